"""Every failure explain recognises, one line each; their order is the order of the report and of the help. The
keyword filter's fragments follow from their keywords."""

from __future__ import annotations

import re

from .recogniser import Recogniser
from .recognisers.cuda_oom import CudaOutOfMemory
from .recognisers.device_mismatch import DeviceMismatch
from .recognisers.duplicate_gpu import DuplicateGpu
from .recognisers.flight_recorder import FlightRecorder
from .recognisers.gpuguard_device_mismatch import GpuguardDeviceMismatch
from .recognisers.gpuguard_stall import GpuguardStall
from .recognisers.invalid_device_ordinal import InvalidDeviceOrdinal
from .recognisers.nccl_diagnostics import NcclDiagnostics
from .recognisers.nccl_ras import NcclRas
from .recognisers.nccl_timeout import NcclTimeout
from .recognisers.ray_gpu_count import RayGpuCount
from .recognisers.torchrun_summary import TorchrunSummary
from .recognisers.watchdog_stuck import WatchdogStuck

RECOGNISERS: tuple[Recogniser, ...] = (
    DuplicateGpu(),
    InvalidDeviceOrdinal(),
    DeviceMismatch(),
    GpuguardDeviceMismatch(),
    CudaOutOfMemory(),
    NcclTimeout(),
    RayGpuCount(),
    GpuguardStall(),
    WatchdogStuck(),
    FlightRecorder(),
    NcclRas(),
    NcclDiagnostics(),
    TorchrunSummary(),
)


def _reading_order(recognisers: tuple[Recogniser, ...]) -> tuple[Recogniser, ...]:
    """The order in which recognisers are offered a line (the first that takes it wins): the registry's, except
    that one that ``yields_to`` a kind comes right after the last recogniser of that kind."""
    order = list(recognisers)
    for r in recognisers:
        if r.yields_to:
            after = max(i for i, other in enumerate(order) if set(other.kinds) & set(r.yields_to))
            if after > order.index(r):
                order.remove(r)
                order.insert(after, r)
    return tuple(order)


#: Who reads a line that several recognisers match: the first of these.
READING_ORDER = _reading_order(RECOGNISERS)
#: Every diagnosis kind, in the order of the report.
KINDS: tuple[str, ...] = tuple(k for r in RECOGNISERS for k in r.kinds)
#: A line holding none of these is not parsed at all (the cheap substring test comes first).
KEYWORDS: tuple[str, ...] = tuple(k for r in RECOGNISERS for k in r.keywords)
#: What `gpuguard explain` says it recognises.
HELP = ", ".join(r.help for r in RECOGNISERS)
#: The recogniser that makes each kind.
BY_KIND: dict[str, Recogniser] = {k: r for r in RECOGNISERS for k in r.kinds}


# ---- the keyword filter ----------------------------------------------------------------------------------------
#
# The C++ reader skips through the log by its shortest keyword (Wu-Manber: fewer and longer keywords, longer
# skips), so it searches one FRAGMENT_BYTES piece of each recogniser keyword: its last FRAGMENT_BYTES bytes, which a
# whole keyword holds. A keyword a paste broke across two lines leaves that piece whole on the second line when the
# break is early in it; a later break leaves a head of the keyword at the end of the first line, which the reader's
# line-end test finds (LINE_END_HEADS: as cheap as counting the lines). A web page's or a JSON log's escapes change
# the quotes in a keyword: the filter searches the longest run of it no escape touches, or, where that run is too
# short, each escaped form.
FRAGMENT_BYTES = 11
_ESCAPED = re.compile(r"[\"'<>&\\]")
# The escaped forms of those characters, in the order html.escape, a numeric reference, and JSON (Docker's, Go's
# encoder) write them.
_ESCAPES = {'"': ("&quot;", "&#34;", '\\"'), "'": ("&#x27;", "&#39;", "'"), "<": ("&lt;", "&#60;", "\\u003c"),
            ">": ("&gt;", "&#62;", "\\u003e"), "&": ("&amp;", "&#38;", "\\u0026"), "\\": ("\\", "\\", "\\\\")}


def _searchable(keyword: str) -> list[str]:
    """What the filter searches for ``keyword``: its longest run no escape changes, or every escaped form."""
    run = max(_ESCAPED.split(keyword), key=len)
    if run == keyword or len(run) >= FRAGMENT_BYTES:
        return [run]
    return list(dict.fromkeys([keyword] + ["".join(_ESCAPES[c][i] if c in _ESCAPES else c for c in keyword)
                                           for i in range(3)]))


def _fragments(text: str) -> list[str]:
    return [text[-FRAGMENT_BYTES:]]


def _heads(text: str) -> list[str]:
    """The heads a break leaves at a line's end when the last fragment of ``text`` does not stay whole below it (a
    break at a space drops that space: the rest then needs one byte more to hold the fragment)."""
    heads = (text[:p].rstrip() for p in range(max(1, len(text) - FRAGMENT_BYTES - 1), len(text)))
    return list(dict.fromkeys(h for h in heads if len(h) >= LINE_END_MIN_HEAD))


#: A head shorter than this ends too many ordinary lines (the reader refuses shorter ones).
LINE_END_MIN_HEAD = 4
_searched = [(s, i) for i, r in enumerate(READING_ORDER) for k in r.keywords for s in _searchable(k)]
_filter = {(f.encode(), i): None for s, i in _searched for f in _fragments(s)}
_line_ends = {(h.encode(), i): None for s, i in _searched for h in _heads(s)}
#: What the C++ reader searches (bytes), and the bit each sets: the index in READING_ORDER of the recogniser it
#: belongs to, so that a line is offered only to the recognisers whose keywords (or a piece of one) it holds.
FILTER_KEYWORDS: tuple[bytes, ...] = tuple(f for f, _ in _filter)
FILTER_GROUPS: tuple[int, ...] = tuple(g for _, g in _filter)
#: The heads of short keywords the reader looks for at the end of each line, and their bits.
LINE_END_HEADS: tuple[bytes, ...] = tuple(h for h, _ in _line_ends)
LINE_END_GROUPS: tuple[int, ...] = tuple(g for _, g in _line_ends)
