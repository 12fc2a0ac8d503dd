"""torch.compile of a guarded CUDA model, default mode and reduce-overhead (CUDA graphs), fullgraph=True: the
checks run when Dynamo traces and never after (graphs replay with no gpuguard work), a mismatch stops the
compilation before any graph is captured, torch's own error for an unguarded model given CPU inputs is read by
explain, and the steady-state step costs the same with and without guard() (timed in one run, recorded, not
asserted).
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
import time

import pytest

pytestmark = pytest.mark.gpu


def _model():
    import torch
    from torch import nn
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(256, 512), nn.ReLU(), nn.Linear(512, 512), nn.ReLU(), nn.Linear(512, 10))
    model[0].register_buffer("unused", torch.zeros(1))  # forward never reads it
    return model.to("cuda:0")


def test_cuda_graphs_replay_without_any_gpuguard_work(report, monkeypatch):
    """The guarded model's CUDA graph replays with no check: a stray buffer stops an eager forward, not a replay.

    reduce-overhead captures the graph; a buffer the graph never reads, moved to the CPU after capture, is seen by
    the eager check and by none of the 50 replays, and no check ran after compiling."""
    import torch
    import gpuguard
    from gpuguard.tensors import compile_time
    from torch._dynamo.utils import counters

    torch.compiler.reset()
    counters.clear()
    checks: list[int] = []
    run_now = compile_time.run_now
    monkeypatch.setattr(compile_time, "run_now", lambda ctx: (checks.append(1), run_now(ctx)))
    model = _model()
    gpuguard.guard(model, deep=True)
    step = torch.compile(model, mode="reduce-overhead", fullgraph=True)
    x = torch.randn(64, 256, device="cuda:0")
    with torch.no_grad():
        for _ in range(5):  # warm-up, then capture
            expected = step(x).clone()
        traced = len(checks)
        torch.utils.swap_tensors(model[0].unused, torch.zeros(1))
        with pytest.raises(gpuguard.DeviceMismatchError):
            model(x)  # eager: the check sees it
        for _ in range(50):
            out = step(x)  # replays: no check runs
        torch.cuda.synchronize()
    report.record("trace-time checks", traced)
    report.record("cudagraph skips", dict(counters["inductor"]))
    assert traced >= 3 and len(checks) == traced
    assert torch.allclose(out, expected)
    assert not any("cudagraph_skips" in k and v for k, v in counters["inductor"].items()), counters["inductor"]


def test_default_mode_checks_when_dynamo_traces_and_never_after(report, monkeypatch):
    """torch.compile(fullgraph=True), default mode: the guarded model's checks run while Dynamo traces, none in
    the 50 calls after, and the compiled step computes what the eager model does."""
    import torch
    import gpuguard
    from gpuguard.tensors import compile_time

    torch.compiler.reset()
    checks: list[int] = []
    run_now = compile_time.run_now
    monkeypatch.setattr(compile_time, "run_now", lambda ctx: (checks.append(1), run_now(ctx)))
    model = _model()
    gpuguard.guard(model, deep=True)
    step = torch.compile(model, fullgraph=True)
    x = torch.randn(64, 256, device="cuda:0")
    with torch.no_grad():
        expected = model(x)
        start = time.perf_counter()
        first = step(x)
        torch.cuda.synchronize()
        compile_seconds = time.perf_counter() - start
        traced = len(checks)
        for _ in range(50):
            out = step(x)
        torch.cuda.synchronize()
    report.record("trace-time checks", traced)
    report.figure(compile_seconds, "s", "first compiled call")
    assert traced >= 1 and len(checks) == traced, (traced, len(checks))
    assert torch.allclose(first, expected, atol=1e-4) and torch.allclose(out, expected, atol=1e-4)


@pytest.mark.parametrize("mode", ["default", "reduce-overhead"])
def test_a_mismatch_stops_compilation_before_any_graph_is_captured(report, mode):
    """A CPU input to the CUDA model: CompileTimeDeviceMismatchError, the eager report, when Dynamo traces."""
    import torch
    import gpuguard
    from gpuguard.tensors.compile_time import CompileTimeDeviceMismatchError

    torch.compiler.reset()
    model = _model()
    gpuguard.guard(model, deep=True)
    x = torch.randn(64, 256)
    with pytest.raises(gpuguard.DeviceMismatchError) as eager:
        model(x)
    step = torch.compile(model, mode=mode, fullgraph=True)
    with pytest.raises(CompileTimeDeviceMismatchError) as compiled:
        step(x)
    report.record("compile-time error", str(compiled.value)[:1500])
    assert compiled.value.report == str(eager.value)
    assert compiled.value.layer == "0" and set(compiled.value.devices) == {"cuda:0", "cpu"}
    with torch.no_grad():
        assert step(x.to("cuda:0")).device == torch.device("cuda:0")  # the right device compiles and runs


_UNGUARDED = """
import torch
from torch import nn
model = nn.Sequential(nn.Linear(256, 512), nn.ReLU(), nn.Linear(512, 10)).to("cuda:0")
torch.compile(model, fullgraph=True)(torch.randn(64, 256))  # CPU inputs: dies of torch's own error
"""


def test_cpu_inputs_to_a_compiled_unguarded_model_torchs_error_is_explained(real_env, report):
    """No gpuguard in the job: torch.compile's own error for CPU inputs to the CUDA model, read by explain as a
    device mismatch between cuda:0 and the CPU."""
    proc = subprocess.run([sys.executable, "-c", _UNGUARDED], env=real_env, capture_output=True, text=True,
                          timeout=300)
    report.record("torch's error (last lines)", proc.stderr[-1500:])
    assert proc.returncode != 0, proc.stdout + proc.stderr
    explained = subprocess.run([sys.executable, "-m", "gpuguard", "explain", "--json", "-"], input=proc.stderr,
                               env=real_env, capture_output=True, text=True, timeout=120)
    report.record("gpuguard explain --json", explained.stdout[-2000:])
    assert explained.returncode == 0, explained.stderr
    found = [d for d in json.loads(explained.stdout)["diagnoses"] if d["kind"] == "device_mismatch"]
    assert found, f"explain did not read torch's error:\n{proc.stderr[-3000:]}\n--- explain:\n{explained.stdout}"
    said = " ".join([found[0]["summary"], found[0]["cause"], *found[0]["devices"]])
    assert "cuda:0" in said and "cpu" in said, found[0]


@pytest.mark.gpu_alone
def test_steady_state_step_cost_compiled_with_and_without_guard(report):
    """Not asserted: the reduce-overhead step's time unguarded, with guard() and with guard(deep=True), in one run.

    An unguarded copy is timed again for the noise; rounds interleave the copies; each is the median of rounds."""
    import copy

    import torch
    import gpuguard

    torch.compiler.reset()
    base = _model()
    models = {name: copy.deepcopy(base) for name in ("unguarded", "guard", "guard_deep", "unguarded_again")}
    gpuguard.guard(models["guard"])
    gpuguard.guard(models["guard_deep"], deep=True)
    steps = {name: torch.compile(m, mode="reduce-overhead", fullgraph=True) for name, m in models.items()}
    x = torch.randn(64, 256, device="cuda:0")
    rounds: dict[str, list[float]] = {name: [] for name in steps}
    with torch.no_grad():
        for step in steps.values():
            for _ in range(10):
                step(x)
        torch.cuda.synchronize()
        for _ in range(15):
            for name, step in steps.items():
                t0 = time.perf_counter()
                for _ in range(500):
                    step(x)
                torch.cuda.synchronize()
                rounds[name].append((time.perf_counter() - t0) / 500)
    median = {name: statistics.median(v) for name, v in rounds.items()}
    base_time = median["unguarded"]
    report.record("us per step (median of rounds)", {k: round(v * 1e6, 2) for k, v in median.items()})
    report.record("ratio to unguarded", {k: round(v / base_time, 4) for k, v in median.items()})
    report.figure(median["guard_deep"] / base_time, "x", "guard(deep=True) / unguarded step")
    assert base_time > 0
