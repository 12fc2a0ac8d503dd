"""gpuguard.bind(): device resolution rules, the errors' messages, the CUDA-state check, and bind() end to end
under the fake driver, a real torchrun and a real Ray."""

from __future__ import annotations

import dataclasses
import json
import sys
import textwrap

import pytest

from gg_testing import launch
from gg_testing.env import SLURM_2x5_RANK7, TORCHRUN, no_driver_env, scrubbed
from gg_testing.launch import write
from gg_testing.procs import run_json

from gpuguard import CudaStateError, LaunchEnvironmentError, RankMappingError, _core
from gpuguard.binding import Binding
from gpuguard.binding.cuda_state import check_cuda_state, earlier_initialisation
from gpuguard.binding.device_choice import check_visibility, resolve_device
from gpuguard.binding.launchers import LaunchContext, detect
from gpuguard.binding.visible_devices import parse_visible_devices
from gpuguard.system.devices import Device



def fake_devices(n: int) -> list[Device]:
    return [Device(index=i, name="NVIDIA H100 80GB HBM3", uuid=f"GPU-00000000-0000-4000-8000-00000000000{i}",
                   pci_bus_id=f"0000:{0x18 + i:02x}:00.0", total_memory=80 * 2**30, compute_capability=(9, 0))
            for i in range(n)]


def resolve(env: dict[str, str], n: int, visible=None, context: LaunchContext | None = None):
    ctx = context or detect(env)
    return resolve_device(ctx, fake_devices(n), parse_visible_devices(visible), host="gpu-n1")


# ---- resolution rules (pure) -----------------------------------------------------------------------------------

def test_local_rank_picks_the_visible_device():
    r = resolve(SLURM_2x5_RANK7, 5)
    assert r.device.index == 2
    assert (r.local_rank, r.local_rank_source, r.chosen_by) == (2, "SLURM_LOCALID", "local rank 2 (SLURM_LOCALID)")


def test_one_visible_device_is_this_process_whatever_its_local_rank():
    r = resolve(TORCHRUN, 1, visible="5")
    assert r.device.index == 0 and r.local_rank == 1
    assert r.chosen_by == "the only GPU this process sees (CUDA_VISIBLE_DEVICES='5')"


def test_no_visible_device_resolves_to_the_cpu():
    r = resolve(TORCHRUN, 0, visible="")
    assert r.device is None and r.chosen_by == "no visible GPU"


def test_global_rank_as_local_rank_on_a_five_gpu_host():
    with pytest.raises(RankMappingError) as err:
        resolve({"RANK": "7", "LOCAL_RANK": "7", "WORLD_SIZE": "10"}, 5)
    msg = str(err.value)
    assert msg.startswith("Rank 7 of 10 (environment variables (RANK, LOCAL_RANK, WORLD_SIZE)) cannot be bound "
                          "to a GPU: its local rank is 7 (LOCAL_RANK), but this host (gpu-n1) shows 5 GPUs to this "
                          "process (cuda:0..cuda:4; CUDA_VISIBLE_DEVICES unset).")
    assert "Likely cause: the global rank is used as the local rank: LOCAL_RANK=7 equals the rank across all 10" in msg
    assert err.value.visible_device_count == 5 and err.value.local_rank_source == "LOCAL_RANK"


def test_never_local_rank_modulo_device_count():
    # local rank 4 on a 4-GPU host must not quietly become cuda:0 (that is rank 0's GPU)
    env = {**TORCHRUN, "RANK": "4", "LOCAL_RANK": "4", "WORLD_SIZE": "8", "LOCAL_WORLD_SIZE": "8",
           "GROUP_RANK": "0"}
    with pytest.raises(RankMappingError) as err:
        resolve(env, 4)
    msg = str(err.value)
    assert "Likely cause: more processes per node than GPUs: this node runs 8 processes (LOCAL_WORLD_SIZE) but " \
           "shows 4 GPUs. Start at most 4 per node (torchrun --nproc_per_node=4" in msg
    assert "global rank" not in msg  # rank 4 == local rank 4 on node 0 of a one-node job is no such mistake


def test_narrowed_visibility_is_named_as_a_cause():
    env = {**TORCHRUN, "LOCAL_RANK": "2", "RANK": "6"}
    with pytest.raises(RankMappingError) as err:
        resolve(env, 2, visible="0,1")
    msg = str(err.value)
    assert "shows 2 GPUs to this process (cuda:0..cuda:1; CUDA_VISIBLE_DEVICES='0,1')" in msg
    assert "this node runs 4 processes (LOCAL_WORLD_SIZE) but shows 2 GPUs" in msg
    assert "Otherwise: visibility narrowed per process: CUDA_VISIBLE_DEVICES='0,1' leaves this process 2 GPUs" in msg


def ray_context(ids, *, noset=False, local_rank=None):
    return LaunchContext(launcher="ray", description="Ray actor", rank=1, world_size=2, local_rank=local_rank,
                         local_world_size=None, node_rank=None, sources={"rank": "RANK"},
                         extra={"ray_gpu_ids": ids, "ray_gpu_share": 1.0, "ray_noset_cuda_visible_devices": noset})


def test_ray_gpu_id_found_in_visibility_ray_set():
    r = resolve({}, 1, visible="3", context=ray_context(["3"]))
    assert r.device.index == 0 and r.chosen_by == "Ray GPU id 3 = entry 0 of CUDA_VISIBLE_DEVICES='3'"
    assert (r.local_rank, r.local_rank_source) == (0, "Ray's GPU id")


def test_ray_train_shares_visibility_across_colocated_workers():
    r = resolve({}, 4, visible="0,1,2,3", context=ray_context(["2"], local_rank=2))
    assert r.device.index == 2


def test_ray_noset_with_visibility_unset_uses_the_id_as_index():
    r = resolve({}, 8, visible=None, context=ray_context(["5"], noset=True))
    assert r.device.index == 5


def test_ray_id_missing_from_visibility_is_explained():
    with pytest.raises(RankMappingError) as err:
        resolve({}, 2, visible="0,1", context=ray_context(["3"], noset=True))
    msg = str(err.value)
    assert msg.startswith("Rank 1 is a Ray worker assigned GPU id 3 (Ray ids: 3), but CUDA_VISIBLE_DEVICES='0,1' on "
                          "gpu-n1 has no such entry (2 GPUs visible). RAY_EXPERIMENTAL_NOSET_CUDA_VISIBLE_DEVICES is set")


def test_ray_actor_without_a_gpu_is_not_guessed_onto_one():
    with pytest.raises(RankMappingError, match=r"Ray gave no GPU \(num_gpus=0\), yet this process on gpu-n1 sees "
                                               r"8 GPUs"):
        resolve({}, 8, context=ray_context([]))


# ---- CUDA_VISIBLE_DEVICES checks (pure: the parser is in the C++ core) -----------------------------------------

@pytest.mark.parametrize("raw, expected", [
    ("0,1,,2", "CUDA_VISIBLE_DEVICES='0,1,,2': entry 3 is empty (two commas in a row, or a comma at the end). The "
               "driver stops reading CUDA_VISIBLE_DEVICES at the first bad entry without a word, so the driver shows "
               "only the 2 GPUs before it (0,1)."),
    ("GPU0", "CUDA_VISIBLE_DEVICES='GPU0': entry 1 ('GPU0') is neither a device index, a GPU UUID or UUID prefix"),
    ("2,2,3", "CUDA_VISIBLE_DEVICES='2,2,3': entry 2 ('2') names the same GPU as entry 1 ('2'). The driver stops "
              "reading CUDA_VISIBLE_DEVICES at the first bad entry without a word, so the driver shows only the 1 GPU "
              "before it (2)."),
])
def test_bad_visibility_entries_are_named(raw, expected):
    with pytest.raises(LaunchEnvironmentError) as err:
        check_visibility(parse_visible_devices(raw), [], driver_loaded=False)
    assert str(err.value).startswith(expected)
    assert err.value.variable == "CUDA_VISIBLE_DEVICES"


def test_hiding_every_gpu_on_purpose_is_not_an_error():
    for raw in ("", "-1", "NoDevFiles"):
        check_visibility(parse_visible_devices(raw), [], driver_loaded=True)


# ---- the CUDA-state check (pure parts) -------------------------------------------------------------------------

def test_who_initialised_cuda_first():
    fresh = _core.DriverInitRecord(attempted=False, initialized_before_gpuguard=False)
    ours = _core.DriverInitRecord(attempted=True, visible_devices_at_init="0,1", initialized_before_gpuguard=False)
    other = _core.DriverInitRecord(attempted=True, visible_devices_at_init="2", initialized_before_gpuguard=True)
    assert earlier_initialisation(fresh, ours, "0,1", torch_initialized=False) is None
    assert earlier_initialisation(ours, ours, "0,1", torch_initialized=False) is None
    assert earlier_initialisation(ours, ours, "2,3", False) == (
        "gpuguard initialised CUDA earlier in this process (gpuguard.devices() or cuda_status()) while "
        "CUDA_VISIBLE_DEVICES='0,1'")
    assert earlier_initialisation(fresh, other, "2", False).startswith("another library (torch")
    assert earlier_initialisation(fresh, ours, "0,1", torch_initialized=True) == \
        "torch initialised CUDA in this process before bind()"


def test_cuda_state_error_compares_this_process_with_a_fresh_one():
    check_cuda_state(["GPU-a"], None, "0", timeout=1)  # nobody initialised earlier: nothing to compare
    check_cuda_state(["GPU-aaaaaaaa"], "someone", "0", timeout=1, fresh=["GPU-aaaaaaaa"])  # same devices
    with pytest.raises(CudaStateError) as err:
        check_cuda_state(["GPU-aaaaaaaa-1", "GPU-bbbbbbbb-2"], "torch initialised CUDA in this process before bind()",
                         "2,3", timeout=1, fresh=["GPU-cccccccc-3", "GPU-dddddddd-4"])
    msg = str(err.value)
    assert msg.startswith("CUDA was initialised in this process before CUDA_VISIBLE_DEVICES got its current value: "
                          "torch initialised CUDA in this process before bind(). The driver reads CUDA_VISIBLE_DEVICES "
                          "once, at initialisation, so this process sees 2 GPUs [GPU-aaaaaaaa, GPU-bbbbbbbb], while "
                          "CUDA_VISIBLE_DEVICES='2,3' gives a new process 2 GPUs [GPU-cccccccc, GPU-dddddddd]")
    assert "before torch.cuda calls such as torch.cuda.device_count()" in msg


# ---- Binding ---------------------------------------------------------------------------------------------------

def make_binding(**over) -> Binding:
    base = dict(launcher="slurm", rank=7, local_rank=2, world_size=10, local_world_size=5, node_rank=1,
                device_index=2, uuid="GPU-5a6b9e22-0002-4002-8002-1f2e3d4c5b62",
                pci_bus_id="0000:3a:00.0", device_name="NVIDIA H100 80GB HBM3", host="gpu-n1",
                cuda_visible_devices=None, visible_device_count=5, local_rank_source="SLURM_LOCALID",
                group="default", chosen_by="local rank 2 (SLURM_LOCALID)", extra={})
    base.update(over)
    return Binding(**base)


def test_binding_is_frozen_and_its_str_is_one_log_line():
    b = make_binding()
    with pytest.raises(dataclasses.FrozenInstanceError):
        b.rank = 0  # type: ignore[misc]
    with pytest.raises(TypeError):
        b.extra["x"] = 1  # type: ignore[index]
    assert str(b) == ("gpuguard: rank 7/10 local 2/5 node 1 -> cuda:2 (GPU-5a6b9e22-0002-4002-8002-1f2e3d4c5b62, "
                      "0000:3a:00.0) on gpu-n1 [slurm, local rank from SLURM_LOCALID, CUDA_VISIBLE_DEVICES=unset]")
    assert json.loads(json.dumps(b.as_dict()))["device"] == "cuda:2"
    import torch
    assert b.device == torch.device("cuda", 2) and make_binding(device_index=None).device == torch.device("cpu")


# ---- bind() end to end, fake driver ----------------------------------------------------------------------------

ATTEMPTS = """
import json, logging, os, sys, warnings, gpuguard
import gpuguard.binding.steps
# These attempts are one rank of a simulated job: only this rank's resolution is under test. The other ranks
# do not exist, so the cross-rank step (tested in test_placement.py) is left out: bind() then raises this
# rank's own failure, as it does after publishing it.
gpuguard.binding.steps._meet_other_ranks = lambda *args, **kwargs: None
records = []
class Keep(logging.Handler):
    def emit(self, record): records.append(record.getMessage())
logging.getLogger("gpuguard").addHandler(Keep())
logging.getLogger("gpuguard").setLevel(logging.INFO)
def attempt(env, **kwargs):
    saved = dict(os.environ)
    os.environ.update(env)
    del records[:]
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            b = gpuguard.bind(**kwargs)
        return {"binding": b.as_dict(), "str": str(b), "log": list(records),
                "warnings": [f"{w.category.__name__}: {w.message}" for w in caught]}
    except gpuguard.GpuGuardError as e:
        return {"error": type(e).__name__, "message": str(e)}
    finally:
        os.environ.clear(); os.environ.update(saved)
"""


def run_attempts(cases: str, env: dict[str, str]):
    return run_json(ATTEMPTS + textwrap.dedent(cases), scrubbed(env))


@pytest.fixture
def h100x5(fake_gpus, tmp_path) -> str:
    """A 5-GPU host: the first five GPUs of the 8-GPU topology."""
    topo = fake_gpus.topology("h100x8")
    topo["gpus"] = topo["gpus"][:5]
    topo.pop("peer_access", None)
    path = tmp_path / "h100x5.json"
    path.write_text(json.dumps(topo))
    return str(path)


def test_bind_on_a_five_gpu_host_under_several_launchers(fake_gpus, h100x5):
    uuids = [g["uuid"] for g in fake_gpus.topology("h100x8")["gpus"]]
    got = run_attempts(f"""
        print(json.dumps({{
            "slurm": attempt({SLURM_2x5_RANK7!r}),
            "global_as_local": attempt({{"RANK": "7", "LOCAL_RANK": "7", "WORLD_SIZE": "10"}}),
            "too_many": attempt({{**{TORCHRUN!r}, "LOCAL_RANK": "6", "RANK": "6", "LOCAL_WORLD_SIZE": "8",
                                  "WORLD_SIZE": "8", "GROUP_RANK": "0"}}),
            "disagree": attempt({{**{SLURM_2x5_RANK7!r}, "LOCAL_RANK": "0"}}),
            "group": attempt({{**{TORCHRUN!r}, "GPUGUARD_GROUP": "rollout"}}),
        }}))
    """, fake_gpus.env(h100x5))
    slurm = got["slurm"]
    assert slurm["binding"]["device"] == "cuda:2" and slurm["binding"]["uuid"] == uuids[2]
    assert slurm["binding"]["pci_bus_id"] == "0000:3a:00.0"
    assert (slurm["binding"]["rank"], slurm["binding"]["node_rank"], slurm["binding"]["visible_device_count"]) == (7, 1, 5)
    assert slurm["warnings"] == []
    assert slurm["log"][-1] == slurm["str"] + " (local rank 2 (SLURM_LOCALID))"  # logged through "gpuguard"
    assert slurm["str"].startswith("gpuguard: rank 7/10 local 2/5 node 1 -> cuda:2 (" + uuids[2])

    assert got["global_as_local"]["error"] == "RankMappingError"
    assert "its local rank is 7 (LOCAL_RANK), but this host (" in got["global_as_local"]["message"]
    assert ") shows 5 GPUs to this process" in got["global_as_local"]["message"]
    assert "Likely cause: the global rank is used as the local rank" in got["global_as_local"]["message"]

    assert got["too_many"]["error"] == "RankMappingError"
    assert "this node runs 8 processes (LOCAL_WORLD_SIZE) but shows 5 GPUs" in got["too_many"]["message"]
    assert "torchrun --nproc_per_node=5" in got["too_many"]["message"]

    assert got["disagree"]["error"] == "LaunchEnvironmentError"
    assert "SLURM_LOCALID=2 but LOCAL_RANK=0" in got["disagree"]["message"]

    assert got["group"]["binding"]["group"] == "rollout" and got["group"]["binding"]["device"] == "cuda:1"


@pytest.mark.parametrize("gpu", [0, 1])
def test_two_processes_with_one_visible_gpu_each_bind_to_their_own(fake_gpus, gpu):
    uuids = [g["uuid"] for g in fake_gpus.topology("h100x8")["gpus"]]
    env = {"RANK": str(gpu), "LOCAL_RANK": str(gpu), "WORLD_SIZE": "2", "LOCAL_WORLD_SIZE": "2"}
    got = run_attempts(f"print(json.dumps(attempt({env!r})))", fake_gpus.env("h100x8", visible=str(gpu)))
    assert got["binding"]["device"] == "cuda:0"
    assert got["binding"]["uuid"] == uuids[gpu]
    assert got["binding"]["local_rank"] == gpu
    assert got["binding"]["chosen_by"] == f"the only GPU this process sees (CUDA_VISIBLE_DEVICES='{gpu}')"


def test_second_process_on_a_one_gpu_host_still_binds(fake_gpus):
    # sharing is for the cross-rank check to report with every rank named; bind() does not guess around it
    env = {"RANK": "1", "LOCAL_RANK": "1", "WORLD_SIZE": "2", "LOCAL_WORLD_SIZE": "2"}
    got = run_attempts(f"print(json.dumps(attempt({env!r})))", fake_gpus.env("h100x1"))
    assert got["binding"]["device"] == "cuda:0" and got["binding"]["visible_device_count"] == 1


def test_duplicated_visibility_entry_stops_bind(fake_gpus):
    got = run_attempts("print(json.dumps(attempt({})))", fake_gpus.env("h100x8", visible="2,2,3"))
    assert got["error"] == "LaunchEnvironmentError"
    assert got["message"].startswith("CUDA_VISIBLE_DEVICES='2,2,3': entry 2 ('2') names the same GPU as entry 1")


def test_visibility_entry_the_driver_rejected_is_named(fake_gpus):
    got = run_attempts("print(json.dumps(attempt({})))", fake_gpus.env("h100x4", visible="0,1,7"))
    assert got["error"] == "LaunchEnvironmentError"
    assert got["message"].startswith(
        "CUDA_VISIBLE_DEVICES='0,1,7': entry 3 ('7') was rejected by the driver: this host has no GPU 7, or it is a "
        "GPU already listed under its UUID; the driver shows 2 devices and ignores everything from it on. The driver "
        "stops reading CUDA_VISIBLE_DEVICES at the first bad entry without a word, so the driver shows only the 2 "
        "GPUs before it (0,1).")


def test_cuda_initialised_by_gpuguard_with_other_visibility(fake_gpus):
    uuids = [g["uuid"] for g in fake_gpus.topology("h100x8")["gpus"]]
    got = run_attempts(f"""
        gpuguard.devices()  # freezes CUDA_VISIBLE_DEVICES=0,1 for this process
        same = attempt({{"CUDA_VISIBLE_DEVICES": "{uuids[0]},{uuids[1][:12]}"}})  # other spelling, same GPUs
        moved = attempt({{"CUDA_VISIBLE_DEVICES": "2,3"}})
        print(json.dumps({{"same": same, "moved": moved}}))
    """, fake_gpus.env("h100x8", visible="0,1"))
    assert got["same"]["binding"]["uuid"] == uuids[0]
    assert got["moved"]["error"] == "CudaStateError"
    assert got["moved"]["message"].startswith(
        "CUDA was initialised in this process before CUDA_VISIBLE_DEVICES got its current value: gpuguard initialised "
        "CUDA earlier in this process (gpuguard.devices() or cuda_status()) while CUDA_VISIBLE_DEVICES='0,1'. The "
        "driver reads CUDA_VISIBLE_DEVICES once, at initialisation, so this process sees 2 GPUs [GPU-5a6b7c00, "
        "GPU-5a6b8d11], while CUDA_VISIBLE_DEVICES='2,3' gives a new process 2 GPUs [GPU-5a6b9e22, GPU-5a6baf33]")


def test_cuda_initialised_by_another_library_before_visibility_was_set(fake_gpus):
    got = run_attempts("""
        import ctypes
        ctypes.CDLL(os.environ["GPUGUARD_LIBCUDA"]).cuInit(0)  # what torch.cuda.device_count() does
        os.environ["CUDA_VISIBLE_DEVICES"] = "4"               # ... then the script narrows visibility: too late
        print(json.dumps(attempt({})))
    """, fake_gpus.env("h100x8"))
    assert got["error"] == "CudaStateError"
    assert "another library (torch, or code calling it) initialised CUDA in this process before gpuguard first " \
           "looked" in got["message"]
    assert "this process sees 8 GPUs [" in got["message"]
    assert "while CUDA_VISIBLE_DEVICES='4' gives a new process 1 GPU [GPU-5a6bc044]" in got["message"]


def test_without_a_gpu_bind_uses_the_cpu_with_a_warning_or_refuses():
    got = run_attempts("""
        print(json.dumps({"plain": attempt({}), "required": attempt({}, require_gpu=True)}))
    """, no_driver_env())
    plain = got["plain"]
    assert plain["binding"]["device"] == "cpu" and plain["binding"]["uuid"] is None
    assert len(plain["warnings"]) == 1
    assert plain["warnings"][0].startswith("GpuGuardWarning: gpuguard.bind(): rank 0 runs on the CPU: no GPU: no "
                                           "NVIDIA driver: /nonexistent/libcuda.so.1")
    assert plain["warnings"][0].endswith("Pass require_gpu=True to make this an error.")
    assert got["required"]["error"] == "RankMappingError"
    assert got["required"]["message"].startswith("Rank 0 needs a GPU (require_gpu=True) but this process on ")
    assert "sees none: no NVIDIA driver" in got["required"]["message"]


def test_bind_warning_in_this_process_is_a_gpuguard_warning(monkeypatch):
    # the in-process path: no driver is loaded by this test process's gpuguard unless a test asked for one
    import gpuguard
    monkeypatch.setenv("GPUGUARD_LAUNCHER", "single")  # whatever launcher runs the suite
    if gpuguard.devices():
        pytest.skip("this machine has a GPU")
    with pytest.warns(gpuguard.GpuGuardWarning, match="runs on the CPU"):
        b = gpuguard.bind()
    assert b.device.type == "cpu"


def test_bind_rejects_a_bad_group_and_timeout():
    import gpuguard
    with pytest.raises(ValueError, match="group=3: use 1 to 128"):
        gpuguard.bind(group=3)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="group='a b': use 1 to 128 letters"):
        gpuguard.bind(group="a b")
    with pytest.raises(ValueError, match="timeout=0: give the seconds to wait"):
        gpuguard.bind(timeout=0)


# ---- real launchers ----------------------------------------------------------------------------------------------

TORCHRUN_WORKER = """
import torch, torch.distributed as dist
import gpuguard
from gg_testing.rank import write_result
binding = gpuguard.init_process_group(backend="gloo")
total = torch.tensor([binding.device_index])
dist.all_reduce(total)
out = dict(binding.as_dict(), all_reduced_index_sum=int(total.item()), dist_world_size=dist.get_world_size())
write_result(out, rank=binding.rank)
dist.destroy_process_group()
"""


@pytest.mark.slow
def test_real_torchrun_four_processes_each_bind_a_distinct_gpu(fake_gpus, tmp_path):
    script = write(tmp_path, "worker.py", TORCHRUN_WORKER)
    proc = launch.torchrun(str(script), nproc=4, env=scrubbed(fake_gpus.env("h100x4")), workdir=tmp_path)
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert sorted(proc.ranks) == [0, 1, 2, 3], proc.tail()
    bindings = [proc.ranks[r] for r in range(4)]
    uuids = [g["uuid"] for g in fake_gpus.topology("h100x4")["gpus"]]
    assert [b["launcher"] for b in bindings] == ["torchrun"] * 4
    assert [b["device"] for b in bindings] == ["cuda:0", "cuda:1", "cuda:2", "cuda:3"]
    assert [b["uuid"] for b in bindings] == uuids
    assert {b["local_rank_source"] for b in bindings} == {"LOCAL_RANK"}
    assert {(b["world_size"], b["local_world_size"], b["node_rank"]) for b in bindings} == {(4, 4, 0)}
    assert {b["dist_world_size"] for b in bindings} == {4}
    assert {b["all_reduced_index_sum"] for b in bindings} == {0 + 1 + 2 + 3}


RAY_DRIVER = """
import json, ray
ray.init(num_cpus=4, num_gpus=4, include_dashboard=False, log_to_driver=False)

@ray.remote
class Worker:
    def bind(self):
        import gpuguard, gpuguard.binding.steps
        # Only this actor's resolution is tested here (the Ray rendezvous is in test_ray.py): no cross-rank step.
        gpuguard.binding.steps._meet_other_ranks = lambda *args, **kwargs: None
        return gpuguard.bind().as_dict()

def actors(num_gpus, extra_env):
    return [Worker.options(num_gpus=num_gpus, runtime_env={"env_vars": {
                "RANK": str(r), "WORLD_SIZE": "2", "GPUGUARD_GROUP": "actor", **extra_env}}).remote()
            for r in range(2)]

first = ray.get([a.bind.remote() for a in actors(1, {})])
noset = ray.get([a.bind.remote() for a in actors(1, {"RAY_EXPERIMENTAL_NOSET_CUDA_VISIBLE_DEVICES": "1"})])
print(json.dumps({"set": first, "noset": noset}))
ray.shutdown()
"""


@pytest.mark.slow
@pytest.mark.ray_cluster
def test_real_ray_actors_bind_the_gpu_ray_assigned(fake_gpus):
    got = run_json(RAY_DRIVER, scrubbed(fake_gpus.env("h100x4", RAY_DISABLE_USAGE_STATS="1")), timeout=240)
    uuids = [g["uuid"] for g in fake_gpus.topology("h100x4")["gpus"]]
    for b in got["set"]:
        assert b["launcher"] == "ray" and b["group"] == "actor"
        (gpu_id,) = b["extra"]["ray_gpu_ids"]
        assert b["cuda_visible_devices"] == gpu_id and b["device"] == "cuda:0"  # Ray narrowed visibility
        assert b["uuid"] == uuids[int(gpu_id)] and b["extra"]["ray_gpu_share"] == 1.0
    assert sorted(b["rank"] for b in got["set"]) == [0, 1]
    assert len({b["uuid"] for b in got["set"]}) == 2
    for b in got["noset"]:
        (gpu_id,) = b["extra"]["ray_gpu_ids"]
        assert b["cuda_visible_devices"] is None and b["extra"]["ray_noset_cuda_visible_devices"] is True
        assert b["device"] == f"cuda:{gpu_id}" and b["uuid"] == uuids[int(gpu_id)]
