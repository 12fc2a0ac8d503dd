"""The streaming explainer: normalises each line the keyword filter passed (and its neighbours), joins the pieces of
a wrapped message, and offers the message to the registry's recognisers, in order."""

from __future__ import annotations

import dataclasses
import io
import os
from collections import deque
from typing import IO, Any, Iterable, Iterator, Optional, Sequence, Union, overload

from .lines import MAX_LINE_CHARS, Origin
from .model import Diagnosis, Group, ranks_text
from .normalise import NormalLine, normalise
from .recogniser import Host, Line, Recogniser
from .registry import BY_KIND, FILTER_GROUPS, FILTER_KEYWORDS, HELP, KINDS, NEIGHBOUR_FRAGMENTS, READING_ORDER
from .wrapping import END, MAX_PIECES, TERMINAL_MIN_WIDTH, Message, break_options

# Lines kept for context (the traceback lines that precede an error), all sources together, each cut here.
CONTEXT_LINES = 64
CONTEXT_CHARS = 1024
# Lines the reader hands out after each hit: the later pieces of a message wrapped below it.
LINES_AFTER = MAX_PIECES - 1
# How much of a stream is read at a time.
READ_BYTES = 1 << 20
# A keyword a break cut leaves its halves at the end of one line and the start of the next: only these many
# characters at each end of a line are searched for them.
EDGE_CHARS = 64

_NO_ORIGIN = (None, None, None, None)


class _Entry:
    """One line handed out by the reader, normalised once."""

    __slots__ = ("number", "line", "mask", "hit", "taken", "_complete")

    def __init__(self, number: int, line: NormalLine, mask: int, hit: bool) -> None:
        self.number = number
        self.line = line
        self.mask = mask          # bit i: READING_ORDER[i] holds a keyword (or a piece of one) here
        self.hit = hit
        self.taken = False        # a recogniser read it (alone or as a piece of a message)
        self._complete: Optional[bool] = None

    def complete(self) -> bool:
        """Whether this line alone holds a match of a recogniser it may hold: a message of its own."""
        if self._complete is None:
            self._complete = self.hit and _span(self.line.body, _recognisers(self.mask)) is not None
        return self._complete


def _edge_mask(body: str) -> int:
    """The recognisers one of whose keywords has a half at the start or the end of ``body`` (a keyword broken
    across two lines leaves its halves there)."""
    head, tail = body[:EDGE_CHARS], body.rstrip()[-EDGE_CHARS:]
    mask = 0
    for fragment, group in NEIGHBOUR_FRAGMENTS:
        if fragment in head or fragment in tail:
            mask |= 1 << group
    return mask


def _recognisers(mask: int) -> list[Recogniser]:
    return [r for i, r in enumerate(READING_ORDER) if mask >> i & 1]


class _Context(Sequence[tuple[int, str]]):
    """The lines before a message, as their programs printed them (launcher prefixes kept), oldest first: a view
    of the explainer's window, built only when a recogniser looks."""

    def __init__(self, entries: Sequence[_Entry]) -> None:
        self._entries = entries

    def __len__(self) -> int:
        return len(self._entries)

    @overload
    def __getitem__(self, i: int) -> tuple[int, str]: ...
    @overload
    def __getitem__(self, i: slice) -> list[tuple[int, str]]: ...

    def __getitem__(self, i: Union[int, slice]) -> Union[tuple[int, str], list[tuple[int, str]]]:
        if isinstance(i, slice):
            return [(e.number, e.line.printed[:CONTEXT_CHARS]) for e in self._entries[i]]
        e = self._entries[i]
        return e.number, e.line.printed[:CONTEXT_CHARS]

    def __iter__(self) -> Iterator[tuple[int, str]]:
        return ((e.number, e.line.printed[:CONTEXT_CHARS]) for e in self._entries)

    def __reversed__(self) -> Iterator[tuple[int, str]]:
        return ((e.number, e.line.printed[:CONTEXT_CHARS]) for e in reversed(self._entries))


class LogExplainer:
    """Streaming explainer: feed() text or bytes in order, then diagnoses(). Memory does not grow with the input.

    The C++ reader (gpuguard._core.Scanner) splits the stream into lines, cuts each at MAX_LINE_CHARS bytes and hands
    over only the lines holding a piece of a recogniser's keyword, with the LINES_AFTER lines after each and the
    CONTEXT_LINES lines before each; everything else is counted and dropped without reaching Python. Each line
    handed over is normalised once (``normalise.py``); a hit is read once the lines after it are known.
    """

    def __init__(self, *, match_local: bool = True, local_devices: Optional[Sequence[Any]] = None,
                 local_host: Optional[str] = None, log_is_local: bool = False) -> None:
        from .._core import Scanner

        self._host = Host(match_local, local_devices, local_host, log_is_local)
        self._scanner = Scanner(FILTER_KEYWORDS, MAX_LINE_CHARS, CONTEXT_LINES, CONTEXT_CHARS, FILTER_GROUPS,
                                LINES_AFTER)
        # the lines handed over lately: the context of the oldest hit still waiting, and the lines after it
        self._window: deque[_Entry] = deque(maxlen=CONTEXT_LINES + LINES_AFTER + 1)
        self._pending: deque[_Entry] = deque()  # hits waiting for the lines after them
        self._groups: dict[str, Group] = {}
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
            self._read_pending(every=True)

    def _take(self, handed: Iterable[tuple[int, bool, bytes, int]]) -> None:
        for number, hit, raw, mask in handed:
            if self._window and self._window[-1].number + 1 != number:
                self._read_pending(every=True)  # a gap: every line after the waiting hits is known
            line = normalise(raw.decode("utf-8", "replace"))
            # a piece of a keyword a break cut: its half at the line's start or end (the reader's bytes say
            # which recognisers a hit holds whole keywords of)
            mask |= _edge_mask(line.body) if not line.blank else 0
            entry = _Entry(number, line, mask, hit or mask != 0)
            self._window.append(entry)
            if entry.hit:
                self._pending.append(entry)
            while self._pending and number - self._pending[0].number >= LINES_AFTER:
                self._read(self._pending.popleft())

    def _read_pending(self, every: bool) -> None:
        while self._pending:
            self._read(self._pending.popleft())

    def _group(self, kind: str) -> Group:
        group = self._groups.get(kind)
        if group is None:
            group = self._groups[kind] = Group()
        return group

    def _read(self, entry: _Entry) -> None:
        """Reads one hit: the message it is a piece of, joined, offered to the recognisers it may belong to."""
        if entry.taken:
            return  # read already, as a later piece of the message above it
        window = self._window
        at = len(window) - 1
        while at >= 0 and window[at] is not entry:
            at -= 1
        if at < 0:
            return  # cannot happen: a hit is read before it leaves the window
        lo = at - 1 if at > 0 and window[at - 1].number == entry.number - 1 and not window[at - 1].taken else at
        hi = at
        while hi + 1 < len(window) and window[hi + 1].number == window[hi].number + 1 and hi - at < LINES_AFTER:
            hi += 1
        pieces = [window[i] for i in range(lo, hi + 1)]
        mask = 0
        for p in pieces:
            mask |= p.mask
        candidates = _recognisers(mask)
        options = [break_options(a.line, b.line, self._terminal_width(lo + i), b.complete)
                   for i, (a, b) in enumerate(zip(pieces, pieces[1:]))]
        message = Message([p.line for p in pieces], options, at - lo)
        span = message.join(lambda text: _span(text, candidates), backward=lo < at)
        if span is None:
            return
        first = pieces[message.first]
        origin = first.line.origin if first.line.origin.key() != _NO_ORIGIN else entry.line.origin
        context = _Context([window[i] for i in range(max(0, lo + message.first - CONTEXT_LINES),
                                                     lo + message.first)])
        line = Line(first.number, message.body, origin, context, message)
        # each recogniser's matches contain one of its keywords (whole, or broken across the pieces joined), so
        # skipping the others loses nothing
        for recogniser in candidates:
            if recogniser.read(line, self._group):
                for i in message.covers(span):
                    pieces[i].taken = True
                return

    def _terminal_width(self, index: int):  # type: ignore[no-untyped-def]
        """Whether the paste shows a terminal as wide as the line at ``index`` of the window: another line of the
        window, of exactly that width, broken where a terminal breaks (the next line goes on at column 0)."""
        window = self._window

        def shows(width: int) -> bool:
            if width < TERMINAL_MIN_WIDTH:
                return False
            for i in range(len(window) - 1):
                if i == index:
                    continue
                a, b = window[i], window[i + 1]
                if a.line.width == width and b.number == a.number + 1 and not b.line.blank and \
                        b.line.indent == 0 and not b.line.store and not b.line.header and \
                        b.line.origin.key() == _NO_ORIGIN and not a.line.trailing_blank:
                    return True
            return False

        return shows

    def kinds(self) -> list[str]:
        """The kinds recognised so far, in report order, without building the diagnoses (a hit still waiting for
        the lines after it is read now)."""
        self._read_pending(every=True)
        return [kind for kind in KINDS if kind in self._groups]

    def diagnoses(self) -> list[Diagnosis]:
        self.finish()
        return [_with_unreadable(BY_KIND[kind].build(kind, self._groups[kind], self._host), self._groups[kind])
                for kind in self.kinds()]


def _with_unreadable(d: Diagnosis, group: Group) -> Diagnosis:
    """The diagnosis, saying which values the text does not give for certain."""
    notes = tuple(group.facts.get("unreadable", ()))
    if not notes:
        return d
    return dataclasses.replace(d, unreadable=notes, summary=(
        d.summary + " Unreadable in this text: " + "; ".join(notes) + " (a line break cuts through it where the "
        "text does not tell how the pieces join; the cause and the fix do not depend on it)."))


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
