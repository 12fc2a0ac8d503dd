"""gpuguard's own DeviceMismatchError report, raised eagerly or while torch.compile traced, as printed or as Dynamo
wrapped it."""

from __future__ import annotations

import re
from typing import Any, Optional

from ..lines import strip_prefixes
from ..model import MAX_DEVICES, Diagnosis, Group
from ..recogniser import Example, Groups, Host, Line, Recogniser
from ..wrapping import MAX_PIECES

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
    # gpuguard's own, at trace time (python/gpuguard/tensors/compile_time.py): the report as the error's message
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
_ERROR_OPEN = "DeviceMismatchError("
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


def _device_list(listed: str) -> list[str]:
    devices = [d.strip() for d in listed.split(",") if d.strip() and d.strip() != "…"]
    if any(not re.fullmatch(r"[a-z]+(?::\d+)?", d) for d in devices):
        raise ValueError(listed)  # "cuda: 1", "cuda:1 cuda:3": a break read the wrong way, not a device list
    return devices


def _headline(line: Line, m: "re.Match[str]") -> tuple[str, Optional[list[str]], bool]:
    """The report's first line as gpuguard printed it, the devices it names (None when a break in the paste makes
    them unreadable), and whether the layer's name is readable (a break inside it: the name left out)."""
    group = next(k for k, v in m.groupdict().items() if k != "layer" and k != "expected" and v)
    listed = line.value(m, group, _device_list)
    expected = line.value(m, "expected") if m.group("expected") else None
    devices: Optional[list[str]] = None
    if listed is not None and (expected is not None or not m.group("expected")):
        devices = ([expected] if expected is not None and expected not in listed else []) + listed
    layer_readable = not m.group("layer") or line.value(m, "layer") is not None
    text, at = m.group(0), m.start()
    if listed is not None:  # as gpuguard lists them (a join of the paste may have dropped the space after a comma)
        s, e = m.span(group)
        text = text[:s - at] + ", ".join(listed) + text[e - at:]
    if not layer_readable:
        s, e = m.span("layer")
        text = text[:s - at] + "…" + text[e - at:]
    return text, devices, layer_readable


def _escaped_report(body: str, start: int) -> Optional[tuple[list[str], bool]]:
    """A report Dynamo printed as a repr on one line, from its first character at ``start``: its lines and whether
    its closing quote was found, or None when it is not in quotes."""
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
    return "".join(text).split("\n"), i < len(body)


def _cause_and_fix(lines: list[str]) -> tuple[Optional[str], Optional[str]]:
    cause = next((t[len("Likely cause: "):] for t in lines if t.startswith("Likely cause: ")), None)
    fix = next((t[len("Fix: "):] for t in lines if t.startswith("Fix: ")), None)
    return cause, fix


def _readings(text: Optional[str]) -> tuple[str, ...]:
    """The texts of a line with the lines a paste broke it into joined, each way the paste allows (one when it is
    certain); the line's prefixes stripped."""
    if text is None:
        return ()
    return tuple(strip_prefixes(r)[0].strip() for r in getattr(text, "readings", (text,)))


def _one(candidates: list[Optional[str]]) -> tuple[Optional[str], bool]:
    """The text every reading gives, and whether it is readable: the one reading there is, or the one finished text
    (a line of the report ends with a full stop) the readings that differ agree on."""
    if len(set(candidates)) <= 1:
        return (candidates[0] if candidates else None), True
    finished = {c for c in candidates if c is not None and c.endswith(".")}
    return (finished.pop(), True) if len(finished) == 1 else (None, False)


def _report_line(text: Optional[str], head: str) -> tuple[Optional[str], bool]:
    """What follows ``head`` in a report line (the cause's, the fix's) read from ``text``, cut where the paste's
    reading joined the report's next line (its fix) to it; unreadable when the ways a paste broke it disagree."""
    candidates: list[Optional[str]] = []
    for reading in _readings(text):
        at = reading.find(head)
        if at < 0:
            candidates.append(None)
            continue
        rest = reading[at + len(head):]
        candidates.append(rest.split("Fix: ")[0].rstrip() if head != "Fix: " else rest.rstrip())
    return _one(candidates)


class GpuguardDeviceMismatch(Recogniser):
    """gpuguard stopped a model whose tensors sit on different devices, in eager mode or when torch.compile traced
    it (at compile time, no step ran): the report says which tensors are where, the likely cause and the fix."""

    kinds = (KIND,)
    keywords = ("is about to run on tensors from", "expected every tensor on", "is split: its parameters and buffers",
                "tensors that must share one device", "Likely cause: ", _FIX_ALONE)
    patterns = (_HEADLINE, _CAUSE, re.compile(re.escape(_FIX_ALONE)))
    help = "gpuguard's DeviceMismatchError (eager or at torch.compile time)"
    examples = (
        # raised eagerly by a guarded layer, as Python prints the exception, under torchrun's per-rank prefix
        Example("[rank3]: gpuguard.errors.DeviceMismatchError: gpuguard: layer 'blocks.2' (Linear) is about to run on "
                "tensors from 2 devices (cuda:1, cuda:0); PyTorch would stop inside this layer with \"Expected all "
                "tensors to be on the same device\".\n"
                "[rank3]:   cuda:1: 2 parameters of 'blocks.2': weight, bias\n"
                "[rank3]:   cuda:0: 1 input: input (shape [2, 4], float32)\n"
                "[rank3]: Likely cause: its input was produced on cuda:0 (by the layers before it).\n"
                "[rank3]: Fix: keep the layer with the layers before it: model.blocks[2].to(\"cuda:0\").\n",
                KIND, (3,), ("cuda:1", "cuda:0")),
        # gpuguard.assert_same_device on tensors alone: no cause line
        Example("gpuguard.errors.DeviceMismatchError: gpuguard: tensors that must share one device are on 2 devices: "
                "cuda:1, cuda:3.\n"
                "  cuda:1: 1 input: tensors[0] (shape [2], float32)\n"
                "  cuda:3: 1 input: tensors[1] (shape [2], float32)\n"
                "Fix: move the tensors to one device, e.g. x = x.to(\"cuda:1\").\n",
                KIND, (), ("cuda:1", "cuda:3")),
        Example("gpuguard.errors.DeviceMismatchError: gpuguard: expected every tensor on cuda:2, but 8 tensors are "
                "elsewhere (cpu).\n"
                "Fix: move them to cuda:2: model.to(\"cuda:2\"); x = x.to(\"cuda:2\").\n",
                KIND, (), ("cuda:2", "cpu")),
        Example("gpuguard.errors.DeviceMismatchError: gpuguard: the model (Stack) is split: its parameters and buffers "
                "are on 2 devices (cuda:0, cuda:1), so no one device holds it and its inputs.\n"
                "  cuda:0: 18 parameters of Stack: layers.0-3.*\n"
                "  cuda:1: 24 parameters of Stack: layers.4-15.*\n"
                "Likely cause: the model is placed across devices on purpose.\n"
                "Fix: put the inputs where its first parameter (layers.0.weight) is: x = x.to(\"cuda:0\").\n",
                KIND, (), ("cuda:0", "cuda:1")),
        # raised inside code torch.compile traced (torch 2.15): the report on one line, its line ends escaped
        Example("torch._dynamo.exc.Unsupported: Observed exception\n"
                "  Developer debug context: raised exception DeviceMismatchError('gpuguard: tensors that must share one "
                "device are on 2 devices: cpu, cuda:0.\\n  cpu: 2 parameters of Linear: weight, bias\\n  cuda:0: 1 "
                "input: tensors[0] (shape [2, 4], float32)\\nLikely cause: the inputs were put on a different device "
                "than the model.\\nFix: move the inputs to the model\\'s device: x = x.to(\"cpu\").')\n",
                KIND, (), ("cpu", "cuda:0")),
    )

    def read(self, line: Line, groups: Groups) -> bool:
        body = line.body
        m = _HEADLINE.search(body)
        if m is None:
            return self._read_cause_or_fix(line, groups)
        form = self._form(line, body) or self._form_before(line) or "eager"
        headline, devices, layer_readable = _headline(line, m)
        report: dict[str, Any] = {"form": form, "headline": headline, "layer": m.group("layer"),
                                  "cause": None, "fix": None, "line": line.number, "origin": line.origin.key()}
        group = groups(KIND)
        found = self._escaped(line, body, m)
        if found:  # the whole report on this line (as a paste broke it)
            closed = {cf for cf, end in found if end}
            if len(found) == 1 or len(closed) == 1:
                report["cause"], report["fix"] = found[0][0] if len(found) == 1 else closed.pop()
            else:
                group.unreadable("the report's cause and fix (broken across lines)")
        reports: list[dict[str, Any]] = group.facts.setdefault("reports", [])
        if any(r["headline"] == report["headline"] and r["origin"] == report["origin"]
               and line.number - r["line"] <= _REPORT_LINES for r in reports[-2:]):
            # the same error printed again: Python prints a chained exception's cause before it, and Dynamo's
            # error repeats the message it wraps
            group.evidence_line(line.number, body)
            return True
        if devices is None:
            group.unreadable("the devices the report lists (broken across lines)")
        if not layer_readable:
            group.unreadable("the layer's name (broken across lines)")
        group.add(line.number, body, ranks=(line.origin.rank,), devices=devices or ())
        group.source(line.origin)
        if len(reports) < _MAX_REPORTS:
            reports.append(report)
        return True

    @staticmethod
    def _escaped(line: Line, body: str, m: "re.Match[str]") -> list[tuple[tuple[Optional[str], Optional[str]], bool]]:
        """The cause and fix of a report printed on one line (Dynamo's repr of the error), in each reading of the
        line (with the lines a paste broke it into), and whether that reading holds all of it; [] when the report
        is not printed that way."""
        if _escaped_report(body, m.start()) is not None:
            readings = _readings(line.printed) or (body,)
        elif body[:m.start()].strip() == "" and line.context and line.context[-1][0] == line.number - 1:
            readings = _readings(line.context[-1][1])  # broken just after the quote that opens it
        else:
            return []
        found = []
        for reading in readings:
            h = _HEADLINE.search(reading)
            escaped = _escaped_report(reading, h.start()) if h else None
            if escaped is not None:
                found.append((_cause_and_fix(escaped[0][1:]), escaped[1]))
        return found

    @staticmethod
    def _form(line: Line, body: str) -> Optional[str]:
        """How the error around the report was raised, said on its line (before the report, where a paste may have
        broken the line: in a reading of the line above joined to this one)."""
        found = next((f for marker, f in _FORMS if marker in body), None)
        if found is None and line.context and line.context[-1][0] == line.number - 1:
            above = line.context[-1][1]
            found = next((f for reading in getattr(above, "readings", ()) for marker, f in _FORMS
                          if marker in reading and "gpuguard: " in reading), None)
            if found is None and body.lstrip().startswith(_ERROR_OPEN):
                # broken just before the error's name (which reads as a line of its own)
                end = strip_prefixes(above)[0].rstrip()
                found = next((f for marker, f in _FORMS if marker.endswith(_ERROR_OPEN) and
                              end.endswith(marker[:-len(_ERROR_OPEN)].rstrip())), None)
        return found

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
        # who printed it, as far as it is readable (a prefix a paste broke across lines may leave some unread)
        unsure = {("rank", "local_rank", "pid", "host").index(f) for f in
                  (line.message.origin_unreadable() if line.message is not None else ()) if f != "nccl_device"}

        def same(key: tuple[Any, ...]) -> bool:
            mine = line.origin.key()
            return all(i in unsure or key[i] == mine[i] for i in range(len(mine)))

        if not any(same(strip_prefixes(text)[1].key()) and
                   any(_HEADLINE.search(r) for r in getattr(text, "readings", (text,)))
                   for number, text in line.context if 0 < line.number - number <= _REPORT_LINES):
            return False  # someone else's "Likely cause: " (and no group made for it)
        group = groups(KIND)
        open_report = next((r for r in reversed(group.facts.get("reports", []))
                            if same(r["origin"]) and r["cause"] is None and r["fix"] is None), None)
        if open_report is None:
            return False
        text = line.body.strip()
        readable = True
        if text.startswith(_FIX_ALONE):
            open_report["fix"], readable = _report_line(line.printed or text, "Fix: ")
        else:
            if not _CAUSE.match(text) and text != "Likely cause:":  # (the rest of it on the next line)
                return False
            cause, readable = _report_line(line.printed or text, "Likely cause: ")
            open_report["cause"] = cause
            # the fix line comes right after the cause's, or after the lines a paste broke the cause into
            after = line.following
            for _ in range(MAX_PIECES):
                if after is None or _FIX.match(strip_prefixes(after)[0].strip()):
                    break
                piece = strip_prefixes(after)[0].strip()
                if cause is None or not piece or piece not in cause:
                    after = None  # not the rest of the cause: no fix line where it should be
                    break
                after = getattr(after, "following", None)
            fix, fix_readable = _report_line(after, "Fix: ") if after is not None else (None, cause is None)
            open_report["fix"] = fix
            readable = readable and fix_readable
        if not readable:
            open_report["cause_unreadable"] = True
            group.unreadable("the report's cause and fix (broken across lines)")
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
