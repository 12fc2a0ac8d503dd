"""Decodes NCCL, PyTorch and Ray failure text (one message or a whole multi-rank log) into plain diagnoses.

Every pattern below is written from the text the real library prints; the comment beside each names the
source it comes from. The input is untrusted and may be huge: it is read line by line, each line is cut at
MAX_LINE_CHARS, only lines holding a known keyword are parsed, and everything kept per diagnosis (ranks,
devices, evidence lines) is capped, so memory stays bounded whatever the size or content of the log.
Text that matches nothing known yields no diagnosis: gpuguard says it does not recognise it, never guesses.
"""

from __future__ import annotations

import io
import os
import re
import socket
from collections import deque
from dataclasses import dataclass, field
from typing import IO, Any, Iterable, Iterator, NamedTuple, Optional, Sequence, Union

# Lines longer than this are cut; the rest of such a line is skipped without being held in memory.
MAX_LINE_CHARS = 16 * 1024
# What one diagnosis keeps, however many times its failure repeats in the log.
MAX_EVIDENCE = 6
MAX_RANKS = 4096
MAX_DEVICES = 256
# Lines kept for context (the traceback lines that precede an error), all sources together.
CONTEXT_LINES = 64

KINDS = (
    "duplicate_gpu",
    "invalid_device_ordinal",
    "device_mismatch",
    "nccl_first_collective_hang",
    "nccl_timeout",
    "ray_gpu_count",
)


class Evidence(NamedTuple):
    """One input line that supports a diagnosis: its 1-based line number and its text (cut at 300 chars)."""

    line: int
    text: str


@dataclass(frozen=True)
class Diagnosis:
    """One failure recognised in the text: what it is, who and what it involves, why, and how to fix it."""

    kind: str
    summary: str
    ranks: tuple[int, ...]
    devices: tuple[str, ...]
    cause: str
    fix: str
    evidence: tuple[Evidence, ...]
    occurrences: int = 1

    def as_dict(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "summary": self.summary,
            "ranks": list(self.ranks),
            "devices": list(self.devices),
            "cause": self.cause,
            "fix": self.fix,
            "evidence": [{"line": e.line, "text": e.text} for e in self.evidence],
            "occurrences": self.occurrences,
        }


# ---- PCI bus ids as NCCL prints them -------------------------------------------------------------------

def nccl_device_to_pci_bus_id(number: str) -> Optional[str]:
    """The PCI bus id behind the device number in NCCL's "Duplicate GPU detected" message.

    NCCL's busIdToInt64 (src/misc/utils.cc) drops ':' and '.' from the bus id string and reads the rest as
    hex; the message prints that integer with %lx. int64ToBusId, in the same file, inverts it with
    "%04lx:%02lx:%02lx.%01lx" of (id >> 20, (id & 0xff000) >> 12, (id & 0xff0) >> 4, id & 0xf), which is
    what this does: "10000" -> "0000:10:00.0", "50" -> "0000:00:05.0". None when it is not such a number.
    """
    text = number.strip().lower()
    if text.startswith("0x"):
        text = text[2:]
    if not text or len(text) > 16 or any(c not in "0123456789abcdef" for c in text):
        return None
    value = int(text, 16)
    return f"{value >> 20:04x}:{(value & 0xFF000) >> 12:02x}:{(value & 0xFF0) >> 4:02x}.{value & 0xF:01x}"


# ---- line prefixes added by launchers -------------------------------------------------------------------

_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
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
_NCCL_WARN_PREFIX = re.compile(
    r"(?P<host>[^\s:\[\]]+):(?P<pid>\d+):(?P<tid>\d+) \[(?P<dev>\d+)\] \S+:\d+(?: \([^)]*\))? NCCL WARN")


@dataclass
class _Origin:
    """Who printed a line, as far as its prefixes tell."""

    rank: Optional[int] = None          # global rank
    local_rank: Optional[int] = None    # torchrun "[default3]:"
    pid: Optional[int] = None           # Ray "(X pid=...)" or NCCL's host:pid:tid
    host: Optional[str] = None          # NCCL's host, or Ray's ip
    nccl_device: Optional[int] = None   # NCCL's "[cudaDev]": the CUDA ordinal of the rank that warned

    def key(self) -> tuple[Any, ...]:
        return (self.rank, self.local_rank, self.pid, self.host)

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


def _strip_prefixes(line: str) -> tuple[str, _Origin]:
    text = _ANSI.sub("", line).rstrip("\r\n")
    origin = _Origin()
    pos = 0
    while True:
        while pos < len(text) and text[pos] in " \t":
            pos += 1
        m = _RAY_PREFIX.match(text, pos)
        if m:
            origin.pid = int(m.group("pid"))
            if m.group("ip"):
                origin.host = m.group("ip")
            pos = m.end()
            continue
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
        break
    body = text[pos:]
    m = _NCCL_WARN_PREFIX.search(body)
    if m:
        origin.host = m.group("host")
        origin.pid = int(m.group("pid"))
        origin.nccl_device = int(m.group("dev"))
    return body, origin


def _clip(text: str, limit: int = 300) -> str:
    text = text.rstrip("\r\n")
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _ranks_phrase(ranks: Iterable[int]) -> str:
    ordered = sorted(set(ranks))
    return ("rank " if len(ordered) == 1 else "ranks ") + _ranks_text(ordered)


def _ranks_text(ranks: Iterable[int], limit: int = 16) -> str:
    ordered = sorted(set(ranks))
    shown = ", ".join(str(r) for r in ordered[:limit])
    return shown + (f" and {len(ordered) - limit} more" if len(ordered) > limit else "")


# ---- the patterns, each from its source -----------------------------------------------------------------

# NCCL <= 2.29, src/init.cc (initTransportsRank):
#   WARN("Duplicate GPU detected : rank %d and rank %d both on CUDA device %lx", rank, i, busId)
# (older releases printed the bus id with %x).
_DUPLICATE = re.compile(
    r"Duplicate GPU detected : rank (?P<a>\d+) and rank (?P<b>\d+) both on CUDA device (?P<dev>[0-9A-Fa-f]+)")
# NCCL >= 2.30, src/init.cc (initTransportsRank):
#   WARN("Multiple Ranks are using the same GPU/Partition. Set NCCL_MULTI_RANK_GPU_ENABLE=1 to enable this "
#        "configuration.")
_MULTI_RANK = re.compile(r"Multiple Ranks are using the same GPU/Partition")
# CUDA's error string for cudaErrorInvalidDevice / CUDA_ERROR_INVALID_DEVICE, as torch prints it through
# c10/cuda/CUDAException.h: "CUDA error: invalid device ordinal", followed since torch 2.6 by
# c10/cuda/CUDAMiscFunctions.cpp's hint "GPU device may be out of range, do you have enough GPUs?".
_INVALID_ORDINAL = re.compile(r"(?:(?P<api>CUDA|HIP) error: )?invalid device ordinal")
# ATen, aten/src/ATen/core/op_registration/adaption.cpp (common_device_check_failure), up to torch 2.5:
#   "Expected all tensors to be on the same device, but found at least two devices, cuda:3 and cuda:1!
#    (when checking argument for argument mat1 in method wrapper_CUDA_addmm)"
# TensorIterator and many kernels print the first sentence alone. Since torch 2.6 adaption.cpp prints:
#   "Expected all tensors to be on the same device, but got mat1 is on cuda:0, different from other tensors
#    on cpu (when checking argument in method wrapper_CUDA_addmm)"
_MISMATCH_TWO = re.compile(
    r"Expected all tensors to be on the same (?:common )?device, but found at least two devices, "
    r"(?P<a>[\w:]+) and (?P<b>[\w:]+)!"
    r"(?: \(when checking ar(?:gu|ug)ment for argument (?P<arg>\w+) in method (?P<method>[\w.]+)\))?")
_MISMATCH_GOT = re.compile(
    r"Expected all tensors to be on the same device, but got (?P<arg>\w+) is on (?P<a>[\w:]+), "
    r"different from other tensors on (?P<b>[\w:]+)(?: \(when checking argument in method (?P<method>[\w.]+)\))?")
# torch/csrc/distributed/c10d/ProcessGroupNCCL.cpp, WorkNCCL::checkTimeout and operator<<(WorkNCCL):
#   logPrefix() + "Watchdog caught collective operation timeout: " + "WorkNCCL(SeqNum=1, OpType=ALLREDUCE,
#   NumelIn=1, NumelOut=1, Timeout(ms)=600000)" + " ran for 600017 milliseconds before timing out."
# logPrefix() is "[Rank 3] ", "[PG 0 Rank 3] " or "[PG ID 0 PG GUID 0(default_pg) Rank 3] " by version;
# releases before 2.2 print "WorkNCCL(SeqNum=1, OpType=..., TensorShape=[...], Timeout(ms)=...)".
_WATCHDOG = re.compile(
    r"(?:Rank (?P<rank>\d+)\] )?Watchdog caught collective operation timeout: WorkNCCL\("
    r"(?:SeqNum=(?P<seq>\d+), )?OpType=(?P<op>\w+)(?P<rest>(?:[^()]|\(ms\))*)\)"
    r"(?: ran for (?P<ran>\d+) milliseconds before timing out)?")
_TIMEOUT_MS = re.compile(r"Timeout\(ms\)=(?P<ms>\d+)")
# Same file, watchdog loop: logPrefix() + "Timeout at NCCL work: 1, last enqueued NCCL work: 1, last completed
# NCCL work: -1."
_TIMEOUT_AT = re.compile(
    r"(?:Rank (?P<rank>\d+)\] )?Timeout at NCCL work: (?P<seq>\d+), last enqueued NCCL work: (?P<enq>-?\d+), "
    r"last completed NCCL work: (?P<done>-?\d+)")
# Ray, python/ray/_private/resource_and_label_spec.py (_resolve_accelerator_resources):
#   f"Attempting to start raylet with {num_accelerators} {accelerator_resource_name}, "
#   f"but {env_var} contains {visible_accelerator_ids}."
# Ray before 2.10 (ray/_private/services.py / parameter.py): "Attempting to start raylet with {} GPUs, but
# CUDA_VISIBLE_DEVICES contains {}."
_RAY_GPUS = re.compile(
    r"Attempting to start raylet with (?P<n>[\d.]+) (?P<res>\w+?)s?, but (?P<env>\w+) contains (?P<ids>\[[^\]]*\])")

# A line is parsed only if it holds one of these (cheap substring tests come first).
_KEYWORDS = (
    "Duplicate GPU detected",
    "Multiple Ranks are using the same GPU",
    "invalid device ordinal",
    "to be on the same",
    "Watchdog caught collective operation timeout",
    "Timeout at NCCL work",
    "Attempting to start raylet",
)
_CONTEXT_HINTS = re.compile(r"set_device\(|\.to\(|\.cuda\(|device\s*=|cuda:\d+|LOCAL_RANK|local_rank|\brank\b")


@dataclass
class _Group:
    """What accumulates for one diagnosis while the log streams by; every collection is capped."""

    occurrences: int = 0
    ranks: set[int] = field(default_factory=set)
    devices: dict[str, None] = field(default_factory=dict)  # insertion-ordered set
    evidence: list[Evidence] = field(default_factory=list)
    facts: dict[str, Any] = field(default_factory=dict)

    def add(self, lineno: int, text: str, ranks: Iterable[Optional[int]] = (), devices: Iterable[str] = ()) -> None:
        self.occurrences += 1
        for r in ranks:
            if r is not None and len(self.ranks) < MAX_RANKS:
                self.ranks.add(r)
        for d in devices:
            if len(self.devices) < MAX_DEVICES:
                self.devices.setdefault(d, None)
        self.evidence_line(lineno, text)

    def source(self, origin: "_Origin") -> None:
        """Remembers who printed a line when no rank says it (a Ray worker's pid and ip)."""
        if origin.rank is None and origin.local_rank is None and (origin.pid is not None or origin.host):
            sources = self.facts.setdefault("sources", {})
            if len(sources) < 16:
                sources.setdefault(origin.describe(), None)

    def who(self) -> str:
        """' on ranks 1, 2' / ' in pid 123, host 10.0.0.5' / '' when the lines do not say."""
        if self.ranks:
            return " on " + _ranks_phrase(self.ranks)
        if self.facts.get("local_ranks"):
            return " on local " + _ranks_phrase(self.facts["local_ranks"])
        if self.facts.get("sources"):
            return " in " + "; ".join(self.facts["sources"])
        return ""

    def sorted_evidence(self) -> tuple[Evidence, ...]:
        return tuple(sorted(self.evidence))

    def evidence_line(self, lineno: int, text: str) -> None:
        clipped = _clip(text)
        if len(self.evidence) < MAX_EVIDENCE and all(e.text != clipped for e in self.evidence):
            self.evidence.append(Evidence(lineno, clipped))


class _UnionFind:
    def __init__(self) -> None:
        self.parent: dict[int, int] = {}

    def find(self, x: int) -> int:
        self.parent.setdefault(x, x)
        while self.parent[x] != x:
            self.parent[x] = self.parent[self.parent[x]]
            x = self.parent[x]
        return x

    def union(self, a: int, b: int) -> None:
        ra, rb = self.find(a), self.find(b)
        if ra != rb:
            self.parent[max(ra, rb)] = min(ra, rb)


class LogExplainer:
    """Streaming explainer: feed() lines in order, then diagnoses(). Memory does not grow with the input."""

    def __init__(self, *, match_local: bool = True, local_devices: Optional[Sequence[Any]] = None,
                 local_host: Optional[str] = None) -> None:
        self.lines = 0
        self._match_local = match_local
        self._local_devices = list(local_devices) if local_devices is not None else None
        self._local_host = local_host
        self._context: deque[tuple[int, str]] = deque(maxlen=CONTEXT_LINES)
        self._groups: dict[str, _Group] = {}
        # duplicate GPUs: (host, pci bus id) -> ranks; pairs as NCCL printed them
        self._dup_ranks: dict[tuple[str, str], _UnionFind] = {}
        self._dup_numbers: dict[tuple[str, str], str] = {}

    # -- input ------------------------------------------------------------------------------------------

    def feed(self, line: str) -> None:
        self.lines += 1
        if len(line) > MAX_LINE_CHARS:
            line = line[:MAX_LINE_CHARS]
        for keyword in _KEYWORDS:
            if keyword in line:
                self._parse(line)
                break
        self._context.append((self.lines, line))

    def feed_stream(self, stream: Union[IO[str], IO[bytes]]) -> None:
        for line in iter_lines(stream):
            self.feed(line)

    # -- parsing ----------------------------------------------------------------------------------------

    def _group(self, key: str) -> _Group:
        group = self._groups.get(key)
        if group is None:
            group = self._groups[key] = _Group()
        return group

    def _parse(self, raw: str) -> None:
        body, origin = _strip_prefixes(raw)
        lineno = self.lines

        m = _DUPLICATE.search(body)
        if m:
            a, b, number = int(m.group("a")), int(m.group("b")), m.group("dev")
            bus = nccl_device_to_pci_bus_id(number) or f"NCCL device {number}"
            key = (origin.host or "", bus)
            if key not in self._dup_ranks and len(self._dup_ranks) >= MAX_DEVICES:
                return
            uf = self._dup_ranks.setdefault(key, _UnionFind())
            if len(uf.parent) < MAX_RANKS:
                uf.union(a, b)
            self._dup_numbers[key] = number
            self._group("duplicate_gpu").add(lineno, body, ranks=(a, b, origin.rank))
            return
        if _MULTI_RANK.search(body):
            group = self._group("duplicate_gpu")
            group.facts["multi_rank_message"] = True
            devices = [f"cuda:{origin.nccl_device} in the process of {origin.describe() or 'a rank'}"] \
                if origin.nccl_device is not None else []
            group.add(lineno, body, ranks=(origin.rank,), devices=devices)
            if origin.host:
                group.facts.setdefault("hosts", set()).add(origin.host)
            return
        m = _MISMATCH_TWO.search(body) or _MISMATCH_GOT.search(body)
        if m:
            group = self._group("device_mismatch")
            group.add(lineno, body, ranks=(origin.rank,), devices=(m.group("a"), m.group("b")))
            group.source(origin)
            pairs = group.facts.setdefault("pairs", {})
            pair = (m.group("a"), m.group("b"))
            if pair in pairs or len(pairs) < MAX_DEVICES:
                pairs.setdefault(pair, set())
                arg, method = m.groupdict().get("arg"), m.groupdict().get("method")
                if arg or method:
                    if len(pairs[pair]) < 8:
                        pairs[pair].add((arg, method))
            return
        m = _INVALID_ORDINAL.search(body)
        if m:
            group = self._group("invalid_device_ordinal")
            group.add(lineno, body, ranks=(origin.rank,))
            group.source(origin)
            if origin.local_rank is not None and len(group.facts.setdefault("local_ranks", set())) < MAX_RANKS:
                group.facts["local_ranks"].add(origin.local_rank)
            for ctx_line, ctx_text in reversed(self._context):
                if _CONTEXT_HINTS.search(ctx_text) and "invalid device ordinal" not in ctx_text:
                    ctx_body, ctx_origin = _strip_prefixes(ctx_text)
                    if ctx_origin.key() == origin.key():
                        group.evidence_line(ctx_line, ctx_body.strip())
                        break
            return
        m = _WATCHDOG.search(body)
        if m:
            seq = int(m.group("seq")) if m.group("seq") else None
            rank = origin.rank if origin.rank is not None else (int(m.group("rank")) if m.group("rank") else None)
            first = seq is not None and seq <= 1
            group = self._group("nccl_first_collective_hang" if first else "nccl_timeout")
            group.add(lineno, body, ranks=(rank,))
            ops = group.facts.setdefault("ops", {})
            op_key = (seq, m.group("op"))
            if op_key in ops or len(ops) < 64:
                ops.setdefault(op_key, set())
                if rank is not None and len(ops[op_key]) < MAX_RANKS:
                    ops[op_key].add(rank)
            t = _TIMEOUT_MS.search(m.group("rest") or "")
            if t:
                group.facts["timeout_ms"] = int(t.group("ms"))
            return
        m = _TIMEOUT_AT.search(body)
        if m:
            rank = origin.rank if origin.rank is not None else (int(m.group("rank")) if m.group("rank") else None)
            seq, done = int(m.group("seq")), int(m.group("done"))
            first = seq <= 1 or done < 0
            group = self._group("nccl_first_collective_hang" if first else "nccl_timeout")
            group.add(lineno, body, ranks=(rank,))
            if done < 0:
                group.facts["none_completed"] = True
            return
        m = _RAY_GPUS.search(body)
        if m:
            group = self._group("ray_gpu_count")
            ids = re.findall(r"'([^']*)'", m.group("ids"))
            group.add(lineno, body, devices=[f"{m.group('env')} entry {i!r}" for i in ids])
            group.facts.update(requested=m.group("n"), resource=m.group("res"), env=m.group("env"), ids=ids)
            return

    # -- output -----------------------------------------------------------------------------------------

    def diagnoses(self) -> list[Diagnosis]:
        out: list[Diagnosis] = []
        builders = {
            "duplicate_gpu": self._duplicate,
            "invalid_device_ordinal": self._invalid_ordinal,
            "device_mismatch": self._mismatch,
            "nccl_first_collective_hang": self._first_collective_hang,
            "nccl_timeout": self._timeout,
            "ray_gpu_count": self._ray,
        }
        for kind in KINDS:
            group = self._groups.get(kind)
            if group is not None:
                out.append(builders[kind](group))
        return out

    def _local(self) -> Optional[list[Any]]:
        if not self._match_local:
            return None
        if self._local_devices is None:
            try:
                from .devices import devices

                self._local_devices = devices()
            except Exception:  # a broken driver must not stop the explanation
                self._local_devices = []
        return self._local_devices

    def _this_host(self) -> str:
        if self._local_host is None:
            self._local_host = socket.gethostname().split(".")[0]
        return self._local_host

    def _duplicate(self, group: _Group) -> Diagnosis:
        devices: list[str] = []
        sharing: list[str] = []
        all_sets: list[list[int]] = []
        for (host, bus), uf in self._dup_ranks.items():
            sets: dict[int, list[int]] = {}
            for r in uf.parent:
                sets.setdefault(uf.find(r), []).append(r)
            where = self._where(host, bus)
            number = self._dup_numbers[(host, bus)]
            label = f"{bus} (NCCL's 'CUDA device {number}')" if not bus.startswith("NCCL") else bus
            devices.append(label + (f" {where}" if where else ""))
            for ranks in sets.values():
                all_sets.append(sorted(ranks))
                sharing.append(f"ranks {_ranks_text(ranks)} share {bus}" + (f" on host {host}" if host else ""))
        multi = group.facts.get("multi_rank_message", False)
        for d in group.devices:
            devices.append(d)
        if sharing:
            summary = "Two or more ranks of one NCCL communicator are on the same GPU: " + "; ".join(sharing) + "."
        else:
            who = f" (reported by {_ranks_phrase(group.ranks)})" if group.ranks else ""
            summary = ("Two or more ranks of one NCCL communicator are on the same GPU or MIG partition" + who +
                       ". NCCL 2.30 and later do not say which ranks or which GPU.")
        cause = self._duplicate_cause(all_sets)
        fix = ("Give every rank its own GPU: call torch.cuda.set_device(local_rank) (LOCAL_RANK from the launcher) "
               "before init_process_group, or use gpuguard.init_process_group(), which binds each rank to its GPU "
               "and stops every rank with one report naming all ranks per device before NCCL starts. Start no more "
               "processes per node than it has GPUs; in Ray give each NCCL actor num_gpus=1 (with verl, "
               "max_colocate_count=1).")
        if multi:
            fix += (" Set NCCL_MULTI_RANK_GPU_ENABLE=1 only if sharing is intended (several ranks on purpose on one "
                    "GPU or one MIG instance); it does not fix a placement mistake.")
        return Diagnosis("duplicate_gpu", summary, tuple(sorted(group.ranks)), tuple(devices), cause, fix,
                         group.sorted_evidence(), group.occurrences)

    @staticmethod
    def _duplicate_cause(sets: list[list[int]]) -> str:
        base = ("NCCL found two ranks on one host whose GPUs have the same PCI bus id, so they share one GPU. ")
        if sets and len(sets) == 1 and len(sets[0]) > 2:
            return base + ("Every rank named is on the same GPU: most often torch.cuda.set_device was not called "
                           "(every rank stays on cuda:0), or every rank was given the same CUDA_VISIBLE_DEVICES.")
        strides = {b - a for s in sets for a, b in zip(s, s[1:])}
        if sets and len(strides) == 1 and next(iter(strides)) > 1:
            g = next(iter(strides))
            return base + (f"The ranks sharing a GPU differ by {g}: the pattern of device = rank % {g}, i.e. more "
                           f"processes per node than its {g} GPU(s) (nproc_per_node larger than the GPU count).")
        return base + ("Common causes: a missing torch.cuda.set_device(local_rank); more processes per node than "
                       "GPUs; Ray actors given fractional GPUs (num_gpus < 1, verl max_colocate_count > 1); the same "
                       "CUDA_VISIBLE_DEVICES for every rank.")

    def _where(self, host: str, bus: str) -> str:
        """Where a bus id is on this machine, if the log was written here; '' when that cannot be told."""
        if not self._match_local or bus.startswith("NCCL"):
            return ""
        if host and host != self._this_host():
            return f"on host {host} (not this host, {self._this_host()}: not matched to a local GPU)"
        local = self._local()
        if not local:
            return ""
        match = next((d for d in local if str(getattr(d, "pci_bus_id", "")).lower() == bus), None)
        if match is None:
            if host:
                return "(no GPU visible on this host has this bus id)"
            return "(no GPU visible here has this bus id: the log is from another host, or it is hidden here)"
        if host:  # NCCL's prefix names this very host
            return f"= GPU {match.index} on this host ({match.uuid})"
        return f"= GPU {match.index} here ({match.uuid}), if the job ran on this host"

    def _invalid_ordinal(self, group: _Group) -> Diagnosis:
        ranks = sorted(group.ranks)
        local = sorted(group.facts.get("local_ranks", ()))
        who = group.who()
        summary = (f"CUDA rejected a device index{who}: the process asked for a GPU number that is not among the "
                   "GPUs it can see.")
        cause = ("A device index counts only the GPUs visible to the process (CUDA_VISIBLE_DEVICES narrows and "
                 "renumbers them from 0). The usual mistake is passing the GLOBAL rank where the LOCAL rank "
                 "belongs: torch.cuda.set_device(rank) works on the first node and fails on the second, where "
                 "ranks start at the GPU count. Also: more processes per node than GPUs, or a process (a Ray "
                 "actor, a job with CUDA_VISIBLE_DEVICES set per rank) that sees one GPU but asks for cuda:N.")
        if ranks and ranks[0] > 0 and not local:
            cause += (f" The lowest failing rank is {ranks[0]}; if ranks below it are on the first node, that node "
                      f"has {ranks[0]} GPU(s) and the failing ranks used their global rank as a device index.")
        fix = ("Select the device with the LOCAL rank: torch.cuda.set_device(int(os.environ['LOCAL_RANK'])) "
               "(SLURM_LOCALID under srun, OMPI_COMM_WORLD_LOCAL_RANK under mpirun), or cuda:0 in a process that "
               "sees one GPU. gpuguard.bind() resolves the local rank from whichever launcher started the process "
               "and refuses an impossible mapping, saying how many GPUs the host shows.")
        return Diagnosis("invalid_device_ordinal", summary, tuple(ranks), (), cause, fix, group.sorted_evidence(),
                         group.occurrences)

    def _mismatch(self, group: _Group) -> Diagnosis:
        pairs: dict[tuple[str, str], set[tuple[Optional[str], Optional[str]]]] = group.facts.get("pairs", {})
        parts = []
        for (a, b), where in pairs.items():
            detail = ""
            args = sorted({w[0] for w in where if w[0]})
            methods = sorted({w[1] for w in where if w[1]})
            if args:
                detail += f" (argument {', '.join(args)}"
                detail += f" of {', '.join(methods)})" if methods else ")"
            elif methods:
                detail += f" (in {', '.join(methods)})"
            parts.append(f"{a} and {b}{detail}")
        ranks = sorted(group.ranks)
        who = group.who()
        summary = f"An operation{who} got tensors on different devices: " + "; ".join(parts) + "."
        involves_cpu = any("cpu" in (a, b) for a, b in pairs)
        cause = ("PyTorch runs an operation on one device; here its inputs were on two. Typical causes: a model "
                 "spread over several GPUs (device_map='auto', a framework placing layers on every visible GPU) "
                 "fed inputs moved by hand to a fixed cuda:N; DataParallel's output_device differing from the "
                 "target's device; tensors created inside forward without device=.")
        if involves_cpu:
            cause += " One side is the CPU: a buffer or tensor kept as a plain attribute is not moved by .to(device)."
        fix = ("gpuguard.assert_same_device(model, *inputs) names every parameter, buffer and input on each device; "
               "gpuguard.guard(model, deep=True) names the first layer whose inputs disagree with its weights. Move "
               "the inputs to the device of the layer that receives them (next(model.parameters()).device for a "
               "one-device model), and register tensors as buffers so that .to() moves them.")
        return Diagnosis("device_mismatch", summary, tuple(ranks), tuple(group.devices), cause, fix,
                         group.sorted_evidence(), group.occurrences)

    @staticmethod
    def _ops_text(group: _Group) -> str:
        ops: dict[tuple[Optional[int], str], set[int]] = group.facts.get("ops", {})
        parts = []
        for (seq, op), ranks in sorted(ops.items(), key=lambda kv: (kv[0][0] or 0, kv[0][1])):
            s = f"{op}" + (f" #{seq}" if seq is not None else "")
            if ranks:
                s += " on " + _ranks_phrase(ranks)
            parts.append(s)
        return "; ".join(parts)

    def _first_collective_hang(self, group: _Group) -> Diagnosis:
        ranks = sorted(group.ranks)
        ops = self._ops_text(group)
        timeout = group.facts.get("timeout_ms")
        summary = ("NCCL's first collective never completed" + (f" ({ops})" if ops else "") +
                   (f" within the {timeout / 1000:g} s timeout" if timeout else "") + ": the ranks formed the "
                   "communicator but no data moved between them.")
        cause = ("A hang on the very first collective usually means a transport between GPUs or nodes is broken, "
                 "not the program: most often GPU peer-to-peer (P2P) on PCIe systems with ACS or the IOMMU "
                 "enabled, where the driver reports peer access but peer writes never arrive; otherwise the "
                 "network between nodes (wrong interface, firewall). It can also be a rank that never reached "
                 "the collective; ranks missing from this list are the ones to look at if the log covers all.")
        fix = ("On the node, run `gpuguard doctor --p2p --nccl`: it copies between every pair of GPUs and verifies "
               "the bytes, then runs an all-reduce under a deadline and again with NCCL_P2P_DISABLE=1, and says "
               "whether that setting is the cure. To test by hand, rerun with NCCL_P2P_DISABLE=1 (and "
               "NCCL_DEBUG=INFO): if it then works, P2P is broken on this machine; the lasting fix is disabling "
               "ACS / setting the IOMMU to passthrough, and NCCL_P2P_DISABLE=1 is a workaround that costs "
               "intra-node bandwidth.")
        return Diagnosis("nccl_first_collective_hang", summary, tuple(ranks), (), cause, fix, group.sorted_evidence(),
                         group.occurrences)

    def _timeout(self, group: _Group) -> Diagnosis:
        ranks = sorted(group.ranks)
        ops = self._ops_text(group)
        timeout = group.facts.get("timeout_ms")
        summary = ("NCCL collectives timed out" + (f": {ops}" if ops else "") +
                   (f" (timeout {timeout / 1000:g} s)" if timeout else "") + ".")
        cause = ("Earlier collectives completed, so the transport works. A later timeout means the ranks stopped "
                 "calling the same collectives in the same order: one rank is stuck or slow elsewhere (data "
                 "loading, a checkpoint, an exception it swallowed), took a different branch, or died. Ranks that "
                 "did not time out on the same operation are the ones to look at.")
        fix = ("Compare what each rank was doing: TORCH_NCCL_TRACE_BUFFER_SIZE=2000 with TORCH_NCCL_DUMP_ON_TIMEOUT=1 "
               "records the last collectives of every rank (the flight recorder); py-spy dump --pid on a hung rank "
               "shows where it waits. Raise the timeout (init_process_group(timeout=...)) only for operations that "
               "are known to be slow.")
        return Diagnosis("nccl_timeout", summary, tuple(ranks), (), cause, fix, group.sorted_evidence(),
                         group.occurrences)

    def _ray(self, group: _Group) -> Diagnosis:
        f = group.facts
        ids = f.get("ids", [])
        summary = (f"Ray refused to start: asked for {f.get('requested')} {f.get('resource')}, but {f.get('env')} "
                   f"lets this process see {len(ids)} ({', '.join(ids) or 'none'}).")
        cause = (f"Ray counts only the GPUs {f.get('env')} exposes. A num_gpus given to ray.init() or `ray start "
                 f"--num-gpus` (or RAY_OVERRIDE_RESOURCES) larger than that count is refused. It also happens when "
                 f"code already inside a Ray worker, whose {f.get('env')} Ray narrowed, starts a new local Ray "
                 f"instead of connecting to the running cluster.")
        fix = (f"Ask for at most {len(ids)} GPU(s), or widen/unset {f.get('env')} before starting Ray; inside an "
               f"existing cluster connect with ray.init(address='auto') instead of starting a new one.")
        return Diagnosis("ray_gpu_count", summary, (), tuple(group.devices), cause, fix, group.sorted_evidence(),
                         group.occurrences)


# ---- reading --------------------------------------------------------------------------------------------

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


def explain(text: Union[str, bytes], *, match_local: bool = True) -> list[Diagnosis]:
    """Diagnoses for every known failure in `text` (one message or a whole log); [] when none is recognised.

    Recognises NCCL's duplicate-GPU errors (both generations), CUDA's "invalid device ordinal", PyTorch's
    "Expected all tensors to be on the same device", NCCL watchdog timeouts (and hangs on the first
    collective), and Ray's "Attempting to start raylet with N GPU". With ``match_local`` (default), PCI bus
    ids from NCCL are matched to this host's GPUs through gpuguard.devices(), which initialises the CUDA
    driver if nothing has yet; pass False to keep this process's CUDA untouched.
    """
    explainer = LogExplainer(match_local=match_local)
    if isinstance(text, (bytes, bytearray)):
        explainer.feed_stream(io.BytesIO(bytes(text)))
    else:
        explainer.feed_stream(io.StringIO(text))
    return explainer.diagnoses()


def explain_file(path: Union[str, "os.PathLike[str]"], *, match_local: bool = True) -> list[Diagnosis]:
    """explain() over a file, streamed: a log of any size is read in bounded memory."""
    explainer = LogExplainer(match_local=match_local)
    with open(path, "rb") as f:
        explainer.feed_stream(f)
    return explainer.diagnoses()


def format_diagnoses(found: Sequence[Diagnosis], lines_read: int) -> str:
    """The text the CLI prints: one block per diagnosis, or a plain statement that nothing was recognised."""
    if not found:
        return (f"gpuguard recognised no failure it knows in this text ({lines_read} line(s) read).\n"
                "It explains: NCCL duplicate-GPU errors, CUDA 'invalid device ordinal', PyTorch 'Expected all "
                "tensors to be on the same device', NCCL watchdog timeouts and first-collective hangs, Ray "
                "'Attempting to start raylet with N GPU'. It does not guess at anything else.\n")
    out = []
    for i, d in enumerate(found, 1):
        times = f" (seen {d.occurrences} times)" if d.occurrences > 1 else ""
        out.append(f"{i}. [{d.kind}] {d.summary}{times}")
        if d.ranks:
            out.append(f"   ranks:    {_ranks_text(d.ranks, limit=32)}")
        for j, dev in enumerate(d.devices):
            out.append(f"   {'devices:' if j == 0 else '':<9} {dev}")
        out.append(f"   cause:    {d.cause}")
        out.append(f"   fix:      {d.fix}")
        for j, e in enumerate(d.evidence):
            out.append(f"   {'evidence:' if j == 0 else '':<9} line {e.line}: {e.text}")
        out.append("")
    return "\n".join(out)
