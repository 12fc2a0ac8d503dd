"""bind(verify_nccl=True): the ranks form a real NCCL communicator of their group, then run one small all-reduce
on a second one, under the call's deadline; when that hangs, they try again with NCCL_P2P_DISABLE=1 and say whether
it cures it.

Rank 0's ``ncclGetUniqueId`` goes to the others through the same store and namespace as the placement check
(``<namespace>/nccl/...``, the all-reduce's under ``<namespace>/nccl/all_reduce/...``); each rank's failure is collected with O(1) store operations, and the last rank to
finish writes one verdict every rank reads. NCCL reads NCCL_P2P_DISABLE once per process, so the retry runs
in a child process per rank (``python -m gpuguard.probes.child nccl``, as ``gpuguard doctor --nccl`` does),
rank 0's child's unique id handed to the others through the store (``<namespace>/nccl/all_reduce/retry/...``).
"""

from __future__ import annotations

import json
import os
import time
from typing import Any, Optional

from ..system.nccl_library import nccl_probe, nccl_status, nccl_unique_id
from ..deadline import Deadline
from ..logs.recognisers.duplicate_gpu import DuplicateGpu
from .exchange import MAX_REPORTED_DEVICES, TIMEOUT_GRACE_S, publish, read_verdict
from .identity import RankIdentity
from .stores import CheckedStore, Store
from .verdict import Verdict

#: Bounds on what a rank reads of a peer's failure report (untrusted bytes).
MAX_FAILURE_REPORT_BYTES = 16384


#: The fix the duplicate verdict names (its error's ``fix``).
DUPLICATE_FIX = "give every rank of the group its own GPU (see gpuguard.bind()'s placement report)."


def _names_a_duplicate(texts: str) -> bool:
    """Whether NCCL's own words say two ranks share a GPU: the duplicate-GPU recogniser's patterns decide, not a
    substring. Only that recogniser is loaded (not the explainer and every other one), and the texts are NCCL's and
    the probe's own lines, never a paste, so each line is matched as it is."""
    return any(pattern.search(line) for line in texts.splitlines() for pattern in DuplicateGpu.patterns)


def _verdict_from(failures: list[dict[str, Any]], failed_total: int, me: RankIdentity, timeout: float) -> Verdict:
    if failed_total == 0:
        return Verdict("ok")
    lines = [f"  rank {f['rank']} ({f['host']}): {f['verdict']} at {f['stage']}: {f['message']}" for f in failures]
    if failed_total > len(failures):
        lines.append(f"  ... and {failed_total - len(failures)} more ranks")
    texts = "\n".join(f.get("last_error", "") + "\n" + f.get("message", "") for f in failures)
    details = {"failed_ranks": [f["rank"] for f in failures], "failed_total": failed_total,
               "nccl_errors": [f.get("last_error", "") for f in failures]}
    if _names_a_duplicate(texts):
        return Verdict("duplicate",
                       f"NCCL refused to form a communicator for group '{me.group}': two ranks share a GPU "
                       f"({failed_total} of {me.world_size} ranks failed):\n" + "\n".join(lines) +
                       "\nFix: " + DUPLICATE_FIX, dict(details, fix=DUPLICATE_FIX))
    if all(f["verdict"] == "timed out" for f in failures):
        in_all_reduce = all(f["stage"] in ALL_REDUCE_STAGES for f in failures)
        what = (f"NCCL formed a communicator for group '{me.group}' but its first all-reduce did not complete "
                f"within {timeout:g} s" if in_all_reduce else
                f"NCCL did not form a communicator for group '{me.group}' within {timeout:g} s")
        return Verdict("timeout",
                       f"{what} on "
                       f"{failed_total} of {me.world_size} ranks; gpuguard aborted it (ncclCommAbort):\n" +
                       "\n".join(lines) + "\nLikely cause: the ranks cannot reach each other (network "
                       "interfaces: NCCL_SOCKET_IFNAME; firewalls) or GPU peer-to-peer is broken; run "
                       "`gpuguard doctor --nccl` on one node to tell which.", dict(details, aborted=True))
    return Verdict("error", f"NCCL failed to form a communicator for group '{me.group}' ({failed_total} of "
                            f"{me.world_size} ranks failed):\n" + "\n".join(lines), details)


#: the nccl_probe stages after the communicator formed
ALL_REDUCE_STAGES = ("ncclAllReduce", "synchronize", "check all-reduce result")
#: a retry without P2P starts one process per rank: with less of the deadline left than this it is not tried
MIN_RETRY_S = 5.0

P2P_DISABLE_COST = ("NCCL then moves data between the GPUs of a node through host memory instead of directly, so "
                    "intra-node collectives lose bandwidth (users report steps 7-10 % slower, more for "
                    "communication-bound jobs)")


def _p2p_user_disabled() -> bool:
    return os.environ.get("NCCL_P2P_DISABLE", "") not in ("", "0")


def _first_try_share(deadline: Deadline) -> float:
    """The first attempt gets about half of what is left when a retry without P2P fits in the rest."""
    left = deadline.remaining()
    return left / 2 if not _p2p_user_disabled() and left >= 2 * MIN_RETRY_S else max(0.1, left)


def _retry_without_p2p(ns: CheckedStore, me: RankIdentity, deadline: Deadline) -> Verdict:
    """Every rank runs the same all-reduce again in a child process with NCCL_P2P_DISABLE=1; one verdict."""
    from ..probes.run import Child, child_env, probe_command

    budget = max(1.0, deadline.remaining())
    end = time.monotonic() + budget
    child = Child(probe_command("nccl", "--rank", str(me.rank), "--nranks", str(me.world_size), "--device",
                                str(me.gpu_index), "--timeout", f"{budget:g}"),
                  child_env(NCCL_P2P_DISABLE="1"), stdin=me.rank > 0)
    try:
        if me.rank == 0:
            first = child.wait_for_event("unique_id", end)
            ns.set("retry/id", str(first["hex"]).encode() if first else b"")
        elif ns.wait_for("retry/id", max(0.1, end - time.monotonic())):
            unique_id = ns.get("retry/id").decode("ascii", "replace")
            if unique_id:
                child.send(unique_id)
        child.wait(end)
    finally:
        if child.proc.poll() is None:
            child.wait(time.monotonic())  # kills it
    results = child.events_of("result")
    ok = bool(results and results[0].get("ok"))
    if not ok:
        ns.add("retry/failed/n", 1)
    if ns.add("retry/done", 1) == me.world_size:
        failed = ns.counter("retry/failed/n")
        return publish(ns, "retry/verdict", Verdict("ok") if failed == 0 else Verdict(
            "error", f"{failed} of {me.world_size} ranks did not complete it", {"failed_total": failed}))
    if ns.wait_for("retry/verdict", max(0.0, end - time.monotonic()) + TIMEOUT_GRACE_S):
        return read_verdict(ns, "retry/verdict")
    return Verdict("timeout", f"only {ns.counter('retry/done')} of {me.world_size} ranks finished in time")


def _after_a_hang(ns: CheckedStore, me: RankIdentity, first: Verdict, deadline: Deadline) -> Verdict:
    """The verdict when the first all-reduce hung: retried without P2P, the finding says whether that cured it."""
    where = f"the first all-reduce on the NCCL communicator of group '{me.group}' ({me.world_size} ranks)"
    if _p2p_user_disabled():
        return Verdict("timeout", first.message + "\nNCCL_P2P_DISABLE is already set, so GPU peer-to-peer is not "
                                  "the cause: look at the network between the ranks (NCCL_SOCKET_IFNAME, "
                                  "firewalls; NCCL_DEBUG=INFO shows the transport).", first.details)
    if not first.details.get("retry_without_p2p"):
        return Verdict("timeout", first.message + f"\ngpuguard did not try again with NCCL_P2P_DISABLE=1: less than "
                                  f"{MIN_RETRY_S:g} s of the deadline was left (give a longer timeout, or run "
                                  "`gpuguard doctor --p2p --nccl` on one node).", first.details)
    retry = _retry_without_p2p(ns, me, deadline)
    details = dict(first.details, p2p_retry=retry.kind)
    if retry.kind == "ok":
        return Verdict("error", f"NCCL hangs with GPU peer-to-peer enabled and works without it: {where} did not "
                                f"complete within the deadline with P2P enabled and completed with "
                                f"NCCL_P2P_DISABLE=1, so peer-to-peer between this job's GPUs is broken.\n" +
                                "\n".join(l for l in first.message.splitlines() if l.startswith("  rank ")) +
                                f"\nFix: export NCCL_P2P_DISABLE=1 for this job ({P2P_DISABLE_COST}). The lasting fix "
                                "is the machine's: disable PCIe ACS / set the IOMMU to passthrough, then check with "
                                "`gpuguard doctor --p2p --nccl`.", dict(details, p2p_cures=True))
    return Verdict("timeout", first.message + f"\nTried again with NCCL_P2P_DISABLE=1: {retry.kind} "
                              f"({retry.message or 'no detail'}), so disabling P2P is not the cure here; run "
                              "`gpuguard doctor --p2p --nccl` on one node, and check the network between the ranks.",
                   dict(details, p2p_cures=False))


def _read_failure(raw: bytes) -> dict[str, Any]:
    try:
        f = json.loads(raw.decode("utf-8")) if len(raw) < MAX_FAILURE_REPORT_BYTES else None
    except (UnicodeDecodeError, ValueError):
        f = None
    if not isinstance(f, dict) or not all(isinstance(f.get(k), str) for k in ("host", "verdict", "stage", "message")):
        f = {"rank": -1, "host": "?", "verdict": "failed", "stage": "?", "message": "malformed report",
             "last_error": ""}
    return f


def _unique_id(ns: Optional[CheckedStore], me: RankIdentity, deadline: Deadline) -> "bytes | Verdict":
    """Rank 0 makes the unique id and publishes it; the others wait for it until the deadline."""
    if me.rank == 0:
        try:
            unique_id = nccl_unique_id()
        except RuntimeError as exc:
            status = nccl_status()
            message = f"rank 0 could not get an NCCL unique id: {exc}" + (
                f" ({status.reason})" if status.reason else "")
            verdict = Verdict("error", message, {"rank": 0})
            if ns is None:
                return verdict
            ns.set("id", b"")
            return publish(ns, "verdict", verdict)
        if ns is not None:
            ns.set("id", unique_id)
        return unique_id
    assert ns is not None
    if not ns.wait_for("id", deadline.remaining()):
        return Verdict("timeout", f"rank 0 did not publish an NCCL unique id within {deadline.total:g} s",
                       {"rank": me.rank})
    unique_id = ns.get("id")
    if unique_id == b"":  # rank 0 failed; its verdict says why
        return read_verdict(ns, "verdict")
    if len(unique_id) != 128:
        return Verdict("error", f"the NCCL unique id at {ns.key('id')!r} is {len(unique_id)} bytes, not 128",
                       {"key": ns.key("id")})
    return unique_id


def _attempt(ns: Optional[CheckedStore], me: RankIdentity, deadline: Deadline, *, all_reduce: bool,
             probe_timeout: float) -> Optional[Verdict]:
    """One communicator of the group (and, with all_reduce, one all-reduce on it) on every rank; one verdict for
    all, or None when it did not come within the deadline plus TIMEOUT_GRACE_S (the caller says so)."""
    unique_id = _unique_id(ns, me, deadline)
    if isinstance(unique_id, Verdict):
        return unique_id
    mine: Optional[dict[str, Any]]
    if me.gpu_uuid:
        outcome = nccl_probe(me.world_size, me.rank, unique_id, me.gpu_index, probe_timeout, all_reduce)
        mine = None if outcome.ok else {
            "rank": me.rank, "host": me.hostname, "verdict": outcome.verdict, "stage": outcome.stage,
            "message": (outcome.error.message if outcome.error else "")[:2000],
            "last_error": outcome.last_error[:1000]}
    else:  # still take part, so that the others learn why instead of waiting for this rank in NCCL
        mine = {"rank": me.rank, "host": me.hostname, "verdict": "failed", "stage": "bind", "last_error": "",
                "message": "verify_nccl=True needs a GPU on every rank; this rank has none (bind() fell back to "
                           "the CPU)"}
    if ns is None:
        return _verdict_from([mine] if mine else [], 1 if mine else 0, me, deadline.total)
    if mine is not None:
        index = ns.add("failed/n", 1) - 1
        ns.set(f"failed/{index}", json.dumps(mine).encode())
    if ns.add("done", 1) == me.world_size:
        failed_total = ns.counter("failed/n")
        failures = [_read_failure(ns.get(f"failed/{i}")) for i in range(min(failed_total, MAX_REPORTED_DEVICES))]
        failures.sort(key=lambda f: f["rank"] if isinstance(f.get("rank"), int) else -1)
        verdict = _verdict_from(failures, failed_total, me, probe_timeout if all_reduce else deadline.total)
        if all_reduce and verdict.kind == "timeout" and verdict.details.get("aborted"):  # one decision for all
            verdict.details["retry_without_p2p"] = not _p2p_user_disabled() and deadline.remaining() >= MIN_RETRY_S
        return publish(ns, "verdict", verdict)
    # Every rank's probe ends by the deadline (NCCL is aborted then), so the grace covers the slowest.
    if ns.wait_for("verdict", deadline.remaining() + TIMEOUT_GRACE_S):
        return read_verdict(ns, "verdict")
    return None


def verify_nccl_across_ranks(store: Optional[Store], me: RankIdentity, *, namespace: str,
                             deadline: Deadline) -> Verdict:
    """Forms a real NCCL communicator of the group (rank 0's unique id through the store); then, on a second
    one, runs one small all-reduce, and on a hang tries that again with NCCL_P2P_DISABLE=1. Forming first keeps
    NCCL's own refusals (a shared GPU) fast: a rank whose peer failed at init would otherwise wait in the
    all-reduce until the deadline. Returns by ``deadline`` plus twice TIMEOUT_GRACE_S."""
    # every store call bounded like the waits here: the deadline plus twice the grace (this function's promise)
    ns = CheckedStore(store, f"{namespace}/nccl", deadline, grace=2 * TIMEOUT_GRACE_S) if store is not None else None
    verdict = _attempt(ns, me, deadline, all_reduce=False, probe_timeout=max(0.1, deadline.remaining()))
    if verdict is not None and verdict.kind == "ok":
        ar = ns.child("all_reduce") if ns is not None else None
        verdict = _attempt(ar, me, deadline, all_reduce=True, probe_timeout=_first_try_share(deadline))
        if verdict is not None and verdict.kind == "timeout" and verdict.details.get("aborted") and ar is not None:
            return _after_a_hang(ar, me, verdict, deadline)
    if verdict is not None:
        return verdict
    assert ns is not None
    done = ns.counter("done")
    return Verdict("timeout", f"only {done} of {me.world_size} ranks finished the NCCL probe of group "
                              f"'{me.group}' within {deadline.total:g} s", {"done": done, "world_size": me.world_size})
