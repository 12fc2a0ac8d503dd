"""The cross-rank duplicate check of an NCCL-backed default group, run once, before its first communicator.

``init_process_group`` (patched) decides where the ranks meet and when the check runs:

- with ``device_id=``, or when this torch cannot build an NCCL group here at all (it sees no CUDA device, so
  its own init would fail at once), at once, before torch's init;
- otherwise after torch's init, at the first of: ``torch.cuda.set_device`` after init, DDP/FSDP
  construction, the first collective. Only then is the user's device known, and NCCL still has no
  communicator (it forms one lazily, at the first collective or at ``device_id=``).

The rank's device is the one its trigger names (set_device's index; DDP's ``device_ids[0]``, FSDP's
``device_id`` or else the device of the wrapped module's parameters; the collective's tensor's device), and
only when none names one the current device (cuda:0 on every rank that never called set_device): a job that
moves its model to ``cuda:LOCAL_RANK`` and gives DDP ``device_ids`` without ever calling set_device is right,
and passes.

Each rank is who the launcher says, with init's own ``rank=``/``world_size=`` (which torch forms the group with,
and which alone name the rank under Lightning's launcher, ddp_spawn and torch.multiprocessing.spawn:
rank_at_init). The ranks meet through the store init creates (the default group's store), torchrun's agent
store or, before torch's init, the TCPStore env:// or a tcp:// init method would create (then handed to torch as
``store=``); inside Ray, through the group's rendezvous actor. The exchange, the verdict and the group rules are bind()'s
(``placement.exchange``, ``placement.raise_for``); gloo-only groups are never checked for sharing.
"""

from __future__ import annotations

import os
import socket
import threading
from dataclasses import dataclass, field
from typing import Any, Callable, Optional

from .._core import host_fingerprint
from ..deadline import Deadline
from ..system.devices import devices
from ..errors import DuplicateDeviceError, GpuGuardError, add_note
from ..binding.launchers import LaunchContext, run_id
from ..binding.stray_contexts import stray_context_failure
from ..placement import RankIdentity, check_gpu_processes, exchange, find_store, namespace_for, raise_for
from ..placement.stores import env_store_for_init, tcp_init_address
from .device_index import mapping_error, visible_gpu_count
from .framework_advice import check_lightning_spawning, device_never_named, fewer_per_node, framework_of
from .rank_at_init import context_at_init
from . import json_report

#: What the report says of the device of a rank whose group has no NCCL (gloo): no GPU is shared through it.
NO_GPU_SHARED = "a group without NCCL shares no GPU: its ranks alone are checked"
#: Seconds the whole check may take (all ranks arriving included); GPUGUARD_TIMEOUT overrides.
DEFAULT_TIMEOUT_S = 120.0


def check_timeout() -> float:
    raw = os.environ.get("GPUGUARD_TIMEOUT", "")
    try:
        value = float(raw) if raw else DEFAULT_TIMEOUT_S
    except ValueError:
        raise GpuGuardError(f"GPUGUARD_TIMEOUT={raw!r}: give the seconds the cross-rank check may wait, e.g. 120",
                            variable="GPUGUARD_TIMEOUT") from None
    if not value > 0:
        raise GpuGuardError(f"GPUGUARD_TIMEOUT={raw!r}: give a positive number of seconds",
                            variable="GPUGUARD_TIMEOUT")
    return value


def nccl_backed(backend: Any) -> bool:
    """Whether a group built with ``backend`` uses NCCL ("nccl", "cuda:nccl,cpu:gloo", or the default, which is
    NCCL for CUDA tensors on a CUDA build of torch)."""
    if backend is None:
        import torch.distributed as dist

        return bool(dist.is_nccl_available())
    return "nccl" in str(backend).lower()


@dataclass
class Chosen:
    """The CUDA device this process uses, and how it came to use it (said in the report). ``fallback``: nothing
    named a device, so this is the current one (cuda:0 on every rank that never called set_device)."""

    index: int
    how: str
    fallback: bool = False


@dataclass
class GroupCheck:
    """The one pending check of this process's default group."""

    context: LaunchContext
    group: str
    store: Any  # None: find it when the check runs (the default group's store, after init)
    gpu: bool = True  # NCCL-backed: the ranks' GPUs are compared; else only the ranks themselves
    done: bool = False
    lock: threading.Lock = field(default_factory=threading.Lock)


_state_lock = threading.Lock()
_pending: Optional[GroupCheck] = None
_chosen: Optional[Chosen] = None


def reset() -> None:
    global _pending, _chosen
    with _state_lock:
        _pending, _chosen = None, None


def note_set_device(index: int) -> None:
    global _chosen
    _chosen = Chosen(index, f"torch.cuda.set_device({index})")


def current_choice() -> Chosen:
    if _chosen is not None:
        return _chosen
    import torch

    index = torch.cuda.current_device() if torch.cuda.is_available() and torch.cuda.is_initialized() else 0
    return Chosen(index, f"set_device was never called, so this rank uses the current device, cuda:{index}, "
                         f"as every rank that never calls it does", fallback=True)


def cuda_index_of_tensor(value: Any) -> Optional[int]:
    """The CUDA index of a tensor (or of the first of a list of tensors, as collectives take), else None."""
    if isinstance(value, (list, tuple)):
        value = value[0] if value else None
    device = getattr(value, "device", None)
    if getattr(device, "type", None) == "cuda" and isinstance(getattr(device, "index", None), int):
        return int(device.index)
    return None


def chosen_by_tensor(value: Any, call: str) -> Optional[Chosen]:
    """A collective's device: its tensor's, which is the device NCCL runs it on (not the current device)."""
    index = cuda_index_of_tensor(value)
    return None if index is None or _chosen is not None else Chosen(index, f"{call} was given a tensor on "
                                                                            f"cuda:{index}")


def chosen_by_wrapper(what: str, module: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Optional[Chosen]:
    """The device a DDP/FSDP wrapper puts the rank on: DDP's ``device_ids[0]``, FSDP's ``device_id`` (``how`` is
    then the call, as a bad index's RankMappingError quotes it), else the device of the module's parameters.
    None when they name no CUDA device (the current device then)."""
    from .device_index import index_of

    if what == "DistributedDataParallel":
        ids = args[0] if args else kwargs.get("device_ids")
        if isinstance(ids, (list, tuple)) and ids:
            index = index_of(ids[0])
            if index is not None and index >= 0:
                return Chosen(index, f"DistributedDataParallel(device_ids={list(ids)!r})")
    device_id = kwargs.get("device_id")
    if what == "FullyShardedDataParallel" and device_id is not None:
        index = index_of(device_id)
        if index is not None and index >= 0:
            return Chosen(index, f"FullyShardedDataParallel(device_id={device_id!r})")
    if _chosen is not None:  # set_device named it: that is the device the wrapper and NCCL use
        return None
    try:
        first = next(iter(module.parameters()), None)
    except Exception:  # noqa: BLE001 - not an nn.Module, or one whose parameters() fails: torch will say so
        return None
    index = cuda_index_of_tensor(first)
    return None if index is None else Chosen(index, f"the module given to {what} has its parameters on "
                                                    f"cuda:{index}")


def pending() -> Optional[GroupCheck]:
    check = _pending
    return check if check is not None and not check.done else None


# ---- init_process_group --------------------------------------------------------------------------------

def before_init(kwargs: dict[str, Any], backend: Any) -> Optional[GroupCheck]:
    """Prepares the check of the group about to be initialised (adding ``store=`` to ``kwargs`` where gpuguard
    creates the env:// or tcp:// store itself); returns it, or None when the group is not checked.

    A group without NCCL (gloo) shares no GPU through it, so only its ranks are checked (every one arrived, with
    the same world size), and leniently: launcher variables gpuguard cannot read, or no store to meet in, leave
    it unchecked rather than stop a job that uses no GPU."""
    global _pending
    gpu = nccl_backed(backend)
    try:
        context = context_at_init(kwargs)
    except GpuGuardError:
        if gpu:
            raise
        return None
    check_lightning_spawning(context)  # whatever the backend: that job would wait for ranks nobody started
    if context.world_size <= 1:
        return None
    group = context.group or "default"
    store = kwargs.get("store")
    from ..ray.store import RayStore, in_ray_worker

    init_method = kwargs.get("init_method")
    address = tcp_init_address(init_method) if isinstance(init_method, str) else None
    if in_ray_worker():
        store = RayStore(group)
    elif store is None and (init_method in (None, "env://") or address is not None):
        # the store torch's env:// or tcp:// rendezvous would make, made here and handed to torch as store=
        timeout = kwargs.get("timeout")
        created = env_store_for_init(context.rank, context.world_size,
                                     float(timeout.total_seconds()) if timeout is not None else 1800.0, address)
        if created is not None:
            kwargs.pop("init_method", None)
            kwargs.update(store=created, rank=context.rank, world_size=context.world_size)
            store = created
        else:  # torchrun's agent store, found by find_store
            try:
                store = find_store(None, group=group, world_size=context.world_size,
                                   deadline=Deadline(check_timeout()))
            except GpuGuardError:
                if gpu:
                    raise
                return None
    elif store is None and not gpu:  # another init method (file://): nowhere to meet before torch's init
        return None
    check = GroupCheck(context=context, group=group, store=store, gpu=gpu)
    with _state_lock:
        _pending = check
    return check


def torch_cannot_build_nccl_here() -> bool:
    import torch

    return torch.cuda.device_count() == 0


def run(trigger: str, chosen: Optional[Chosen] = None) -> None:  # noqa: D401
    """Runs the pending check once (every later call returns at once)."""
    check = pending()
    if check is None:
        return
    with check.lock:
        if check.done:
            return
        check.done = True
        _run(check, trigger, (chosen or current_choice()) if check.gpu else None)


def _identity(check: GroupCheck, chosen: Optional[Chosen], failure: Optional[GpuGuardError]) -> RankIdentity:
    context = check.context
    found = devices() if chosen is not None else []
    device = found[chosen.index] if chosen is not None and failure is None and 0 <= chosen.index < len(found) \
        else None
    share = context.extra.get("ray_gpu_share")
    ray_ids = context.extra.get("ray_gpu_ids")
    return RankIdentity(
        rank=context.rank, world_size=context.world_size, group=check.group,
        local_rank=context.local_rank if context.local_rank is not None else -1,
        local_world_size=context.local_world_size if context.local_world_size is not None else -1,
        host_hash=host_fingerprint().hash, hostname=socket.gethostname(),
        gpu_uuid=device.uuid if device else "", pci_bus_id=device.pci_bus_id if device else "",
        gpu_index=device.index if device else -1, pid=os.getpid(),
        cuda_visible_devices=os.environ.get("CUDA_VISIBLE_DEVICES"), visible_device_count=len(found),
        launcher=context.launcher, multi_rank_gpu_enabled=os.environ.get("NCCL_MULTI_RANK_GPU_ENABLE") == "1",
        gpu_fraction=float(share) if isinstance(share, (int, float)) and 0 < float(share) else None,
        ray_gpu_ids=",".join(str(i) for i in ray_ids) if isinstance(ray_ids, (list, tuple)) else str(ray_ids or ""),
        failure_kind=None if failure is None else type(failure).__name__,
        failure_text="" if failure is None else str(failure))


def _run(check: GroupCheck, trigger: str, chosen: Optional[Chosen]) -> None:
    """The check; ``chosen`` None: a group without NCCL, whose ranks alone are compared (no device is read)."""
    deadline = Deadline(check_timeout())
    failure: Optional[GpuGuardError] = None
    n = visible_gpu_count() if chosen is not None else 0
    if chosen is not None and n and not 0 <= chosen.index < n:
        failure = mapping_error(chosen.index, n, chosen.how, check.context)
    if chosen is not None and failure is None and n:  # a context on another GPU, made before this one was chosen
        failure = stray_context_failure(rank=check.context.rank, host=socket.gethostname(), own_index=chosen.index,
                                        found=devices(), local_rank=check.context.local_rank,
                                        local_world_size=check.context.local_world_size)
    me = _identity(check, chosen, failure)
    store = check.store or find_store(None, group=check.group, world_size=me.world_size, deadline=deadline)
    namespace = namespace_for(store, check.group, me.rank, run_id(check.context), deadline)
    verdict = exchange(store, me, namespace=namespace, deadline=deadline)
    record: Callable[[str, str], None] = lambda kind, message: json_report.write(
        check.context, check.group, chosen.index if chosen is not None else None,
        chosen.how if chosen is not None else NO_GPU_SHARED, trigger, kind, message)
    if failure is not None:
        record(type(failure).__name__, str(failure))
        raise failure
    try:
        raise_for(verdict, me)
    except DuplicateDeviceError as exc:
        assert chosen is not None  # a rank of a group without NCCL reads no GPU, so it shares none
        note = f"gpuguard (auto, at {trigger}): rank {me.rank} is on cuda:{chosen.index} because {chosen.how}."
        framework = framework_of(check.context)
        lws = check.context.local_world_size
        if chosen.fallback and check.context.launcher != "ray":
            note += " " + device_never_named(framework)
        elif not chosen.fallback and lws is not None and n and lws > n and framework is not None:
            note += (f" This node runs {lws} processes ({check.context.source('local_world_size')}) but shows "
                     f"{n} GPU{'s' if n != 1 else ''}. {fewer_per_node(n, framework)}.")
        share = check.context.extra.get("ray_gpu_share")
        if check.context.launcher == "ray" and isinstance(share, float) and share < 1:
            from ..ray.store import in_ray_train_worker

            if in_ray_train_worker():  # Ray Train's workers are placed by ScalingConfig, not by actor options
                note += (f" Ray Train gave each training worker {share:g} GPU (ScalingConfig(resources_per_worker="
                         f"{{'GPU': {share:g}}})); fix: give each a whole GPU, resources_per_worker={{'GPU': 1}} "
                         f"(the default with use_gpu=True), with num_workers no more than the cluster's GPUs.")
        if check.context.launcher == "ray":  # a verl worker group: its RayResourcePool's settings, named
            from ..ray.verl import duplicate_note

            verl = duplicate_note(os.environ, share if isinstance(share, float) else None,
                                  exc.details.get("shared") or [])
            note += f" {verl}" if verl else ""
        add_note(exc, note)
        record(type(exc).__name__, f"{exc}\n{chosen.how}")
        raise
    except GpuGuardError as exc:
        record(type(exc).__name__, str(exc))
        raise
    try:  # other programs' memory on this rank's GPU (GPUGUARD_REQUIRE_EXCLUSIVE=1: an error on every rank)
        if chosen is not None:
            check_gpu_processes(store, me, namespace=verdict.namespace, deadline=deadline,
                                require_exclusive=os.environ.get("GPUGUARD_REQUIRE_EXCLUSIVE", "") == "1")
    except GpuGuardError as exc:
        record(type(exc).__name__, str(exc))
        raise
    record(verdict.kind, verdict.message)
    if chosen is not None and n:  # from now on, a context made on another GPU is reported where it is made
        from ..system import context_monitor

        context_monitor.start(me.rank, chosen.index)
