"""What copying a log adds to each line, one small named rule each, so explain can take the line back to what the program printed.

Four families, applied by ``normalise.py`` from the outside in:

- rewrites of the whole line: colour codes (``ansi_codes``, ``bare_colour_codes``) and a web page's escapes
  (``html_entities``);
- the place the text was copied from (outer layers, at the line's head): quote markers, code fences, the line
  numbers of a viewer, of ``cat -n`` and of ``nl``;
- the log store (transport): Docker's JSON log lines, the CRI prefix of containerd / CRI-O (``kubectl logs`` of a
  pod's file), ``kubectl logs --timestamps``, syslog / journald;
- the logging library of the program (log headers): ISO 8601 timestamps with a level and logger, glog's (and
  c10's) ``I1124 10:00:00.000000 123 file.cc:42]``, Python logging's default ``ERROR:name:``.

Every rule is anchored where it applies and every repetition in it is bounded, so a rule costs time linear in the
head it looks at, never in the line. A rule removes only what its format puts there: when the text does not fit
it exactly, the rule does not apply and the text is left as it is.
"""

from __future__ import annotations

import html
import json
import re
from typing import NamedTuple, Optional

# ---- rewrites of the whole line -------------------------------------------------------------------------------

# ECMA-48 control sequences (CSI: colours, cursor moves), operating-system commands (a terminal's title, links)
# and the two-byte escapes.
_ANSI = re.compile(r"\x1b(?:\[[0-?]{0,32}[ -/]{0,8}[@-~]|\][^\x07\x1b]{0,4096}(?:\x07|\x1b\\)?|[@-Z\\-_])")
# A colour code whose ESC byte a web form or a copy dropped ("[36m(RayTrainWorker pid=1)[0m", as pasted issues
# show Ray's coloured prefixes): only the SGR form, never followed by "]" (a bracketed "[5m]" is text).
_BARE_SGR = re.compile(r"\[(?:\d{1,3};){0,8}\d{1,3}m(?!\])")
# An HTML character reference: named (&quot;), decimal (&#34;) or hexadecimal (&#x22;), with its semicolon.
_ENTITY = re.compile(r"&(?:#\d{1,7}|#[xX][0-9A-Fa-f]{1,6}|[A-Za-z][A-Za-z0-9]{1,31});")


def ansi_codes(text: str) -> str:
    """A terminal's control sequences removed (they are not shown, so they are not part of the text)."""
    return _ANSI.sub("", text) if "\x1b" in text else text


def bare_colour_codes(text: str) -> str:
    """Colour codes whose ESC byte was lost on the way ("[0m") removed."""
    return _BARE_SGR.sub("", text) if "m" in text and "[" in text else text


def html_entities(text: str) -> str:
    """A web page's character references decoded (``&quot;`` -> ``"``, ``&gt;`` -> ``>``, ``&nbsp;`` -> space);
    text with a bare ``&`` is left alone."""
    for _ in range(2):  # a page that escaped the text twice ("&amp;quot;") is read too
        if "&" not in text or not _ENTITY.search(text):
            break
        text = html.unescape(text).replace("\xa0", " ")
    return text


# ---- outer layers: where the text was copied from --------------------------------------------------------------

# Markdown and e-mail quote markers, nested: "> ", ">> ", "> > " (up to three spaces before each, as CommonMark).
_QUOTE = re.compile(r"(?:[ ]{0,3}>[ ]?){1,16}")
# A fenced code block's fence (CommonMark): ``` or ~~~ (three or more), an info string after it ("```text").
_FENCE = re.compile(r"[ ]{0,3}(?:`{3,64}[^`]{0,128}|~{3,64}.{0,128})")
# Line numbers: `cat -n` and `nl` (right-aligned in six columns, then a TAB), a viewer's gutter ("  12 | ",
# "12│", bat's "  12 │ "). A bare "12 " is not one: NCCL RAS prints "  6 ranks have launched ...".
_LINE_NUMBER = re.compile(r"[ ]{0,8}\d{1,9}(?:\t|[ ]{0,2}[|│┃¦][ ]?)")
# `nl`'s unnumbered empty line: its number's columns and the TAB left blank.
_NL_BLANK = re.compile(r"[ ]{6,8}\t?")


def quote_markers(text: str, pos: int = 0) -> Optional[int]:
    """Where the text starts after its quote markers (markdown ``>``, nested), or None without any."""
    m = _QUOTE.match(text, pos)
    return m.end() if m else None


def code_fence(text: str, pos: int = 0) -> bool:
    """Whether the line is a code fence (no text of the log)."""
    m = _FENCE.fullmatch(text.rstrip(), pos)
    return m is not None


def line_numbers(text: str, pos: int = 0) -> Optional[int]:
    """Where the text starts after a viewer's, `cat -n`'s or `nl`'s line number, or None without one."""
    m = _LINE_NUMBER.match(text, pos)
    if m:
        return m.end()
    if _NL_BLANK.fullmatch(text, pos):
        return len(text)
    return None


# ---- transport: the log store ------------------------------------------------------------------------------------

class Transport(NamedTuple):
    """A log store's layer around the program's line: where the line starts under it, what the store says."""

    end: int            # where the program's text starts (in ``text``, or in ``replaced`` when given)
    kind: str           # "docker", "cri", "kubectl", "syslog"
    stream: str         # stdout / stderr (container runtimes), the tag for syslog, "" when not said
    partial: bool       # the store split one long line: the next record of the same stream continues it as is
    replaced: Optional[str] = None  # the program's line decoded from the record (Docker's JSON)
    ended: bool = False  # the program's line ends on this physical line for certain (Docker's log string closed)
    open_string: bool = False  # the record's log string goes on past this physical line (a terminal broke it)


_RFC3339 = r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(?:\.\d{1,9})?(?:Z|[+-]\d\d:?\d\d)"
# CRI logging (kubelet's cri-api, pkg/kubelet/kuberuntime/logs): "<RFC3339Nano> <stream> <tag> <content>", tag F
# (full) or P (partial: the runtime split a line longer than its buffer; the next P/F of the stream continues it).
_CRI = re.compile(_RFC3339 + r" (?P<stream>stdout|stderr) (?P<tag>[FP])(?::[A-Za-z0-9:]{0,64})?(?: |$)")
# `kubectl logs --timestamps` / `docker logs -t`: an RFC3339Nano timestamp and one space before each line.
_KUBECTL = re.compile(_RFC3339 + r" ")
# syslog as journalctl and /var/log/syslog show it (RFC 3164): "Nov 24 10:00:00 host tag[pid]: ".
_SYSLOG = re.compile(r"(?:Jan|Feb|Mar|Apr|May|Jun|Jul|Aug|Sep|Oct|Nov|Dec) [ \d]\d \d\d:\d\d:\d\d "
                     r"[^\s:]{1,255} (?P<tag>[^\s:\[\]]{1,128})(?:\[\d{1,10}\])?: ")
_DOCKER_HEAD = re.compile(r'\{\s{0,8}"log"\s{0,8}:\s{0,8}"')
_JSON_STRING_BODY = re.compile(r'(?:[^"\\]|\\.){0,20000}')
_DOCKER_STREAM = re.compile(r'"stream"\s{0,8}:\s{0,8}"(?P<stream>\w{1,16})"')


def docker_json(text: str, pos: int = 0) -> Optional[Transport]:
    """Docker's json-file log record {"log": "...\\n", "stream": "stderr", "time": "..."}: the line it holds
    (a record whose log has no final newline is a part of a longer line). A record cut short is decoded as far
    as it goes."""
    head = _DOCKER_HEAD.match(text, pos)
    if not head:
        return None
    try:
        record = json.loads(text[pos:])
    except ValueError:
        record = None
    ended = True
    if isinstance(record, dict) and isinstance(record.get("log"), str):
        log, stream = record["log"], record.get("stream") if isinstance(record.get("stream"), str) else ""
    else:  # cut by the reader (or broken by a terminal): decode the string as far as it goes
        body = _JSON_STRING_BODY.match(text, head.end()).group(0)
        ended = text[head.end() + len(body):head.end() + len(body) + 1] == '"'  # the log string closed here
        if body.endswith("\\") and not body.endswith("\\\\"):
            body = body[:-1]
        try:
            log = json.loads('"' + body + '"')
        except ValueError:
            return None
        s = _DOCKER_STREAM.search(text, head.end() + len(body))
        stream = s.group("stream") if s else ""
    partial = ended and not log.endswith("\n")
    return Transport(0, "docker", str(stream), partial, log.rstrip("\r\n"), ended and not partial, not ended)


def json_string_rest(text: str) -> tuple[str, bool]:
    """The rest of a JSON string a line break cut (the next physical line of a Docker record): its text decoded
    up to the closing quote, and whether the string goes on past this line too."""
    body = _JSON_STRING_BODY.match(text).group(0)
    closed = text[len(body):len(body) + 1] == '"'
    if body.endswith("\\") and not body.endswith("\\\\"):
        body = body[:-1]
    try:
        decoded = json.loads('"' + body + '"')
    except ValueError:
        decoded = body
    return decoded.rstrip("\r\n"), not closed


def cri_prefix(text: str, pos: int = 0) -> Optional[Transport]:
    """The CRI prefix "2026-01-05T10:00:00.123456789Z stderr F " of a container's log file."""
    m = _CRI.match(text, pos)
    if not m:
        return None
    return Transport(m.end(), "cri", m.group("stream"), m.group("tag") == "P")


def kubectl_timestamp(text: str, pos: int = 0) -> Optional[Transport]:
    """The RFC3339 timestamp `kubectl logs --timestamps` (and `docker logs -t`) puts before each line."""
    m = _KUBECTL.match(text, pos)
    if not m or log_header(text, pos) is not None and log_header(text, pos) > m.end():
        return None  # a timestamp followed by a level is the program's own log header
    return Transport(m.end(), "kubectl", "", False)


def syslog_prefix(text: str, pos: int = 0) -> Optional[Transport]:
    """syslog / journald's "Nov 24 10:00:00 host tag[pid]: " before each line a program wrote to it."""
    m = _SYSLOG.match(text, pos)
    if not m:
        return None
    return Transport(m.end(), "syslog", m.group("tag"), False)


TRANSPORT_RULES = (("docker_json", docker_json), ("cri_prefix", cri_prefix), ("syslog_prefix", syslog_prefix),
                   ("kubectl_timestamp", kubectl_timestamp))

# ---- log headers: the program's logging library ----------------------------------------------------------------

_LEVEL = r"(?:TRACE|DEBUG|INFO|NOTICE|WARN|WARNING|ERROR|CRITICAL|FATAL|Trace|Debug|Info|Warning|Error|Critical)"
# An ISO 8601 date and time, bracketed or not, with what Python logging, torch.distributed.elastic and Ray put
# after it: "2024-10-09 21:16:03,123 - name - ERROR - ", "[2024-10-09 21:16:03,123] name: [ERROR] ",
# "2025-01-01 10:00:00,123 INFO worker.py:1234 -- ", "[2026-01-05 10:00:00] ", "2026-01-05T10:00:00Z ERROR ".
_ISO_HEADER = re.compile(
    r"\[?\d{4}-\d\d-\d\d[T ]\d\d:\d\d(?::\d\d(?:[.,]\d{1,9})?)?(?:Z|[+-]\d\d:?\d\d| UTC)?\]?"
    r"(?:"
    r"(?: {1,4}-)? {1,4}[\w.<>-]{1,128} {1,4}- {1,4}" + _LEVEL + r" {1,4}- {1,4}"      # asctime - name - LEVEL -
    r"| {1,4}[\w.<>-]{1,128}: \[" + _LEVEL + r"\] {0,4}"                               # name: [LEVEL]
    r"| {1,4}" + _LEVEL + r" {1,4}[\w.-]{1,128}:\d{1,9} {1,4}-- {0,4}"                 # LEVEL file.py:N --
    r"| {1,4}\[" + _LEVEL + r"\]:? {0,4}"                                              # [LEVEL]
    r"|(?: {1,4}-)? {1,4}" + _LEVEL + r"(?: {1,4}-| ?:)? {1,4}"                       # LEVEL, - LEVEL -, LEVEL:
    r"| {1,4}"                                                                          # the timestamp alone
    r")")
# glog, and c10's logging in PyTorch: "I1124 10:00:00.000000 123 file.cc:42] ", "[E1121 05:00:00.123456
# ProcessGroupNCCL.cpp:683] ", "[E1111 17:01:37] ".
_GLOG_HEADER = re.compile(r"\[?[IWEF]\d{4} \d\d:\d\d:\d\d(?:\.\d{1,9})?(?: {1,8}\d{1,10})?(?: [^\s\]:]{1,255}:\d{1,9})?\]"
                          r" {0,4}")
# Python logging's default format (logging.basicConfig): "ERROR:root:", "WARNING:torch.distributed.run:".
_PYTHON_DEFAULT = re.compile(r"(?:DEBUG|INFO|WARNING|ERROR|CRITICAL):[\w.<>-]{0,128}:")


def iso_log_header(text: str, pos: int = 0) -> Optional[int]:
    """Where the message starts after an ISO 8601 timestamp and the level / logger written with it."""
    m = _ISO_HEADER.match(text, pos)
    return m.end() if m else None


def glog_header(text: str, pos: int = 0) -> Optional[int]:
    """Where the message starts after glog's (c10's) "I1124 10:00:00.000000 123 file.cc:42] "."""
    m = _GLOG_HEADER.match(text, pos)
    return m.end() if m else None


def python_logging_default(text: str, pos: int = 0) -> Optional[int]:
    """Where the message starts after Python logging's default "LEVEL:logger:"."""
    m = _PYTHON_DEFAULT.match(text, pos)
    return m.end() if m else None


LOG_HEADER_RULES = (("iso_log_header", iso_log_header), ("glog_header", glog_header),
                    ("python_logging_default", python_logging_default))


def log_header(text: str, pos: int = 0) -> Optional[int]:
    """Where the message starts after any log header at ``pos``, or None without one."""
    for _, rule in LOG_HEADER_RULES:
        end = rule(text, pos)
        if end is not None:
            return end
    return None


def log_header_rule(text: str, pos: int = 0) -> Optional[tuple[str, int]]:
    """The name of the log header at ``pos`` and where the message starts after it."""
    for name, rule in LOG_HEADER_RULES:
        end = rule(text, pos)
        if end is not None:
            return name, end
    return None
