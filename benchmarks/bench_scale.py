"""Scale simulation: gpuguard's placement check and the watchdog's steady traffic at 1k ... 16k ranks, against one
real TCPStore, with the cost of the simulation itself measured apart.

Each simulated rank is a gevent greenlet running gpuguard's own ``exchange()`` (the check bind() runs), unmodified,
over a connection of its own to a real ``torch.distributed.TCPStore`` server in a child process. The connections
speak the TCPStore wire protocol (tcp_store_wire.py, pure Python, so that gevent makes them cooperative): one
thread carries every rank, where bench_placement.py's thousands of threads on 2 cores measured mostly their own
scheduling. Connections are made before the clock starts. Scenarios per size:

  harness     the simulation alone: the passing check's store requests, none of gpuguard's code
  pass        every rank on a GPU of its own
  fail-few    three hosts put two ranks on each of half their GPUs (12 shared GPUs, whatever the size)
  fail-many   every host does (a quarter of the GPUs shared)
  timeout     the last rank never arrives; every other rank must name it (deadline --deadline s)
  node-gone   the last node's 8 ranks never arrive (deadline --deadline s)
  leader-dies rank 0 dies after counting itself in, before it composes the verdict (deadline --deadline s)
  slow-store  the store stops answering for half the deadline as the ranks start, then goes on (SIGSTOP, SIGCONT)
  store-stalls the store stops answering for longer than the deadline and its grace: each rank's bind() raises
              the store's error (shown as verdict "store-error") by the deadline + its grace
  watchdog    every rank makes the healthy watchdog's one store operation per tick (a CHECK of the alarm key,
              tick 1 s) for --watch-s seconds
  watch-tier  the same with the per-node tier: one rank in 8 (each node's leader) asks

The timeout scenarios pass at 1,024 ranks. From 4,096 up, this one thread cannot run thousands of ranks' timeouts
at one instant within the 2 s a store call gets past its own bound (a rank waits its turn longer), and the run
stops there; --abandon-after 10 widens that wait for the simulation only (a real rank has its own core).

Measured per run: wall time from the start to the last rank's verdict; store operations per rank (median and
most, and rank 0's, which composes); requests per second the server answered; CPU time of the server process
and of the simulation process, each per rank (the server's flat across sizes: linear); memory: the server's
resident growth per rank (its keys), and the simulation's per rank (connection, greenlet and check). The
simulation's CPU time is its own overhead plus the check's Python code, which on a real job runs on each rank's
own core, plus Python's garbage collector, measured apart: its full collections walk every simulated rank's
objects in this one process, most of what grows with size (a real rank's heap holds its own check only). The
server's CPU time is what one TCPStore spends, and how much of the server's one thread a size needs is the load
column.
Separately, the server's capacity: 256 connections issuing CHECKs back to back; the server's CPU time per
request gives the most requests per second one TCPStore thread sustains.

    pip install gevent   # the simulation's only extra
    python benchmarks/bench_scale.py [--sizes 1024,4096,16384] [--deadline 20] [--watch-s 10] [--abandon-after S]
"""

from __future__ import annotations

from gevent import monkey

monkey.patch_all()  # before anything imports socket or threading: the ranks are greenlets

import argparse  # noqa: E402
import contextlib  # noqa: E402
import gc  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402
import resource  # noqa: E402
import signal  # noqa: E402
import statistics  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any, Iterator, Optional  # noqa: E402

import gevent  # noqa: E402
import gevent.event  # noqa: E402
import gevent.pool  # noqa: E402

from gpuguard.deadline import GRACE_S, Deadline  # noqa: E402
from gpuguard.errors import GpuGuardError  # noqa: E402
from gpuguard.placement import exchange  # noqa: E402
from gpuguard.placement import stores as checked_stores  # noqa: E402
from gpuguard.placement.verdict import Verdict  # noqa: E402
from simulated_ranks import few_sharing_hosts, identity  # noqa: E402
from tcp_store_server import Server, status_kib  # noqa: E402
from tcp_store_wire import WireStore  # noqa: E402

@contextlib.contextmanager
def _serving(n: int) -> Iterator[tuple[Server, list[WireStore]]]:
    """A fresh server and ``n`` connections to it (made before any clock starts); closed and stopped after."""
    server = Server()
    stores: list[WireStore] = []
    try:
        stores = _connect(server.port, n)
        yield server, stores
    finally:
        for s in stores:
            s.close()
        server.stop()


def _connect(port: int, n: int) -> list[WireStore]:
    pool = gevent.pool.Pool(64)  # the server's accept backlog is finite: a bounded number of handshakes at once
    stores: list[Optional[WireStore]] = [None] * n

    def one(i: int) -> None:
        stores[i] = WireStore("127.0.0.1", port, timeout=600)
    for i in range(n):
        pool.spawn(one, i)
    pool.join(raise_error=True)
    return stores  # type: ignore[return-value]


class GcClock:
    """CPU time this process spends in Python's cyclic garbage collector. One process holds every simulated
    rank's objects, so each full collection walks a heap that grows with the ranks (a real rank's heap holds its
    own check only): the share of the simulation's CPU per rank that grows with size is this, measured apart."""

    def __init__(self) -> None:
        self.cpu_s = 0.0
        self.full_collections = 0
        self._began = 0.0

    def __enter__(self) -> "GcClock":
        gc.callbacks.append(self._phase)
        return self

    def __exit__(self, *exc: object) -> None:
        gc.callbacks.remove(self._phase)

    def _phase(self, phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            self._began = time.process_time()
            return
        self.cpu_s += time.process_time() - self._began
        self.full_collections += info["generation"] == 2


def _measure(server: Server, stores: list[WireStore], body: Any) -> dict[str, Any]:
    """Runs ``body()`` and what it cost: wall, the server's and this process's CPU (and its garbage collector's
    share), the requests."""
    requests = sum(s.requests for s in stores)
    server_cpu, own_cpu, started = server.cpu_s(), time.process_time(), time.perf_counter()
    with GcClock() as collector:
        extra = body(started)
    wall = time.perf_counter() - started
    # the server's CPU is read a moment later: /proc's counters advance in ticks
    gevent.sleep(0.05)
    result = {"wall_s": extra.pop("wall_s", wall), "server_cpu_s": server.cpu_s() - server_cpu,
              "sim_cpu_s": time.process_time() - own_cpu, "sim_gc_cpu_s": collector.cpu_s,
              "sim_full_collections": collector.full_collections,
              "requests": sum(s.requests for s in stores) - requests}
    result.update(extra)
    return result


class DyingLeader:
    """Rank 0's connection in the leader-dies scenario: when rank 0 has counted itself in and waits to compose the
    verdict (its wait for ``wake``), its process dies as under SIGKILL: the connection closes, the rank ends."""

    def __init__(self, inner: WireStore) -> None:
        self.inner = inner
        self.rank: Optional[gevent.Greenlet] = None

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def wait(self, keys: list[str], timeout: Any = None) -> None:
        if any(k.endswith("/wake") for k in keys):
            self.inner.close()
            assert self.rank is not None
            self.rank.kill(block=False)
            raise gevent.GreenletExit
        self.inner.wait(keys, timeout)


#: The scenarios whose verdict comes at the deadline, or that the store holds up: they run under --deadline.
TIMEOUT_SCENARIOS = ("timeout", "node-gone", "leader-dies", "slow-store", "store-stalls")


def stalled_store(server: Server, seconds: float) -> None:
    """The store's process stops answering for ``seconds`` (SIGSTOP, as a host stalled by swapping, a stopped VM or
    a debugger would), then goes on."""
    os.kill(server.pid, signal.SIGSTOP)
    try:
        gevent.sleep(seconds)
    finally:
        os.kill(server.pid, signal.SIGCONT)


def run_check(world: int, scenario: str, deadline_s: float) -> dict[str, Any]:
    sharing = {"fail-few": few_sharing_hosts(world), "fail-many": frozenset(range(world // 8))}.get(
        scenario, frozenset())
    absent = {"timeout": {world - 1}, "node-gone": set(range(world - 8, world))}.get(scenario, set())
    # the deadline the timeout scenarios wait for; the others get one that the simulation's single thread, which
    # runs every rank's Python in turn (about 1 ms each at 16k ranks), cannot reach
    limit = deadline_s if scenario in TIMEOUT_SCENARIOS else max(deadline_s, 300.0)
    sim_rss = status_kib("self", "VmRSS")
    with _serving(world) as (server, stores):
        server_rss = server.rss_kib()
        identities = [identity(r, world, sharing) for r in range(world)]
        clients: list[Any] = list(stores)
        if scenario == "leader-dies":
            clients[0] = DyingLeader(stores[0])
        go = gevent.event.Event()
        finished = [0.0] * world
        verdicts: list[Any] = [None] * world

        def rank(i: int) -> None:
            go.wait()
            try:
                verdicts[i] = exchange(clients[i], identities[i], namespace="sim", deadline=Deadline(limit))
            except GpuGuardError as exc:  # the store failed: what the rank's bind() raises
                verdicts[i] = Verdict("store-error", str(exc))
            finished[i] = time.perf_counter()

        def body(started: float) -> dict[str, Any]:
            ranks = {i: gevent.spawn(rank, i) for i in range(world) if i not in absent}
            if isinstance(clients[0], DyingLeader):
                clients[0].rank = ranks[0]
            stall = None
            if scenario in ("slow-store", "store-stalls"):  # half the deadline, or past it and its grace
                pause = limit / 2 if scenario == "slow-store" else limit + GRACE_S + 1.0
                stall = gevent.spawn(stalled_store, server, pause)
            go.set()
            gevent.joinall(list(ranks.values()), raise_error=True)
            if stall is not None:
                stall.join()
            return {"wall_s": max(finished) - started}

        ops_before = [s.ops for s in stores]
        result = _measure(server, stores, body)
        ops = [s.ops - before for s, before in zip(stores, ops_before)]
        answered = [r for r in range(world) if verdicts[r] is not None]
        kinds = sorted({verdicts[r].kind for r in answered})
        named = sorted({tuple(verdicts[r].details.get("missing_ranks", ())) for r in answered})
        waiting = sorted(ops[r] for r in answered if r != 0)
        result.update({
            "ranks": world, "scenario": scenario, "deadline_s": limit, "verdicts": kinds,
            "missing_named": [list(m) for m in named], "answered": len(answered),
            "message": verdicts[answered[-1]].message if answered else "",
            "ops_median": statistics.median(waiting), "ops_max": waiting[-1], "ops_rank0": ops[0],
            "server_rss_kib_per_rank": (server.rss_kib() - server_rss) / world,
            "sim_peak_kib_per_rank": (status_kib("self", "VmHWM") - sim_rss) / world,
        })
        return result


def run_harness_alone(world: int) -> dict[str, Any]:
    """The simulation's own cost: every rank makes the passing check's store requests (wait for and get ``lead``,
    two compare_sets, add, set, add, set, and rank 0 waits for ``wake`` and sets the verdict the others get), with
    none of gpuguard's code. The check's Python per rank is the passing run's sim CPU less this one's."""
    with _serving(world) as (server, stores):
        go = gevent.event.Event()
        finished = [0.0] * world

        def rank(i: int) -> None:
            go.wait()
            s = stores[i]
            if i == 0:
                s.set("h/lead", b"epoch")
            else:
                s.get("h/lead")
            record = b"r" * 150
            s.compare_set(f"h/rec/{i}", b"", record)
            s.compare_set(f"h/dev/{i}", b"", record)
            s.add(f"h/host/{i // 8}", 1)
            s.set(f"h/pid/{i}", str(i))
            if s.add("h/arrived", 1) == world:
                s.set("h/wake", b"1")
            s.set(f"h/done/{i}", b"1")
            if i == 0:
                s.wait(["h/wake"])
                s.set("h/verdict", b"{}")
            else:
                s.get("h/verdict")
            finished[i] = time.perf_counter()

        def body(started: float) -> dict[str, Any]:
            ranks = [gevent.spawn(rank, i) for i in range(world)]
            go.set()
            gevent.joinall(ranks, raise_error=True)
            return {"wall_s": max(finished) - started}

        result = _measure(server, stores, body)
        result.update({"ranks": world, "scenario": "harness", "verdicts": ["-"]})
        return result


def run_watchdog(world: int, seconds: float, tick: float = 1.0, per_node: int = 1) -> dict[str, Any]:
    """Every rank's healthy watchdog: one CHECK of the alarm key per tick, ticks spread over the ranks; with
    ``per_node`` > 1, the per-node tier: only each node's leader asks (the others read its answer in shared
    memory, bench_watch_tier.py), so ``world / per_node`` connections carry the job's steady traffic."""
    askers = world // per_node
    with _serving(askers) as (server, stores):
        stop = gevent.event.Event()

        def rank(i: int, started: float) -> None:
            due = started + tick * i / askers
            while not stop.is_set():
                gevent.sleep(max(0.0, due - time.perf_counter()))
                stores[i].check([f"gpuguard/watch/default_pg/alarm/{i % 7}"])
                due += tick

        def body(started: float) -> dict[str, Any]:
            ranks = [gevent.spawn(rank, i, started) for i in range(askers)]
            gevent.sleep(seconds)
            stop.set()
            gevent.joinall(ranks, raise_error=True)
            return {}

        result = _measure(server, stores, body)
        result.update({"ranks": world, "scenario": "watchdog" if per_node == 1 else "watch-tier",
                       "offered_per_s": askers / tick})
        return result


def run_capacity(seconds: float = 5.0, clients: int = 256) -> dict[str, Any]:
    """Requests back to back from ``clients`` connections: the server's CPU time per request."""
    with _serving(clients) as (server, stores):
        stop = gevent.event.Event()

        def client(s: WireStore) -> None:
            while not stop.is_set():
                s.check(["gpuguard/watch/default_pg/alarm/0"])

        def body(started: float) -> dict[str, Any]:
            workers = [gevent.spawn(client, s) for s in stores]
            gevent.sleep(seconds)
            stop.set()
            gevent.joinall(workers, raise_error=True)
            return {}

        result = _measure(server, stores, body)
        per_request = result["server_cpu_s"] / result["requests"]
        result.update({"scenario": "capacity", "clients": clients, "server_cpu_us_per_request": per_request * 1e6,
                       "sustainable_per_s": 1 / per_request,
                       "server_busy": result["server_cpu_s"] / result["wall_s"]})
        return result


def _row(r: dict[str, Any], sustainable: float) -> str:
    n = r["ranks"]
    load = r["requests"] / r["wall_s"]
    if "ops_median" in r:
        ops = f"{r['ops_median']:>5g} {r['ops_max']:>4} {r['ops_rank0']:>4}"
    elif r["scenario"] in ("watchdog", "watch-tier"):
        ops = f"{r['requests'] / n / r['wall_s'] * 60:>5.0f}/min     "
    else:
        ops = f"{r['requests'] / n:>5.1f} req      "
    mem = (f"{r['server_rss_kib_per_rank']:>6.1f} {r['sim_peak_kib_per_rank']:>6.1f}" if "server_rss_kib_per_rank" in r
           else f"{'':>13}")
    verdict = ",".join(r.get("verdicts", [])) or "-"
    return (f"{n:>6} {r['scenario']:<11} {r['wall_s']:>7.2f} {ops} {load:>8.0f} {load / sustainable:>5.0%} "
            f"{r['server_cpu_s'] / n * 1e6:>7.0f} {r['sim_cpu_s'] / n * 1e6:>7.0f} {r['sim_gc_cpu_s'] / n * 1e6:>6.0f} "
            f"{mem}  {verdict}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="1024,4096,16384")
    parser.add_argument("--scenarios", default="harness,pass,fail-few,fail-many,timeout,node-gone,leader-dies,"
                                                "slow-store,store-stalls,watchdog,watch-tier")
    parser.add_argument("--deadline", type=float, default=20.0, help="the check's deadline (the timeout scenario "
                        "waits for it)")
    parser.add_argument("--watch-s", type=float, default=10.0)
    parser.add_argument("--abandon-after", type=float, default=None,
                        help="how long past its own bound a rank waits for a store call before it gives up on it "
                             f"(gpuguard's stores.ABANDON_AFTER_S, {checked_stores.ABANDON_AFTER_S:g} s). One thread "
                             "takes turns running every rank, so at thousands of ranks timing out at once a rank waits "
                             "its turn longer than that, which a rank with a core of its own never does: widen it to "
                             "run the timeout scenarios there")
    parser.add_argument("--out", default=str(Path(__file__).resolve().parent / "results" / "bench_scale.json"))
    args = parser.parse_args()
    if args.abandon_after is not None:
        checked_stores.ABANDON_AFTER_S = args.abandon_after
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))  # a connection per rank, here and in the server
    sizes = [int(x) for x in args.sizes.split(",") if x]
    if max(sizes) + 64 > hard:
        print(f"bench_scale: {max(sizes)} ranks need as many open files; the hard limit is {hard} (ulimit -Hn)",
              file=sys.stderr)
        return 2

    capacity = run_capacity()
    sustainable = capacity["sustainable_per_s"]
    print(f"one TCPStore server: {capacity['server_cpu_us_per_request']:.1f} us of CPU per request "
          f"({capacity['requests'] / capacity['wall_s']:.0f} requests/s reached with the server "
          f"{capacity['server_busy']:.0%} busy): at most ~{sustainable:.0f} requests/s on its one thread")
    print(f"{'ranks':>6} {'scenario':<11} {'wall s':>7} {'ops/rank':>5} {'max':>4} {'r0':>4} {'req/s':>8} "
          f"{'load':>5} {'srv us':>7} {'sim us':>7} {'gc us':>6} {'srvKiB':>6} {'simKiB':>6}  verdict")
    rows = []
    for n in sizes:
        for scenario in args.scenarios.split(","):
            if scenario == "watchdog":
                r = run_watchdog(n, args.watch_s)
            elif scenario == "watch-tier":
                r = run_watchdog(n, args.watch_s, per_node=8)
            elif scenario == "harness":
                r = run_harness_alone(n)
            else:
                r = run_check(n, scenario, args.deadline)
            rows.append(r)
            print(_row(r, sustainable), flush=True)
    print("ops/rank: store operations per rank but rank 0 (median, most), r0: rank 0's (it opens the check and "
          "composes); watchdog: operations per rank per minute. req/s: requests the server answered per second of "
          "the run (a get is two); load: that against the server's sustainable rate. srv us / sim us: CPU time per "
          "rank of the server and of this simulation (its own overhead plus the check's Python code, which a real "
          "job runs on each rank's core); gc us: the part of sim us spent in Python's garbage collector, whose full "
          "collections walk every simulated rank's objects (a real rank's heap holds its own). srvKiB: the server's "
          "memory growth per rank; simKiB: this process's.")
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"capacity": capacity, "runs": rows, "cpus": os.cpu_count(),
                               "python": sys.version.split()[0]}, indent=2))
    print(f"saved {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
