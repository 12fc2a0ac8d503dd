"""The cross-rank placement check: every rank publishes who-is-where, and every rank gets the same verdict.

``bind()`` runs :func:`exchange` after resolving this process's GPU, through the store
:func:`~gpuguard.placement.stores.find_store` found, under the one deadline of the bind() call.

Namespaces. A check's keys live under a *base*, ``gpuguard/v2/<group>/<run id>/<restart>/<call>`` (the run id,
``launchers.run_id``: ``TORCHELASTIC_RUN_ID``, the SLURM job and step of an srun task, Open MPI's job id; never
the SLURM step of an MPI daemon, which would split one mpirun's ranks; torchelastic's restart count; ``<call>``:
how many checks this rank of this process made for the group), and under it in an *epoch* of their own that this
run's rank 0 (the *leader*) draws at random: ``<base>/epoch/<16 hex digits>``. The base repeats whenever a job
has no run id (plain RANK/WORLD_SIZE, ``bind(rank=, world_size=, local_rank=, store=)`` under
``torch.multiprocessing.spawn``) and its store outlives a run (a notebook's TCPStore, a ``file://`` init method
whose file survived a crash, a long-lived store server); the epoch never does, so no key of an earlier run can
take part in this one. The ranks agree on it without trusting what the store held before they came:

* the leader writes ``<base>/lead`` = its epoch (and, when ``lead`` named an earlier epoch, sends whoever waits
  there on: ``<old>/next`` = the new epoch, ``<old>/verdict`` = a *moved* verdict);
* every other rank reads ``lead`` (waiting for it up to the deadline) and joins that epoch. A ``lead`` left by an
  earlier run is recognised and left: the rank's slot ``rec/<rank>`` already holds another process's record,
  or ``arrived`` counts past the world size, or a verdict was written before this rank arrived (see
  :func:`_fresh`); the rank then waits for ``next``. Only the leader composes a verdict that lets a job go on,
  and only in its own epoch after all N ranks counted themselves in, so a rank never takes an earlier run's
  "ok": a verdict composed before it arrived would have needed N arrivals without it, and its own arrival
  would have counted past N.

Keys in an epoch (``N`` = world size):

==================================  =========================================================================
``rec/<rank>``                      the rank's identity record (compact binary, ~150 bytes), written with
                                    ``compare_set`` from empty: its arrival mark, and its host and pid for
                                    any message that names it
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
``arrived``                         counter: ranks that finished publishing (a value past N: an earlier run's
                                    epoch, or another program's writes)
``done/<rank>``                     set right after the rank counted itself in: a rank with ``rec`` and no
                                    ``done`` arrived and went silent (killed, stopped, hung) in between
``all_arrived``, ``wake``           set by the rank that counts N: the readers of a failure verdict wait on
                                    ``all_arrived`` to name every failed rank; the leader waits on ``wake``
                                    to compose, which a failed rank sets too, so a failure stops it at once
``verdict``                         the outcome every rank reads, written once (``compare_set`` from empty):
                                    by the leader once all arrived, by a rank whose own resolution failed, or
                                    by the first rank to reach the deadline (naming the ranks missing)
``timeout``                         counter electing that one timeout reporter
``failed/n``, ``failed/<i>``        counter and records (at most 8) of the ranks that failed, so that a
                                    failure verdict names all of them
``read``, ``all_read``              counter of ranks that read a verdict that stops the job, and the key the
                                    last one sets: the rank serving the store waits on it before exiting
``next``                            set by a later run's leader: the epoch a rank left here should go to
``nccl/...``                        the same pattern for ``verify_nccl=True``: ``id`` (rank 0's unique id),
                                    ``failed/n`` + ``failed/<i>``, ``done``, ``verdict``
==================================  =========================================================================

Cost per rank, independent of N. A rank on a GPU of its own makes 8 store operations: get ``lead``
(a ``wait`` and a ``get`` on a store whose timeout cannot be set), compare_set ``rec``, compare_set ``owner``, add
``host``, set ``pid``, add ``arrived``, set ``done``, get ``verdict``; the one that counts N sets ``all_arrived``
and ``wake`` too. The leader makes 13 to 15: check (and get) ``lead``, set ``lead``, the moves of an earlier epoch
(2), compare_set ``rec`` and ``owner``, add ``host``, set ``pid``, add ``arrived``, set ``done``, wait ``wake``,
the composition
(from 1 read when no GPU is shared, at most 16 shared GPUs x 16 records plus their counters otherwise: the
report's bounds, whatever N), compare_set ``verdict``, delete ``lead``. A rank that finds its GPU taken adds 3
(add ``dev/n``, set its slot, add ``shared_ranks``), and the second one on a GPU 2 more (``shared/n``,
``shared/<i>``). A rank on a MIG instance adds 1 (compare_set of its GPU's ``owner``), or 3 to 5 when another
instance of that GPU was claimed first (the same pattern under ``gpu/``). Bytes stored per rank: its record
twice (``rec`` and ``owner`` or its slot, ~150 bytes each) plus counters and a one-byte ``done``.
A verdict that stops the job (anything but ok or a warning) costs each rank one more ``add`` on ``read`` (the
last reader sets ``all_read``, which the rank serving the store waits on before it exits, and deletes ``lead``),
and a failed rank three more (``failed/n``, ``failed/<i>``, ``wake``; the readers of a failure verdict read at
most 8 of them to name every failed rank). Nothing is all-to-all: no rank ever reads every record. A failed
rank's record is published like any other and its failure becomes the verdict at once (``compare_set``), so
every rank waiting on ``verdict`` wakes immediately, naming it. On a timeout, the one reporting rank finds the
ranks that never arrived and those that arrived and went silent with ``check`` over blocks of 256 keys
(``rec/*`` and ``done/*``; blocks with a gap are halved until the gap is found, at most
MAX_REPORT_CHECKS checks in all), and reads the records of at most MAX_NAMED_SILENT silent ranks for their host
and pid.

After an ok or warning verdict each rank looks up the pids NVML lists on its GPU (``placement.foreign_processes``,
in the epoch's namespace: one ``check`` each, at most 32, none on a GPU of its own); with ``require_exclusive`` one
more round follows there (``procs/n``, ``procs/verdict``: 3 to 4 operations more), so that a refusal reaches every
rank.

Every store call is bounded by what is left of the deadline plus TIMEOUT_GRACE_S (``CheckedStore``: the store's
own timeout is set for each call and restored after, and a call whose server stopped answering is left behind),
and waiting is one blocking ``get``/``wait`` on the one key an outcome is written to (short polling slices would
add store operations and, with c10d's TCPStore, log lines per expired slice).
"""

from __future__ import annotations

import itertools
import logging
import os
import re
import secrets
import threading
from dataclasses import dataclass
from typing import Optional, Union

from .._core import analyze_placement
from ..deadline import GRACE_S, Deadline
from ..errors import GpuGuardError
from .foreign_processes import pid_key
from .identity import RankIdentity
from .stores import CheckedStore, Store, own_client
from .verdict import Verdict

log = logging.getLogger("gpuguard")

#: Format of everything under the namespace; bumped if the layout changes, so mixed versions never mix keys.
PROTOCOL = "v2"
#: The composer reads at most this many shared GPUs, and this many records per GPU (the report's bounds).
MAX_REPORTED_DEVICES = 16
MAX_REPORTED_RANKS_PER_DEVICE = 16
#: After the deadline a rank waits this much longer for the timeout reporter's verdict; every store call of the
#: exchange is bounded by what is left of the deadline plus this.
TIMEOUT_GRACE_S = GRACE_S
#: A failure verdict names at most this many failed ranks (each with its error's first line).
MAX_REPORTED_FAILURES = 8
#: A rank that reads a failure verdict waits at most this long for every rank to arrive, so that its message
#: names every failed rank (ranks start seconds apart on real clusters); the verdict itself is written at once.
FAILURE_GRACE_S = 5.0
#: The timeout reporter names at most this many silent ranks with their host and pid (one get each).
MAX_NAMED_SILENT = 8
#: The timeout reporter's budget of ``check`` calls for finding who is missing (blocks of BLOCK ranks, halved
#: where one has a gap); past it, the rest are counted, not named.
MAX_REPORT_CHECKS = 2048
BLOCK = 256
#: How many times a rank follows ``next`` from an epoch an earlier run left to a newer one.
MAX_MOVES = 3
#: The leader's rank.
LEADER = 0

_EPOCH = re.compile(r"[0-9a-f]{16}")


# ---- namespaces -------------------------------------------------------------------------------------------

_calls: dict[tuple[str, Optional[int]], itertools.count] = {}
_calls_lock = threading.Lock()


def key_part(text: str) -> str:
    """Escapes '/' and '%' so that a group name cannot reach into another group's keys."""
    return text.replace("%", "%25").replace("/", "%2F")


def run_namespace(group: str, run_id: Optional[str] = None, rank: Optional[int] = None) -> str:
    """The base namespace of this rank's next check for ``group`` (see the module docstring). ``run_id`` names
    the launch (``launchers.run_id``: the same on every rank of it); without it, torchrun's or SLURM's. Calls are
    counted per group and rank, so that threads of one process binding different ranks meet in one check."""
    if run_id is None:
        run_id = os.environ.get("TORCHELASTIC_RUN_ID") or (
            f"slurm-{os.environ['SLURM_JOB_ID']}.{os.environ.get('SLURM_STEP_ID', '0')}"
            if os.environ.get("SLURM_JOB_ID") else "")
    restart = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
    with _calls_lock:
        call = next(_calls.setdefault((group, rank), itertools.count()))
    return f"gpuguard/{PROTOCOL}/{key_part(group)}/{key_part(run_id)}/{key_part(restart)}/{call}"


def namespace_for(store: Store, group: str, rank: int, run_id: Optional[str] = None,
                  deadline: Optional[Deadline] = None) -> str:
    """The base namespace of this rank's next check through ``store``. A store that outlives the processes using
    it (the Ray rendezvous actor, which an actor restarted by Ray's ``max_restarts`` finds again) counts the calls
    per rank itself, so a restarted actor's next check is its peers' next check, not its own first one again
    (a per-process count would restart at 0 and read the verdict of the round it already took part in)."""
    if not getattr(store, "outlives_ranks", False):
        return run_namespace(group, run_id, rank)
    base = f"gpuguard/{PROTOCOL}/{key_part(group)}/persistent"
    call = CheckedStore(store, base, deadline, grace=TIMEOUT_GRACE_S).add(f"calls/{rank}", 1) - 1
    return f"{base}/{call}"


# ---- verdicts the exchange composes ------------------------------------------------------------------------

def publish(store: CheckedStore, key: str, verdict: Verdict) -> Verdict:
    """Writes ``verdict`` unless one is already there; returns whichever verdict won."""
    return Verdict.decode(store.compare_set(key, b"", verdict.encode()), store.key(key))


def read_verdict(store: CheckedStore, key: str) -> Verdict:
    return Verdict.decode(store.get(key), store.key(key))


def _failure_verdict(me: RankIdentity, arrived: int) -> Verdict:
    where = f"host {me.hostname}, pid {me.pid}" if me.hostname else f"pid {me.pid}"
    return Verdict("failure",
                   f"rank {me.rank} ({where}) could not bind a GPU, so every rank of group '{me.group}' stops "
                   f"here instead of waiting for it:\n  {me.failure_kind}: {me.failure_text}",
                   {"failed_rank": me.rank, "failure_kind": me.failure_kind, "host": me.hostname, "pid": me.pid,
                    "arrived_at": arrived})


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


def mark_read(ns: CheckedStore, base: CheckedStore, world_size: int) -> None:
    """Counts this rank as having read the verdict; the last one sets ``all_read`` (the store's owner waits on it
    before it exits, see :func:`hold_until_read`) and deletes ``lead``: every rank found the epoch."""
    if ns.add("read", 1) == world_size:
        ns.set("all_read", b"1")
        _retire_lead(base)


def hold_until_read(store: Store, namespace: str, deadline: Deadline) -> bool:
    """For the rank that serves the store (rank 0 as TCPStore master under env://): returns once every rank
    has read the verdict, or at the deadline. Its exit would otherwise cut off ranks still starting.
    ``namespace``: the epoch's (``Verdict.namespace``)."""
    return CheckedStore(store, namespace, deadline, grace=TIMEOUT_GRACE_S).wait_for("all_read", deadline.remaining())


def _retire_lead(base: CheckedStore) -> None:
    """Deletes ``lead`` once every rank found the epoch (best effort: a store that cannot delete keeps it, and
    the next run's ranks then recognise it as an earlier run's)."""
    try:
        base.delete("lead")
    except GpuGuardError as exc:
        log.debug("gpuguard: could not delete %s: %s", base.key("lead"), exc)


# ---- who is missing, for the timeout verdict -----------------------------------------------------------------

class _CheckBudget:
    def __init__(self, checks: int) -> None:
        self.left = checks


def _without(store: CheckedStore, prefix: str, ranks: range, budget: _CheckBudget,
             out: list[int]) -> int:
    """Appends to ``out`` the ranks in ``ranks`` whose key ``<prefix>/<rank>`` is missing: one ``check`` for the
    whole range, halved where there is a gap. Returns how many ranks were left unexamined (budget spent)."""
    if not ranks:
        return 0
    if budget.left <= 0:
        return len(ranks)
    budget.left -= 1
    if store.has(*(f"{prefix}/{r}" for r in ranks)):
        return 0
    if len(ranks) == 1:
        out.append(ranks[0])
        return 0
    middle = len(ranks) // 2
    return (_without(store, prefix, ranks[:middle], budget, out)
            + _without(store, prefix, ranks[middle:], budget, out))


@dataclass
class _Absent:
    never: list[int]  # no record: never arrived
    silent: list[int]  # a record, no done mark: arrived and went silent
    unexamined: int  # ranks the check budget did not reach


def _absent_ranks(store: CheckedStore, world_size: int) -> _Absent:
    budget = _CheckBudget(MAX_REPORT_CHECKS)
    never: list[int] = []
    not_done: list[int] = []
    unexamined = 0
    for start in range(0, world_size, BLOCK):
        block = range(start, min(start + BLOCK, world_size))
        unexamined += _without(store, "rec", block, budget, never)
    never_set = set(never)
    for start in range(0, world_size, BLOCK):
        block = range(start, min(start + BLOCK, world_size))
        unexamined += _without(store, "done", block, budget, not_done)
    return _Absent(never, [r for r in not_done if r not in never_set], unexamined)


def _format_ranks(ranks: list[int], limit: int = 32) -> str:
    shown = ", ".join(str(r) for r in ranks[:limit])
    return shown + (f" and {len(ranks) - limit} more" if len(ranks) > limit else "")


def _whole_nodes(never: list[int], per_node: int, world_size: int) -> list[tuple[int, int]]:
    """The blocks of ``per_node`` consecutive ranks (0-7, 8-15, ...) of which not one arrived: under the usual
    placement (torchrun, srun's default block distribution) each is every rank of one node."""
    if per_node < 2 or world_size % per_node or world_size == per_node:
        return []
    missing = set(never)
    return [(start, start + per_node - 1) for start in range(0, world_size, per_node)
            if all(r in missing for r in range(start, start + per_node))]


def _who(store: CheckedStore, rank: int) -> dict:
    """A rank's host and pid from its record (it arrived, so it has one)."""
    try:
        peer = RankIdentity.decode(store.get(f"rec/{rank}"))
        return {"rank": rank, "host": peer.hostname, "pid": peer.pid}
    except (ValueError, GpuGuardError):
        return {"rank": rank, "host": "", "pid": -1}


def _where(who: dict) -> str:
    return f"host {who['host'] or 'unknown'}, pid {who['pid']}"


def _timeout_verdict(store: CheckedStore, me: RankIdentity, timeout: float) -> Verdict:
    n = me.world_size
    absent = _absent_ranks(store, n)
    never, silent = absent.never, absent.silent
    arrived = n - len(never) - absent.unexamined
    finished = arrived - len(silent)
    group = f"group '{me.group}'"
    details = {"missing_ranks": sorted(never + silent)[:1024], "never_arrived": never[:1024],
               "silent_ranks": silent[:1024], "arrived": arrived, "finished": finished, "world_size": n,
               "timeout": timeout}
    if absent.unexamined:
        details["unexamined"] = absent.unexamined
    still = (" A rank that never arrived exited, crashed or hangs before gpuguard.bind() (its own log says why), "
             "was never started (check the launcher's process count), or "
             f"{_started_late(timeout, 'the others')}." if never else "")
    silent_who = [_who(store, r) for r in silent[:MAX_NAMED_SILENT]]
    if not never and not silent and not absent.unexamined:
        # every rank arrived and finished its part: the leader, who writes the verdict, went silent after that
        leader = _who(store, LEADER)
        details.update(missing_ranks=[LEADER], silent_ranks=[LEADER], silent=[dict(leader, step="composing")])
        return Verdict(
            "timeout",
            f"every rank of {group} reached gpuguard's placement check within {timeout:g} s, but rank {LEADER} "
            f"({_where(leader)}), which writes the verdict once all have arrived, went silent before writing it: "
            f"it died, was stopped (SIGSTOP, a debugger) or hangs. `ps -o stat= -p {leader['pid']}` on "
            f"{leader['host'] or 'its host'} shows T for a stopped process; its own log says why it died. Every "
            f"other rank stops here instead of hanging in NCCL.", details)
    details["silent"] = [dict(w, step="after publishing its record") for w in silent_who]
    parts = []
    if silent:
        named = "; ".join(f"{w['rank']} ({_where(w)})" for w in silent_who)
        more = len(silent) - len(silent_who)
        parts.append(f"{'rank' if len(silent) == 1 else 'ranks'} {named}{f' and {more} more' if more > 0 else ''} "
                     f"of {group} reached gpuguard's placement check and then went silent before finishing it")
    if never:
        noun = "rank" if len(never) == 1 else "ranks"
        parts.append(f"{noun} {_format_ranks(never)} of {group} did not reach gpuguard's placement check"
                     if not silent else f"{noun} {_format_ranks(never)} never arrived")
    head = ", and ".join(parts) + f" within {timeout:g} s ({arrived} of {n} arrived"
    head += f", {finished} finished)." if silent else ")."
    if absent.unexamined:
        head += f" ({absent.unexamined} ranks were not examined: too many missing to name.)"
    nodes = _whole_nodes(never, me.local_world_size, n)
    if nodes:
        details["missing_nodes"] = [list(block) for block in nodes[:64]]
        blocks = ", ".join(f"{a}-{b}" for a, b in nodes[:8])
        blocks += f" and {len(nodes) - 8} more" if len(nodes) > 8 else ""
        one = len(nodes) == 1
        head += (f" Ranks {blocks} are {'all the ranks of one node' if one else f'{len(nodes)} whole nodes'} if the "
                 f"launcher placed {me.local_world_size} consecutive ranks per node (torchrun does, and so does "
                 f"srun's default block distribution): {'that node is' if one else 'those nodes are'} then down or "
                 f"unreachable, or the launcher never started the job there (its log for "
                 f"{'that node' if one else 'them'} says which).")
    if silent:
        pids = ", ".join(f"{w['pid']} on {w['host'] or 'its host'}" for w in silent_who[:3])
        head += (f" A silent rank died, was stopped (SIGSTOP, a debugger) or hangs after it arrived: `ps -o stat= "
                 f"-p PID` shows T for a stopped process ({pids}); its own log says why it died.")
    return Verdict("timeout", f"{head}{still} Every other rank stops here instead of hanging in NCCL.", details)


def _started_late(timeout: float, than: str) -> str:
    """The cause no log shows: ranks that start further apart than the deadline (CI of 054b1f9: four ranks
    importing torch at once on a loaded node came 39 s after the fifth, whose check had 40 s)."""
    return (f"started more than {timeout:g} s after {than} (importing torch on a loaded node can take that long: "
            f"then give the check a longer deadline: bind(timeout=), init_process_group(bind_timeout=), `gpuguard "
            f"check --timeout`, or GPUGUARD_TIMEOUT under `gpuguard run` and GPUGUARD=1)")


def _no_leader_verdict(me: RankIdentity, timeout: float) -> Verdict:
    return Verdict(
        "timeout",
        f"rank {LEADER} of group '{me.group}' did not reach gpuguard's placement check within {timeout:g} s "
        f"(every check of a group begins when its rank {LEADER} opens it, so no other missing rank can be named "
        f"before it does). Rank {LEADER} exited, crashed or hangs before gpuguard.bind() (its own log says why), "
        f"was never started (check the launcher's process count), or {_started_late(timeout, 'this rank')}; "
        f"every other rank stops here instead of hanging in NCCL.",
        {"missing_ranks": [LEADER], "never_arrived": [LEADER], "silent_ranks": [], "world_size": me.world_size,
         "timeout": timeout})


# ---- the shared-GPU claims and the composition --------------------------------------------------------------

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
    """Run by the leader once every rank arrived: reads the (bounded) sample of shared GPUs and analyses it."""
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
    """Publishes ``me`` and returns the verdict every rank of the group gets (the protocol above); ``namespace``
    is the base (:func:`run_namespace`, :func:`namespace_for`). The verdict's ``namespace`` is the epoch's.

    Never raises for what the verdict reports; raises GpuGuardError only when the store itself fails. Returns
    by ``deadline`` plus at most TIMEOUT_GRACE_S (waiting for the one rank that names the missing ranks), plus
    ABANDON_AFTER_S when the store stopped answering.
    """
    with own_client(store) as client:
        base = CheckedStore(client, namespace, deadline, grace=TIMEOUT_GRACE_S)
        record = me.encode()
        if me.rank == LEADER:
            epoch: Optional[str] = _open_epoch(base)
        else:
            found = base.wait_get("lead", deadline.remaining())
            if found is None:
                return _no_leader_verdict(me, deadline.total)
            epoch = _epoch_id(found, base.key("lead"))
        for _ in range(MAX_MOVES + 1):
            assert epoch is not None
            ns = base.child(f"epoch/{epoch}")
            outcome = _take_part(base, ns, me, record, deadline)
            if isinstance(outcome, _Moved):
                epoch = outcome.to
                continue
            outcome.namespace = ns.namespace
            return outcome
        return Verdict("error", f"gpuguard's cross-rank check of group '{me.group}' was sent from one epoch to "
                                f"the next {MAX_MOVES} times under {base.key('epoch')!r}: several runs are using "
                                f"this store and group at once. Give each run a group or a store of its own.",
                       {"key": base.key("epoch")})


@dataclass
class _Moved:
    """This rank found itself in an epoch an earlier run left, and a later leader said where to go."""
    to: str


def _epoch_id(value: bytes, key: str) -> str:
    text = value.decode("ascii", "replace")
    if not _EPOCH.fullmatch(text):
        raise GpuGuardError(f"the store key {key!r} holds {value[:60]!r}, not a gpuguard epoch (16 hex digits): "
                            f"another program, or a different gpuguard version, wrote it", key=key)
    return text


def _open_epoch(base: CheckedStore) -> str:
    """The leader's new epoch, published as ``lead``; an epoch ``lead`` named before is sent on to it."""
    old = base.get("lead").decode("ascii", "replace") if base.has("lead") else ""
    epoch = secrets.token_hex(8)
    base.set("lead", epoch.encode())
    if _EPOCH.fullmatch(old):
        moved = Verdict("moved", f"this check moved to epoch {epoch}", {"to": epoch})
        base.set(f"epoch/{old}/next", epoch.encode())
        base.compare_set(f"epoch/{old}/verdict", b"", moved.encode())
    return epoch


def _redirect(base: CheckedStore, ns: CheckedStore, deadline: Deadline) -> Optional[_Moved]:
    """Waits (up to the deadline) for a later leader to say where the run moved from this earlier epoch."""
    to = ns.wait_get("next", deadline.remaining())
    return None if to is None else _Moved(_epoch_id(to, ns.key("next")))


def _fresh(base: CheckedStore, ns: CheckedStore, verdict: Verdict, me: RankIdentity, arrived: int,
           deadline: Deadline) -> Union[Verdict, _Moved]:
    """``verdict``, read in this epoch after this rank counted itself in as the ``arrived``-th, if it belongs to
    this run; else where to go. A verdict composed after all N arrived (ok, warning, duplicate, error; it carries
    N) is this run's: composed before this rank arrived, it would have made this rank count past N. A failure or timeout
    can be written before everyone arrived; one that came after this rank did is this run's too. One that came
    before is this run's unless ``lead`` names another epoch now, or, for a timeout that says this rank never
    arrived (this rank late, or an earlier run's verdict), a later leader sends this rank on before its deadline."""
    if verdict.kind == "moved":
        to = verdict.details.get("to")
        return _Moved(_epoch_id(str(to).encode(), ns.key("verdict")))
    if verdict.kind not in ("failure", "timeout"):
        if verdict.details.get("world_size", me.world_size) != me.world_size:  # an earlier run of another size
            return _redirect(base, ns, deadline) or _other_size(ns, me, verdict)
        return verdict
    if verdict.kind == "failure":
        published_after = isinstance(verdict.details.get("arrived_at"), int) and verdict.details["arrived_at"] > arrived
        if published_after or verdict.details.get("failed_rank") == me.rank:
            return verdict
    elif me.rank not in (verdict.details.get("never_arrived") or []):
        return verdict  # it saw this rank's record, written in this run
    epoch = ns.namespace.rsplit("/", 1)[-1]
    lead = base.get("lead") if base.has("lead") else None
    if lead is not None and lead.decode("ascii", "replace") != epoch:
        return _redirect(base, ns, deadline) or verdict
    if verdict.kind == "timeout":
        return _redirect(base, ns, deadline) or verdict
    return verdict


def _take_part(base: CheckedStore, ns: CheckedStore, me: RankIdentity, record: bytes,
               deadline: Deadline) -> Union[Verdict, _Moved]:
    """This rank's whole part in one epoch: arrive, claim, count in, then the verdict."""
    held = ns.compare_set(f"rec/{me.rank}", b"", record)
    if held != record:
        return _redirect(base, ns, deadline) or _slot_taken(ns, me, held)
    if me.failure_kind is not None:
        slot = ns.add("failed/n", 1) - 1
        if slot < MAX_REPORTED_FAILURES:
            ns.set(f"failed/{slot}", record)
    else:
        _claim_gpu(ns, me, record)
    arrived = ns.add("arrived", 1)
    if not 1 <= arrived <= me.world_size:  # an earlier run's epoch, or someone else's writes
        return _redirect(base, ns, deadline) or _counter_error(ns, me, arrived)
    if me.failure_kind is not None:
        verdict = publish(ns, "verdict", _failure_verdict(me, arrived))
        ns.set("wake", b"1")  # the leader stops waiting for the others
    if arrived == me.world_size:
        ns.set("all_arrived", b"1")
        if me.failure_kind is None:
            ns.set("wake", b"1")
    ns.set(f"done/{me.rank}", b"1")
    if me.failure_kind is not None:
        return _stopping(ns, base, verdict, me, deadline)
    if me.rank == LEADER:
        if ns.wait_for("wake", deadline.remaining()):
            composed = _compose(ns, me)
            composed.details["world_size"] = me.world_size  # a reader of another size knows it is not its run's
            verdict = publish(ns, "verdict", composed)
            if verdict.kind not in ("failure", "timeout"):  # composed after every rank arrived: all found it
                _retire_lead(base)
            return _stopping(ns, base, verdict, me, deadline)
    else:
        data = ns.wait_get("verdict", deadline.remaining())
        if data is not None:
            fresh = _fresh(base, ns, Verdict.decode(data, ns.key("verdict")), me, arrived, deadline)
            return fresh if isinstance(fresh, _Moved) else _stopping(ns, base, fresh, me, deadline)
    return _stopping(ns, base, _timed_out(ns, me, deadline), me, deadline)


def _claim_gpu(ns: CheckedStore, me: RankIdentity, record: bytes) -> None:
    """Claims this rank's GPU, counts its host, and says which pid on that host is this rank."""
    if not me.gpu_uuid:
        ns.set(pid_key(me.host_hash, me.pid), str(me.rank).encode())
        return
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


def _timed_out(ns: CheckedStore, me: RankIdentity, deadline: Deadline) -> Verdict:
    """At the deadline: one rank (the first to get here) names the missing ranks; the others take its verdict."""
    if ns.add("timeout", 1) == 1:
        verdict = publish(ns, "verdict", _timeout_verdict(ns, me, deadline.total))
    else:
        data = ns.wait_get("verdict", min(TIMEOUT_GRACE_S, ns.bound() or TIMEOUT_GRACE_S))
        verdict = Verdict("moved") if data is None else Verdict.decode(data, ns.key("verdict"))
    if verdict.kind != "moved":  # moved: this epoch was an earlier run's, and this run's is too late to join now
        return verdict
    arrived_now = ns.counter("arrived")
    return Verdict("timeout",
                   f"only {arrived_now} of {me.world_size} ranks of group '{me.group}' reached gpuguard's placement "
                   f"check within {deadline.total:g} s, and the rank naming the missing ones did not report back",
                   {"arrived": arrived_now, "world_size": me.world_size, "timeout": deadline.total})


def _stopping(ns: CheckedStore, base: CheckedStore, verdict: Verdict, me: RankIdentity,
              deadline: Deadline) -> Verdict:
    """The verdict as this rank returns it: a failure completed with every failed rank (after waiting briefly
    for the ranks still arriving), and a verdict that stops the job counted as read."""
    if verdict.kind == "failure":
        ns.wait_for("all_arrived", min(FAILURE_GRACE_S, deadline.remaining()))
        verdict = _with_other_failures(ns, verdict, me)
    if verdict.kind not in ("ok", "warning"):  # ranks go on to exit: the store's owner waits for all to read
        mark_read(ns, base, me.world_size)
    return verdict


def _slot_taken(ns: CheckedStore, me: RankIdentity, held: bytes) -> Verdict:
    key = ns.key(f"rec/{me.rank}")
    try:
        other = RankIdentity.decode(held)
        who = f"host {other.hostname or 'unknown'}, pid {other.pid}"
    except ValueError as exc:
        return Verdict("error", f"the identity record at store key {key!r} is malformed: {exc}. Another program, "
                                f"or a different gpuguard version, wrote it.", {"key": key})
    return Verdict("error",
                   f"rank {me.rank}'s place in gpuguard's placement check of group '{me.group}' is held by another "
                   f"process ({who}), and no later check took over within {ns.deadline.total if ns.deadline else 0:g}"
                   f" s: two processes were started as rank {me.rank} (check RANK and the launcher's process "
                   f"count), or another job uses this store and group at once (give it a group or store of its "
                   f"own).", {"key": key, "other_host": other.hostname, "other_pid": other.pid})


def _other_size(ns: CheckedStore, me: RankIdentity, verdict: Verdict) -> Verdict:
    key = ns.key("verdict")
    return Verdict("error",
                   f"the verdict at store key {key!r} is for a group of {verdict.details.get('world_size')} ranks, "
                   f"not {me.world_size}, and no later check took over: an earlier run with another world size "
                   f"left it, or the ranks disagree on WORLD_SIZE. Check the launcher's process count.",
                   {"key": key, "world_size": me.world_size})


def _counter_error(ns: CheckedStore, me: RankIdentity, arrived: int) -> Verdict:
    key = ns.key("arrived")
    return Verdict("error",
                   f"the arrival counter at store key {key!r} reads {arrived} for a group of {me.world_size} ranks: "
                   f"another program, or another job sharing this store and group, wrote to gpuguard's keys. Give "
                   f"this job a group or a store of its own.", {"key": key, "value": arrived})
