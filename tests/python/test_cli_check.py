"""`gpuguard check` as users run it: under the job's own launcher (a real torchrun), every rank binds, meets
the others, and exits 0 with its binding, or 1 with the same duplicate report on every rank."""

from __future__ import annotations

import json
import sys

import pytest

from gg_testing import launch
from gg_testing.env import scrubbed
from gg_testing.procs import run_json

pytestmark = pytest.mark.version_independent  # CI runs this file on the oldest corner only (pyproject's markers)


def torchrun_check(fake_gpus, tmp_path, topology: str, nproc: int) -> launch.Finished:
    """`gpuguard check --json` on every rank, each rank's stdout in its own file (launch.rank_json reads them)."""
    return launch.torchrun("-m", "gpuguard", "check", "--json", "--timeout", "60", nproc=nproc,
                           env=scrubbed(fake_gpus.env(topology)), workdir=tmp_path, logs=True)


@pytest.mark.slow
def test_check_passes_with_one_gpu_per_rank(fake_gpus, tmp_path):
    proc = torchrun_check(fake_gpus, tmp_path, "h100x4", 2)
    assert proc.returncode == 0, proc.stderr[-3000:]
    ranks = launch.rank_json(proc)
    assert sorted(ranks) == [0, 1]
    uuids = [g["uuid"] for g in fake_gpus.topology("h100x4")["gpus"]]
    assert [ranks[r]["binding"]["uuid"] for r in (0, 1)] == uuids[:2]
    assert all(ranks[r]["ok"] for r in (0, 1))


@pytest.mark.slow
def test_check_fails_on_every_rank_with_the_same_report_when_two_ranks_share_a_gpu(fake_gpus, tmp_path):
    proc = torchrun_check(fake_gpus, tmp_path, "h100x1", 2)
    assert proc.returncode != 0
    ranks = launch.rank_json(proc)
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
    proc = launch.torchrun("-m", "gpuguard", "check", "--json", "--timeout", "60", nproc=2, env=env,
                           workdir=tmp_path, logs=True)
    assert proc.returncode == 0, proc.stderr[-3000:]
    logs = sorted((tmp_path / "logs").rglob("stderr.log"))
    assert len(logs) == 2, logs
    for log in logs:
        modules = [line.rsplit("|", 1)[-1].strip() for line in log.read_text().splitlines() if "|" in line]
        assert "gpuguard.cli" in modules and "gpuguard._core" in modules, modules[-20:]
        assert not [m for m in modules if m == "torch" or m.startswith("torch.")], log


ONE_WRITE_PER_LINE = r"""
import io, json, sys
from gpuguard import cli

class Recorder(io.RawIOBase):
    '''What the file descriptor would receive, write by write, as with `python -u` (no fileno: the fallback).'''
    def __init__(self):
        self.writes = []
    def writable(self):
        return True
    def write(self, b):
        self.writes.append(bytes(b))
        return len(b)

raw = Recorder()
sys.stdout = io.TextIOWrapper(raw, write_through=True)
code = cli.main(["check", "--json", "--timeout", "20"])
sys.stdout.flush()
sys.stdout = sys.__stdout__
print(json.dumps({"code": code, "writes": [w.decode() for w in raw.writes]}))
"""


def test_check_json_writes_each_line_in_one_write(fake_gpus):
    """Unbuffered (python -u), print() wrote the object and its newline in two writes, so two ranks on one
    stdout could glue their objects on one line ({...}{...}); now each line is one write."""
    got = run_json(ONE_WRITE_PER_LINE, scrubbed(fake_gpus.env("h100x4")))
    assert got["code"] == 0
    assert len(got["writes"]) == 1, got["writes"]
    line = got["writes"][0]
    assert line.endswith("}\n") and json.loads(line)["ok"] is True


@pytest.mark.slow
def test_check_json_lines_of_ranks_sharing_one_unbuffered_stdout_each_parse(fake_gpus, tmp_path):
    """4 ranks under torchrun write to the launcher's own stdout (no --tee: they inherit it), unbuffered."""
    # the ranks' lines share one stream on purpose: that they stay whole there is the subject
    env = dict(scrubbed(fake_gpus.env("h100x4")), PYTHONUNBUFFERED="1")
    proc = launch.torchrun("-m", "gpuguard", "check", "--json", "--timeout", "60", nproc=4, env=env,
                           workdir=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    objects = [json.loads(line) for line in proc.stdout.splitlines() if line.strip()]
    assert sorted(o["binding"]["rank"] for o in objects) == [0, 1, 2, 3], proc.stdout
