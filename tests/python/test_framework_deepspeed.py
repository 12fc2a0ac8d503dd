"""DeepSpeed's own launcher and deepspeed.initialize under `gpuguard run`, on the fake GPUs: a job that trains on
the CPU with every rank checked, protect(engine) after initialize, and the DeepSpeed mistake gpuguard stops
before NCCL (more ranks per node than GPUs: `--num_gpus` is never checked against the GPUs there are).

This torch sees no CUDA device. With DeepSpeed's CPU accelerator (DS_ACCELERATOR=cpu) the job trains on gloo to
its end. With its CUDA accelerator (DS_ACCELERATOR=cuda) DeepSpeed takes the path a GPU job takes as far as
init_process_group, where it passes device_id=cuda:LOCAL_RANK and gpuguard checks every rank; `deepspeed` itself
refuses to start there ("no GPU resources available": it counts torch's GPUs), so that test starts the ranks
with `python -m deepspeed.launcher.launch`, the per-node launcher `deepspeed --num_gpus 3` runs with
--world_info={"localhost": [0, 1, 2]}.
"""

from __future__ import annotations

import base64
import importlib.util
import json
import sys

import pytest
import torch

from gg_testing.framework_jobs import DEEPSPEED_TRAIN, gpuguard_run, report_rows
from gg_testing.ports import free_port

pytestmark = [pytest.mark.slow, pytest.mark.skipif(
    importlib.util.find_spec("deepspeed") is None,
    reason="needs DeepSpeed: scripts/setup.sh installs it (pyproject.toml's dependency group 'frameworks')")]

# deepspeed/comm/torch.py passes device_id= to init_process_group on CUDA, but not for 2.6.0 < torch.__version__ <
# 2.7.1 (pytorch/pytorch#153960; 2.6.0+cu124 is in it): there the check waits for the engine's set_device, which
# needs a GPU
TORCH = torch.torch_version.TorchVersion(torch.__version__)
PASSES_DEVICE_ID = not "2.6.0" < TORCH < "2.7.1"

def run_job(fake_gpus, tmp_path, topology: str, command: list[str], **extra: str):
    return gpuguard_run(fake_gpus, tmp_path, DEEPSPEED_TRAIN, command, topology, **extra)


def test_deepspeed_num_gpus_2_trains_with_every_rank_checked(fake_gpus, tmp_path):
    finished, report = run_job(fake_gpus, tmp_path, "h100x4",
                               ["deepspeed", "--num_gpus", "2", "--master_port", str(free_port())],
                               DS_ACCELERATOR="cpu")
    assert finished.returncode == 0, finished.tail()
    assert "step done on rank 0" in finished.stdout and "step done on rank 1" in finished.stdout
    assert report_rows(report) == [(0, 2, "deepspeed", "deepspeed", "ok"), (1, 2, "deepspeed", "deepspeed", "ok")]
    for rank in (0, 1):  # protect(engine): the module guarded, the collectives watched
        assert f"gpuguard: DeepSpeed rank {rank}/2: guard() on Linear + watch() of the collectives" in \
            finished.stderr, finished.tail()


@pytest.mark.skipif(not PASSES_DEVICE_ID, reason=f"DeepSpeed passes no device_id to init_process_group on torch "
                                                 f"{TORCH} (2.6.0 < torch < 2.7.1)")
def test_more_ranks_than_gpus_stop_every_rank_naming_num_gpus(fake_gpus, tmp_path):
    world = base64.urlsafe_b64encode(json.dumps({"localhost": [0, 1, 2]}).encode()).decode()
    finished, report = run_job(fake_gpus, tmp_path, "h100x2_no_peer",
                               [sys.executable, "-u", "-m", "deepspeed.launcher.launch", f"--world_info={world}",
                                "--master_addr=127.0.0.1", f"--master_port={free_port()}"], DS_ACCELERATOR="cuda")
    assert finished.returncode not in (0, None), finished.tail()
    assert [(r["rank"], r["device"], r["verdict"]) for r in report["ranks"]] == \
        [(0, "cuda:0", "RankMappingError"), (1, "cuda:1", "RankMappingError"), (2, "cuda:2", "RankMappingError")]
    own = "init_process_group(device_id=device(type='cuda', index=2)) asks for cuda:2, but this process on "
    assert own in finished.stderr, finished.tail()
    assert ("sees 2 GPUs (cuda:0..cuda:1; CUDA_VISIBLE_DEVICES=0,1,2); CUDA would stop with 'invalid device "
            "ordinal'. This is rank 2 of 3 (DeepSpeed launcher): global rank 2 (RANK), local rank 2 (LOCAL_RANK). The "
            "index already is the local rank: this node runs 3 processes (LOCAL_SIZE) but shows 2 GPUs. Start at most "
            "2 per node: deepspeed --num_gpus 2 (or --include localhost:<2 GPU ids>).") in finished.stderr
    # ranks 0 and 1 stop at once too, naming rank 2, instead of waiting for it in NCCL's init
    assert finished.stderr.count("rank 2 (host ") >= 2
    assert "ProcessGroupNCCL is only supported with GPUs" not in finished.stderr
