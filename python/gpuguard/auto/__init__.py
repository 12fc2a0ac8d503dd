"""gpuguard.auto: every gpuguard check on a job nobody edited (``gpuguard run``, ``GPUGUARD=1``, the Ray hook).

``enable()`` wraps a few public torch entry points and ``disable()`` puts every one of them back:

- ``torch.cuda.set_device(n)``, ``module.to("cuda:n")``, ``module.cuda(n)``, DDP's ``device_ids=[n]``: n
  checked against the GPUs this process sees, before torch (device_index). Not ``Tensor.to``/``.cuda``: torch
  hands ``torch.Tensor.<name>`` to ``__torch_function__``, so a wrapper there breaks subclasses that check
  which method they got (LazyModule's UninitializedParameter refuses every ``.to`` with it);
- ``torch.distributed.init_process_group``: NCCL-backed groups get bind()'s cross-rank duplicate check, once,
  before their first communicator (group_check), triggered by ``device_id=``, ``set_device`` after init,
  DDP/FSDP construction or the first collective (those wrappers are removed once the check ran);
- ``sys.excepthook`` / ``threading.excepthook``: a device-mismatch RuntimeError gets gpuguard's report (enrich),
  and gpuguard's reports are printed in one write, whole among other ranks' output (excepthooks);
- with ``GPUGUARD_GUARD=1``, ``guard(deep=True)`` on every module given to DDP/FSDP;
- ``torch.load``, ``torch.cuda.synchronize``/``mem_get_info``/``empty_cache`` (and ``set_device``): once the group
  check has bound the rank, a CUDA context such a call made on another GPU is reported with its stack
  (context_monitor, which also polls the driver for contexts made elsewhere).
"""

from __future__ import annotations

import functools
import inspect
import os
import sys
import threading
from typing import TYPE_CHECKING, Any, Callable, Optional

from ..system import context_monitor
from . import device_index, enrich as _enrich, excepthooks, group_check
from .patches import Patches

if TYPE_CHECKING:
    from ..watchdog import Watch

__all__ = ["disable", "enable", "enrich", "is_enabled"]

_patches = Patches()
_lock = threading.Lock()
_enabled = False
_announced = False
_rank_announced = False  # this process's rank was said, at start or at init_process_group
_watch: Optional["Watch"] = None  # the watchdog GPUGUARD_WATCH=1 started

#: torch.distributed calls that use the default group's communicator: the first one runs the pending check.
COLLECTIVES = ("all_reduce", "all_gather", "all_gather_into_tensor", "all_gather_object", "broadcast",
               "broadcast_object_list", "reduce", "reduce_scatter", "reduce_scatter_tensor", "all_to_all",
               "all_to_all_single", "barrier", "gather", "scatter", "send", "recv", "isend", "irecv",
               "batch_isend_irecv")


def enrich(exc: BaseException) -> bool:
    """Attaches gpuguard's report to a device-mismatch exception the caller caught (a framework that reports
    exceptions itself, e.g. Ray, never reaches sys.excepthook); True when a report was attached."""
    return _enrich.enrich(exc)


def is_enabled() -> bool:
    return _enabled


def _flag(name: str) -> bool:
    return os.environ.get(name, "").strip().lower() not in ("", "0", "false", "no", "off")


# ---- the wrappers ------------------------------------------------------------------------------------------

def _check_group(trigger: str, chosen: Optional[group_check.Chosen] = None) -> None:
    """Runs the pending group check (once); whatever its outcome, the collective wrappers go: they exist only
    to trigger it."""
    if group_check.pending() is None:
        return
    try:
        group_check.run(trigger, chosen)
    finally:
        _disarm_collectives()


def _set_device(original: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(original)
    def set_device(device: Any) -> Any:
        index = device_index.index_of(device)
        if index is not None and index >= 0:
            call = f"torch.cuda.set_device({device!r})"
            if group_check.pending() is not None:
                # after init: the rank meets the others on this device (a bad index is published first, so
                # every rank stops, naming it)
                _check_group("torch.cuda.set_device after init_process_group", group_check.Chosen(index, call))
            else:
                device_index.check_index(index, call)
            group_check.note_set_device(index)
        result = original(device)
        context_monitor.after_call(f"torch.cuda.set_device({device!r})")
        return result
    return set_device


def _watched_call(name: str) -> Callable[[Any], Any]:
    """A torch call that may make a CUDA context (torch.load without map_location, torch.cuda.synchronize() on
    the current device, ...): once the rank is bound, a context it made on another GPU is reported with the stack."""
    def make(original: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(original)
        def watched(*args: Any, **kwargs: Any) -> Any:
            result = original(*args, **kwargs)
            if context_monitor.current() is not None:
                context_monitor.after_call(name)
            return result
        return watched
    return make


def _module_to(original: Callable[..., Any]) -> Callable[..., Any]:
    """``model.to("cuda:n")`` / ``model.to(torch.device("cuda", n))``: the same index check as set_device."""
    @functools.wraps(original)
    def to(self: Any, *args: Any, **kwargs: Any) -> Any:
        device = args[0] if args else kwargs.get("device")
        if device is not None and not isinstance(device, int):  # an int is a dtype-less index only in Tensor.to
            index = device_index.index_of(device)
            if index is not None and index >= 0:
                device_index.check_index(index, f"{type(self).__name__}.to({device!r})")
        return original(self, *args, **kwargs)
    return to


def _module_cuda(original: Callable[..., Any]) -> Callable[..., Any]:
    """``model.cuda(n)`` (which moves the parameters with Tensor.cuda, not Module.to): the same check."""
    @functools.wraps(original)
    def cuda(self: Any, *args: Any, **kwargs: Any) -> Any:
        device = args[0] if args else kwargs.get("device")
        index = device_index.index_of(device) if device is not None else None
        if index is not None and index >= 0:
            device_index.check_index(index, f"{type(self).__name__}.cuda({device!r})")
        return original(self, *args, **kwargs)
    return cuda


def _init_process_group(original: Callable[..., Any]) -> Callable[..., Any]:
    signature = inspect.signature(original)

    @functools.wraps(original)
    def init_process_group(*args: Any, **kwargs: Any) -> Any:
        try:
            kwargs = dict(signature.bind_partial(*args, **kwargs).arguments)
        except TypeError:
            return original(*args, **kwargs)  # let torch say what is wrong with the arguments
        extra = kwargs.pop("kwargs", None)
        if isinstance(extra, dict):
            kwargs.update(extra)
        check = group_check.before_init(kwargs, kwargs.get("backend"))
        _announce_rank(check.context if check is not None else None, kwargs)
        if _flag("GPUGUARD_GUARD"):
            _arm_module_wrappers()  # guard(deep=True) whatever the backend (gloo on the CPU too)
        if check is not None and not check.gpu:  # its ranks alone: nothing to wait for, checked at once
            _check_group("init_process_group (a group without NCCL: its ranks, not their GPUs)")
        elif check is not None:
            _arm_triggers()
            device_id = kwargs.get("device_id")
            index = device_index.index_of(device_id) if device_id is not None else None
            if index is not None:
                _check_group("init_process_group(device_id=...)",
                                group_check.Chosen(index, f"init_process_group(device_id={device_id!r})"))
            elif group_check.torch_cannot_build_nccl_here():
                _check_group("init_process_group (this torch sees no CUDA device, so torch's NCCL group "
                                "would fail inside init)")
        return original(**kwargs)
    return init_process_group


def _before_wrapping(what: str) -> Callable[[Any], Any]:
    """A wrapper of a module class's __init__ that runs the pending check first (and guard() if asked)."""
    def make(original: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(original)
        def __init__(self: Any, module: Any, *args: Any, **kwargs: Any) -> Any:
            chosen = group_check.chosen_by_wrapper(what, module, args, kwargs)
            if group_check.pending() is not None:
                _check_group(f"{what} construction", chosen)  # a bad index is published, every rank stops
            elif chosen is not None:
                device_index.check_index(chosen.index, chosen.how)
            if _flag("GPUGUARD_GUARD"):
                from ..tensors.tensor_devices import guard
                guard(module, deep=True)
            return original(self, module, *args, **kwargs)
        return __init__
    return make


def _collective(name: str) -> Callable[[Any], Any]:
    def make(original: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(original)
        def collective(*args: Any, **kwargs: Any) -> Any:
            call = f"torch.distributed.{name}"
            _check_group(f"the first collective ({call})",
                         group_check.chosen_by_tensor(args[0] if args else kwargs.get("tensor"), call))
            return original(*args, **kwargs)
        return collective
    return make


def _arm_triggers() -> None:
    import torch.distributed as dist

    for name in COLLECTIVES:
        _patches.replace(dist, name, _collective(name))
    _arm_module_wrappers()


def _arm_module_wrappers() -> None:
    """DDP's and FSDP's __init__: the pending group check's trigger, and guard(deep=True) with GPUGUARD_GUARD=1."""
    from torch.nn.parallel import DistributedDataParallel

    _patches.replace(DistributedDataParallel, "__init__", _before_wrapping("DistributedDataParallel"))
    try:
        from torch.distributed.fsdp import FullyShardedDataParallel
    except ImportError:  # pragma: no cover - a torch without FSDP
        return
    _patches.replace(FullyShardedDataParallel, "__init__", _before_wrapping("FullyShardedDataParallel"))


def _disarm_collectives() -> None:
    import torch.distributed as dist

    for name in COLLECTIVES:
        _patches.put_back(dist, name)


# ---- switching it on and off -------------------------------------------------------------------------------

def _announce(origin: str) -> None:
    """One line when gpuguard arms itself, saying who this process is where the launcher says it; where it does
    not (no launcher variables, or no rank among them), that the rank comes at init_process_group, where
    _announce_rank says it: never "single" for what becomes rank 0 of 2."""
    global _announced, _rank_announced
    if _announced:
        return
    _announced = True
    from ..errors import LaunchEnvironmentError, LaunchVariablesIncompleteError
    from ..binding.launchers import detect

    try:
        context = detect()
    except LaunchVariablesIncompleteError:
        context, who = None, "rank not exported by the launcher (read at init_process_group)"
    except LaunchEnvironmentError:
        context, who = None, "launcher variables unreadable"
    if context is not None and context.launcher == "single":
        who = "no launcher variables (a single process, unless init_process_group names a rank)"
    elif context is not None:
        who = f"rank {context.rank}/{context.world_size} ({context.launcher})"
        _rank_announced = True
    extras = " + guard(deep=True) on DDP/FSDP modules" if _flag("GPUGUARD_GUARD") else ""
    if _watch is not None:
        extras += " + a collective watchdog (GPUGUARD_WATCH)"
    sys.stderr.write(f"gpuguard: active (auto) pid {os.getpid()}, {who}, via {origin}: checking set_device, "
                     f"process groups (NCCL: their GPUs), device mismatches{extras}\n")
    sys.stderr.flush()


def _announce_rank(context: Any, kwargs: dict[str, Any]) -> None:
    """At init_process_group, once: the rank this process is, where the line at start could not say it."""
    global _rank_announced
    if _rank_announced:
        return
    if context is None:  # no check prepared (one process; a gloo group left unchecked): its rank, where readable
        from ..errors import GpuGuardError
        from .rank_at_init import context_at_init

        try:
            context = context_at_init(kwargs)
        except GpuGuardError:
            return
    if context.world_size <= 1:
        return
    _rank_announced = True
    sys.stderr.write(f"gpuguard: pid {os.getpid()} is rank {context.rank}/{context.world_size} "
                     f"({context.launcher}: {context.description}), named at init_process_group\n")
    sys.stderr.flush()


def enable(origin: str = "gpuguard.auto.enable()") -> None:
    """Installs the lazy checks (idempotent). Imports torch, never initialises CUDA."""
    global _enabled
    with _lock:
        if _enabled:
            return
        import torch
        import torch.distributed as dist

        _patches.replace(torch.cuda, "set_device", _set_device)
        _patches.replace(torch.nn.Module, "to", _module_to)
        _patches.replace(torch.nn.Module, "cuda", _module_cuda)
        _patches.replace(torch, "load", _watched_call("torch.load"))
        for name in ("synchronize", "mem_get_info", "empty_cache"):
            _patches.replace(torch.cuda, name, _watched_call(f"torch.cuda.{name}"))
        if dist.is_available():
            _patches.replace(dist, "init_process_group", _init_process_group)
        excepthooks.install(_patches)
        global _watch
        from ..watchdog import watch_from_environment

        _watch = watch_from_environment(launch_context=_launch_context)  # GPUGUARD_WATCH=1: the collective watchdog, started before any group
        _enabled = True
    _announce(origin)


def _launch_context() -> Any:
    """This process's launch context, for the watchdog's per-node tier (the watchdog imports no launcher)."""
    from ..binding.launchers import detect

    return detect(os.environ)


def disable() -> None:
    """Puts back every torch attribute enable() replaced, and forgets any pending group check."""
    global _enabled
    global _watch
    with _lock:
        _patches.restore()
        group_check.reset()
        context_monitor.stop()
        if _watch is not None:
            _watch.stop()
            _watch = None
        _enabled = False
    finder = sys.modules.get("_gpuguard_autostart")
    if finder is not None:
        finder.uninstall()
