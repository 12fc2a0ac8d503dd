"""gpuguard.bind(): one call that puts this process on its GPU under any launcher, and init_process_group().

bind() reads the launch context (launchers.py), checks CUDA_VISIBLE_DEVICES and the CUDA state, resolves the
device (resolve.py), always meets the other ranks (crossrank.py; a rank whose own resolution failed still
takes part, so that the others stop too), and only then calls torch.cuda.set_device.
"""

from __future__ import annotations

import inspect
import logging
import os
import re
import socket
import warnings
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Mapping, Optional

import torch

from . import crossrank
from ._native import _C
from .cuda_state import check_cuda_state, earlier_initialisation
from .devices import cuda_status, devices
from .errors import GpuGuardError, GpuGuardWarning, RankMappingError
from .launchers import LaunchContext, detect
from .resolve import Resolution, check_visibility, resolve_device
from .visibility import parse_visible_devices

logger = logging.getLogger("gpuguard")

_GROUP_RE = re.compile(r"[A-Za-z0-9_.:/@+-]{1,128}")


@dataclass(frozen=True)
class Binding:
    """Where this process runs: its ranks, its device and how that device was chosen."""

    launcher: str
    rank: int
    local_rank: int
    world_size: int
    local_world_size: Optional[int]
    node_rank: Optional[int]
    device: torch.device
    device_index: Optional[int]          # None on the CPU
    uuid: Optional[str]
    pci_bus_id: Optional[str]
    device_name: Optional[str]
    host: str
    cuda_visible_devices: Optional[str]  # the raw environment value; None when unset
    visible_device_count: int
    local_rank_source: str               # the variable that gave the local rank, e.g. "SLURM_LOCALID"
    group: str
    chosen_by: str                       # how the device was chosen, for logs
    extra: Mapping[str, Any] = field(default_factory=dict)  # launcher specifics: Ray GPU ids and share, ...

    def __post_init__(self) -> None:
        object.__setattr__(self, "extra", MappingProxyType(dict(self.extra)))

    @property
    def is_gpu(self) -> bool:
        return self.device.type == "cuda"

    def __str__(self) -> str:
        lws = "?" if self.local_world_size is None else str(self.local_world_size)
        node = "" if self.node_rank is None else f" node {self.node_rank}"
        group = "" if self.group == "default" else f" group {self.group}"
        if self.is_gpu:
            where = f"{self.device} ({self.uuid}, {self.pci_bus_id})"
        else:
            where = f"cpu ({self.chosen_by})"
        visible = ("unset" if self.cuda_visible_devices is None else repr(self.cuda_visible_devices))
        # "(no launcher variables: ...)" and the like explain themselves; a variable name needs "from"
        source = "" if self.local_rank_source.startswith("(") else f", local rank from {self.local_rank_source}"
        return (f"gpuguard: rank {self.rank}/{self.world_size} local {self.local_rank}/{lws}{node}{group} "
                f"-> {where} on {self.host} [{self.launcher}{source}, CUDA_VISIBLE_DEVICES={visible}]")

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready: for logs, reports and tests."""
        return {
            "launcher": self.launcher, "rank": self.rank, "local_rank": self.local_rank,
            "world_size": self.world_size, "local_world_size": self.local_world_size,
            "node_rank": self.node_rank, "device": str(self.device), "device_index": self.device_index,
            "uuid": self.uuid, "pci_bus_id": self.pci_bus_id, "device_name": self.device_name,
            "host": self.host, "cuda_visible_devices": self.cuda_visible_devices,
            "visible_device_count": self.visible_device_count, "local_rank_source": self.local_rank_source,
            "group": self.group, "chosen_by": self.chosen_by, "extra": dict(self.extra),
        }


def _check_arguments(group: str, timeout: float) -> None:
    if not isinstance(group, str) or not _GROUP_RE.fullmatch(group):
        raise ValueError(f"group={group!r}: use 1 to 128 letters, digits or '_.:/@+-', e.g. group='rollout'")
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not timeout > 0:
        raise ValueError(f"timeout={timeout!r}: give the seconds to wait, a positive number")


def _group_name(group: str, context: LaunchContext) -> str:
    # an explicit group wins; the default yields to GPUGUARD_GROUP from the launcher's environment
    return context.group if group == "default" and context.group else group


def _resolve(context: LaunchContext, group: str, require_gpu: bool, timeout: float) -> Binding:
    """This rank's Binding, or a GpuGuardError saying why there is none."""
    host = socket.gethostname()
    visible_now = os.environ.get("CUDA_VISIBLE_DEVICES")
    visibility = parse_visible_devices(visible_now)
    before = _C.driver_init_record()
    found = devices()  # initialises the driver here, if nobody did: the launcher has set visibility by now
    after = _C.driver_init_record()
    status = cuda_status()
    who = earlier_initialisation(before, after, visible_now, _torch_cuda_initialized())
    if who is None and not found and status.library_loaded and visibility.entries:
        # the driver shows nothing although the variable lists GPUs: maybe frozen empty by an earlier cuInit
        who = "CUDA was initialised in this process before bind() (the driver shows no device)"
    check_cuda_state([d.uuid for d in found], who, visible_now, timeout=timeout)
    check_visibility(visibility, found, status.library_loaded)
    resolution: Resolution = resolve_device(context, found, visibility, host=host)
    if resolution.device is None:
        reason = status.reason or "no CUDA device is visible"
        if require_gpu:
            raise RankMappingError(
                f"Rank {context.rank} needs a GPU (require_gpu=True) but this process on {host} sees none: "
                f"{reason}. Check `gpuguard devices` on this host, the job's GPU request (srun --gpus-per-task, "
                f"num_gpus in Ray), and CUDA_VISIBLE_DEVICES.",
                rank=context.rank, host=host, reason=reason, cuda_visible_devices=visible_now)
        device, chosen_by = torch.device("cpu"), f"no GPU: {reason}"
    else:
        device, chosen_by = torch.device("cuda", resolution.device.index), resolution.chosen_by
    d = resolution.device
    return Binding(
        launcher=context.launcher, rank=context.rank, local_rank=resolution.local_rank,
        world_size=context.world_size, local_world_size=context.local_world_size, node_rank=context.node_rank,
        device=device, device_index=d.index if d else None, uuid=d.uuid if d else None,
        pci_bus_id=d.pci_bus_id if d else None, device_name=d.name if d else None, host=host,
        cuda_visible_devices=visible_now, visible_device_count=len(found),
        local_rank_source=resolution.local_rank_source, group=group, chosen_by=chosen_by,
        extra=dict(context.extra))


def _torch_cuda_initialized() -> bool:
    try:
        return bool(torch.cuda.is_initialized())
    except Exception:  # pragma: no cover - a torch without CUDA support
        return False


def _apply(binding: Binding) -> None:
    if not binding.is_gpu:
        warnings.warn(f"gpuguard.bind(): rank {binding.rank} runs on the CPU: {binding.chosen_by}. Pass "
                      f"require_gpu=True to make this an error.", GpuGuardWarning, stacklevel=3)
        return
    if torch.cuda.is_available():
        torch.cuda.set_device(binding.device)
    else:
        logger.info("gpuguard: this torch cannot use CUDA (%s build, torch.cuda.is_available() is False); "
                    "torch.cuda.set_device(%s) skipped", "CUDA" if torch.version.cuda else "CPU",
                    binding.device)


def bind(*, group: str = "default", store: Any = None, timeout: float = 60, verify_nccl: bool = False,
         require_gpu: bool = False) -> Binding:
    """Binds this process to its GPU under whichever launcher started it, and returns the Binding.

    group: the rank's group; ranks of different groups may share a GPU (colocated roles). The default
      yields to ``GPUGUARD_GROUP`` in the environment.
    store: where ranks meet for the cross-rank check (a torch.distributed Store); found automatically
      when None. timeout: seconds to wait for the other ranks (and for the CUDA-state check).
    verify_nccl: also form a real NCCL communicator under the deadline.
    require_gpu: no GPU is an error instead of a warning and a CPU binding.

    Raises LaunchEnvironmentError (launcher variables or CUDA_VISIBLE_DEVICES malformed or contradictory),
    RankMappingError (no GPU for this local rank), CudaStateError (CUDA initialised with another
    visibility); all are GpuGuardError.
    """
    _check_arguments(group, timeout)
    context = detect()
    group = _group_name(group, context)
    binding: Optional[Binding] = None
    failure: Optional[GpuGuardError] = None
    try:
        binding = _resolve(context, group, require_gpu, float(timeout))
    except GpuGuardError as exc:  # still meet the others below, so they stop too instead of waiting
        failure = exc
    if binding is not None and binding.launcher == "ray" and store is None:
        _publish_to_ray(binding)
    crossrank.check_across_ranks(binding, failure, context, group=group, store=store, timeout=float(timeout),
                                 verify_nccl=verify_nccl)
    if binding is None:  # the cross-rank step re-raises this rank's failure; this is a safety net
        assert failure is not None
        raise failure
    _apply(binding)
    logger.info("%s (%s)", binding, binding.chosen_by)
    return binding


def _publish_to_ray(binding: Binding) -> None:
    """Ray (issue 6): the row RayPlacement.report() shows, put where the exchange meets, before it runs (so the
    report also shows a placement the check refuses). Only informative: a failure here is logged, and the
    exchange that follows reports any real trouble with the rendezvous."""
    from .ray_report import publish_binding

    try:
        publish_binding(binding)
    except GpuGuardError as exc:
        logger.warning("gpuguard: could not publish rank %d's binding for RayPlacement.report(): %s",
                       binding.rank, exc)


def _supports_device_id() -> bool:
    import torch.distributed as dist

    try:
        return "device_id" in inspect.signature(dist.init_process_group).parameters
    except (TypeError, ValueError):  # pragma: no cover - a wrapped function without a signature
        return False


def init_process_group(backend: str = "nccl", *, group: str = "default", verify_nccl: bool = False,
                       require_gpu: Optional[bool] = None, bind_timeout: float = 60,
                       **kwargs: Any) -> Binding:
    """``bind()``, then ``torch.distributed.init_process_group(backend, device_id=<the bound GPU>, ...)``.

    ``rank`` and ``world_size`` default to the launcher's (so ``srun``/``mpirun`` need no RANK/WORLD_SIZE);
    ``store=`` is also the store bind() meets the other ranks through. ``require_gpu`` defaults to whether
    the backend is NCCL. Other keyword arguments go to torch unchanged. Returns the Binding.
    """
    import torch.distributed as dist

    if require_gpu is None:
        require_gpu = "nccl" in str(backend).lower()
    if kwargs.get("store") is None and kwargs.get("init_method") in (None, "env://"):
        # srun/mpirun/plain variables have no store before init: create the one env:// would, so that bind()'s
        # cross-rank check can run first, and hand it to torch.
        context = detect()
        env_store = crossrank.env_store_for_init(context.rank, context.world_size, float(bind_timeout))
        if env_store is not None:
            kwargs.pop("init_method", None)
            kwargs["store"] = env_store
    binding = bind(group=group, store=kwargs.get("store"), timeout=bind_timeout, verify_nccl=verify_nccl,
                   require_gpu=require_gpu)
    if "rank" not in kwargs and "world_size" not in kwargs:
        kwargs["rank"], kwargs["world_size"] = binding.rank, binding.world_size
    if binding.is_gpu and torch.cuda.is_available() and "device_id" not in kwargs and _supports_device_id():
        kwargs["device_id"] = binding.device
    dist.init_process_group(backend=backend, **kwargs)
    return binding

