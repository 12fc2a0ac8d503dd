"""torch.compile(mode="reduce-overhead") of a guarded CUDA model: replays without gpuguard, a mismatch before capture.

CUDA graphs replay with no gpuguard work, a mismatch stops the compilation before any graph is captured, and the
steady-state step costs the same with and without guard() (timed in one run, recorded, not asserted).
"""

from __future__ import annotations

import statistics
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
    from gpuguard import compile_time
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


def test_a_mismatch_stops_compilation_before_any_graph_is_captured(report):
    """A CPU input to the CUDA model: CompileTimeDeviceMismatchError, the eager report, when Dynamo traces."""
    import torch
    import gpuguard
    from gpuguard.compile_time import CompileTimeDeviceMismatchError

    torch.compiler.reset()
    model = _model()
    gpuguard.guard(model, deep=True)
    x = torch.randn(64, 256)
    with pytest.raises(gpuguard.DeviceMismatchError) as eager:
        model(x)
    step = torch.compile(model, mode="reduce-overhead", fullgraph=True)
    with pytest.raises(CompileTimeDeviceMismatchError) as compiled:
        step(x)
    report.record("compile-time error", str(compiled.value)[:1500])
    assert compiled.value.report == str(eager.value)
    assert compiled.value.layer == "0" and set(compiled.value.devices) == {"cuda:0", "cpu"}
    with torch.no_grad():
        assert step(x.to("cuda:0")).device == torch.device("cuda:0")  # the right device compiles and runs


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
    assert base_time > 0
