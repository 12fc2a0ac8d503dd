"""The streaming explainer: normalises each line the keyword filter passed (and its neighbours), joins the pieces of
a wrapped message, and offers the message to the registry's recognisers, in order."""

from __future__ import annotations

import dataclasses
import io
import itertools
import os
import re
from collections import deque
from typing import IO, Any, Callable, Iterable, Iterator, Optional, Sequence, Union, overload

from .._core import Scanner
from .lines import MAX_LINE_CHARS
from .model import Diagnosis, Group, ranks_text
from .normalise import NormalLine, joined_records, normalise
from .recogniser import ContextText, Host, Line, Recogniser
from .registry import (BY_KIND, FILTER_GROUPS, FILTER_KEYWORDS, HELP, KINDS, LINE_END_GROUPS, LINE_END_HEADS,
                       READING_ORDER)
from .wrapping import AS_IS, DEDENT, END, MAX_PIECES, SPACE, TERMINAL_MIN_WIDTH, Message, break_options, record_start

# Lines kept for context (the traceback lines that precede an error), all sources together, each cut here.
CONTEXT_LINES = 64
CONTEXT_CHARS = 1024
#: the most texts a line before a message is read as (ContextText.readings), each way the lines below may join it
CONTEXT_READINGS = 8
# Lines the reader hands out after each hit: the later pieces of a message wrapped below it.
LINES_AFTER = MAX_PIECES - 1
# How much of a stream is read at a time.
READ_BYTES = 1 << 20
# How far from a line the paste is searched for another line a terminal of its width broke.
TERMINAL_EVIDENCE_LINES = 16
# Records of other streams a container runtime may put between the pieces of a line it split.
MAX_INTERLEAVED = 4
# What a container runtime's record shows near its head (CRI's stream and tag, Docker's "log" key), behind any
# quote markers or line numbers: only such lines are normalised as they arrive.
_MAY_BE_STORE_RECORD = re.compile(r"std(?:out|err) [FP]|log(?:[\"\\]|&(?:amp;)?(?:quot|#34);){1,4}\s{0,8}:")
STORE_HEAD_CHARS = 160
# A line the keyword filter passes is offered to the recognisers whose keywords it holds; a line a store split
# (joined from its records, which the filter saw apart) is searched here for every keyword, whole.

_NO_ORIGIN = (None, None, None, None)


class _Entry:
    """One line handed out by the reader (a line a container runtime split: all its records), normalised when
    first looked at: most lines handed out are context no recogniser reads."""

    __slots__ = ("number", "last", "_raw", "_line", "mask", "hit", "taken", "_complete", "context_text", "broken",
                 "split_record")

    def __init__(self, number: int, raw: str, mask: int, hit: bool, line: Optional[NormalLine] = None) -> None:
        self.number = number
        self.last = number        # the input line its last record was on
        self._raw = raw
        self._line = line
        self.mask = mask          # bit i: READING_ORDER[i] holds a keyword (or a piece of one) here
        self.hit = hit
        self.taken = False        # a recogniser read it (alone or as a piece of a message)
        self._complete: Optional[bool] = None
        self.context_text: Optional[ContextText] = None  # as a line before a message, once built
        self.broken: Optional[bool] = None  # the next line goes on from it as a terminal's break (once known)
        # (store, stream) of a record the runtime split that this line, a terminal's piece of it, ends: the next
        # record of that stream goes on from it exactly
        self.split_record: Optional[tuple[str, str]] = None

    @property
    def line(self) -> NormalLine:
        if self._line is None:
            self._line = normalise(self._raw)
        return self._line

    def extend(self, record: NormalLine, number: int, mask: int, hit: bool) -> None:
        """The next record of a line the store split (CRI "P", a Docker record without its newline): joined
        exactly, the prefixes read again over the whole line."""
        self._line = joined_records(self.line, record)
        self.last = number
        self.mask |= mask | (_mask_of(self.line.body) if not self.mask else 0)
        self.hit = self.hit or hit or self.mask != 0
        self._complete = None
        self.context_text = None
        self.broken = None

    def complete(self) -> bool:
        """Whether this line alone holds a match of a recogniser it may hold: a message of its own."""
        if self._complete is None:
            self._complete = self.hit and _span(self.line.body, _recognisers(self.mask)) is not None
        return self._complete


def _broken_at_width(a: _Entry, b: _Entry) -> bool:
    """Whether line ``b`` goes on from ``a`` the way a terminal's break does (at column 0, no prefix, no record
    of its own): evidence of the terminal's width, a.line.width. Decided once per pair."""
    if a.broken is None:
        a.broken = b.number == a.last + 1 and not b.line.blank and b.line.indent == 0 and not b.line.store and \
            not b.line.header and b.line.origin.key() == _NO_ORIGIN and not record_start(b.line.body)
    return a.broken


class _Options(Sequence[tuple[Optional[str], ...]]):
    """The readings of each break between the pieces around a hit, worked out when the joining asks (most hits
    need one or two)."""

    def __init__(self, compute: Callable[[int], tuple[Optional[str], ...]], n: int) -> None:
        self._compute = compute
        self._known: dict[int, tuple[Optional[str], ...]] = {}
        self._n = n

    def __len__(self) -> int:
        return self._n

    @overload
    def __getitem__(self, k: int) -> tuple[Optional[str], ...]: ...
    @overload
    def __getitem__(self, k: slice) -> list[tuple[Optional[str], ...]]: ...

    def __getitem__(self, k: Union[int, slice]) -> Any:
        if isinstance(k, slice):
            return [self[i] for i in range(self._n)[k]]
        if k < 0:
            k += self._n
        if not 0 <= k < self._n:
            raise IndexError(k)
        if k not in self._known:
            self._known[k] = self._compute(k)
        return self._known[k]


def _never() -> bool:
    return False


def _mask_of(text: str) -> int:
    """The recognisers (bit i: READING_ORDER[i]) one of whose keywords ``text`` holds."""
    return sum(1 << i for i, r in enumerate(READING_ORDER) if any(k in text for k in r.keywords))


def _recognisers(mask: int) -> list[Recogniser]:
    return [r for i, r in enumerate(READING_ORDER) if mask >> i & 1]


class _Context(Sequence[tuple[int, str]]):
    """The lines before a message, as their programs printed them (launcher prefixes kept), oldest first: a view
    of the explainer's window, built only when a recogniser looks. Each text is a ContextText: it says whether the
    next line may go on from its last character (a value read up to its end may be cut there)."""

    def __init__(self, entries: Sequence[_Entry], text_of: Callable[[int], "ContextText"]) -> None:
        self._entries = entries
        self._text_of = text_of

    def __len__(self) -> int:
        return len(self._entries)

    def _item(self, i: int) -> tuple[int, str]:
        return self._entries[i].number, self._text_of(i)

    @overload
    def __getitem__(self, i: int) -> tuple[int, str]: ...
    @overload
    def __getitem__(self, i: slice) -> list[tuple[int, str]]: ...

    def __getitem__(self, i: Union[int, slice]) -> Union[tuple[int, str], list[tuple[int, str]]]:
        if isinstance(i, slice):
            return [self._item(j) for j in range(len(self._entries))[i]]
        return self._item(i if i >= 0 else len(self._entries) + i)

    def __iter__(self) -> Iterator[tuple[int, str]]:
        return (self._item(j) for j in range(len(self._entries)))

    def __reversed__(self) -> Iterator[tuple[int, str]]:
        return (self._item(j) for j in reversed(range(len(self._entries))))


class LogExplainer:
    """Streaming explainer: feed() text or bytes in order, then diagnoses(). Memory does not grow with the input.

    The C++ reader (gpuguard._core.Scanner) splits the stream into lines, cuts each at MAX_LINE_CHARS bytes and hands
    over only the lines holding a piece of a recogniser's keyword, with the LINES_AFTER lines after each and the
    CONTEXT_LINES lines before each; everything else is counted and dropped without reaching Python. Each line
    handed over is normalised once (``normalise.py``); a hit is read once the lines after it are known.
    """

    def __init__(self, *, match_local: bool = True, local_devices: Optional[Sequence[Any]] = None,
                 local_host: Optional[str] = None, log_is_local: bool = False) -> None:
        self._host = Host(match_local, local_devices, local_host, log_is_local)
        self._scanner = Scanner(FILTER_KEYWORDS, MAX_LINE_CHARS, CONTEXT_LINES, CONTEXT_CHARS, FILTER_GROUPS,
                                LINES_AFTER, LINE_END_HEADS, LINE_END_GROUPS)
        # the lines handed over lately: the context of the oldest hit still waiting, and the lines after it
        self._window: deque[_Entry] = deque(maxlen=CONTEXT_LINES + LINES_AFTER + 1)
        self._pending: deque[_Entry] = deque()  # hits waiting for the lines after them
        self._last_number = 0  # the last line handed over
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
            if number != self._last_number + 1:
                self._read_pending(every=True)  # a gap: every line after the waiting hits is known
            self._last_number = number
            text = raw.decode("utf-8", "replace")
            before = self._window[-1] if self._window and self._window[-1].last == number - 1 else None
            if before is not None and before._line is not None and before._line.open_string:
                line: Optional[NormalLine] = normalise(text, string_goes_on=True)  # a Docker record a break cut
            elif _MAY_BE_STORE_RECORD.search(text, 0, STORE_HEAD_CHARS):
                line = normalise(text)  # a record a container runtime may have split: joined now
            else:
                line = None  # normalised when looked at
            open_part = self._open_partial(line, number) if line is not None else None
            if open_part is not None:  # the store split this line: the record goes on here, exactly
                open_part.extend(line, number, mask, hit)  # type: ignore[arg-type]
                if open_part.hit and open_part not in self._pending:
                    self._pending.append(open_part)
                continue
            entry = _Entry(number, text, mask, hit, line)
            if before is not None and line is None:  # a terminal's piece of the line above, if any
                split = before.split_record or (
                    (before._line.store, before._line.stream) if before._line is not None and before._line.partial
                    else None)
                entry.split_record = split
            self._window.append(entry)
            if entry.hit:
                self._pending.append(entry)
            while self._pending and number - self._pending[0].last >= LINES_AFTER:
                self._read(self._pending.popleft())

    def _open_partial(self, line: NormalLine, number: int) -> Optional[_Entry]:
        """The line a container runtime split that ``line`` continues: the last line of the same stream among the
        last few, if it is partial (CRI interleaves stdout and stderr records)."""
        if not line.store:
            return None
        expected = number - 1
        for entry in itertools.islice(reversed(self._window), MAX_INTERLEAVED):
            if entry.last != expected or entry._line is None or entry.line.store != line.store:
                return None  # a line between them the reader left out, or one no store wrote (a terminal's break)
            if entry.line.stream == line.stream:
                return entry if entry.line.partial else None
            expected = entry.number - 1  # another stream's record: the runtime interleaves them
        return None

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
        lo = at  # the lines above that may hold the head of a message the hit goes on
        while lo > 0 and at - lo < LINES_AFTER and window[lo - 1].last == window[lo].number - 1 and \
                not window[lo - 1].taken:
            lo -= 1
        hi = at
        while hi + 1 < len(window) and window[hi + 1].number == window[hi].last + 1 and hi - at < LINES_AFTER:
            hi += 1
        pieces = [window[i] for i in range(lo, hi + 1)]
        mask = 0
        for p in pieces:
            mask |= p.mask
        candidates = _recognisers(mask)
        # a line below that holds a message of its own is not the rest of this one; the hit itself may be the rest
        # of the line above whether it matches alone or not
        def readings(i: int) -> tuple[Optional[str], ...]:
            # a piece that goes on a piece above is as wide as the line they make so far
            logical = pieces[i].line.width + (widths[i - 1] if i > 0 and options[i - 1] != (END,) else 0)
            widths[i] = logical
            split = pieces[i].split_record
            if split is not None and (pieces[i + 1].line.store, pieces[i + 1].line.stream) == split:
                return (AS_IS,)  # the runtime's next record of a line it split, after a terminal's pieces of it
            return break_options(pieces[i].line, pieces[i + 1].line, self._terminal_width(lo + i),
                                 pieces[i + 1].complete if lo + i + 1 > at else _never, logical)

        widths: dict[int, int] = {}
        options = _Options(readings, len(pieces) - 1)
        # whether the log may hold a line after the last piece that the message does not see (not read yet: a hit
        # is read LINES_AFTER input lines after it, and a line a runtime split counts several; one the reader left
        # out; one past the pieces): a number at the message's end may go on there, unless the log ends there
        unseen_below = not (self._finished and window[hi].last >= self._scanner.lines)
        message = Message([p.line for p in pieces], options, at - lo, lambda i: pieces[i].split_record is not None,
                          unseen_below)
        span = message.join(lambda text: _span(text, candidates))
        if span is None:
            # no pattern matches here, joined or not: a recogniser that reads a longer message across the lines
            # before (torch's out-of-memory text) gets the hit as it is
            base = max(0, at - CONTEXT_LINES)
            alone = Line(entry.number, entry.line.body, entry.line.origin,
                         _Context([window[i] for i in range(base, at)], lambda i: self._context_text(base + i)),
                         printed=ContextText(entry.line.printed, lambda: self._readings(entry)),
                         following=self._following(at))
            for recogniser in candidates:
                if recogniser.read(alone, self._group):
                    return
            return
        first = pieces[message.first]
        origin = message.origin if message.origin.key() != _NO_ORIGIN else entry.line.origin
        unsure = message.origin_unreadable()
        if unsure:  # a prefix a break cut, read two ways: who printed the message is unreadable
            origin = dataclasses.replace(origin, **{f: None for f in unsure})
        base = max(0, lo + message.first - CONTEXT_LINES)
        context = _Context([window[i] for i in range(base, lo + message.first)],
                           lambda i: self._context_text(base + i))
        # the message as printed: its body, with the leading blanks of a first piece that has no prefix (a terminal
        # may have broken the line just before them)
        head = first.line.printed
        lead = head[:len(head) - len(head.lstrip(" \t"))] if first.line.origin.key() == _NO_ORIGIN and \
            not first.line.header else ""
        last, printed = pieces[message.last], lead + message.body
        line = Line(first.number, message.body, origin, context, message,
                    ContextText(printed, lambda: self._readings(last, printed)), self._following(lo + message.last))
        # each recogniser's matches contain one of its keywords (whole, or broken across the pieces joined), so
        # skipping the others loses nothing
        for recogniser in candidates:
            if recogniser.read(line, self._group):
                for i in message.covers(span):
                    pieces[i].taken = True
                if unsure:
                    for kind in recogniser.kinds:
                        if kind in self._groups:
                            self._groups[kind].unreadable("who printed it (its prefix is broken across lines)")
                return

    def _index(self, entry: _Entry) -> Optional[int]:
        window = self._window
        return next((i for i in range(len(window) - 1, -1, -1) if window[i] is entry), None)

    def _following(self, index: Optional[int]) -> Optional[ContextText]:
        """The line right after the one at ``index`` of the window, as its program printed it, with its readings
        (None when the window does not hold the log's next line)."""
        window = self._window
        if index is not None and index + 1 < len(window) and window[index + 1].number == window[index].last + 1:
            return self._context_text(index + 1)
        return None

    def _context_text(self, index: int) -> ContextText:
        """The line at ``index`` of the window as its program printed it, cut at CONTEXT_CHARS; its readings (with
        the lines that go on from it) are worked out when a recogniser asks. Built once a line."""
        entry = self._window[index]
        if entry.context_text is None:
            entry.context_text = ContextText(entry.line.printed[:CONTEXT_CHARS], lambda: self._readings(entry),
                                             lambda: self._following(self._index(entry)))
        return entry.context_text

    def _readings(self, entry: _Entry, text: Optional[str] = None) -> tuple[str, ...]:
        """The texts of a line (``text``: what ends with the line ``entry``, the line itself by default) with the
        lines that go on from it: those that certainly do joined (a terminal as wide as the paste shows, a line of
        nothing but prefixes); where the next may go on but need not, one text for each way (the line alone
        first), each going on as far as the lines below certainly do (up to CONTEXT_READINGS texts)."""
        window = self._window
        index = self._index(entry)
        text = entry.line.printed if text is None else text
        if index is None:
            return (text[:CONTEXT_CHARS],)
        done: list[str] = []
        going = [text]
        i = index
        while going and i + 1 < len(window) and window[i + 1].number == window[i].last + 1 and \
                i - index < MAX_PIECES - 1:
            options = break_options(window[i].line, window[i + 1].line, self._terminal_width(i), _never)
            if options == (END,):
                break
            nxt = window[i + 1].line
            piece = nxt.body if nxt.origin.key() != _NO_ORIGIN or nxt.header else nxt.printed
            ended = going if END in options else []
            joined = [t.rstrip() + " " + piece.lstrip() if sep == SPACE else
                      t + (piece.lstrip() if sep == DEDENT else piece)
                      for t in going for sep in options if sep is not END]
            if len(done) + len(ended) + len(joined) > CONTEXT_READINGS:
                break  # too many ways: the texts so far
            done += ended
            going = []
            for t in joined:
                (done if len(t) >= CONTEXT_CHARS else going).append(t)
            i += 1
        return tuple(dict.fromkeys(t[:CONTEXT_CHARS] for t in done + going))

    def _terminal_width(self, index: int):  # type: ignore[no-untyped-def]
        """Whether the paste shows a terminal as wide as the line at ``index`` of the window: another line of the
        window, of exactly that width, broken where a terminal breaks (the next line goes on at column 0)."""
        window = self._window

        def shows(width: int) -> bool:
            if width < TERMINAL_MIN_WIDTH:
                return False
            for i in range(max(0, index - TERMINAL_EVIDENCE_LINES), min(len(window) - 1, index + TERMINAL_EVIDENCE_LINES)):
                if i != index and window[i].line.width == width and _broken_at_width(window[i], window[i + 1]):
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
