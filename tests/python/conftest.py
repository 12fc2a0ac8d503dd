"""Shared fixtures: the fake CUDA driver and NCCL (tests/fakes), their topologies, and subprocess helpers.

The driver reads CUDA_VISIBLE_DEVICES once per process (at cuInit), so every test that varies visibility
runs its code in a fresh interpreter through `run_python`.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path
from typing import Any, Optional

import pytest

ROOT = Path(__file__).resolve().parents[2]
TOPOLOGIES = ROOT / "tests" / "fakes" / "topologies"


def _fakes_dir() -> Path:
    """The folder holding libgpuguard_fake_cuda.so: $GPUGUARD_FAKES_DIR, the dev build, or a fresh build."""
    candidates = [os.environ.get("GPUGUARD_FAKES_DIR"), str(ROOT / "build" / "dev" / "tests" / "fakes")]
    for c in candidates:
        if c and (Path(c) / "libgpuguard_fake_cuda.so").exists():
            return Path(c)
    out = ROOT / "build" / "fakes-pytest"
    subprocess.run(["cmake", "-S", str(ROOT / "tests" / "fakes"), "-B", str(out)], check=True,
                   stdout=subprocess.DEVNULL)
    subprocess.run(["cmake", "--build", str(out)], check=True, stdout=subprocess.DEVNULL)
    return out


@pytest.fixture(scope="session")
def fakes_dir() -> Path:
    return _fakes_dir()


class FakeGpus:
    """Environment for a process that should see the fake driver with a given topology."""

    def __init__(self, fakes: Path, state_root: Optional[str] = None) -> None:
        self.fakes = fakes
        self.state_root = state_root

    def topology(self, name: str) -> dict[str, Any]:
        return json.loads((TOPOLOGIES / f"{name}.json").read_text())

    def env(self, topology: str = "h100x8", visible: Optional[str] = None, **extra: str) -> dict[str, str]:
        env = dict(os.environ)
        env.pop("CUDA_VISIBLE_DEVICES", None)
        path = Path(topology) if topology.endswith(".json") else TOPOLOGIES / f"{topology}.json"
        env["GPUGUARD_LIBCUDA"] = str(self.fakes / "libgpuguard_fake_cuda.so")
        nccl = self.fakes / "libgpuguard_fake_nccl.so"
        if nccl.exists():
            env["GPUGUARD_LIBNCCL"] = str(nccl)
        nvml = self.fakes / "libgpuguard_fake_nvml.so"
        if nvml.exists():
            env["GPUGUARD_LIBNVML"] = str(nvml)
        # the contexts the fake driver's processes hold, for the fake NVML: one folder per environment, so that
        # processes of other tests never show up on this one's GPUs
        env["GPUGUARD_FAKE_GPU_STATE_DIR"] = tempfile.mkdtemp(prefix="gg-fake-gpu-", dir=self.state_root)
        env["GPUGUARD_FAKE_TOPOLOGY"] = str(path)
        # where the fake NCCL's ranks meet, under pytest's own temporary folder rather than the fake's default in /tmp
        env.setdefault("GPUGUARD_FAKE_NCCL_DIR", os.path.join(self.state_root or tempfile.gettempdir(), "fake-nccl"))
        if visible is not None:
            env["CUDA_VISIBLE_DEVICES"] = visible
        env["PYTHONPATH"] = os.pathsep.join(
            [str(ROOT / "python")] + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
        env.update(extra)
        return env


@pytest.fixture(scope="session")
def fake_gpus(fakes_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> FakeGpus:
    return FakeGpus(fakes_dir, str(tmp_path_factory.mktemp("fake-gpu-state")))


def no_driver_env(**extra: str) -> dict[str, str]:
    env = dict(os.environ)
    env["GPUGUARD_LIBCUDA"] = "/nonexistent/libcuda.so.1"
    env["GPUGUARD_LIBNVML"] = "/nonexistent/libnvidia-ml.so.1"
    env["PYTHONPATH"] = os.pathsep.join(
        [str(ROOT / "python")] + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
    env.update(extra)
    return env


def run_python(code: str, env: dict[str, str], timeout: float = 120, check: bool = True) -> subprocess.CompletedProcess[str]:
    """Runs `code` in a fresh interpreter; on failure with check=True, fails the test showing its output."""
    proc = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], env=env, capture_output=True,
                          text=True, timeout=timeout)
    if check and proc.returncode != 0:
        pytest.fail(f"subprocess failed ({proc.returncode}):\nstdout:\n{proc.stdout}\nstderr:\n{proc.stderr}")
    return proc


def run_json(code: str, env: dict[str, str], timeout: float = 120) -> Any:
    """Runs `code`, which must print one JSON document as its last stdout line, and returns it."""
    proc = run_python(code, env, timeout)
    return json.loads(proc.stdout.strip().splitlines()[-1])


def run_cli(args: list[str], env: dict[str, str], timeout: float = 120,
            stdin: Optional[str] = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "gpuguard", *args], env=env, capture_output=True, text=True,
                          timeout=timeout, input=stdin)


# Prepended to a script run in a fresh interpreter: its tensor checks run in Python (gpuguard._python_checks), as
# where gpuguard._libtorch cannot load, without the warning that says so.
USE_PYTHON_CHECKS = ("import gpuguard._libtorch_loader as _loader, gpuguard._python_checks as _python_checks\n"
                     "_loader._checks = _python_checks\n")


@pytest.fixture(params=["C++", "Python"])
def tensor_checks_impl(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Runs a test against each implementation of the tensor checks: the compiled gpuguard._libtorch, and
    gpuguard._python_checks, which runs where _libtorch cannot load and must word every report alike. Checks made
    inside the test (guard()'s hooks included) take the implementation chosen here."""
    from gpuguard import _libtorch_loader, _python_checks

    implementation = _libtorch_loader.libtorch() if request.param == "C++" else _python_checks
    monkeypatch.setattr(_libtorch_loader, "_checks", implementation)
    return str(request.param)
