"""accelerate and the Hugging Face Trainer under `gpuguard run`, on the fake GPUs: `accelerate launch` and
torchrun starting a Trainer that trains a tiny BERT built from a config (nothing downloaded), with every rank
checked and GpuGuardTrainerCallback on every rank, and a config file's gpu_ids; and accelerate's mistake
gpuguard stops before NCCL, in a plain Accelerator() program and in the Trainer: more processes than GPUs
(`--num_processes` is never checked against the GPUs there are).

This torch sees no CUDA device, so accelerate never takes its multi-GPU path (it asks torch.cuda.is_available()):
the Trainer runs accelerate's MULTI_CPU on gloo. Its NCCL path, where accelerate sets each process's device to
local_process_index % device_count after init_process_group, needs torch to see a GPU
(tests/python/gpu/test_gpu_frameworks.py). `accelerate launch --use_deepspeed` with DeepSpeed's CUDA accelerator
reaches init_process_group(device_id=cuda:LOCAL_RANK) here, and that is where the mistake is shown.
"""

from __future__ import annotations

import importlib.util

import pytest
import torch

from gg_testing import launch
from gg_testing.framework_jobs import (ACCELERATE_CONFIG, HF_TRAINER as TRAINER, HF_TRAINER_GPU, gpuguard_run,
                                       report_rows)
from gg_testing.ports import free_port

pytestmark = [pytest.mark.slow, pytest.mark.skipif(
    importlib.util.find_spec("transformers") is None or importlib.util.find_spec("accelerate") is None,
    reason="needs transformers and accelerate: scripts/setup.sh installs them (pyproject.toml's dependency group "
           "'frameworks')")]

TORCH = torch.torch_version.TorchVersion(torch.__version__)

ACCELERATOR = """
from accelerate import Accelerator

accelerator = Accelerator()
print(f"ready on rank {accelerator.process_index}", flush=True)
"""


def run_job(fake_gpus, tmp_path, code: str, topology: str, command: list[str], **extra: str):
    return gpuguard_run(fake_gpus, tmp_path, code, command, topology, **extra)


ACCELERATE_LAUNCH = ["accelerate", "launch", "--multi_gpu", "--num_processes", "2", "--num_machines", "1",
                     "--mixed_precision", "no", "--dynamo_backend", "no"]


@pytest.mark.parametrize("how", ["accelerate launch", "accelerate config file", "torchrun"])
def test_the_trainer_trains_with_every_rank_checked_and_its_callback_on_each(fake_gpus, tmp_path, how):
    if how == "accelerate launch":
        command = [*ACCELERATE_LAUNCH, "--main_process_port", str(free_port())]
    elif how == "accelerate config file":
        (tmp_path / "accelerate.yaml").write_text(ACCELERATE_CONFIG.format(port=free_port()))
        command = ["accelerate", "launch", "--config_file", str(tmp_path / "accelerate.yaml")]
    else:
        command = launch.torchrun_argv(nproc=2)
    finished, report = run_job(fake_gpus, tmp_path, TRAINER, "h100x4", command)
    assert finished.returncode == 0, finished.tail()
    assert "train done on rank 0" in finished.stdout and "train done on rank 1" in finished.stdout
    # accelerate launch runs torchrun in its own process; accelerate's PartialState calls init_process_group
    assert report_rows(report) == [(0, 2, "torchrun", "accelerate", "ok"), (1, 2, "torchrun", "accelerate", "ok")]
    if how == "accelerate config file":  # its gpu_ids became every rank's CUDA_VISIBLE_DEVICES
        assert [r["cuda_visible_devices"] for r in report["ranks"]] == ["2,3", "2,3"]
    for rank in (0, 1):
        assert f"gpuguard: Trainer rank {rank}/2: guard() on BertForSequenceClassification + watch() of the " \
               f"collectives" in finished.stderr, finished.tail()


@pytest.mark.skipif("2.6.0" < TORCH < "2.7.1",
                    reason=f"DeepSpeed passes no device_id to init_process_group on torch {TORCH}")
@pytest.mark.parametrize("program", ["Accelerator()", "the Trainer"])
def test_more_processes_than_gpus_stop_every_rank_naming_num_processes(fake_gpus, tmp_path, program):
    command = ["accelerate", "launch", "--use_deepspeed", "--zero_stage", "0", "--num_processes", "3",
               "--num_machines", "1", "--mixed_precision", "no", "--dynamo_backend", "no",
               "--main_process_port", str(free_port())]
    code = ACCELERATOR if program == "Accelerator()" else HF_TRAINER_GPU
    finished, report = run_job(fake_gpus, tmp_path, code, "h100x2_no_peer", command, DS_ACCELERATOR="cuda")
    assert finished.returncode not in (0, None), finished.tail()
    assert [(r["rank"], r["framework"], r["verdict"]) for r in report["ranks"]] == \
        [(0, "accelerate", "RankMappingError"), (1, "accelerate", "RankMappingError"),
         (2, "accelerate", "RankMappingError")]
    assert ("The index already is the local rank: this node runs 3 processes (LOCAL_WORLD_SIZE) but shows 2 GPUs. "
            "Start at most 2 per node: accelerate launch --num_processes 2 (num_processes in the accelerate config), "
            "or gpu_ids naming as many GPUs as processes.") in finished.stderr, finished.tail()
    assert "ProcessGroupNCCL is only supported with GPUs" not in finished.stderr
