"""The tensor checks' trace-time half: run by Dynamo (comptime) while torch.compile traces, on its fake tensors.

traced_checks.run() hands over the call's tensors by name; run_now() reads them as the fake tensors Dynamo traces
with, runs the eager check (C++, or its Python twin) on them and on the module's own tensors, and turns a
DeviceMismatchError into CompileTimeDeviceMismatchError, the form Dynamo passes to the user unchanged. Imported
only while Dynamo traces (it imports torch._dynamo).

Why comptime. The checks must run once, on what Dynamo traces, and leave nothing in the graph. Dynamo cannot trace
into C++ (a graph break; with fullgraph=True an error), and every other way to run real code while it traces costs
something: a custom op with a fake implementation stays in the graph (a call per step, exported by torch.export)
and its errors come back as Dynamo's "observed" RuntimeError with the message only;
torch.compiler.assume_constant_result runs the graph so far (a second forward, on the GPU, while compiling) and
refuses modules on torch 2.6; an error raised in traced Python reaches the user as "Unsupported: Observed
exception" with its fields lost. torch._dynamo.comptime is Dynamo's interface for running Python while it traces:
the check runs as in eager mode, its exception is a Python exception. Two reads go past ComptimeVar's methods
(tested on torch 2.6 and 2.15): the object behind a module's or a hook's local, and a placeholder's real tensor.
Dynamo re-raises any other exception from code it runs while tracing as InternalTorchDynamoError, dropping the
original; TorchRuntimeError it passes through, hence CompileTimeDeviceMismatchError's second base.
"""

from __future__ import annotations

import functools
from typing import Any, NoReturn

import torch
from torch._dynamo.comptime import ComptimeContext, ComptimeVar
from torch._dynamo.exc import TorchRuntimeError

from .implementation import tensor_checks
from ..errors import DeviceMismatchError

__all__ = ["CompileTimeDeviceMismatchError", "run_now"]


class CompileTimeDeviceMismatchError(DeviceMismatchError, TorchRuntimeError):
    """A ``DeviceMismatchError`` found while torch.compile traced the model, before any compiled step ran.

    The same report and fields as the eager check's; Dynamo adds "from user code: ..." (where the check ran)
    after the report. Pickles as the plain ``DeviceMismatchError`` it was made from (a process that unpickles
    it, such as a Ray driver, need not import torch._dynamo).
    """

    def __init__(self, message: str, *, fix: str = "", **details: Any) -> None:
        super().__init__(message, fix=fix, **details)  # GpuGuardError, then TorchRuntimeError (the user's stack)
        self.report = message  # without what Dynamo appends to the message

    @classmethod
    def of(cls, error: DeviceMismatchError) -> "CompileTimeDeviceMismatchError":
        return cls(str(error), fix=error.fix, **error.details)

    def without_fix(self) -> str:
        report = self.report
        if self.fix and report.endswith(self.fix):
            return report[: len(report) - len(self.fix)].rstrip()
        return report

    def __reduce__(self) -> Any:
        return (DeviceMismatchError, (self.report,), {"fix": self.fix, "details": dict(self.details)})


def run_now(ctx: ComptimeContext) -> None:
    fn = _real(ctx.get_local("fn"))
    module = _real(ctx.get_local("module"))
    arg_names = _real(ctx.get_local("arg_names"))
    slots = ctx.get_local("slots").as_python_constant()
    paths = ctx.get_local("paths").as_python_constant()
    tensors = [_traced_tensor(proxy) for proxy in ctx.get_local("tensors").as_proxy()]
    positional = ctx.get_local("positional").as_python_constant()
    names = arg_names(module, positional) if positional else []
    inputs: dict[str, Any] = {}
    for slot, path, tensor in zip(slots, paths, tensors):
        base = names[slot] if isinstance(slot, int) and slot < len(names) else (
            f"args[{slot}]" if isinstance(slot, int) else slot)
        inputs[base + path] = tensor
    expected = ctx.get_local("expected").as_python_constant()
    if expected is not None:
        fn = functools.partial(fn, expected=expected)
    try:
        tensor_checks().run_traced(fn, module, (), inputs)
    except DeviceMismatchError as error:
        _raise_at_trace_time(error)


def _traced_tensor(proxy: Any) -> Any:
    """The tensor a traced value stands for: the fake tensor Dynamo traces it with, or for one the graph receives
    from outside (its placeholder: the caller's inputs, the parameters), the real tensor it was made from. Both
    have the same device, dtype and dimensions; the real one is also the very tensor the caller passed, which is
    how guard(deep=True) tells the caller's inputs from activations, in eager mode as here."""
    node = proxy.node
    if node.op == "placeholder":
        graph_arg = node.meta.get("grapharg")
        try:
            real = graph_arg.example if graph_arg is not None else None
        except Exception:  # noqa: BLE001 - a freed example: the fake tensor is as good for the check
            real = None
        if isinstance(real, torch.Tensor):
            return real
    return node.meta["example_value"]


def _raise_at_trace_time(error: DeviceMismatchError) -> NoReturn:
    # from None: the error raised is the same report; printing the eager one above it would say it twice
    raise CompileTimeDeviceMismatchError.of(error) from None


def _real(var: ComptimeVar) -> Any:
    """The Python object behind a traced local that is no tensor: a constant, a function, a module, a hook.

    ComptimeVar gives constants only. A module, a C function or any other object is a Dynamo VariableTracker that
    holds the object itself: ``value`` (``module`` for a module Dynamo specialises on, in older torch such as
    2.6). Reading it adds no guard: the check's outcome depends only on the devices and dimensions of the
    tensors, which Dynamo guards anyway.
    """
    if var.is_python_constant():
        return var.as_python_constant()
    tracked = var._i_will_not_complain_if_bc_breaks_VariableTracker()
    tracked = tracked.realize()  # a local Dynamo has not looked into yet is a LazyVariableTracker
    for attribute in ("value", "module"):
        if attribute in vars(tracked):
            return vars(tracked)[attribute]
    raise RuntimeError(f"gpuguard: cannot read {type(tracked).__name__} while torch.compile traces, so the device "
                       f"check cannot run; please report this with your torch version ({torch.__version__})")
