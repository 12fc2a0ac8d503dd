"""The cross-rank placement check: every rank publishes who-is-where, and every rank gets the same verdict.

``bind()`` runs :func:`exchange` after resolving this process's GPU, through the store
:func:`~gpuguard.placement.stores.find_store` found, under the one deadline of the bind() call.

Key layout. Every key lives under one namespace per check,
``gpuguard/v1/<group>/<run id>/<restart>/<call>``: the run id (``launchers.run_id``: ``TORCHELASTIC_RUN_ID``,
the SLURM job and step of an srun task, Open MPI's job id; never the SLURM step of an MPI daemon, which would
split one mpirun's ranks) and torchelastic's restart count keep elastic restarts apart, and ``<call>`` (how many checks this
process has made for this group) keeps repeated ``bind()`` calls apart. Under it (``N`` = world size):

==================================  =========================================================================
``rec/<rank>``                      the rank's identity record (compact binary, ~150 bytes): its arrival mark
``dev/<gpu uuid>/owner``            the record of the first rank on that GPU (``compare_set`` from empty:
                                    whoever wins owns it; a rank that loses learns at once that it shares)
``dev/<gpu uuid>/n``, ``/<i>``      counter and records of the further ranks on that GPU (only if shared)
``shared/n``, ``shared/<i>``        counter and list of the GPUs that got a second rank
``shared_ranks``                    counter: ranks on shared GPUs (for the report's totals)
``host/<host hash>/n``              counter: ranks of the group on that host (NCCL's host hash)
``pid/<host hash>/<pid>``           the rank with that pid on that host: how a rank tells the job's processes on
                                    its GPU from others (``placement.foreign_processes``, after the verdict)
``gpu/<host hash>/<pci>/...``       MIG ranks only: ``owner``, ``n``, ``<i>`` as under ``dev/``, for the GPU
                                    their instance belongs to (instances of one GPU share its PCI bus id)
                                    (a GPU whose MIG instances got a second rank is listed under
                                    ``shared/`` as ``gpu:<host hash>/<pci>``)
``arrived``                         counter: ranks that finished publishing
``verdict``                         the outcome every rank reads, written once (``compare_set`` from empty):
                                    by the last arriver, by a rank whose own resolution failed, or by the
                                    first rank to reach the deadline (naming the ranks that never came)
``timeout``                         counter electing that one timeout reporter
``failed/n``, ``failed/<i>``        counter and records (at most 8) of the ranks that failed, so that a
                                    failure verdict names all of them
``all_arrived``                     set by the last rank to arrive when the verdict is a failure: readers wait
                                    on it (at most FAILURE_GRACE_S) before naming the failed ranks
``read``, ``all_read``              counter of ranks that read a verdict that stops the job, and the key the
                                    last one sets: the rank serving the store waits on it before exiting
``nccl/...``                        the same pattern for ``verify_nccl=True``: ``id`` (rank 0's unique id),
                                    ``failed/n`` + ``failed/<i>``, ``done``, ``verdict``
==================================  =========================================================================

Cost per rank, independent of N: a rank on a GPU of its own makes 7 store operations: set ``rec``,
compare_set ``owner``, add ``host``, set ``pid``, add ``arrived``, then wait + get ``verdict``. A rank that finds its
GPU taken adds 3 (add ``dev/n``, set its slot, add ``shared_ranks``), and the second one on a GPU 2 more
(``shared/n``, ``shared/<i>``). A rank on a MIG instance adds 1 (compare_set of its GPU's ``owner``), or 3
to 5 when another instance of that GPU was claimed first (the same pattern under ``gpu/``). The last arriver writes the verdict instead of waiting for it, after reading
at most 16 shared GPUs × 16 records plus their counters, so even a job in which every rank shares is
bounded. Bytes stored per rank: its record twice (``rec`` and ``owner`` or its slot, ~150 bytes each) plus
shared counters. On a timeout, the one reporting rank finds the missing ranks with one ``check`` per 256
ranks plus one per rank of the blocks with a gap.
A verdict that stops the job (anything but ok or a warning) costs each rank one more ``add`` on ``read``
(the last reader sets ``all_read``, which the rank serving the store waits on before it exits), and a failed
rank two more (``failed/n``, ``failed/<i>``; the readers of a failure verdict read at most 8 of them to name
every failed rank). Nothing is all-to-all: no rank ever reads every record. A failed rank's record is published like any other
and its failure becomes the verdict at once (``compare_set``), so every rank waiting on ``verdict`` wakes
immediately, naming it.

After an ok or warning verdict each rank looks up the pids NVML lists on its GPU (``placement.foreign_processes``:
one ``check`` each, at most 32, none on a GPU of its own); with ``require_exclusive`` one more round follows through
the same namespace (``procs/n``, ``procs/verdict``: 3 to 4 operations more), so that a refusal reaches every rank.

Waiting is one ``store.wait([verdict], remaining)``: every outcome, including a peer's failure, is written to
that one key, so a single blocking wait sees it the moment it is published (short polling slices would add
store operations and, with c10d's TCPStore, a log line per expired slice).
"""

from __future__ import annotations

import itertools
import logging
import os
import threading
from typing import Optional

from .._core import analyze_placement
from ..deadline import Deadline
from .identity import RankIdentity
from .foreign_processes import pid_key
from .stores import CheckedStore, Store
from .verdict import Verdict

log = logging.getLogger("gpuguard")

#: Format of everything under the namespace; bumped if the layout changes, so mixed versions never mix keys.
PROTOCOL = "v1"
#: The composer reads at most this many shared GPUs, and this many records per GPU (the report's bounds).
MAX_REPORTED_DEVICES = 16
MAX_REPORTED_RANKS_PER_DEVICE = 16
#: After the deadline a rank waits this much longer for the timeout reporter's verdict.
TIMEOUT_GRACE_S = 5.0
#: A failure verdict names at most this many failed ranks (each with its error's first line).
MAX_REPORTED_FAILURES = 8
#: A rank that reads a failure verdict waits at most this long for every rank to arrive, so that its message
#: names every failed rank (ranks start seconds apart on real clusters); the verdict itself is written at once.
FAILURE_GRACE_S = 5.0


# ---- namespaces -------------------------------------------------------------------------------------------

_calls: dict[str, itertools.count] = {}
_calls_lock = threading.Lock()


def key_part(text: str) -> str:
    """Escapes '/' and '%' so that a group name cannot reach into another group's keys."""
    return text.replace("%", "%25").replace("/", "%2F")


def run_namespace(group: str, run_id: Optional[str] = None) -> str:
    """The namespace of this process's next check for ``group`` (see the module docstring). ``run_id`` names
    the launch (``launchers.run_id``: the same on every rank of it); without it, torchrun's or SLURM's."""
    if run_id is None:
        run_id = os.environ.get("TORCHELASTIC_RUN_ID") or (
            f"slurm-{os.environ['SLURM_JOB_ID']}.{os.environ.get('SLURM_STEP_ID', '0')}"
            if os.environ.get("SLURM_JOB_ID") else "")
    restart = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
    with _calls_lock:
        call = next(_calls.setdefault(group, itertools.count()))
    return f"gpuguard/{PROTOCOL}/{key_part(group)}/{key_part(run_id)}/{key_part(restart)}/{call}"


def namespace_for(store: Store, group: str, rank: int, run_id: Optional[str] = None) -> str:
    """The namespace of this rank's next check through ``store``. A store that outlives the processes using it
    (the Ray rendezvous actor, which an actor restarted by Ray's ``max_restarts`` finds again) counts the calls
    per rank itself, so a restarted actor's next check is its peers' next check, not its own first one again
    (a per-process count would restart at 0 and read the verdict of the round it already took part in)."""
    if not getattr(store, "outlives_ranks", False):
        return run_namespace(group, run_id)
    base = f"gpuguard/{PROTOCOL}/{key_part(group)}/persistent"
    call = CheckedStore(store, base).add(f"calls/{rank}", 1) - 1
    return f"{base}/{call}"


# ---- verdicts the exchange composes ------------------------------------------------------------------------

def publish(store: CheckedStore, key: str, verdict: Verdict) -> Verdict:
    """Writes ``verdict`` unless one is already there; returns whichever verdict won."""
    return Verdict.decode(store.compare_set(key, b"", verdict.encode()), store.key(key))


def read_verdict(store: CheckedStore, key: str) -> Verdict:
    return Verdict.decode(store.get(key), store.key(key))


def _failure_verdict(me: RankIdentity) -> Verdict:
    where = f"host {me.hostname}, pid {me.pid}" if me.hostname else f"pid {me.pid}"
    return Verdict("failure",
                   f"rank {me.rank} ({where}) could not bind a GPU, so every rank of group '{me.group}' stops "
                   f"here instead of waiting for it:\n  {me.failure_kind}: {me.failure_text}",
                   {"failed_rank": me.rank, "failure_kind": me.failure_kind, "host": me.hostname, "pid": me.pid})


def _with_other_failures(store: CheckedStore, verdict: Verdict, me: RankIdentity) -> Verdict:
    """A failure verdict completed with every other failed rank known now (``failed/n``, bounded), so that
    each rank's message names all of them, not only the first to publish."""
    if verdict.kind != "failure":
        return verdict
    total = store.counter("failed/n")
    first = verdict.details.get("failed_rank")
    others: list[str] = []
    ranks: list[int] = [first] if isinstance(first, int) else []
    for i in range(min(total, MAX_REPORTED_FAILURES)):
        try:
            peer = RankIdentity.decode(store.get(f"failed/{i}"))
        except ValueError:
            continue
        if peer.rank == first or peer.rank in ranks:
            continue
        ranks.append(peer.rank)
        text = (peer.failure_text or "").strip().splitlines()
        others.append(f"  rank {peer.rank} ({peer.hostname or 'unknown host'}): {peer.failure_kind}: "
                      f"{text[0][:300] if text else ''}")
    if not others:
        return verdict
    more = total - len(ranks)
    message = (f"{verdict.message}\n{total} ranks failed ({', '.join(str(r) for r in sorted(ranks))}"
               f"{f' and {more} more' if more > 0 else ''}); the others:\n" + "\n".join(others))
    return Verdict("failure", message, dict(verdict.details, failed_ranks=sorted(ranks), failed_total=total))


def mark_read(store: CheckedStore, world_size: int) -> None:
    """Counts this rank as having read the verdict; the last one sets ``all_read`` (the store's owner waits
    on it before it exits, see :func:`hold_until_read`)."""
    if store.add("read", 1) == world_size:
        store.set("all_read", b"1")


def hold_until_read(store: Store, namespace: str, deadline: Deadline) -> bool:
    """For the rank that serves the store (rank 0 as TCPStore master under env://): returns once every rank
    has read the verdict, or at the deadline. Its exit would otherwise cut off ranks still starting."""
    return CheckedStore(store, namespace).wait_for("all_read", deadline.remaining())


def _missing_ranks(store: CheckedStore, world_size: int) -> list[int]:
    """Ranks whose record never arrived: one check per 256 ranks, then one per rank of incomplete blocks."""
    missing: list[int] = []
    block = 256
    for start in range(0, world_size, block):
        ranks = range(start, min(start + block, world_size))
        if store.has(*(f"rec/{r}" for r in ranks)):
            continue
        missing.extend(r for r in ranks if not store.has(f"rec/{r}"))
    return missing


def _format_ranks(ranks: list[int], limit: int = 32) -> str:
    shown = ", ".join(str(r) for r in ranks[:limit])
    return shown + (f" and {len(ranks) - limit} more" if len(ranks) > limit else "")


def _timeout_verdict(store: CheckedStore, me: RankIdentity, timeout: float) -> Verdict:
    missing = _missing_ranks(store, me.world_size)
    arrived = me.world_size - len(missing)
    noun = "rank" if len(missing) == 1 else "ranks"
    return Verdict(
        "timeout",
        f"{noun} {_format_ranks(missing)} of group '{me.group}' did not reach gpuguard's placement check within "
        f"{timeout:g} s ({arrived} of {me.world_size} arrived). A missing rank exited, crashed or hangs before "
        f"gpuguard.bind() (its own log says why), or was never started (check the launcher's process count); "
        f"every other rank stops here instead of hanging in NCCL.",
        {"missing_ranks": missing[:1024], "arrived": arrived, "world_size": me.world_size, "timeout": timeout})


def _claim(ns: CheckedStore, prefix: str, listing: str, name: str, record: bytes) -> bool:
    """Claims ``prefix`` (compare_set of ``owner``); a rank that finds it taken adds its record in a slot, and
    the second lists ``name`` under ``listing``. True when the claim was already taken."""
    device = ns.child(prefix)
    if device.compare_set("owner", b"", record) == record:
        return False
    slot = device.add("n", 1)
    device.set(str(slot), record)
    if slot == 1:  # the second rank lists it once
        index = ns.add(f"{listing}/n", 1) - 1
        ns.set(f"{listing}/{index}", name.encode())
    return True


def _compose(store: CheckedStore, me: RankIdentity) -> Verdict:
    """Run by the last rank to arrive: reads the (bounded) sample of shared GPUs and analyses it."""
    shared_total = store.counter("shared/n")
    if shared_total == 0:
        return Verdict("ok")
    ranks_sharing = store.counter("shared_ranks")
    records: list[bytes] = []
    device_totals: dict[str, int] = {}
    host_totals: dict[int, int] = {}
    split_gpus = 0  # listed GPUs split into MIG instances: not shared devices (exact within the sample)
    for i in range(min(shared_total, MAX_REPORTED_DEVICES)):
        uuid = store.get(f"shared/{i}").decode("utf-8", "replace")
        split_gpu = uuid.startswith("gpu:")  # MIG instances of one GPU, not one device
        split_gpus += split_gpu
        device = store.child(f"gpu/{uuid[4:]}" if split_gpu else f"dev/{key_part(uuid)}")
        extra = device.counter("n")
        if not split_gpu:
            device_totals[uuid] = 1 + extra
        slots = ["owner"] + [str(slot) for slot in range(1, min(extra, MAX_REPORTED_RANKS_PER_DEVICE - 1) + 1)]
        for slot in slots:
            data = device.get(slot)
            try:
                peer = RankIdentity.decode(data)
            except ValueError as exc:
                key = device.key(slot)
                return Verdict("error", f"the identity record at store key {key!r} is malformed: {exc}. Another "
                                        f"program, or a different gpuguard version, wrote it.", {"key": key})
            records.append(data)
            if peer.host_hash not in host_totals:
                host_totals[peer.host_hash] = store.counter(f"host/{peer.host_hash:016x}/n")
    report = analyze_placement(records, device_totals, host_totals, shared_total - split_gpus, ranks_sharing)
    if report.severity == "ok":
        return Verdict("ok")
    details = {"group": me.group, "causes": report.causes, "shared_devices_total": report.shared_devices_total,
               "ranks_sharing_total": report.ranks_sharing_total,
               "shared": [{k: getattr(d, k) for k in ("gpu_uuid", "pci_bus_id", "total_ranks", "ranks", "hosts", "causes")}
                          for d in report.shared]}
    kind = "warning" if report.severity == "warning" else "duplicate"
    return Verdict(kind, report.message, details)


# ---- the protocol ------------------------------------------------------------------------------------------

def exchange(store: Store, me: RankIdentity, *, namespace: str, deadline: Deadline) -> Verdict:
    """Publishes ``me`` and returns the verdict every rank of the group gets (the protocol above).

    Never raises for what the verdict reports; raises GpuGuardError only when the store itself fails. Returns
    by ``deadline`` plus at most TIMEOUT_GRACE_S (waiting for the one rank that names the missing ranks).
    """
    ns = CheckedStore(store, namespace)
    record = me.encode()
    ns.set(f"rec/{me.rank}", record)
    verdict = _exchange(ns, me, record, deadline)
    if verdict.kind == "failure":  # name every failed rank: wait briefly for the ranks still arriving
        ns.wait_for("all_arrived", min(FAILURE_GRACE_S, max(deadline.remaining(), 0.0)))
        verdict = _with_other_failures(ns, verdict, me)
    if verdict.kind not in ("ok", "warning"):  # ranks go on to exit: the store's owner waits for all to read
        mark_read(ns, me.world_size)
    return verdict


def _arrive(ns: CheckedStore, me: RankIdentity, failed: bool = False) -> bool:
    """Counts this rank in ``arrived``; True for the last one. A failed last one sets ``all_arrived`` (what
    the readers of a failure verdict wait on); a healthy last one does so only if the verdict is a failure."""
    last = ns.add("arrived", 1) == me.world_size
    if last and failed:
        ns.set("all_arrived", b"1")
    return last


def _exchange(ns: CheckedStore, me: RankIdentity, record: bytes, deadline: Deadline) -> Verdict:
    if me.failure_kind is not None:
        slot = ns.add("failed/n", 1) - 1
        if slot < MAX_REPORTED_FAILURES:
            ns.set(f"failed/{slot}", record)
        verdict = publish(ns, "verdict", _failure_verdict(me))
        _arrive(ns, me, failed=True)
        return verdict
    if me.gpu_uuid:
        device = ns.child(f"dev/{key_part(me.gpu_uuid)}")
        if device.compare_set("owner", b"", record) != record:  # another rank of the group holds this GPU
            slot = device.add("n", 1)
            device.set(str(slot), record)
            if slot == 1:  # the second rank on a GPU lists it once as shared, and counts the owner too
                index = ns.add("shared/n", 1) - 1
                ns.set(f"shared/{index}", me.gpu_uuid.encode())
            ns.add("shared_ranks", 2 if slot == 1 else 1)
        if me.gpu_uuid.startswith("MIG-") and me.pci_bus_id:  # its GPU, which other instances may be on
            gpu = f"{me.host_hash:016x}/{key_part(me.pci_bus_id)}"
            _claim(ns, f"gpu/{gpu}", "shared", f"gpu:{gpu}", record)
        ns.add(f"host/{me.host_hash:016x}/n", 1)
    ns.set(pid_key(me.host_hash, me.pid), str(me.rank).encode())  # read after the verdict: which pids are ranks
    if _arrive(ns, me):
        verdict = publish(ns, "verdict", _compose(ns, me))
        if verdict.kind == "failure":  # a failed rank wrote it earlier: its readers wait for everyone
            ns.set("all_arrived", b"1")
        return verdict
    if ns.wait_for("verdict", deadline.remaining()):
        return read_verdict(ns, "verdict")
    # Deadline: one rank (the first to get here) names the missing ranks; the others take its verdict.
    if ns.add("timeout", 1) == 1:
        return publish(ns, "verdict", _timeout_verdict(ns, me, deadline.total))
    if ns.wait_for("verdict", TIMEOUT_GRACE_S):
        return read_verdict(ns, "verdict")
    arrived_now = ns.counter("arrived")
    return Verdict("timeout",
                   f"only {arrived_now} of {me.world_size} ranks of group '{me.group}' reached gpuguard's placement "
                   f"check within {deadline.total:g} s, and the rank naming the missing ones did not report back",
                   {"arrived": arrived_now, "world_size": me.world_size, "timeout": deadline.total})
