"""Ray as Ray users write it: the README's example, a driver script whose actor lives in __main__, run as
`python examples/ray_placement_example.py ...` under a real local Ray and the fake driver, as its docstring says."""

from __future__ import annotations

import pickle
import subprocess
import sys

import pytest

from conftest import ROOT
from test_bind import scrubbed

pytestmark = pytest.mark.slow
ray = pytest.importorskip("ray")

EXAMPLE = ROOT / "examples" / "ray_placement_example.py"


def run_example(fake_gpus, *args: str) -> str:
    proc = subprocess.run([sys.executable, str(EXAMPLE), "--fake-gpus", "8", "--cpus-per-worker", "0.1", *args],
                          env=scrubbed(fake_gpus.env("h100x8")), capture_output=True, text=True, timeout=400,
                          cwd=str(ROOT))
    output = proc.stdout + proc.stderr
    assert proc.returncode == 0, output[-4000:]
    assert "cannot pickle" not in output, output[-4000:]
    return proc.stdout


def test_the_example_places_two_colocated_groups_one_rank_per_gpu_each(fake_gpus):
    out = run_example(fake_gpus, "--workers", "8", "--max-colocate", "2")
    assert "Ray gave the actors of group 'actor' 1/2 GPU each" in out, out[-3000:]
    assert "Ray gave the actors of group 'rollout' 1/2 GPU each" in out, out[-3000:]
    assert "DuplicateDeviceError" not in out


def test_the_example_with_fractional_gpus_stops_every_rank_with_the_duplicate_report(fake_gpus):
    out = run_example(fake_gpus, "--workers", "6", "--fractional")
    assert "is shared by ranks 0, 1 and 2" in out and "is shared by ranks 3, 4 and 5" in out, out[-3000:]
    assert "Fix: give every rank of a group a whole GPU: gpuguard.ray_placement(max_colocate=1)" in out


def test_the_package_and_what_it_hands_to_ray_pickle_by_reference_or_by_value():
    import gpuguard
    from ray import cloudpickle

    assert pickle.loads(cloudpickle.dumps(gpuguard)) is gpuguard  # a module: by reference, as Ray needs

    def uses_gpuguard():  # what a driver script's actor method closes over
        return gpuguard.bind, gpuguard.DuplicateDeviceError

    assert pickle.loads(cloudpickle.dumps(uses_gpuguard))() == (gpuguard.bind, gpuguard.DuplicateDeviceError)


def test_a_gpuguard_error_raised_in_an_actor_reaches_ray_get_with_its_class_message_and_fields(fake_gpus):
    import gpuguard

    @ray.remote
    class Rank:
        def check(self):
            raise gpuguard.DuplicateDeviceError("ranks 0 and 1 share GPU-1. Fix: one GPU per rank",
                                                fix="Fix: one GPU per rank", ranks=[0, 1], uuid="GPU-1")

    ray.init(num_cpus=1, include_dashboard=False, log_to_driver=False,
             runtime_env={"env_vars": {"PYTHONPATH": fake_gpus.env("h100x1")["PYTHONPATH"]}})
    try:
        with pytest.raises(gpuguard.DuplicateDeviceError) as caught:
            ray.get(Rank.remote().check.remote(), timeout=120)
    finally:
        ray.shutdown()
    err = caught.value
    assert err.details == {"ranks": [0, 1], "uuid": "GPU-1"} and err.fix == "Fix: one GPU per rank"
    assert err.ranks == [0, 1] and "ranks 0 and 1 share GPU-1" in str(err)
