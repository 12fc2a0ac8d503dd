"""A gpuguard whose tensor checks were built for another torch (pip upgraded torch after gpuguard was installed):
bind(), the zero-code checks, watch(), the command line and explain keep working; the tensor checks raise one clear
error each time they are used, and doctor reports it as a finding.

Two packages stand for "built against one torch, imported under another":
- real: gpuguard really built (pip install --no-build-isolation --target) by another interpreter of this Python
  version whose torch differs, GPUGUARD_TEST_OTHER_TORCH_PYTHON (CI: the middle corner runs this file with the
  oldest corner's Python, torch 2.6, whose wheels use the old C++ ABI, so its _libtorch cannot load here at all);
  skipped, saying so, where none is given;
- simulated (everywhere): a copy of this build whose build record names PyTorch 2.4.1 and whose gpuguard._libtorch
  is a file no loader can open.
The loader must refuse either from the build record, without trying to load the module; everything else runs from
the package's own gpuguard._core.
"""

from __future__ import annotations

import importlib.machinery
import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from gg_testing.paths import ROOT
import gpuguard
from gpuguard._libtorch_loader import build_record_name

SIMULATED_TORCH = "2.4.1+cu124"
REBUILD = "pip install --no-build-isolation --force-reinstall --no-deps gpuguard"
OTHER_PYTHON = os.environ.get("GPUGUARD_TEST_OTHER_TORCH_PYTHON")
SUFFIX = importlib.machinery.EXTENSION_SUFFIXES[0]


def _simulated(site: Path) -> tuple[Path, str]:
    package = Path(gpuguard.__file__).parent
    shutil.copytree(package, site / "gpuguard", ignore=shutil.ignore_patterns("__pycache__"))
    for built in (site / "gpuguard").glob("_libtorch*.so"):
        built.write_bytes(b"not a library: compiled for torch " + SIMULATED_TORCH.encode())
    (site / "gpuguard" / f"{build_record_name()}.py").write_text(
        f'TORCH_VERSION = "{SIMULATED_TORCH}"\nTORCH_CXX11_ABI = 1\n')
    for name in ("gpuguard_auto.pth", "_gpuguard_autostart.py"):
        shutil.copy(ROOT / "python" / name, site / name)
    return site, SIMULATED_TORCH


def _other_interpreter_facts() -> dict[str, str]:
    code = ("import importlib.metadata as m, json, sys; print(json.dumps({'python': '%d.%d' % sys.version_info[:2], "
            "'torch': m.version('torch')}))")
    proc = subprocess.run([OTHER_PYTHON, "-c", code], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, f"GPUGUARD_TEST_OTHER_TORCH_PYTHON={OTHER_PYTHON} has no torch: {proc.stderr}"
    return json.loads(proc.stdout)


def _real(site: Path) -> tuple[Path, str]:
    """gpuguard built from this checkout by the other interpreter, installed into ``site`` as pip installs it."""
    if not OTHER_PYTHON:
        pytest.skip("needs GPUGUARD_TEST_OTHER_TORCH_PYTHON: an interpreter of this Python version with another torch "
                    "(CI sets it to the oldest corner's), to build gpuguard against that torch")
    facts = _other_interpreter_facts()
    import torch

    ours = "%d.%d" % sys.version_info[:2]
    assert facts["python"] == ours, f"GPUGUARD_TEST_OTHER_TORCH_PYTHON is Python {facts['python']}, not {ours}"
    assert facts["torch"].split("+")[0] != torch.__version__.split("+")[0], "the other interpreter has this torch"
    # the build folder and type setup.sh uses for that interpreter: a build made there already is reused
    build = ROOT / "build" / f"wheel-py{facts['python']}-torch{facts['torch'].split('+')[0]}"
    build_type = os.environ.get("GPUGUARD_BUILD_TYPE", "Release")
    proc = subprocess.run([OTHER_PYTHON, "-m", "pip", "install", "-q", "--disable-pip-version-check",
                           "--no-build-isolation", "--no-deps", "--target", str(site), f"-Cbuild-dir={build}",
                           f"-Ccmake.build-type={build_type}", str(ROOT)],
                          capture_output=True, text=True, timeout=1500)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    record = (site / "gpuguard" / f"{build_record_name()}.py").read_text()
    built_for = record.split('TORCH_VERSION = "', 1)[1].split('"', 1)[0]
    assert built_for.split("+")[0] == facts["torch"].split("+")[0], record
    return site, built_for


@pytest.fixture(scope="module", params=["real", "simulated"])
def mismatched(request, tmp_path_factory) -> tuple[Path, str]:
    """(a folder holding the package and the .pth beside it, as site-packages would; the torch it was built for)"""
    site = tmp_path_factory.mktemp(f"site-{request.param}")
    return _real(site) if request.param == "real" else _simulated(site)


def env_for(mismatched: tuple[Path, str], fake_gpus, **extra: str) -> dict[str, str]:
    site = mismatched[0]
    env = fake_gpus.env("h100x4")
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT / "tests" / "python" / "auto_site"), str(site)])
    env["GPUGUARD_TEST_SITE"] = str(site)  # the .pth is read from the copy, as from an installed package
    env.update(extra)
    return env


def run(args: list[str], env: dict[str, str], cwd: Path, timeout: float = 240,
        stdin: str = "") -> subprocess.CompletedProcess[str]:
    return subprocess.run(args, env=env, cwd=cwd, capture_output=True, text=True, timeout=timeout, input=stdin)


def expected_error(built_for: str, installed: str) -> str:
    return (f"gpuguard was built for PyTorch {built_for}, but PyTorch {installed} is installed, so its tensor "
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
    assert facts["errors"] == [expected_error(mismatched[1], facts["torch"])] * 4  # every call, the same words
    # the zero-code mode was on and still explains what it cannot report
    assert "gpuguard: active (auto)" in proc.stderr
    assert proc.returncode != 0
    assert f"gpuguard: no report on which tensors disagree: {expected_error(mismatched[1], facts['torch'])}" \
        in proc.stderr
    assert "not a library" not in proc.stderr and "undefined symbol" not in proc.stderr  # never tried to load it


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
    assert doc["versions"]["gpuguard built for torch"] == mismatched[1]
    assert found["severity"] == "warning"
    assert found["message"].startswith(f"gpuguard's tensor checks were built for PyTorch {mismatched[1]}, but "
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
    t = torch.ones(4)
    dist.all_reduce(t)
dist.destroy_process_group()
"""
# `t` outlives destroy_process_group() on purpose: torch 2.6's gloo group holds the GIL in its destructor while
# its worker thread may still be freeing the last all-reduce's work, whose tensor then needs the GIL (fixed in
# torch 2.8, pytorch/pytorch#154976). With a temporary tensor there, 5 of 20 runs of this script hung in
# destroy_process_group() on torch 2.6 without gpuguard; with `t` kept, 0 of 20.


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


LOAD_DIRECTLY = """
import importlib.util, sys
import torch
path = sys.argv[1]
spec = importlib.util.spec_from_file_location("gpuguard._libtorch", path)
try:
    spec.loader.exec_module(importlib.util.module_from_spec(spec))
except ImportError as exc:
    print("ImportError:", exc)
else:
    print("loaded")
"""


def test_the_module_built_for_the_other_torch_really_cannot_load_here(mismatched, tmp_path):
    """What the build record spares the user: with another C++ ABI (torch 2.6's wheels against later ones) the
    module built for the other torch fails to load at all, on an undefined symbol."""
    site, built_for = mismatched
    if built_for == SIMULATED_TORCH:
        pytest.skip("the simulated build has no module to load; the real one (GPUGUARD_TEST_OTHER_TORCH_PYTHON) does")
    import torch

    record = (site / "gpuguard" / f"{build_record_name()}.py").read_text()
    if f"TORCH_CXX11_ABI = {int(torch._C._GLIBCXX_USE_CXX11_ABI)}" in record:
        pytest.skip(f"torch {built_for} and {torch.__version__} share a C++ ABI: whether the module loads depends on "
                    f"which symbols changed")
    [module] = (site / "gpuguard").glob(f"_libtorch{SUFFIX}")
    proc = run([sys.executable, "-c", LOAD_DIRECTLY, str(module)], dict(os.environ), tmp_path)
    assert proc.stdout.startswith("ImportError:") and "undefined symbol" in proc.stdout, proc.stdout + proc.stderr


DUPLICATE_JOB = """
import torch, torch.distributed as dist
dist.init_process_group("nccl")
dist.all_reduce(torch.ones(1))
"""


@pytest.mark.slow
def test_an_unmodified_two_rank_job_on_a_one_gpu_host_still_stops_on_both_ranks(mismatched, fake_gpus, tmp_path):
    """The zero-code check lives in gpuguard._core, which needs no torch: a torch upgrade leaves it working."""
    (tmp_path / "train.py").write_text(DUPLICATE_JOB)
    env = env_for(mismatched, fake_gpus)
    env["GPUGUARD_FAKE_TOPOLOGY"] = str(ROOT / "tests" / "fakes" / "topologies" / "h100x1.json")
    proc = run([sys.executable, "-m", "gpuguard", "run", "--", sys.executable, "-m", "torch.distributed.run",
                "--standalone", "--nproc_per_node=2", "train.py"], env, tmp_path)
    assert proc.returncode != 0
    assert proc.stderr.count("gpuguard.errors.DuplicateDeviceError: 2 ranks of group 'default' share 1 GPU") == 2, \
        proc.stderr
