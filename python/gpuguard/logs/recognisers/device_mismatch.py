"""PyTorch's "Expected all tensors to be on the same device": one operation got tensors on two devices."""

from __future__ import annotations

import re
from typing import Optional

from ..model import MAX_DEVICES, Diagnosis, Group
from ..recogniser import Example, Groups, Host, Line, Recogniser

# ATen, aten/src/ATen/core/op_registration/adaption.cpp (common_device_check_failure), up to torch 2.5:
#   "Expected all tensors to be on the same device, but found at least two devices, cuda:3 and cuda:1!
#    (when checking argument for argument mat1 in method wrapper_CUDA_addmm)"
# TensorIterator and many kernels print the first sentence alone. Since torch 2.6 adaption.cpp prints:
#   "Expected all tensors to be on the same device, but got mat1 is on cuda:0, different from other tensors
#    on cpu (when checking argument in method wrapper_CUDA_addmm)"
_MISMATCH_TWO = re.compile(
    r"Expected all tensors to be on the same (?:common )?device, but found at least two devices, "
    r"(?P<a>[\w:]{1,64}) and (?P<b>[\w:]{1,64})!"
    r"(?: \(when checking ar(?:gu|ug)ment for argument (?P<arg>\w{1,128}) in method (?P<method>[\w.]{1,256})\))?")
_MISMATCH_GOT = re.compile(
    r"Expected all tensors to be on the same device, but got (?P<arg>\w{1,128}) is on (?P<a>[\w:]{1,64}), "
    r"different from other tensors on (?P<b>[\w:]{1,64})(?: \(when checking argument in method (?P<method>[\w.]{1,256})\))?")

# FakeTensor's own check, torch/_subclasses/fake_tensor.py up to torch 2.6 (gone by 2.15): what torch.compile prints
# when it traces the same mismatch (inside "Failed running call_function ..."), and what runs under FakeTensorMode:
#   "Unhandled FakeTensor Device Propagation for aten.mm.default, found two different devices cuda:0, cuda:3"
_MISMATCH_FAKE = re.compile(
    r"Unhandled FakeTensor Device Propagation for (?P<method>[\w.]{1,256}), found two different devices "
    r"(?P<a>[\w:]{1,64}), (?P<b>[\w:]{1,64})")

# A device whose index a paste broke across lines where the break cannot be told.
UNREADABLE_DEVICE = "an unreadable device"


class DeviceMismatch(Recogniser):
    """Inputs of one operation on two devices (GPU and GPU, or GPU and CPU)."""

    kinds = ("device_mismatch",)
    keywords = ("Expected all tensors to be on the same", "Unhandled FakeTensor Device Propagation")
    patterns = (_MISMATCH_TWO, _MISMATCH_GOT, _MISMATCH_FAKE)
    help = "PyTorch 'Expected all tensors to be on the same device'"
    examples = (
        # adaption.cpp up to torch 2.5, under torch's per-rank excepthook prefix
        Example("[rank2]: RuntimeError: Expected all tensors to be on the same device, but found at least two devices, "
                "cuda:3 and cuda:1! (when checking argument for argument mat1 in method wrapper_CUDA_addmm)\n",
                "device_mismatch", (2,), ("cuda:3 and cuda:1", "argument mat1 of wrapper_CUDA_addmm")),
        # torch >= 2.6's wording
        Example("RuntimeError: Expected all tensors to be on the same device, but got index is on cpu, different from "
                "other tensors on cuda:0 (when checking argument in method wrapper_CUDA__index_select)\n",
                "device_mismatch", (), ("cpu and cuda:0", "argument index of wrapper_CUDA__index_select")),
        # torch.compile tracing the mismatch on torch 2.6 (FakeTensor's check)
        Example("[rank1]: torch._dynamo.exc.TorchRuntimeError: Failed running call_function <built-in function "
                "linear>(*(FakeTensor(..., device='cuda:3', size=(2, 8)), Parameter(FakeTensor(..., device='cuda:0', "
                "size=(8, 8), requires_grad=True)), Parameter(FakeTensor(..., device='cuda:0', size=(8,), "
                "requires_grad=True))), **{}):\n"
                "[rank1]: Unhandled FakeTensor Device Propagation for aten.addmm.default, found two different devices "
                "cuda:0, cuda:3\n",
                "device_mismatch", (1,), ("cuda:0 and cuda:3", "in aten.addmm.default")),
    )

    def read(self, line: Line, groups: Groups) -> bool:
        body, origin = line.body, line.origin
        m = _MISMATCH_TWO.search(body) or _MISMATCH_GOT.search(body) or _MISMATCH_FAKE.search(body)
        if not m:
            return False
        group = groups("device_mismatch")
        a, b = line.value(m, "a"), line.value(m, "b")
        if a is None or b is None:
            group.unreadable("a device PyTorch named")
        group.add(line.number, body, ranks=(origin.rank,), devices=[d for d in (a, b) if d is not None])
        group.source(origin)
        pairs = group.facts.setdefault("pairs", {})
        pair = (a or UNREADABLE_DEVICE, b or UNREADABLE_DEVICE)
        if pair in pairs or len(pairs) < MAX_DEVICES:
            pairs.setdefault(pair, set())
            arg, method = m.groupdict().get("arg"), m.groupdict().get("method")
            if arg or method:
                if len(pairs[pair]) < 8:
                    pairs[pair].add((arg, method))
        return True

    def build(self, kind: str, group: Group, host: Host) -> Diagnosis:
        pairs: dict[tuple[str, str], set[tuple[Optional[str], Optional[str]]]] = group.facts.get("pairs", {})
        parts = []
        for (a, b), where in pairs.items():
            detail = ""
            args = sorted({w[0] for w in where if w[0]})
            methods = sorted({w[1] for w in where if w[1]})
            if args:
                detail += f" (argument {', '.join(args)}"
                detail += f" of {', '.join(methods)})" if methods else ")"
            elif methods:
                detail += f" (in {', '.join(methods)})"
            parts.append(f"{a} and {b}{detail}")
        ranks = sorted(group.ranks)
        who = group.who()
        summary = f"An operation{who} got tensors on different devices: " + "; ".join(parts) + "."
        involves_cpu = any("cpu" in (a, b) for a, b in pairs)
        cause = ("PyTorch runs an operation on one device; here its inputs were on two. Typical causes: a model "
                 "spread over several GPUs (device_map='auto', a framework placing layers on every visible GPU) "
                 "fed inputs moved by hand to a fixed cuda:N; DataParallel's output_device differing from the "
                 "target's device; tensors created inside forward without device=.")
        if involves_cpu:
            cause += " One side is the CPU: a buffer or tensor kept as a plain attribute is not moved by .to(device)."
        fix = ("gpuguard.assert_same_device(model, *inputs) names every parameter, buffer and input on each device; "
               "gpuguard.guard(model, deep=True) names the first layer whose inputs disagree with its weights. Put the "
               "inputs where the model's first parameter is (next(model.parameters()).device: the model's device, "
               "or its first layer's when a framework placed it across GPUs); never move a model placed across "
               "GPUs to one device (to run it on one GPU, set CUDA_VISIBLE_DEVICES before the process starts); "
               "register tensors as buffers so that .to() moves them.")
        return Diagnosis(kind, summary, tuple(ranks), tuple(group.devices), cause, fix, group.sorted_evidence(),
                         group.occurrences)
