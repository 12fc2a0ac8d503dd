"""The zero-code mode (gpuguard.auto): unmodified scripts under GPUGUARD=1 / `gpuguard run` / the Ray setup
hook, run with real torchrun and real Ray on the fake driver, stopped with gpuguard's report on every rank.

The .pth is read as an installed gpuguard's site-packages would be: tests/python/auto_site/sitecustomize.py
calls ``site.addsitedir`` on the source tree's python/ folder, which holds gpuguard_auto.pth beside the
package. torch here cannot build an NCCL group (no CUDA device for torch), so an NCCL group's check runs
inside init_process_group, before torch's NCCL code; on a job that is right, the error that follows is
torch's own, never gpuguard's.
"""

from __future__ import annotations

import json
import os
import sys

import pytest

from gg_testing import launch
from gg_testing.env import auto_env
from gg_testing.launch import write
from gg_testing.ports import free_port
from gg_testing.procs import last_json, run_json, run_python

ACTIVE = "gpuguard: active (auto)"


# ---- switching it on ----------------------------------------------------------------------------------------

STARTUP_PROBE = """
import json, sys
before = {m: m in sys.modules for m in ("_gpuguard_autostart", "torch", "gpuguard")}
import torch
after = {"gpuguard.auto": "gpuguard.auto" in sys.modules}
if after["gpuguard.auto"]:
    import gpuguard.auto
    after["enabled"] = gpuguard.auto.is_enabled()
    after["set_device_wrapped"] = torch.cuda.set_device.__code__.co_filename != torch.cuda.__file__
    gpuguard.auto.disable()
    after["restored"] = (torch.cuda.set_device.__code__.co_filename == torch.cuda.__file__
                         and torch.distributed.init_process_group is
                         torch.distributed.distributed_c10d.init_process_group
                         and sys.excepthook is sys.__excepthook__)
print(json.dumps({"before": before, "after": after}))
"""


@pytest.mark.parametrize("value", [None, "0", ""])
def test_unset_or_zero_loads_nothing(fake_gpus, value):
    env = auto_env(fake_gpus.env("h100x4"))
    env.pop("GPUGUARD")
    if value is not None:
        env["GPUGUARD"] = value
    proc = run_python(STARTUP_PROBE, env)
    got = json.loads(proc.stdout.splitlines()[-1])
    assert got == {"before": {"_gpuguard_autostart": False, "torch": False, "gpuguard": False},
                   "after": {"gpuguard.auto": False}}
    assert ACTIVE not in proc.stderr


def test_gpuguard_1_arms_at_torch_import_and_disable_restores(fake_gpus):
    proc = run_python(STARTUP_PROBE, auto_env(fake_gpus.env("h100x4")))
    got = json.loads(proc.stdout.splitlines()[-1])
    # the .pth loaded only the standard-library hook: neither torch nor gpuguard before the job imports torch
    assert got["before"] == {"_gpuguard_autostart": True, "torch": False, "gpuguard": False}
    assert got["after"] == {"gpuguard.auto": True, "enabled": True, "set_device_wrapped": True, "restored": True}
    assert proc.stderr.count(ACTIVE) == 1


SET_DEVICE = """
import torch
torch.cuda.set_device(5)
"""


def test_set_device_with_the_global_rank_names_ranks_and_variables(fake_gpus):
    # rank 5 of 2 nodes x 5 GPUs seen from a 4-GPU host: local rank 1 on node 1 (torchrun's variables)
    env = auto_env(fake_gpus.env("h100x4"), TORCHELASTIC_RUN_ID="r", RANK="5", WORLD_SIZE="8", LOCAL_RANK="1",
                   LOCAL_WORLD_SIZE="4", GROUP_RANK="1", MASTER_ADDR="127.0.0.1", MASTER_PORT="1")
    proc = run_python(SET_DEVICE, env, check=False)
    assert proc.returncode == 1
    assert "gpuguard.errors.RankMappingError: torch.cuda.set_device(5) asks for cuda:5, but this process on " in \
        proc.stderr
    assert "sees 4 GPUs (cuda:0..cuda:3; CUDA_VISIBLE_DEVICES unset); CUDA would stop with 'invalid device " \
           "ordinal'" in proc.stderr
    assert "global rank 5 (RANK), local rank 1 (LOCAL_RANK)" in proc.stderr
    assert "5 equals the global rank" in proc.stderr and "on node 1 the device is the local rank (1: cuda:1)" \
        in proc.stderr
    assert "torch.cuda.set_device(int(os.environ['LOCAL_RANK']))" in proc.stderr


def test_set_device_with_the_local_rank_on_a_node_with_fewer_gpus_than_ranks_says_to_start_fewer(fake_gpus):
    # torchrun --nproc_per_node=3 on a host that shows 2 GPUs: local rank 2 asks for cuda:2, and using the local
    # rank, which it already does, is not the fix
    env = auto_env(fake_gpus.env("h100x4", visible="0,1"), TORCHELASTIC_RUN_ID="r", RANK="2", WORLD_SIZE="3",
                   LOCAL_RANK="2", LOCAL_WORLD_SIZE="3", GROUP_RANK="0", MASTER_ADDR="127.0.0.1", MASTER_PORT="1")
    proc = run_python(SET_DEVICE.replace("set_device(5)", "set_device(2)"), env, check=False)
    assert proc.returncode == 1
    assert "RankMappingError: torch.cuda.set_device(2) asks for cuda:2, but this process on " in proc.stderr
    assert ("The index already is the local rank: this node runs 3 processes (LOCAL_WORLD_SIZE) but shows 2 GPUs. "
            "Start at most 2 per node (torchrun --nproc_per_node=2, srun --ntasks-per-node=2, mpirun --npernode 2), "
            "or ask for nodes with more GPUs.") in proc.stderr, proc.stderr[-3000:]
    assert "Use the local rank" not in proc.stderr


@pytest.mark.parametrize("call,quoted", [('.to(torch.device("cuda", 3))', "Linear.to(device(type='cuda', index=3))"),
                                         (".cuda(3)", "Linear.cuda(3)")])
def test_module_to_a_device_this_process_cannot_see(fake_gpus, call, quoted):
    env = auto_env(fake_gpus.env("h100x4", visible="2,3"), RANK="3", WORLD_SIZE="4", LOCAL_RANK="1",
                   LOCAL_WORLD_SIZE="2", MASTER_ADDR="127.0.0.1", MASTER_PORT="1")
    proc = run_python(f"""
        import torch
        torch.nn.Linear(2, 2).to("meta")               # not CUDA: untouched
        torch.nn.LazyLinear(2).to(torch.float64)       # Module.to on a lazy module: untouched
        torch.nn.Linear(2, 2){call}
    """, env, check=False)
    assert f"RankMappingError: {quoted} asks for cuda:3, but this process on " in proc.stderr
    assert "sees 2 GPUs (cuda:0..cuda:1; CUDA_VISIBLE_DEVICES=2,3)" in proc.stderr
    assert "3 equals the global rank" in proc.stderr and "(1: cuda:1)" in proc.stderr


# ---- (a) two torchrun agents, set_device(dist.get_rank()) after init ------------------------------------------

RANK_AS_DEVICE = """
import torch, torch.distributed as dist
from gg_testing.rank import write_result
dist.init_process_group("gloo")
try:
    torch.cuda.set_device(dist.get_rank())
    out = {"type": None}
except Exception as exc:
    out = {"type": type(exc).__name__, "module": type(exc).__module__, "message": str(exc)}
write_result(out, rank=dist.get_rank())
"""


@pytest.mark.slow
def test_a_two_torchrun_agents_global_rank_as_device(fake_gpus, tmp_path):
    script = write(tmp_path, "train.py", RANK_AS_DEVICE)
    agents = launch.torchrun_nodes(  # one host, two "nodes" of 2 GPUs each
        str(script), nodes=2, nproc=2, workdir=tmp_path,
        env_of_node=lambda node: auto_env(fake_gpus.env("h100x4", visible=("0,1", "2,3")[node])))
    logs = launch.wait_jobs(agents)
    ranks = agents[0].ranks()
    assert sorted(ranks) == [0, 1, 2, 3], [log.tail() for log in logs]
    for r in (2, 3):
        got = ranks[r]
        assert (got["module"], got["type"]) == ("gpuguard.errors", "RankMappingError"), got
        msg = got["message"]
        assert f"torch.cuda.set_device({r}) asks for cuda:{r}" in msg
        assert "sees 2 GPUs (cuda:0..cuda:1; CUDA_VISIBLE_DEVICES=2,3)" in msg
        assert f"global rank {r} (RANK), local rank {r - 2} (LOCAL_RANK)" in msg
        assert f"{r} equals the global rank" in msg and f"on node 1 the device is the local rank ({r - 2}: " \
               f"cuda:{r - 2})" in msg
    for r in (0, 1):  # right index: gpuguard lets torch's set_device run (this torch has no GPU to set)
        assert ranks[r]["type"] != "RankMappingError" and "gpuguard" not in ranks[r].get("module", ""), ranks[r]
    for log in logs:
        assert log.stderr.count(ACTIVE) == 3  # the agent and its two workers: one line each


# ---- (b), (c) NCCL groups sharing a GPU under torchrun ----------------------------------------------------------

NCCL_JOB = """
import os, sys
import torch, torch.distributed as dist
if os.environ.get("DEVICE_ID"):  # the right job: each rank names its own GPU
    dist.init_process_group("nccl", device_id=torch.device("cuda", int(os.environ["LOCAL_RANK"])))
else:
    dist.init_process_group("nccl")
dist.all_reduce(torch.ones(1))
"""


def torchrun_auto(fake_gpus, tmp_path, topology: str, nproc: int, **extra: str):
    script = write(tmp_path, "train.py", NCCL_JOB)
    report = tmp_path / "report.json"
    env = auto_env(fake_gpus.env(topology), **extra)
    env.pop("GPUGUARD")  # `gpuguard run` sets it
    job = launch.Job(launch.torchrun_argv(str(script), nproc=nproc, prefix=(
        "-m", "gpuguard", "run", "--json-report", str(report), "--", sys.executable)), env, tmp_path)
    proc = job.wait()
    return proc, json.loads(report.read_text())


@pytest.mark.slow
def test_b_two_ranks_on_a_one_gpu_host_both_stop_with_duplicate(fake_gpus, tmp_path):
    proc, report = torchrun_auto(fake_gpus, tmp_path, "h100x1", 2)
    assert proc.returncode != 0
    assert proc.stderr.count("gpuguard.errors.DuplicateDeviceError: 2 ranks of group 'default' share 1 GPU") == 2
    assert "Fix: start at most 1 process on" in proc.stderr and "(torchrun --nproc_per_node=1)" in proc.stderr
    assert "nccl2 requires at least one CUDA device" not in proc.stderr  # stopped before torch's NCCL code
    assert [(r["rank"], r["verdict"], r["device"]) for r in report["ranks"]] == \
        [(0, "DuplicateDeviceError", "cuda:0"), (1, "DuplicateDeviceError", "cuda:0")]
    assert report["exit_status"] == proc.returncode


@pytest.mark.slow
def test_c_four_ranks_never_calling_set_device_share_cuda0(fake_gpus, tmp_path):
    proc, report = torchrun_auto(fake_gpus, tmp_path, "h100x4", 4)
    assert proc.returncode != 0
    assert proc.stderr.count("DuplicateDeviceError: 4 ranks of group 'default' share 1 GPU") == 4
    for r in range(4):
        assert f"rank {r} is on cuda:0 because set_device was never called" in proc.stderr
    assert "Call torch.cuda.set_device(int(os.environ['LOCAL_RANK'])) before init_process_group" in proc.stderr
    assert {r["verdict"] for r in report["ranks"]} == {"DuplicateDeviceError"}
    assert sorted(r["rank"] for r in report["ranks"]) == [0, 1, 2, 3]
    assert report["verdicts"] == {"DuplicateDeviceError": 4}


@pytest.mark.slow
def test_c_right_job_passes_the_check_with_one_line_per_process(fake_gpus, tmp_path):
    proc, report = torchrun_auto(fake_gpus, tmp_path, "h100x4", 4, DEVICE_ID="1")
    assert "gpuguard.errors" not in proc.stderr
    assert proc.stderr.count(ACTIVE) == 5  # torchrun's agent and 4 workers
    assert [(r["rank"], r["verdict"], r["device"]) for r in report["ranks"]] == \
        [(r, "ok", f"cuda:{r}") for r in range(4)]
    # what follows gpuguard's check is torch's own NCCL init (which this GPU-less torch cannot do): gpuguard
    # raised nothing, the line per process is all it said


# ---- (d) a verl-style Ray job through the setup hook ----------------------------------------------------------

RAY_JOB = """
import json, os, ray
ray.init(num_cpus=8, num_gpus=4, include_dashboard=False, log_to_driver=False,
         runtime_env={"worker_process_setup_hook": "gpuguard.ray.setup"})

@ray.remote
class Worker:
    def init(self, port):
        import sys
        before = {m: m in sys.modules for m in ("_gpuguard_autostart", "gpuguard.ray", "torch", "gpuguard._core")}
        import torch, torch.distributed as dist   # the actor's own imports; nothing of gpuguard
        try:
            dist.init_process_group("nccl", init_method=f"tcp://127.0.0.1:{port}",
                                    rank=int(os.environ["RANK"]), world_size=int(os.environ["WORLD_SIZE"]))
        except Exception as exc:
            return {"type": type(exc).__name__, "module": type(exc).__module__, "message": str(exc),
                    "before": before}
        return {"type": None, "before": before}

def group(name, num_gpus, port):
    actors = [Worker.options(num_gpus=num_gpus, runtime_env={"env_vars": {
                  "RANK": str(r), "WORLD_SIZE": "3", "GPUGUARD_GROUP": name}}).remote() for r in range(3)]
    return ray.get([a.init.remote(port) for a in actors])

print(json.dumps({"colocated": group("colocated", 1 / 3, PORT1), "whole": group("whole", 1, PORT2)}))
ray.shutdown()
"""


@pytest.mark.slow
@pytest.mark.ray_cluster
def test_d_ray_actors_with_a_third_of_a_gpu_each_all_raise(fake_gpus):
    code = RAY_JOB.replace("PORT1", str(free_port())).replace("PORT2", str(free_port()))
    env = auto_env(fake_gpus.env("h100x4", RAY_DISABLE_USAGE_STATS="1"))
    env.pop("GPUGUARD")  # only the setup hook switches it on here
    proc = run_python(code, env, timeout=300)
    got = last_json(proc.stdout)
    for r in got["colocated"] + got["whole"]:  # the hook ran and loaded nothing but the standard library
        assert r["before"] == {"_gpuguard_autostart": True, "gpuguard.ray": True, "torch": False,
                               "gpuguard._core": False}, r
    for r in got["colocated"]:
        assert (r["module"], r["type"]) == ("gpuguard.errors", "DuplicateDeviceError"), r
        assert "3 ranks of group 'colocated' share 1 GPU" in r["message"]
        assert "Ray gave these actors 1/3 of a GPU each (num_gpus=1/3)" in r["message"]
        assert "gpuguard.ray_placement(max_colocate=1), or any placement group with one" in r["message"]
    for r in got["whole"]:  # a GPU each: gpuguard passes; torch's NCCL init then fails on this GPU-less torch
        assert "gpuguard" not in (r.get("module") or ""), r


# ---- (e) a model split across meta and cpu, in a plain script ------------------------------------------------

SPLIT_MODEL = """
import os, torch
from torch import nn

class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.encoder = nn.Linear(4, 4)
        self.head = nn.Linear(4, 2)

    def forward(self, x):
        return self.head(torch.relu(self.encoder(x)))

model = Net()
if os.environ.get("SPLIT"):
    model.head.to("meta")
print(tuple(model(torch.zeros(3, 4)).shape))
"""


def test_e_device_mismatch_crash_carries_the_named_parameters(fake_gpus):
    proc = run_python(SPLIT_MODEL, auto_env(fake_gpus.env("h100x1"), SPLIT="1"), check=False)
    assert proc.returncode == 1
    err = proc.stderr
    # the original exception, type and text unchanged, then gpuguard's report as its note
    assert "RuntimeError: Tensor on device meta is not on the expected device cpu!" in err
    assert "gpuguard: torch stopped in layer 'head' (Linear) of Net." in err
    assert "meta: 2 parameters of Net: head.*" in err and "cpu: 2 parameters of Net: encoder.*" in err
    assert "cpu: 1 input: tensors[0] (shape [3, 4], float32)" in err
    assert err.index("RuntimeError: Tensor on device meta") < err.index("gpuguard: torch stopped")
    assert err.count("gpuguard: torch stopped") == 1


def test_e_right_model_runs_with_the_one_line(fake_gpus):
    proc = run_python(SPLIT_MODEL, auto_env(fake_gpus.env("h100x1")))
    assert proc.stdout.strip() == "(3, 2)"
    assert proc.stderr.strip().splitlines() == [line for line in proc.stderr.strip().splitlines()
                                                if line.startswith(ACTIVE)]
    assert proc.stderr.count(ACTIVE) == 1


# ---- reports printed whole: ranks sharing the launcher's stderr never cut into each other's ------------------

WRITES_PROBE = """
import json, sys
import torch
from gpuguard.errors import DuplicateDeviceError, add_note

class Recording:  # a stderr that keeps each write apart
    def __init__(self): self.writes = []
    def write(self, text): self.writes.append(text); return len(text)
    def flush(self): pass

def writes_of(exc):
    try:
        raise exc
    except BaseException as caught:
        sys.stderr, real = Recording(), sys.stderr
        try:
            sys.excepthook(type(caught), caught, caught.__traceback__)
        finally:
            recorded, sys.stderr = sys.stderr, real
    return recorded.writes

ours = DuplicateDeviceError("2 ranks of group 'default' share 1 GPU.\\nFix: start at most 1 process")
add_note(ours, "gpuguard (auto, at init_process_group): rank 1 is on cuda:0")  # exc.add_note is 3.11+
print(json.dumps({"ours": writes_of(ours), "other": writes_of(ValueError("not gpuguard's"))}))
"""


def test_a_gpuguard_report_reaches_stderr_in_one_write(fake_gpus):
    got = run_json(WRITES_PROBE, auto_env(fake_gpus.env("h100x1")))
    [whole] = got["ours"]
    assert whole.startswith("Traceback (most recent call last):\n")
    assert whole.endswith("gpuguard.errors.DuplicateDeviceError: 2 ranks of group 'default' share 1 GPU.\n"
                          "Fix: start at most 1 process\n"
                          "gpuguard (auto, at init_process_group): rank 1 is on cuda:0\n")
    # any other exception is printed by Python's own hook, as without gpuguard (in many writes)
    assert len(got["other"]) > 1 and "".join(got["other"]).endswith("ValueError: not gpuguard's\n")


def test_a_report_under_torchs_rank_prefix_hook_stays_whole_and_prefixed(fake_gpus, tmp_path):
    code = f"""
    import torch.distributed as dist
    from gpuguard.errors import RankMappingError
    dist.init_process_group("gloo", init_method="file://{tmp_path / 'store'}", rank=0, world_size=1)
    raise RankMappingError("torch.cuda.set_device(5) asks for cuda:5\\nFix: use the local rank")
    """
    proc = run_python(code, auto_env(fake_gpus.env("h100x1")), check=False)
    assert proc.returncode == 1
    tail = proc.stderr.splitlines()[-2:]
    assert tail == ["[rank0]: gpuguard.errors.RankMappingError: torch.cuda.set_device(5) asks for cuda:5",
                    "[rank0]: Fix: use the local rank"], proc.stderr


# ---- the deferred check of an NCCL group, as on a CUDA build of torch -----------------------------------------
# This torch cannot build an NCCL group (no CUDA device), so these scripts run a gloo group that gpuguard is told
# to treat as NCCL on a torch that could build it: everything else (torchrun, its agent store, the exchange, the
# triggers) is what a CUDA job goes through.

DEFERRED = """
import os, sys
import torch, torch.distributed as dist
from gg_testing.rank import write_result
import gpuguard.auto.group_check as group_check
group_check.nccl_backed = lambda backend: True
group_check.torch_cannot_build_nccl_here = lambda: False
mode = sys.argv[1]
dist.init_process_group("gloo")
out = {"type": None}
try:
    if mode == "rank_as_device":
        torch.cuda.set_device(dist.get_rank())
    elif mode == "collective":
        dist.all_reduce(torch.ones(1))
    elif mode == "ddp":
        torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(2, 2))
    elif mode.startswith("ddp_"):  # device_ids=[LOCAL_RANK] | [RANK] | [0]; set_device never called
        index = {"ddp_local": int(os.environ["LOCAL_RANK"]), "ddp_rank": dist.get_rank(), "ddp_zero": 0}[mode]
        torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(2, 2), device_ids=[index])
except Exception as exc:
    out = {"type": type(exc).__name__, "module": type(exc).__module__, "message": str(exc),
           "notes": getattr(exc, "__notes__", [])}
out["collective_unwrapped"] = dist.all_reduce is dist.distributed_c10d.all_reduce
write_result(out)
"""


def torchrun_deferred(fake_gpus, tmp_path, mode: str, nodes: int, nproc: int):
    script = write(tmp_path, "train.py", DEFERRED)

    def env_of_node(node: int) -> dict[str, str]:
        return auto_env(fake_gpus.env("h100x4", visible=",".join(str(node * nproc + i) for i in range(nproc))))
    agents = launch.torchrun_nodes(str(script), mode, nodes=nodes, nproc=nproc, env_of_node=env_of_node,
                                   workdir=tmp_path)
    logs = launch.wait_jobs(agents)
    ranks = agents[0].ranks()
    assert sorted(ranks) == list(range(nodes * nproc)), [log.tail() for log in logs]
    return ranks


@pytest.mark.slow
def test_a_nccl_set_device_after_init_stops_every_rank(fake_gpus, tmp_path):
    ranks = torchrun_deferred(fake_gpus, tmp_path, "rank_as_device", nodes=2, nproc=2)
    for r in (2, 3):
        assert ranks[r]["type"] == "RankMappingError"
        assert f"{r} equals the global rank" in ranks[r]["message"]
    for r in (0, 1):  # their own index is right; they stop because a peer cannot bind, naming it
        assert ranks[r]["type"] == "RankMappingError", ranks[r]
        assert "could not bind a GPU, so every rank of group 'default' stops here" in ranks[r]["message"]
        assert "equals the global rank" in ranks[r]["message"]


@pytest.mark.slow
@pytest.mark.parametrize("mode,trigger", [("collective", "the first collective (torch.distributed.all_reduce)"),
                                          ("ddp", "DistributedDataParallel construction")])
def test_first_collective_or_ddp_runs_the_check_once(fake_gpus, tmp_path, mode, trigger):
    ranks = torchrun_deferred(fake_gpus, tmp_path, mode, nodes=1, nproc=2)
    for r, got in ranks.items():
        assert got["type"] == "DuplicateDeviceError", got
        assert "2 ranks of group 'default' share 1 GPU" in got["message"]
        assert got["notes"] == [f"gpuguard (auto, at {trigger}): rank {r} is on cuda:0 because set_device was never "
                                f"called, so this rank uses the current device, cuda:0, as every rank that never "
                                f"calls it does. Call torch.cuda.set_device(int(os.environ['LOCAL_RANK'])) before "
                                f"init_process_group, or pass device_id= to it."]
    if mode == "collective":  # the trigger is gone once it fired: no wrapper left on the hot path
        assert all(got["collective_unwrapped"] for got in ranks.values())


@pytest.mark.slow
def test_ddp_device_ids_name_the_rank_device_without_set_device(fake_gpus, tmp_path):
    # the model on cuda:LOCAL_RANK through DDP's device_ids, set_device never called: right, so no duplicate
    ranks = torchrun_deferred(fake_gpus, tmp_path, "ddp_local", nodes=1, nproc=2)
    for got in ranks.values():
        assert "gpuguard" not in got.get("module", ""), got  # what stops it is torch's DDP (a CPU-only torch)
        assert got["collective_unwrapped"], got  # the check ran at DDP construction, and passed


@pytest.mark.slow
def test_ddp_device_ids_of_zero_on_every_rank_share_cuda0(fake_gpus, tmp_path):
    ranks = torchrun_deferred(fake_gpus, tmp_path, "ddp_zero", nodes=1, nproc=2)
    for r, got in ranks.items():
        assert got["type"] == "DuplicateDeviceError", got
        assert got["notes"] == [f"gpuguard (auto, at DistributedDataParallel construction): rank {r} is on cuda:0 "
                                f"because DistributedDataParallel(device_ids=[0])."]


@pytest.mark.slow
def test_ddp_device_ids_of_the_global_rank_stop_every_rank(fake_gpus, tmp_path):
    ranks = torchrun_deferred(fake_gpus, tmp_path, "ddp_rank", nodes=2, nproc=2)
    for r in (2, 3):
        assert ranks[r]["type"] == "RankMappingError", ranks[r]
        assert (f"DistributedDataParallel(device_ids=[{r}]) asks for cuda:{r}, but this process on "
                in ranks[r]["message"])
        assert f"{r} equals the global rank" in ranks[r]["message"]
    for r in (0, 1):
        assert ranks[r]["type"] == "RankMappingError", ranks[r]
        assert "could not bind a GPU, so every rank of group 'default' stops here" in ranks[r]["message"]


def test_a_collective_runs_on_its_tensor_device_not_the_current_one(fake_gpus):
    got = run_json("""
        import json, types, torch
        from gpuguard.auto import group_check
        on = lambda i: types.SimpleNamespace(device=torch.device("cuda", i))  # a CUDA tensor, as far as asked
        chosen = group_check.chosen_by_tensor(on(2), "torch.distributed.all_reduce")
        listed = group_check.chosen_by_tensor([on(1), on(3)], "torch.distributed.all_gather")
        print(json.dumps({"tensor": [chosen.index, chosen.how, chosen.fallback],
                          "list": listed.index,
                          "cpu": group_check.chosen_by_tensor(torch.ones(1), "x"),
                          "nothing": group_check.chosen_by_tensor(None, "x")}))
    """, auto_env(fake_gpus.env("h100x4")))
    assert got == {"tensor": [2, "torch.distributed.all_reduce was given a tensor on cuda:2", False], "list": 1,
                   "cpu": None, "nothing": None}


# ---- Ray actor restarts meet their peers again ------------------------------------------------------------------

RAY_RESTART = """
import json, os, ray
ray.init(num_cpus=4, num_gpus=2, include_dashboard=False, log_to_driver=False,
         runtime_env={"worker_process_setup_hook": "gpuguard.ray.setup"})

@ray.remote(num_gpus=1, max_restarts=1, max_task_retries=0)
class Worker:
    def init(self, port):
        import torch, torch.distributed as dist
        try:
            dist.init_process_group("nccl", init_method=f"tcp://127.0.0.1:{port}",
                                    rank=int(os.environ["RANK"]), world_size=2)
        except Exception as exc:  # torch's own NCCL init on this GPU-less torch, once gpuguard passed
            return {"type": type(exc).__name__, "module": type(exc).__module__, "message": str(exc)[:1500]}
        return {"type": None}

    def pid(self):
        return os.getpid()

# 120 s: the restarted actor imports torch afresh in init(), which took past 30 s on CI's fully loaded two cores
actors = [Worker.options(runtime_env={"env_vars": {"RANK": str(r), "WORLD_SIZE": "2", "GPUGUARD_GROUP": "restart",
          "GPUGUARD_TIMEOUT": "120"}}).remote() for r in range(2)]
first = ray.get([a.init.remote(PORT1) for a in actors])
old = ray.get(actors[1].pid.remote())
ray.kill(actors[1], no_restart=False)          # Ray restarts it (max_restarts=1): a new process, same rank
import time
deadline = time.monotonic() + 120
new = old
while new == old and time.monotonic() < deadline:  # until the restarted process answers
    try:
        new = ray.get(actors[1].pid.remote(), timeout=60)
    except (ray.exceptions.RayActorError, ray.exceptions.ActorUnavailableError):
        time.sleep(0.5)
second = ray.get([a.init.remote(PORT2) for a in actors])   # both ranks check again, the restarted one too
print(json.dumps({"first": first, "second": second, "restarted": new != old}))
ray.shutdown()
"""


@pytest.mark.slow
@pytest.mark.ray_cluster
def test_ray_actor_restarted_by_max_restarts_meets_its_peers_again(fake_gpus):
    code = RAY_RESTART.replace("PORT1", str(free_port())).replace("PORT2", str(free_port()))
    env = auto_env(fake_gpus.env("h100x4", RAY_DISABLE_USAGE_STATS="1"))
    env.pop("GPUGUARD")
    proc = run_python(code, env, timeout=300)
    got = last_json(proc.stdout)
    assert got["restarted"]
    # a GPU each, both rounds: gpuguard's check passes (a RendezvousTimeoutError here is the restarted actor
    # reading its own first round again while its peer waits in the second)
    for round_ in ("first", "second"):
        for rank, r in enumerate(got[round_]):
            assert "gpuguard" not in (r.get("module") or ""), (round_, rank, r)
