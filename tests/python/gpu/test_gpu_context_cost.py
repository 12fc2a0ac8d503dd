"""What a stray CUDA context costs on a real GPU, and NVML's answers against the fake NVML's: measured with the
real driver and NVML, recorded in the report (gpuguard's messages quote 300-500 MiB from published figures until
this has run on the GPUs users have)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

pytestmark = pytest.mark.gpu

# A process that makes a context on cuda:0 the way a stray torch call does, then waits; its parent reads NVML.
_STRAY = """
import sys, torch
torch.zeros(1, device="cuda:0")   # what torch.load without map_location does with tensors saved from cuda:0
print("ready", flush=True)
sys.stdin.readline()
"""

_MEASURE = """
import json, os, subprocess, sys
from gpuguard import _core, devices
d = devices()[0]
before, _ = _core.gpu_usage(d.uuid, d.pci_bus_id)
child = subprocess.Popen([sys.executable, "-c", sys.argv[1]], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                         text=True)
assert child.stdout.readline().strip() == "ready"
during, error = _core.gpu_usage(d.uuid, d.pci_bus_id)
mine = [p.used_memory for p in during.processes if p.pid == child.pid]
child.communicate("")
print("RESULT " + json.dumps({
    "gpu": d.name, "total": during.total_memory, "reserved": during.reserved_memory,
    "context_bytes": mine[0] if mine else None, "pids_listed": [p.pid for p in during.processes],
    "child": child.pid, "used_delta": during.used_memory - before.used_memory,
    "active_here": _core.active_primary_contexts(), "nvml": _core.nvml_status().as_dict()}))
"""


@pytest.mark.gpu_alone  # the GPU's used memory before and after: another test's memory would count
def test_a_stray_context_costs_what_nvml_says_and_the_checks_make_none(real_env, report):
    proc = subprocess.run([sys.executable, "-c", _MEASURE, _STRAY], env=real_env, capture_output=True, text=True,
                          timeout=300)
    lines = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
    assert lines, proc.stdout[-3000:] + proc.stderr[-3000:]
    got = json.loads(lines[-1][len("RESULT "):])
    report.record("measurement", got)
    # NVML lists the child by a pid this namespace knows, unless the driver reports the host's pids (a container)
    if got["child"] in got["pids_listed"]:
        assert got["context_bytes"] is not None and got["context_bytes"] > 64 << 20
        report.record("context MiB (torch.zeros on cuda:0, NVML usedGpuMemory)", got["context_bytes"] / (1 << 20))
    assert got["used_delta"] > 0
    report.record("used MiB added on the GPU", got["used_delta"] / (1 << 20))
    report.figure(got["used_delta"] / (1 << 20), "MiB", "used on the GPU by one stray context")
    # gpuguard asked the driver and NVML about GPU 0 and made no context of its own
    assert got["active_here"] == []


def test_nvml_process_query_protocol_matches_the_fake(real_env, report):
    code = """
import ctypes, json
lib = ctypes.CDLL("libnvidia-ml.so.1")
assert lib.nvmlInit_v2() == 0
dev = ctypes.c_void_p()
assert lib.nvmlDeviceGetHandleByIndex_v2(0, ctypes.byref(dev)) == 0
count = ctypes.c_uint(0)
rc = lib.nvmlDeviceGetComputeRunningProcesses_v3(dev, ctypes.byref(count), None)
uuid = ctypes.create_string_buffer(96)
lib.nvmlDeviceGetUUID(dev, uuid, 96)
by_uuid = ctypes.c_void_p()
rc_uuid = lib.nvmlDeviceGetHandleByUUID(uuid.value, ctypes.byref(by_uuid))
missing = lib.nvmlDeviceGetHandleByUUID(b"GPU-00000000-0000-0000-0000-000000000000", ctypes.byref(by_uuid))
print(json.dumps({"count_query": [rc, count.value], "by_uuid": rc_uuid, "unknown_uuid": missing}))
"""
    proc = subprocess.run([sys.executable, "-c", code], env=real_env, capture_output=True, text=True, timeout=120)
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    report.record("nvml", got)
    rc, count = got["count_query"]
    assert (rc, count == 0) in ((0, True), (7, False))  # SUCCESS with none running, or INSUFFICIENT_SIZE + count
    assert got["by_uuid"] == 0 and got["unknown_uuid"] == 6  # as the fake answers
