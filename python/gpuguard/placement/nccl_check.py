"""bind(verify_nccl=True): the ranks form a real NCCL communicator of their group under the call's deadline.

Rank 0's ``ncclGetUniqueId`` goes to the others through the same store and namespace as the placement check
(``<namespace>/nccl/...``); each rank's failure is collected with O(1) store operations, and the last rank to
finish writes one verdict every rank reads.
"""

from __future__ import annotations

import json
from typing import Any, Optional

from .. import _C
from ..deadline import Deadline
from ..explain import kinds_in
from .exchange import MAX_REPORTED_DEVICES, TIMEOUT_GRACE_S, publish, read_verdict
from .identity import RankIdentity
from .stores import CheckedStore, Store
from .verdict import Verdict

#: Bounds on what a rank reads of a peer's failure report (untrusted bytes).
MAX_FAILURE_REPORT_BYTES = 16384


#: The fix the duplicate verdict names (its error's ``fix``).
DUPLICATE_FIX = "give every rank of the group its own GPU (see gpuguard.bind()'s placement report)."


def _names_a_duplicate(texts: str) -> bool:
    """Whether NCCL's own words say two ranks share a GPU: explain's recogniser decides, not a substring."""
    return "duplicate_gpu" in kinds_in(texts)


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
        return Verdict("timeout",
                       f"NCCL did not form a communicator for group '{me.group}' within {timeout:g} s on "
                       f"{failed_total} of {me.world_size} ranks; gpuguard aborted it (ncclCommAbort):\n" +
                       "\n".join(lines) + "\nLikely cause: the ranks cannot reach each other (network "
                       "interfaces: NCCL_SOCKET_IFNAME; firewalls) or GPU peer-to-peer is broken; run "
                       "`gpuguard doctor --nccl` on one node to tell which.", dict(details, aborted=True))
    return Verdict("error", f"NCCL failed to form a communicator for group '{me.group}' ({failed_total} of "
                            f"{me.world_size} ranks failed):\n" + "\n".join(lines), details)


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
            unique_id = _C.nccl_unique_id()
        except RuntimeError as exc:
            status = _C.nccl_status()
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


def verify_nccl_across_ranks(store: Optional[Store], me: RankIdentity, *, namespace: str,
                             deadline: Deadline) -> Verdict:
    """Forms a real NCCL communicator of the group (rank 0's unique id through the store) by ``deadline``;
    returns by ``deadline`` plus TIMEOUT_GRACE_S."""
    ns = CheckedStore(store, f"{namespace}/nccl") if store is not None else None
    unique_id = _unique_id(ns, me, deadline)
    if isinstance(unique_id, Verdict):
        return unique_id
    mine: Optional[dict[str, Any]]
    if me.gpu_uuid:
        outcome = _C.nccl_probe(me.world_size, me.rank, unique_id, me.gpu_index, max(0.1, deadline.remaining()),
                                False)
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
        return publish(ns, "verdict", _verdict_from(failures, failed_total, me, deadline.total))
    # Every rank's probe ends by the deadline (NCCL is aborted then), so the grace covers the slowest.
    if ns.wait_for("verdict", deadline.remaining() + TIMEOUT_GRACE_S):
        return read_verdict(ns, "verdict")
    done = ns.counter("done")
    return Verdict("timeout", f"only {done} of {me.world_size} ranks finished the NCCL probe of group "
                              f"'{me.group}' within {deadline.total:g} s", {"done": done, "world_size": me.world_size})
