# Type stubs for gpuguard._core, the private torch-free compiled core (csrc/python/core/). Public API: the gpuguard
# package.
import datetime
from typing import Any, ClassVar, Optional, Sequence, Union

# Records (csrc/python/core/records.cc, bind_records): each takes its fields positionally in this order or by
# keyword, and has __repr__, __eq__, pickling and as_dict() (plain data for JSON, nested records as dicts).
# Fields marked "derived" are read-only and not constructor arguments.

class ErrorInfo:
    _fields: ClassVar[tuple[str, ...]]
    library: str
    call: str
    code_name: str
    code: int
    detail: str
    where: str
    @property
    def message(self) -> str: ...  # derived
    def __init__(self, *args: Any, **fields: Any) -> None: ...
    def as_dict(self) -> dict[str, Any]: ...

class Device:
    _fields: ClassVar[tuple[str, ...]]
    index: int
    name: str
    uuid: str
    pci_bus_id: str
    total_memory: int
    compute_capability: tuple[int, int]
    multiprocessors: int
    @property
    def total_memory_gib(self) -> float: ...
    def __init__(self, *args: Any, **fields: Any) -> None: ...
    def as_dict(self) -> dict[str, Any]: ...

class CudaStatus:
    _fields: ClassVar[tuple[str, ...]]
    library_loaded: bool
    initialized: bool
    library: str
    driver_version: int
    device_count: int
    visible_devices_at_init: Optional[str]
    reason: str
    @property
    def driver_version_string(self) -> str: ...
    def __init__(self, *args: Any, **fields: Any) -> None: ...
    def as_dict(self) -> dict[str, Any]: ...

class GpuProcess:
    _fields: ClassVar[tuple[str, ...]]
    pid: int
    used_memory: int
    def __init__(self, *args: Any, **fields: Any) -> None: ...
    def as_dict(self) -> dict[str, Any]: ...

class GpuUsage:
    _fields: ClassVar[tuple[str, ...]]
    uuid: str
    total_memory: int
    used_memory: int
    free_memory: int
    reserved_memory: int
    processes: list[GpuProcess]
    def __init__(self, *args: Any, **fields: Any) -> None: ...
    def as_dict(self) -> dict[str, Any]: ...

class NvmlStatus:
    _fields: ClassVar[tuple[str, ...]]
    library_loaded: bool
    initialized: bool
    library: str
    driver_version: str
    reason: str
    def __init__(self, *args: Any, **fields: Any) -> None: ...
    def as_dict(self) -> dict[str, Any]: ...

class VisibleEntry:
    _fields: ClassVar[tuple[str, ...]]
    kind: str
    text: str
    index: Optional[int]
    uuid: Optional[str]
    def __init__(self, *args: Any, **fields: Any) -> None: ...
    def as_dict(self) -> dict[str, Any]: ...

class VisibilityProblem:
    _fields: ClassVar[tuple[str, ...]]
    kind: str
    position: int
    entry: str
    same_as: Optional[int]
    reason: str
    def __init__(self, *args: Any, **fields: Any) -> None: ...
    def as_dict(self) -> dict[str, Any]: ...

class VisibleDevices:
    _fields: ClassVar[tuple[str, ...]]
    set: bool
    raw: Optional[str]
    entries: list[VisibleEntry]
    problem: Optional[VisibilityProblem]
    hides_all_on_purpose: bool
    def __init__(self, *args: Any, **fields: Any) -> None: ...
    def describe(self) -> str: ...
    def as_dict(self) -> dict[str, Any]: ...

class IdentityRecord:
    _fields: ClassVar[tuple[str, ...]]
    rank: int
    world_size: int
    group: str
    local_rank: int
    local_world_size: int
    host_hash: int
    hostname: str
    gpu_uuid: str
    pci_bus_id: str
    gpu_index: int
    pid: int
    cuda_visible_devices: Optional[str]
    visible_device_count: int
    launcher: str
    multi_rank_gpu_enabled: bool
    failure_kind: Optional[str]
    failure_text: str
    gpu_fraction: Optional[float]
    ray_gpu_ids: str
    def __init__(self, *args: Any, **fields: Any) -> None: ...
    def encode(self) -> bytes: ...
    @staticmethod
    def decode(data: bytes) -> IdentityRecord: ...
    def as_dict(self) -> dict[str, Any]: ...

class SharedDevice:
    _fields: ClassVar[tuple[str, ...]]
    group: str
    gpu_uuid: str
    pci_bus_id: str
    total_ranks: int
    records: list[IdentityRecord]
    causes: list[str]
    warning_only: bool
    @property
    def ranks(self) -> list[int]: ...  # derived
    @property
    def hosts(self) -> list[str]: ...  # derived
    def __init__(self, *args: Any, **fields: Any) -> None: ...
    def as_dict(self) -> dict[str, Any]: ...

class PlacementReport:
    _fields: ClassVar[tuple[str, ...]]
    severity: str  # "ok" | "warning" | "error"
    message: str
    shared_devices_total: int
    ranks_sharing_total: int
    causes: list[str]
    shared: list[SharedDevice]
    def __init__(self, *args: Any, **fields: Any) -> None: ...
    def as_dict(self) -> dict[str, Any]: ...

class NcclStatus:
    _fields: ClassVar[tuple[str, ...]]
    loaded: bool
    already_in_process: bool
    library: str
    found_by: str
    version: int
    version_string: str
    reason: str
    def __init__(self, *args: Any, **fields: Any) -> None: ...
    def as_dict(self) -> dict[str, Any]: ...

class NcclProbeOutcome:
    _fields: ClassVar[tuple[str, ...]]
    verdict: str  # "ok" | "failed" | "timed out"
    @property
    def ok(self) -> bool: ...  # derived
    stage: str
    error: Optional[ErrorInfo]
    last_error: str
    aborted: bool
    elapsed_s: float
    init_s: float
    all_reduce_result: list[float]
    nccl_version: int
    library: str
    def __init__(self, *args: Any, **fields: Any) -> None: ...
    def as_dict(self) -> dict[str, Any]: ...

class DriverInitRecord:
    _fields: ClassVar[tuple[str, ...]]
    attempted: bool
    succeeded: bool
    visible_devices_at_init: Optional[str]
    initialized_before_gpuguard: bool
    def __init__(self, *args: Any, **fields: Any) -> None: ...
    def as_dict(self) -> dict[str, Any]: ...

class HostFingerprint:
    _fields: ClassVar[tuple[str, ...]]
    hostname: str
    hashed: str
    hash: int
    from_nccl_hostid: bool
    def __init__(self, *args: Any, **fields: Any) -> None: ...
    def as_dict(self) -> dict[str, Any]: ...

class PeerCopyResult:
    _fields: ClassVar[tuple[str, ...]]
    src: int
    dst: int
    bytes: int
    peer_access_reported: bool
    peer_access_enabled: bool
    verified: bool
    mismatched_bytes: int
    first_mismatch: Optional[int]
    destination_unchanged: bool
    copy_milliseconds: float
    def __init__(self, *args: Any, **fields: Any) -> None: ...
    def as_dict(self) -> dict[str, Any]: ...

def cuda_status() -> CudaStatus: ...
def enumerate_devices() -> tuple[list[Device], Optional[ErrorInfo]]: ...
def driver_initialized() -> bool: ...
def active_primary_contexts() -> list[int]: ...
def nvml_status() -> NvmlStatus: ...
def gpu_usage(uuid: str, pci_bus_id: str = "") -> tuple[Optional[GpuUsage], Optional[ErrorInfo]]: ...
def can_access_peer(a: int, b: int) -> bool: ...

# NCCL (issue: duplicate-device detection, verify_nccl)
def nccl_status() -> NcclStatus: ...
def nccl_prefer(path: str, origin: str) -> bool: ...
def nccl_unique_id() -> bytes: ...
def nccl_probe(nranks: int, rank: int, unique_id: bytes, device: int, timeout_s: float,
               all_reduce: bool = False) -> NcclProbeOutcome: ...

# diagnostics (gpuguard doctor --p2p)
def peer_copy_probe(src: int, dst: int, bytes: int) -> tuple[Optional[PeerCopyResult], Optional[ErrorInfo]]: ...

# identity records and placement (issue: duplicate-device detection)
def host_fingerprint() -> HostFingerprint: ...
def analyze_placement(records: list[bytes], device_rank_totals: dict[str, int] = ...,
                      host_rank_totals: dict[int, int] = ..., shared_devices_total: int = -1,
                      ranks_sharing_total: int = -1) -> PlacementReport: ...
# binding each process to its GPU (issue: bind)
def parse_visible_devices(raw: Optional[str]) -> VisibleDevices: ...
def find_rejected_entry(raw: Optional[str], visible_uuids: list[str]) -> Optional[VisibilityProblem]: ...
def driver_init_record() -> DriverInitRecord: ...

# the job's TCPStore without torch (gpuguard check under torchrun)
class TcpStore:
    def __init__(self, host: str, port: int, timeout_s: float, prefix: str = "") -> None: ...
    def set(self, key: str, value: bytes) -> None: ...
    def get(self, key: str) -> bytes: ...
    def add(self, key: str, amount: int) -> int: ...
    def check(self, keys: list[str]) -> bool: ...
    def wait(self, keys: list[str], timeout: datetime.timedelta) -> None: ...
    def compare_set(self, key: str, expected: bytes, desired: bytes) -> bytes: ...
    @property
    def timeout(self) -> datetime.timedelta: ...
    def set_timeout(self, timeout: datetime.timedelta) -> None: ...

# the collective watchdog (gpuguard.watch)
class SiteRequest:
    id: int
    source: str
    group: str
    seq: int

class Watchdog:
    def __init__(self, *, store_host: str, store_port: int, prefix: str, rank: int, world_size: int, host: str,
                 pid: int, gpu: str, stall_after_s: float, min_stall_s: float, tick_s: float, gather_s: float,
                 report_path: str, exit_on_stall: bool, exit_code: int, flight_recorder: object = None,
                 recorder_sources: list[str] = ..., source_note: str = "", calls_note: str = "",
                 site_wait_s: float = 5.0, node_relay_path: str = "", node_leader: bool = False) -> None: ...
    def describe_group(self, name: str, desc: str, ranks: list[int]) -> None: ...
    def add_group(self, name: str, desc: str, ranks: list[int], label: str = "") -> int: ...
    def enter(self, group: int, op: str, sizes: str, site: str) -> int: ...
    def exit(self, group: int) -> None: ...
    def complete(self, group: int, seq: int) -> None: ...
    def exit_on_stream(self, group: int, seq: int, stream: int) -> None: ...
    def next_site_request(self) -> Optional[SiteRequest]: ...
    def answer_site(self, id: int, site: str) -> None: ...
    def stop(self) -> None: ...
    @property
    def stall_threshold_s(self) -> float: ...
    @property
    def store_ops(self) -> int: ...
    @property
    def ticks(self) -> int: ...
    @property
    def reports(self) -> int: ...
    @property
    def relayed_ticks(self) -> int: ...
    @property
    def unrelayed_ticks(self) -> int: ...
    @property
    def relay_max_age_s(self) -> float: ...
    @property
    def last_report_json(self) -> str: ...

def dump_python_stacks() -> str: ...
def exports_stack_dumper() -> bool: ...
def dump_stacks_by_signal(signum: int, fd: int) -> None: ...
def remove_abandoned_relays(directory: str, name_prefix: str, idle_s: float) -> int: ...
def read_flight_recorder(flight_recorder: object, source: str, include_collectives: bool = False) -> str: ...

# explain's log reader (csrc/python/core/scanner.cc, over gpuguard/log_scan.h)
MIN_KEYWORD_BYTES: int

class Scanner:
    """Splits a byte stream into lines (cut at max_line_bytes) and hands out the lines holding a keyword or ending
    with one of line_end_heads (a keyword's head, its rest on the next line), the lines_after lines after each and
    the up to context_lines lines before each (cut at context_line_bytes), once each; a hit carries the groups of
    what it holds (bit groups[i] for keyword i, default bit i; bit line_end_groups[i] for head i)."""

    def __init__(self, keywords: Sequence[bytes], max_line_bytes: int = 16384, context_lines: int = 64,
                 context_line_bytes: int = 1024, groups: Optional[Sequence[int]] = None,
                 lines_after: int = 1, line_end_heads: Optional[Sequence[bytes]] = None,
                 line_end_groups: Optional[Sequence[int]] = None) -> None: ...
    def feed(self, data: Union[bytes, bytearray, memoryview]) -> list[tuple[int, bool, bytes, int]]: ...
    def finish(self) -> list[tuple[int, bool, bytes, int]]: ...
    @property
    def lines(self) -> int: ...
    @property
    def hits(self) -> int: ...
