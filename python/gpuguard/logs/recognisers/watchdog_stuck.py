"""PyTorch's NCCL heartbeat monitor: the watchdog thread itself stopped making progress (a hang below Python)."""

from __future__ import annotations

import re

from ..model import Diagnosis, Group
from ..recogniser import Example, Groups, Host, Line, Recogniser

# torch/csrc/distributed/c10d/ProcessGroupNCCL.cpp (HeartbeatMonitor::runLoop; handleStall in newer releases):
#   logPrefix() + "ProcessGroupNCCL's watchdog got stuck for " + heartbeatTimeoutInSec_ + " seconds without making
#   progress in monitoring enqueued collectives. This typically indicates a NCCL/CUDA API (e.g., CudaEventDestroy)
#   hang blocking the watchdog, ..." (TORCH_NCCL_HEARTBEAT_TIMEOUT_SEC, default 480 s)
# Releases 2.2-2.3 print first: logPrefix() + "Heartbeat monitor timed out! Process will be terminated after dumping
# debug info. workMetaList_.size()=" + N.
_STUCK = re.compile(r"(?:Rank (?P<rank>\d{1,9})\] )?ProcessGroup\w{0,16}'s watchdog got stuck for (?P<s>\d{1,9}) seconds")
_MONITOR = re.compile(r"(?:Rank (?P<rank>\d{1,9})\] )?Heartbeat monitor timed out!(?: Process will be terminated)?")

KIND = "nccl_watchdog_stuck"


class WatchdogStuck(Recogniser):
    """The watchdog that checks collectives for timeouts was itself blocked for the heartbeat timeout."""

    kinds = (KIND,)
    keywords = ("watchdog got stuck for", "Heartbeat monitor timed out")
    patterns = (_STUCK, _MONITOR)
    help = "PyTorch's 'watchdog got stuck' heartbeat"
    examples = (
        # ProcessGroupNCCL.cpp's heartbeat monitor, as a job under torchrun printed it (c10's log header kept)
        Example("[rank1]:[E1111 17:10:53.123456 4242 ProcessGroupNCCL.cpp:1577] [PG ID 0 PG GUID 0(default_pg) Rank "
                "1] ProcessGroupNCCL's watchdog got stuck for 480 seconds without making progress in monitoring "
                "enqueued collectives. This typically indicates a NCCL/CUDA API (e.g., CudaEventDestroy) hang "
                "blocking the watchdog.\n", KIND, (1,), ("on rank 1 for 480 s",)),
    )

    def read(self, line: Line, groups: Groups) -> bool:
        m = _STUCK.search(line.body) or _MONITOR.search(line.body)
        if not m:
            return False
        group = groups(KIND)
        said = line.integer(m, "rank")
        if said is None and m.group("rank"):
            group.unreadable("the rank")
        rank = line.origin.rank if line.origin.rank is not None else said
        group.add(line.number, line.body, ranks=(rank,))
        group.source(line.origin)
        if "s" in m.groupdict() and m.group("s"):
            seconds = line.integer(m, "s")
            if seconds is None:
                group.unreadable("how long it was stuck")
            else:
                group.facts["seconds"] = seconds
        return True

    def build(self, kind: str, group: Group, host: Host) -> Diagnosis:
        seconds = group.facts.get("seconds")
        summary = (f"PyTorch's NCCL watchdog stopped making progress{group.who()}" +
                   (f" for {seconds} s" if seconds else "") + ": the process hung below Python, and PyTorch "
                   "aborts it.")
        cause = ("The watchdog thread checks every collective for its timeout; the heartbeat monitor found that "
                 "thread itself blocked for TORCH_NCCL_HEARTBEAT_TIMEOUT_SEC. It is stuck in a CUDA or NCCL call "
                 "(a hung kernel or collective, a CUDA call waiting for a GPU that no longer answers), or waiting "
                 "for the GIL that another thread holds inside a CUDA call. Ranks printing this are hung, not slow: "
                 "look at the collective each was in, and at any rank that printed a watchdog timeout or died "
                 "earlier.")
        fix = ("Before the abort, dump the stacks of a hung rank with py-spy dump --native --pid <pid> (Python and "
               "C++ frames: the blocking CUDA/NCCL call shows). TORCH_NCCL_TRACE_BUFFER_SIZE=2000 with "
               "TORCH_NCCL_DUMP_ON_TIMEOUT=1 records the last collectives of every rank (analyse with "
               "torchfrtrace). If the watchdog is only slow, not stuck (a long legitimate wait), raise "
               "TORCH_NCCL_HEARTBEAT_TIMEOUT_SEC; TORCH_NCCL_ENABLE_MONITORING=0 turns the monitor off.")
        return Diagnosis(kind, summary, tuple(sorted(group.ranks)), (), cause, fix, group.sorted_evidence(),
                         group.occurrences)
