"""Benchmark: gpuguard's device check against the idiomatic Python check, in the same run.

  python benchmarks/bench_tensor_devices.py [--quick]

1. assert_same_device(model, x) against
   {t.device for t in itertools.chain(model.parameters(), model.buffers(), inputs)}
   for models of 10, 1,000 and 10,000 parameter tensors (nn.Sequential of Linear layers: weight + bias).
2. guard(model)'s per-forward overhead against a hand-written Python forward pre-hook doing the same check,
   on the 1,000-parameter model. The model's forward is made trivial (it returns its input) so that the
   hook's cost is not lost in the noise of 500 Linear layers; the hooks still check all 1,000 parameters.
   A no-op pre-hook is timed too: PyTorch's own price for calling any pre-hook.
3. The same two checks in gpuguard's Python implementation (gpuguard.tensors._python_checks, what runs where the compiled
   gpuguard._libtorch cannot load, e.g. after a torch upgrade), beside the compiled ones, with the ratio.

Targets: 1,000 parameters: assert_same_device >= 50x faster than the idiom; guard() <= the no-op hook + 3 us.
Prints a table and writes benchmarks/results/tensor_devices.json. Timings are the best of several rounds
(the least disturbed by other processes), each the mean over many calls. The per-forward figures of part 2 take
the best of many short rounds, the variants interleaved: on a shared machine a disturbance lasts seconds, and a
few long rounds can all fall inside one. The median of guard()'s cost over the no-op, round by round, is printed
beside the best.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path

import torch
from torch import nn

import gpuguard  # the installed package; PYTHONPATH=python measures this checkout's in-place build
from gpuguard.tensors import implementation as chosen
from gpuguard.tensors import _python_checks

RESULTS = Path(__file__).resolve().parent / "results"


def make_model(n_params: int) -> nn.Module:
    return nn.Sequential(*[nn.Linear(4, 4) for _ in range(n_params // 2)])


class Trivial(nn.Module):
    """Holds the model as a submodule (so its parameters are the ones checked) and returns its input."""

    def __init__(self, body: nn.Module) -> None:
        super().__init__()
        self.body = body

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x


def per_call_us(fn, calls: int, rounds: int) -> float:
    fn()
    best = float("inf")
    for _ in range(rounds):
        t0 = time.perf_counter_ns()
        for _ in range(calls):
            fn()
        best = min(best, (time.perf_counter_ns() - t0) / calls)
    return best / 1000.0


def idiom(model: nn.Module, *inputs: torch.Tensor) -> torch.device:
    devices = {t.device for t in itertools.chain(model.parameters(), model.buffers(), inputs)}
    if len(devices) != 1:
        raise RuntimeError(f"tensors on {devices}")
    return devices.pop()


def python_pre_hook(module: nn.Module, args: tuple, kwargs: dict) -> None:
    inputs = [a for a in itertools.chain(args, kwargs.values()) if isinstance(a, torch.Tensor)]
    devices = {t.device for t in itertools.chain(module.parameters(), module.buffers(), inputs)}
    if len(devices) > 1:
        raise RuntimeError(f"tensors on {devices}")


def noop_pre_hook(module: nn.Module, args: tuple, kwargs: dict) -> None:
    return None


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer rounds (a smoke run)")
    opts = parser.parse_args()
    rounds = 3 if opts.quick else 9
    x = torch.zeros(2, 4)

    check_rows = []
    for n in (10, 1_000, 10_000):
        model = make_model(n)
        assert gpuguard.assert_same_device(model, x) == idiom(model, x)
        calls = max(20, 200_000 // (n + 50))
        t_idiom = per_call_us(lambda: idiom(model, x), max(5, calls // 20), rounds)
        t_gg = per_call_us(lambda: gpuguard.assert_same_device(model, x), calls, rounds)
        check_rows.append({"parameters": n, "idiom_us": t_idiom, "assert_same_device_us": t_gg,
                           "speedup": t_idiom / t_gg})

    model = Trivial(make_model(1_000))
    calls = 2_000
    short_rounds = 10 * rounds
    # the two Python hooks, hundreds of times slower (so not sensitive to a disturbance): fewer calls, and only
    # every 10th round, which makes `rounds` rounds
    python_hooks = (python_pre_hook, "python_guard")
    variants = {}

    compiled = chosen.tensor_checks()
    assert compiled is not _python_checks, "gpuguard._libtorch does not load here: nothing compiled to measure"

    def timed(hook):
        handle = None
        if hook in ("guard", "python_guard"):
            chosen._checks = _python_checks if hook == "python_guard" else compiled
            handle = gpuguard.guard(model)
            chosen._checks = compiled
        elif hook is not None:
            handle = model.register_forward_pre_hook(hook, with_kwargs=True)
        calls_here = 400 if hook in python_hooks else calls
        t = per_call_us(lambda: model(x), calls_here, 1)
        handle.remove() if handle is not None else None
        return t

    # interleave the variants round by round, so that a disturbance hits them all alike
    names = {"none": None, "noop_hook": noop_pre_hook, "python_hook": python_pre_hook, "guard": "guard",
             "python_guard": "python_guard"}
    for name in names:
        variants[name] = float("inf")
    guard_over_noop_by_round = []
    for i in range(short_rounds):
        this_round = {}
        for name, hook in names.items():
            if hook in python_hooks and i % 10:
                continue
            this_round[name] = timed(hook)
            variants[name] = min(variants[name], this_round[name])
        guard_over_noop_by_round.append(this_round["guard"] - this_round["noop_hook"])
    guard_rows = {
        "forward_unhooked_us": variants["none"],
        "noop_hook_overhead_us": variants["noop_hook"] - variants["none"],
        "python_hook_overhead_us": variants["python_hook"] - variants["none"],
        "guard_overhead_us": variants["guard"] - variants["none"],
    }
    guard_rows["guard_speedup_vs_python_hook"] = guard_rows["python_hook_overhead_us"] / guard_rows["guard_overhead_us"]
    guard_rows["guard_over_noop_us"] = guard_rows["guard_overhead_us"] - guard_rows["noop_hook_overhead_us"]
    guard_rows["guard_over_noop_median_us"] = statistics.median(guard_over_noop_by_round)

    # the Python implementation, used where gpuguard._libtorch cannot load
    model_1000 = make_model(1_000)
    chosen._checks = _python_checks
    try:
        assert gpuguard.assert_same_device(model_1000, x) == idiom(model_1000, x)
        t_python_check = per_call_us(lambda: gpuguard.assert_same_device(model_1000, x), 200, rounds)
    finally:
        chosen._checks = compiled
    python_rows = {
        "assert_same_device_1000_us": t_python_check,
        "assert_same_device_1000_ratio": t_python_check / check_rows[1]["assert_same_device_us"],
        "guard_overhead_us": variants["python_guard"] - variants["none"],
    }
    python_rows["guard_overhead_ratio"] = python_rows["guard_overhead_us"] / guard_rows["guard_overhead_us"]

    print("assert_same_device vs {t.device for t in chain(parameters(), buffers(), inputs)}")
    print(f"{'parameters':>10} | {'idiom µs':>10} | {'gpuguard µs':>11} | {'speedup':>8}")
    for r in check_rows:
        print(f"{r['parameters']:>10,} | {r['idiom_us']:>10.1f} | {r['assert_same_device_us']:>11.2f} | "
              f"{r['speedup']:>7.0f}x")
    print()
    print("per-forward overhead on the 1,000-parameter model (forward itself: "
          f"{guard_rows['forward_unhooked_us']:.2f} µs)")
    print(f"  no-op pre-hook (PyTorch's hook dispatch alone): {guard_rows['noop_hook_overhead_us']:8.2f} µs")
    print(f"  hand-written Python pre-hook, same check:       {guard_rows['python_hook_overhead_us']:8.2f} µs")
    print(f"  gpuguard.guard(model):                          {guard_rows['guard_overhead_us']:8.2f} µs"
          f"   ({guard_rows['guard_speedup_vs_python_hook']:.0f}x less)")
    print(f"  guard() over the no-op: best {guard_rows['guard_over_noop_us']:.2f} µs, median of {short_rounds} rounds "
          f"{guard_rows['guard_over_noop_median_us']:.2f} µs")
    print()
    print("the Python implementation (where gpuguard._libtorch cannot load), 1,000 parameters:")
    print(f"  assert_same_device: {python_rows['assert_same_device_1000_us']:10.1f} µs   "
          f"(compiled: {check_rows[1]['assert_same_device_us']:.2f} µs, "
          f"{python_rows['assert_same_device_1000_ratio']:.0f}x slower)")
    print(f"  guard(model) per forward: {python_rows['guard_overhead_us']:4.1f} µs   "
          f"(compiled: {guard_rows['guard_overhead_us']:.2f} µs, {python_rows['guard_overhead_ratio']:.0f}x slower)")
    target_check = check_rows[1]["speedup"] >= 50
    target_guard = guard_rows["guard_over_noop_us"] <= 3
    print()
    print(f"targets: 1,000 params >= 50x: {'met' if target_check else 'MISSED'} ({check_rows[1]['speedup']:.0f}x); "
          f"guard() <= no-op + 3 µs: {'met' if target_guard else 'MISSED'} "
          f"({guard_rows['guard_overhead_us']:.2f} µs = no-op {guard_rows['noop_hook_overhead_us']:.2f} + "
          f"{guard_rows['guard_over_noop_us']:.2f} µs)")

    RESULTS.mkdir(parents=True, exist_ok=True)
    out = RESULTS / "tensor_devices.json"
    out.write_text(json.dumps({
        "assert_same_device": check_rows, "guard": guard_rows, "python_implementation": python_rows,
        "targets": {"speedup_1000_ge_50x": target_check, "guard_le_noop_plus_3us": target_guard},
        "machine": {"python": platform.python_version(), "torch": torch.__version__,
                    "cpus": os.cpu_count(), "platform": platform.platform()},
        "rounds": rounds, "short_rounds": short_rounds,
    }, indent=2))
    print(f"saved {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
