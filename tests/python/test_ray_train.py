"""Ray Train as its users write it: a TorchTrainer driver script (ray_scripts/train_packed.py) that never names
gpuguard, switched on for its training workers by the setup hook or by GPUGUARD=1 in runtime_env["env_vars"],
under a real local Ray and the fake driver.

Two workers given half a GPU each share one: every worker stops at Ray Train's own init_process_group with
the duplicate report and the Ray Train fix, before NCCL. Where the line falls without a GPU: this torch has
no CUDA, so gpuguard checks inside init_process_group, on cuda:0 (Ray Train calls set_device only after it);
the same job on a real GPU, checked at Ray Train's set_device, is tests/python/gpu/test_gpu_ray.py.
"""

from __future__ import annotations

import json
import sys

import pytest

from gg_testing import launch
from gg_testing.env import auto_env, scrubbed
from gg_testing.paths import ROOT


SCRIPTS = ROOT / "tests" / "python" / "ray_scripts"


@pytest.fixture(autouse=True, scope="module")
def _ray_train() -> None:
    """Skips where Ray Train cannot import (ray[train]: pandas, pyarrow). Asked when a test runs, not when pytest
    collects the file: importing ray.train.torch takes 2-3 CPU-s (it imports torch._inductor), which every pytest
    process of CI would pay for a file only the Ray steps run."""
    pytest.importorskip("ray.train.torch", exc_type=ImportError)


@pytest.mark.slow
@pytest.mark.ray_cluster
@pytest.mark.parametrize("switch", ["hook", "env"])
def test_a_trainer_whose_workers_share_a_gpu_stops_every_worker_with_the_ray_train_fix(switch, fake_gpus, tmp_path):
    report = tmp_path / "ranks.jsonl"
    env = auto_env(fake_gpus.env("h100x4", RAY_DISABLE_USAGE_STATS="1", GPUGUARD_JSON_REPORT=str(report)))
    env.pop("GPUGUARD")  # the driver is not switched on: only the workers are, by the runtime_env
    proc = launch.Job([sys.executable, "train_packed.py", "--switch", switch, "--workers", "2",
                       "--gpus-per-worker", "0.5", "--fake-gpus", "1", "--storage", str(tmp_path / "runs")],
                      scrubbed(env), tmp_path, cwd=str(SCRIPTS)).wait(400)
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0 and "training finished" not in out and "trained a step" not in out, out[-5000:]
    # what the driver shows: gpuguard's report, raised in a worker at Ray Train's init_process_group
    assert "gpuguard.errors.DuplicateDeviceError: 2 ranks of group 'default' share 1 GPU." in proc.stderr, out[-5000:]
    assert "is shared by ranks 0 and 1:" in proc.stderr
    assert "Likely cause: Ray gave these actors 1/2 of a GPU each (num_gpus=1/2)" in proc.stderr
    assert "Fix: give every rank of a group a whole GPU" in proc.stderr
    assert ("Ray Train gave each training worker 0.5 GPU (ScalingConfig(resources_per_worker={'GPU': 0.5})); fix: "
            "give each a whole GPU, resources_per_worker={'GPU': 1} (the default with use_gpu=True)") in proc.stderr
    # every training worker had gpuguard on and was stopped by it (one JSON line per rank)
    rows = [json.loads(line) for line in report.read_text().splitlines()]
    assert sorted((r["rank"], r["world_size"], r["launcher"], r["verdict"]) for r in rows) == [
        (0, 2, "ray", "DuplicateDeviceError"), (1, 2, "ray", "DuplicateDeviceError")], rows
