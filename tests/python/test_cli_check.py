"""`gpuguard check` as users run it: under the job's own launcher (a real torchrun), every rank binds, meets
the others, and exits 0 with its binding, or 1 with the same duplicate report on every rank."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from test_bind import scrubbed


def torchrun_check(fake_gpus, topology: str, nproc: int) -> subprocess.CompletedProcess[str]:
    env = scrubbed(fake_gpus.env(topology))
    return subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone",
                           f"--nproc_per_node={nproc}", "--tee=1", "-m", "gpuguard", "check", "--json",
                           "--timeout", "60"],
                          env=env, capture_output=True, text=True, timeout=240)


def rank_lines(stdout: str) -> dict[int, dict]:
    """torchrun --tee prefixes each rank's stdout with `[rankN]:` (older torch: `[default0]:`)."""
    out = {}
    for line in stdout.splitlines():
        head, sep, body = line.partition("]:")
        if not sep or not body.strip().startswith("{"):
            continue
        digits = "".join(c for c in head if c.isdigit())
        out[int(digits)] = json.loads(body)
    return out


@pytest.mark.slow
def test_check_passes_with_one_gpu_per_rank(fake_gpus):
    proc = torchrun_check(fake_gpus, "h100x4", 2)
    assert proc.returncode == 0, proc.stderr[-3000:]
    ranks = rank_lines(proc.stdout)
    assert sorted(ranks) == [0, 1]
    uuids = [g["uuid"] for g in fake_gpus.topology("h100x4")["gpus"]]
    assert [ranks[r]["binding"]["uuid"] for r in (0, 1)] == uuids[:2]
    assert all(ranks[r]["ok"] for r in (0, 1))


@pytest.mark.slow
def test_check_fails_on_every_rank_with_the_same_report_when_two_ranks_share_a_gpu(fake_gpus):
    proc = torchrun_check(fake_gpus, "h100x1", 2)
    assert proc.returncode != 0
    ranks = rank_lines(proc.stdout)
    assert sorted(ranks) == [0, 1]
    assert {ranks[r]["error"] for r in (0, 1)} == {"DuplicateDeviceError"}
    assert ranks[0]["message"] == ranks[1]["message"]
    assert "is shared by ranks 0 and 1" in ranks[0]["message"]
    assert "2 processes on a host with 1 GPU" in ranks[0]["message"]


@pytest.mark.slow
def test_check_never_imports_torch_in_the_ranks(fake_gpus, tmp_path):
    # each rank's own stderr (torchrun --redirects) holds its -X importtime lines; the agent's are apart
    env = scrubbed(fake_gpus.env("h100x4"))
    env["PYTHONPROFILEIMPORTTIME"] = "1"
    proc = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
                           "--log-dir", str(tmp_path), "--redirects=3", "-m", "gpuguard", "check", "--json",
                           "--timeout", "60"], env=env, capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stderr[-3000:]
    logs = sorted(tmp_path.rglob("stderr.log"))
    assert len(logs) == 2, logs
    for log in logs:
        modules = [line.rsplit("|", 1)[-1].strip() for line in log.read_text().splitlines() if "|" in line]
        assert "gpuguard.cli" in modules and "gpuguard._core" in modules, modules[-20:]
        assert not [m for m in modules if m == "torch" or m.startswith("torch.")], log
