"""gpuguard.bind(): puts this process on its GPU under any launcher, once every rank of its group agreed.

bind() owns its steps, in this order, all under one deadline (``timeout`` seconds for the whole call):

1. detect: the launcher that started this process and its ranks (``launchers.detect``);
2. resolve: the devices this process sees, the CUDA state and CUDA_VISIBLE_DEVICES checked, the device
   chosen (``cuda_state``, ``device_choice``): a Binding, or the GpuGuardError saying why there is none;
3. identity: this rank's RankIdentity, from the launch context and the resolution (a failed rank has one too,
   carrying its failure, so that the others stop at once instead of waiting for it);
4. find the store the group meets in, once (``placement.stores.find_store``);
5. exchange: publish the identity, get the verdict every rank of the group gets (``placement.exchange``);
6. verdict: this rank's own failure is raised first, then the verdict's error; with ``verify_nccl``, the
   NCCL communicator of the group is formed (``placement.nccl_check``);
7. set_device, only now.
"""

from __future__ import annotations

import logging
import os
import socket
import sys
import time
import warnings
from typing import Any, Optional

from .._core import driver_init_record, host_fingerprint
from ..deadline import Deadline
from ..system.devices import cuda_status, devices
from ..errors import GpuGuardError, GpuGuardWarning, LaunchEnvironmentError, RankMappingError
from ..group_name import is_group_name
from ..placement import (RankIdentity, check_gpu_processes, exchange, find_store, hold_until_read, namespace_for,
                         raise_for)
from ..placement import foreign_processes
from .binding import Binding
from .cuda_state import check_cuda_state, earlier_initialisation
from .device_choice import Resolution, check_visibility, resolve_device
from .launchers import LaunchContext, check_spawned_child, detect, explicit_context, rank_hint, run_id
from .stray_contexts import stray_context_failure
from .visible_devices import parse_visible_devices

logger = logging.getLogger("gpuguard")


def check_arguments(group: str, timeout: float) -> None:
    if not is_group_name(group):
        raise ValueError(f"group={group!r}: use 1 to 128 letters, digits or '_.:/@+-', e.g. group='rollout'")
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not timeout > 0:
        raise ValueError(f"timeout={timeout!r}: give the seconds to wait, a positive number")


def _group_name(group: str, context: LaunchContext) -> str:
    # an explicit group wins; the default yields to GPUGUARD_GROUP from the launcher's environment
    return context.group if group == "default" and context.group else group


# ---- step 2: resolve ---------------------------------------------------------------------------------------

def _resolve(context: LaunchContext, group: str, host: str, require_gpu: bool, deadline: Deadline) -> Binding:
    """This rank's Binding, or a GpuGuardError saying why there is none."""
    visible_now = os.environ.get("CUDA_VISIBLE_DEVICES")
    visibility = parse_visible_devices(visible_now)
    before = driver_init_record()
    found = devices()  # initialises the driver here, if nobody did: the launcher has set visibility by now
    after = driver_init_record()
    check_spawned_child(context, len(found))  # a multiprocessing child is not "rank 0 of 1" on a multi-GPU host
    status = cuda_status()
    who = earlier_initialisation(before, after, visible_now, _torch_cuda_initialized())
    if who is None and not found and status.library_loaded and visibility.entries:
        # the driver shows nothing although the variable lists GPUs: maybe frozen empty by an earlier cuInit
        who = "CUDA was initialised in this process before bind() (the driver shows no device)"
    check_cuda_state([d.uuid for d in found], who, visible_now, timeout=deadline.remaining())
    check_visibility(visibility, found, status.library_loaded)
    resolution: Resolution = resolve_device(context, found, visibility, host=host)
    if resolution.device is not None:  # a context of this process on another GPU: made before set_device
        stray = stray_context_failure(rank=context.rank, host=host, own_index=resolution.device.index, found=found,
                                      local_rank=resolution.local_rank, local_world_size=context.local_world_size)
        if stray is not None:
            raise stray
    if resolution.device is None:
        reason = status.reason or "no CUDA device is visible"
        if require_gpu:
            raise RankMappingError(
                f"Rank {context.rank} needs a GPU (require_gpu=True) but this process on {host} sees none: "
                f"{reason}. Check `gpuguard devices` on this host, the job's GPU request (srun --gpus-per-task, "
                f"num_gpus in Ray), and CUDA_VISIBLE_DEVICES.",
                rank=context.rank, host=host, reason=reason, cuda_visible_devices=visible_now)
        chosen_by = f"no GPU: {reason}"
    else:
        chosen_by = resolution.chosen_by
    d = resolution.device
    return Binding(
        launcher=context.launcher, rank=context.rank, local_rank=resolution.local_rank,
        world_size=context.world_size, local_world_size=context.local_world_size, node_rank=context.node_rank,
        device_index=d.index if d else None, uuid=d.uuid if d else None,
        pci_bus_id=d.pci_bus_id if d else None, device_name=d.name if d else None, host=host,
        cuda_visible_devices=visible_now, visible_device_count=len(found),
        local_rank_source=resolution.local_rank_source, group=group, chosen_by=chosen_by,
        extra=dict(context.extra))


def _torch_cuda_initialized() -> bool:
    torch = sys.modules.get("torch")  # a torch nobody imported initialised nothing
    if torch is None:
        return False
    try:
        return bool(torch.cuda.is_initialized())
    except Exception:  # pragma: no cover - a torch without CUDA support
        return False


# ---- step 3: identity --------------------------------------------------------------------------------------

def _identity(context: LaunchContext, group: str, host: str, binding: Optional[Binding],
              failure: Optional[GpuGuardError]) -> RankIdentity:
    """This rank's record for the exchange: from the resolution when there is one, else from the launch
    context with the failure that prevented it."""
    share = context.extra.get("ray_gpu_share")
    ray_ids = context.extra.get("ray_gpu_ids")
    if binding is not None:
        visible_count = binding.visible_device_count
    else:  # bind() already initialised the driver; this only reads the count
        status = cuda_status()
        visible_count = status.device_count if status.initialized else -1
    # A Ray actor has no local rank unless LOCAL_RANK is set: bind()'s local_rank there is the index of the GPU
    # Ray chose (under RAY_EXPERIMENTAL_NOSET_CUDA_VISIBLE_DEVICES it can exceed the world size), not a rank.
    if context.launcher == "ray" and context.local_rank is None:
        local_rank = -1
    elif binding is not None:
        local_rank = binding.local_rank
    else:
        local_rank = context.local_rank if context.local_rank is not None else -1
    on_gpu = binding is not None and binding.is_gpu
    return RankIdentity(
        rank=context.rank, world_size=context.world_size, group=group, local_rank=local_rank,
        local_world_size=context.local_world_size if context.local_world_size is not None else -1,
        host_hash=host_fingerprint().hash, hostname=host,
        gpu_uuid=(binding.uuid or "") if on_gpu else "",
        pci_bus_id=(binding.pci_bus_id or "") if on_gpu else "",
        gpu_index=binding.device_index if on_gpu and binding.device_index is not None else -1,
        pid=os.getpid(), cuda_visible_devices=os.environ.get("CUDA_VISIBLE_DEVICES"),
        visible_device_count=visible_count, launcher=context.launcher,
        multi_rank_gpu_enabled=os.environ.get("NCCL_MULTI_RANK_GPU_ENABLE") == "1",
        gpu_fraction=float(share) if isinstance(share, (int, float)) and 0 < float(share) else None,
        ray_gpu_ids=",".join(str(i) for i in ray_ids) if isinstance(ray_ids, (list, tuple)) else str(ray_ids or ""),
        failure_kind=None if failure is None else type(failure).__name__,
        failure_text="" if failure is None else str(failure))


# ---- steps 4-6: meet the other ranks -----------------------------------------------------------------------

def _meet_other_ranks(me: RankIdentity, binding: Optional[Binding], store: Any, deadline: Deadline,
                      verify_nccl: bool, launch_id: str = "", store_owner: bool = False,
                      require_exclusive: bool = False) -> Optional[Any]:
    """Finds the store once, exchanges, and raises the verdict's error on this rank. A rank with a failure of
    its own only publishes it (every other rank then stops naming it) and returns: bind() raises its error."""
    found = find_store(store, group=me.group, world_size=me.world_size, deadline=deadline)
    if binding is not None and binding.launcher == "ray" and store is None:
        _publish_ray_row(binding, found)
    if found is None:  # one process: nothing to compare
        if me.failure_kind is None:
            check_gpu_processes(None, me, namespace="", deadline=deadline, require_exclusive=require_exclusive)
            if verify_nccl:
                _verify_nccl(None, me, "", deadline)
        return
    namespace = namespace_for(found, me.group, me.rank, launch_id, deadline)
    started = time.monotonic()
    verdict = exchange(found, me, namespace=namespace, deadline=deadline)
    logger.debug("gpuguard: cross-rank check of group %r (%d ranks): %s in %.3f s", me.group, me.world_size,
                 verdict.kind, time.monotonic() - started)
    if store_owner and verdict.namespace and (me.failure_kind is not None or verdict.kind not in ("ok", "warning")):
        # this process serves the store: exiting now would cut off ranks still starting up from the verdict
        hold_until_read(found, verdict.namespace, deadline)
    if me.failure_kind is not None:
        return verdict
    raise_for(verdict, me)
    try:  # in the epoch the exchange took place in, where every rank's pid key is
        check_gpu_processes(found, me, namespace=verdict.namespace, deadline=deadline,
                            require_exclusive=require_exclusive)
    except GpuGuardError:
        if store_owner:  # as above: the others read the round's verdict from this process's store
            foreign_processes.hold_until_read(found, verdict.namespace, deadline)
        raise
    if verify_nccl:
        _verify_nccl(found, me, verdict.namespace, deadline)


def _verify_nccl(found: Any, me: RankIdentity, namespace: str, deadline: Deadline) -> None:
    """verify_nccl: a real NCCL communicator of the group (placement/nccl_check.py), imported only when asked for:
    it loads the finder of the job's NCCL and the duplicate-GPU recogniser, which bind() needs for nothing else."""
    from ..placement.nccl_check import verify_nccl_across_ranks

    raise_for(verify_nccl_across_ranks(found, me, namespace=namespace, deadline=deadline), me)


def _publish_ray_row(binding: Binding, found: Any) -> None:
    """Ray: the row RayPlacement.report() shows, put in the group's rendezvous actor before the exchange (so the
    report also shows a placement the check refuses). Only informative: a failure here is logged, and the
    exchange that follows reports any real trouble with the rendezvous."""
    from ..ray.report import publish_row
    from ..ray.store import RayStore

    extra = binding.extra
    row = {"group": binding.group, "rank": binding.rank, "world_size": binding.world_size,
           "hostname": binding.host, "pid": os.getpid(), "cuda_visible_devices": binding.cuda_visible_devices,
           "device": binding.device_text, "uuid": binding.uuid, "pci_bus_id": binding.pci_bus_id,
           "device_name": binding.device_name, "ray_gpu_ids": list(extra.get("ray_gpu_ids") or []),
           "gpu_fraction": extra.get("ray_gpu_share")}
    try:
        # the exchange's own store when it is the group's Ray actor; a process group's store is not read by
        # RayPlacement.report(), so the row then goes to the actor all the same
        publish_row(found if isinstance(found, RayStore) else RayStore(binding.group), row)
    except GpuGuardError as exc:
        logger.warning("gpuguard: could not publish rank %d's binding for RayPlacement.report(): %s",
                       binding.rank, exc)


# ---- step 7: set_device ------------------------------------------------------------------------------------

def _apply(binding: Binding) -> None:
    if not binding.is_gpu:
        warnings.warn(f"gpuguard.bind(): rank {binding.rank} runs on the CPU: {binding.chosen_by}. Pass "
                      f"require_gpu=True to make this an error.", GpuGuardWarning, stacklevel=4)
        return
    import torch

    if torch.cuda.is_available():
        torch.cuda.set_device(binding.device)
    else:
        logger.info("gpuguard: this torch cannot use CUDA (%s build, torch.cuda.is_available() is False); "
                    "torch.cuda.set_device(%s) skipped", "CUDA" if torch.version.cuda else "CPU",
                    binding.device)


# ---- the entry points --------------------------------------------------------------------------------------

def detect_or_hint() -> tuple[LaunchContext, Optional[LaunchEnvironmentError]]:
    """detect(); when it fails but the rank and world size still read cleanly (a contradiction elsewhere),
    a minimal context with the failure, so that this rank reports it to the others at once instead of
    leaving them to wait it out. Without a rank there is no one to tell: the error is raised here."""
    try:
        return detect(), None
    except LaunchEnvironmentError as exc:
        hint = rank_hint(os.environ)
        if hint is None or hint[1] <= 1:
            raise
        rank, world_size, name = hint
        return LaunchContext(launcher=name, description=name, rank=rank, world_size=world_size, local_rank=None,
                             local_world_size=None, node_rank=None), exc


def bind_in(context: LaunchContext, *, group: str, store: Any, deadline: Deadline, verify_nccl: bool,
            require_gpu: bool, failure: Optional[GpuGuardError] = None, store_owner: bool = False,
            set_device: bool = True, require_exclusive: bool = False) -> Binding:
    """bind()'s steps 2-7 for an already detected launch context (init_process_group detects only once).
    ``failure``: detect()'s error, reported to the other ranks and raised. ``store_owner``: this process
    serves the store, and stays until every rank read a failing verdict (or the deadline). ``set_device``:
    False skips step 7, the only one that imports torch. ``require_exclusive``: other programs' memory on a rank's
    GPU stops every rank (ForeignProcessError) instead of a warning."""
    group = _group_name(group, context)
    host = socket.gethostname()
    binding: Optional[Binding] = None
    if failure is None:
        try:
            binding = _resolve(context, group, host, require_gpu, deadline)
        except GpuGuardError as exc:  # still meet the others below, so they stop too instead of waiting
            failure = exc
    me = _identity(context, group, host, binding, failure)
    try:
        verdict = _meet_other_ranks(me, binding, store, deadline, verify_nccl, run_id(context), store_owner,
                                    require_exclusive)
    except GpuGuardError as meeting:
        if failure is None:
            raise
        # no store to tell the others through (or it failed): this rank's own error is still the one to raise
        logger.warning("gpuguard: rank %d could not report its failure to the other ranks: %s", me.rank, meeting)
        raise failure from meeting
    if failure is not None:
        others = [r for r in (verdict.details.get("failed_ranks") or []) if r != me.rank] if verdict else []
        if others and failure.args:  # this rank's own error, and who else failed
            failure.args = (f"{failure.args[0]}\n(ranks {', '.join(map(str, others))} failed too; "
                            f"{verdict.details.get('failed_total', len(others) + 1)} ranks failed in all)",
                            *failure.args[1:])
        raise failure
    assert binding is not None
    if set_device:
        _apply(binding)
    logger.info("%s (%s)", binding, binding.chosen_by)
    return binding


def bind(*, group: str = "default", store: Any = None, timeout: float = 60, verify_nccl: bool = False,
         require_gpu: bool = False, rank: Optional[int] = None, world_size: Optional[int] = None,
         local_rank: Optional[int] = None, require_exclusive: bool = False) -> Binding:
    """gpuguard.bind() without its watch= (gpuguard/api.py adds that): binds this process to its GPU under whichever
    launcher started it, and returns the Binding. The arguments are gpuguard.bind()'s."""
    check_arguments(group, timeout)
    deadline = Deadline(timeout)
    context, failure = _context(rank, world_size, local_rank)
    return bind_in(context, group=group, store=store, deadline=deadline, verify_nccl=verify_nccl,
                   require_gpu=require_gpu, failure=failure, require_exclusive=require_exclusive)


def preflight(*, group: str = "default", timeout: float = 60, verify_nccl: bool = False,
              require_gpu: bool = False, require_exclusive: bool = False) -> Binding:
    """``gpuguard check``: every rank binds and meets the others exactly as the job's bind() would, without the
    last step (``torch.cuda.set_device``), so that the check never imports torch."""
    check_arguments(group, timeout)
    deadline = Deadline(timeout)
    context, failure = _context(None, None, None)
    return bind_in(context, group=group, store=None, deadline=deadline, verify_nccl=verify_nccl,
                   require_gpu=require_gpu, failure=failure, set_device=False, require_exclusive=require_exclusive)


def _context(rank: Optional[int], world_size: Optional[int],
             local_rank: Optional[int]) -> tuple[LaunchContext, Optional[LaunchEnvironmentError]]:
    """Step 1: bind(rank=, world_size=, local_rank=)'s context, or the launcher's (detect_or_hint)."""
    if (rank, world_size, local_rank) != (None, None, None):
        return explicit_context(rank, world_size, local_rank), None
    return detect_or_hint()
