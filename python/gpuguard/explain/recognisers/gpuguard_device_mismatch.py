"""gpuguard's own DeviceMismatchError report, raised eagerly or while torch.compile traced, as printed or as Dynamo
wrapped it."""

from __future__ import annotations

import re
from typing import Any, Optional

from ..lines import strip_prefixes
from ..model import MAX_DEVICES, Diagnosis, Group
from ..recogniser import Groups, Host, Line, Recogniser

KIND = "gpuguard_device_mismatch"

# The report's first line, from csrc/gpuguard/tensor_devices.cc (check_devices), one of four:
#   gpuguard: layer 'blocks.2' (Linear) is about to run on tensors from 2 devices (cuda:0, cpu); PyTorch would ...
#   gpuguard: expected every tensor on cuda:0, but 3 tensors are elsewhere (cpu).
#   gpuguard: the model (Net) is split: its parameters and buffers are on 2 devices (cuda:0, cuda:1), so ...
#   gpuguard: tensors that must share one device are on 2 devices: cuda:1, cuda:3.
_HEADLINE = re.compile(
    r"gpuguard: (?:"
    r"layer '(?P<layer>[^'\\]{1,256})' \([\w.]{1,128}\) is about to run on tensors from \d{1,4} devices "
    r"\((?P<layer_devices>[\w:, ]{1,1024})\)"
    r"|expected every tensor on (?P<expected>[\w:]{1,64}), but \d{1,9} tensors? (?:is|are) elsewhere "
    r"\((?P<elsewhere>[\w:, ]{1,1024})\)"
    r"|the model(?: \([\w.]{1,128}\))? is split: its parameters and buffers are on \d{1,4} devices "
    r"\((?P<split_devices>[\w:, ]{1,1024})\)"
    r"|tensors that must share one device are on \d{1,4} devices: (?P<devices>[\w:, ]{1,1024})\.)")
# The report's cause and fix lines (same file: cause_and_fix), each one line; the fix comes last. Only their heads
# are matched: a match that reaches the end of a long line would have the reader join the next line to it, as
# the rest of a line a terminal wrapped.
_CAUSE = re.compile(r"^Likely cause: ")
_FIX = re.compile(r"^Fix: ")
# The one report without a cause line (tensors only, no module): its fix line alone.
_FIX_ALONE = "Fix: move the tensors to one device"

# How the line around the report says it was raised. A report Dynamo printed inside its own error is on one line,
# with its line ends escaped ("\n"). Texts from torch 2.6 and 2.15 (torch/_dynamo/exc.py, convert_frame.py,
# symbolic_convert.py, utils.py), as they print a DeviceMismatchError raised while Dynamo traced:
_FORMS = (
    # gpuguard's own, at trace time (python/gpuguard/compile_time.py): the report as the error's message
    ("CompileTimeDeviceMismatchError: gpuguard: ", "compile_time"),
    # raised by code Dynamo ran while tracing (an assume_constant_result function, comptime): re-raised as
    # "torch._dynamo.exc.InternalTorchDynamoError: DeviceMismatchError: <message>"
    ("InternalTorchDynamoError: DeviceMismatchError: ", "internal"),
    # raised in traced code, torch 2.15: "torch._dynamo.exc.Unsupported: Observed exception ... Developer debug
    # context: raised exception DeviceMismatchError('<message>')"
    ("raised exception DeviceMismatchError(", "observed"),
    # raised by a fake tensor call (a custom op's fake implementation), torch 2.15: "TorchRuntimeError: RuntimeError
    # when making fake tensor call ... got DeviceMismatchError('<message>')"; torch 2.6: "Failed running
    # call_function ...: got DeviceMismatchError('<message>')" (the same words)
    ("got DeviceMismatchError(", "fake_tensor"),
    # constructed in traced code, torch 2.6: "torch._dynamo.exc.Unsupported: call_function
    # UserDefinedClassVariable(<class 'gpuguard.errors.DeviceMismatchError'>) [ConstantVariable(str: '<message>')]"
    ("UserDefinedClassVariable(<class 'gpuguard.errors.DeviceMismatchError'>)", "unsupported"),
)
# ... or on the line before the report's first line, torch 2.6, raised by a fake tensor call:
#   "torch._dynamo.exc.TorchRuntimeError: Failed running call_function <op>(*(FakeTensor(...), ...), **{}):"
_FORM_BEFORE = (("TorchRuntimeError: Failed running ", "fake_tensor"),)
_WRAPPED = {
    "internal": "InternalTorchDynamoError",
    "observed": "Unsupported (\"Observed exception\")",
    "fake_tensor": "TorchRuntimeError (a fake tensor call)",
    "unsupported": "Unsupported",
}
# a report's cause line comes at most this many lines after its first line (one or two lines per device)
_REPORT_LINES = 64
_MAX_REPORTS = 8


def _devices(m: "re.Match[str]") -> list[str]:
    listed = next(v for k, v in m.groupdict().items() if k != "layer" and k != "expected" and v)
    devices = [d.strip() for d in listed.split(",") if d.strip() and d.strip() != "…"]
    if m.group("expected") and m.group("expected") not in devices:
        devices.insert(0, m.group("expected"))
    return devices


def _escaped_report(body: str, start: int) -> Optional[list[str]]:
    """A report Dynamo printed as a repr on one line, from its first character at ``start``: its lines, or None
    when it is not in quotes."""
    quote = body[start - 1] if start > 0 else ""
    if quote not in ("'", '"'):
        return None
    text, i = [], start
    while i < len(body) and body[i] != quote:
        if body[i] == "\\" and i + 1 < len(body):
            nxt = body[i + 1]
            text.append("\n" if nxt == "n" else nxt)
            i += 2
            continue
        text.append(body[i])
        i += 1
    return "".join(text).split("\n")


class GpuguardDeviceMismatch(Recogniser):
    """gpuguard stopped a model whose tensors sit on different devices, in eager mode or when torch.compile traced
    it (at compile time, no step ran): the report says which tensors are where, the likely cause and the fix."""

    kinds = (KIND,)
    keywords = ("is about to run on tensors from", "expected every tensor on", "is split: its parameters and buffers",
                "tensors that must share one device", "Likely cause: ", _FIX_ALONE)
    patterns = (_HEADLINE, _CAUSE, re.compile(re.escape(_FIX_ALONE)))
    help = "gpuguard's DeviceMismatchError (eager or at torch.compile time)"

    def read(self, line: Line, groups: Groups) -> bool:
        body = line.body
        m = _HEADLINE.search(body)
        if m is None:
            return self._read_cause_or_fix(line, groups)
        form = next((f for marker, f in _FORMS if marker in body), None) or self._form_before(line) or "eager"
        report: dict[str, Any] = {"form": form, "headline": body[m.start():m.end()], "layer": m.group("layer"),
                                  "cause": None, "fix": None, "line": line.number, "origin": line.origin.key()}
        lines = _escaped_report(body, m.start())
        if lines is not None:  # the whole report on this line
            for text in lines[1:]:
                if text.startswith("Likely cause: "):
                    report["cause"] = text[len("Likely cause: "):]
                elif text.startswith("Fix: "):
                    report["fix"] = text[len("Fix: "):]
        group = groups(KIND)
        reports: list[dict[str, Any]] = group.facts.setdefault("reports", [])
        if any(r["headline"] == report["headline"] and r["origin"] == report["origin"]
               and line.number - r["line"] <= _REPORT_LINES for r in reports[-2:]):
            # the same error printed again: Python prints a chained exception's cause before it, and Dynamo's
            # error repeats the message it wraps
            group.evidence_line(line.number, body)
            return True
        group.add(line.number, body, ranks=(line.origin.rank,), devices=_devices(m))
        group.source(line.origin)
        if len(reports) < _MAX_REPORTS:
            reports.append(report)
        return True

    @staticmethod
    def _form_before(line: Line) -> Optional[str]:
        if not line.context or line.context[-1][0] != line.number - 1:
            return None
        before = line.context[-1][1]
        return next((f for marker, f in _FORM_BEFORE if marker in before), None)

    def _read_cause_or_fix(self, line: Line, groups: Groups) -> bool:
        """The cause line of a report printed on several lines (and the fix line right after it), or the fix line
        of a report that has no cause line: taken only a few lines after a report's first line, printed by the
        same process."""
        if not any(_HEADLINE.search(text) and strip_prefixes(text)[1].key() == line.origin.key()
                   for number, text in line.context if 0 < line.number - number <= _REPORT_LINES):
            return False  # someone else's "Likely cause: " (and no group made for it)
        group = groups(KIND)
        open_report = next((r for r in reversed(group.facts.get("reports", []))
                            if r["origin"] == line.origin.key() and r["cause"] is None and r["fix"] is None), None)
        if open_report is None:
            return False
        text = line.body.strip()
        if text.startswith(_FIX_ALONE):
            open_report["fix"] = text[len("Fix: "):]
        else:
            if not _CAUSE.match(text):
                return False
            open_report["cause"] = text[len("Likely cause: "):]
            following = strip_prefixes(line.following)[0].strip() if line.following is not None else ""
            if _FIX.match(following):
                open_report["fix"] = following[len("Fix: "):]
        group.evidence_line(line.number, text)
        return True

    def build(self, kind: str, group: Group, host: Host) -> Diagnosis:
        reports = group.facts.get("reports") or [{}]
        first = reports[0]
        form = first.get("form", "eager")
        when = " while torch.compile traced the model (at compile time: no compiled step ran)" if form != "eager" \
            else ""
        headline = (first.get("headline") or "").removeprefix("gpuguard: ").rstrip(".")
        summary = f"gpuguard's device check stopped the run{group.who()}{when}: {headline}."
        wrapped = sorted({_WRAPPED[r["form"]] for r in reports if r.get("form") in _WRAPPED})
        cause = ("Likely cause: " + first["cause"]) if first.get("cause") else (
            "Tensors that one operation will combine are on different devices (the report above the traceback "
            "lists which parameters, buffers and inputs are where).")
        if wrapped:
            cause += (f" Dynamo reported gpuguard's error inside its own ({', '.join(wrapped)}); its hints about "
                      "graph breaks, running eagerly or reporting to PyTorch do not apply: the model stops the same "
                      "way eagerly.")
        fix = ("Fix: " + first["fix"]) if first.get("fix") else (
            "Fix: move what the report lists to one device: the inputs where the model's first parameter is "
            "(next(model.parameters()).device), or a stray layer to the rest of the model; "
            "gpuguard.guard(model, deep=True) names the first layer whose inputs disagree with its weights.")
        devices = tuple(list(group.devices)[:MAX_DEVICES])
        return Diagnosis(kind, summary, tuple(sorted(group.ranks)), devices, cause, fix, group.sorted_evidence(),
                         group.occurrences)
