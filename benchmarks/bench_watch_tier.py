"""The watchdog's per-node tier against every rank asking the store: the job store's steady load, measured with
gpuguard's real C++ watchdogs.

One process holds ``--ranks`` watchdogs (``gpuguard._core.Watchdog``, each its own thread and its own connection),
``--per-node`` to a node, healthy (no collective ever waits), against a real TCPStore server in a child process.
Three phases of ``--seconds`` each, in one run:

  every rank   no tier: each watchdog asks the store once a tick
  tier         each node's leader asks and writes its node's relay page; the others read it
  tier, leaders gone   the leaders of a quarter of the nodes stop (as when they die): their nodes' followers find
               the answer too old and ask the store themselves

Printed per phase: the store operations the watchdogs made per second (from their own counters) and per rank per
minute, the ticks followers took from their leader's page, the server's CPU share, and the ratio against "every
rank". The tier's cost on a follower is one read of a shared page per tick instead of a store round trip.

    python benchmarks/bench_watch_tier.py [--ranks 512] [--per-node 8] [--seconds 10] [--tick 1]
"""

from __future__ import annotations

import argparse
import os
import socket
import sys
import tempfile
import time
from typing import Any, Optional

from gpuguard._core import Watchdog
from tcp_store_server import Server


def start(port: int, prefix: str, ranks: int, per_node: int, tick: float,
          pages: Optional[str]) -> list[Watchdog]:
    """``ranks`` healthy watchdogs; with ``pages`` (a folder), in the tier: leaders first, as local rank 0 is."""
    order = sorted(range(ranks), key=lambda r: (r % per_node != 0, r))
    dogs: dict[int, Watchdog] = {}
    for rank in order:
        relay = os.path.join(pages, f"node{rank // per_node}") if pages else ""
        dogs[rank] = Watchdog(
            store_host="127.0.0.1", store_port=port, prefix=prefix, rank=rank, world_size=ranks,
            host=socket.gethostname(), pid=os.getpid(), gpu="", stall_after_s=3600.0, min_stall_s=60.0, tick_s=tick,
            gather_s=5.0, report_path="", exit_on_stall=False, exit_code=75, node_relay_path=relay,
            node_leader=bool(pages) and rank % per_node == 0)
    return [dogs[r] for r in range(ranks)]


def phase(server: Server, dogs: list[Watchdog], seconds: float) -> dict[str, Any]:
    ops = sum(d.store_ops for d in dogs)
    relayed = sum(d.relayed_ticks for d in dogs)
    cpu, started = server.cpu_s(), time.perf_counter()
    time.sleep(seconds)
    wall = time.perf_counter() - started
    return {"ops_per_s": (sum(d.store_ops for d in dogs) - ops) / wall,
            "relayed_per_s": (sum(d.relayed_ticks for d in dogs) - relayed) / wall,
            "server_cpu_per_s": (server.cpu_s() - cpu) / wall}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", type=int, default=512)
    parser.add_argument("--per-node", type=int, default=8)
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--tick", type=float, default=1.0)
    args = parser.parse_args()
    if args.ranks % args.per_node or args.ranks < 4 * args.per_node:
        print("bench_watch_tier: --ranks must be a multiple of --per-node, with at least 4 nodes", file=sys.stderr)
        return 2
    nodes = args.ranks // args.per_node
    server = Server()
    rows = []
    try:
        dogs = start(server.port, "gpuguard/watch/bench/every/", args.ranks, args.per_node, args.tick, None)
        time.sleep(args.tick)  # every watchdog's first tick is behind it
        rows.append(("every rank asks", phase(server, dogs, args.seconds)))
        for d in dogs:
            d.stop()
        with tempfile.TemporaryDirectory(dir="/dev/shm" if os.path.isdir("/dev/shm") else None) as pages:
            dogs = start(server.port, "gpuguard/watch/bench/tier/", args.ranks, args.per_node, args.tick, pages)
            time.sleep(args.tick)
            rows.append(("tier", phase(server, dogs, args.seconds)))
            gone = range(0, args.ranks // 4, args.per_node)  # the leaders of the first quarter of the nodes
            for r in gone:
                dogs[r].stop()
            time.sleep(4 * args.tick)  # their pages' answers grow older than three ticks
            live = [d for r, d in enumerate(dogs) if r not in gone]
            rows.append((f"tier, {len(gone)} leaders gone", phase(server, live, args.seconds)))
            for d in live:
                d.stop()
    finally:
        server.stop()
    base = rows[0][1]["ops_per_s"]
    print(f"{args.ranks} healthy watchdogs, {args.per_node} per node ({nodes} nodes), tick {args.tick:g} s, "
          f"{args.seconds:g} s per phase; one TCPStore server")
    print(f"{'':<26} {'store ops/s':>11} {'/rank/min':>9} {'relayed/s':>9} {'server CPU':>10} {'vs every rank':>13}")
    for name, r in rows:
        print(f"{name:<26} {r['ops_per_s']:>11.1f} {r['ops_per_s'] / args.ranks * 60:>9.1f} "
              f"{r['relayed_per_s']:>9.1f} {r['server_cpu_per_s']:>9.1%} {r['ops_per_s'] / base:>12.3f}x")
    print(f"expected: every rank {args.ranks / args.tick:.0f}/s; tier {nodes / args.tick:.0f}/s "
          f"({1 / args.per_node:.3f}x); with a quarter of the leaders gone, their followers ask again: "
          f"{(nodes - nodes // 4 + (args.ranks // 4 - nodes // 4)) / args.tick:.0f}/s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
