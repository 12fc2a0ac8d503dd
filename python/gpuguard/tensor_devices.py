"""Tensor-device consistency: assert_same_device, the @same_device decorator and guard(module).

The checks run in the C++ core (gpuguard._C): it reads the module's parameter, buffer and submodule dicts and
each tensor's device on every call, so the answer always describes the model as it is now. Names are only
gathered once a check has failed, for the report carried by DeviceMismatchError.
"""

from __future__ import annotations

import functools
import inspect
from typing import Any, Callable, Optional, TypeVar, Union

import torch
from torch import nn

from . import _C

__all__ = ["GuardHandle", "assert_same_device", "guard", "same_device"]

DeviceLike = Union[torch.device, str, int]
F = TypeVar("F", bound=Callable[..., Any])


def _as_device(expected: Optional[DeviceLike]) -> Optional[torch.device]:
    if expected is None or isinstance(expected, torch.device):
        return expected
    if isinstance(expected, (str, int)):
        try:
            return torch.device(expected)
        except RuntimeError as exc:
            raise ValueError(f"gpuguard: expected={expected!r} is not a device ({exc}); "
                             f"pass a torch.device or a string such as 'cuda:0' or 'cpu'") from None
    raise TypeError(f"gpuguard: expected= must be a torch.device or a string such as 'cuda:0', "
                    f"not {type(expected).__name__}")


def assert_same_device(model_or_tensor: Any, *tensors: Any,
                       expected: Optional[DeviceLike] = None) -> Optional[torch.device]:
    """Checks that a model's parameters and buffers and the given inputs all sit on one device.

    ``model_or_tensor`` is an ``nn.Module`` (every parameter and buffer, by qualified name) or an input;
    inputs may be tensors or lists, tuples, dicts, namedtuples and dataclasses nesting them (``None`` and
    other leaves are skipped). With ``expected``, every tensor must be on that device.

    Returns the common device (``None`` when no tensor was given). Raises ``DeviceMismatchError``, whose
    message groups the tensors by device and ends with the fix, and whose ``groups`` hold the same as data.
    With ``GPUGUARD_DISABLE=1`` nothing is checked and ``None`` is returned.
    """
    if _C.checks_disabled():
        return None
    device = _as_device(expected)
    if isinstance(model_or_tensor, nn.Module):
        return _C.check_call(model_or_tensor, tensors, None, device, _tensors_labels)
    return _C.check_call(None, (model_or_tensor, *tensors), None, device, _call_labels)


def _tensors_labels(n: int) -> list[str]:
    return [f"tensors[{i}]" for i in range(n)]


def _call_labels(n: int) -> list[str]:
    return ["model_or_tensor"] + [f"tensors[{i}]" for i in range(n - 1)]


def same_device(fn: F) -> F:
    """Decorator: checks every call of ``fn`` before it runs.

    On a ``forward`` method (or any function whose first argument is an ``nn.Module``) that module's
    parameters and buffers take part; every tensor argument does, nested ones included. Raises
    ``DeviceMismatchError`` naming the arguments by parameter name.
    """
    if not callable(fn):
        raise TypeError(f"gpuguard.same_device decorates a function or a forward method, not {type(fn).__name__}")

    def labels(n: int, has_module: bool) -> list[str]:
        names = _positional_names(fn, n + (1 if has_module else 0))
        return names[1:] if has_module else names

    @functools.wraps(fn)
    def checked(*args: Any, **kwargs: Any) -> Any:
        if not _C.checks_disabled():
            if args and isinstance(args[0], nn.Module):
                _C.check_call(args[0], args[1:], kwargs, None, lambda n: labels(n, True))
            else:
                _C.check_call(None, args, kwargs, None, lambda n: labels(n, False))
        return fn(*args, **kwargs)

    return checked  # type: ignore[return-value]


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


def _forward_arg_names(module: nn.Module, n: int) -> list[str]:
    """Names of a forward's positional arguments (``self`` excluded), for the C++ pre-hooks' reports."""
    return _positional_names(module.forward, n)


class GuardHandle:
    """What guard() returns: ``remove()`` takes every hook it added away (idempotent). Also a context
    manager: ``with gpuguard.guard(model): ...`` removes the hooks on exit."""

    def __init__(self, module: nn.Module, deep: bool) -> None:
        self.module = module
        self.deep = deep
        self._handles: list[Any] = []
        self._layer_handles: list[Any] = []

    @property
    def hooked_layers(self) -> list[str]:
        """deep=True: the qualified names of the layers currently hooked ("" is the root)."""
        return [name for name, _ in self._layer_handles]

    def remove(self) -> None:
        for _, h in self._layer_handles:
            h.remove()
        self._layer_handles.clear()
        for h in self._handles:
            h.remove()
        self._handles.clear()

    def __enter__(self) -> "GuardHandle":
        return self

    def __exit__(self, *exc: object) -> None:
        self.remove()

    def __repr__(self) -> str:
        state = "active" if self._handles else "removed"
        mode = ", deep=True" if self.deep else ""
        return f"<gpuguard.GuardHandle {type(self.module).__name__}{mode} {state}>"


def _owns_parameters(module: nn.Module) -> bool:
    return any(p is not None for p in module._parameters.values())


class _DeepGuard:
    """deep=True: the root's first pre-hook. When the module tree changed since the layers were hooked
    (submodules added or replaced, parameters added), it hooks them again, so no layer goes unchecked."""

    def __init__(self, handle: GuardHandle) -> None:
        self._handle = handle
        self._watch = _C.TreeWatch()

    def __call__(self, module: nn.Module, args: Any, kwargs: Any) -> None:
        if self._watch.changed(module):
            self.hook_layers(module)

    def hook_layers(self, root: nn.Module) -> None:
        for _, h in self._handle._layer_handles:
            h.remove()
        self._handle._layer_handles.clear()
        for name, sub in root.named_modules():
            if _owns_parameters(sub):
                hook = _C.layer_hook(name, type(sub).__name__)
                self._handle._layer_handles.append(
                    (name, sub.register_forward_pre_hook(hook, with_kwargs=True)))


def guard(module: nn.Module, *, deep: bool = False) -> GuardHandle:
    """Checks devices on every forward of ``module`` through forward pre-hooks (keyword arguments included).

    ``deep=False``: every parameter and buffer of the module and every tensor input share one device.
    ``deep=True``: every submodule owning parameters is checked on entry against its own inputs, and the
    first layer whose inputs sit on another device than its own weights is named: the exact layer where
    PyTorch would fail. A model split across devices on purpose (each layer's inputs on its weights' device)
    passes. Returns a handle whose ``remove()`` takes the hooks away. ``GPUGUARD_DISABLE=1`` makes every
    check a no-op.
    """
    if not isinstance(module, nn.Module):
        raise TypeError(f"gpuguard.guard expects an nn.Module, not {type(module).__name__}")
    handle = GuardHandle(module, deep)
    if not deep:
        handle._handles.append(module.register_forward_pre_hook(_C.forward_hook(), with_kwargs=True))
        return handle
    deep_guard = _DeepGuard(handle)
    deep_guard._watch.changed(module)
    deep_guard.hook_layers(module)
    # prepend: the tree is re-synced before any layer hook of the root itself runs
    handle._handles.append(module.register_forward_pre_hook(deep_guard, with_kwargs=True, prepend=True))
    return handle
