"""The streaming explainer: offers each line holding a known keyword to the registry's recognisers, in order."""

from __future__ import annotations

import io
import os
from collections import deque
from typing import IO, Any, Iterable, Optional, Sequence, Union

from .._core import Scanner
from .lines import MAX_LINE_CHARS, Origin, strip_prefixes
from .model import Diagnosis, Group, ranks_text
from .recogniser import Host, Line, Recogniser
from .registry import BY_KIND, HELP, KEYWORDS, KINDS, READING_ORDER
from .wrapping import continuation, join

# Lines kept for context (the traceback lines that precede an error), all sources together, each cut here.
CONTEXT_LINES = 64
CONTEXT_CHARS = 1024
# A line shorter than this is not a terminal's wrap of a longer one (terminals are at least 80 columns wide).
TERMINAL_MIN_WIDTH = 80
# How much of a stream is read at a time.
READ_BYTES = 1 << 20

_KEYWORD_BYTES = [k.encode() for k in KEYWORDS]
# Bit i of the mask the reader gives a hit is KEYWORDS[i]: the recognisers owning the keywords a line holds.
_KEYWORD_MASKS = {r: sum(1 << i for i, k in enumerate(KEYWORDS) if k in r.keywords) for r in READING_ORDER}


class LogExplainer:
    """Streaming explainer: feed() text or bytes in order, then diagnoses(). Memory does not grow with the input.

    The C++ reader (gpuguard._core.Scanner) splits the stream into lines, cuts each at MAX_LINE_CHARS bytes and hands
    over only the lines holding a recogniser's keyword, with the line after each and the lines before each
    (context); everything else is counted and dropped without reaching Python.
    """

    def __init__(self, *, match_local: bool = True, local_devices: Optional[Sequence[Any]] = None,
                 local_host: Optional[str] = None, log_is_local: bool = False) -> None:
        self._host = Host(match_local, local_devices, local_host, log_is_local)
        self._scanner = Scanner(_KEYWORD_BYTES, MAX_LINE_CHARS, CONTEXT_LINES, CONTEXT_CHARS)
        self._context: deque[tuple[int, str]] = deque(maxlen=CONTEXT_LINES)
        self._groups: dict[str, Group] = {}
        self._pending: Optional[tuple[int, str, int]] = None  # a hit waiting for the line after it
        self._finished = False

    @property
    def lines(self) -> int:
        """Lines read so far."""
        return int(self._scanner.lines)

    def feed(self, text: Union[str, bytes]) -> None:
        """The next piece of the log. Bytes may end anywhere (the rest of a line may follow in the next piece); a
        str is whole lines (one without a line end gets one)."""
        data = text.encode("utf-8", "surrogateescape") if isinstance(text, str) else text
        if isinstance(text, str) and text and not text.endswith(("\n", "\r")):
            data += b"\n"  # a str is whole lines: a line fed alone ends with it
        self._take(self._scanner.feed(data))

    def feed_stream(self, stream: Union[IO[str], IO[bytes]]) -> None:
        """Reads ``stream`` to its end in READ_BYTES pieces, then finishes."""
        binary = getattr(stream, "buffer", stream) if not isinstance(stream, io.TextIOBase) or \
            hasattr(stream, "buffer") else None
        if binary is not None and hasattr(binary, "readinto"):
            buf = bytearray(READ_BYTES)
            view = memoryview(buf)
            while True:
                n = binary.readinto(buf)
                if not n:
                    break
                self._take(self._scanner.feed(view[:n]))
        else:
            while True:
                piece = stream.read(READ_BYTES)
                if not piece:
                    break
                self._take(self._scanner.feed(piece.encode("utf-8", "surrogateescape")
                                              if isinstance(piece, str) else piece))
        self.finish()

    def finish(self) -> None:
        """The log ended: a last line without a line end is read too. diagnoses() calls it."""
        if not self._finished:
            self._finished = True
            self._take(self._scanner.finish())
            self._flush(None)

    def _take(self, handed: Iterable[tuple[int, bool, bytes, int]]) -> None:
        for number, hit, raw, keywords in handed:
            text = raw.decode("utf-8", "replace")
            self._flush((number, text))
            if hit:
                self._pending = (number, text, keywords)
            else:
                self._context.append((number, text[:CONTEXT_CHARS]))

    def _flush(self, nxt: Optional[tuple[int, str]]) -> None:
        """Reads the pending hit, now that the line after it (``nxt``) is known."""
        if self._pending is None:
            return
        number, text, keywords = self._pending
        self._pending = None
        following = nxt[1] if nxt is not None and nxt[0] == number + 1 else None
        self._parse(number, text, keywords, following)
        self._context.append((number, text[:CONTEXT_CHARS]))

    def _group(self, kind: str) -> Group:
        group = self._groups.get(kind)
        if group is None:
            group = self._groups[kind] = Group()
        return group

    def _parse(self, number: int, raw: str, keywords: int, following: Optional[str]) -> None:
        body, origin = strip_prefixes(raw)
        # the recognisers owning a keyword the reader found in the line, in reading order (a keyword split by a
        # multi-byte character the decoder replaced is not offered: the reader's bytes are the truth)
        candidates = [r for r in READING_ORDER if keywords & _KEYWORD_MASKS[r]]
        body, number = self._unwrap(number, raw, body, origin, following, candidates)
        line = Line(number, body, origin, self._context, following)
        # each recogniser's matches contain one of its keywords, so skipping the others loses nothing; a keyword
        # that only a joined piece brought in belongs to that piece's own line, which is read on its own
        for recogniser in candidates:
            if recogniser.read(line, self._group):
                return

    def _unwrap(self, number: int, raw: str, body: str, origin: Origin, following: Optional[str],
                candidates: Sequence[Recogniser]) -> tuple[str, int]:
        """The message a wrap broke, whole. A line that holds a keyword but no match may be the second piece of a
        message begun on the line before; a match may go on past the line's end (a number cut by a terminal's
        wrap), which only a line at least a terminal wide can show. The joined text is kept only when it matches
        where the line alone did not, or further than it did."""
        span = _span(body, candidates)
        if span is None and self._context and self._context[-1][0] == number - 1:
            prev_body, prev_origin = strip_prefixes(self._context[-1][1])
            cont = continuation(prev_body, prev_origin, raw)
            if cont is not None:
                joined = join(prev_body, cont)
                joined_span = _span(joined, candidates)
                if joined_span is not None:
                    body, number, span = joined, number - 1, joined_span
        if following is None:
            return body, number
        if span is None or (span[1] >= len(body.rstrip()) and len(body) >= TERMINAL_MIN_WIDTH):
            cont = continuation(body, origin, following)
            # a match that reaches the line's end grows only into a terminal's wrap (no indent, no prefix): an
            # indented or prefixed next line may be the next record, and is joined only to complete a match
            if cont is not None and (span is None or not cont.separator):
                joined = join(body, cont)
                joined_span = _span(joined, candidates)
                if joined_span is not None and (span is None or (joined_span[0] == span[0] and
                                                                 joined_span[1] > span[1])):
                    body = joined
        return body, number

    def kinds(self) -> list[str]:
        """The kinds recognised so far, in report order, without building the diagnoses (a last line still open
        waits for finish())."""
        self._flush(None)
        return [kind for kind in KINDS if kind in self._groups]

    def diagnoses(self) -> list[Diagnosis]:
        self.finish()
        return [BY_KIND[kind].build(kind, self._groups[kind], self._host) for kind in self.kinds()]


def _span(body: str, recognisers: Sequence[Recogniser]) -> Optional[tuple[int, int]]:
    """Where the first pattern of these recognisers that matches ``body`` matches it."""
    for r in recognisers:
        for pattern in r.patterns:
            m = pattern.search(body)
            if m:
                return m.span()
    return None


def _explainer_of(text: Union[str, bytes], match_local: bool) -> LogExplainer:
    explainer = LogExplainer(match_local=match_local)
    data = text.encode("utf-8", "surrogateescape") if isinstance(text, str) else bytes(text)
    explainer.feed_stream(io.BytesIO(data))
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
    with open(path, "rb", buffering=0) as f:
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
