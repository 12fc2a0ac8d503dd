"""devices() on a real GPU against nvidia-smi and torch.cuda; CUDA_VISIBLE_DEVICES forms; import leaves CUDA alone."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest

from .gpu_support import normalise_bus_id

pytestmark = pytest.mark.gpu

_ENUMERATE = """
import json, torch, gpuguard
ours = [d.as_dict() for d in gpuguard.devices()]
theirs = []
for i in range(torch.cuda.device_count()):
    p = torch.cuda.get_device_properties(i)
    uuid = str(p.uuid)
    pci = None
    if hasattr(p, "pci_bus_id"):
        pci = f"{p.pci_domain_id:04x}:{p.pci_bus_id:02x}:{p.pci_device_id:02x}.0"
    theirs.append({"name": p.name, "uuid": uuid if uuid.startswith("GPU-") else "GPU-" + uuid,
                   "total_memory": p.total_memory, "cc": f"{p.major}.{p.minor}", "pci": pci})
print(json.dumps({"ours": ours, "torch": theirs, "status": gpuguard.cuda_status().as_dict()}))
"""


def run_json(code: str, env: dict[str, str], timeout: float = 180) -> dict:
    proc = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], env=env, capture_output=True, text=True,
                          timeout=timeout)
    assert proc.returncode == 0, f"exit {proc.returncode}\nstdout:\n{proc.stdout}\nstderr:\n{proc.stderr}"
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_devices_match_nvidia_smi_and_torch(real_env, smi, report):
    """Every field of devices() equals what nvidia-smi and torch.cuda say of the same GPU."""
    got = run_json(_ENUMERATE, real_env)
    report.record("gpuguard.devices()", got["ours"])
    report.record("cuda_status()", got["status"])
    ours, theirs = got["ours"], got["torch"]
    assert len(ours) == len(smi) == len(theirs)
    for mine, row, t in zip(ours, smi, theirs):
        assert mine["index"] == int(row["index"])
        assert mine["uuid"] == row["uuid"] == t["uuid"]
        assert mine["name"] == row["name"] == t["name"]
        assert mine["pci_bus_id"] == normalise_bus_id(row["pci.bus_id"])
        assert t["pci"] in (None, mine["pci_bus_id"])
        assert mine["total_memory"] == t["total_memory"]
        smi_mib = int(row["memory.total"])
        report.record(f"memory of GPU {mine['index']}", {"cuDeviceTotalMem MiB": mine["total_memory"] >> 20,
                                                         "nvidia-smi MiB": smi_mib})
        assert abs((mine["total_memory"] >> 20) - smi_mib) <= smi_mib // 100
        assert f"{mine['compute_capability'][0]}.{mine['compute_capability'][1]}" == t["cc"]


@pytest.mark.parametrize("form", ["index", "uuid", "uuid_prefix", "minus_one"])
def test_visible_devices_forms_match_torch(real_env, smi, report, form):
    """CUDA_VISIBLE_DEVICES by index, full UUID, UUID prefix and -1: gpuguard sees what torch sees."""
    uuid = smi[0]["uuid"]
    value = {"index": "0", "uuid": uuid, "uuid_prefix": uuid[:12], "minus_one": "-1"}[form]
    got = run_json(_ENUMERATE, dict(real_env, CUDA_VISIBLE_DEVICES=value))
    report.record(f"CUDA_VISIBLE_DEVICES={value}", {"gpuguard": [d["uuid"] for d in got["ours"]],
                                                    "torch": [d["uuid"] for d in got["torch"]],
                                                    "reason": got["status"].get("reason")})
    assert [d["uuid"] for d in got["ours"]] == [d["uuid"] for d in got["torch"]]
    if form == "minus_one":
        assert got["ours"] == []
        assert got["status"]["reason"], got["status"]  # says why there is no device
    else:
        assert [d["uuid"] for d in got["ours"]] == [uuid]


_CONTEXT_PROBE = """
import ctypes, json
cuda = ctypes.CDLL("libcuda.so.1")
def current():
    ctx = ctypes.c_void_p()
    return cuda.cuCtxGetCurrent(ctypes.byref(ctx)), ctx.value
def primary_active():
    dev = ctypes.c_int()
    assert cuda.cuDeviceGet(ctypes.byref(dev), 0) == 0
    flags, active = ctypes.c_uint(), ctypes.c_int()
    assert cuda.cuDevicePrimaryCtxGetState(dev, ctypes.byref(flags), ctypes.byref(active)) == 0
    return active.value
import torch, gpuguard
after_import = {"cuCtxGetCurrent": current()[0], "torch_initialized": torch.cuda.is_initialized()}
gpuguard.devices(); gpuguard.cuda_status()
after_devices = {"primary_context_active": primary_active(), "torch_initialized": torch.cuda.is_initialized()}
torch.zeros(1, device="cuda")
after_tensor = {"primary_context_active": primary_active(), "torch_initialized": torch.cuda.is_initialized()}
print(json.dumps({"after_import": after_import, "after_devices": after_devices, "after_tensor": after_tensor}))
"""


def test_import_and_devices_leave_cuda_uninitialised(real_env, report):
    """import gpuguard never calls cuInit; devices() calls cuInit but creates no context; torch then does."""
    got = run_json(_CONTEXT_PROBE, real_env)
    report.record("driver state", got)
    assert got["after_import"] == {"cuCtxGetCurrent": 3, "torch_initialized": False}  # CUDA_ERROR_NOT_INITIALIZED
    assert got["after_devices"] == {"primary_context_active": 0, "torch_initialized": False}
    assert got["after_tensor"] == {"primary_context_active": 1, "torch_initialized": True}  # the probe can see one
