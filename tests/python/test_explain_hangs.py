"""explain on what hung jobs print (issue 13): PyTorch's watchdog heartbeat, NCCL RAS (text, JSON, monitor mode) and
its 2.31 diagnostics, the flight recorder and torchfrtrace, gpuguard's own stall JSON, messages wrapped across lines,
and torch's newer device-mismatch wording. Every sample is a published text, its source cited beside it."""

from __future__ import annotations

import json

import pytest

from gpuguard.logs import explain

pytestmark = pytest.mark.version_independent  # CI runs this file on the oldest corner only (pyproject's markers)


def one(found, kind):
    matching = [d for d in found if d.kind == kind]
    assert len(matching) == 1, [d.kind for d in found]
    return matching[0]


# torch/csrc/distributed/c10d/ProcessGroupNCCL.cpp (HeartbeatMonitor / handleStall): logPrefix() +
# "ProcessGroupNCCL's watchdog got stuck for " + heartbeatTimeoutInSec_ + " seconds without making progress in
# monitoring enqueued collectives. This typically indicates a NCCL/CUDA API (e.g., CudaEventDestroy) hang blocking
# the watchdog, ..."; as a job printed it under torchrun (an NCCL timeout debug report, 2025-11-11: "[rank1]:[E1111
# 17:10:53] ProcessGroupNCCL's watchdog got stuck for 480 seconds without making progress").
HEARTBEAT = (
    "[rank1]:[E1111 17:10:53.123456 4242 ProcessGroupNCCL.cpp:1577] [PG ID 0 PG GUID 0(default_pg) Rank 1] "
    "ProcessGroupNCCL's watchdog got stuck for 480 seconds without making progress in monitoring enqueued "
    "collectives. This typically indicates a NCCL/CUDA API (e.g., CudaEventDestroy) hang blocking the watchdog, and "
    "could be triggered by another thread holding the GIL inside a CUDA api (for example, CudaEventDestroy), or other "
    "deadlock-prone behaviors.If you suspect the watchdog is not actually stuck and a longer timeout would help, you "
    "can either increase the timeout (TORCH_NCCL_HEARTBEAT_TIMEOUT_SEC) to a larger value or disable the heartbeat "
    "monitor (TORCH_NCCL_ENABLE_MONITORING=0).\n")


def test_watchdog_heartbeat_says_the_process_hung_below_python_and_how_to_see_where():
    d = one(explain(HEARTBEAT, match_local=False), "nccl_watchdog_stuck")
    assert d.ranks == (1,)
    assert d.summary == ("PyTorch's NCCL watchdog stopped making progress on rank 1 for 480 s: the process hung below "
                         "Python, and PyTorch aborts it.")
    assert "py-spy dump --native --pid" in d.fix and "TORCH_NCCL_HEARTBEAT_TIMEOUT_SEC" in d.fix


# The NCCL User Guide, Troubleshooting > RAS (docs/troubleshooting/ras.rst), "an invocation right after artificially
# creating a problem with one of the job processes" and, 60 s later, the process declared dead.
RAS_INCOMPLETE = """\
Communicators... (2.05s)
=============

Group     Comms     Nodes     Ranks     Ranks     Ranks    Status  Errors
    #  in group  per comm  per node  per comm  in group
    0         1         4       7-8        32        32   RUNNING  INCOMPLETE

Errors
======

DEAD
  1 job process is considered dead (unreachable via the RAS network)
  Process 3487984 on node 172.16.64.213 managing GPU 5

#0-0 (cf264af53edbe986) INCOMPLETE
  Missing communicator data from 1 rank
  The missing rank: 21

Warnings
========

TIMEOUT
  Encountered 2 communication timeouts while gathering communicator data
"""

# Same page: the Warnings section of a communicator whose ranks launched different numbers of collectives.
RAS_MISMATCH = """\
Warnings
========

#0-0 (27a079b828ff1a75) MISMATCH
  Communicator ranks have different collective operation counts
  26 ranks have launched up to operation 6650
  6 ranks have launched up to operation 6649
  Rank 0 -- GPU 0 managed by process 483072 on node 172.16.64.210
  Rank 2 -- GPU 2 managed by process 483074 on node 172.16.64.210
  Rank 3 -- GPU 3 managed by process 483075 on node 172.16.64.210
  Rank 4 -- GPU 4 managed by process 483076 on node 172.16.64.210
  Rank 5 -- GPU 5 managed by process 483077 on node 172.16.64.210
  Rank 7 -- GPU 7 managed by process 483079 on node 172.16.64.210
"""

# Same page, "JSON Output" (NCCL 2.28.7+, ncclras -f json), the sample as published.
RAS_JSON = """\
{
  "nccl_version": "2.29.1",
  "cuda_runtime_version": 13000,
  "cuda_driver_version": 13000,
  "timestamp": "2025-12-19 13:06:53",
  "communicators_count": 1,
  "communicators": [
    {
      "hash": "0xae94423cfbb2ef4a",
      "secondary_hash": "0xb7e7187447156001:0xb8242ed28a71381e",
      "size": 2,
      "ranks_count": 1,
      "missing_ranks_count": 1,
      "ranks": [
        {
          "rank": 0,
          "host": "172.16.64.245",
          "pid": 1524344,
          "cuda_dev": 0,
          "nvml_dev": 0,
          "status": {
            "init_state": 0,
            "async_error": 0,
            "finalize_called": false,
            "destroy_flag": false,
            "abort_flag": false
          },
          "collective_counts": {
            "Broadcast": 0,
            "Reduce": 0,
            "AllGather": 0,
            "ReduceScatter": 0,
            "AllReduce": 0
          }
        }
      ],
      "missing_ranks": [
        {
          "rank": 1,
          "host": "172.16.64.245",
          "pid": 1524345,
          "cuda_dev": 1,
          "nvml_dev": 1,
          "status": {
            "unresponsive": true,
            "considered_dead": false
          }
        }
      ]
    }
  ],
  "ras": {
    "collection_time_sec": 0.000,
    "timeouts_count": 0
  }
}
"""

# Same page, "Monitoring Mode" (NCCL 2.29+, ncclras -m).
RAS_MONITOR = "[2025-12-19 13:07:07] PEER_DEAD: Process 1524345 on node 172.16.64.245 managing GPU 1\n"


def test_ncclras_text_names_the_missing_rank_and_the_dead_process():
    d = one(explain(RAS_INCOMPLETE, match_local=False), "nccl_ras_missing")
    assert d.ranks == (21,)
    assert d.summary == ("NCCL's RAS is missing rank 21 of a communicator; 1 process(es) considered dead "
                         "(unreachable for 60 s).")
    assert d.devices == ("process 3487984 on 172.16.64.213 (GPU 5)",)
    assert "py-spy dump --native --pid PID" in d.fix


def test_ncclras_mismatch_names_the_ranks_behind_and_the_counts():
    d = one(explain(RAS_MISMATCH, match_local=False), "nccl_ras_behind")
    assert d.ranks == (0, 2, 3, 4, 5, 7)
    assert d.summary.startswith("Ranks of one NCCL communicator have launched different numbers of collectives "
                                "(26 rank(s) at operation 6650, 6 rank(s) at operation 6649); behind: ranks 0, 2, 3")
    assert "process 483072 on 172.16.64.210 (GPU 0)" in d.devices


# RAS_MISMATCH's counts as fuzz_paste.py (seed 688248812, run 8846) pasted them: CRI records split by the runtime,
# a terminal 83 wide, a break inside "6650" and a nested quote. The hit ("...collective oper") is read once the five
# lines after it are in, which ends at "ation 66": the "50" below was not seen yet, and 66 was taken as the count.
RAS_MISMATCH_BROKEN_COUNT = """\
> > 2026-01-05T10:00:00.123456789Z stderr P #0-0 (27a079b828ff1a75) MISMAT
> > 2026-01-05T10:00:00.123456789Z stderr P C
> > 2026-01-05T10:00:00.123456789Z stderr F H
> > 2026-01-05T10:00:00.123456789Z stderr P   Commun
> > 2026-01-05T10:00:00.123456789Z stderr P icator ranks have different collective oper
> > a
> > 2026-01-05T10:00:00.123456789Z stderr P tion 
> > 2026-01-05T10:00:00.123456789Z stderr F counts
> > 2026-01-05T10:00:00.123456789Z stderr F   26 ranks have launched up to oper
> > ation 66
> > 50
> > 2026-01-05T10:00:00.123456789Z stderr F   6 ranks have launched up to operation 664
> > 9
> > 2026-01-05T10:00:00.123456789Z stderr F   Rank 0 -- GPU 0 managed by process 483072
> >  on node 172.16.64.210
"""


def test_ncclras_count_broken_at_the_end_of_the_lines_read_is_unreadable_not_cut():
    d = one(explain(RAS_MISMATCH_BROKEN_COUNT, match_local=False), "nccl_ras_behind")
    assert "operation 66 " not in d.summary and "operation 66)" not in d.summary and "operation 664)" not in d.summary
    assert d.summary == ("Ranks of one NCCL communicator have launched different numbers of collectives; behind: "
                         "rank 0. Unreadable in this text: a count of collectives (a line break cuts through it "
                         "where the text does not tell how the pieces join; the cause and the fix do not depend "
                         "on it).")
    assert d.unreadable == ("a count of collectives",)
    assert d.ranks == (0,) and d.devices == ("process 483072 on 172.16.64.210 (GPU 0)",)


def test_ncclras_json_and_monitor_mode_name_the_unresponsive_rank_and_its_process():
    d = one(explain(RAS_JSON, match_local=False), "nccl_ras_missing")
    assert d.ranks == (1,)
    assert d.devices == ("process 1524345 on 172.16.64.245 (GPU 1)",)
    assert "dead" not in d.summary  # "considered_dead": false
    d = one(explain(RAS_MONITOR, match_local=False), "nccl_ras_missing")
    assert d.devices == ("process 1524345 on 172.16.64.245",) and "1 process(es) considered dead" in d.summary


def test_a_healthy_ncclras_report_is_not_a_finding():
    healthy = RAS_INCOMPLETE.split("Errors")[0].replace("INCOMPLETE", "OK") + RAS_JSON.replace(
        '"missing_ranks_count": 1', '"missing_ranks_count": 0').split('"missing_ranks": [')[0]
    assert [d.kind for d in explain(healthy, match_local=False)] == []


# The NCCL User Guide, RAS Diagnostics (NCCL 2.31, NCCL_RUN_RAS_DIAGNOSTICS=1 or ncclras -D), "Output Format".
RAS_DIAGNOSTICS = """\
node042:12345 NCCL DIAG === RAS Diagnostics ===
node042:12345 NCCL DIAG [OK]   GPU inventory: 8x NVIDIA H100 per node consistent across 8 ranks in comm 0x1234
node042:12345 NCCL DIAG [INFO] NCCL environment: mismatch across 8 ranks in comm 0x1234 for NCCL_DEBUG
node042:12345 NCCL DIAG [INFO] NCCL environment: NCCL_DEBUG=INFO on rank(s) {0,1,2,3}
node042:12345 NCCL DIAG [INFO] NCCL environment: NCCL_DEBUG=WARN on rank(s) {4,5,6,7}
node042:12345 NCCL DIAG [INFO] NCCL environment: 1 NCCL_* env var(s) differ across ranks in comm 0x1234
node042:12345 NCCL DIAG RAS diagnostics completed in 12.3 ms across 8 RAS peers
"""


def test_nccl_diagnostics_reports_only_the_info_findings():
    d = one(explain(RAS_DIAGNOSTICS, match_local=False), "nccl_ras_diagnostics")
    assert d.occurrences == 4 and d.ranks == tuple(range(8))
    assert d.summary.startswith("NCCL's RAS diagnostics found the ranks of a communicator inconsistent: NCCL "
                                "environment: mismatch across 8 ranks in comm 0x1234 for NCCL_DEBUG;")
    ok_only = "\n".join(line for line in RAS_DIAGNOSTICS.splitlines() if "[INFO]" not in line)
    assert explain(ok_only, match_local=False) == []


# The PyTorch tutorial "Flight Recorder for Debugging Stuck Jobs" (torchfrtrace output), and the dump line of
# ProcessGroupNCCL.cpp (dumpDebuggingInfo): logPrefix() + "ProcessGroupNCCL dumping nccl trace to " + target.
FR_TRACE = """\
$torchfrtrace --prefix "trace_" /tmp/
Not all ranks joining collective 5 at entry 4
group info: 0:default_pg
collective: nccl:all_reduce
missing ranks: {1}
input sizes: [[3, 4]]
output sizes: [[3, 4]]
expected ranks: 2
collective state: scheduled
collective stack trace:
  all_reduce at /home/cpio/local/pytorch/torch/distributed/distributed_c10d.py:2696
  wrapper at /home/cpio/local/pytorch/torch/distributed/c10d_logger.py:83
  <module> at /home/cpio/test/crash.py:44
"""
FR_DUMP = ("[rank0]:[I1121 05:10:00.000000 77 ProcessGroupNCCL.cpp:1322] [PG ID 0 PG GUID 0(default_pg) Rank 0] "
           "ProcessGroupNCCL dumping nccl trace to /tmp/trace_0\n")


def test_torchfrtrace_names_the_rank_that_never_joined_and_the_collective():
    d = one(explain(FR_TRACE, match_local=False), "flight_recorder_missing_ranks")
    assert d.ranks == (1,)
    assert d.summary == "Rank 1 never joined nccl:all_reduce #5 of group 0:default_pg; the other ranks waited in it."
    d = one(explain(FR_DUMP, match_local=False), "flight_recorder_dumped")
    assert d.ranks == (0,) and d.devices == ("/tmp/trace_0",) and "torchfrtrace" in d.fix


# gpuguard.watch()'s own report, one JSON line (the shape documented in recognisers/gpuguard_stall.py).
STALL = {"gpuguard_stall": {"kind": "rank_behind", "group": "dp", "seq": 5653, "op": "ALL_REDUCE", "stuck_ranks": [5],
                            "waiting_ranks": [0, 1, 2, 3, 4, 6, 7], "waited_s": 74,
                            "stack": "File \"train.py\", line 88, in step\n    batch = next(loader)"}}


def test_gpuguard_stall_json_is_read_whole_or_cut():
    line = "[rank0]: " + json.dumps(STALL) + "\n"
    d = one(explain(line, match_local=False), "gpuguard_stall")
    assert d.ranks == (5,)
    assert d.summary == "Rank 5 never entered ALL_REDUCE #5653 on group 'dp'; ranks 0, 1, 2, 3, 4, 6, 7 waited in it for 74 s."
    assert d.devices[0].startswith('stack of rank 5: File "train.py", line 88, in step')
    # the same report with a stack longer than the reader keeps: no longer JSON, still read field by field
    long = dict(STALL["gpuguard_stall"], stack="x" * 40000)
    d = one(explain(json.dumps({"gpuguard_stall": long}), match_local=False), "gpuguard_stall")
    assert d.ranks == (5,) and "ALL_REDUCE #5653" in d.summary
    for kind, words in (("no_progress", "Every rank entered ALL_REDUCE #5653"), ("desync", "a desync"),
                        ("rank_gone", "Rank 5 is gone"),
                        ("rank_slow", "Every rank entered ALL_REDUCE #5653 on group 'dp'; rank 5 had not completed "
                                      "it")):
        d = one(explain(json.dumps({"gpuguard_stall": dict(STALL["gpuguard_stall"], kind=kind)}), match_local=False),
                "gpuguard_stall")
        assert words in d.summary
    assert "gpuguard doctor --p2p --nccl" in one(explain(json.dumps(
        {"gpuguard_stall": {"kind": "no_progress"}}), match_local=False), "gpuguard_stall").fix


# Wrapped messages. The watchdog timeout as the NCCL timeout debug report above quotes it: one message broken over
# three lines, the continuations at column 0 without the prefix.
WRAPPED_WATCHDOG = """\
[rank1]:[E1111 17:01:37] [Rank 1] Watchdog caught collective operation timeout: 
WorkNCCL(SeqNum=14863, OpType=ALLREDUCE, NumelIn=14845952, NumelOut=14845952, Timeout(ms)=1800000) 
ran for 1800048 milliseconds before timing out.
"""
# NCCL's WARN (src/init.cc) as an 80-column terminal shows it: broken mid-word, mid-number.
DUPLICATE = ("node7:2811:2811 [3] init.cc:1027 NCCL WARN Duplicate GPU detected : rank 7 and rank 5 both on CUDA "
             "device 1a000")


def test_a_message_a_terminal_wrapped_is_read_whole():
    d = one(explain(WRAPPED_WATCHDOG, match_local=False), "nccl_timeout")
    assert d.ranks == (1,) and "ALLREDUCE #14863 on rank 1" in d.summary and "timeout 1800 s" in d.summary
    for width in (80, 100, 120):
        wrapped = "\n".join(DUPLICATE[i:i + width] for i in range(0, len(DUPLICATE), width)) + "\n"
        d = one(explain(wrapped, match_local=False), "duplicate_gpu")
        assert d.ranks == (5, 7), width
        assert "0000:1a:00.0" in d.summary, (width, d.summary)


def test_a_message_a_viewer_wrapped_with_indentation_or_repeated_prefix_is_read_whole():
    indented = ("[rank2]: Expected all tensors to be on the same device, but found at least two devices,\n"
                "    cuda:0 and cpu! (when checking argument for argument mat1 in method wrapper_CUDA_addmm)\n")
    d = one(explain(indented, match_local=False), "device_mismatch")
    assert d.devices == ("cuda:0", "cpu") and "argument mat1 of wrapper_CUDA_addmm" in d.summary
    repeated = ("[rank2]: Expected all tensors to be on the same device, but found at least two devices,\n"
                "[rank2]: cuda:1 and cuda:0!\n")
    assert one(explain(repeated, match_local=False), "device_mismatch").devices == ("cuda:1", "cuda:0")


def test_lines_that_start_records_of_their_own_are_never_joined():
    two = ("Duplicate GPU detected : rank 1 and rank 0 both on CUDA device 18000\n"
           "Duplicate GPU detected : rank 2 and rank 0 both on CUDA device 18000\n")
    assert one(explain(two, match_local=False), "duplicate_gpu").ranks == (0, 1, 2)
    nccl = (DUPLICATE + "\nnode7:2811:2811 [3] NCCL INFO comm 0x55 rank 7 nranks 8 - Init COMPLETE\n")
    assert "0000:1a:00.0" in one(explain(nccl, match_local=False), "duplicate_gpu").summary


# torch >= 2.6, aten/src/ATen/core/op_registration/adaption.cpp (common_device_check_failure): "Expected all tensors
# to be on the same device, but got " + argName + " is on " + device + ", different from other tensors on " + ...
# (both pieces are in the installed libtorch_cpu.so); index_select with a CPU index, as users report it.
NEW_WORDING = ("RuntimeError: Expected all tensors to be on the same device, but got index is on cpu, different from "
               "other tensors on cuda:0 (when checking argument in method wrapper_CUDA__index_select)\n")


def test_torchs_newer_device_mismatch_wording_names_the_argument_and_both_devices():
    d = one(explain(NEW_WORDING, match_local=False), "device_mismatch")
    assert d.devices == ("cpu", "cuda:0")
    assert d.summary == ("An operation got tensors on different devices: cpu and cuda:0 (argument index of "
                         "wrapper_CUDA__index_select).")
