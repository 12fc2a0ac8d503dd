"""bind(), init_process_group(device_id=) and verify_nccl on one real GPU, and the CudaStateError path."""

from __future__ import annotations

import sys

import pytest

from .gpu_support import run_job, torchrun, worker

pytestmark = pytest.mark.gpu

_ONE_RANK = r'''
import os, sys
import torch, torch.distributed as dist
import gpuguard
mode = sys.argv[1]
if mode == "bind":
    b = gpuguard.bind(timeout=60, verify_nccl=True, require_gpu=True)
    out = {"device": str(b.device), "current": torch.cuda.current_device(), "uuid": b.as_dict().get("uuid")}
else:
    b = gpuguard.init_process_group("nccl", bind_timeout=60)
    t = torch.full((8,), 3.0, device=b.device)
    dist.all_reduce(t)
    torch.cuda.synchronize()
    group = dist.distributed_c10d._get_default_group()
    out = {"device": str(b.device), "current": torch.cuda.current_device(), "sum": t[0].item(),
           "bound_device_id": str(getattr(group, "bound_device_id", None))}
    dist.destroy_process_group()
report_result(**out)
'''


def _result(job) -> dict:
    assert 0 in job.results, f"exit {job.returncode}, no result:\n{job.output[-4000:]}"
    return job.results[0]


@pytest.mark.slow
def test_bind_sets_the_real_device_and_verifies_nccl(tmp_path, real_env, smi, report):
    """One rank: bind(verify_nccl=True) forms a real communicator and all-reduces; the device is set."""
    job = torchrun(worker(tmp_path, "one.py", _ONE_RANK), 1, real_env, 180, "bind")
    report.record("seconds", round(job.seconds, 1))
    report.record("output", job.output[-1500:])
    report.figure(job.seconds, "s", "the job")
    assert job.returncode == 0, job.output[-4000:]
    got = _result(job)
    assert got["device"] == "cuda:0" and got["current"] == 0
    assert got["uuid"] in (None, smi[0]["uuid"])


@pytest.mark.slow
def test_init_process_group_passes_device_id_and_all_reduces(tmp_path, real_env, report):
    """gpuguard.init_process_group('nccl') hands torch device_id=cuda:0; a real all-reduce works."""
    job = torchrun(worker(tmp_path, "one.py", _ONE_RANK), 1, real_env, 180, "init")
    report.record("seconds", round(job.seconds, 1))
    report.figure(job.seconds, "s", "the job")
    assert job.returncode == 0, job.output[-4000:]
    got = _result(job)
    report.record("result", got)
    assert got["device"] == "cuda:0" and got["current"] == 0 and got["sum"] == 3.0
    assert got["bound_device_id"] == "cuda:0"


_MOVED = r'''
import os, sys
import torch, gpuguard
torch.zeros(1, device="cuda")           # torch initialises CUDA with CUDA_VISIBLE_DEVICES unset: 1 GPU
os.environ["CUDA_VISIBLE_DEVICES"] = sys.argv[1]   # too late: the driver read it already
try:
    b = gpuguard.bind(timeout=60)
    report_result(bound=str(b.device))
except gpuguard.GpuGuardError as e:
    report_result(error=type(e).__name__, message=str(e))
'''


@pytest.mark.parametrize("later", ["nothing", "uuid"])
def test_cuda_state_error_when_visibility_changes_after_torch_initialised(tmp_path, real_env, smi, report, later):
    """Visibility narrowed to nothing after torch initialised CUDA: CudaStateError; to the same GPU: no error."""
    value = smi[0]["uuid"] if later == "uuid" else ""
    script = worker(tmp_path, "moved.py", _MOVED)
    got = _result(run_job([sys.executable, str(script), value], real_env, 180))
    got.pop("rank")
    report.record(f"CUDA_VISIBLE_DEVICES={value!r} after torch initialised", got)
    if later == "uuid":
        assert got == {"bound": "cuda:0"}
        return
    assert got["error"] == "CudaStateError", got
    assert got["message"].startswith("CUDA was initialised in this process before CUDA_VISIBLE_DEVICES got its "
                                     "current value: "), got
    assert "gives a new process no GPU" in got["message"], got
    assert f"this process sees 1 GPU [{smi[0]['uuid'][:12]}" in got["message"], got
