"""Another process holding memory on the one GPU (another user's job, a run that did not exit): the warning
bind() gives, naming it and its memory as NVML and /proc see it, and `gpuguard explain` reading the real CUDA
out-of-memory error of a job that then asks for more than is free."""

from __future__ import annotations

import json
import re
import subprocess
import sys

import pytest

from .gpu_support import run_job, worker

# gpu_alone: the warning lists every process on the GPU, and the job asks for all of its free memory
pytestmark = [pytest.mark.gpu, pytest.mark.gpu_alone]

# One line: bind()'s warning quotes the holder's command line, which then stays on one line of it.
_HOLDER = ('import sys, torch; held = torch.empty(int(sys.argv[1]), dtype=torch.uint8, device="cuda:0"); '
           'print("ready", flush=True); sys.stdin.readline()')

# One process (no launcher): bind(), then more than the free memory.
_JOB = r'''
import torch, gpuguard
binding = gpuguard.bind(timeout=60)  # the warning goes to stderr through the "gpuguard" logger
free, total = torch.cuda.mem_get_info()
asked = free + (1 << 30)             # more than is free, less than the GPU: the holder has the rest
try:
    torch.empty(asked, dtype=torch.uint8, device="cuda")
    report_result(oom=None, free=free, total=total)
except torch.cuda.OutOfMemoryError as exc:
    report_result(oom=str(exc), free=free, total=total, asked=asked, device=str(binding.device))
'''


@pytest.fixture
def holder(smi, real_env):
    """A process holding 40 % of the GPU, alive for the test."""
    held = int(smi[0]["memory.total"]) * (1 << 20) * 2 // 5
    proc = subprocess.Popen([sys.executable, "-c", _HOLDER, str(held)], env=real_env, stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "ready", "the holder did not start"
        yield proc, held
    finally:
        proc.kill()
        proc.wait()


def test_a_foreign_process_on_the_gpu_is_named_at_bind_and_by_explain_of_the_real_oom(holder, tmp_path, real_env,
                                                                                     smi, report):
    """bind() warns naming the holder's pid and memory; the job's real out-of-memory error, pasted into explain
    on this host, is another process's memory (oom_other_process) naming the same pid."""
    proc, held = holder
    job = run_job([sys.executable, str(worker(tmp_path, "job.py", _JOB))], real_env, 240)
    assert job.returncode == 0 and 0 in job.results, job.output[-4000:]
    warning = job.output[job.output.find("gpuguard: rank 0 is bound to"):]
    report.record("bind() warning", warning[:2000])
    assert warning.startswith(f"gpuguard: rank 0 is bound to cuda:0 ({smi[0]['uuid']}) on host "), job.output[-4000:]
    assert "which already holds memory of " in warning and "That memory is not this rank's to use" in warning
    listed = re.search(rf"^  pid {proc.pid}: ([\d.]+) GiB \((.*)\)$", warning, re.M)
    if listed:  # NVML names the holder by a pid this namespace knows
        report.figure(float(listed.group(1)), "GiB", f"pid {proc.pid} as bind() names it")
        assert float(listed.group(1)) >= held / (1 << 30) - 0.05, listed.group(0)
        assert "python" in listed.group(2) and "torch.empty" in listed.group(2), listed.group(0)  # /proc's view
        assert re.search(rf"\(kill [\d ]*\b{proc.pid}\b", warning), warning
    else:  # a container whose driver names the host's pids: the warning says it cannot see them
        report.figure(0, "", f"pid {proc.pid} not listed by NVML (host pids)")
        assert ("not visible from this pid namespace" in warning
                or "in use under no process NVML lists" in warning), warning
    oom = job.results[0]["oom"]
    report.record("torch's out-of-memory error", oom)
    assert oom and "CUDA out of memory. Tried to allocate" in oom, job.results[0]
    explained = subprocess.run([sys.executable, "-m", "gpuguard", "explain", "--this-host", "--json", "-"],
                               input=f"torch.OutOfMemoryError: {oom}\n", env=real_env, capture_output=True, text=True,
                               timeout=120)
    report.record("gpuguard explain --this-host --json", explained.stdout[-3000:])
    assert explained.returncode == 0, explained.stderr
    kinds = [d["kind"] for d in json.loads(explained.stdout)["diagnoses"]]
    assert kinds == ["oom_other_process"], explained.stdout
    diagnosis = json.loads(explained.stdout)["diagnoses"][0]
    if f"Process {proc.pid} has " in oom:  # torch names the holder by this namespace's pid
        assert diagnosis["cause"].startswith(f"pid {proc.pid} holds "), diagnosis["cause"]
        assert f"pid {proc.pid} is running here now: " in diagnosis["summary"], diagnosis["summary"]
        assert f"ps -o pid,user,lstart,args -p {proc.pid}" in diagnosis["fix"], diagnosis["fix"]
