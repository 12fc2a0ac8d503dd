"""A Lightning Trainer under `srun` on the real SLURM cluster (tests/cluster/cluster.py), run as Lightning's docs
say (`srun python train.py`, two tasks for devices=2) under `gpuguard run`: Lightning reads SLURM's variables
(its SLURMEnvironment), and so does gpuguard, which checks every rank and names the framework."""

from __future__ import annotations

import importlib.util
import json
import sys

import pytest

from gg_testing.framework_jobs import LIGHTNING_TRAINER

pytestmark = [pytest.mark.timeout(300), pytest.mark.skipif(
    importlib.util.find_spec("lightning") is None,
    reason="needs Lightning: scripts/setup.sh installs it (pyproject.toml's dependency group 'frameworks')")]


def test_a_trainer_under_srun_is_checked_rank_by_rank(cluster):
    script = cluster.dir / "lightning_train.py"
    script.write_text(LIGHTNING_TRAINER)
    report = cluster.dir / "lightning_report.json"
    r = cluster.run([sys.executable, "-m", "gpuguard", "run", "--json-report", str(report), "--", "srun", "-N1",
                     "-w", "gg1", "-n2", "--ntasks-per-node=2", sys.executable, str(script)],
                    env=cluster.env(BACKEND="gloo"), timeout=240, check=False)
    assert r.returncode == 0, f"{r.stdout[-3000:]}\n{r.stderr[-3000:]}"
    assert "fit done on rank 0" in r.stdout
    rows = [(x["rank"], x["world_size"], x["launcher"], x["framework"], x["host"], x["verdict"])
            for x in json.loads(report.read_text())["ranks"]]
    assert rows == [(0, 2, "slurm", "lightning", "gg1", "ok"), (1, 2, "slurm", "lightning", "gg1", "ok")]
