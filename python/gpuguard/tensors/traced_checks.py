"""The tensor checks in code torch.compile traces: the half Dynamo traces, which reads containers and nothing else.

guard()'s hooks, @same_device and guard(deep=True)'s root hooks begin with ``torch.compiler.is_dynamo_compiling()``
(tensor_devices.py): a plain ``False`` in eager mode, which keeps the C++ fast path, and folded to ``True`` by
Dynamo, which cannot trace into C++ (a graph break; with fullgraph=True an error). Under Dynamo they call ``run()``.
It walks the call's arguments as the C++ walker does (tuples, lists, namedtuples, dicts, dataclasses), naming each
tensor as the eager report names it, and hands names and tensors to Dynamo's ``comptime``, which runs
compile_time.run_now at trace time. Reading containers adds no node to the graph and no guard to the compiled
code: the compiled step runs no gpuguard code at all.
"""

from __future__ import annotations

from typing import Any, Callable, Optional

import torch

__all__ = ["run"]

# How deep run() follows nested containers. Dynamo inlines each level as a call; real inputs nest a few levels.
MAX_NESTING = 32

_PLAIN_LEAVES = (type(None), bool, int, float, complex, str, bytes)


# ---- traced by Dynamo -----------------------------------------------------------------------------------

def run(fn: Callable[..., Any], module: Any, args: Any, kwargs: Optional[dict[str, Any]],
        arg_names: Callable[[Any, int], list[str]], expected: Optional[torch.device]) -> list[Any]:
    """At trace time, ``fn(module, (), {name: tensor})`` (with ``expected=`` when not None): the check, given every
    tensor of the call by the name the eager report gives it (``arg_names(module, len(args))`` names the
    positional arguments). Returns the tensors it found.

    Traced by Dynamo: only containers are read here, so the graph gains nothing. (No default argument: Dynamo
    would guard it on every compiled call.)
    """
    slots: list[Any] = []
    paths: list[str] = []
    tensors: list[Any] = []
    positional = 0
    if isinstance(args, tuple):
        positional = len(args)
        for i, value in enumerate(args):
            if isinstance(value, torch.Tensor):  # the common case, without a call (each costs Dynamo time)
                slots.append(i)
                paths.append("")
                tensors.append(value)
            else:
                _collect(value, i, "", slots, paths, tensors, 0)
    elif args is not None:
        positional = 1
        _collect(args, 0, "", slots, paths, tensors, 0)
    if kwargs:
        for key, value in kwargs.items():
            _collect(value, str(key), "", slots, paths, tensors, 0)
    # torch._dynamo is loaded whenever this runs (Dynamo is tracing it), but importing it here, where Dynamo
    # traces the import, fails on torch 2.6: it is reached through torch
    torch._dynamo.comptime.comptime(_run_now)
    return tensors


def common_device(module: Any, tensors: list[Any], expected: Optional[torch.device]) -> Optional[torch.device]:
    """What assert_same_device returns once the check passed, read from metadata Dynamo knows while tracing: every
    tensor agrees, so the first that is not a 0-dim CPU tensor (which agrees with any device) gives the device."""
    if expected is not None:
        return expected
    scalar = False
    for t in tensors:
        if t.device.type != "cpu" or t.dim() != 0:
            return t.device
        scalar = True
    if module is not None:
        for owned in (module.parameters(), module.buffers()):
            for t in owned:
                if t.device.type != "cpu" or t.dim() != 0:
                    return t.device
                scalar = True
    return torch.device("cpu") if scalar else None


def _collect(obj: Any, slot: Any, path: str, slots: list[Any], paths: list[str], tensors: list[Any],
             depth: int) -> None:
    """The tensors inside ``obj`` with their paths, named as collect_tensors.cc names them for the report:
    ``[i]`` in a list or tuple, ``.field`` in a namedtuple or dataclass, ``['key']`` in a dict."""
    if isinstance(obj, torch.Tensor):
        slots.append(slot)
        paths.append(path)
        tensors.append(obj)
        return
    if depth >= MAX_NESTING or isinstance(obj, _PLAIN_LEAVES):
        return
    if isinstance(obj, (tuple, list)):
        fields = getattr(type(obj), "_fields", None) if isinstance(obj, tuple) and type(obj) is not tuple else None
        for i, item in enumerate(obj):
            if isinstance(fields, tuple) and i < len(fields):
                sub = path + "." + str(fields[i])
            else:
                sub = path + "[" + str(i) + "]"
            _collect(item, slot, sub, slots, paths, tensors, depth + 1)
        return
    if isinstance(obj, dict):
        for key, value in obj.items():
            shown = "'" + key + "'" if isinstance(key, str) else repr(key)
            _collect(value, slot, path + "[" + shown + "]", slots, paths, tensors, depth + 1)
        return
    fields = getattr(type(obj), "__dataclass_fields__", None)
    if isinstance(fields, dict) and not isinstance(obj, type):
        for name in fields:
            if hasattr(obj, name):  # a field without a value (init=False, never set) holds nothing
                _collect(getattr(obj, name), slot, path + "." + name, slots, paths, tensors, depth + 1)


# ---- executed by Dynamo while it traces ---------------------------------------------------------------

def _run_now(ctx: Any) -> None:
    from .compile_time import run_now
    run_now(ctx)
