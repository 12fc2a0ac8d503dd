"""Memory on a rank's GPU held by processes that are not ranks of its job (a leftover run, another user's job, a
co-located server): a warning naming each, or with ``require_exclusive`` an error that stops every rank.

Runs after the exchange's verdict, when every rank has published ``pid/<host hash>/<pid>`` (one ``set`` in
:func:`placement.exchange.exchange`): a pid NVML lists on this rank's GPU is a rank of the job exactly when its key
exists. A warning is each rank's own. With ``require_exclusive`` (which every rank of the group must pass alike)
one more round follows, so that one rank's error reaches the others at once (under the exchange's namespace,
``procs/``): a rank that refuses its GPU writes ``procs/verdict`` first (``compare_set``); the last rank to count
itself in ``procs/n`` writes "ok"; every rank waits on that one key.

Cost per rank, independent of the world size: one ``check`` per process NVML lists on its GPU besides itself
(at most MAX_LOOKED_UP) and one ``get`` for each that is a rank; with ``require_exclusive``, ``add``, ``wait`` and
``get`` of the round (and its ``compare_set`` for the last or refusing rank; ``add`` of ``procs/read`` when it
fails).
"""

from __future__ import annotations

import logging
from typing import Any, Optional

from ..deadline import GRACE_S, Deadline
from ..errors import ForeignProcessError
from ..system.processes import (UNLISTED_WORTH_SAYING_BYTES, describe_pid, format_bytes, unlisted_memory, usage_of)
from .identity import RankIdentity
from .stores import CheckedStore, Store
from .verdict import Verdict

logger = logging.getLogger("gpuguard")

#: The processes of one GPU looked up in the store (and named in a message); a GPU with more is cut there.
MAX_LOOKED_UP = 32


def pid_key(host_hash: int, pid: int) -> str:
    """The key under the exchange's namespace that says ``pid`` on that host is a rank of the job (its value:
    the rank)."""
    return f"pid/{host_hash:016x}/{pid}"


def _job_ranks(ns: Optional[CheckedStore], me: RankIdentity, pids: list[int]) -> dict[int, int]:
    """pid -> rank, for those of ``pids`` that are ranks of this job on this host."""
    found: dict[int, int] = {}
    if ns is None:
        return found
    for pid in pids[:MAX_LOOKED_UP]:
        key = pid_key(me.host_hash, pid)
        if ns.has(key):
            try:
                found[pid] = int(ns.get(key).decode("ascii"))
            except ValueError:
                found[pid] = -1
    return found


def foreign_report(me: RankIdentity, ns: Optional[CheckedStore],
                   require_exclusive: bool) -> Optional[tuple[str, list[dict[str, Any]], str]]:
    """(message, processes, fix) when this rank's GPU holds memory of processes that are not ranks of the job;
    None when it holds none, or NVML cannot say (logged at debug level)."""
    if not me.gpu_uuid:
        return None
    usage, why = usage_of(me.gpu_uuid, me.pci_bus_id)
    if usage is None:
        logger.debug("gpuguard: not checking rank %d's GPU for other processes: %s", me.rank, why)
        return None
    others = sorted((p for p in usage.processes if p.pid != me.pid), key=lambda p: -int(p.used_memory))
    ranks = _job_ranks(ns, me, [p.pid for p in others])
    foreign = [p for p in others if p.pid not in ranks][:MAX_LOOKED_UP]
    unlisted = unlisted_memory(usage)
    if not foreign and unlisted < UNLISTED_WORTH_SAYING_BYTES:
        return None
    processes: list[dict[str, Any]] = []
    lines: list[str] = []
    for p in foreign:
        view = describe_pid(p.pid)
        held = int(p.used_memory)
        processes.append({"pid": p.pid, "bytes": held if held >= 0 else None, "description": view.describe(),
                          "visible": view.visible})
        lines.append(f"  pid {p.pid}: {format_bytes(held)} ({view.describe()})")
    if unlisted >= UNLISTED_WORTH_SAYING_BYTES:
        lines.append(f"  {format_bytes(unlisted)} in use under no process NVML lists (a process of another "
                     f"container, on drivers that leave those out of this namespace's list)")
    where = f"cuda:{me.gpu_index} ({me.gpu_uuid}) on host {me.hostname}" if me.gpu_index >= 0 else me.gpu_uuid
    free = format_bytes(int(usage.free_memory))
    total = format_bytes(int(usage.total_memory))
    visible = [p for p in processes if p["visible"]]
    stop = (f"if {'it is' if len(visible) == 1 else 'they are'} left over from an earlier run of yours, end "
            f"{'it' if len(visible) == 1 else 'them'} (kill {' '.join(str(p['pid']) for p in visible)}); "
            if visible else "")
    fix = (f"Fix: {stop}otherwise run this rank on a GPU nobody else uses (CUDA_VISIBLE_DEVICES, or ask the "
           f"scheduler for whole GPUs)" + ("" if require_exclusive else
                                           ", or pass require_exclusive=True to bind() to refuse such a GPU") + ".")
    n = len(foreign)
    whose = (f"memory of {n} process{'es' if n != 1 else ''} that {'are not ranks' if n != 1 else 'is not a rank'} "
             f"of this job" if foreign else "memory that no rank of this job uses")
    message = (f"rank {me.rank} is bound to {where}, which already holds {whose} ({free} of {total} free):\n"
               + "\n".join(lines) +
               "\nThat memory is not this rank's to use: it may run out of memory, and it shares the GPU's "
               f"compute with them.\n{fix}")
    return message, processes, fix


def check_gpu_processes(store: Optional[Store], me: RankIdentity, *, namespace: str, deadline: Deadline,
                        require_exclusive: bool) -> Optional[Verdict]:
    """Warns (or, with ``require_exclusive``, raises ForeignProcessError on every rank) when a rank's GPU holds
    memory of processes outside the job. ``store`` None: a job of one process (every other process is foreign).
    ``namespace``: where the exchange took place (``Verdict.namespace``: its epoch), which holds the pid keys.
    Returns the round's verdict (None without a store); raises GpuGuardError when the store fails."""
    ns = CheckedStore(store, namespace, deadline, grace=GRACE_S) if store is not None else None
    report = foreign_report(me, ns, require_exclusive)
    failure: Optional[Verdict] = None
    if report is not None:
        message, processes, fix = report
        if not require_exclusive:
            logger.warning("gpuguard: %s", message)
        else:
            failure = Verdict("failure", message, {"failed_rank": me.rank, "failure_kind": "ForeignProcessError",
                                                   "uuid": me.gpu_uuid, "processes": processes, "fix": fix})
    if ns is None:
        if failure is not None:
            _raise(failure, me)
        return None
    if not require_exclusive:  # a warning is this rank's own: no round, nothing more on the store
        return None
    rounds = ns.child("procs")
    if failure is not None:
        publish(rounds, "verdict", failure)
    if rounds.add("n", 1) == me.world_size:
        publish(rounds, "verdict", Verdict("ok"))
    if not rounds.wait_for("verdict", max(deadline.remaining(), 0.0)):
        logger.warning("gpuguard: rank %d did not hear within the deadline whether every rank's GPU is free of "
                       "other processes (a rank exited after the placement check); going on", me.rank)
        return None
    verdict = read_verdict(rounds, "verdict")
    if verdict.kind == "failure":
        if rounds.add("read", 1) == me.world_size:
            rounds.set("all_read", b"1")
        _raise(verdict, me)
    return verdict


def publish(store: CheckedStore, key: str, verdict: Verdict) -> Verdict:
    """Writes ``verdict`` unless one is there already; returns whichever won (as the exchange's verdict)."""
    return Verdict.decode(store.compare_set(key, b"", verdict.encode()), store.key(key))


def read_verdict(store: CheckedStore, key: str) -> Verdict:
    return Verdict.decode(store.get(key), store.key(key))


def hold_until_read(store: Store, namespace: str, deadline: Deadline) -> bool:
    """For the rank that serves the store: returns once every rank read a failing verdict of the round."""
    return CheckedStore(store, namespace, deadline, grace=GRACE_S).child("procs").wait_for(
        "all_read", max(deadline.remaining(), 0.0))


def _raise(verdict: Verdict, me: RankIdentity) -> None:
    failed = verdict.details.get("failed_rank")
    message = verdict.message
    if failed != me.rank:
        message = (f"rank {failed}'s GPU holds memory of processes outside this job and the job asked for whole "
                   f"GPUs (require_exclusive=True), so every rank stops here:\n{message}")
    raise ForeignProcessError(message, fix=str(verdict.details.get("fix", "")), rank=me.rank,
                              failed_rank=failed, uuid=verdict.details.get("uuid"),
                              processes=verdict.details.get("processes", []))


__all__ = ["check_gpu_processes", "foreign_report", "hold_until_read", "pid_key"]
