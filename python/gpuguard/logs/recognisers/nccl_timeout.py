"""PyTorch's NCCL watchdog timeouts: a hang on the first collective (transport) or a later one (the program)."""

from __future__ import annotations

import re
from typing import Optional

from ..model import MAX_RANKS, Diagnosis, Group, ranks_phrase
from ..recogniser import Example, Groups, Host, Line, Recogniser

# torch/csrc/distributed/c10d/ProcessGroupNCCL.cpp, WorkNCCL::checkTimeout and operator<<(WorkNCCL):
#   logPrefix() + "Watchdog caught collective operation timeout: " + "WorkNCCL(SeqNum=1, OpType=ALLREDUCE,
#   NumelIn=1, NumelOut=1, Timeout(ms)=600000)" + " ran for 600017 milliseconds before timing out."
# logPrefix() is "[Rank 3] ", "[PG 0 Rank 3] " or "[PG ID 0 PG GUID 0(default_pg) Rank 3] " by version;
# releases before 2.2 print "WorkNCCL(SeqNum=1, OpType=..., TensorShape=[...], Timeout(ms)=...)".
# Every repetition is bounded and the op name cannot run into what follows it, so a match costs time linear in
# the line however long (a 16 KB line of letters after "OpType=" took minutes with unbounded repeats).
_WATCHDOG = re.compile(
    r"(?:Rank (?P<rank>\d{1,9})\] )?Watchdog caught collective operation timeout: WorkNCCL\("
    r"(?:SeqNum=(?P<seq>\d{1,19}), )?OpType=(?P<op>\w{1,64}?)(?P<rest>(?:,(?:[^()]|\(ms\)){0,1024})?)\)"
    r"(?: ran for (?P<ran>\d{1,19}) milliseconds before timing out)?")
_TIMEOUT_MS = re.compile(r"Timeout\(ms\)=(?P<ms>\d{1,19})")
# Same file, watchdog loop: logPrefix() + "Timeout at NCCL work: 1, last enqueued NCCL work: 1, last completed
# NCCL work: -1."
_TIMEOUT_AT = re.compile(
    r"(?:Rank (?P<rank>\d{1,9})\] )?Timeout at NCCL work: (?P<seq>\d{1,19}), last enqueued NCCL work: "
    r"(?P<enq>-?\d{1,19}), last completed NCCL work: (?P<done>-?\d{1,19})")

HANG = "nccl_first_collective_hang"
TIMEOUT = "nccl_timeout"


class NcclTimeout(Recogniser):
    """A collective that timed out: the first one of a communicator (HANG) or a later one (TIMEOUT)."""

    kinds = (HANG, TIMEOUT)
    keywords = ("Watchdog caught collective operation timeout", "Timeout at NCCL work: ")
    patterns = (_WATCHDOG, _TIMEOUT_AT)
    help = "NCCL watchdog timeouts and first-collective hangs"
    examples = (
        # ProcessGroupNCCL.cpp's watchdog on the first collective, with c10's log header, under torch's rank prefix
        Example("[rank0]:[E1121 05:00:00.123456 ProcessGroupNCCL.cpp:683] [PG ID 0 PG GUID 0(default_pg) Rank 0] "
                "Watchdog caught collective operation timeout: WorkNCCL(SeqNum=1, OpType=ALLREDUCE, NumelIn=1, "
                "NumelOut=1, Timeout(ms)=600000) ran for 600017 milliseconds before timing out.\n",
                HANG, (0,), ("ALLREDUCE #1 on rank 0", "600 s")),
        # the watchdog loop's line: nothing ever completed
        Example("[rank1]:[E1121 05:00:00 ProcessGroupNCCL.cpp:1537] [PG 0 Rank 1] Timeout at NCCL work: 1, last "
                "enqueued NCCL work: 1, last completed NCCL work: -1.\n", HANG, (1,), ()),
        # a later collective (releases before 2.2 print "[Rank N] " and TensorShape)
        Example("[Rank 3] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=5120, OpType=BROADCAST, "
                "TensorShape=[1024], Timeout(ms)=1800000) ran for 1800321 milliseconds before timing out.\n",
                TIMEOUT, (3,), ("BROADCAST #5120 on rank 3", "1800 s")),
    )

    def read(self, line: Line, groups: Groups) -> bool:
        body, origin = line.body, line.origin
        m = _WATCHDOG.search(body)
        if m:
            seq = line.integer(m, "seq")
            said = line.integer(m, "rank")
            rank = origin.rank if origin.rank is not None else said
            # the first collective of a communicator hangs for the transport; without its number, a timeout
            first = seq is not None and seq <= 1
            group = groups(HANG if first else TIMEOUT)
            if seq is None and m.group("seq"):
                group.unreadable("the collective's sequence number")
            if rank is None and m.group("rank"):
                group.unreadable("the rank")
            group.add(line.number, body, ranks=(rank,))
            ops = group.facts.setdefault("ops", {})
            op_key = (seq, m.group("op"))
            if op_key in ops or len(ops) < 64:
                ops.setdefault(op_key, set())
                if rank is not None and len(ops[op_key]) < MAX_RANKS:
                    ops[op_key].add(rank)
            rest = m.group("rest") or ""
            t = _TIMEOUT_MS.search(body, m.start("rest"), m.end("rest")) if rest else None
            if t:
                ms = line.integer(t, "ms")
                if ms is None:
                    group.unreadable("the timeout")
                else:
                    group.facts["timeout_ms"] = ms
            return True
        m = _TIMEOUT_AT.search(body)
        if m:
            rank = origin.rank if origin.rank is not None else line.integer(m, "rank")
            seq, done = line.integer(m, "seq"), line.integer(m, "done")
            first = (seq is not None and seq <= 1) or (done is not None and done < 0)
            group = groups(HANG if first else TIMEOUT)
            if seq is None or done is None:
                group.unreadable("the collective's sequence numbers")
            group.add(line.number, body, ranks=(rank,))
            if done is not None and done < 0:
                group.facts["none_completed"] = True
            return True
        return False

    def build(self, kind: str, group: Group, host: Host) -> Diagnosis:
        return _first_collective_hang(group) if kind == HANG else _timeout(group)


def _ops_text(group: Group) -> str:
    ops: dict[tuple[Optional[int], str], set[int]] = group.facts.get("ops", {})
    parts = []
    for (seq, op), ranks in sorted(ops.items(), key=lambda kv: (kv[0][0] or 0, kv[0][1])):
        s = f"{op}" + (f" #{seq}" if seq is not None else "")
        if ranks:
            s += " on " + ranks_phrase(ranks)
        parts.append(s)
    return "; ".join(parts)


def _first_collective_hang(group: Group) -> Diagnosis:
    ranks = sorted(group.ranks)
    ops = _ops_text(group)
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
    return Diagnosis(HANG, summary, tuple(ranks), (), cause, fix, group.sorted_evidence(), group.occurrences)


def _timeout(group: Group) -> Diagnosis:
    ranks = sorted(group.ranks)
    ops = _ops_text(group)
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
    return Diagnosis(TIMEOUT, summary, tuple(ranks), (), cause, fix, group.sorted_evidence(), group.occurrences)
