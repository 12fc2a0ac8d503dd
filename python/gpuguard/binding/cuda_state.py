"""The "CUDA_VISIBLE_DEVICES set too late" check: CUDA initialised with one visibility, the environment now another.

The driver reads CUDA_VISIBLE_DEVICES once, at cuInit. Code that touches CUDA first (``torch.cuda.device_count()``,
a library initialising at import) and sets the variable afterwards keeps the old devices for the life of the
process, and every index it later uses is off. Only when CUDA was initialised before bind() does this check
cost anything: it then compares this process's devices with a fresh child process's under the current
environment (one short interpreter start, bounded by a deadline).
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
from typing import Optional, Sequence

from .._core import DriverInitRecord
from ..errors import CudaStateError
from ..probes.run import child_env

logger = logging.getLogger("gpuguard")

_ENUMERATE = "import json, gpuguard; print(json.dumps([d.uuid for d in gpuguard.devices()]))"


def _describe_visibility(value: Optional[str]) -> str:
    return f"CUDA_VISIBLE_DEVICES={value!r}" if value is not None else "CUDA_VISIBLE_DEVICES unset"


def earlier_initialisation(record_before: DriverInitRecord, record_after: DriverInitRecord,
                           visible_now: Optional[str], torch_initialized: bool) -> Optional[str]:
    """Who initialised CUDA before bind() with a visibility that may differ from now; None when nobody did.

    ``record_before``/``record_after``: ``_core.driver_init_record()`` before and after bind()'s enumeration.
    """
    if record_after.initialized_before_gpuguard:
        return ("another library (torch, or code calling it) initialised CUDA in this process before "
                "gpuguard first looked, with a CUDA_VISIBLE_DEVICES gpuguard never saw")
    if record_before.attempted:
        at_init = record_before.visible_devices_at_init
        if at_init != visible_now:
            return (f"gpuguard initialised CUDA earlier in this process (gpuguard.devices() or "
                    f"cuda_status()) while {_describe_visibility(at_init)}")
        return None
    if torch_initialized:
        return "torch initialised CUDA in this process before bind()"
    return None


# CUDA_VISIBLE_DEVICES value -> what a fresh process saw with it: repeated bind() calls pay once
_fresh_by_visibility: dict[Optional[str], list[str]] = {}


def enumerate_in_child(timeout: float) -> Optional[list[str]]:
    """The device UUIDs a fresh process sees under the current environment; None if it could not tell."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible in _fresh_by_visibility:
        return list(_fresh_by_visibility[visible])
    found = _run_child(timeout)
    if found is not None:
        _fresh_by_visibility[visible] = list(found)
    return found


def _run_child(timeout: float) -> Optional[list[str]]:
    try:
        proc = subprocess.run([sys.executable, "-c", _ENUMERATE], env=child_env(), capture_output=True, text=True,
                              timeout=max(1.0, timeout))
    except subprocess.TimeoutExpired:
        logger.warning("gpuguard: could not verify CUDA_VISIBLE_DEVICES: the check process took over %.0f s",
                       timeout)
        return None
    lines = proc.stdout.strip().splitlines()
    if proc.returncode != 0 or not lines:
        logger.warning("gpuguard: could not verify CUDA_VISIBLE_DEVICES: the check process failed (%s): %s",
                       proc.returncode, proc.stderr.strip()[-500:])
        return None
    try:
        found = json.loads(lines[-1])
    except ValueError:
        return None
    return [str(u) for u in found] if isinstance(found, list) else None


def _short(uuids: Sequence[str]) -> str:
    if not uuids:
        return "no GPU"
    return f"{len(uuids)} GPU{'s' if len(uuids) != 1 else ''} [" + ", ".join(u[:12] for u in uuids) + "]"


def check_cuda_state(in_process: Sequence[str], who: Optional[str], visible_now: Optional[str], *,
                     timeout: float, fresh: Optional[Sequence[str]] = None) -> None:
    """Raises CudaStateError when CUDA was initialised earlier (``who``) and this process's devices differ
    from what the environment now gives a new process."""
    if who is None:
        return
    if fresh is None:
        fresh = enumerate_in_child(timeout)
        if fresh is None:
            return
    if list(fresh) == list(in_process):
        return
    raise CudaStateError(
        f"CUDA was initialised in this process before CUDA_VISIBLE_DEVICES got its current value: {who}. "
        f"The driver reads CUDA_VISIBLE_DEVICES once, at initialisation, so this process sees "
        f"{_short(in_process)}, while {_describe_visibility(visible_now)} gives a new process "
        f"{_short(fresh)}; every device index this process uses is off. Set CUDA_VISIBLE_DEVICES before "
        f"anything touches CUDA (in the job script or launcher, or at the very top of the program, before "
        f"torch.cuda calls such as torch.cuda.device_count() and before importing libraries that use the GPU "
        f"at import), or do not change it at all and let gpuguard.bind() pick the device by local rank.",
        initialised_by=who, cuda_visible_devices=visible_now, in_process_uuids=list(in_process),
        expected_uuids=list(fresh))
