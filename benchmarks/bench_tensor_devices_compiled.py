"""Benchmark: a torch.compile'd step with and without gpuguard.guard(), in the same run, and what the check adds to
compiling.

  python benchmarks/bench_tensor_devices_compiled.py [--quick]

1. Steady state. One MLP (Linear + ReLU layers), copies with the same weights: unguarded, guard(model),
   guard(model, deep=True), and no-op Python hooks where deep=True puts its own (what torch.compile charges for
   any hook there: Dynamo checks more of a module with hooks before each compiled call), each compiled by
   Inductor (the default backend). One more unguarded copy compiled alike measures the noise: the same graph
   timed twice. Two steps each: inference (forward under no_grad) and
   training (forward, backward, SGD). Rounds interleave the copies, so that a disturbance hits them all alike;
   each copy's time is the best round's mean per call (the round least disturbed by other processes).
   Target: guarded / unguarded within the noise, and within 1 %.
2. Compile time, where the check runs (once per compilation, on Dynamo's fake tensors): Dynamo's tracing alone
   (backend="eager"), best of several, for models of 8 and 64 layers; and one full Inductor compile of each
   copy with Inductor's and AOTAutograd's caches off (the guarded graph is the unguarded one, which a cache
   would otherwise serve), best of three.
For reference, the eager guarded forward against the eager unguarded one.

Prints a table and writes benchmarks/results/tensor_devices_compiled.json.
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path
from typing import Any, Callable

import torch
from torch import nn

import gpuguard  # the installed package; PYTHONPATH=python measures this checkout's in-place build

RESULTS = Path(__file__).resolve().parent / "results"
VARIANTS = ("unguarded", "guard", "guard_deep", "plain_hooks_deep", "unguarded_again")


def mlp(layers: int, width: int) -> nn.Module:
    torch.manual_seed(0)
    parts: list[nn.Module] = []
    for _ in range(layers):
        parts += [nn.Linear(width, width), nn.ReLU()]
    return nn.Sequential(*parts, nn.Linear(width, 10))


def plain_hooks_where_deep_guard_puts_its_own(model: nn.Module) -> None:
    """No-op Python hooks where guard(deep=True) puts its own: what torch.compile charges for any hook there."""
    def pre_hook(module: nn.Module, args: Any, kwargs: Any) -> None:
        return None

    def forward_hook(module: nn.Module, args: Any, output: Any) -> None:
        return None

    model.register_forward_pre_hook(pre_hook, with_kwargs=True, prepend=True)
    model.register_forward_hook(forward_hook, always_call=True)
    for layer in model.modules():
        if layer is not model and any(p is not None for p in layer._parameters.values()):
            layer.register_forward_pre_hook(pre_hook, with_kwargs=True)


def copies(base: nn.Module) -> dict[str, nn.Module]:
    out = {name: copy.deepcopy(base) for name in VARIANTS}
    gpuguard.guard(out["guard"])
    gpuguard.guard(out["guard_deep"], deep=True)
    plain_hooks_where_deep_guard_puts_its_own(out["plain_hooks_deep"])
    return out


def no_caches() -> None:
    """Inductor's FX graph cache and AOTAutograd's cache would serve the guarded copy the graph compiled for the
    unguarded one (they are the same graph); compile times are only comparable without them."""
    import torch._inductor.config as inductor_config

    for owner, name in ((inductor_config, "fx_graph_cache"), (inductor_config, "fx_graph_remote_cache"),
                        (inductor_config, "autotune_local_cache")):
        if hasattr(owner, name):
            setattr(owner, name, False)
    try:
        import torch._functorch.config as functorch_config
        if hasattr(functorch_config, "enable_autograd_cache"):
            functorch_config.enable_autograd_cache = False
    except ImportError:  # pragma: no cover - a torch without it
        pass


def timed_rounds(steps: dict[str, Callable[[], Any]], calls: int, rounds: int) -> dict[str, dict[str, float]]:
    per_round: dict[str, list[float]] = {name: [] for name in steps}
    for step in steps.values():
        for _ in range(max(3, calls // 10)):
            step()
    for _ in range(rounds):
        for name, step in steps.items():
            t0 = time.perf_counter_ns()
            for _ in range(calls):
                step()
            per_round[name].append((time.perf_counter_ns() - t0) / calls / 1000.0)
    return {name: {"best_us": min(v), "median_us": statistics.median(v)} for name, v in per_round.items()}


def steady_state(layers: int, width: int, batch: int, calls: int, rounds: int) -> dict[str, Any]:
    torch.compiler.reset()
    models = copies(mlp(layers, width))
    x = torch.randn(batch, width)
    compiled = {name: torch.compile(m) for name, m in models.items()}
    optimizers = {name: torch.optim.SGD(m.parameters(), lr=1e-6) for name, m in models.items()}

    def inference(name: str) -> Callable[[], Any]:
        def step() -> Any:
            with torch.no_grad():
                return compiled[name](x)
        return step

    def training(name: str) -> Callable[[], Any]:
        def step() -> None:
            compiled[name](x).sum().backward()
            optimizers[name].step()
            optimizers[name].zero_grad(set_to_none=True)
        return step

    out: dict[str, Any] = {"layers": layers, "width": width, "batch": batch}
    for kind, make in (("inference", inference), ("training", training)):
        times = timed_rounds({name: make(name) for name in VARIANTS}, calls, rounds)
        base = times["unguarded"]["best_us"]
        out[kind] = {name: {**t, "ratio": t["best_us"] / base} for name, t in times.items()}
    eager = {name: (lambda m=models[name]: m(x)) for name in ("unguarded", "guard", "guard_deep", "plain_hooks_deep")}
    with torch.no_grad():
        times = timed_rounds(eager, calls, rounds)
    base = times["unguarded"]["best_us"]
    out["eager_inference"] = {name: {**t, "ratio": t["best_us"] / base} for name, t in times.items()}
    return out


def dynamo_trace_seconds(layers: int, width: int, repeats: int) -> dict[str, float]:
    """Dynamo's tracing alone (backend="eager"): where the check runs while compiling."""
    models = copies(mlp(layers, width))
    x = torch.randn(8, width)
    best: dict[str, float] = {}
    for _ in range(repeats):
        for name in ("unguarded", "guard", "guard_deep", "plain_hooks_deep"):
            torch.compiler.reset()
            fn = torch.compile(models[name], backend="eager", fullgraph=True)
            t0 = time.perf_counter()
            fn(x)
            best[name] = min(best.get(name, float("inf")), time.perf_counter() - t0)
    return best


def inductor_compile_seconds(layers: int, width: int, repeats: int) -> dict[str, float]:
    """One whole compile per copy and repeat (Dynamo, AOTAutograd, Inductor, the C++ compiler), best of repeats;
    a first compile of another size warms Inductor up, so that no copy pays for its imports."""
    torch.compiler.reset()
    torch.compile(mlp(1, 8))(torch.randn(2, 8))
    models = copies(mlp(layers, width))
    x = torch.randn(8, width)
    out: dict[str, float] = {}
    for _ in range(repeats):
        for name in ("unguarded", "guard", "guard_deep"):
            torch.compiler.reset()
            fn = torch.compile(models[name], fullgraph=True)
            t0 = time.perf_counter()
            fn(x)
            out[name] = min(out.get(name, float("inf")), time.perf_counter() - t0)
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer rounds (a smoke run)")
    parser.add_argument("--threads", type=int, default=1,
                        help="torch's CPU threads (default 1: on a shared machine, fewer threads fight for cores)")
    opts = parser.parse_args()
    torch.set_num_threads(opts.threads)
    rounds = 5 if opts.quick else 21
    calls = 50 if opts.quick else 200
    no_caches()

    steady = [steady_state(8, 256, 64, calls, rounds), steady_state(4, 32, 8, calls * 4, rounds)]
    trace = {layers: dynamo_trace_seconds(layers, 64, 2 if opts.quick else 5) for layers in (8, 64)}
    full = inductor_compile_seconds(8, 256, 1 if opts.quick else 3)

    print("compiled step (Inductor), best round; ratio to the unguarded copy; 'unguarded_again' = noise")
    for s in steady:
        print(f"  MLP {s['layers']} x {s['width']}, batch {s['batch']}")
        for kind in ("inference", "training", "eager_inference"):
            cells = "  ".join(f"{name} {t['best_us']:8.1f} µs ({t['ratio']:.3f})" for name, t in s[kind].items())
            print(f"    {kind:16s} {cells}")
    print("compile time, seconds (the check runs here, once)")
    for layers, t in trace.items():
        print(f"  Dynamo tracing, {layers:2d} layers: " + "  ".join(
            f"{name} {v:.3f} s (+{(v / t['unguarded'] - 1) * 100:.1f} %)" for name, v in t.items()))
    print("  Inductor, 8 x 256, caches off: " + "  ".join(
        f"{name} {v:.2f} s (+{(v / full['unguarded'] - 1) * 100:.1f} %)" for name, v in full.items()))

    worst = max(abs(s[kind][name]["ratio"] - 1) for s in steady for kind in ("inference", "training")
                for name in ("guard", "guard_deep"))
    # gpuguard's own share of deep=True's compiled step: beyond what the same hooks cost when they do nothing
    own = max(abs(s[kind]["guard_deep"]["best_us"] / s[kind]["plain_hooks_deep"]["best_us"] - 1)
              for s in steady for kind in ("inference", "training"))
    noise = max(abs(s[kind]["unguarded_again"]["ratio"] - 1) for s in steady for kind in ("inference", "training"))
    met = worst <= max(0.01, noise)
    print()
    print(f"target: compiled step guarded within the noise and within 1 %: worst {worst * 100:.2f} %, noise (the "
          f"same graph timed twice) {noise * 100:.2f} %: {'met' if worst <= 0.01 else 'MISSED'}")
    print(f"  deep=True against no-op hooks in the same places (gpuguard's own share): worst {own * 100:.2f} %")

    RESULTS.mkdir(parents=True, exist_ok=True)
    out = RESULTS / "tensor_devices_compiled.json"
    out.write_text(json.dumps({
        "steady_state": steady, "dynamo_trace_s": trace, "inductor_compile_s": full,
        "worst_step_overhead": worst, "noise": noise, "deep_against_plain_hooks": own, "target_met": worst <= 0.01, "within_noise": met,
        "machine": {"python": platform.python_version(), "torch": torch.__version__, "cpus": os.cpu_count(),
                    "platform": platform.platform()},
        "rounds": rounds, "calls": calls,
    }, indent=2))
    print(f"saved {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
