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
from typing import Any, Callable, NamedTuple, Optional, Sequence

from .lines import Origin, prefix_end
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
DEDENT = "\0"  # as AS_IS, the next line's indentation (a viewer's, not the text's) left out

# What starts a record of its own (each alternative anchored and bounded); log headers the normaliser knows are
# removed before this is asked, so the timestamps here are the ones of unknown formats.
_RECORD_START = re.compile(
    r"(?:\[?\d{4}-\d\d-\d\d[ T]\d"            # ISO timestamps
    r"|\[?[IWEF]\d{4} \d\d:\d\d"               # glog / c10 logging: "I1121 05:00:00", "[E1121 05:00:00"
    r"|(?P<nccl>[^\s:\[\]]{1,255}:\d{1,10}(?::\d{1,10} \[\d{1,4}\]| NCCL DIAG))"  # NCCL: "host:pid:tid [dev]", "host:pid NCCL DIAG"
    r"|Traceback \(|File \"|During handling|The above exception"
    r"|[A-Za-z_][\w.]{0,200}(?:Error|Exception|Warning|Interrupt)\b"
    r"|\[[A-Za-z_]{0,32}\d{1,6}\]:|\(\w{0,64} ?pid=\d"  # another launcher prefix left in the body
    r"|\{\s{0,8}\")")  # a JSON record
_NO_ORIGIN = (None, None, None, None)
_HOST_CHAR = re.compile(r"[^\s:\[\]]")


def all_prefix(line: NormalLine) -> bool:
    """Whether the line holds nothing but launcher prefixes and a log header (its message is on the next line)."""
    printed = line.printed.rstrip()
    if not printed or line.body.strip() == "":
        return bool(printed)
    return prefix_end(printed + " x")[0] == len(printed) + 1


def record_start(body: str) -> bool:
    """Whether a line's body starts a record of its own (a timestamp, an NCCL header, a traceback, ...)."""
    return _RECORD_START.match(body) is not None


def break_options(line: NormalLine, nxt: NormalLine, terminal_width: Callable[[int], bool],
                  complete: Callable[[], bool], logical_width: int = 0) -> tuple[Optional[str], ...]:
    """The readings the break between ``line`` and the next input line ``nxt`` allows (see the module's docstring).

    ``terminal_width(w)``: whether the paste shows a terminal w columns wide (another line broken at w);
    ``complete()``: whether ``nxt`` holds a message of its own (asked last: it runs patterns);
    ``logical_width``: the width of the line ``line`` is the last piece of so far, when it goes on a line above
    (a short piece of a long line may be broken again)."""
    if line.blank or nxt.blank:
        return (END,)
    if line.partial and nxt.store:
        return (AS_IS,) if (nxt.store, nxt.stream) == (line.store, line.stream) else (END,)
    if line.ended:
        return (END,)  # the store closed the program's line here; what follows is the record's own fields
    if line.open_string and not nxt.blank:  # a Docker record's log string goes on below, for certain
        if line.width >= TERMINAL_MIN_WIDTH and terminal_width(line.width):
            return (AS_IS,)
        return (AS_IS, SPACE, DEDENT) if nxt.indent else (AS_IS, SPACE)
    if max(line.width, logical_width) < MIN_WRAPPED_CHARS or nxt.header or len(nxt.body) > MAX_CONTINUATION_CHARS:
        return (END,)
    body = nxt.body.rstrip()
    if nxt.origin.launcher_key() != _NO_ORIGIN and nxt.origin.launcher_key() != line.origin.launcher_key():
        return (END,)  # another process's line
    if all_prefix(line):
        return (SPACE,)  # a line of nothing but prefixes is the head of the message below it
    start = _RECORD_START.match(body) if body else None
    if start and _HOST_CHAR.match(line.body[-1:]) and line.width >= TERMINAL_MIN_WIDTH and \
            terminal_width(line.width):
        return (END, AS_IS)  # what looks like a record's start may be the rest of a word the terminal cut
    if not body or start and not (body[0] == "{" and line.body.rstrip().endswith((":", ",", "["))):
        return (END,)  # a record of its own (a "{" opens a JSON record unless a key or a list above awaits it)
    program_break = False  # the program printed the next line itself (its launcher / the store prefixed it again)
    if nxt.store:
        if (nxt.store, nxt.stream) != (line.store, line.stream):
            return (END,)
        program_break = True
    if nxt.origin.launcher_key() != _NO_ORIGIN:
        program_break = True  # under the same launcher prefix again
    if len(body) >= SAME_HEAD_CHARS and body[:SAME_HEAD_CHARS] == line.body[:SAME_HEAD_CHARS]:
        return (END,)  # the same header again: the next record of the same kind
    if complete():
        return (END,)
    if program_break:
        return (END, SPACE)
    if line.width >= TERMINAL_MIN_WIDTH and terminal_width(line.width):
        return (AS_IS,)  # a terminal as wide as this line broke it (before a space, or in a word)
    if line.trailing_blank:
        return (END, SPACE)  # broken at a space, kept at the line's end
    if nxt.indent and nxt.indent >= line.indent:
        # a viewer's soft wrap indents (each piece alike), as does a block the paste indents: at a space, or in a
        # word too long for the viewer, the indentation no part of the text
        return (END, SPACE, DEDENT)
    # either; the likelier first (a reading is preferred over another that matches as far only if it comes first)
    return (END, AS_IS, SPACE) if line.width >= TERMINAL_MIN_WIDTH else (END, SPACE, AS_IS)


class Text(NamedTuple):
    """A reading of some pieces joined: the message's text (prefixes read off the joined line, so that a prefix a
    break cut is read whole), where each piece starts in it, who printed it, and whether the prefixes fill the
    first piece or reach past it (the pieces are then one line for certain)."""

    body: str
    starts: list[int]
    origin: Origin
    prefix_spans_break: bool


def render(pieces: Sequence[NormalLine], first: int, last: int, seps: Sequence[Optional[str]]) -> Text:
    """pieces[first..last] joined by seps[k] between piece k and k + 1: the first from its printed line, the
    others from their bodies; the launcher prefixes and log headers are then read off the joined line."""
    raw = pieces[first].printed
    raw_starts = [0]
    for k in range(first, last):
        nxt = pieces[k + 1]
        # a later piece joins without the prefixes the program put on it again; as is, with its leading blanks
        # (a terminal may break a line just before a space)
        text = nxt.body if nxt.origin.key() != _NO_ORIGIN or nxt.header else nxt.printed
        if seps[k] == SPACE:
            raw = raw.rstrip() + SPACE
            text = text.lstrip()
        elif seps[k] == DEDENT:
            text = text.lstrip()
        raw_starts.append(len(raw))
        raw += text
    if last == first:
        p = pieces[first]
        return Text(p.body, [0], p.origin, False)
    cut, origin, _, nccl_end = prefix_end(raw)
    # the prefixes run to the first break (the first piece is nothing but prefixes) or past it
    spans = max(cut, nccl_end) >= len(raw[:raw_starts[1]].rstrip())
    return Text(raw[cut:], [max(0, s - cut) for s in raw_starts], origin, spans)


Match = Callable[[str], Optional[tuple[int, int]]]


class Message:
    """One message read across consecutive lines: its pieces, the reading chosen at each break, its text."""

    def __init__(self, pieces: Sequence[NormalLine], options: Sequence[tuple[Optional[str], ...]], hit: int,
                 goes_on: Callable[[int], bool] = lambda i: False, unseen_below: bool = False) -> None:
        self.pieces = pieces
        # goes_on(i): a store's record the line of piece i belongs to goes on below it (a runtime split the line)
        self._goes_on = goes_on
        # the log may hold a line right after the last piece that these pieces leave out (not read yet, left out by
        # the reader, or past the lines handed out after the hit): it may go on from the last piece
        self._unseen_below = unseen_below
        self.options = options            # options[k]: the readings of the break after pieces[k]
        self.hit = hit
        self.first = self.last = hit
        self.seps: list[Optional[str]] = [END] * max(0, len(pieces) - 1)
        self.text = render(pieces, hit, hit, self.seps)

    @property
    def body(self) -> str:
        return self.text.body

    @property
    def starts(self) -> list[int]:
        return self.text.starts

    @property
    def origin(self) -> Origin:
        return self.text.origin

    def _forward(self, first: int, seps: list[Optional[str]], span: Optional[tuple[int, int]], text: Text
                 ) -> tuple[int, Optional[tuple[int, int]], Text]:
        """Joins the lines below pieces[first..hit] while a join makes a pattern match, or match on into the next
        line: the last piece joined, the match, the text (``seps`` is updated)."""
        last = self.last
        if span is None:  # the message may need several lines below before a pattern matches at all
            found_first = self._first_match(first, seps)
            if found_first is None:
                return last, None, text
            last, span, text = found_first
        while last + 1 < len(self.pieces) and last - first + 1 < MAX_PIECES:
            k = last
            if not self.pieces[k + 1].printed.strip() and END not in self.options[k]:
                # a store's record with nothing in it that certainly goes on from this line: the line goes on past it
                seps[k] = self.options[k][0]
                last, text = k + 1, render(self.pieces, first, k + 1, seps)
                continue
            best: Optional[tuple[str, Text, tuple[int, int]]] = None
            for sep in self.options[k]:
                if sep is END:
                    continue
                seps[k] = sep
                joined = render(self.pieces, first, k + 1, seps)
                found = self._match(joined.body)
                if found is None or found[1] <= joined.starts[-1] or (span is not None and found[0] != span[0]):
                    continue
                if span is not None and not _clean_end(joined.body, found[1]):
                    continue  # a match that grows only by glueing the next word on is no reading of this message
                if best is None or _better(joined, found, best[1], best[2]):
                    best = (sep, joined, found)
            seps[k] = END
            if best is None:
                break
            seps[k] = best[0]
            last, text, span = k + 1, best[1], best[2]
        return last, span, text

    def _first_match(self, first: int, seps: list[Optional[str]]
                     ) -> Optional[tuple[int, tuple[int, int], Text]]:
        """The fewest lines below that make a pattern match, read the best way (``seps`` is updated): every
        reading of their breaks is tried, nearest lines first."""
        for last in range(self.last + 1, min(len(self.pieces), first + MAX_PIECES)):
            breaks = range(self.last, last)
            best: Optional[tuple[tuple[Optional[str], ...], Text, tuple[int, int]]] = None
            for combo in itertools.product(*(self.options[k] for k in breaks)):
                if END in combo:
                    continue
                trial = list(seps)
                for k, sep in zip(breaks, combo):
                    trial[k] = sep
                joined = render(self.pieces, first, last, trial)
                found = self._match(joined.body)
                if found is not None and found[1] > joined.starts[-1] and \
                        (best is None or _better(joined, found, best[1], best[2])):
                    best = (combo, joined, found)
            if best is not None:
                for k, sep in zip(breaks, best[0]):
                    seps[k] = sep
                return last, best[2], best[1]
            if all(self.options[k] == (END,) for k in breaks[-1:]):
                return None  # the message ends at a break that allows no join
        return None

    def join(self, match: Match) -> Optional[tuple[int, int]]:
        """Joins the pieces around the hit as far as a pattern needs them; the match's span in the message.

        Back to the line above when the hit alone does not match (it is a later piece of a message begun above),
        or when the joined line's match is the hit's own begun above, or prefixes fill the line above (the hit is
        the rest of that line); on to the lines below while a join makes the match reach into them."""
        self._match = match
        hit_span = match(self.body)
        seps = list(self.seps)
        last, span, text = self._forward(self.first, seps, hit_span, self.text)
        choice = (self.first, last, span, text, seps)
        while choice[0] > 0 and self.hit - choice[0] + 1 < MAX_PIECES:
            k = choice[0] - 1
            first, last, span, text, seps = choice
            best = None
            for sep in self.options[k]:
                if sep is END:
                    continue
                back = list(seps)
                back[k] = sep
                joined = render(self.pieces, k, self.hit, back)
                b_last, b_span, b_text = self._forward(k, back, match(joined.body), joined)
                if b_span is None:
                    continue
                if span is not None and not b_span[0] < b_text.starts[first - k]:
                    # a match that does not begin above: the message read without the line above, grown to it (the
                    # same lines below, the same end), the line above holding its prefixes, or lending its
                    # prefixes to a hit without any (origin_unreadable says when that is not certain)
                    if b_last != last or len(b_text.body) - b_span[1] != len(text.body) - span[1] or \
                            not (b_text.prefix_spans_break or
                                 (text.origin.key() == _NO_ORIGIN and b_text.origin.key() != _NO_ORIGIN)):
                        continue
                # the reading whose match begins above the hit first: it reads more of the message
                above = b_span[0] < b_text.starts[first - k]
                if best is None or (above, _better(b_text, b_span, best[3], best[2])) > (best[5], False):
                    best = (k, b_last, b_span, b_text, back, above)
            if best is None:
                break
            choice = best[:5]
        self.first, self.last, span, self.text, self.seps = choice
        return span

    def origin_unreadable(self) -> tuple[str, ...]:
        """The fields of ``origin`` (who printed the message) that differ between the readings of the breaks
        above the hit: a prefix a break cut where the text does not tell how the pieces join, or a prefix the
        line above lends the hit when the hit may be a line of its own (a line of nothing but prefixes lends its
        prefixes for certain)."""
        if self.first == self.hit:
            return ()
        fields = ("rank", "local_rank", "pid", "host", "nccl_device")
        breaks = [k for k in range(self.first, self.hit) if len(self.options[k]) > 1]
        differ: set[str] = set()
        for combo in itertools.islice(itertools.product(*(self.options[k] for k in breaks)), MAX_READINGS):
            seps = list(self.seps)
            for k, sep in zip(breaks, combo):
                seps[k] = sep
            first = max([self.first] + [k + 1 for k in breaks if seps[k] is END])
            other = render(self.pieces, first, self.last, seps).origin
            differ.update(f for f in fields if getattr(other, f) != getattr(self.origin, f))
        return tuple(f for f in fields if f in differ)

    def covers(self, span: tuple[int, int]) -> range:
        """The piece indices a span of the text reaches into."""
        return range(self.first, self.first + max(1, sum(1 for s in self.starts if s < span[1])))

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
            gap = 1 if self.seps[k] == SPACE else 0
            if len(self.options[k]) > 1 and s <= j and e >= j - gap:
                touching.append(k)
        end_edge = self.last + 1 < len(self.pieces) and len(self.options[self.last]) > 1 and \
            e >= len(self.body.rstrip())
        if end_edge:
            touching.append(self.last)
        last_piece = self.pieces[self.last]
        if (last_piece.partial or last_piece.open_string or self._goes_on(self.last) or self._unseen_below) and \
                self.last + 1 == len(self.pieces) and e >= len(self.body.rstrip()):
            return None  # the line may go on (the store says it does), in a line these pieces do not hold
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
            other_text = render(self.pieces, self.first, last, seps)
            start = _moved(m.start(), self.starts, other_text.starts)
            body = other_text.body
            other = m.re.search(body, start) if start <= len(body) else None
            if other is None or other.start() != start or other.group(group) is None:
                continue  # the pattern does not read this message there: not a reading of this number
            os, oe = other.span(group)
            if _whole(body, os, oe):
                try:
                    read = parse(other.group(group))
                except ValueError:
                    continue
                if read not in values:
                    values.append(read)
            if len(values) > 1:
                return None
        return values[0] if len(values) == 1 else None


def _better(text: Text, found: tuple[int, int], best_text: Text, best: tuple[int, int]) -> bool:
    """Whether a match is a better reading than the best so far: one that ends between words first (a join
    glueing a number to the next word is the wrong one), then the one that begins earlier in the first piece (a
    pattern reading the message from its start), then the one that reaches further into the last piece (a reading
    with a space added is not further for it)."""
    return (_clean_end(text.body, found[1]), -found[0], found[1] - text.starts[-1]) > \
        (_clean_end(best_text.body, best[1]), -best[0], best[1] - best_text.starts[-1])


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
