"""The collectives watch() tracks: torch.distributed's public collective functions, wrapped while it runs.

The fallback of watch() where torch's flight recorder cannot be read (see recorder.py): the functions themselves
are wrapped, in ``torch.distributed`` and ``torch.distributed.distributed_c10d`` both (torch's own helpers, e.g.
``all_gather_object``, call them through the latter), and restored by ``restore()``. A collective issued with
``async_op=True`` completes when its Work's future does; one issued below Python (DDP's reducer, FSDP) is not
seen, nor is a name bound before watch() started (``from torch.distributed import all_reduce``). The wrappers
also start a watch() called before ``init_process_group`` at the first collective.
"""

from __future__ import annotations

import functools
import inspect
import sys
from typing import Any, Callable, Optional

import torch
import torch.distributed as dist
from torch.distributed import distributed_c10d

#: The collectives every rank of a group must call in the same order (point-to-point send/recv are not).
COLLECTIVES = ("all_reduce", "broadcast", "all_gather", "all_gather_into_tensor", "reduce_scatter",
               "reduce_scatter_tensor", "all_to_all", "all_to_all_single", "barrier", "reduce", "gather",
               "scatter", "monitored_barrier")

#: enter(OP_NAME, group, first argument, call site) -> token; leave(token, what the call returned or None)
Enter = Callable[[str, Any, Any, str], Any]
Leave = Callable[[Any, Any], None]


_DTYPE_NAMES: dict[Any, str] = {}


def describe_sizes(first: Any) -> str:
    """'float32[4]' for a tensor, 'list[4] of float32[4]' for a list of tensors; '' otherwise."""
    if isinstance(first, torch.Tensor):
        dtype = first.dtype
        name = _DTYPE_NAMES.get(dtype)
        if name is None:
            name = _DTYPE_NAMES[dtype] = str(dtype).replace("torch.", "")
        return f"{name}[{first.numel()}]"
    if isinstance(first, (list, tuple)) and first and isinstance(first[0], torch.Tensor):
        return f"list[{len(first)}] of {describe_sizes(first[0])}"
    return ""


def _wrap(name: str, original: Callable[..., Any], enter: Enter, leave: Leave) -> Callable[..., Any]:
    params = list(inspect.signature(original).parameters)
    group_at = params.index("group") if "group" in params else None
    takes_tensor = bool(params) and params[0] not in ("group",)
    op = name.upper()

    @functools.wraps(original)
    def tracked(*args: Any, **kwargs: Any) -> Any:
        if "group" in kwargs:
            group = kwargs["group"]
        else:
            group = args[group_at] if group_at is not None and len(args) > group_at else None
        first = (args[0] if args else kwargs.get(params[0])) if takes_tensor else None
        caller = sys._getframe(1)
        token = enter(op, group, first, f"{caller.f_code.co_filename}:{caller.f_lineno}")
        result = None
        try:
            result = original(*args, **kwargs)
            return result
        finally:
            leave(token, result)

    tracked.__gpuguard_original__ = original  # type: ignore[attr-defined]
    return tracked


def _after(original: Callable[..., Any], then: Callable[[], None]) -> Callable[..., Any]:
    @functools.wraps(original)
    def initialised(*args: Any, **kwargs: Any) -> Any:
        result = original(*args, **kwargs)
        then()
        return result

    initialised.__gpuguard_original__ = original  # type: ignore[attr-defined]
    return initialised


class Wrapped:
    """The collectives as wrapped by one watch(), and init_process_group (``on_init`` runs after it);
    restore() puts the originals back."""

    def __init__(self, enter: Enter, leave: Leave, on_init: Optional[Callable[[], None]] = None) -> None:
        self._saved: list[tuple[Any, str, Any]] = []
        if on_init is not None:  # each module's own: the zero-code mode's patch of dist's one keeps working
            for module in (dist, distributed_c10d):
                current = module.init_process_group
                self._saved.append((module, "init_process_group", current))
                module.init_process_group = _after(current, on_init)
        for name in COLLECTIVES:
            original = getattr(distributed_c10d, name, None)
            if original is None:
                continue
            original = getattr(original, "__gpuguard_original__", original)
            tracked = _wrap(name, original, enter, leave)
            for module in (dist, distributed_c10d):
                if getattr(module, name, None) is not None:
                    self._saved.append((module, name, getattr(module, name)))
                    setattr(module, name, tracked)

    def restore(self) -> None:
        for module, name, original in reversed(self._saved):
            setattr(module, name, original)
        self._saved.clear()


def group_identity(group: Optional[Any]) -> tuple[Any, str, str, list[int]]:
    """(the group object, its name (the same on every rank), what users call it, its global ranks)."""
    pg = group if group is not None else distributed_c10d._get_default_group()
    name = distributed_c10d._get_process_group_name(pg)
    desc = getattr(pg, "group_desc", "") or ""
    if not desc or desc == "undefined":
        desc = name
    return pg, name, desc, list(dist.get_process_group_ranks(pg))
