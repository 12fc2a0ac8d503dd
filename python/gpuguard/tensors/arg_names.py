"""The names a report gives a call's positional arguments, read from the signature; shared by tensor_devices.py, the
Python checks (_python_checks.py) and the C++ pre-hooks (csrc/python/libtorch/device_check.cc imports it by name)."""

from __future__ import annotations

import inspect
from typing import Any, Callable


def _positional_names(fn: Callable[..., Any], n: int) -> list[str]:
    """The parameter names the first ``n`` positional arguments of ``fn`` bind to (``*args`` ones as
    ``args[i]``); only called to write a report."""
    try:
        params = list(inspect.signature(fn).parameters.values())
    except (TypeError, ValueError):
        return [f"args[{i}]" for i in range(n)]
    out: list[str] = []
    for p in params:
        if len(out) == n:
            break
        if p.kind == p.VAR_POSITIONAL:
            out.extend(f"{p.name}[{i}]" for i in range(n - len(out)))
            break
        if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD):
            out.append(p.name)
    out.extend(f"args[{i}]" for i in range(len(out), n))
    return out


def _forward_arg_names(module: Any, n: int) -> list[str]:
    """Names of a forward's positional arguments (``self`` excluded), for the C++ pre-hooks' reports."""
    return _positional_names(module.forward, n)
