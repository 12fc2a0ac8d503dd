"""Ray as Ray users write it: a driver script whose actor and task live in __main__, run as `python script.py`
under a real local Ray and the fake driver, and everything gpuguard hands to Ray pickled as Ray needs it.

The script (ray_scripts/driver_actor.py) is the shape that failed with "cannot pickle '_Package' object":
Ray pickles classes and functions of ``__main__`` by value, with the module globals they use (``gpuguard``).
"""

from __future__ import annotations

import pickle
import re
import sys

import pytest

from gg_testing import launch
from gg_testing.env import scrubbed
from gg_testing.paths import ROOT
from gg_testing.ray_start import init_in_this_process, ray_start_timed_out, until_a_driver_joins

ray = pytest.importorskip("ray")

SCRIPTS = ROOT / "tests" / "python" / "ray_scripts"


@pytest.mark.slow
@pytest.mark.ray_cluster
def test_a_driver_script_whose_actor_and_task_live_in_main_uses_gpuguard_under_real_ray(fake_gpus, tmp_path):
    env = scrubbed(fake_gpus.env("h100x4", RAY_DISABLE_USAGE_STATS="1"))
    proc = launch.Job([sys.executable, "driver_actor.py"], env, tmp_path, cwd=str(SCRIPTS)).wait(400)
    out = proc.stdout + proc.stderr
    if ray_start_timed_out(proc.returncode, out):  # Ray's own start, before any gpuguard code
        with until_a_driver_joins():  # alone again, as conftest started the first
            proc = launch.Job([sys.executable, "driver_actor.py"], env, tmp_path / "again",
                              cwd=str(SCRIPTS)).wait(400)
        out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-5000:]
    assert "cannot pickle" not in out, out[-5000:]
    gpus = [g["uuid"] for g in fake_gpus.topology("h100x4")["gpus"]]
    # bind() in each placed actor; the Binding comes back to the driver
    assert f"gpuguard: rank 0/2 local 0/? group trainers -> cuda:0 ({gpus[0]}," in proc.stdout, out[-5000:]
    assert f"gpuguard: rank 1/2 local 0/? group trainers -> cuda:0 ({gpus[1]}," in proc.stdout, out[-5000:]
    # the RayPlacement went to the actor as an argument, and its PlacementReport came back
    assert "Ray gave the actors of group 'trainers' 1 GPU each" in proc.stdout, out[-5000:]
    # assert_same_device's error crossed Ray with its fields
    assert ("driver caught DeviceMismatchError: devices ['cpu', 'meta']; Fix: move the inputs to the model's "
            "device") in proc.stdout, out[-5000:]
    # a task of __main__ calls gpuguard.devices(), the function named like its module
    seen = re.findall(r"a task sees \['(GPU-[0-9a-f-]+)'\]", proc.stdout)
    assert len(seen) == 1 and seen[0] in gpus, out[-5000:]  # one GPU, whichever Ray gave the task
    # two ranks of one group packed onto one GPU: both stop, and the driver catches gpuguard's class. Which GPU
    # they share is Ray's choice (GPU 0 in most runs, GPU 1 in one of CI's)
    caught = dict(re.findall(r"driver caught DuplicateDeviceError of rank (\d): shared \{'(GPU-[0-9a-f-]+)': "
                             r"\[0, 1\]\}, causes \['fractional_ray_gpus'\]", proc.stdout))
    assert set(caught) == {"0", "1"} and len(set(caught.values())) == 1, out[-5000:]
    assert caught["0"] in gpus, (caught, gpus)
    assert proc.stdout.count("Likely cause: Ray gave these actors 1/2 of a GPU each (num_gpus=1/2)") == 2
    assert proc.stdout.count("Fix: give every rank of a group a whole GPU: gpuguard.ray_placement(max_colocate=1)") == 2


def test_the_package_and_what_it_hands_to_ray_pickle_by_reference_or_by_value():
    import gpuguard
    from ray import cloudpickle

    assert pickle.loads(cloudpickle.dumps(gpuguard)) is gpuguard  # a module: by reference, as Ray needs

    def uses_gpuguard():  # what a driver script's actor method closes over
        return gpuguard.bind, gpuguard.DuplicateDeviceError, gpuguard.devices

    assert pickle.loads(cloudpickle.dumps(uses_gpuguard))() == (
        gpuguard.bind, gpuguard.DuplicateDeviceError, gpuguard.devices)
    assert callable(gpuguard.devices)  # the function, not the module gpuguard/system/devices.py


@pytest.mark.parametrize("name", ["GpuGuardError", "DuplicateDeviceError", "DeviceMismatchError", "RankMappingError",
                                  "RendezvousTimeoutError", "CudaStateError", "LaunchEnvironmentError",
                                  "RayPlacementError", "RayRendezvousError"])
def test_every_error_class_pickles_with_its_message_fix_fields_and_notes(name):
    import gpuguard
    from gpuguard.errors import add_note
    from ray import cloudpickle

    cls = getattr(gpuguard, name)
    err = cls("ranks 0 and 1 share GPU-1. Fix: one GPU per rank", fix="Fix: one GPU per rank", ranks=[0, 1],
              uuid="GPU-1")
    add_note(err, "gpuguard (auto, at init_process_group): rank 0 is on cuda:0")  # exc.add_note is 3.11+
    for dumps in (pickle.dumps, cloudpickle.dumps):
        back = pickle.loads(dumps(err))
        assert type(back) is cls and str(back) == str(err)
        assert back.fix == "Fix: one GPU per rank" and back.details == {"ranks": [0, 1], "uuid": "GPU-1"}
        assert back.ranks == [0, 1] and back.__notes__ == err.__notes__


@pytest.mark.slow
@pytest.mark.ray_cluster
def test_a_gpuguard_error_raised_in_an_actor_reaches_ray_get_with_its_class_message_and_fields(fake_gpus):
    import gpuguard

    @ray.remote
    class Rank:
        def check(self):
            raise gpuguard.DuplicateDeviceError("ranks 0 and 1 share GPU-1. Fix: one GPU per rank",
                                                fix="Fix: one GPU per rank", ranks=[0, 1], uuid="GPU-1")

    init_in_this_process(ray, num_cpus=1, include_dashboard=False, log_to_driver=False,
                         runtime_env={"env_vars": {"PYTHONPATH": fake_gpus.env("h100x1")["PYTHONPATH"]}})
    try:
        with pytest.raises(gpuguard.DuplicateDeviceError) as caught:
            rank = Rank.remote()  # held: Ray 2.43 loses an actor whose only handle was a temporary
            ray.get(rank.check.remote(), timeout=120)
    finally:
        ray.shutdown()
    err = caught.value
    assert err.details == {"ranks": [0, 1], "uuid": "GPU-1"} and err.fix == "Fix: one GPU per rank"
    assert err.ranks == [0, 1] and "ranks 0 and 1 share GPU-1" in str(err)
