"""Messages broken across lines (by a terminal, a viewer, a person, the program or a log store): where a line may
go on into the next, how the pieces are joined, and which numbers a joined message gives for certain.

A break between two normalised lines (``normalise.NormalLine``) allows some of three readings: END (the message
ends there), AS_IS (the next line goes on exactly where this one stopped: a terminal or `fold` broke it at its
width, in the middle of a word or a number, or a container runtime split a long line) and SPACE (it goes on after
one space: a viewer's soft wrap, a person's hard wrap, the program's own line break). What the lines show narrows
the choice: a store's partial mark (CRI "P", a Docker record without its newline) allows AS_IS only, and so does a
terminal's width when the paste shows it twice; an indented next line, a blank kept at the line's end or the same
launcher / store prefix repeated allow END or SPACE; a line that starts a record of its own (a log header, a
timestamp, an NCCL header, a traceback, another process's prefix, a message complete in itself) allows END only.

A message is joined only where a join makes a recogniser's pattern match, or match further. A number in it (a
device, a rank, a PCI id, a sequence number) is taken only when every reading the touching breaks allow, in which
the pattern still matches there and the number stands whole (no letter or digit glued to either side), gives the
same digits; otherwise it is unreadable and the diagnosis says so, never a guess.
"""

from __future__ import annotations

import itertools
import re
from typing import Any, Callable, Optional, Sequence

from .normalise import NormalLine

# A line shorter than this is no wrapped piece of a message (no terminal or viewer is that narrow).
MIN_WRAPPED_CHARS = 40
# A line at least this wide may have been broken by a terminal at its width (terminals are at least 80 wide).
TERMINAL_MIN_WIDTH = 80
# A next line opening with the same this many characters as the line is another record like it.
SAME_HEAD_CHARS = 12
# A continuation is joined to at most this many characters: a "continuation" longer than a screen line is a new line.
MAX_CONTINUATION_CHARS = 4096
# The most lines one message is read across (the reader hands out LINES_AFTER lines after each hit).
MAX_PIECES = 6
# The most alternative readings tried for one number.
MAX_READINGS = 27

END: Optional[str] = None
AS_IS = ""
SPACE = " "

# What starts a record of its own (each alternative anchored and bounded); log headers the normaliser knows are
# removed before this is asked, so the timestamps here are the ones of unknown formats.
_RECORD_START = re.compile(
    r"(?:\[?\d{4}-\d\d-\d\d[ T]\d"            # ISO timestamps
    r"|\[?[IWEF]\d{4} \d\d:\d\d"               # glog / c10 logging: "I1121 05:00:00", "[E1121 05:00:00"
    r"|[^\s:\[\]]{1,255}:\d{1,10}(?::\d{1,10})? (?:\[\d{1,4}\]|NCCL )"  # NCCL: "host:pid:tid [dev]", "host:pid NCCL DIAG"
    r"|Traceback \(|File \"|During handling|The above exception"
    r"|[A-Za-z_][\w.]{0,200}(?:Error|Exception|Warning|Interrupt)\b"
    r"|\[[A-Za-z_]{0,32}\d{1,6}\]:|\(\w{0,64} ?pid=\d"  # another launcher prefix left in the body
    r"|NCCL (?:INFO|WARN)|\{)")
_NO_ORIGIN = (None, None, None, None)


def break_options(line: NormalLine, nxt: NormalLine, terminal_width: Callable[[int], bool],
                  complete: Callable[[], bool]) -> tuple[Optional[str], ...]:
    """The readings the break between ``line`` and the next input line ``nxt`` allows (see the module's docstring).

    ``terminal_width(w)``: whether the paste shows a terminal w columns wide (another line broken at w);
    ``complete()``: whether ``nxt`` holds a message of its own (asked last: it runs patterns)."""
    if line.blank or nxt.blank:
        return (END,)
    if line.partial:
        return (AS_IS,) if (nxt.store, nxt.stream) == (line.store, line.stream) else (END,)
    if line.width < MIN_WRAPPED_CHARS or nxt.header or len(nxt.body) > MAX_CONTINUATION_CHARS:
        return (END,)
    body = nxt.body.rstrip()
    if not body or _RECORD_START.match(body):
        return (END,)
    program_break = False  # the program printed the next line itself (its launcher / the store prefixed it again)
    if nxt.store:
        if (nxt.store, nxt.stream) != (line.store, line.stream):
            return (END,)
        program_break = True
    if nxt.origin.key() != _NO_ORIGIN:
        if nxt.origin.key() != line.origin.key():
            return (END,)  # another process's line
        program_break = True
    if len(body) >= SAME_HEAD_CHARS and body[:SAME_HEAD_CHARS] == line.body[:SAME_HEAD_CHARS]:
        return (END,)  # the same header again: the next record of the same kind
    if complete():
        return (END,)
    if program_break or nxt.indent > line.indent or line.trailing_blank:
        return (END, SPACE)
    if line.width >= TERMINAL_MIN_WIDTH and terminal_width(line.width):
        return (AS_IS,)
    return (END, AS_IS, SPACE)


def render(pieces: Sequence[NormalLine], first: int, last: int, seps: Sequence[Optional[str]]) -> tuple[str, list[int]]:
    """The text of pieces[first..last] joined by seps[k] between piece k and k + 1, and where each piece starts."""
    body = pieces[first].body
    starts = [0]
    for k in range(first, last):
        if seps[k] == SPACE:
            body = body.rstrip() + SPACE
        starts.append(len(body))
        body += pieces[k + 1].body
    return body, starts


Match = Callable[[str], Optional[tuple[int, int]]]


class Message:
    """One message read across consecutive lines: its pieces, the reading chosen at each break, its text."""

    def __init__(self, pieces: Sequence[NormalLine], options: Sequence[tuple[Optional[str], ...]], hit: int) -> None:
        self.pieces = pieces
        self.options = options            # options[k]: the readings of the break after pieces[k]
        self.first = self.last = hit
        self.seps: list[Optional[str]] = [END] * max(0, len(pieces) - 1)
        self.body, self.starts = render(pieces, hit, hit, self.seps)

    def _set(self, first: int, last: int) -> None:
        self.first, self.last = first, last
        self.body, self.starts = render(self.pieces, first, last, self.seps)

    def join(self, match: Match, backward: bool) -> Optional[tuple[int, int]]:
        """Joins the pieces around the hit as far as the pattern needs them; the match's span in the message.
        Back only when the hit alone does not match (it is then a later piece of a message begun above); on
        while the match is missing or reaches the end of the text (a number or a clause may go on below)."""
        span = match(self.body)
        if span is None and backward and self.first > 0:
            k = self.first - 1
            best = None
            for sep in self.options[k]:
                if sep is END:
                    continue
                self.seps[k] = sep
                text, _ = render(self.pieces, k, self.last, self.seps)
                found = match(text)
                if found is not None and (best is None or _better(text, found, best[2], best[1])):
                    best = (sep, found, text)
            self.seps[k] = END
            if best is not None:
                self.seps[k] = best[0]
                self._set(k, self.last)
                span = best[1]
        while (self.last + 1 < len(self.pieces) and self.last - self.first + 1 < MAX_PIECES and
               (span is None or span[1] >= len(self.body.rstrip()))):
            k = self.last
            best = None
            for sep in self.options[k]:
                if sep is END:
                    continue
                self.seps[k] = sep
                text, _ = render(self.pieces, self.first, k + 1, self.seps)
                found = match(text)
                if found is None or (span is not None and (found[0] != span[0] or found[1] <= span[1])):
                    continue  # a join is kept only where it makes the pattern match, or match further
                if best is None or _better(text, found, best[2], best[1]):
                    best = (sep, found, text)
            self.seps[k] = END
            if best is None:
                break
            self.seps[k] = best[0]
            self._set(self.first, k + 1)
            span = best[1]
        return span

    def covers(self, span: tuple[int, int]) -> range:
        """The piece indices a span of the text reaches into."""
        return range(self.first, self.first + sum(1 for s in self.starts if s < span[1]))

    def value(self, m: "re.Match[str]", group: str, parse: Callable[[str], Any] = str) -> Any:
        """``parse`` of the text of ``group`` (a number, or a list of them) in match ``m`` of this message's text,
        when every reading of the breaks it touches gives the same; None when it is unreadable (or absent)."""
        text = m.group(group)
        if text is None:
            return None
        try:
            value = parse(text)
        except ValueError:
            return None
        s, e = m.span(group)
        touching = []
        for k in range(self.first, self.last):
            j = self.starts[k - self.first + 1]
            sep = self.seps[k] or ""
            if len(self.options[k]) > 1 and s <= j and e >= j - len(sep):
                touching.append(k)
        end_edge = self.last + 1 < len(self.pieces) and len(self.options[self.last]) > 1 and \
            e >= len(self.body.rstrip())
        if end_edge:
            touching.append(self.last)
        if not touching:
            return value if _whole(self.body, s, e) else None
        values = [value] if _whole(self.body, s, e) else []
        reach = self.last + 1 if end_edge else self.last
        for combo in itertools.islice(itertools.product(*(self.options[k] for k in touching)), MAX_READINGS):
            seps = list(self.seps)
            for k, sep in zip(touching, combo):
                seps[k] = sep
            last = self.first
            while last < reach and seps[last] is not END:
                last += 1  # a break read as END ends the message there
            if seps == self.seps and last == self.last:
                continue  # the reading chosen
            text, starts = render(self.pieces, self.first, last, seps)
            start = _moved(m.start(), self.starts, starts)
            other = m.re.search(text, start) if start <= len(text) else None
            if other is None or other.start() != start or other.group(group) is None:
                continue  # the pattern does not read this message there: not a reading of this number
            os, oe = other.span(group)
            if _whole(text, os, oe):
                try:
                    read = parse(other.group(group))
                except ValueError:
                    continue
                if read not in values:
                    values.append(read)
            if len(values) > 1:
                return None
        return values[0] if len(values) == 1 else None


def _better(text: str, found: tuple[int, int], best_text: str, best: tuple[int, int]) -> bool:
    """Whether a match is a better reading than the best so far: one that ends between words first (a join
    glueing a number to the next word is the wrong one), then the one that reaches further."""
    return (_clean_end(text, found[1]), found[1]) > (_clean_end(best_text, best[1]), best[1])


def _clean_end(text: str, end: int) -> bool:
    return end >= len(text) or end == 0 or not (text[end - 1].isalnum() and text[end].isalnum())


def _whole(text: str, s: int, e: int) -> bool:
    """Whether text[s:e] stands alone: no letter or digit glued before or after it."""
    return (s == 0 or not text[s - 1].isalnum()) and (e >= len(text) or not text[e].isalnum())


def _moved(pos: int, starts: Sequence[int], new_starts: Sequence[int]) -> int:
    """Where position ``pos`` of one rendering lies in another (pieces start at ``starts`` / ``new_starts``)."""
    for p in range(len(starts) - 1, -1, -1):
        if pos >= starts[p]:
            return new_starts[p] + (pos - starts[p]) if p < len(new_starts) else pos
    return pos
