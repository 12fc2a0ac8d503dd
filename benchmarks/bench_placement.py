"""Cost of the cross-rank placement check: wall time and store operations per rank, 8 ... 1,024 simulated ranks,
beside torch.distributed.all_gather_object of the same records over gloo (the obvious alternative).

Each simulated rank is a thread with its own TCPStore client (connected before the clock starts) and a fake
identity: 8 GPUs per host, every rank on its own GPU (the common, passing case), plus a run where three hosts
put two ranks on each of half their GPUs (the failing case, where rank 0 reads the sample). A
counting Store wrapper counts every operation each rank makes. all_gather_object runs N real processes (gloo)
for the sizes this machine can start; each gathers every rank's record, as a naive check would.

    python benchmarks/bench_placement.py [--sizes 8,64,256,1024] [--gather-sizes 8,16]
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import statistics
import sys
import threading
import time
from pathlib import Path
from typing import Any

import torch.distributed as dist
import torch.multiprocessing as mp

from gpuguard.deadline import Deadline
from gpuguard.placement import exchange
from simulated_ranks import few_sharing_hosts, identity


class CountingStore:
    """Counts the Store operations one rank makes (those that reach the server; the store's timeout, a local
    setting, passes through uncounted)."""

    OPERATIONS = {"set", "get", "add", "check", "wait", "compare_set", "delete_key", "multi_get"}

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.ops = 0

    def __getattr__(self, name: str) -> Any:
        attribute = getattr(self.inner, name)
        if name not in self.OPERATIONS:
            return attribute

        def counted(*args: Any) -> Any:
            self.ops += 1
            return attribute(*args)
        return counted

    @property
    def timeout(self) -> datetime.timedelta:
        return self.inner.timeout  # type: ignore[no-any-return]


def run_check(world: int, sharing_hosts: frozenset[int]) -> dict[str, Any]:
    master = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False,
                           timeout=datetime.timedelta(seconds=120))
    identities = [identity(r, world, sharing_hosts) for r in range(world)]
    stores: list[Any] = [None] * world
    kinds: list[str] = [""] * world
    finished = [0.0] * world
    barrier = threading.Barrier(world + 1)

    def rank(i: int) -> None:
        stores[i] = CountingStore(dist.TCPStore("127.0.0.1", master.port, is_master=False,
                                                timeout=datetime.timedelta(seconds=120)))
        barrier.wait()
        kinds[i] = exchange(stores[i], identities[i], namespace="bench", deadline=Deadline(120)).kind
        finished[i] = time.perf_counter()

    threads = [threading.Thread(target=rank, args=(i,)) for i in range(world)]
    for t in threads:
        t.start()
    barrier.wait()  # every client is connected: the clock measures the check alone
    started = time.perf_counter()
    for t in threads:
        t.join()
    ops = sorted(s.ops for s in stores[1:]) or [0]  # rank 0 leads: it opens the epoch and composes
    return {"ranks": world, "verdict": sorted(set(kinds)), "wall_s": max(finished) - started,
            "ops_median": statistics.median(ops), "ops_max_waiting_rank": ops[-1],
            "ops_composer": stores[0].ops, "ops_total": sum(ops) + stores[0].ops}


def _gather_worker(rank: int, world: int, port: int, out: Any) -> None:
    store = dist.TCPStore("127.0.0.1", port, is_master=False, timeout=datetime.timedelta(seconds=120))
    dist.init_process_group("gloo", store=store, rank=rank, world_size=world)
    record = identity(rank, world, frozenset()).encode()
    gathered: list[Any] = [None] * world
    dist.barrier()
    started = time.perf_counter()
    dist.all_gather_object(gathered, record)
    elapsed = time.perf_counter() - started
    got = sum(len(g) for g in gathered)
    times = [None] * world
    dist.all_gather_object(times, elapsed)
    if rank == 0:
        out.put({"ranks": world, "wall_s": max(times), "bytes_received_per_rank": got})
    dist.destroy_process_group()


def run_gather(world: int) -> dict[str, Any]:
    master = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False,
                           timeout=datetime.timedelta(seconds=120))
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    procs = [ctx.Process(target=_gather_worker, args=(r, world, master.port, queue)) for r in range(world)]
    for p in procs:
        p.start()
    result = queue.get(timeout=600)
    for p in procs:
        p.join(120)
    return result  # type: ignore[no-any-return]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="8,32,128,512,1024")
    parser.add_argument("--gather-sizes", default="8,16,32")
    parser.add_argument("--repeats", type=int, default=3, help="runs per size; the median wall time is kept")
    args = parser.parse_args()
    sizes = [int(x) for x in args.sizes.split(",") if x]
    gather_sizes = [int(x) for x in args.gather_sizes.split(",") if x]

    rows = []
    for n in sizes:
        ok_runs = [run_check(n, frozenset()) for _ in range(args.repeats)]
        sharing = few_sharing_hosts(n)
        dup_runs = [run_check(n, sharing) for _ in range(args.repeats)]
        ok = sorted(ok_runs, key=lambda r: r["wall_s"])[len(ok_runs) // 2]
        dup = sorted(dup_runs, key=lambda r: r["wall_s"])[len(dup_runs) // 2]
        rows.append({"ranks": n, "pass": ok, "duplicate": dup})
    gathers = {n: run_gather(n) for n in gather_sizes}

    print(f"{'ranks':>6}  {'check (pass)':>12}  {'check (dup)':>11}  {'ops/rank':>8}  {'max ops':>7}  "
          f"{'composer':>8}  {'all_gather_object':>17}  {'ratio':>6}")
    for row in rows:
        n, ok, dup = row["ranks"], row["pass"], row["duplicate"]
        g = gathers.get(n)
        gather_text = f"{g['wall_s'] * 1e3:14.1f} ms" if g else f"{'(not run)':>17}"
        ratio = f"{g['wall_s'] / ok['wall_s']:5.2f}x" if g else f"{'':>6}"
        print(f"{n:>6}  {ok['wall_s'] * 1e3:9.1f} ms  {dup['wall_s'] * 1e3:8.1f} ms  {ok['ops_median']:>8g}  "
              f"{max(ok['ops_max_waiting_rank'], dup['ops_max_waiting_rank']):>7}  {dup['ops_composer']:>8}  "
              f"{gather_text}  {ratio}")
    print("ops/rank: median store operations per rank (passing run); max ops: most by any rank but rank 0, which "
          "opens the check and writes the verdict (either run); composer: rank 0, in the failing run (bounded by "
          "the report).")
    print("ratio: all_gather_object wall time / gpuguard's check wall time at the same size (>1: the check is "
          "faster). all_gather_object ranks are processes; the check's ranks are threads of one process.")

    results = Path(__file__).resolve().parent / "results"
    results.mkdir(exist_ok=True)
    out = results / "bench_placement.json"
    out.write_text(json.dumps({"check": rows, "all_gather_object": list(gathers.values()),
                               "cpus": os.cpu_count(), "python": sys.version.split()[0]}, indent=2))
    print(f"saved {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
