"""Real NCCL on one GPU: its own duplicate-GPU text decoded by explain; bind() stopping both ranks first."""

from __future__ import annotations

import re
import socket
import subprocess
import sys

import pytest

from .gpu_support import nccl_lines, normalise_bus_id, torchrun, worker

pytestmark = [pytest.mark.gpu, pytest.mark.slow]

# One script, three ways: NCCL alone, bind() before NCCL, bind(verify_nccl=True). Each rank writes its result.
_WORKER = r'''
import os, sys, time
import torch, torch.distributed as dist
mode = sys.argv[1]
say = report_result
if mode == "nccl_alone":
    torch.cuda.set_device(0)  # what a script that ignores LOCAL_RANK on a 1-GPU host does
    dist.init_process_group("nccl")
    t = torch.ones(4, device="cuda")
    try:
        dist.all_reduce(t)
        torch.cuda.synchronize()
        say(outcome="all_reduce returned", value=t[0].item())
    except Exception as e:
        say(outcome="raised", error=type(e).__name__, message=str(e))
        raise
    finally:
        dist.destroy_process_group()
else:
    import gpuguard
    start = time.monotonic()
    try:
        b = gpuguard.bind(timeout=90, verify_nccl=(mode == "verify_nccl"))
        say(outcome="bound", binding=str(b.device), seconds=time.monotonic() - start)
    except gpuguard.GpuGuardError as e:
        say(outcome="raised", error=type(e).__name__, message=str(e), seconds=time.monotonic() - start)
        sys.exit(3)
'''


@pytest.fixture
def script(tmp_path):
    return worker(tmp_path, "worker.py", _WORKER)


def test_nccl_own_duplicate_text_is_decoded_by_explain(script, real_env, smi, report):
    """Two ranks on one GPU without gpuguard: record NCCL's words; explain names both ranks and this GPU."""
    job = torchrun(script, 2, dict(real_env, NCCL_DEBUG="WARN"), 240, "nccl_alone")
    out = job.output
    lines = nccl_lines(out, "WARN")
    report.record("exit", job.returncode)
    report.record("seconds", round(job.seconds, 1))
    report.record("NCCL text", lines[:12])
    report.record("rank results", job.results)
    report.figure(job.seconds, "s", "NCCL refused")
    assert job.returncode not in (0, None), \
        f"NCCL did not refuse two ranks on one GPU (exit {job.returncode}):\n{out[-4000:]}"
    assert lines, f"NCCL printed no WARN line of its own:\n{out[-4000:]}"
    proc = subprocess.run([sys.executable, "-m", "gpuguard", "explain", "-"], input=out, env=real_env,
                          capture_output=True, text=True, timeout=120)
    report.record("gpuguard explain", proc.stdout[-3000:])
    assert proc.returncode == 0, proc.stderr
    # NCCL's WARN lines name the host; torch's error repeats NCCL's text without it: one pair, named once
    bus = normalise_bus_id(smi[0]["pci.bus_id"])
    summary = proc.stdout.splitlines()[0]
    host = socket.gethostname().split(".")[0]
    assert re.search(rf": ranks 0, 1 share {re.escape(bus)} on host {re.escape(host)}\. \(seen \d+ times\)$", summary), \
        proc.stdout
    assert f"{bus} (NCCL's 'CUDA device {int(bus.replace(':', '').replace('.', ''), 16):x}') = GPU 0 on this host " \
           f"({smi[0]['uuid']})" in proc.stdout, proc.stdout
    if len(smi) == 1:  # set_device(local_rank) would send local rank 1 to a cuda:1 that does not exist
        assert "fix:      This host shows 1 GPU" in proc.stdout, proc.stdout


def test_bind_stops_both_ranks_before_nccl(script, real_env, smi, report):
    """Two ranks on a 1-GPU host with bind(): both raise DuplicateDeviceError, NCCL never runs."""
    # NCCL_DEBUG=WARN: had NCCL been reached and refused the GPU, it would say so in a line of its own
    job = torchrun(script, 2, dict(real_env, NCCL_DEBUG="WARN"), 240, "bind")
    got, out = job.results, job.output
    report.record("rank results", got)
    report.record("seconds", round(job.seconds, 1))
    report.figure(max((r.get("seconds", 0) for r in got.values()), default=0), "s", "bind() to the error")
    assert sorted(got) == [0, 1], out[-4000:]
    assert {r["error"] for r in got.values()} == {"DuplicateDeviceError"}, got
    message = got[0]["message"]
    assert got[1]["message"] == message
    assert f"GPU {smi[0]['uuid']} (PCI {normalise_bus_id(smi[0]['pci.bus_id'])}) is shared by ranks 0 and 1" in message
    assert "2 processes on a host with 1 GPU" in message
    assert not nccl_lines(out), out[-4000:]


def test_multi_rank_gpu_enable_does_not_silence_gpuguard(script, real_env, report):
    """NCCL_MULTI_RANK_GPU_ENABLE=1: record what NCCL does alone, and check bind(verify_nccl=True) still refuses."""
    env = dict(real_env, NCCL_MULTI_RANK_GPU_ENABLE="1", NCCL_DEBUG="WARN")
    alone = torchrun(script, 2, env, 240, "nccl_alone")
    report.record("NCCL alone: exit", alone.returncode if alone.returncode is not None else "hung (killed after 240 s)")
    report.record("NCCL alone: rank results", alone.results)
    report.record("NCCL alone: NCCL text", nccl_lines(alone.output)[:12])
    report.record("NCCL alone: seconds", round(alone.seconds, 1))
    job = torchrun(script, 2, env, 240, "verify_nccl")
    got = job.results
    report.record("bind(verify_nccl=True): rank results", got)
    report.figure(job.seconds, "s", "bind(verify_nccl=True) job")
    assert sorted(got) == [0, 1], job.output[-4000:]
    assert {r["error"] for r in got.values()} == {"DuplicateDeviceError"}, got
