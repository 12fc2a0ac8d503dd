"""CUDA tensors: assert_same_device and guard(deep=True) against PyTorch's own error, and the guard's cost."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest

pytestmark = pytest.mark.gpu


def _model():
    import torch
    from torch import nn
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(256, 512), nn.ReLU(), nn.Linear(512, 512), nn.ReLU(), nn.Linear(512, 10))


def test_model_on_gpu_inputs_on_cpu(real_env, report):
    """PyTorch's own text is decoded by explain; assert_same_device and guard(deep=True) name the parts."""
    import torch
    import gpuguard
    model = _model().to("cuda:0")
    x = torch.randn(64, 256)
    with pytest.raises(RuntimeError) as plain:
        model(x)
    torch_text = str(plain.value)
    report.record("PyTorch's message", torch_text)
    assert "Expected all tensors to be on the same device" in torch_text
    proc = subprocess.run([sys.executable, "-m", "gpuguard", "explain", "-"], input=torch_text, env=real_env,
                          capture_output=True, text=True, timeout=120)
    report.record("gpuguard explain", proc.stdout[-2000:])
    assert proc.returncode == 0, proc.stderr
    assert "cuda:0" in proc.stdout and "cpu" in proc.stdout, proc.stdout
    with pytest.raises(gpuguard.DeviceMismatchError) as checked:
        gpuguard.assert_same_device(model, x)
    report.record("assert_same_device", str(checked.value))
    assert "cuda:0" in str(checked.value) and "cpu" in str(checked.value)
    handle = gpuguard.guard(model, deep=True)
    try:
        with pytest.raises(gpuguard.DeviceMismatchError) as guarded:
            model(x)
    finally:
        handle.remove()
    report.record("guard(deep=True)", str(guarded.value))
    assert "cuda:0" in str(guarded.value) and "cpu" in str(guarded.value)
    assert gpuguard.assert_same_device(model, x.to("cuda:0")) == torch.device("cuda:0")


@pytest.mark.gpu_alone
def test_guard_overhead_per_forward_on_the_gpu(report):
    """Not asserted: the cost of a guarded forward on a small model, as a ratio to the unguarded step."""
    import torch
    import gpuguard
    model = _model().to("cuda:0")
    x = torch.randn(64, 256, device="cuda:0")

    def step_seconds(n: int = 2000) -> float:
        for _ in range(50):
            model(x)
        torch.cuda.synchronize()
        best = float("inf")
        for _ in range(3):
            start = time.perf_counter()
            for _ in range(n):
                model(x)
            torch.cuda.synchronize()
            best = min(best, (time.perf_counter() - start) / n)
        return best

    bare = step_seconds()
    timings = {"bare us/forward": round(bare * 1e6, 2)}
    for deep in (False, True):
        handle = gpuguard.guard(model, deep=deep)
        try:
            t = step_seconds()
        finally:
            handle.remove()
        timings[f"guard(deep={deep}) us/forward"] = round(t * 1e6, 2)
        timings[f"guard(deep={deep}) ratio"] = round(t / bare, 3)
    report.record("overhead", timings)
    report.figure(timings["guard(deep=True) ratio"], "x", "guard(deep=True) / bare forward")
    assert bare > 0
