"""The streaming explainer: offers each line holding a known keyword to the registry's recognisers, in order."""

from __future__ import annotations

import io
import os
from collections import deque
from typing import IO, Any, Optional, Sequence, Union

from .lines import MAX_LINE_CHARS, iter_lines, strip_prefixes
from .model import Diagnosis, Group, ranks_text
from .recogniser import Host, Line
from .registry import BY_KIND, HELP, KEYWORDS, KINDS, READING_ORDER

# Lines kept for context (the traceback lines that precede an error), all sources together.
CONTEXT_LINES = 64


class LogExplainer:
    """Streaming explainer: feed() lines in order, then diagnoses(). Memory does not grow with the input."""

    def __init__(self, *, match_local: bool = True, local_devices: Optional[Sequence[Any]] = None,
                 local_host: Optional[str] = None) -> None:
        self.lines = 0
        self._host = Host(match_local, local_devices, local_host)
        self._context: deque[tuple[int, str]] = deque(maxlen=CONTEXT_LINES)
        self._groups: dict[str, Group] = {}

    def feed(self, line: str) -> None:
        self.lines += 1
        if len(line) > MAX_LINE_CHARS:
            line = line[:MAX_LINE_CHARS]
        for keyword in KEYWORDS:
            if keyword in line:
                self._parse(line)
                break
        self._context.append((self.lines, line))

    def feed_stream(self, stream: Union[IO[str], IO[bytes]]) -> None:
        for line in iter_lines(stream):
            self.feed(line)

    def _group(self, kind: str) -> Group:
        group = self._groups.get(kind)
        if group is None:
            group = self._groups[kind] = Group()
        return group

    def _parse(self, raw: str) -> None:
        body, origin = strip_prefixes(raw)
        line = Line(self.lines, body, origin, self._context)
        for recogniser in READING_ORDER:
            # each recogniser's matches contain one of its keywords, so skipping the others loses nothing
            if any(k in body for k in recogniser.keywords) and recogniser.read(line, self._group):
                return

    def kinds(self) -> list[str]:
        """The kinds recognised so far, in report order, without building the diagnoses."""
        return [kind for kind in KINDS if kind in self._groups]

    def diagnoses(self) -> list[Diagnosis]:
        return [BY_KIND[kind].build(kind, self._groups[kind], self._host) for kind in self.kinds()]


def _explainer_of(text: Union[str, bytes], match_local: bool) -> LogExplainer:
    explainer = LogExplainer(match_local=match_local)
    if isinstance(text, (bytes, bytearray)):
        explainer.feed_stream(io.BytesIO(bytes(text)))
    else:
        explainer.feed_stream(io.StringIO(text))
    return explainer


def explain(text: Union[str, bytes], *, match_local: bool = True) -> list[Diagnosis]:
    """Diagnoses for every known failure in `text` (one message or a whole log); [] when none is recognised.

    Recognises the failures listed in registry.RECOGNISERS (``HELP`` names them: NCCL's duplicate-GPU errors,
    CUDA's "invalid device ordinal", PyTorch's "Expected all tensors to be on the same device", ...). With
    ``match_local`` (default), PCI bus ids from NCCL are matched to this host's GPUs through gpuguard.devices(),
    which initialises the CUDA driver if nothing has yet; pass False to keep this process's CUDA untouched.
    """
    return _explainer_of(text, match_local).diagnoses()


def kinds_in(text: Union[str, bytes]) -> list[str]:
    """The kinds of failure (KINDS) recognised in ``text``, in report order; never touches CUDA."""
    return _explainer_of(text, False).kinds()


def explain_file(path: Union[str, "os.PathLike[str]"], *, match_local: bool = True) -> list[Diagnosis]:
    """explain() over a file, streamed: a log of any size is read in bounded memory."""
    explainer = LogExplainer(match_local=match_local)
    with open(path, "rb") as f:
        explainer.feed_stream(f)
    return explainer.diagnoses()


def format_diagnoses(found: Sequence[Diagnosis], lines_read: int) -> str:
    """The text the CLI prints: one block per diagnosis, or a plain statement that nothing was recognised."""
    if not found:
        return (f"gpuguard recognised no failure it knows in this text ({lines_read} line(s) read).\n"
                f"It explains: {HELP}. It does not guess at anything else.\n")
    out = []
    for i, d in enumerate(found, 1):
        times = f" (seen {d.occurrences} times)" if d.occurrences > 1 else ""
        out.append(f"{i}. [{d.kind}] {d.summary}{times}")
        if d.ranks:
            out.append(f"   ranks:    {ranks_text(d.ranks, limit=32)}")
        for j, dev in enumerate(d.devices):
            out.append(f"   {'devices:' if j == 0 else '':<9} {dev}")
        out.append(f"   cause:    {d.cause}")
        out.append(f"   fix:      {d.fix}")
        for j, e in enumerate(d.evidence):
            out.append(f"   {'evidence:' if j == 0 else '':<9} line {e.line}: {e.text}")
        out.append("")
    return "\n".join(out)
