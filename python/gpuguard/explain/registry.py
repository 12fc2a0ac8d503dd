"""Every failure explain recognises, one line each; their order is the order of the report and of the help."""

from __future__ import annotations

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
