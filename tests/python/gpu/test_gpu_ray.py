"""Ray Train on the real GPU: two TorchTrainer workers given half of it each stop at Ray Train's own
set_device with gpuguard's report; one worker given all of it trains a DDP step with gpuguard switched on."""

from __future__ import annotations

import importlib.util
import json
import sys

import pytest

from gg_testing.paths import ROOT
from .gpu_support import run_job

# find_spec, not an import: importing Ray costs seconds to a minute, at every collection (the dry run's, CI's)
pytestmark = [pytest.mark.gpu, pytest.mark.ray_cluster, pytest.mark.skipif(importlib.util.find_spec("ray") is None,
                                                  reason="needs Ray Train (ray[train]), not installed here")]

TRAIN = ROOT / "tests" / "python" / "ray_scripts" / "train_packed.py"


def train(tmp_path, real_env, *args: str):
    report = tmp_path / "ranks.jsonl"
    env = dict(real_env, GPUGUARD_JSON_REPORT=str(report), RAY_DISABLE_USAGE_STATS="1")
    job = run_job([sys.executable, str(TRAIN), "--switch", "hook", "--storage", str(tmp_path / "runs"), *args], env,
                  400)
    rows = [json.loads(line) for line in report.read_text().splitlines()] if report.exists() else []
    return job.returncode, job.output, job.seconds, rows


@pytest.mark.slow
def test_ray_train_workers_sharing_the_gpu_stop_at_ray_trains_set_device(tmp_path, real_env, report):
    """Two workers of resources_per_worker={"GPU": 0.5}: both stop with the report before NCCL's first collective."""
    rc, out, seconds, rows = train(tmp_path, real_env, "--workers", "2", "--gpus-per-worker", "0.5")
    report.record("seconds", round(seconds, 1))
    report.figure(seconds, "s", "the job")
    report.record("output", out[-2000:])
    assert rc != 0 and "training finished" not in out, out[-5000:]
    assert "gpuguard.errors.DuplicateDeviceError: 2 ranks of group 'default' share 1 GPU." in out, out[-5000:]
    assert "Ray Train gave each training worker 0.5 GPU (ScalingConfig(resources_per_worker={'GPU': 0.5}))" in out
    assert sorted((r["rank"], r["verdict"], r["checked_at"]) for r in rows) == [
        (0, "DuplicateDeviceError", "torch.cuda.set_device after init_process_group"),
        (1, "DuplicateDeviceError", "torch.cuda.set_device after init_process_group")], rows


@pytest.mark.slow
def test_ray_train_with_a_whole_gpu_trains_with_gpuguard_on(tmp_path, real_env, report):
    """One worker of resources_per_worker={"GPU": 1}: Ray Train's real NCCL group and DDP step run unhindered."""
    rc, out, seconds, rows = train(tmp_path, real_env, "--workers", "1", "--gpus-per-worker", "1")
    report.record("seconds", round(seconds, 1))
    report.figure(seconds, "s", "the job")
    report.record("output", out[-2000:])
    assert rc == 0, out[-5000:]
    assert "worker 0 trained a step on cuda:0" in out and "training finished" in out, out[-5000:]
    assert "gpuguard.errors" not in out
