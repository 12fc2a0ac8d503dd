"""Ray Job Submission as its users do it: a local cluster from `ray start --head` (its own ports, temp folder and
token), `ray job submit --runtime-env-json ... -- python job.py`, the job (ray_scripts/job.py) never naming
gpuguard; the cluster is stopped afterwards, also on failure (gg_testing.ray_head.RayHead).

The setup hook, or GPUGUARD=1 in the job's env_vars, reaches the job's workers, and a job whose two ranks Ray
packs onto one GPU stops with gpuguard's report, shown by `ray job submit` itself.
"""

from __future__ import annotations

import json
from typing import Iterator

import pytest

from gg_testing.env import auto_env, scrubbed
from gg_testing.paths import ROOT
from gg_testing.ports import free_port
from gg_testing.procs import run_logged
from gg_testing.ray_head import RayHead

pytest.importorskip("ray.dashboard.modules.job.sdk", exc_type=ImportError)  # ray[default]: the Jobs API

SCRIPTS = ROOT / "tests" / "python" / "ray_scripts"


@pytest.fixture(scope="module")
def head(fake_gpus, tmp_path_factory) -> Iterator[RayHead]:
    report = tmp_path_factory.mktemp("jobs") / "ranks.jsonl"
    env = auto_env(fake_gpus.env("h100x4", GPUGUARD_JSON_REPORT=str(report)))
    env.pop("GPUGUARD")  # the cluster is not switched on: a job's runtime_env switches on its own workers
    cluster = RayHead(scrubbed(env), num_gpus=2, num_cpus=4, dashboard=True)
    cluster.report = report  # type: ignore[attr-defined]
    cluster.start()
    try:
        yield cluster
    finally:
        cluster.stop()


@pytest.mark.slow
@pytest.mark.ray_cluster
@pytest.mark.parametrize("runtime_env", [{"worker_process_setup_hook": "gpuguard.ray.setup"},
                                         {"env_vars": {"GPUGUARD": "1"}}], ids=["hook", "GPUGUARD=1"])
def test_a_submitted_job_whose_ranks_share_a_gpu_stops_with_the_report(head, runtime_env):
    group = "hook" if "worker_process_setup_hook" in runtime_env else "env"
    proc = run_logged(["ray", "job", "submit", f"--address={head.dashboard_url}", f"--working-dir={SCRIPTS}",
                       f"--runtime-env-json={json.dumps(runtime_env)}", "--", "python", "job.py",
                       "--gpus-per-rank", "0.5", "--group", group, "--port", str(free_port())],
                      head.env(), timeout=300)
    out = proc.stdout
    assert proc.returncode != 0 and "joined" not in out, out[-5000:]
    assert "failed" in out, out[-5000:]  # ray job submit: "Job 'raysubmit_...' failed"
    assert f"gpuguard.errors.DuplicateDeviceError: 2 ranks of group '{group}' share 1 GPU." in out, out[-5000:]
    assert "is shared by ranks 0 and 1:" in out
    assert "Likely cause: Ray gave these actors 1/2 of a GPU each (num_gpus=1/2)" in out
    assert "Fix: give every rank of a group a whole GPU: gpuguard.ray_placement(max_colocate=1)" in out
    # both of the job's workers were switched on and stopped by gpuguard (one JSON line per rank)
    rows = [json.loads(line) for line in head.report.read_text().splitlines()]  # type: ignore[attr-defined]
    assert sorted((r["rank"], r["launcher"], r["verdict"]) for r in rows if r["group"] == group) == [
        (0, "ray", "DuplicateDeviceError"), (1, "ray", "DuplicateDeviceError")], rows
