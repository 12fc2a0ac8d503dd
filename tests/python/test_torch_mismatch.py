"""A gpuguard whose tensor checks were built for another torch (pip upgraded torch after gpuguard was installed), or
whose package lacks them: bind(), the zero-code checks, watch(), the command line and explain keep working; the
tensor checks run in Python, with the same answers and reports as the compiled ones, after one warning that says why
and how to rebuild; doctor says which path runs.

Three packages stand for "built against one torch, imported under another" and "installed without _libtorch":
- real: gpuguard really built (pip install --no-build-isolation --target) by another interpreter of this Python
  version whose torch differs, GPUGUARD_TEST_OTHER_TORCH_PYTHON (CI: the middle corner, torch 2.11, runs this file
  with a venv of its own Python holding torch 2.6, whose wheels use the old C++ ABI, so its _libtorch cannot load
  here at all);
  skipped, saying so, where none is given;
- simulated (everywhere): a copy of this build whose build record names PyTorch 2.4.1 and whose gpuguard._libtorch
  is a file no loader can open;
- without_libtorch (everywhere): a copy of this build with its _libtorch*.so removed.
The loader must refuse the first two from the build record, without trying to load the module; everything else
runs from the package's own gpuguard._core.
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
from typing import Optional

import pytest

from gg_testing.paths import ROOT
import gpuguard
from gpuguard._libtorch_loader import build_record_name

pytestmark = pytest.mark.follows_torch

SIMULATED_TORCH = "2.4.1+cu124"
REBUILD = ("pip install --no-build-isolation --force-reinstall --no-deps . (run in the gpuguard clone it was installed "
           "from, in the environment that holds this torch)")
OTHER_PYTHON = os.environ.get("GPUGUARD_TEST_OTHER_TORCH_PYTHON")
SUFFIX = importlib.machinery.EXTENSION_SUFFIXES[0]


def _copy(site: Path) -> Path:
    """This build's package and its .pth, copied into ``site`` as pip installs them."""
    package = Path(gpuguard.__file__).parent
    shutil.copytree(package, site / "gpuguard", ignore=shutil.ignore_patterns("__pycache__"))
    for name in ("gpuguard_auto.pth", "_gpuguard_autostart.py"):
        shutil.copy(ROOT / "python" / name, site / name)
    return site / "gpuguard"


def _simulated(site: Path) -> tuple[Path, Optional[str]]:
    package = _copy(site)
    for built in package.glob("_libtorch*.so"):
        built.write_bytes(b"not a library: compiled for torch " + SIMULATED_TORCH.encode())
    (package / f"{build_record_name()}.py").write_text(f'TORCH_VERSION = "{SIMULATED_TORCH}"\nTORCH_CXX11_ABI = 1\n')
    return site, SIMULATED_TORCH


def _without_libtorch(site: Path) -> tuple[Path, Optional[str]]:
    removed = list(_copy(site).glob("_libtorch*.so"))
    assert removed, "this build has no gpuguard._libtorch to remove"
    for built in removed:
        built.unlink()
    return site, None


def _other_interpreter_facts() -> dict[str, str]:
    code = ("import importlib.metadata as m, json, sys; print(json.dumps({'python': '%d.%d' % sys.version_info[:2], "
            "'torch': m.version('torch')}))")
    proc = subprocess.run([OTHER_PYTHON, "-c", code], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, f"GPUGUARD_TEST_OTHER_TORCH_PYTHON={OTHER_PYTHON} has no torch: {proc.stderr}"
    return json.loads(proc.stdout)


def _real(site: Path) -> tuple[Path, Optional[str]]:
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


@pytest.fixture(scope="module", params=["real", "simulated", "without_libtorch"])
def mismatched(request, tmp_path_factory) -> tuple[Path, Optional[str]]:
    """(a folder holding the package and the .pth beside it, as site-packages would; the torch it was built for,
    None where its _libtorch was removed)"""
    site = tmp_path_factory.mktemp(f"site-{request.param}")
    return {"real": _real, "simulated": _simulated, "without_libtorch": _without_libtorch}[request.param](site)


def env_for(mismatched: tuple[Path, Optional[str]], fake_gpus, **extra: str) -> dict[str, str]:
    site = mismatched[0]
    env = fake_gpus.env("h100x4")
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT / "tests" / "python" / "auto_site"), str(site)])
    env["GPUGUARD_TEST_SITE"] = str(site)  # the .pth is read from the copy, as from an installed package
    env.update(extra)
    return env


def run(args: list[str], env: dict[str, str], cwd: Path, timeout: float = 240,
        stdin: str = "") -> subprocess.CompletedProcess[str]:
    return subprocess.run(args, env=env, cwd=cwd, capture_output=True, text=True, timeout=timeout, input=stdin)


def why(built_for: Optional[str], installed: str) -> str:
    """The warning's first line: why the compiled checks are not used, and the rebuild command."""
    if built_for is None:
        return (f"gpuguard: gpuguard._libtorch (its compiled tensor checks) is missing or unloadable: No module named "
                f"'gpuguard._libtorch'. Build it with: {REBUILD}")
    return (f"gpuguard: gpuguard was built for PyTorch {built_for}, but PyTorch {installed} is installed, so "
            f"gpuguard._libtorch (its compiled tensor checks) cannot load. Rebuild it against this torch: {REBUILD}")


IN_PYTHON = ("Until then, assert_same_device, same_device, guard and find_device_mismatch run in Python: the same "
             "checks and reports, but slower (about a millisecond a call on a model of a thousand tensors).")

# Each tensor check, passing and failing; the script prints what each answered, to compare with this process's
# compiled checks (CHECKS runs here too).
CHECKS = """
import json, os, sys, warnings
import torch
import gpuguard
from torch import nn


def answers():
    torch.manual_seed(0)
    out = {}

    def failed(fn):
        try:
            fn()
        except gpuguard.DeviceMismatchError as e:
            return [str(e), e.fix, e.details]
        return "passed"

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.a, self.b = nn.Linear(2, 2), nn.Linear(2, 2)

        def forward(self, x, mask=None):
            return self.b(self.a(x))

    x, far = torch.ones(2), torch.ones(2, device="meta")
    out["assert_same_device"] = [str(gpuguard.assert_same_device(Net(), x, {"k": [x]})),
                                 failed(lambda: gpuguard.assert_same_device(Net(), x, {"k": [far]}, expected="cpu"))]
    found = gpuguard.find_device_mismatch(Net(), far)
    out["find_device_mismatch"] = [gpuguard.find_device_mismatch(Net(), x), str(found), found.details]
    out["same_device"] = failed(lambda: gpuguard.same_device(lambda batch, *rest: batch)(x, far))
    net = Net()
    with gpuguard.guard(net):
        net(x)
        out["guard"] = failed(lambda: net(x, mask=far))
    split = Net()
    split.b.to("meta")
    with gpuguard.guard(split, deep=True) as handle:
        out["deep_hooked"] = handle.hooked_layers
        out["guard(deep=True)"] = failed(lambda: split(x))
    return out
"""

TRAIN = CHECKS + """
binding = gpuguard.bind()                       # one process: no store needed
facts = {"binding": str(binding.device), "devices": len(gpuguard.devices()),
         "explain": [d.kind for d in gpuguard.explain("RuntimeError: CUDA error: invalid device ordinal")]}
facts["answers"] = answers()
facts["answers_again"] = answers() == facts["answers"]  # no warning or state change the second time
facts["torch"] = torch.__version__
print(json.dumps(facts), flush=True)
nn.Linear(2, 2).to("meta")(torch.ones(2))       # PyTorch's own device-mismatch error, to the excepthook
"""


def compiled_answers() -> dict:
    """CHECKS' answers from this process's compiled checks, as JSON would carry them back."""
    from gpuguard import _libtorch_loader
    from gpuguard.tensors.implementation import tensor_checks

    assert tensor_checks() is _libtorch_loader.libtorch()
    scope: dict = {}
    exec(CHECKS, scope)  # noqa: S102 - the same code as the script runs
    return json.loads(json.dumps(scope["answers"]()))


def test_a_job_keeps_bind_devices_and_explain_and_the_tensor_checks_run_in_python_after_one_warning(
        mismatched, fake_gpus, tmp_path):
    (tmp_path / "train.py").write_text(TRAIN)
    env = env_for(mismatched, fake_gpus, CUDA_VISIBLE_DEVICES="2")
    proc = run([sys.executable, "-m", "gpuguard", "run", "--", sys.executable, "train.py"], env, tmp_path)
    facts = json.loads(proc.stdout.strip().splitlines()[-1])
    assert facts["binding"] == "cpu" or facts["binding"].startswith("cuda"), facts
    assert facts["devices"] == 1 and facts["explain"] == ["invalid_device_ordinal"]
    # every tensor check ran, and answered as the compiled checks answer here
    assert facts["answers"] == compiled_answers()
    assert facts["answers_again"] is True
    assert facts["answers"]["deep_hooked"] == ["a", "b"]
    # one warning, saying why and how to rebuild
    assert proc.stderr.count("GpuGuardWarning") == 1, proc.stderr
    assert f"{why(mismatched[1], facts['torch'])}\n{IN_PYTHON}" in proc.stderr, proc.stderr
    # the zero-code mode was on, and reports on PyTorch's own error with the Python checks
    assert "gpuguard: active (auto)" in proc.stderr
    assert proc.returncode != 0
    import torch
    from torch import nn

    report = gpuguard.find_device_mismatch(nn.Linear(2, 2).to("meta"), torch.ones(2))
    assert f"gpuguard: torch stopped in Linear of Linear.\n{report}" in proc.stderr, proc.stderr
    assert "not a library" not in proc.stderr and "undefined symbol" not in proc.stderr  # never tried to load it


def test_the_command_line_works_and_doctor_says_the_checks_run_in_python(mismatched, fake_gpus, tmp_path):
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
    installed = doc["versions"]["torch"]
    built_for = mismatched[1]
    if built_for is None:
        found = {f["code"]: f for f in doc["findings"]}["tensor_checks_missing"]
        assert doc["versions"]["tensor checks"] == "Python (gpuguard._libtorch is missing)"
        assert found["message"] == ("gpuguard was built without its compiled tensor checks (gpuguard._libtorch): "
                                    "assert_same_device, same_device, guard and find_device_mismatch run in Python "
                                    "instead: the same checks and reports, slower.")
        assert found["fix"] == f"Rebuild gpuguard with torch installed: {REBUILD}"
    else:
        found = {f["code"]: f for f in doc["findings"]}["torch_build_mismatch"]
        assert doc["versions"]["gpuguard built for torch"] == built_for
        assert doc["versions"]["tensor checks"] == (f"Python (gpuguard._libtorch was built for PyTorch {built_for}, "
                                                    f"not {installed})")
        assert found["message"].startswith(f"gpuguard's tensor checks were built for PyTorch {built_for}, but "
                                           f"PyTorch {installed} is installed: assert_same_device, same_device, guard "
                                           f"and find_device_mismatch run in Python instead")
        assert found["fix"] == f"Rebuild gpuguard against this torch: {REBUILD}"
    assert found["severity"] == "warning"


WATCHED = """
import glob, os, time
import torch, torch.distributed as dist
import gpuguard

def both_reported():  # rank 1 stays behind until each rank wrote its stall report (60 s at most)
    return len(glob.glob(os.path.join(os.environ["GPUGUARD_WATCH_DIR"], "gpuguard-stall-rank*.json"))) >= 2 or \\
        time.monotonic() > started + 60
dist.init_process_group("gloo")
gpuguard.watch(stall_after=3, tick=0.5, gather=3)
rank, started = dist.get_rank(), time.monotonic()
for step in range(3):
    if rank == 1 and step == 2:
        while not both_reported(): time.sleep(0.2)  # rank 1 falls behind; rank 0 waits in the all-reduce
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
    assert f'File "{tmp_path / "watched.py"}", line 14 in <module>' in proc.stderr, proc.stderr


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
    if built_for in (SIMULATED_TORCH, None):
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
