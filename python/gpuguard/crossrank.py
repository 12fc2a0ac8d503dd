"""The cross-rank placement check: every rank publishes who-is-where, and every rank gets the same verdict.

``bind()`` calls :func:`check_across_ranks` after resolving this process's GPU. The ranks meet in a key-value
store (the :class:`~gpuguard.rendezvous.Store` protocol, c10d semantics), found in this order:

1. an explicit ``store=``;
2. a job of one process needs none (nothing to compare);
3. the default process group's store, after ``torch.distributed.init_process_group``;
4. the torchrun agent store before it (``TORCHELASTIC_USE_AGENT_STORE=True``, ``MASTER_ADDR``/``MASTER_PORT``;
   joined as a ``TCPStore`` client, ``is_master=False``, under ``/gpuguard/attempt_<restart>``);
5. inside Ray, a named rendezvous actor per group (:func:`_ray_store`);
6. anything else is an error that says how to give the ranks a place to meet.

``gpuguard.init_process_group`` under env:// without torchrun (srun, mpirun, plain variables) first creates the
TCPStore env:// would (:func:`env_store_for_init`), so that this check runs through it before torch starts.

Key layout. Every key lives under one namespace per check,
``gpuguard/v1/<group>/<run id>/<restart>/<call>``: the run id (``TORCHELASTIC_RUN_ID``, or the SLURM job and
step) and torchelastic's restart count keep elastic restarts apart, and ``<call>`` (how many checks this
process has made for this group) keeps repeated ``bind()`` calls apart. Under it (``N`` = world size):

==================================  =========================================================================
``rec/<rank>``                      the rank's identity record (compact binary, ~150 bytes): its arrival mark
``dev/<gpu uuid>/owner``            the record of the first rank on that GPU (``compare_set`` from empty:
                                    whoever wins owns it; a rank that loses learns at once that it shares)
``dev/<gpu uuid>/n``, ``/<i>``      counter and records of the further ranks on that GPU (only if shared)
``shared/n``, ``shared/<i>``        counter and list of the GPUs that got a second rank
``shared_ranks``                    counter: ranks on shared GPUs (for the report's totals)
``host/<host hash>/n``              counter: ranks of the group on that host (NCCL's host hash)
``arrived``                         counter: ranks that finished publishing
``verdict``                         the outcome every rank reads, written once (``compare_set`` from empty):
                                    by the last arriver, by a rank whose own resolution failed, or by the
                                    first rank to reach the deadline (naming the ranks that never came)
``timeout``                         counter electing that one timeout reporter
``nccl/...``                        the same pattern for ``verify_nccl=True``: ``id`` (rank 0's unique id),
                                    ``failed/n`` + ``failed/<i>``, ``done``, ``verdict``
==================================  =========================================================================

Cost per rank, independent of N: a rank on a GPU of its own makes 6 store operations: set ``rec``,
compare_set ``owner``, add ``host``, add ``arrived``, then wait + get ``verdict``. A rank that finds its GPU
taken adds 3 (add ``dev/n``, set its slot, add ``shared_ranks``), and the second one on a GPU 2 more
(``shared/n``, ``shared/<i>``). The last arriver writes the verdict instead of waiting for it, after reading
at most 16 shared GPUs × 16 records plus their counters, so even a job in which every rank shares is
bounded. Bytes stored per rank: its record twice (``rec`` and ``owner`` or its slot, ~150 bytes each) plus
shared counters. On a timeout, the one reporting rank finds the missing ranks with one ``check`` per 256
ranks plus one per rank of the blocks with a gap.
Nothing is all-to-all: no rank ever reads every record. A failed rank's record is published like any other
and its failure becomes the verdict at once (``compare_set``), so every rank waiting on ``verdict`` wakes
immediately, naming it.

Waiting is one ``store.wait([verdict], remaining)``: every outcome, including a peer's failure, is written to
that one key, so a single blocking wait sees it the moment it is published (short polling slices would add
store operations and, with c10d's TCPStore, a log line per expired slice).
"""

from __future__ import annotations

import datetime
import itertools
import json
import logging
import os
import threading
import time
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any, Optional

from . import errors
from ._native import _C
from .errors import DuplicateDeviceError, GpuGuardError, RendezvousTimeoutError
from .rendezvous import Store

if TYPE_CHECKING:
    from .binding import Binding
    from .launchers import LaunchContext

log = logging.getLogger("gpuguard")

#: Format of everything under the namespace; bumped if the layout changes, so mixed versions never mix keys.
PROTOCOL = "v1"
#: Bound on a verdict a rank will parse (it is written by a peer, so it is untrusted input too).
MAX_VERDICT_BYTES = 256 * 1024
#: The composer reads at most this many shared GPUs, and this many records per GPU (the report's bounds).
MAX_REPORTED_DEVICES = 16
MAX_REPORTED_RANKS_PER_DEVICE = 16
#: After its own deadline a rank waits this much longer for the timeout reporter's verdict.
TIMEOUT_GRACE_S = 5.0


@dataclass
class RankIdentity:
    """One rank's identity record (the fields of ``gpuguard::IdentityRecord``)."""

    rank: int
    world_size: int
    group: str = "default"
    local_rank: int = -1
    local_world_size: int = -1
    host_hash: int = 0
    hostname: str = ""
    gpu_uuid: str = ""
    pci_bus_id: str = ""
    gpu_index: int = -1
    pid: int = 0
    cuda_visible_devices: Optional[str] = None
    visible_device_count: int = -1
    launcher: str = ""
    multi_rank_gpu_enabled: bool = False
    failure_kind: Optional[str] = None
    failure_text: str = ""
    gpu_fraction: Optional[float] = None
    ray_gpu_ids: str = ""

    def encode(self) -> bytes:
        try:
            return _C.encode_identity(asdict(self))
        except ValueError as exc:
            raise GpuGuardError(f"gpuguard could not describe rank {self.rank} for the cross-rank check: {exc}",
                                rank=self.rank) from exc

    @classmethod
    def decode(cls, data: bytes) -> "RankIdentity":
        return cls(**_C.decode_identity(data))


@dataclass
class Verdict:
    """What every rank of one check learns: ``kind`` is ok | warning | duplicate | failure | timeout | error."""

    kind: str
    message: str = ""
    details: dict[str, Any] = field(default_factory=dict)

    def encode(self) -> bytes:
        data = json.dumps({"v": 1, "kind": self.kind, "message": self.message, "details": self.details},
                          sort_keys=True).encode()
        if len(data) > MAX_VERDICT_BYTES:  # never happens with bounded reports; keep the promise anyway
            data = json.dumps({"v": 1, "kind": self.kind, "message": self.message[:MAX_VERDICT_BYTES // 2],
                               "details": {}}).encode()
        return data

    @classmethod
    def decode(cls, data: bytes, key: str) -> "Verdict":
        def bad(why: str) -> GpuGuardError:
            return GpuGuardError(f"the placement verdict at store key {key!r} is malformed ({why}); another "
                                 f"program, or a different gpuguard version, wrote it", key=key)
        if len(data) > MAX_VERDICT_BYTES:
            raise bad(f"{len(data)} bytes")
        try:
            doc = json.loads(data.decode("utf-8"))
        except (UnicodeDecodeError, ValueError) as exc:
            raise bad(str(exc)) from None
        kinds = {"ok", "warning", "duplicate", "failure", "timeout", "error"}
        if (not isinstance(doc, dict) or doc.get("v") != 1 or doc.get("kind") not in kinds
                or not isinstance(doc.get("message"), str) or not isinstance(doc.get("details"), dict)):
            raise bad("unexpected structure")
        return cls(doc["kind"], doc["message"], doc["details"])


# ---- finding the store ------------------------------------------------------------------------------------

def _ray_store(group: str) -> Optional[Store]:
    """The Ray rendezvous actor's store for ``group`` when this process is a Ray actor; None elsewhere.

    The actor (``gpuguard:<job id>:<group>`` in namespace ``gpuguard``, see ray_rendezvous.py) is created here
    by the group's first rank unless ``ray_placement`` made it already; Ray itself is never imported here.
    """
    from .ray_rendezvous import RayStore, in_ray_worker

    if not in_ray_worker():
        return None
    return RayStore(group)


def _agent_store(timeout: float) -> Optional[Store]:
    """The torchrun agent's TCPStore, joined as a client, when torchrun says workers may use it."""
    if os.environ.get("TORCHELASTIC_USE_AGENT_STORE", "").lower() != "true":
        return None
    host, port = os.environ.get("MASTER_ADDR"), os.environ.get("MASTER_PORT")
    if not host or not port:
        raise GpuGuardError(
            "TORCHELASTIC_USE_AGENT_STORE=True but MASTER_ADDR/MASTER_PORT are not both set, so gpuguard cannot "
            "reach torchrun's store; launch with torchrun unchanged, or pass store=", variable="MASTER_PORT")
    try:
        port_number = int(port)
    except ValueError:
        raise GpuGuardError(f"MASTER_PORT={port!r} is not a port number", variable="MASTER_PORT") from None
    import torch.distributed as dist

    try:
        tcp = dist.TCPStore(host, port_number, is_master=False, timeout=datetime.timedelta(seconds=timeout),
                            wait_for_workers=False)
    except Exception as exc:  # noqa: BLE001 - c10d raises several types; say which store and why
        raise GpuGuardError(f"could not connect to torchrun's agent store at {host}:{port_number}: {exc}",
                            host=host, port=port_number) from exc
    attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
    return dist.PrefixStore(f"/gpuguard/attempt_{attempt}", tcp)  # type: ignore[no-any-return]


def _default_group_store() -> Optional[Store]:
    try:
        import torch.distributed as dist
    except ImportError:  # pragma: no cover - torch without distributed
        return None
    if not (dist.is_available() and dist.is_initialized()):
        return None
    from torch.distributed import distributed_c10d

    return distributed_c10d._get_default_store()  # type: ignore[no-any-return]


def env_store_for_init(rank: int, world_size: int, timeout: float) -> Optional[Store]:
    """For ``gpuguard.init_process_group`` under env:// without torchrun (srun, mpirun, plain variables): the
    TCPStore torch's env:// rendezvous would create (rank 0 serves it on MASTER_ADDR:MASTER_PORT), created
    here so that bind() can meet the other ranks through it first; it is then handed to torch as ``store=``.
    None where there is nothing to create: one process, torchrun's agent store, or no MASTER_ADDR/MASTER_PORT.
    """
    if world_size <= 1 or os.environ.get("TORCHELASTIC_USE_AGENT_STORE", "").lower() == "true":
        return None
    host, port = os.environ.get("MASTER_ADDR"), os.environ.get("MASTER_PORT")
    if not host or not port:
        return None
    try:
        port_number = int(port)
    except ValueError:
        raise GpuGuardError(f"MASTER_PORT={port!r} is not a port number", variable="MASTER_PORT") from None
    import torch.distributed as dist

    try:
        return dist.TCPStore(host, port_number, world_size, is_master=rank == 0,  # type: ignore[no-any-return]
                             timeout=datetime.timedelta(seconds=timeout), wait_for_workers=False,
                             multi_tenant=True)
    except Exception as exc:  # noqa: BLE001 - c10d raises several types; say which store and why
        raise GpuGuardError(f"could not {'serve' if rank == 0 else 'reach'} the rendezvous store at "
                            f"{host}:{port_number} (MASTER_ADDR/MASTER_PORT): {exc}", host=host,
                            port=port_number) from exc


def find_store(store: Optional[Store], *, group: str, world_size: int, timeout: float) -> Optional[Store]:
    """The store the ranks of ``group`` meet in, in the documented order; None for a single process."""
    if store is not None:
        missing = [m for m in ("set", "get", "add", "check", "wait", "compare_set") if not hasattr(store, m)]
        if missing:
            raise TypeError(f"store= must implement gpuguard.rendezvous.Store (c10d semantics); "
                            f"{type(store).__name__} lacks {', '.join(missing)}")
        return store
    if world_size <= 1:
        return None
    found = _default_group_store() or _agent_store(timeout) or _ray_store(group)
    if found is not None:
        return found
    raise GpuGuardError(
        f"gpuguard.bind() found {world_size} ranks but no place where they can meet to compare GPUs. Call it "
        f"after torch.distributed.init_process_group(), launch with torchrun (its agent store is used), run "
        f"inside Ray, or pass store= (any torch.distributed.Store, e.g. a TCPStore every rank can reach).",
        world_size=world_size)


# ---- namespaces -------------------------------------------------------------------------------------------

_calls: dict[str, itertools.count] = {}
_calls_lock = threading.Lock()


def _key_part(text: str) -> str:
    """Escapes '/' and '%' so that a group name cannot reach into another group's keys."""
    return text.replace("%", "%25").replace("/", "%2F")


def run_namespace(group: str) -> str:
    """The namespace of this process's next check for ``group`` (see the module docstring)."""
    run_id = os.environ.get("TORCHELASTIC_RUN_ID") or (
        f"slurm-{os.environ['SLURM_JOB_ID']}.{os.environ.get('SLURM_STEP_ID', '0')}"
        if os.environ.get("SLURM_JOB_ID") else "")
    restart = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
    with _calls_lock:
        call = next(_calls.setdefault(group, itertools.count()))
    return f"gpuguard/{PROTOCOL}/{_key_part(group)}/{_key_part(run_id)}/{_key_part(restart)}/{call}"


# ---- the exchange -----------------------------------------------------------------------------------------

def _store_op(what: str, key: str, fn: Any, *args: Any) -> Any:
    """The one checking helper for store calls: failures name the operation and the key."""
    try:
        return fn(*args)
    except GpuGuardError:
        raise
    except Exception as exc:  # noqa: BLE001 - any store (c10d, Ray) may raise anything
        raise GpuGuardError(f"store.{what}({key!r}) failed during gpuguard's cross-rank check: "
                            f"{type(exc).__name__}: {exc}", store_operation=what, key=key) from exc


def _wait_for(store: Store, key: str, seconds: float) -> bool:
    """True when ``key`` exists within ``seconds``; False on timeout. Other store failures raise."""
    if seconds <= 0:
        return bool(store.check([key]))
    started = time.monotonic()
    try:
        store.wait([key], datetime.timedelta(seconds=seconds))
        return True
    except Exception as exc:  # noqa: BLE001 - the protocol does not fix the timeout exception's type
        if time.monotonic() - started >= seconds * 0.9 or "timeout" in str(exc).lower():
            return store.check([key])
        raise GpuGuardError(f"store.wait({key!r}) failed during gpuguard's cross-rank check: "
                            f"{type(exc).__name__}: {exc}", store_operation="wait", key=key) from exc


def _publish(store: Store, key: str, verdict: Verdict) -> Verdict:
    """Writes ``verdict`` unless one is already there; returns whichever verdict won."""
    won = _store_op("compare_set", key, store.compare_set, key, b"", verdict.encode())
    return Verdict.decode(bytes(won), key)


def _failure_verdict(me: RankIdentity) -> Verdict:
    where = f"host {me.hostname}, pid {me.pid}" if me.hostname else f"pid {me.pid}"
    return Verdict("failure",
                   f"rank {me.rank} ({where}) could not bind a GPU, so every rank of group '{me.group}' stops "
                   f"here instead of waiting for it:\n  {me.failure_kind}: {me.failure_text}",
                   {"failed_rank": me.rank, "failure_kind": me.failure_kind, "host": me.hostname, "pid": me.pid})


def _missing_ranks(store: Store, ns: str, world_size: int) -> list[int]:
    """Ranks whose record never arrived: one check per 256 ranks, then one per rank of incomplete blocks."""
    missing: list[int] = []
    block = 256
    for start in range(0, world_size, block):
        ranks = range(start, min(start + block, world_size))
        if store.check([f"{ns}/rec/{r}" for r in ranks]):
            continue
        missing.extend(r for r in ranks if not store.check([f"{ns}/rec/{r}"]))
    return missing


def _format_ranks(ranks: list[int], limit: int = 32) -> str:
    shown = ", ".join(str(r) for r in ranks[:limit])
    return shown + (f" and {len(ranks) - limit} more" if len(ranks) > limit else "")


def _timeout_verdict(store: Store, ns: str, me: RankIdentity, timeout: float) -> Verdict:
    missing = _missing_ranks(store, ns, me.world_size)
    arrived = me.world_size - len(missing)
    noun = "rank" if len(missing) == 1 else "ranks"
    return Verdict(
        "timeout",
        f"{noun} {_format_ranks(missing)} of group '{me.group}' did not reach gpuguard's placement check within "
        f"{timeout:g} s ({arrived} of {me.world_size} arrived). A missing rank exited, crashed or hangs before "
        f"gpuguard.bind() (its own log says why), or was never started (check the launcher's process count); "
        f"every other rank stops here instead of hanging in NCCL.",
        {"missing_ranks": missing[:1024], "arrived": arrived, "world_size": me.world_size, "timeout": timeout})


def _compose(store: Store, ns: str, me: RankIdentity) -> Verdict:
    """Run by the last rank to arrive: reads the (bounded) sample of shared GPUs and analyses it."""
    shared_total = int(_store_op("add", f"{ns}/shared/n", store.add, f"{ns}/shared/n", 0))
    if shared_total == 0:
        return Verdict("ok")
    ranks_sharing = int(_store_op("add", f"{ns}/shared_ranks", store.add, f"{ns}/shared_ranks", 0))
    records: list[bytes] = []
    device_totals: dict[str, int] = {}
    host_totals: dict[int, int] = {}
    for i in range(min(shared_total, MAX_REPORTED_DEVICES)):
        uuid = bytes(_store_op("get", f"{ns}/shared/{i}", store.get, f"{ns}/shared/{i}")).decode("utf-8", "replace")
        device = f"{ns}/dev/{_key_part(uuid)}"
        extra = int(_store_op("add", f"{device}/n", store.add, f"{device}/n", 0))
        device_totals[uuid] = 1 + extra
        keys = [f"{device}/owner"] + [f"{device}/{slot}" for slot in range(1, min(extra, MAX_REPORTED_RANKS_PER_DEVICE - 1) + 1)]
        for key in keys:
            data = bytes(_store_op("get", key, store.get, key))
            try:
                peer = RankIdentity.decode(data)
            except ValueError as exc:
                return Verdict("error", f"the identity record at store key {key!r} is malformed: {exc}. Another "
                                        f"program, or a different gpuguard version, wrote it.", {"key": key})
            records.append(data)
            if peer.host_hash not in host_totals:
                host_key = f"{ns}/host/{peer.host_hash:016x}/n"
                host_totals[peer.host_hash] = int(_store_op("add", host_key, store.add, host_key, 0))
    report = _C.analyze_placement(records, device_totals, host_totals, shared_total, ranks_sharing)
    if report["severity"] == "ok":
        return Verdict("ok")
    details = {"group": me.group, "causes": report["causes"], "shared_devices_total": report["shared_devices_total"],
               "ranks_sharing_total": report["ranks_sharing_total"],
               "shared": [{k: d[k] for k in ("gpu_uuid", "pci_bus_id", "total_ranks", "ranks", "hosts", "causes")}
                          for d in report["shared"]]}
    kind = "warning" if report["severity"] == "warning" else "duplicate"
    return Verdict(kind, report["message"], details)


def _read_verdict(store: Store, key: str) -> Verdict:
    return Verdict.decode(bytes(_store_op("get", key, store.get, key)), key)


def exchange(store: Store, me: RankIdentity, *, namespace: str, timeout: float) -> Verdict:
    """Publishes ``me`` and returns the verdict every rank of the group gets (the protocol above).

    Never raises for what the verdict reports; raises GpuGuardError only when the store itself fails.
    """
    ns = namespace
    record = me.encode()
    deadline = time.monotonic() + timeout
    verdict_key = f"{ns}/verdict"
    _store_op("set", f"{ns}/rec/{me.rank}", store.set, f"{ns}/rec/{me.rank}", record)
    if me.failure_kind is not None:
        return _publish(store, verdict_key, _failure_verdict(me))
    if me.gpu_uuid:
        device = f"{ns}/dev/{_key_part(me.gpu_uuid)}"
        owner = _store_op("compare_set", f"{device}/owner", store.compare_set, f"{device}/owner", b"", record)
        if bytes(owner) != record:  # another rank of the group already holds this GPU
            slot = int(_store_op("add", f"{device}/n", store.add, f"{device}/n", 1))
            _store_op("set", f"{device}/{slot}", store.set, f"{device}/{slot}", record)
            if slot == 1:  # the second rank on a GPU lists it once as shared, and counts the owner too
                index = int(_store_op("add", f"{ns}/shared/n", store.add, f"{ns}/shared/n", 1)) - 1
                _store_op("set", f"{ns}/shared/{index}", store.set, f"{ns}/shared/{index}", me.gpu_uuid.encode())
            _store_op("add", f"{ns}/shared_ranks", store.add, f"{ns}/shared_ranks", 2 if slot == 1 else 1)
        host_key = f"{ns}/host/{me.host_hash:016x}/n"
        _store_op("add", host_key, store.add, host_key, 1)
    arrived = int(_store_op("add", f"{ns}/arrived", store.add, f"{ns}/arrived", 1))
    if arrived == me.world_size:
        return _publish(store, verdict_key, _compose(store, ns, me))
    if _wait_for(store, verdict_key, deadline - time.monotonic()):
        return _read_verdict(store, verdict_key)
    # Deadline: one rank (the first to get here) names the missing ranks; the others take its verdict.
    if int(_store_op("add", f"{ns}/timeout", store.add, f"{ns}/timeout", 1)) == 1:
        return _publish(store, verdict_key, _timeout_verdict(store, ns, me, timeout))
    if _wait_for(store, verdict_key, TIMEOUT_GRACE_S):
        return _read_verdict(store, verdict_key)
    arrived_now = int(_store_op("add", f"{ns}/arrived", store.add, f"{ns}/arrived", 0))
    return Verdict("timeout",
                   f"only {arrived_now} of {me.world_size} ranks of group '{me.group}' reached gpuguard's placement "
                   f"check within {timeout:g} s, and the rank naming the missing ones did not report back",
                   {"arrived": arrived_now, "world_size": me.world_size, "timeout": timeout})


# ---- turning verdicts into exceptions ---------------------------------------------------------------------

def _error_class(name: Optional[str]) -> type[GpuGuardError]:
    """The gpuguard error class a peer's failure names, from gpuguard's own classes only."""
    cls = getattr(errors, name or "", None)
    if isinstance(cls, type) and issubclass(cls, GpuGuardError):
        return cls
    return GpuGuardError


def raise_for(verdict: Verdict, me: RankIdentity, failure: Optional[BaseException] = None) -> None:
    """Raises what ``verdict`` means on this rank (nothing for ok; a log warning for warning)."""
    if failure is not None:
        raise failure  # this rank's own error says more than the verdict about it
    if verdict.kind == "ok":
        return
    if verdict.kind == "warning":
        log.warning("gpuguard: %s", verdict.message)
        return
    details = dict(verdict.details, rank=me.rank, group=me.group)
    if verdict.kind == "duplicate":
        raise DuplicateDeviceError(verdict.message, **details)
    if verdict.kind == "timeout":
        raise RendezvousTimeoutError(verdict.message, **details)
    if verdict.kind == "failure":
        raise _error_class(verdict.details.get("failure_kind"))(verdict.message, peer_failure=True, **details)
    raise GpuGuardError(verdict.message, **details)


# ---- building this rank's record --------------------------------------------------------------------------

def _first(*values: Any) -> Any:
    for value in values:
        if value is not None:
            return value
    return None


def identity_of(binding: Optional["Binding"], failure: Optional[BaseException], context: "LaunchContext",
                group: str) -> RankIdentity:
    """This rank's record, from bind()'s Binding (or the failure that prevented one) and the launch context."""
    fingerprint = _C.host_fingerprint()
    extra = dict(binding.extra) if binding is not None else dict(getattr(context, "extra", {}) or {})
    on_gpu = binding is not None and binding.uuid is not None and binding.device_index is not None
    visible_count = binding.visible_device_count if binding is not None else None
    if visible_count is None:
        status = _C.cuda_status()  # bind() already initialised the driver; this only reads the count
        visible_count = int(status["device_count"]) if status["initialized"] else -1
    share = extra.get("ray_gpu_share")
    ray_ids = extra.get("ray_gpu_ids")
    # A Ray actor has no local rank unless LOCAL_RANK is set: bind()'s local_rank there is the index of the GPU
    # Ray chose (under RAY_EXPERIMENTAL_NOSET_CUDA_VISIBLE_DEVICES it can exceed the world size), not a rank.
    no_local_rank = context.launcher == "ray" and context.local_rank is None
    me = RankIdentity(
        rank=int(_first(binding.rank if binding else None, context.rank)),
        world_size=int(_first(binding.world_size if binding else None, context.world_size)),
        group=group,
        local_rank=-1 if no_local_rank else int(_first(binding.local_rank if binding else None,
                                                       context.local_rank, -1)),
        local_world_size=int(_first(context.local_world_size, -1)),
        host_hash=int(fingerprint["hash"]),
        hostname=str(binding.host if binding is not None else fingerprint["hostname"]),
        gpu_uuid=binding.uuid if on_gpu and binding is not None and binding.uuid else "",
        pci_bus_id=(binding.pci_bus_id or "") if on_gpu and binding is not None else "",
        gpu_index=int(binding.device_index) if on_gpu and binding is not None and binding.device_index is not None else -1,
        pid=os.getpid(),
        cuda_visible_devices=os.environ.get("CUDA_VISIBLE_DEVICES"),
        visible_device_count=int(visible_count),
        launcher=str(binding.launcher if binding is not None else context.launcher),
        multi_rank_gpu_enabled=os.environ.get("NCCL_MULTI_RANK_GPU_ENABLE") == "1",
        gpu_fraction=float(share) if isinstance(share, (int, float)) and 0 < float(share) else None,
        ray_gpu_ids=",".join(str(i) for i in ray_ids) if isinstance(ray_ids, (list, tuple)) else str(ray_ids or ""),
    )
    if failure is not None:
        me.failure_kind = type(failure).__name__ if isinstance(failure, GpuGuardError) else "GpuGuardError"
        me.failure_text = str(failure)
    return me


# ---- verify_nccl ------------------------------------------------------------------------------------------

def _nccl_verdict_from(failures: list[dict[str, Any]], failed_total: int, me: RankIdentity,
                       timeout: float) -> Verdict:
    if failed_total == 0:
        return Verdict("ok")
    lines = [f"  rank {f['rank']} ({f['host']}): {f['verdict']} at {f['stage']}: {f['message']}" for f in failures]
    if failed_total > len(failures):
        lines.append(f"  ... and {failed_total - len(failures)} more ranks")
    texts = " ".join(f.get("last_error", "") + " " + f.get("message", "") for f in failures)
    details = {"failed_ranks": [f["rank"] for f in failures], "failed_total": failed_total,
               "nccl_errors": [f.get("last_error", "") for f in failures]}
    if "Duplicate GPU detected" in texts or "Multiple Ranks are using the same GPU" in texts:
        return Verdict("duplicate",
                       f"NCCL refused to form a communicator for group '{me.group}': two ranks share a GPU "
                       f"({failed_total} of {me.world_size} ranks failed):\n" + "\n".join(lines) +
                       "\nFix: give every rank of the group its own GPU (see gpuguard.bind()'s placement report).",
                       details)
    if all(f["verdict"] == "timed out" for f in failures):
        return Verdict("timeout",
                       f"NCCL did not form a communicator for group '{me.group}' within {timeout:g} s on "
                       f"{failed_total} of {me.world_size} ranks; gpuguard aborted it (ncclCommAbort):\n" +
                       "\n".join(lines) + "\nLikely cause: the ranks cannot reach each other (network "
                       "interfaces: NCCL_SOCKET_IFNAME; firewalls) or GPU peer-to-peer is broken; run "
                       "`gpuguard doctor --nccl` on one node to tell which.", dict(details, aborted=True))
    return Verdict("error", f"NCCL failed to form a communicator for group '{me.group}' ({failed_total} of "
                            f"{me.world_size} ranks failed):\n" + "\n".join(lines), details)


def verify_nccl_across_ranks(store: Optional[Store], me: RankIdentity, *, namespace: str,
                             timeout: float) -> Verdict:
    """Forms a real NCCL communicator of the group (rank 0's unique id through the store) under a deadline."""
    ns = f"{namespace}/nccl"
    id_key = f"{ns}/id"
    started = time.monotonic()
    if me.rank == 0:
        try:
            unique_id = _C.nccl_unique_id()
        except RuntimeError as exc:
            status = _C.nccl_status()
            message = f"rank 0 could not get an NCCL unique id: {exc}" + (
                f" ({status['reason']})" if status.get("reason") else "")
            verdict = Verdict("error", message, {"rank": 0})
            if store is not None:
                _store_op("set", id_key, store.set, id_key, b"")
                return _publish(store, f"{ns}/verdict", verdict)
            return verdict
        if store is not None:
            _store_op("set", id_key, store.set, id_key, unique_id)
    else:
        assert store is not None
        if not _wait_for(store, id_key, timeout):
            return Verdict("timeout", f"rank 0 did not publish an NCCL unique id within {timeout:g} s",
                           {"rank": me.rank})
        unique_id = bytes(_store_op("get", id_key, store.get, id_key))
        if len(unique_id) != 128:
            return Verdict.decode(bytes(_store_op("get", f"{ns}/verdict", store.get, f"{ns}/verdict")),
                                  f"{ns}/verdict") if unique_id == b"" else Verdict(
                "error", f"the NCCL unique id at {id_key!r} is {len(unique_id)} bytes, not 128", {"key": id_key})
    remaining = max(0.1, timeout - (time.monotonic() - started))
    if me.gpu_uuid:
        outcome = _C.nccl_probe(me.world_size, me.rank, unique_id, me.gpu_index, remaining, False)
    else:  # still take part, so that the others learn why instead of waiting for this rank in NCCL
        outcome = {"ok": False, "verdict": "failed", "stage": "bind", "last_error": "", "error": {
            "message": "verify_nccl=True needs a GPU on every rank; this rank has none (bind() fell back to "
                       "the CPU)"}}
    mine = None if outcome["ok"] else {
        "rank": me.rank, "host": me.hostname, "verdict": outcome["verdict"], "stage": outcome["stage"],
        "message": (outcome["error"] or {}).get("message", "")[:2000], "last_error": outcome["last_error"][:1000]}
    if store is None:
        return _nccl_verdict_from([mine] if mine else [], 1 if mine else 0, me, timeout)
    if mine is not None:
        index = int(_store_op("add", f"{ns}/failed/n", store.add, f"{ns}/failed/n", 1)) - 1
        _store_op("set", f"{ns}/failed/{index}", store.set, f"{ns}/failed/{index}", json.dumps(mine).encode())
    verdict_key = f"{ns}/verdict"
    if int(_store_op("add", f"{ns}/done", store.add, f"{ns}/done", 1)) == me.world_size:
        failed_total = int(_store_op("add", f"{ns}/failed/n", store.add, f"{ns}/failed/n", 0))
        failures = []
        for i in range(min(failed_total, MAX_REPORTED_DEVICES)):
            raw = bytes(_store_op("get", f"{ns}/failed/{i}", store.get, f"{ns}/failed/{i}"))
            try:
                f = json.loads(raw.decode("utf-8")) if len(raw) < 16384 else None
            except (UnicodeDecodeError, ValueError):
                f = None
            if not isinstance(f, dict) or not all(isinstance(f.get(k), str) for k in ("host", "verdict", "stage", "message")):
                f = {"rank": -1, "host": "?", "verdict": "failed", "stage": "?", "message": "malformed report",
                     "last_error": ""}
            failures.append(f)
        failures.sort(key=lambda f: f["rank"] if isinstance(f.get("rank"), int) else -1)
        return _publish(store, verdict_key, _nccl_verdict_from(failures, failed_total, me, timeout))
    # Every rank's probe ends by its own deadline (NCCL is aborted then), so the grace covers the slowest.
    if _wait_for(store, verdict_key, timeout + TIMEOUT_GRACE_S):
        return Verdict.decode(bytes(_store_op("get", verdict_key, store.get, verdict_key)), verdict_key)
    done = int(_store_op("add", f"{ns}/done", store.add, f"{ns}/done", 0))
    return Verdict("timeout", f"only {done} of {me.world_size} ranks finished the NCCL probe of group "
                              f"'{me.group}' within {timeout:g} s", {"done": done, "world_size": me.world_size})


# ---- the entry point bind() calls -------------------------------------------------------------------------

def check_across_ranks(binding: Optional["Binding"], failure: Optional[GpuGuardError], context: "LaunchContext",
                       *, group: str, store: Any, timeout: float, verify_nccl: bool) -> None:
    """bind()'s cross-rank step: raises the same error on every rank when the group's placement is wrong.

    ``binding`` is this rank's Binding (None when ``failure`` says why there is none); ``failure`` is re-raised
    on this rank after it is published, so the other ranks stop at once naming it.
    """
    if not isinstance(group, str) or not group:
        raise ValueError("group must be a non-empty string")
    if not timeout or timeout <= 0:
        raise ValueError(f"timeout must be a positive number of seconds, not {timeout!r}")
    me = identity_of(binding, failure, context, group)
    found = find_store(store, group=group, world_size=me.world_size, timeout=timeout)
    if found is None:
        if failure is not None:
            raise failure
        if verify_nccl:
            raise_for(verify_nccl_across_ranks(None, me, namespace="", timeout=timeout), me)
        return
    namespace = run_namespace(group)
    started = time.monotonic()
    verdict = exchange(found, me, namespace=namespace, timeout=timeout)
    log.debug("gpuguard: cross-rank check of group %r (%d ranks): %s in %.3f s", group, me.world_size,
              verdict.kind, time.monotonic() - started)
    raise_for(verdict, me, failure)
    if verify_nccl:
        raise_for(verify_nccl_across_ranks(found, me, namespace=namespace, timeout=timeout), me)
