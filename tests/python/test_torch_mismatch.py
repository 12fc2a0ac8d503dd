"""A gpuguard whose tensor checks were built for another torch (pip upgraded torch after gpuguard was installed):
bind(), the zero-code checks, watch(), the command line and explain keep working; the tensor checks raise one clear
error each time they are used, and doctor reports it as a finding.

Stand-in for "built against one torch, imported under another": a copy of this build's package whose build record
(_build_info.py) names PyTorch 2.4.1 and whose gpuguard._libtorch is replaced by a file no loader can open, as a
module compiled against another torch's symbols cannot be loaded into this one. The loader must refuse it from the
build record, without trying to load it; everything else runs from the copy's real gpuguard._core.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import gpuguard
from conftest import ROOT

OTHER_TORCH = "2.4.1"
REBUILD = "pip install --no-build-isolation --force-reinstall --no-deps gpuguard"


@pytest.fixture(scope="module")
def mismatched(tmp_path_factory) -> Path:
    """A folder holding the copy of the package (put it first on PYTHONPATH), the .pth beside it."""
    site = tmp_path_factory.mktemp("site")
    package = Path(gpuguard.__file__).parent
    shutil.copytree(package, site / "gpuguard", ignore=shutil.ignore_patterns("__pycache__"))
    for built in (site / "gpuguard").glob("_libtorch*.so"):
        built.write_bytes(b"not a library: compiled for torch " + OTHER_TORCH.encode())
    (site / "gpuguard" / "_build_info.py").write_text(f'TORCH_VERSION = "{OTHER_TORCH}+cu124"\nTORCH_CXX11_ABI = 1\n')
    for name in ("gpuguard_auto.pth", "_gpuguard_autostart.py"):
        shutil.copy(ROOT / "python" / name, site / name)
    return site


def env_for(site: Path, fake_gpus, **extra: str) -> dict[str, str]:
    env = fake_gpus.env("h100x4")
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT / "tests" / "python" / "auto_site"), str(site)])
    env["GPUGUARD_TEST_SITE"] = str(site)  # the .pth is read from the copy, as from an installed package
    env.update(extra)
    return env


def run(args: list[str], env: dict[str, str], cwd: Path, timeout: float = 240,
        stdin: str = "") -> subprocess.CompletedProcess[str]:
    return subprocess.run(args, env=env, cwd=cwd, capture_output=True, text=True, timeout=timeout, input=stdin)


def expected_error(installed: str) -> str:
    return (f"gpuguard was built for PyTorch {OTHER_TORCH}+cu124, but PyTorch {installed} is installed, so its tensor "
            f"checks (assert_same_device, same_device, guard, find_device_mismatch) cannot load; everything else "
            f"works. Rebuild it against this torch: {REBUILD} (or, in a source checkout, pip install "
            f"--no-build-isolation .)")


TRAIN = """
import json, os, sys
import torch
import gpuguard
from torch import nn

binding = gpuguard.bind()                       # one process: no store needed
facts = {"binding": str(binding.device), "devices": len(gpuguard.devices()),
         "explain": [d.kind for d in gpuguard.explain("RuntimeError: CUDA error: invalid device ordinal")]}
model = nn.Linear(2, 2)
errors = []
for call in (lambda: gpuguard.assert_same_device(model, torch.ones(2)),
             lambda: gpuguard.find_device_mismatch(model, torch.ones(2)),
             lambda: gpuguard.guard(model),
             lambda: gpuguard.same_device(lambda x: x)(torch.ones(1))):
    try:
        call()
    except ImportError as exc:
        errors.append(str(exc))
facts["errors"] = errors
facts["torch"] = torch.__version__
print(json.dumps(facts), flush=True)
model.to("meta")(torch.ones(2))                 # PyTorch's own device-mismatch error, to the excepthook
"""


def test_a_job_keeps_bind_devices_and_explain_and_the_tensor_checks_say_why_they_cannot_run(
        mismatched, fake_gpus, tmp_path):
    (tmp_path / "train.py").write_text(TRAIN)
    env = env_for(mismatched, fake_gpus, CUDA_VISIBLE_DEVICES="2")
    proc = run([sys.executable, "-m", "gpuguard", "run", "--", sys.executable, "train.py"], env, tmp_path)
    facts = json.loads(proc.stdout.strip().splitlines()[-1])
    assert facts["binding"] == "cpu" or facts["binding"].startswith("cuda"), facts
    assert facts["devices"] == 1 and facts["explain"] == ["invalid_device_ordinal"]
    assert facts["errors"] == [expected_error(facts["torch"])] * 4  # every call, the same words
    # the zero-code mode was on and still explains what it cannot report
    assert "gpuguard: active (auto)" in proc.stderr
    assert proc.returncode != 0
    assert f"gpuguard: no report on which tensors disagree: {expected_error(facts['torch'])}" in proc.stderr
    assert "not a library" not in proc.stderr  # the loader never tried to load the file


def test_the_command_line_works_and_doctor_names_the_mismatch(mismatched, fake_gpus, tmp_path):
    env = env_for(mismatched, fake_gpus, CUDA_VISIBLE_DEVICES="0,1")
    devices = run([sys.executable, "-m", "gpuguard", "devices", "--json"], env, tmp_path)
    assert devices.returncode == 0, devices.stderr
    assert len(json.loads(devices.stdout)["devices"]) == 2
    explained = run([sys.executable, "-m", "gpuguard", "explain", "--json"], env, tmp_path,
                    stdin="[rank1]: RuntimeError: CUDA error: invalid device ordinal\n")
    assert explained.returncode == 0, explained.stderr
    assert [d["kind"] for d in json.loads(explained.stdout)["diagnoses"]] == ["invalid_device_ordinal"]
    doctor = run([sys.executable, "-m", "gpuguard", "doctor", "--json"], env, tmp_path)
    doc = json.loads(doctor.stdout)
    found = {f["code"]: f for f in doc["findings"]}["torch_build_mismatch"]
    assert doc["versions"]["gpuguard built for torch"] == f"{OTHER_TORCH}+cu124"
    assert found["severity"] == "warning"
    assert found["message"].startswith(f"gpuguard's tensor checks were built for PyTorch {OTHER_TORCH}+cu124, but "
                                       f"PyTorch {doc['versions']['torch']} is installed: assert_same_device")
    assert found["fix"] == f"Rebuild gpuguard against this torch: {REBUILD}"


WATCHED = """
import os, time
import torch, torch.distributed as dist
import gpuguard

dist.init_process_group("gloo")
gpuguard.watch(stall_after=3, tick=0.5, gather=3)
rank = dist.get_rank()
for step in range(3):
    if rank == 1 and step == 2:
        time.sleep(12)                          # rank 1 falls behind; rank 0 waits in the all-reduce
    dist.all_reduce(torch.ones(4))
dist.destroy_process_group()
"""


@pytest.mark.slow
def test_watch_names_the_stuck_rank(mismatched, fake_gpus, tmp_path):
    (tmp_path / "watched.py").write_text(textwrap.dedent(WATCHED))
    env = env_for(mismatched, fake_gpus, GPUGUARD_WATCH_DIR=str(tmp_path))
    proc = run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", "watched.py"],
               env, tmp_path)
    assert proc.returncode == 0, proc.stderr
    for rank in (0, 1):
        assert (f"[rank {rank}] gpuguard: collective stall: rank 1 never entered ALL_REDUCE #3 on group 'default_pg' "
                f"(ranks 0, 1)") in proc.stderr, proc.stderr
    assert f'File "{tmp_path / "watched.py"}", line 11 in <module>' in proc.stderr, proc.stderr
