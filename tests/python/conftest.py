"""pytest fixtures of tests/python: the fake CUDA driver and NCCL (tests/fakes) and, after every test, the end of
any job it left running. What the fixtures use lives in the test-support package, tests/gg_testing.

The driver reads CUDA_VISIBLE_DEVICES once per process (at cuInit), so every test that varies visibility
runs its code in a fresh interpreter through gg_testing.procs.run_python.
"""

from __future__ import annotations

from pathlib import Path
from typing import Iterator

import pytest

from gg_testing.env import FakeGpus, fakes_dir as find_fakes_dir
from gg_testing.cpu_time import *  # noqa: F401,F403  (each test's CPU seconds, for CI's table)
from gg_testing.launch import reap_all
from gg_testing.ray_start import until_a_driver_joins, workers_at_the_tests_priority

pytest_plugins = ("gg_testing.schedule",)  # a parallel step's costliest files first

workers_at_the_tests_priority()  # before any test builds an environment from os.environ


@pytest.fixture(scope="session")
def fakes_dir() -> Path:
    return find_fakes_dir()


@pytest.fixture(scope="session")
def fake_gpus(fakes_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> FakeGpus:
    return FakeGpus(fakes_dir, str(tmp_path_factory.mktemp("fake-gpu-state")))


@pytest.fixture(autouse=True)
def _end_jobs_left_running() -> Iterator[None]:
    """A test that fails before its job ended leaves nothing running for the next one."""
    yield
    reap_all()


@pytest.fixture(autouse=True)
def _one_ray_cluster_starting_at_a_time(request: pytest.FixtureRequest) -> Iterator[None]:
    """A test marked ray_cluster starts once no other test's Ray cluster is starting, and holds the others back
    until its own driver joined its cluster (gg_testing.ray_start). ray_cluster(shared=True): the test uses the
    cluster its module's fixture started, which held them back itself."""
    marker = request.node.get_closest_marker("ray_cluster")
    if marker is None or marker.kwargs.get("shared"):
        yield
        return
    with until_a_driver_joins():
        yield


@pytest.fixture(params=["C++", "Python"])
def tensor_checks_impl(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Runs a test against each implementation of the tensor checks: the compiled gpuguard._libtorch, and
    gpuguard.tensors._python_checks, which runs where _libtorch cannot load and must word every report alike. Checks
    made inside the test (guard()'s hooks included) take the implementation chosen here."""
    from gpuguard import _libtorch_loader
    from gpuguard.tensors import _python_checks, implementation as chosen

    implementation = _libtorch_loader.libtorch() if request.param == "C++" else _python_checks
    monkeypatch.setattr(chosen, "_checks", implementation)
    return str(request.param)


@pytest.fixture
def fake(monkeypatch: pytest.MonkeyPatch) -> Iterator[object]:
    """torch's FakeTensorMode, for models placed across GPUs this machine does not have. Without a GPU, torch 2.6
    reaches the CUDA runtime for fake CUDA tensors in two places: random initialisation asks for a generator ("CUDA
    driver version is insufficient"), and autograd's AccumulateGrad asks for the current stream (an exception inside
    noexcept code: the process aborts). So layers start at zero and the forwards record no graph: the tests that use
    it are about devices only."""
    import torch
    from torch._subclasses.fake_tensor import FakeTensorMode

    for name in ("uniform_", "normal_"):
        monkeypatch.setattr(torch.Tensor, name, lambda self, *args, **kwargs: self.zero_())
    with torch.no_grad(), FakeTensorMode(allow_non_fake_inputs=True) as mode:
        yield mode
