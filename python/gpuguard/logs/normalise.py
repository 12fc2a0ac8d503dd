"""The one normaliser in front of every recogniser: a pasted log line taken back to the message its program printed.

A line reaches a recogniser as the program printed it, whatever carried it: the rules of ``paste_rules.py``
apply from the outside in,

  1. rewrites of the whole line: ANSI codes, colour codes that lost their ESC, HTML entities;
  2. the place it was copied from: quote markers (nested), code fences, line numbers (a viewer's, `cat -n`,
     `nl`), in any order;
  3. the log store: a Docker JSON record, the CRI prefix (its P tag marks a line the runtime split), `kubectl
     logs --timestamps`, syslog;
  4. then, in ``lines.read_prefixes``, launcher prefixes and log headers (ISO 8601 with level and logger, glog,
     Python logging) in whatever order they stack (only when a reader asks for the body or who printed it).

What it removes at steps 2 and 3 is kept as facts the wrapping reader needs (``wrapping.py``): the width of the
line as a terminal showed it (after step 2), its indentation, whether the store marked it partial and which
stream it belongs to, whether a log header opened it. Only the lines the keyword filter passed and their
neighbours are normalised, each once.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property

from .lines import Origin, read_prefixes
from .paste_rules import (
    TRANSPORT_RULES,
    ansi_codes,
    bare_colour_codes,
    code_fence,
    html_entities,
    json_string_rest,
    line_numbers,
    quote_markers,
)

# Outer layers stack a few deep ("> 12 | > text" at most in practice); the loop is bounded whatever the line holds.
MAX_LAYERS = 8


@dataclass
class NormalLine:
    """One input line, normalised (its launcher prefixes and log header read only when asked for)."""

    printed: str            # the program's line: paste, viewer and store removed (launcher prefixes and headers kept)
    width: int = 0          # columns of the line as a terminal showed it (store prefix included, paste removed)
    indent: int = 0         # leading blanks of that line
    trailing_blank: bool = False  # it ended in a blank as pasted (a wrap at a space kept the space)
    fence: bool = False     # a code fence: no text of the log
    partial: bool = False   # the store split a long line: the next record of the same stream continues it exactly
    stream: str = ""        # the store's stream (stdout / stderr; a syslog tag), "" without a store prefix
    store: str = ""         # which store prefix it had ("cri", "docker", "kubectl", "syslog"), "" if none
    ended: bool = False     # the store says the program's line ends here (Docker's log string closed on this line)
    open_string: bool = False  # a Docker record's log string goes on on the next physical line
    rules: tuple[str, ...] = field(default_factory=tuple)  # the rules that applied, outermost first

    @cached_property
    def _prefixes(self) -> tuple[str, Origin, bool]:
        return read_prefixes(self.printed)

    @property
    def body(self) -> str:
        """What recognisers read: ``printed`` without launcher prefixes and log headers."""
        return self._prefixes[0]

    @property
    def origin(self) -> Origin:
        """Who printed it (launcher prefixes, NCCL's WARN prefix)."""
        return self._prefixes[1]

    @property
    def header(self) -> bool:
        """A log header opened it: a record of its own."""
        return self._prefixes[2]

    @property
    def blank(self) -> bool:
        """No text at all (a line of nothing but prefixes is not blank, nor a store's record of blanks: its message
        may be on the next line)."""
        return self.fence or (not self.printed.strip() and not self.store)


def normalise(raw: str, string_goes_on: bool = False) -> NormalLine:
    """``raw`` (one input line, decoded) taken back to what its program printed, with the facts of each layer.
    ``string_goes_on``: the line before was a Docker record whose log string a break cut; this line holds its
    rest (JSON-escaped, then the record's other fields)."""
    rules: list[str] = []
    text = raw.rstrip("\r\n")
    for name, rewrite in (("ansi_codes", ansi_codes), ("bare_colour_codes", bare_colour_codes),
                          ("html_entities", html_entities)):
        new = rewrite(text)
        if new != text:
            rules.append(name)
            text = new
    pos = 0
    for _ in range(MAX_LAYERS):
        if code_fence(text, pos):
            rules.append("code_fence")
            return NormalLine("", fence=True, rules=tuple(rules))
        end = quote_markers(text, pos)
        if end is not None and end > pos:
            rules.append("quote_markers")
            pos = end
            continue
        end = line_numbers(text, pos)
        if end is not None and end > pos:
            rules.append("line_numbers")
            pos = end
            continue
        break
    shown = text[pos:]
    width = len(shown)  # blanks at the end count: a terminal breaks at its width, on a space or not
    indent = len(shown) - len(shown.lstrip(" \t"))
    partial, stream, store, ended, open_string = False, "", "", False, False
    if string_goes_on:
        rules.append("docker_json_rest")
        shown, open_string = json_string_rest(shown)
        ended = not open_string
    for name, rule in TRANSPORT_RULES if not string_goes_on else ():
        found = rule(shown, 0)
        if found is not None:
            rules.append(name)
            store, stream, partial, ended = found.kind, found.stream, found.partial, found.ended
            open_string = found.open_string
            shown = found.replaced if found.replaced is not None else shown[found.end:]
            break
    trailing_blank = shown[-1:] in (" ", "\t")  # of the program's text: a store's separator is none of it
    return NormalLine(shown, width=width, indent=indent, trailing_blank=trailing_blank, partial=partial,
                      stream=stream, store=store, ended=ended, open_string=open_string, rules=tuple(rules))


def joined_records(line: NormalLine, record: NormalLine) -> NormalLine:
    """A line a log store split (``line`` partial) joined with its next ``record``, exactly; the launcher
    prefixes and log headers read again over the whole line, so that one the split cut is read whole."""
    return NormalLine(line.printed + record.printed, width=line.width + len(record.printed), indent=line.indent,
                      trailing_blank=record.trailing_blank if record.printed else line.trailing_blank,
                      partial=record.partial, stream=line.stream,
                      store=line.store, rules=tuple(dict.fromkeys(line.rules + record.rules)))
