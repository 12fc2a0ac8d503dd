"""Cost of gpuguard.watch(): per collective, per 1 ms training step, and in store operations per rank per minute,
each beside the same loop without the watchdog (the obvious alternative: no watchdog at all).

One process, a real gloo process group of one rank over a real TCPStore (the watchdog's C++ thread connects to
it as it would to torchrun's). Blocks with and without the watchdog alternate, and the fastest block counts
(a loaded machine only ever adds time). The watchdog's cost is work on the calling thread, so its CPU time
(time.thread_time) is printed beside the wall time: it is what a preempted, shared machine distorts least. The 1 ms step is a busy-wait of 1 ms plus one small all-reduce, the
shape of a fast training step; target: the watchdog adds at most 1 % of it.

    python benchmarks/bench_watch.py [--collectives 20000] [--steps 2000] [--idle 10]
"""

from __future__ import annotations

import argparse
import datetime
import statistics
import time

import torch
import torch.distributed as dist

import gpuguard


def per_call(fn, n: int) -> tuple[float, float]:
    """(wall seconds, calling thread's CPU seconds) per call."""
    start, cpu = time.perf_counter(), time.thread_time()
    for _ in range(n):
        fn()
    return (time.perf_counter() - start) / n, (time.thread_time() - cpu) / n


def alternate(fn, n: int, blocks: int) -> tuple[tuple[float, float], tuple[float, float]]:
    """The fastest block's (wall, CPU) per call of `fn`, without and with the watchdog, alternating."""
    plain, watched = [], []
    for _ in range(blocks):
        plain.append(per_call(fn, n))
        w = gpuguard.watch(stall_after=600)
        try:
            fn()  # the watchdog starts with the first collective: keep that out of the clock
            watched.append(per_call(fn, n))
        finally:
            w.stop()
    def best(rows):
        return min(r[0] for r in rows), min(r[1] for r in rows)
    return best(plain), best(watched)


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

    def collective() -> None:
        dist.all_reduce(t)

    def step() -> None:
        end = time.perf_counter() + 1e-3
        while time.perf_counter() < end:
            pass
        dist.all_reduce(t)

    # The watchdog's own cost, apart from gloo's noise: the same wrapper around a collective that does nothing.
    from gpuguard.watchdog.collectives import _wrap

    def nothing(tensor, op=None, group=None, async_op=False):
        return None

    w = gpuguard.watch(stall_after=600)
    dist.all_reduce(t)
    tracked = _wrap("all_reduce", nothing, w._enter, w._leave)
    bare = min(per_call(lambda: nothing(t), 20000)[1] for _ in range(args.blocks))
    wrapped = min(per_call(lambda: tracked(t), 20000)[1] for _ in range(args.blocks))
    w.stop()

    for _ in range(2000):  # warm up gloo and the allocator
        collective()
    per_n = max(1, args.collectives // args.blocks)
    plain_c, watched_c = alternate(collective, per_n, args.blocks)
    plain_s, watched_s = alternate(step, max(1, args.steps // args.blocks), args.blocks)

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

    print(f"the watchdog alone (its wrapper around a collective that does nothing), calling thread CPU: "
          f"+{(wrapped - bare) * 1e6:.2f} us per collective = {100 * (wrapped - bare) / 1e-3:.2f} % of a 1 ms step "
          f"(target <= 1 %)")
    for label, plain, watched in (("wall", plain_c[0], watched_c[0]), ("calling thread CPU", plain_c[1], watched_c[1])):
        print(f"all_reduce (1 rank, gloo, float32[4]), {label}: {plain * 1e6:.2f} us without the watchdog, "
              f"{watched * 1e6:.2f} us with: +{(watched - plain) * 1e6:.2f} us per collective "
              f"(ratio {watched / plain:.3f}; {100 * (watched - plain) / 1e-3:.2f} % of a 1 ms step)")
    for label, plain, watched in (("wall", plain_s[0], watched_s[0]), ("calling thread CPU", plain_s[1], watched_s[1])):
        print(f"1 ms step (busy 1 ms + one all_reduce), {label}: {plain * 1e3:.4f} ms without, {watched * 1e3:.4f} ms "
              f"with: {100 * (watched - plain) / plain:+.3f} % (target <= 1 %; ratio {watched / plain:.4f})")
    print(f"store operations per rank per minute while healthy: {ops_per_minute:.1f} (one per tick), at "
          f"{collectives_per_minute:.0f} collectives per minute: {ops_per_minute / collectives_per_minute:.5f} "
          f"store operations per collective (a store write per collective would be 1.0; ratio "
          f"{collectives_per_minute / max(ops_per_minute, 1e-9):.0f}x fewer)")


if __name__ == "__main__":
    main()
