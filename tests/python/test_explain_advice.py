"""explain's advice says only what the evidence supports (issue 11): one duplicate pair shows no pattern; a Ray log
leads with Ray's fractional GPUs; on a host that shows one GPU the fix is not set_device(local_rank); torchrun's own
failure summary names global ranks, hosts and processes per node."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from gpuguard.logs import LogExplainer, explain

pytestmark = pytest.mark.version_independent  # CI runs this file on the oldest corner only (pyproject's markers)


def one(found, kind):
    matching = [d for d in found if d.kind == kind]
    assert len(matching) == 1, [d.kind for d in found]
    return matching[0]


# NCCL <= 2.29, src/init.cc: WARN("Duplicate GPU detected : rank %d and rank %d both on CUDA device %lx", ...)
PAIR = "Duplicate GPU detected : rank 7 and rank 5 both on CUDA device 10000\n"


def test_one_pair_claims_no_pattern():
    d = one(explain(PAIR, match_local=False), "duplicate_gpu")
    assert "differ by" not in d.cause and "rank % 2" not in d.cause
    assert "One pair shows no pattern, so the log alone cannot tell which mistake placed them." in d.cause
    two_pairs = PAIR + "Duplicate GPU detected : rank 3 and rank 1 both on CUDA device 20000\n"
    assert "the pattern of device = rank % 2" in one(explain(two_pairs, match_local=False), "duplicate_gpu").cause


def test_a_ray_log_leads_with_rays_fractional_gpus():
    # Ray's driver prints worker output as "(ActorName pid=N, ip=A) line" (ray/_private/worker.py, print_worker_logs)
    ray = "(RayWorkerWrapper pid=48213, ip=10.0.0.5) " + PAIR
    d = one(explain(ray, match_local=False), "duplicate_gpu")
    assert d.cause.index("fraction (num_gpus < 1") < d.cause.index("Otherwise")
    assert "set_device" not in d.cause


def test_on_a_host_showing_one_gpu_the_fix_is_not_set_device_local_rank():
    gpu = SimpleNamespace(index=0, uuid="GPU-5a6b7c00-0000-4000-8000-1f2e3d4c5b60", pci_bus_id="0000:10:00.0")
    x = LogExplainer(local_devices=[gpu], log_is_local=True)
    x.feed(PAIR)
    d = one(x.diagnoses(), "duplicate_gpu")
    assert d.fix.startswith("This host shows 1 GPU, so two ranks on it cannot each have their own: "
                            "torch.cuda.set_device(local_rank) would make local rank 1 ask for cuda:1")
    # the log's own NCCL prefix naming this host counts as local too; another host's log keeps the usual fix
    nccl = "node7:2811:2811 [0] init.cc:1027 NCCL WARN " + PAIR
    x = LogExplainer(local_devices=[gpu], local_host="node7")
    x.feed(nccl)
    assert one(x.diagnoses(), "duplicate_gpu").fix.startswith("This host shows 1 GPU")
    x = LogExplainer(local_devices=[gpu], local_host="login1")
    x.feed(nccl)
    assert one(x.diagnoses(), "duplicate_gpu").fix.startswith("Give every rank its own GPU")


# Two ranks on an H200's one GPU under torchrun with NCCL_DEBUG=WARN (NCCL 2.28.9, torch 2.11; the lent GPU machine,
# 2026-11-28): NCCL's WARN line with its host:pid:tid prefix, then torch's error repeating NCCL's text without it.
H200_LOG = """\
[2026-11-28 05:45:20] vm:1346:1346 [0] init.cc:904 NCCL WARN Duplicate GPU detected : rank 0 and rank 1 both on CUDA device 60
[2026-11-28 05:45:20] vm:1347:1347 [0] init.cc:904 NCCL WARN Duplicate GPU detected : rank 1 and rank 0 both on CUDA device 60
[rank0]: torch.distributed.DistBackendError: NCCL error in: /pytorch/torch/csrc/distributed/c10d/NCCLUtils.cpp:93, \
invalid usage (run with NCCL_DEBUG=WARN for details), NCCL version 2.28.9
[rank0]: ncclInvalidUsage: This usually reflects invalid usage of NCCL library.
[rank0]: Last error:
[rank0]: Duplicate GPU detected : rank 0 and rank 1 both on CUDA device 60
[rank1]: Last error:
[rank1]: Duplicate GPU detected : rank 1 and rank 0 both on CUDA device 60
"""


def test_a_pair_printed_with_and_without_nccls_host_prefix_is_named_once():
    # on the GPU machine explain named the pair twice ("ranks 0, 1 share 0000:00:06.0 on host vm; ranks 0, 1 share
    # 0000:00:06.0"), listed the GPU twice and, the host unsure, gave the set_device(local_rank) fix
    gpu = SimpleNamespace(index=0, uuid="GPU-82813277-b47e-9f55-f7bd-676cf6226fc2", pci_bus_id="0000:00:06.0")
    x = LogExplainer(local_devices=[gpu], local_host="vm")
    x.feed(H200_LOG)
    d = one(x.diagnoses(), "duplicate_gpu")
    assert d.summary == ("Two or more ranks of one NCCL communicator are on the same GPU: ranks 0, 1 share "
                         "0000:00:06.0 on host vm."), d.summary
    assert d.devices == (f"0000:00:06.0 (NCCL's 'CUDA device 60') = GPU 0 on this host ({gpu.uuid})",), d.devices
    assert d.fix.startswith("This host shows 1 GPU"), d.fix
    assert d.occurrences == 4
    # a pair without a host that shares no rank with one read with a host may be another host's GPU: kept apart
    other = "[rank2]: Duplicate GPU detected : rank 2 and rank 3 both on CUDA device 60\n"
    d = one(explain(H200_LOG + other, match_local=False), "duplicate_gpu")
    assert d.summary.endswith("ranks 0, 1 share 0000:00:06.0 on host vm; ranks 2, 3 share 0000:00:06.0."), d.summary


# torch/distributed/elastic/multiprocessing/errors/__init__.py (ChildFailedError.format_msg), as printed by a
# two-node job (the shape of the published summaries: "host : ...", "rank : 5 (local_rank: 5)", "exitcode : ...").
TORCHRUN = """\
[2024-10-09 21:16:03,123] torch.distributed.elastic.multiprocessing.api: [ERROR] failed (exitcode: 1)
Traceback (most recent call last):
torch.distributed.elastic.multiprocessing.errors.ChildFailedError:
============================================================
train.py FAILED
------------------------------------------------------------
Failures:
[1]:
  time      : 2024-10-09_21:16:02
  host      : node2
  rank      : 7 (local_rank: 3)
  exitcode  : -15 (pid: 1006195)  (SIGTERM)
  error_file: <N/A>
  traceback : Signal 15 (SIGTERM) received by PID 1006195
------------------------------------------------------------
Root Cause (first observed failure):
[0]:
  time      : 2024-10-09_21:16:02
  host      : node2
  rank      : 5 (local_rank: 1)
  exitcode  : 1 (pid: 1006193)
  error_file: <N/A>
  traceback : To enable traceback see: https://pytorch.org/docs/stable/elastic/errors.html
============================================================
"""


def test_torchruns_summary_names_global_ranks_hosts_and_processes_per_node():
    d = one(explain(TORCHRUN, match_local=False), "torchrun_failures")
    assert d.ranks == (5, 7)
    assert d.summary == "torchrun reports ranks 5, 7 failed (rank 7 only stopped by torchrun after the others failed)."
    assert d.devices == ("node2: local ranks 1-3",)
    assert "Node offsets" not in d.cause  # one node's offset (4) alone gives no count per node
    two_nodes = TORCHRUN.replace("rank      : 7 (local_rank: 3)", "rank      : 2 (local_rank: 2)").replace(
        "host      : node2\n  rank      : 2", "host      : node1\n  rank      : 2")
    d = one(explain(two_nodes, match_local=False), "torchrun_failures")
    assert "Node offsets 0, 4 (global rank - local rank) point to 4 processes per node" in d.cause
