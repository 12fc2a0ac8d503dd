"""set_device(rank) under a launcher that claims two GPUs on this one-GPU machine (torchrun --nproc_per_node=2,
gpuguard's zero-code mode as `gpuguard run` arms it): gpuguard's RankMappingError comes before CUDA's own
"invalid device ordinal", which the same call gives once gpuguard is switched off."""

from __future__ import annotations

import os
import socket

import pytest

from gg_testing.paths import ROOT
from .gpu_support import torchrun, worker

pytestmark = [pytest.mark.gpu, pytest.mark.slow]

# The seed script's two shapes: the rank as the device before init_process_group, or after it (an NCCL group:
# gpuguard's group check then runs at set_device, and every rank stops, naming the one that cannot bind).
_JOB = r'''
import os, sys
import torch, torch.distributed as dist
mode = sys.argv[1]
if mode == "after_init":
    dist.init_process_group("nccl")
rank = int(os.environ["RANK"])
try:
    torch.cuda.set_device(rank)  # the rank as the device: cuda:1 does not exist on a one-GPU machine
    report_result(type=None, current=torch.cuda.current_device())
except Exception as exc:
    import gpuguard.auto
    gpuguard.auto.disable()  # the same call without gpuguard: what CUDA itself says
    try:
        torch.cuda.set_device(rank)
        torch.zeros(1, device="cuda")
        cuda = None
    except Exception as raw:
        cuda = f"{type(raw).__name__}: {raw}"
    report_result(type=type(exc).__name__, module=type(exc).__module__, message=str(exc), cuda=cuda)
'''


def auto_env(env: dict[str, str]) -> dict[str, str]:
    """``env`` with the zero-code mode armed as an installed gpuguard's .pth arms it (tests/python/auto_site)."""
    return dict(env, GPUGUARD="1", GPUGUARD_TEST_SITE=str(ROOT / "python"),
                PYTHONPATH=os.pathsep.join([str(ROOT / "tests" / "python" / "auto_site"), env["PYTHONPATH"]]))


@pytest.mark.parametrize("mode", ["before_init", "after_init"])
def test_set_device_of_the_rank_on_a_one_gpu_machine_is_a_rank_mapping_error(tmp_path, real_env, report, mode):
    """Rank 1 asks for cuda:1: RankMappingError naming the index, the one GPU and the launcher's ranks, while
    CUDA's own answer to that call is 'invalid device ordinal'."""
    job = torchrun(worker(tmp_path, "train.py", _JOB), 2, auto_env(real_env), 240, mode)
    got = job.results
    report.record("rank results", got)
    report.figure(job.seconds, "s", "the job")
    assert sorted(got) == [0, 1], job.output[-4000:]
    bad = got[1]
    assert (bad["module"], bad["type"]) == ("gpuguard.errors", "RankMappingError"), bad
    assert (f"torch.cuda.set_device(1) asks for cuda:1, but this process on {socket.gethostname()} sees 1 GPU "
            f"(cuda:0..cuda:0; CUDA_VISIBLE_DEVICES unset); CUDA would stop with 'invalid device ordinal'.") \
        in bad["message"], bad["message"]
    assert "global rank 1 (RANK), local rank 1 (LOCAL_RANK)" in bad["message"], bad["message"]
    # the rank already uses its local rank: the fix is fewer processes on this node, not the local rank
    assert ("The index already is the local rank: this node runs 2 processes (LOCAL_WORLD_SIZE) but shows 1 GPU. "
            "Start at most 1 per node (torchrun --nproc_per_node=1") in bad["message"], bad["message"]
    assert "invalid device ordinal" in bad["cuda"], bad["cuda"]  # what gpuguard said CUDA would say
    if mode == "before_init":  # rank 0's cuda:0 exists: gpuguard lets torch set it
        assert got[0]["type"] is None and got[0]["current"] == 0, got[0]
    else:  # one NCCL group: rank 0 stops too, naming rank 1's request
        assert got[0]["type"] == "RankMappingError", got[0]
        assert "could not bind a GPU, so every rank of group 'default' stops here" in got[0]["message"]
        assert "torch.cuda.set_device(1) asks for cuda:1" in got[0]["message"], got[0]["message"]
    assert "gpuguard: active (auto)" in job.output
