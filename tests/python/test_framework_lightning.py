"""Lightning's own code under `gpuguard run`: a Trainer through Lightning's own launcher (`python train.py`),
ddp_spawn and torchrun, and Fabric, on the fake GPUs; the callbacks its entry points add under GPUGUARD=1; and
the Lightning mistake gpuguard stops (a LOCAL_RANK left in the shell, which switches Lightning's spawning off).

This torch sees no CUDA device, so Lightning runs on its CPU accelerator: with the gloo backend every job here
trains to its end, and its ranks are checked at init_process_group (every rank arrived, the same world size).
With the NCCL backend, gpuguard's check of the ranks' GPUs runs inside init_process_group, before torch's own
NCCL init fails on this machine; Lightning's GPU accelerator, which names each rank's GPU itself (set_device,
then init_process_group(device_id=)), needs torch to see a GPU: tests/python/gpu/test_gpu_frameworks.py runs it.
"""

from __future__ import annotations

import importlib.util

import pytest

from gg_testing import launch
from gg_testing.framework_jobs import LIGHTNING_TRAINER as TRAINER, gpuguard_run, report_rows as rows

pytestmark = [pytest.mark.slow, pytest.mark.skipif(
    importlib.util.find_spec("lightning") is None,
    reason="needs Lightning: scripts/setup.sh installs it (pyproject.toml's dependency group 'frameworks')")]

FABRIC = """
import os

import torch
from torch import nn
import lightning as L
from lightning.fabric.strategies import DDPStrategy

if __name__ == "__main__":
    fabric = L.Fabric(accelerator="cpu", devices=2, strategy=DDPStrategy(process_group_backend="gloo"))
    fabric.launch()
    model = nn.Linear(4, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    model, optimizer = fabric.setup(model, optimizer)
    x = torch.randn(8, 4)
    if os.environ.get("INPUT_DEVICE"):  # a batch that never reached the model's device
        x = x.to(os.environ["INPUT_DEVICE"])
    loss = model(x).sum()
    fabric.backward(loss)
    optimizer.step()
    print(f"step done on rank {fabric.global_rank}", flush=True)
"""


def run_job(fake_gpus, tmp_path, code: str, *command: str, **extra: str):
    return gpuguard_run(fake_gpus, tmp_path, code, list(command), **extra)


@pytest.mark.parametrize("spawn", ["", "1"], ids=["own launcher", "ddp_spawn"])
def test_a_trainer_on_gloo_trains_to_its_end_with_every_rank_checked(fake_gpus, tmp_path, spawn):
    finished, report = run_job(fake_gpus, tmp_path, TRAINER, BACKEND="gloo", SPAWN=spawn)
    assert finished.returncode == 0, finished.tail()
    assert "fit done on rank 0" in finished.stdout
    assert rows(report) == [(0, 2, "lightning", "lightning", "ok"), (1, 2, "lightning", "lightning", "ok")]
    # said when it is true: at init_process_group, the rank Lightning named there (never "single" at start)
    for rank in (0, 1):
        assert f"is rank {rank}/2 (lightning: " in finished.stderr, finished.tail()
    assert "rank 0/1" not in finished.stderr and "launcher variables unreadable" not in finished.stderr
    # the entry point's callback, on every rank, once the model is on its device
    for rank in (0, 1):
        assert f"gpuguard: Lightning rank {rank}/2: guard() on DistributedDataParallel + watch() of the " \
               f"collectives" in finished.stderr, finished.tail()


@pytest.mark.parametrize("spawn", ["", "1"], ids=["own launcher", "ddp_spawn"])
def test_a_trainer_on_nccl_has_every_rank_checked_before_torchs_nccl(fake_gpus, tmp_path, spawn):
    # before: LaunchEnvironmentError on every rank ("... but no RANK"; ddp_spawn: "RANK, WORLD_SIZE are not set")
    finished, report = run_job(fake_gpus, tmp_path, TRAINER, BACKEND="nccl", SPAWN=spawn)
    assert "LaunchEnvironmentError" not in finished.stderr, finished.tail()
    assert [(r[0], r[2]) for r in rows(report)] == [(0, "lightning"), (1, "lightning")]
    # the CPU accelerator names no GPU, so NCCL would run both ranks on cuda:0: said in Lightning's words
    assert {r["verdict"] for r in report["ranks"]} == {"DuplicateDeviceError"}
    # (ddp_spawn's parent prints the first failed rank's traceback alone)
    assert ("Lightning names each rank's GPU only with a GPU accelerator (Trainer(accelerator='gpu', devices=N) calls "
            "set_device and passes device_id=); with accelerator='cpu' the NCCL backend runs every rank on cuda:0: use "
            "process_group_backend='gloo' for a run on the CPU.") in finished.stderr, finished.tail()
    assert "ProcessGroupNCCL is only supported with GPUs" not in finished.stderr  # stopped before torch's NCCL


def test_a_local_rank_left_in_the_shell_stops_the_job_at_once_naming_it(fake_gpus, tmp_path):
    # Lightning reads LOCAL_RANK as "a launcher started every rank", starts no other process, and rank 0 would
    # wait for rank 1 in init_process_group for torch's 30 minutes
    finished, report = run_job(fake_gpus, tmp_path, TRAINER, BACKEND="gloo", LOCAL_RANK="0")
    assert finished.returncode not in (0, None), finished.tail()
    assert ("gpuguard.errors.LaunchEnvironmentError: LOCAL_RANK=0 is set in this process's environment, but no "
            "launcher started it: Lightning takes a set LOCAL_RANK to mean that a launcher (torchrun, SLURM) "
            "started every rank, so it did not start the other 1 process of this 2-rank job itself") \
        in finished.stderr, finished.tail()
    assert "Fix: unset LOCAL_RANK (it was exported in the shell or the job script) and run `python train.py` " \
           "again, or start every rank with a launcher: torchrun --nproc_per_node=2 train.py." in finished.stderr
    assert "[gg_testing: killed after" not in finished.stderr


def test_a_trainer_under_torchrun_is_read_from_torchruns_variables(fake_gpus, tmp_path):
    finished, report = run_job(fake_gpus, tmp_path, TRAINER, *launch.torchrun_argv(nproc=2), BACKEND="gloo")
    assert finished.returncode == 0, finished.tail()
    assert rows(report) == [(0, 2, "torchrun", "lightning", "ok"), (1, 2, "torchrun", "lightning", "ok")]


def test_fabric_is_checked_and_its_callback_guards_the_set_up_module(fake_gpus, tmp_path):
    finished, report = run_job(fake_gpus, tmp_path, FABRIC)
    assert finished.returncode == 0, finished.tail()
    assert rows(report) == [(0, 2, "lightning", "lightning", "ok"), (1, 2, "lightning", "lightning", "ok")]
    for rank in (0, 1):
        assert f"gpuguard: Fabric rank {rank}/2: guard() on _FabricModule" in finished.stderr, finished.tail()


def test_fabrics_callback_names_the_batch_that_is_not_on_the_models_device(fake_gpus, tmp_path):
    finished, _ = run_job(fake_gpus, tmp_path, FABRIC, INPUT_DEVICE="meta")
    assert finished.returncode not in (0, None)
    assert "gpuguard.errors.DeviceMismatchError: gpuguard: tensors that must share one device are on 2 devices: " \
           "cpu, meta." in finished.stderr, finished.tail()
