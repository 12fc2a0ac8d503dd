"""Cost of gpuguard.watch(): per collective, per 1 ms training step and per DDP step, and in store operations per
rank per minute, each beside the same loop without the watchdog (the obvious alternative: no watchdog at all),
for both of its progress sources: torch's flight recorder (the default where torch has one) and the wrappers.

One process, a real gloo process group of one rank over a real TCPStore (the watchdog's C++ thread connects to
it as it would to torchrun's). Blocks with and without the watchdog alternate, and the fastest block counts (a
loaded machine only ever adds time). The watchdog's cost on the training thread is what matters, so that
thread's CPU time (time.thread_time) is printed beside the wall time: it is what a preempted, shared machine
distorts least. The 1 ms step is a busy-wait of 1 ms plus one small all-reduce, the shape of a fast training
step; the DDP step is forward, backward (DDP's reducer all-reduces the gradients) and a 1 ms busy-wait. Target:
the watchdog adds at most 1 % of either. The watchdog's own thread reads the flight recorder's status once per
tick; the cost of a read, and what a reader that never pauses does to the training thread, are printed too.

    python benchmarks/bench_watch.py [--collectives 20000] [--steps 2000] [--idle 10]
"""

from __future__ import annotations

import argparse
import datetime
import os
import threading
import time
from typing import Callable

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

import gpuguard
from gpuguard._core import read_flight_recorder


def per_call(fn: Callable[[], None], n: int) -> tuple[float, float]:
    """(wall seconds, calling thread's CPU seconds) per call."""
    start, cpu = time.perf_counter(), time.thread_time()
    for _ in range(n):
        fn()
    return (time.perf_counter() - start) / n, (time.thread_time() - cpu) / n


def best(rows: list[tuple[float, float]]) -> tuple[float, float]:
    return min(r[0] for r in rows), min(r[1] for r in rows)


def alternate(fn: Callable[[], None], n: int, blocks: int, source: str) -> tuple[tuple[float, float], ...]:
    """The fastest block's (wall, CPU) per call of `fn`, without and with the watchdog, alternating."""
    plain, watched = [], []
    os.environ["GPUGUARD_WATCH_SOURCE"] = source
    for _ in range(blocks):
        plain.append(per_call(fn, n))
        w = gpuguard.watch(stall_after=600)
        try:
            fn()  # (the fallback starts at the first collective: keep that out of the clock)
            watched.append(per_call(fn, n))
        finally:
            w.stop()
    return best(plain), best(watched)


def busy(seconds: float) -> None:
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


def report(what: str, unit: float, unit_name: str, plain: tuple[float, float], watched: tuple[float, float],
           base: float) -> None:
    for label, p, w in (("wall", plain[0], watched[0]), ("training thread CPU", plain[1], watched[1])):
        print(f"  {what}, {label}: {p / unit:.3f} {unit_name} without the watchdog, {w / unit:.3f} {unit_name} with: "
              f"{(w - p) * 1e6:+.2f} us = {100 * (w - p) / base:+.3f} % of a {base * 1e3:g} ms step "
              f"(target <= 1 %; ratio {w / p:.4f})")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--collectives", type=int, default=20000)
    parser.add_argument("--steps", type=int, default=2000)
    parser.add_argument("--blocks", type=int, default=9)
    parser.add_argument("--idle", type=float, default=10.0, help="seconds of watching to count store operations")
    args = parser.parse_args()

    server = dist.TCPStore("127.0.0.1", 0, 1, True, wait_for_workers=False)
    dist.init_process_group("gloo", store=server, rank=0, world_size=1, timeout=datetime.timedelta(seconds=60))
    t = torch.ones(4)
    model = DistributedDataParallel(torch.nn.Linear(256, 256))
    x = torch.ones(8, 256)

    def collective() -> None:
        dist.all_reduce(t)

    def step() -> None:
        busy(1e-3)
        dist.all_reduce(t)

    def ddp_step() -> None:
        model(x).sum().backward()
        busy(1e-3)

    for _ in range(2000):  # warm up gloo, the allocator and the flight recorder's ring (2000 entries)
        collective()
    n_coll = max(1, args.collectives // args.blocks)
    n_step = max(1, args.steps // args.blocks)
    for source, title in (("recorder", "torch's flight recorder (the default where torch has one)"),
                          ("wrappers", "gpuguard's wrappers (the fallback; they do not see DDP's collectives)")):
        print(f"progress from {title}:")
        os.environ["GPUGUARD_WATCH_SOURCE"] = source
        w = gpuguard.watch(stall_after=600)
        collective()
        used = "recorder" if w.source is not None and w.source.reader is not None else "wrappers"
        w.stop()
        if used != source:
            print(f"  (the {source} source is not available here: {w.source.fallback_reason if w.source else ''})")
            continue
        report("all_reduce (1 rank, gloo, float32[4])", 1e-6, "us", *alternate(collective, n_coll, args.blocks, source),
               base=1e-3)
        report("1 ms step (busy 1 ms + one all_reduce)", 1e-3, "ms", *alternate(step, n_step, args.blocks, source),
               base=1e-3)
        plain, watched = alternate(ddp_step, n_step, args.blocks, source)
        report("DDP step (Linear 256x256, forward + backward + busy 1 ms)", 1e-3, "ms", plain, watched, base=plain[0])
    os.environ.pop("GPUGUARD_WATCH_SOURCE", None)

    # The watchdog thread's read of the recorder, and a reader that never pauses beside the training thread.
    from gpuguard._libtorch_loader import libtorch
    reader = libtorch().flight_recorder_reader()
    reads = [per_call(lambda: read_flight_recorder(reader, "gloo"), 2000) for _ in range(5)]
    full = [per_call(lambda: read_flight_recorder(reader, "gloo", True), 5) for _ in range(3)]
    print(f"one read of the recorder's status (what the watchdog's thread does once per tick, no GIL): "
          f"{best(reads)[0] * 1e6:.1f} us; the whole recorder with its 2000 entries (only at a stall): "
          f"{best(full)[0] * 1e3:.1f} ms")
    stop = threading.Event()

    def hammer() -> None:
        while not stop.is_set():
            read_flight_recorder(reader, "gloo")
    plain = best([per_call(collective, n_coll) for _ in range(3)])
    thread = threading.Thread(target=hammer)
    thread.start()
    hammered = best([per_call(collective, n_coll) for _ in range(3)])
    stop.set()
    thread.join()
    print(f"all_reduce beside a thread reading the recorder's status without pause (1000x the watchdog's rate): "
          f"{plain[0] * 1e6:.2f} us alone, {hammered[0] * 1e6:.2f} us beside it (ratio {hammered[0] / plain[0]:.3f}; "
          f"on 2 shared cores this includes the reader's own CPU)")

    w = gpuguard.watch(stall_after=600)
    collective()
    before, start = w.store_ops, time.monotonic()
    steps = 0
    while time.monotonic() - start < args.idle:  # training at full speed while the store operations are counted
        step()
        steps += 1
    elapsed = time.monotonic() - start
    ops_per_minute = (w.store_ops - before) / elapsed * 60
    collectives_per_minute = steps / elapsed * 60
    w.stop()
    dist.destroy_process_group()
    print(f"store operations per rank per minute while healthy: {ops_per_minute:.1f} (one per tick), at "
          f"{collectives_per_minute:.0f} collectives per minute: {ops_per_minute / collectives_per_minute:.5f} "
          f"store operations per collective (a store write per collective would be 1.0; ratio "
          f"{collectives_per_minute / max(ops_per_minute, 1e-9):.0f}x fewer)")


if __name__ == "__main__":
    main()
