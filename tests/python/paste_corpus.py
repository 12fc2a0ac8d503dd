"""The corpus of pasted shapes: every recogniser's own examples x every way copying a log changes it, and the check
that each shape gives the clean text's diagnosis with the same numbers, or says a value is unreadable.

A recogniser joins the corpus by declaring ``examples`` (logs/recogniser.py: ``Example(text, kind, ranks,
values)``); nothing here names one. The transformations are those a log meets between the program and explain:

  program   a log header before each line (ISO 8601 / Python logging, glog / c10, logging's default), after the
            launcher prefix the example has; the program breaking its own line at a space (the continuation
            under the same launcher prefix);
  store     CRI ("... stderr F "), CRI's partial records (a line split at any point into P records and an F),
            Docker's JSON log lines, `kubectl logs --timestamps`, syslog;
  screen    a word wrap at each space (plain, indented like a viewer's soft wrap, or keeping the space), a
            terminal's wrap at 80, 100 and 120 columns (in the middle of words and numbers), ANSI colours, colour
            codes that lost their ESC;
  paste     a code fence, line numbers (a viewer's gutter, `cat -n`, `nl`, bat's), quote markers (nested), HTML
            escapes;

each alone, and stacked in the order they happen. `python tests/python/paste_corpus.py DIR` writes the corpus as
files (the seeds of the log reader's fuzz target, scripts/fuzz.sh).
"""

from __future__ import annotations

import html
import itertools
import json
import re
import sys
from pathlib import Path
from typing import Callable, Iterator, NamedTuple, Optional, Sequence

from gpuguard.logs import RECOGNISERS, Diagnosis, explain
from gpuguard.logs.recogniser import Example
from gpuguard.logs.wrapping import MIN_WRAPPED_CHARS

Transform = Callable[[str], str]

_LAUNCHER = re.compile(r"^(?:\[[A-Za-z_]*\d+\]:|\(\w+ pid=\d+(?:, ip=[\d.]+)?\) )")
TIMESTAMP = "2026-01-05T10:00:00.123456789Z"


def _lines(text: str) -> list[str]:
    return text.split("\n")[:-1] if text.endswith("\n") else text.split("\n")


def _per_line(f: Callable[[str], str]) -> Transform:
    return lambda text: "".join(f(line) + "\n" for line in _lines(text))


def _after_launcher(header: str) -> Transform:
    def add(line: str) -> str:
        m = _LAUNCHER.match(line)
        cut = m.end() if m else 0
        return line[:cut] + header + line[cut:]
    return _per_line(add)


# ---- the program ------------------------------------------------------------------------------------------------

PROGRAM: dict[str, Transform] = {
    "iso_log_header": _after_launcher("2026-01-05 10:00:00,123 - torch.distributed - ERROR - "),
    "elastic_log_header": _after_launcher("[2026-01-05 10:00:00,123] torch.distributed.elastic.agent: [ERROR] "),
    "glog_header": _after_launcher("E1124 10:00:00.000000 1234 ProcessGroupNCCL.cpp:1577] "),
    "c10_header": _after_launcher("[E1121 05:00:00.123456 ProcessGroupNCCL.cpp:683] "),
    "python_logging_default": _after_launcher("ERROR:torch.distributed:"),
}


def program_breaks(text: str) -> Iterator[tuple[str, str]]:
    """The program broke one of its lines at a space itself: the rest follows under the same launcher prefix."""
    lines = _lines(text)
    for i, line in enumerate(lines):
        m = _LAUNCHER.match(line)
        prefix = line[:m.end()] if m else ""
        for at in _spaces(line):
            if at - len(prefix) < MIN_WRAPPED_CHARS:
                continue
            broken = lines[:i] + [line[:at], prefix + line[at + 1:]] + lines[i + 1:]
            yield f"program_break@{i}:{at}", "".join(piece + "\n" for piece in broken)


# ---- the log store ----------------------------------------------------------------------------------------------


def _docker(line: str) -> str:
    # Docker's json-file driver (Go's encoding/json: <, > and & as \u003c, \u003e, \u0026)
    record = json.dumps({"log": line + "\n", "stream": "stderr", "time": TIMESTAMP}, ensure_ascii=False)
    return record.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")


STORE: dict[str, Transform] = {
    "cri": _per_line(lambda line: f"{TIMESTAMP} stderr F {line}"),
    "docker_json": _per_line(_docker),
    "kubectl_timestamps": _per_line(lambda line: f"{TIMESTAMP} {line}"),
    "syslog": _per_line(lambda line: f"Nov 24 10:00:00 node7 python[1234]: {line}"),
}


def cri_partials(text: str, step: int = 7) -> Iterator[tuple[str, str]]:
    """Each long line split by the runtime at every ``step``-th character into a P record and an F record."""
    lines = _lines(text)
    for i, line in enumerate(lines):
        for at in range(step, len(line) - 1, step):
            records = [f"{TIMESTAMP} stderr F {x}" for x in lines[:i]] + \
                [f"{TIMESTAMP} stderr P {line[:at]}", f"{TIMESTAMP} stderr F {line[at:]}"] + \
                [f"{TIMESTAMP} stderr F {x}" for x in lines[i + 1:]]
            yield f"cri_partial@{i}:{at}", "".join(r + "\n" for r in records)


# ---- the screen -------------------------------------------------------------------------------------------------


def _spaces(line: str) -> list[int]:
    return [i for i, c in enumerate(line) if c == " " and line[:i].strip() and line[i + 1:].strip()]


WRAP_STYLES = {
    "plain": lambda head, tail: head + "\n" + tail,       # a person's hard wrap, a viewer's copy: the space gone
    "indented": lambda head, tail: head + "\n    " + tail,  # a viewer's soft wrap indents the continuation
    "kept_space": lambda head, tail: head + " \n" + tail,  # the space left at the end of the line
}


def word_wraps(text: str, styles: Sequence[str] = tuple(WRAP_STYLES)) -> Iterator[tuple[str, str]]:
    """Each line broken at each space whose head is as long as a wrapped line is (MIN_WRAPPED_CHARS)."""
    lines = _lines(text)
    for i, line in enumerate(lines):
        for n, at in enumerate(_spaces(line)):
            if len(line[:at].lstrip()) < MIN_WRAPPED_CHARS:
                continue
            style = styles[n % len(styles)]
            broken = WRAP_STYLES[style](line[:at], line[at + 1:])
            yield f"wrap_{style}@{i}:{at}", "".join(x + "\n" for x in lines[:i] + [broken] + lines[i + 1:])


def terminal(width: int) -> Transform:
    """A terminal `width` columns wide: every longer line broken every `width` characters, wherever they fall."""
    def wrap(line: str) -> str:
        return "\n".join(line[i:i + width] for i in range(0, len(line), width)) if line else line
    return _per_line(wrap)


SCREEN: dict[str, Transform] = {
    **{f"terminal_{w}": terminal(w) for w in (80, 100, 120)},
    # colours as terminals show them: a launcher's prefix in one colour, the line in another
    "ansi": _per_line(lambda line: (lambda m: "\x1b[36m" + line[:m.end()] + "\x1b[0m\x1b[31m" + line[m.end():] + "\x1b[0m"
                                    if m else "\x1b[1;31m" + line + "\x1b[0m")(_LAUNCHER.match(line))),
    "bare_colour_codes": _per_line(lambda line: "[31m" + line + "[0m"),
}

# ---- the paste ----------------------------------------------------------------------------------------------------


def _numbered(fmt: Callable[[int, str], str]) -> Transform:
    return lambda text: "".join(fmt(12 + i, line) + "\n" for i, line in enumerate(_lines(text)))


PASTE: dict[str, Transform] = {
    "code_fence": lambda text: "```text\n" + text + "```\n",
    "viewer_line_numbers": _numbered(lambda n, line: f"{n:>5} | {line}"),
    "cat_n": _numbered(lambda n, line: f"{n:>6}\t{line}"),
    "nl": lambda text: "".join((f"{n:>6}\t{line}" if line else "       ") + "\n" for n, line in
                               zip(itertools.accumulate((1 if x else 0 for x in _lines(text))), _lines(text))),
    "bat_line_numbers": _numbered(lambda n, line: f"{n:>4} │ {line}"),
    "quote": _per_line(lambda line: "> " + line),
    "nested_quote": _per_line(lambda line: "> > " + line),
    "email_quote": _per_line(lambda line: ">> " + line),
    "html_escape": lambda text: html.escape(text, quote=True),
}


# ---- the corpus ---------------------------------------------------------------------------------------------------

class Shape(NamedTuple):
    example: Example
    name: str
    text: str


def examples() -> list[Example]:
    return [e for r in RECOGNISERS for e in r.examples]


def _compose(*fs: Transform) -> Transform:
    def composed(text: str) -> str:
        for f in fs:
            text = f(text)
        return text
    return composed


def shapes(examples_: Sequence[Example] = ()) -> Iterator[Shape]:
    """Every pasted shape of every example: each transformation alone, then stacked in the order they happen."""
    for ex in examples_ or examples():
        text = ex.text
        singles = {**PROGRAM, **STORE, **SCREEN, **PASTE}
        for name, f in singles.items():
            yield Shape(ex, name, f(text))
        for name, t in itertools.chain(program_breaks(text), cri_partials(text), word_wraps(text)):
            yield Shape(ex, name, t)
        # stacked: one of each layer, rotating through their variants so that every variant meets every other
        # layer's, and every word wrap is pasted under every outer layer once
        programs = [("", lambda t: t)] + list(PROGRAM.items())
        stores = [("", lambda t: t)] + [(k, v) for k, v in STORE.items()]
        screens = [("", lambda t: t)] + [(k, v) for k, v in SCREEN.items()]
        pastes = list(PASTE.items())
        pastes2 = [("", lambda t: t), ("quote", PASTE["quote"]), ("nested_quote", PASTE["nested_quote"])]
        for i, (pname, pf) in enumerate(programs):
            for j, (sname, sf) in enumerate(stores):
                for k, (cname, cf) in enumerate(screens):
                    if sname == "docker_json" and cname.startswith("terminal"):
                        continue  # a Docker record is read whole; a terminal never showed it broken
                    outer_name, outer = pastes[(i + j + k) % len(pastes)]
                    quote_name, quote = pastes2[(i + 2 * j + k) % len(pastes2)]
                    name = "+".join(x for x in (pname, sname, cname, outer_name, quote_name) if x)
                    yield Shape(ex, name, _compose(pf, sf, cf, outer, quote)(text))
        # every word wrap of the stored line (the store's prefix, the program's header before the wrap), under a
        # paste layer and a quote that change from one wrap to the next
        for j, (sname, sf) in enumerate(stores):
            if sname == "docker_json":
                continue  # a Docker record is read whole; its line breaks are the program's (program_breaks)
            pname, pf = programs[j % len(programs)]
            for n, (wname, wrapped) in enumerate(word_wraps(_compose(pf, sf)(text))):
                outer_name, outer = pastes[n % len(pastes)]
                quote_name, quote = pastes2[n % len(pastes2)]
                yield Shape(ex, "+".join(x for x in (pname, sname, wname, outer_name, quote_name) if x),
                            _compose(outer, quote)(wrapped))


# ---- the check --------------------------------------------------------------------------------------------------

_NUMBERS = re.compile(r"[\w:./-]*\d[\w:./-]*")


def _numbers(text: str) -> set[str]:
    return {n.rstrip(".:,;") for n in _NUMBERS.findall(text)}


def check_example(ex: Example, found: Sequence[Diagnosis]) -> Optional[str]:
    """What is wrong with an example's clean diagnosis (its kind, ranks and values), or None."""
    kinds = [d.kind for d in found]
    if ex.kind not in kinds:
        return f"the clean text gave {kinds}, not {ex.kind}"
    d = next(d for d in found if d.kind == ex.kind)
    if d.ranks != ex.ranks:
        return f"ranks {d.ranks}, not {ex.ranks}"
    for v in ex.values:
        if v not in d.summary and not any(v in dev for dev in d.devices):
            return f"{v!r} is in neither the summary nor the devices: {d.summary} / {d.devices}"
    if d.unreadable:
        return f"the clean text has unreadable values: {d.unreadable}"
    return None


def compare(clean: Sequence[Diagnosis], pasted: Sequence[Diagnosis]) -> Optional[str]:
    """None when the pasted shape gives the clean text's diagnoses, or the same with values it calls unreadable
    and no value the clean text does not give; otherwise what differs."""
    if [d.kind for d in pasted] != [d.kind for d in clean]:
        return f"kinds {[d.kind for d in pasted]} instead of {[d.kind for d in clean]}"
    for c, p in zip(clean, pasted):
        if not p.unreadable:
            for field in ("summary", "ranks", "devices", "cause", "fix", "occurrences"):
                if getattr(p, field) != getattr(c, field):
                    return f"{c.kind}: {field} {getattr(p, field)!r} instead of {getattr(c, field)!r}"
            continue
        if not p.cause or not p.fix:
            return f"{c.kind}: no cause or fix beside the unreadable values"
        other = _other_ranks_or_values(c, p, _numbers)
        if other:
            return other
    return None


def _other_ranks_or_values(c: Diagnosis, p: Diagnosis, values: Callable[[str], set[str]]) -> Optional[str]:
    """A rank, or a value as ``values`` reads them, that the pasted diagnosis ``p`` states and the clean one ``c``
    does not (what ``p`` calls unreadable is left out)."""
    if not set(p.ranks) <= set(c.ranks):
        return f"{p.kind}: ranks {p.ranks}, the clean text gives {c.ranks}"
    stated = p.summary.split(" Unreadable in this text: ")[0]
    extra = values(stated + " " + " ".join(p.devices)) - values(c.summary + " " + " ".join(c.devices))
    if extra:
        return f"{p.kind}: values {sorted(extra)} the clean text does not give: {p.summary} / {p.devices}"
    return None


# The numbers a diagnosis states: PCI bus ids whole, every other run of digits on its own (a rank, a count, a
# device index; "ranks 1-3" states 1 and 3).
_NUMBER = re.compile(r"[0-9a-f]{4}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-9a-f]|\d+")


def _numeric(text: str) -> set[str]:
    return set(_NUMBER.findall(text))


def wrong(clean: Sequence[Diagnosis], pasted: Sequence[Diagnosis]) -> Optional[str]:
    """What the pasted shape gives that the clean text does not: another kind, a rank, a number (the weaker
    check, for shapes beyond the corpus: one may miss what a break hides, never say another number; names such as
    a host a break cut are not numbers)."""
    by_kind = {d.kind: d for d in clean}
    for p in pasted:
        c = by_kind.get(p.kind)
        if c is None:
            return f"a {p.kind} diagnosis the clean text does not give"
        other = _other_ranks_or_values(c, p, _numeric)
        if other:
            return other
    return None


def run(shapes_: Sequence[Shape]) -> list[str]:
    """The problems: each shape whose diagnosis differs from its clean text's (by more than unreadable values)."""
    problems = []
    clean: dict[str, list[Diagnosis]] = {}
    for shape in shapes_:
        if shape.example.text not in clean:
            clean[shape.example.text] = explain(shape.example.text, match_local=False)
        problem = compare(clean[shape.example.text], explain(shape.text, match_local=False))
        if problem:
            problems.append(f"{shape.example.kind} / {shape.name}: {problem}\n{shape.text}")
    return problems


def write(directory: Path) -> int:
    """Writes every shape as a file in ``directory``; the count."""
    directory.mkdir(parents=True, exist_ok=True)
    n = 0
    for n, shape in enumerate(shapes(), 1):
        (directory / f"paste-{n:05d}").write_bytes(shape.text.encode("utf-8", "surrogateescape"))
    return n


if __name__ == "__main__":
    if len(sys.argv) != 2:
        raise SystemExit("usage: paste_corpus.py DIR  (writes the corpus of pasted shapes there, one file each)")
    print(f"paste_corpus.py: {write(Path(sys.argv[1]))} shapes written to {sys.argv[1]}")
