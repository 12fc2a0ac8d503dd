"""Reading a log: lines cut at MAX_LINE_CHARS, and the prefixes launchers add (who printed each line) and logging
libraries add (a log header: when, at which level) stripped from the line's head."""

from __future__ import annotations

import io
import re
from dataclasses import dataclass
from typing import IO, Any, Iterator, Optional, Union

from .paste_rules import ansi_codes, log_header

# Lines longer than this (in bytes, as read) are cut; the rest of such a line is skipped without being held in
# memory (by the C++ reader, gpuguard._core.Scanner, for streams; by iter_lines for text).
MAX_LINE_CHARS = 16 * 1024

# Ray driver output of worker lines: "(RayWorker pid=123)" / "(WorkerDict pid=123, ip=10.0.0.5)" / "(pid=123)"
# (ray/_private/worker.py, print_worker_logs).
_RAY_PREFIX = re.compile(r"\((?:(?P<actor>[^\s()]+) )?pid=(?P<pid>\d+)(?:, ip=(?P<ip>[0-9A-Fa-f.:]+))?\)\s*")
# torch.distributed's excepthook and c10 logging: "[rank1]: Traceback", "[rank1]:[E810 ...]"
# (torch/distributed/distributed_c10d.py, excepthook_prefix).
_RANK_PREFIX = re.compile(r"\[rank(?P<rank>\d+)\]:\s*")
# torchrun's per-worker tee prefix "[default0]:" = role name + LOCAL rank
# (torch/distributed/elastic/multiprocessing/tail_log.py); "[3]:" with log_line_prefix_template="[${rank}]:".
_ROLE_PREFIX = re.compile(r"\[(?P<role>[A-Za-z_][A-Za-z_-]*?)(?P<local>\d+)\]:\s*")
_NUMBER_PREFIX = re.compile(r"\[(?P<rank>\d+)\]:\s*")
# NCCL's own WARN line prefix (src/debug.cc): "[timestamp] host:pid:tid [cudaDev] file:line (func) NCCL WARN".
# Every repetition is bounded and the search looks only at the line's head, so a long line costs linear time.
_NCCL_WARN_PREFIX = re.compile(
    r"(?<![^\s\]])(?P<host>[^\s:\[\]]{1,255}):(?P<pid>\d{1,10}):(?P<tid>\d{1,10}) \[(?P<dev>\d{1,4})\] "
    r"[^\s:]{1,255}:\d{1,9}(?: \([^()]{0,255}\))? NCCL WARN")
_NCCL_WARN_HEAD = 640


@dataclass
class Origin:
    """Who printed a line, as far as its prefixes tell."""

    rank: Optional[int] = None          # global rank
    local_rank: Optional[int] = None    # torchrun "[default3]:"
    pid: Optional[int] = None           # Ray "(X pid=...)" or NCCL's host:pid:tid
    host: Optional[str] = None          # NCCL's host, or Ray's ip
    nccl_device: Optional[int] = None   # NCCL's "[cudaDev]": the CUDA ordinal of the rank that warned
    ray: bool = False                   # printed by a Ray worker (its "(Actor pid=...)" prefix)

    def key(self) -> tuple[Any, ...]:
        return (self.rank, self.local_rank, self.pid, self.host)

    def launcher_key(self) -> tuple[Any, ...]:
        """What the launcher's prefix says (not NCCL's WARN prefix, which only a message's first line has)."""
        return (self.rank, self.local_rank, self.pid if self.ray else None, self.host if self.ray else None)

    def describe(self) -> str:
        parts = []
        if self.rank is not None:
            parts.append(f"rank {self.rank}")
        if self.local_rank is not None:
            parts.append(f"local rank {self.local_rank}")
        if self.host:
            parts.append(f"host {self.host}")
        if self.pid is not None:
            parts.append(f"pid {self.pid}")
        return ", ".join(parts)


def strip_prefixes(line: str) -> tuple[str, Origin]:
    """The line's text without ANSI colours, launcher prefixes and log headers, and who printed it."""
    body, origin, _ = read_prefixes(line)
    return body, origin


def read_prefixes(line: str) -> tuple[str, Origin, bool]:
    """The line's text without ANSI colours, launcher prefixes and log headers (in any order: "[rank1]:[E1121
    05:00:00 ...] " as much as "2026-01-05 10:00:00 INFO [rank1]: "), who printed it, and whether a log header
    opened it (the line is then a record of its own, never the rest of the line before)."""
    text = ansi_codes(line).rstrip("\r\n")
    start, origin, header, _ = prefix_end(text)
    return text[start:], origin, header


def prefix_end(text: str) -> tuple[int, Origin, bool, int]:
    """Where the text after the launcher prefixes and log headers starts in ``text`` (no ANSI codes), who printed
    it, whether a log header was among them, and where NCCL's WARN prefix ends in ``text`` (0 without one)."""
    origin = Origin()
    header = False
    pos = 0
    for _ in range(16):  # prefixes stack a few deep; a line of nothing but prefixes ends the loop too
        while pos < len(text) and text[pos] in " \t":
            pos += 1
        first = text[pos:pos + 1]
        if not first or not (first in "[(" or first.isalnum()):
            break  # no prefix starts with anything else
        m = _RAY_PREFIX.match(text, pos) if first == "(" else None
        if m:
            origin.pid = int(m.group("pid"))
            origin.ray = True
            if m.group("ip"):
                origin.host = m.group("ip")
            pos = m.end()
            continue
        if first == "[":
            m = _RANK_PREFIX.match(text, pos) or _NUMBER_PREFIX.match(text, pos)
            if m:
                origin.rank = int(m.group("rank"))
                pos = m.end()
                continue
            m = _ROLE_PREFIX.match(text, pos)
            if m:
                origin.local_rank = int(m.group("local"))
                pos = m.end()
                continue
        end = log_header(text, pos)
        if end is not None and end > pos:
            header = True
            pos = end
            continue
        break
    nccl_end = 0
    head = text[pos:pos + _NCCL_WARN_HEAD]
    m = _NCCL_WARN_PREFIX.search(head) if " NCCL WARN" in head else None  # (the body's start: its lookbehind's)
    if m:
        origin.host = m.group("host")
        origin.pid = int(m.group("pid"))
        origin.nccl_device = int(m.group("dev"))
        nccl_end = pos + m.end()
    return pos, origin, header, nccl_end


def iter_lines(stream: Union[IO[str], IO[bytes]]) -> Iterator[str]:
    """The lines of a text or binary stream, decoded with errors='replace', each cut at MAX_LINE_CHARS.

    Never holds more than one (cut) line: the remainder of an overlong line is read and dropped in bounded
    pieces. '\\r' ends a line too (progress bars), as it does for a terminal.
    """
    if isinstance(stream, io.TextIOBase) and not hasattr(stream, "buffer"):
        text: IO[str] = stream  # type: ignore[assignment]
    else:
        binary = getattr(stream, "buffer", stream)
        text = io.TextIOWrapper(binary, encoding="utf-8", errors="replace", newline=None)  # type: ignore[arg-type]
    while True:
        line = text.readline(MAX_LINE_CHARS)
        if not line:
            return
        if len(line) >= MAX_LINE_CHARS and not line.endswith("\n"):
            while True:
                rest = text.readline(MAX_LINE_CHARS)
                if not rest or rest.endswith("\n"):
                    break
        yield line
