"""Tensor-device consistency: assert_same_device, the @same_device decorator and guard(module).

The checks run in C++ (gpuguard._libtorch, loaded on first use by _libtorch_loader): it reads the module's
parameter, buffer and submodule dicts and each tensor's device on every call, so the answer always describes the
model as it is now. Names are only gathered once a check has failed, for the report carried by
DeviceMismatchError. Where _libtorch cannot load (built for another torch, or missing), tensor_checks() gives
gpuguard.tensors._python_checks instead: the same checks and reports in Python, slower.
"""

from __future__ import annotations

import functools
import sys
import weakref
from typing import Any, Callable, Optional, TypeVar, Union

import torch
from torch import nn

from . import traced_checks
from .arg_names import _forward_arg_names, _positional_names
from .implementation import tensor_checks
from ..errors import DeviceMismatchError

# True only in code torch.compile's Dynamo traces, where it sends the checks to traced_checks (run at trace time on
# Dynamo's fake tensors); a plain False everywhere else. torch.compiler.is_dynamo_compiling exists since torch 2.3.
_dynamo_tracing = torch.compiler.is_dynamo_compiling

__all__ = ["GuardHandle", "assert_same_device", "find_device_mismatch", "guard", "same_device"]

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

    In code torch.compile traces it checks once, at trace time, and returns the common device as a constant of
    the compiled code (GPUGUARD_DISABLE is then read at trace time, and the device is returned all the same).
    """
    if _dynamo_tracing():
        device = _as_device(expected)
        if isinstance(model_or_tensor, nn.Module):
            found = traced_checks.run(_check_inputs, model_or_tensor, tensors, None, _tensors_arg_names, device)
            return traced_checks.common_device(model_or_tensor, found, device)
        found = traced_checks.run(_check_inputs, None, (model_or_tensor, *tensors), None, _call_arg_names, device)
        return traced_checks.common_device(None, found, device)
    checks = tensor_checks()
    if checks.checks_disabled():
        return None
    device = _as_device(expected)
    if isinstance(model_or_tensor, nn.Module):
        return checks.check_call(model_or_tensor, tensors, None, device, _tensors_labels)
    return checks.check_call(None, (model_or_tensor, *tensors), None, device, _call_labels)


def find_device_mismatch(model_or_tensor: Any, *tensors: Any,
                         expected: Optional[DeviceLike] = None) -> Optional[DeviceMismatchError]:
    """The same check as ``assert_same_device``, answered instead of raised: the ``DeviceMismatchError`` it
    would raise (message, ``cause``, ``fix``, ``groups``, ``devices``...), or None when the tensors agree.

    For code that reports rather than stops, e.g. explaining a PyTorch "Expected all tensors to be on the
    same device" error after it happened. Runs even with ``GPUGUARD_DISABLE=1`` (it is asked for explicitly).
    Bad arguments still raise (TypeError, ValueError).
    """
    checks = tensor_checks()
    device = _as_device(expected)
    try:
        if isinstance(model_or_tensor, nn.Module):
            checks.check_call(model_or_tensor, tensors, None, device, _tensors_labels)
        else:
            checks.check_call(None, (model_or_tensor, *tensors), None, device, _call_labels)
    except DeviceMismatchError as mismatch:
        mismatch.__traceback__ = None  # returned, not raised: no frames kept alive through it
        return mismatch
    return None


def _tensors_labels(n: int) -> list[str]:
    return [f"tensors[{i}]" for i in range(n)]


def _call_labels(n: int) -> list[str]:
    return ["model_or_tensor"] + [f"tensors[{i}]" for i in range(n - 1)]


def _tensors_arg_names(module: Any, n: int) -> list[str]:
    return _tensors_labels(n)


def _call_arg_names(module: Any, n: int) -> list[str]:
    return _call_labels(n)


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

    def arg_names(module: Any, n: int) -> list[str]:
        return labels(n, module is not None)

    @functools.wraps(fn)
    def checked(*args: Any, **kwargs: Any) -> Any:
        if _dynamo_tracing():
            module = args[0] if args and isinstance(args[0], nn.Module) else None
            traced_checks.run(_check_inputs, module, args[1:] if module is not None else args, kwargs, arg_names,
                              None)
            return fn(*args, **kwargs)
        checks = tensor_checks()
        if not checks.checks_disabled():
            if args and isinstance(args[0], nn.Module):
                checks.check_call(args[0], args[1:], kwargs, None, lambda n: labels(n, True))
            else:
                checks.check_call(None, args, kwargs, None, lambda n: labels(n, False))
        return fn(*args, **kwargs)

    return checked  # type: ignore[return-value]


def _check_inputs(module: Optional[nn.Module], args: tuple[Any, ...], kwargs: Optional[dict[str, Any]],
                  expected: Optional[torch.device] = None) -> None:
    """assert_same_device's and @same_device's check with every input already named (traced_checks.run)."""
    checks = tensor_checks()
    if not checks.checks_disabled():
        checks.check_call(module, args, kwargs, expected, None)


def _traceable(check: Callable[..., None]) -> Callable[..., None]:
    """The pre-hook ``check`` (C++, or the Python implementation's) as the hook guard() registers: eagerly ``check``
    itself (one Python call more); while torch.compile traces, the same check at trace time (traced_checks), which
    Dynamo can follow."""

    def hook(module: nn.Module, args: Any, kwargs: Any = None) -> None:
        if _dynamo_tracing():
            traced_checks.run(check, module, args, kwargs, _forward_arg_names, None)
            return None
        return check(module, args, kwargs)

    hook.__qualname__ = hook.__name__ = getattr(check, "__name__", "gpuguard_check")
    return hook


class GuardHandle:
    """What guard() returns: ``remove()`` takes every hook it added away (idempotent). Also a context
    manager: ``with gpuguard.guard(model): ...`` removes the hooks on exit."""

    def __init__(self, module: nn.Module, deep: bool) -> None:
        # weakly: a handle kept after the model is dropped must not keep the model (and its GPU memory) alive
        self._module_ref = weakref.ref(module)
        self._module_type = type(module).__name__
        self.deep = deep
        self._handles: list[Any] = []
        self._deep: Optional[_DeepGuard] = None

    @property
    def module(self) -> Optional[nn.Module]:
        """The guarded module, or None once it was freed."""
        return self._module_ref()

    @property
    def hooked_layers(self) -> list[str]:
        """deep=True: the qualified names of the layers currently checked ("" is the root)."""
        return self._deep.hooked_layers() if self._deep is not None else []

    def remove(self) -> None:
        if self._deep is not None:
            self._deep.unhook_layers()
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
        return f"<gpuguard.GuardHandle {self._module_type}{mode} {state}>"


def _owns_parameters(module: nn.Module) -> bool:
    return any(p is not None for p in module._parameters.values())


class _Leave:
    """The root's forward ended: DeepGuard.leave() as traced_checks.run calls it while torch.compile traces."""

    def __init__(self, state: Any) -> None:
        self._state = state

    def __call__(self, module: nn.Module, args: Any, kwargs: Any) -> None:
        self._state.leave()


class _DeepGuard:
    """deep=True: the root's first pre-hook and its always-called forward hook.

    On entry it remembers the caller's tensors (so that a layer's report can tell an input placed by the
    caller from an activation made inside the model), checks the root's own parameters when it owns some,
    and, when the module tree changed since the layers were hooked (submodules added or replaced,
    parameters added), hooks them again, so no layer goes unchecked.

    The root's own check runs here, never as a hook of its own: a hook removed while the root's hooks run is
    still called by PyTorch in that forward, without its keyword arguments. Layers whose module and name did
    not change keep their hook.

    Known limit: a layer whose own forward is wrapped by a framework that moves its inputs (accelerate's
    AlignDevicesHook on a leaf listed in a device map) is checked before the wrapper moves them.
    """

    def __init__(self, root: nn.Module) -> None:
        self._state = tensor_checks().DeepGuard(root)
        self._leave_traced = _Leave(self._state)
        self._root_check: Optional[Callable[..., None]] = None
        self._layers: dict[str, tuple[Any, Any]] = {}  # name -> (weak reference to the module, hook handle)

    def __call__(self, module: nn.Module, args: Any, kwargs: Any = None) -> None:
        if _dynamo_tracing():  # this same call, run at trace time on Dynamo's fake tensors
            traced_checks.run(self, module, args, kwargs, _forward_arg_names, None)
            return
        if self._state.enter(module, args, kwargs):
            self.hook_layers(module)
        if self._root_check is not None:
            self._root_check(module, args, kwargs)

    def after_forward(self, module: nn.Module, args: Any, output: Any) -> None:
        if _dynamo_tracing():
            traced_checks.run(self._leave_traced, module, (), None, _forward_arg_names, None)
            return
        self._state.leave()

    def hooked_layers(self) -> list[str]:
        return ([""] if self._root_check is not None else []) + list(self._layers)

    def hook_layers(self, root: nn.Module) -> None:
        self._root_check = None
        if _owns_parameters(root):
            self._root_check = self._state.layer_hook("", type(root).__name__)
        wanted = {name: sub for name, sub in root.named_modules() if name and _owns_parameters(sub)}
        for name in [n for n, (ref, _) in self._layers.items() if ref() is not wanted.get(n)]:
            self._layers.pop(name)[1].remove()
        layers: dict[str, tuple[Any, Any]] = {}
        for name, sub in wanted.items():  # module order, as named_modules() gives it
            kept = self._layers.get(name)
            if kept is None:
                hook = _traceable(self._state.layer_hook(name, type(sub).__name__))
                kept = (weakref.ref(sub), sub.register_forward_pre_hook(hook, with_kwargs=True))
            layers[name] = kept
        self._layers = layers

    def unhook_layers(self) -> None:
        for _, h in self._layers.values():
            h.remove()
        self._layers.clear()
        self._root_check = None


def _inside_compiled(module: nn.Module) -> nn.Module:
    """The model inside what torch.compile(model) returned: hooked there, the checks run while Dynamo traces and
    never in a compiled step; on the wrapper they would run eagerly around every step."""
    eval_frame = sys.modules.get("torch._dynamo.eval_frame")  # no wrapper exists before Dynamo was imported
    while eval_frame is not None and isinstance(module, eval_frame.OptimizedModule):
        module = module._orig_mod
    return module


def guard(module: nn.Module, *, deep: bool = False) -> GuardHandle:
    """Checks devices on every forward of ``module`` through forward pre-hooks (keyword arguments included).

    ``deep=False``: every parameter and buffer of the module and every tensor input share one device.
    ``deep=True``: every submodule owning parameters is checked on entry against its own inputs, and the
    first layer whose inputs sit on another device than its own weights is named: the exact layer where
    PyTorch would fail. A model split across devices on purpose (each layer's inputs on its weights' device)
    passes. Returns a handle whose ``remove()`` takes the hooks away. ``GPUGUARD_DISABLE=1`` makes every
    check a no-op.

    Under torch.compile the checks run once, when Dynamo traces the model, and a compiled step runs none. Guard
    the model before its first compiled call: Dynamo does not watch a module's hooks, so a guard added later is
    only checked once something else makes it compile again. Given what torch.compile returned, the model
    inside it is guarded.
    """
    if not isinstance(module, nn.Module):
        raise TypeError(f"gpuguard.guard expects an nn.Module, not {type(module).__name__}")
    module = _inside_compiled(module)
    checks = tensor_checks()
    handle = GuardHandle(module, deep)
    if not deep:
        handle._handles.append(module.register_forward_pre_hook(_traceable(checks.forward_hook()), with_kwargs=True))
        return handle
    deep_guard = _DeepGuard(module)
    deep_guard._state.enter(module, (), None)  # the tree as it is now; no call in progress
    deep_guard._state.leave()
    deep_guard.hook_layers(module)
    handle._deep = deep_guard
    # prepend: the tree is re-synced before any other pre-hook of the root runs; always_call: a forward that
    # raised still ends the call the layers' reports refer to
    handle._handles.append(module.register_forward_pre_hook(deep_guard, with_kwargs=True, prepend=True))
    handle._handles.append(module.register_forward_hook(deep_guard.after_forward, always_call=True))
    return handle
