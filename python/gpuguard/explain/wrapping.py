"""Messages a terminal or a log viewer wrapped across lines: when the next line continues this one, and the join.

Two shapes are read. A terminal (or `fold`, or a pasted screen) breaks a long line at its width, mid-word, and the
continuation starts at column 0, with no prefix or with the same launcher prefix repeated; nothing is lost, so the
pieces are joined as they are. A log viewer that soft-wraps indents the continuation instead, breaking at a space;
that piece is joined after one space, as is a piece under the same launcher prefix (the program broke its message
itself, at a space). A line that starts a record of its own (a timestamp, an NCCL
"host:pid:tid [dev]" header, a traceback, another process's prefix) is never a continuation.
"""

from __future__ import annotations

import re
from typing import Optional

from .lines import Origin, strip_prefixes

# A wrapped message is long: a terminal or viewer narrower than this is not in use.
MIN_WRAPPED_CHARS = 40
# A next line opening with the same this many characters as the line is another record like it.
SAME_HEAD_CHARS = 12
# A continuation is joined to at most this many characters: a "continuation" longer than a screen line is a new line.
MAX_CONTINUATION_CHARS = 4096

# What starts a record of its own (each alternative anchored and bounded).
_RECORD_START = re.compile(
    r"(?:\[?\d{4}-\d\d-\d\d[ T]\d"            # ISO timestamps: logging, NCCL_DEBUG_TIMESTAMP_FORMAT
    r"|\[?[IWEF]\d{4} \d\d:\d\d"               # glog / c10 logging: "I1121 05:00:00", "[E1121 05:00:00"
    r"|[^\s:\[\]]{1,255}:\d{1,10}(?::\d{1,10})? (?:\[\d{1,4}\]|NCCL )"  # NCCL: "host:pid:tid [dev]", "host:pid NCCL DIAG"
    r"|Traceback \(|File \"|During handling|The above exception"
    r"|[A-Za-z_][\w.]{0,200}(?:Error|Exception|Warning|Interrupt)\b"
    r"|\[[A-Za-z_]{0,32}\d{1,6}\]:|\(\w{0,64} ?pid=\d"  # another launcher prefix left in the body
    r"|NCCL (?:INFO|WARN)|\{)")


class Continuation:
    """How `nxt` continues `line`: joined as is (terminal wrap) or after one space (indented soft wrap)."""

    def __init__(self, separator: str, text: str) -> None:
        self.separator = separator
        self.text = text


def continuation(line: str, line_origin: Origin, nxt_raw: str) -> Optional[Continuation]:
    """The continuation of ``line`` (a body without prefixes) in the raw next line, or None if it starts anew."""
    if len(line) < MIN_WRAPPED_CHARS:
        return None
    body, origin = strip_prefixes(nxt_raw)
    prefixed = origin.key() != (None, None, None, None)
    if prefixed and origin.key() != line_origin.key():
        return None  # another process's line
    body = body.rstrip()
    if not body or len(body) > MAX_CONTINUATION_CHARS or _RECORD_START.match(body):
        return None
    if len(body) >= SAME_HEAD_CHARS and body[:SAME_HEAD_CHARS] == line[:SAME_HEAD_CHARS]:
        return None  # the same header again: the next record of the same kind

    # a terminal's wrap keeps every character and repeats no prefix; an indented piece, or one under the same
    # prefix again (the program broke its message itself), was broken at a space
    indented = nxt_raw[:1] in (" ", "\t")
    return Continuation(" " if indented or prefixed else "", body)


def join(line: str, cont: Continuation) -> str:
    if cont.separator:
        return line.rstrip() + cont.separator + cont.text
    return line + cont.text
