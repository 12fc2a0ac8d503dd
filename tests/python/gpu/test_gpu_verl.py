"""verl's worker groups on the real GPU: ranks of one worker group on one GPU stop before NCCL, naming verl's settings.

Two Ray nodes on this host, each offering its one GPU, put ranks 0 and 1 of a verl worker group (process_on_nodes=[1, 1])
on that GPU. The lent GPU image has no Ray and no verl (shared/notes/gpu-image.md: Ray's wheel is larger than what can
be carried there), so this skips there; it runs wherever verl's dependency group is installed beside a CUDA torch."""

from __future__ import annotations

import importlib.util
import json
import sys

import pytest

from gg_testing.paths import ROOT
from gg_testing.procs import last_json
from .gpu_support import run_job

# find_spec, not an import: importing verl (and Ray, torch) costs seconds at every collection (the dry run's, CI's)
pytestmark = [pytest.mark.gpu, pytest.mark.ray_cluster, pytest.mark.skipif(
    importlib.util.find_spec("verl") is None or importlib.util.find_spec("ray") is None,
    reason="needs verl and Ray (pip install --group verl); the lent GPU image has neither")]

JOB = ROOT / "tests" / "python" / "ray_scripts" / "verl_worker_groups.py"


@pytest.mark.slow
def test_two_ray_nodes_offering_one_gpu_stop_a_verl_worker_group_before_nccl(tmp_path, real_env, report):
    """Both ranks stop at the first all-reduce (no device_id, no set_device: verl's init) with the duplicate report."""
    lines = tmp_path / "ranks.jsonl"
    env = dict(real_env, GPUGUARD_JSON_REPORT=str(lines), RAY_DISABLE_USAGE_STATS="1")
    job = run_job([sys.executable, str(JOB), "two-ray-nodes", "--gpus-per-node", "1"], env, 400)
    report.record("seconds", round(job.seconds, 1))
    report.figure(job.seconds, "s", "the job")
    report.record("output", job.output[-2000:])
    assert job.returncode == 0, job.output[-5000:]
    (results,) = last_json(job.output)
    assert sorted(r["rank"] for r in results) == [0, 1]
    for r in results:
        assert (r["module"], r["type"]) == ("gpuguard.errors", "DuplicateDeviceError"), r
        assert r["message"].startswith("2 ranks of group 'actor_rollout' share 1 GPU."), r["message"]
        assert "process_on_nodes=[1, 1] (trainer.nnodes=2 x trainer.n_gpus_per_node=1" in " ".join(r["notes"])
    rows = [json.loads(line) for line in lines.read_text().splitlines()]
    assert sorted((row["rank"], row["verdict"]) for row in rows) == [(0, "DuplicateDeviceError"),
                                                                    (1, "DuplicateDeviceError")]
