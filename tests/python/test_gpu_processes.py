"""Every process on a rank's GPU accounted for: a stray CUDA context of a rank (error naming the rank and both
GPUs), other programs' memory on its GPU (a warning naming pid and memory; an error with require_exclusive), the
healthy job (no message), contexts made later in the run; and the fake NVML's answers against nvml.h's contract.

The jobs run under real torchrun on the fake driver and fake NVML. A script "touches cuda:0" as torch does when a
checkpoint is loaded without map_location: it retains the primary context of device 0 through the driver
(cuDevicePrimaryCtxRetain), which the fake driver records for the fake NVML like any context.
"""

from __future__ import annotations

import ctypes
import json
import os
import pwd
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from gg_testing import launch
from gg_testing.env import auto_env, no_driver_env, scrubbed
from gg_testing.launch import write
from gg_testing.paths import TOPOLOGIES
from gg_testing.procs import run_json, run_python

TOUCH_CUDA0 = """
def touch_cuda0():  # what torch.load(path) does with tensors saved from cuda:0: a context on cuda:0
    import ctypes, os
    lib = ctypes.CDLL(os.environ["GPUGUARD_LIBCUDA"])
    assert lib.cuInit(0) == 0
    ctx = ctypes.c_void_p()
    assert lib.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), 0) == 0
"""

def with_touch(code: str) -> str:
    return TOUCH_CUDA0 + textwrap.dedent(code)


JOB = TOUCH_CUDA0 + """
import os
import gpuguard
from gg_testing.rank import write_result
if os.environ["RANK"] in os.environ.get("TOUCH_RANKS", "").split(","):
    touch_cuda0()
try:
    binding = gpuguard.bind(timeout=60, require_exclusive=os.environ.get("EXCLUSIVE") == "1")
    out = {"type": None, "device": binding.device_index}
except gpuguard.GpuGuardError as exc:
    out = {"type": type(exc).__name__, "message": str(exc), "fix": exc.fix}
write_result(out)
"""


def torchrun(fake_gpus, tmp_path: Path, topology: str, nproc: int, **extra: str):
    script = write(tmp_path, "train.py", JOB)
    job = launch.torchrun(str(script), nproc=nproc, env=scrubbed(fake_gpus.env(topology, **extra)), workdir=tmp_path)
    assert sorted(job.ranks) == list(range(nproc)), job.tail()
    return job, job.ranks


def topology_with_processes(tmp_path: Path, per_gpu: dict[int, list[dict[str, int]]], base: str = "h100x4") -> str:
    topo = json.loads((TOPOLOGIES / f"{base}.json").read_text())
    for index, processes in per_gpu.items():
        topo["gpus"][index]["processes"] = processes
    path = tmp_path / "topology.json"
    path.write_text(json.dumps(topo))
    return str(path)


def absent_pid() -> int:
    pid = 4_000_000
    while os.path.exists(f"/proc/{pid}"):
        pid += 1
    return pid


@pytest.fixture
def sleeper():
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)  # inference-server"])
    yield proc
    proc.kill()
    proc.wait()


# ---- a stray context at bind() ------------------------------------------------------------------------------

@pytest.mark.slow
def test_a_rank_touching_cuda0_before_set_device_stops_every_rank_naming_it_and_both_gpus(fake_gpus, tmp_path):
    proc, ranks = torchrun(fake_gpus, tmp_path, "h100x4", 2, TOUCH_RANKS="1")
    uuid0, uuid1 = (g["uuid"] for g in fake_gpus.topology("h100x4")["gpus"][:2])
    for r in (0, 1):
        got = ranks[r]
        assert got["type"] == "StrayContextError", got
        msg = got["message"]
        assert "rank 1 (host " in msg and f"is bound to cuda:1 ({uuid1}) but already has a CUDA context on cuda:0" \
            in msg
        assert f"cuda:0 ({uuid0}, local rank 0's GPU): it holds 414 MiB there (NVML, pid " in msg
        assert "torch.load without map_location" in msg and "torch.cuda.synchronize()" in msg
        assert "Fix: call torch.cuda.set_device(int(os.environ['LOCAL_RANK'])) (or gpuguard.bind()) first" in msg
    assert "could not bind a GPU, so every rank of group 'default' stops here" in ranks[0]["message"]
    assert ranks[1]["fix"].startswith("Fix: call torch.cuda.set_device")


def test_a_context_on_a_gpu_no_rank_uses_is_a_warning_with_its_cost(fake_gpus):
    # one process on a 4-GPU host (local rank 0 of 1) that touched cuda:2: memory lost, but nobody's GPU
    env = scrubbed(fake_gpus.env("h100x4", GPUGUARD_LIBNVML="/nonexistent/libnvidia-ml.so.1"))
    proc = run_python(TOUCH_CUDA0.replace("PrimaryCtxRetain(ctypes.byref(ctx), 0)", "PrimaryCtxRetain(ctypes.byref(ctx), 2)")
                      + "\ntouch_cuda0()\nimport gpuguard\nprint(gpuguard.bind(timeout=30).device_index)\n", env)
    assert proc.stdout.strip().splitlines()[-1] == "0"
    assert "but already has a CUDA context on cuda:2" in proc.stderr
    assert "a GPU no rank of this host is bound to" in proc.stderr
    # no NVML: the message says what a context typically costs, and where that number comes from
    assert "a CUDA context holds typically 300-500 MiB with CUDA >= 11.7 (about 400 MiB per PyTorch's " \
           "maintainers, pytorch/pytorch#109888)" in proc.stderr


# ---- other programs on a rank's GPU ------------------------------------------------------------------------

@pytest.mark.slow
def test_a_foreign_process_on_a_ranks_gpu_is_a_warning_naming_pid_and_memory(fake_gpus, tmp_path, sleeper):
    gone = absent_pid()
    topology = topology_with_processes(tmp_path, {1: [{"pid": sleeper.pid, "used_mib": 30720},
                                                      {"pid": gone, "used_mib": 2048}]})
    proc, ranks = torchrun(fake_gpus, tmp_path, topology, 2)
    assert ranks[0] == {"type": None, "device": 0} and ranks[1] == {"type": None, "device": 1}
    warning = proc.stderr
    assert warning.count("gpuguard: rank 1 is bound to cuda:1") == 1 and "rank 0 is bound" not in warning
    assert "which already holds memory of 2 processes that are not ranks of this job (" in warning
    assert f"  pid {sleeper.pid}: 30.0 GiB (" in warning and "inference-server" in warning
    assert f"user {pwd.getpwuid(os.getuid()).pw_name}, started 20" in warning
    assert f"  pid {gone}: 2.0 GiB (not visible from this pid namespace: a process of another container" in warning
    assert f"end it (kill {sleeper.pid})" in warning and "require_exclusive=True" in warning


@pytest.mark.slow
def test_require_exclusive_turns_it_into_an_error_on_every_rank(fake_gpus, tmp_path, sleeper):
    topology = topology_with_processes(tmp_path, {1: [{"pid": sleeper.pid, "used_mib": 30720}]})
    proc, ranks = torchrun(fake_gpus, tmp_path, topology, 2, EXCLUSIVE="1")
    for r in (0, 1):
        assert ranks[r]["type"] == "ForeignProcessError", ranks[r]
        assert f"pid {sleeper.pid}: 30.0 GiB" in ranks[r]["message"]
    assert ranks[0]["message"].startswith("rank 1's GPU holds memory of processes outside this job and the job asked "
                                          "for whole GPUs (require_exclusive=True), so every rank stops here")
    assert ranks[1]["message"].startswith("rank 1 is bound to cuda:1")
    assert "or pass require_exclusive=True" not in ranks[1]["message"]


@pytest.mark.slow
def test_the_healthy_job_says_nothing(fake_gpus, tmp_path):
    proc, ranks = torchrun(fake_gpus, tmp_path, "h100x4", 2, EXCLUSIVE="1")
    assert ranks == {0: {"type": None, "device": 0}, 1: {"type": None, "device": 1}}
    assert "gpuguard" not in proc.stderr, proc.stderr


def test_other_ranks_stray_contexts_on_my_gpu_are_not_foreign_processes(fake_gpus, tmp_path):
    """Rank 0's GPU holds rank 1's context: that is the job's own process (its own error names it), never
    reported as another program."""
    from gpuguard.placement import RankIdentity
    env = scrubbed(fake_gpus.env("h100x4"))
    got = run_json(with_touch("""
        import json, os, subprocess, sys
        from gpuguard import _core, devices
        from gpuguard.deadline import Deadline
        from gpuguard.placement import RankIdentity, foreign_processes
        from gpuguard.placement.stores import CheckedStore

        class Store(dict):  # the exchange's pid keys, as the other ranks left them
            def check(self, keys): return all(k in self for k in keys)
            def get(self, key): return self[key]
        d = devices()
        peer = subprocess.Popen([sys.executable, "-c", "import sys; exec(sys.argv[1]); touch_cuda0(); "
                                 "print('ready', flush=True); input()", %r], stdin=subprocess.PIPE,
                                stdout=subprocess.PIPE, text=True)
        assert peer.stdout.readline().strip() == "ready"
        me = RankIdentity(rank=0, world_size=2, host_hash=7, hostname="h", gpu_uuid=d[0].uuid,
                          pci_bus_id=d[0].pci_bus_id, gpu_index=0, pid=os.getpid())
        seen = [p.pid for p in _core.gpu_usage(d[0].uuid)[0].processes]
        as_rank = foreign_processes.foreign_report(me, CheckedStore(Store({f"ns/pid/{7:016x}/{peer.pid}": b"1"}),
                                                                    "ns"), False)
        unknown = foreign_processes.foreign_report(me, CheckedStore(Store(), "ns"), False)
        peer.communicate("")
        print(json.dumps({"seen": seen == [peer.pid], "as_rank": as_rank, "unknown": unknown[0] if unknown else None,
                          "peer": peer.pid}))
    """ % TOUCH_CUDA0), env)
    assert got["seen"] and got["as_rank"] is None
    assert f"pid {got['peer']}: 414 MiB" in got["unknown"]


# ---- later in the run --------------------------------------------------------------------------------------

def test_a_context_made_after_bind_is_reported_once_with_the_stack_that_made_it(fake_gpus):
    env = scrubbed(fake_gpus.env("h100x4", GPUGUARD_CONTEXT_POLL_S="0"))
    proc = run_python(with_touch("""
        from gpuguard import devices
        from gpuguard.system import context_monitor
        devices()
        monitor = context_monitor.start(rank=3, own_index=1)

        def torch_load():  # the zero-code mode's wrapper of torch.load: the call, then the check
            touch_cuda0()
            context_monitor.after_call("torch.load")

        def load_checkpoint():
            torch_load()

        load_checkpoint()
        load_checkpoint()                               # once: the context is known now
        assert len(monitor.reports) == 1, monitor.reports
    """), env)
    report = proc.stderr
    assert report.count("made a CUDA context on another GPU after it was bound") == 1
    assert "gpuguard: rank 3 (host " in report and "bound to cuda:1" in report
    assert "cuda:0 (GPU-5a6b7c00-0000-4000-8000-1f2e3d4c5b60): 414 MiB there now (NVML)" in report
    assert "Made by torch.load, called from:" in report and "in load_checkpoint" in report


def test_the_monitor_thread_finds_contexts_no_watched_call_made(fake_gpus):
    env = scrubbed(fake_gpus.env("h100x4", GPUGUARD_CONTEXT_POLL_S="0.1"))
    proc = run_python(with_touch("""
        import time
        from gpuguard import devices
        from gpuguard.system import context_monitor
        devices()
        monitor = context_monitor.start(rank=0, own_index=2)
        touch_cuda0()
        deadline = time.time() + 20
        while not monitor.reports and time.time() < deadline:
            time.sleep(0.05)
        assert monitor.reports
    """), env)
    assert "Made between" in proc.stderr and "by a call gpuguard does not watch" in proc.stderr


def test_zero_code_mode_wraps_torch_load_for_the_monitor(fake_gpus, tmp_path):
    env = auto_env(fake_gpus.env("h100x4", GPUGUARD_CONTEXT_POLL_S="0"))
    ckpt = tmp_path / "ckpt.pt"
    proc = run_python(with_touch(f"""
        import torch
        from gpuguard import devices
        from gpuguard.system import context_monitor

        class SavedOnCuda0:  # stands for tensors saved from cuda:0: loading them makes a context there
            def __init__(self):
                self.device = "cuda:0"

            def __setstate__(self, state):
                touch_cuda0()
        torch.save({{"w": SavedOnCuda0()}}, {str(ckpt)!r})
        devices()
        context_monitor.start(rank=1, own_index=1)    # what the group check does once the rank is bound

        def resume():
            return torch.load({str(ckpt)!r}, weights_only=False)
        resume()
    """), env)
    assert "Made by torch.load, called from:" in proc.stderr and "in resume" in proc.stderr, proc.stdout + proc.stderr


# ---- the fake NVML, against nvml.h's contract --------------------------------------------------------------

def test_fake_nvml_answers_as_nvml_h_documents(fake_gpus, tmp_path):
    topology = topology_with_processes(tmp_path, {2: [{"pid": 41, "used_mib": 1000}, {"pid": 42, "used_mib": -1}]})
    env = fake_gpus.env(topology)
    got = run_json("""
        import ctypes, json, os
        lib = ctypes.CDLL(os.environ["GPUGUARD_LIBNVML"])
        class Info(ctypes.Structure):
            _fields_ = [("pid", ctypes.c_uint), ("used", ctypes.c_ulonglong), ("gi", ctypes.c_uint), ("ci", ctypes.c_uint)]
        class Mem(ctypes.Structure):
            _fields_ = [("total", ctypes.c_ulonglong), ("free", ctypes.c_ulonglong), ("used", ctypes.c_ulonglong)]
        out = {}
        dev = ctypes.c_void_p()
        out["before_init"] = lib.nvmlDeviceGetHandleByUUID(b"GPU-5a6b9e22-0002-4002-8002-1f2e3d4c5b62", ctypes.byref(dev))
        out["init"] = lib.nvmlInit_v2()
        out["by_uuid"] = lib.nvmlDeviceGetHandleByUUID(b"GPU-5a6b9e22-0002-4002-8002-1f2e3d4c5b62", ctypes.byref(dev))
        other = ctypes.c_void_p()
        out["by_bus_id"] = [lib.nvmlDeviceGetHandleByPciBusId_v2(b, ctypes.byref(other)) == 0 and other.value == dev.value
                            for b in (b"0000:3a:00.0", b"00000000:3A:00.0", b"0000:3a:00", b"3a:00.0")]
        out["unknown_uuid"] = lib.nvmlDeviceGetHandleByUUID(b"GPU-00000000-0000-0000-0000-000000000000", ctypes.byref(other))
        out["not_a_uuid"] = lib.nvmlDeviceGetHandleByUUID(b"xyz", ctypes.byref(other))
        count = ctypes.c_uint(0)
        out["count_query"] = [lib.nvmlDeviceGetComputeRunningProcesses_v3(dev, ctypes.byref(count), None), count.value]
        small = ctypes.c_uint(1); infos = (Info * 4)()
        out["too_small"] = [lib.nvmlDeviceGetComputeRunningProcesses_v3(dev, ctypes.byref(small), infos), small.value]
        room = ctypes.c_uint(4)
        out["listed"] = [lib.nvmlDeviceGetComputeRunningProcesses_v3(dev, ctypes.byref(room), infos), room.value,
                         [(infos[i].pid, infos[i].used, infos[i].gi) for i in range(room.value)]]
        empty = ctypes.c_void_p(); lib.nvmlDeviceGetHandleByUUID(b"GPU-5a6b7c00-0000-4000-8000-1f2e3d4c5b60", ctypes.byref(empty))
        zero = ctypes.c_uint(0)
        out["none_running"] = [lib.nvmlDeviceGetComputeRunningProcesses_v3(empty, ctypes.byref(zero), None), zero.value]
        mem = Mem()
        out["memory"] = [lib.nvmlDeviceGetMemoryInfo(dev, ctypes.byref(mem)), mem.total, mem.free, mem.used]
        print(json.dumps(out))
    """, env)
    not_available = 2 ** 64 - 1
    assert got["before_init"] == 1  # NVML_ERROR_UNINITIALIZED
    assert got["init"] == 0 and got["by_uuid"] == 0
    assert got["by_bus_id"] == [True, True, True, True]  # the three formats nvml.h names, any case
    assert got["unknown_uuid"] == 6 and got["not_a_uuid"] == 2  # NOT_FOUND, INVALID_ARGUMENT
    assert got["count_query"] == [7, 2]  # *infoCount = 0: INSUFFICIENT_SIZE and the count
    assert got["too_small"] == [7, 2]
    assert got["listed"] == [0, 2, [[41, 1000 << 20, 0xFFFFFFFF], [42, not_available, 0xFFFFFFFF]]]
    assert got["none_running"] == [0, 0]  # none running: SUCCESS, with infos NULL
    total = 81559 << 20
    assert got["memory"] == [0, total, total - (1000 << 20), 1000 << 20]  # total = free + used


def test_gpu_usage_through_the_core_and_nvml_missing(fake_gpus):
    got = run_json("""
        import json
        from gpuguard import _core
        usage, error = _core.gpu_usage("GPU-5a6b7c00-0000-4000-8000-1f2e3d4c5b60")
        print(json.dumps({"status": _core.nvml_status().reason, "usage": usage is None, "error": error is None}))
    """, no_driver_env())
    assert got["usage"] and not got["error"]
    assert got["status"].startswith("no NVIDIA management library (libnvidia-ml.so.1 ships with the driver): ")
