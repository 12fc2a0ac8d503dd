"""What gpuguard.watch() costs a DDP job as users run it: steady state, start-up, the longest step, the recorder.

Real jobs: each is ``--ranks`` processes (gloo on this CPU machine, NCCL on a GPU: ``--backend nccl --device
cuda``) joined through a real TCPStore (env:// rendezvous, as torchrun's), training a DDP model
(``Linear(width, width)``, forward and backward, one gradient all-reduce per step). The flight recorder is asked
for as gpuguard's docs say, with TORCH_FR_BUFFER_SIZE and TORCH_NCCL_TRACE_BUFFER_SIZE in the job's environment
(2000 entries on, 0 off). Every step is timed on its own. Each rank also runs a probe thread that sleeps 1 ms in a
loop and keeps its longest gap between wake-ups: a thread that holds the GIL (or a stall of the process) shows as
a gap, whatever step it lands in. The figures, each beside the obvious alternative in the same run:

  start-up      two fresh jobs one after the other, without and with watch() (called right after
                init_process_group, before the model, as users do), each trained for ``--first`` seconds: the
                time the watch() call itself takes, the time from it to the watchdog's first tick, the longest
                single step and the probe's longest gap (a GIL hold while the job trains) of each job
  steady state  three jobs started together and kept alive, given blocks of steps in turn (only one trains at
                a time; the order rotates every round) for ``--steady`` seconds after the watched one's first
                ticks: watched (its one watch() kept on throughout), plain, and plain with the recorder off.
                Per-step medians and means; watched / plain is what watch() costs, plain / recorder-off what the
                flight recorder itself costs. A watch cannot be paused, so the unwatched twin job in the same time
                window is the comparison; "plain / plain" of two twin jobs (``--twin``) shows the noise floor.

Nothing here asserts a timing (a shared machine only adds noise); the target is watched / plain <= 1.01 at
steady state and no gap of more than a few milliseconds after watch() starts.

    python benchmarks/bench_watch_cost.py [--first 60] [--steady 20] [--ranks 2] [--json out.json]
    python benchmarks/bench_watch_cost.py --quick     # CI: about 45 s on two cores
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

ROOT = Path(__file__).resolve().parents[1]
BUFFER_ENTRIES = "2000"


# ---- one rank of one job (a child process: the recorder's variables must be set before torch reads them) ------

class GapProbe(threading.Thread):
    """Sleeps 1 ms in a loop and keeps the longest gap between its wake-ups after ``gaps_from``; also notes when the
    watchdog's first tick came. Waking needs the GIL, so a GIL held elsewhere shows as a long gap."""

    def __init__(self) -> None:
        super().__init__(name="gap-probe", daemon=True)
        self.origin = time.perf_counter()
        self.gaps_from = float("inf")  # gaps count from here: once watch() returned, when the job trains
        self.longest = 0.0
        self.longest_at = 0.0
        self.watch: Any = None
        self.first_tick_at: Optional[float] = None
        self.done = threading.Event()

    def run(self) -> None:
        last = time.perf_counter()
        while not self.done.is_set():
            time.sleep(0.001)
            now = time.perf_counter()
            if now - last > self.longest and last >= self.gaps_from:
                self.longest, self.longest_at = now - last, last - self.origin
            last = now
            if self.first_tick_at is None and self.watch is not None and self.watch.ticks > 0:
                self.first_tick_at = now - self.origin


def rank_main(cfg: dict[str, Any]) -> None:
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    out = sys.stdout
    sys.stdout = sys.stderr  # only this function's answers go to the parent's pipe

    def say(**kw: Any) -> None:
        out.write("BENCH " + json.dumps(kw) + "\n")
        out.flush()

    probe = GapProbe()
    probe.start()
    cuda = cfg["device"] == "cuda"
    if cuda:
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    dist.init_process_group(cfg["backend"])
    import gpuguard  # imported by both jobs, and before the clock: watch() is what is measured

    watch, watch_call_s = None, 0.0
    probe.origin = time.perf_counter()  # the job's training starts here, with or without watch()
    if cfg["watch"]:
        watch = gpuguard.watch(stall_after=600)
        watch_call_s = time.perf_counter() - probe.origin
        probe.watch = watch
    # the watch() call is start-up, reported as watch_call_s (it pays torch's first symbolisation, holding the GIL
    # on purpose before the job trains); a gap from here on is one the training thread feels
    probe.gaps_from = time.perf_counter()
    device = torch.device("cuda", torch.cuda.current_device()) if cuda else torch.device("cpu")
    torch.manual_seed(0)
    model = DistributedDataParallel(torch.nn.Linear(cfg["width"], cfg["width"]).to(device),
                                    device_ids=[device.index] if cuda else None)
    x = torch.ones(cfg["batch"], cfg["width"], device=device)

    def step() -> None:
        model(x).sum().backward()
        if cuda:
            torch.cuda.synchronize()

    source = ""
    if watch is not None and watch.source is not None:
        source = watch.source.note or watch.source.calls_note
    say(ready=True, watch_call_s=watch_call_s, source=source)
    for line in sys.stdin:
        cmd = json.loads(line)
        if cmd["op"] == "steps":
            begin = time.perf_counter()
            times = []
            for _ in range(cmd["n"]):
                start = time.perf_counter()
                step()
                times.append(time.perf_counter() - start)
            say(times=times, begin=begin - probe.origin, ticks=watch.ticks if watch is not None else 0)
        elif cmd["op"] == "stop":
            probe.done.set()
            probe.join()
            say(longest_gap_s=probe.longest, longest_gap_at=probe.longest_at, first_tick_at=probe.first_tick_at,
                reports=watch.reports if watch is not None else 0)
            break
    if watch is not None:
        watch.stop()
    dist.destroy_process_group()


# ---- the parent: jobs, their blocks, the figures -------------------------------------------------------------

def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class Job:
    """One job's rank processes, talked to through their stdin and stdout."""
    name: str
    watch: bool
    recorder: bool
    procs: list[subprocess.Popen] = field(default_factory=list)
    logs: list[Any] = field(default_factory=list)
    ready: list[dict] = field(default_factory=list)
    steps: list[float] = field(default_factory=list)      # rank 0's step times, in order
    step_at: list[float] = field(default_factory=list)    # when each began, seconds after the origin
    ticks: int = 0
    final: list[dict] = field(default_factory=list)

    def start(self, args: argparse.Namespace, logdir: str) -> None:
        port = free_port()
        cfg = {"backend": args.backend, "device": args.device, "watch": self.watch, "width": args.width,
               "batch": args.batch}
        for rank in range(args.ranks):
            env = dict(os.environ, RANK=str(rank), WORLD_SIZE=str(args.ranks), LOCAL_RANK=str(rank),
                       LOCAL_WORLD_SIZE=str(args.ranks), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port),
                       TORCHELASTIC_RUN_ID=f"bench-{self.name}-{port}", PYTHONUNBUFFERED="1",
                       PYTHONPATH=os.pathsep.join([str(ROOT / "python")] + ([os.environ["PYTHONPATH"]]
                                                                            if os.environ.get("PYTHONPATH") else [])))
            entries = BUFFER_ENTRIES if self.recorder else "0"
            env["TORCH_FR_BUFFER_SIZE"] = env["TORCH_NCCL_TRACE_BUFFER_SIZE"] = entries
            log = open(os.path.join(logdir, f"{self.name}-rank{rank}.log"), "w+")
            self.logs.append(log)
            self.procs.append(subprocess.Popen([sys.executable, __file__, "--rank-worker", json.dumps(cfg)],
                                               stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=log, text=True,
                                               env=env))

    def _answers(self) -> list[dict]:
        answers = []
        for rank, proc in enumerate(self.procs):
            while True:
                line = proc.stdout.readline()
                if not line:
                    self.logs[rank].seek(0)
                    raise RuntimeError(f"job {self.name}, rank {rank} ended (exit {proc.wait()}):\n"
                                       + self.logs[rank].read()[-3000:])
                if line.startswith("BENCH "):
                    answers.append(json.loads(line[len("BENCH "):]))
                    break
        return answers

    def _send(self, **cmd: Any) -> None:
        for proc in self.procs:
            proc.stdin.write(json.dumps(cmd) + "\n")
            proc.stdin.flush()

    def wait_ready(self) -> None:
        self.ready = self._answers()

    def block(self, n: int, keep: bool = True) -> float:
        """Runs n steps on every rank; keeps rank 0's step times; returns the block's mean step."""
        self._send(op="steps", n=n)
        answers = self._answers()
        times = answers[0]["times"]
        self.ticks = answers[0]["ticks"]
        if keep:
            at = answers[0]["begin"]
            for t in times:
                self.step_at.append(at)
                at += t
            self.steps.extend(times)
        return sum(times) / len(times)

    def stop(self) -> None:
        self._send(op="stop")
        self.final = self._answers()
        for proc in self.procs:
            proc.wait(timeout=60)
        for log in self.logs:
            log.close()

    def kill(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()

    @property
    def longest_gap(self) -> tuple[float, float]:
        worst = max(self.final, key=lambda f: f["longest_gap_s"])
        return worst["longest_gap_s"], worst["longest_gap_at"]


def block_size(job: Job, block_s: float) -> int:
    """Steps per block of about block_s seconds, from a short block of this job (not kept)."""
    mean = job.block(20, keep=False)
    return max(5, int(block_s / max(mean, 1e-6)))


def start_up(args: argparse.Namespace, logdir: str) -> dict[str, Any]:
    """Two fresh jobs, plain then watched, each trained for args.first seconds after its start."""
    figures: dict[str, Any] = {}
    for name, watched in (("plain", False), ("watched", True)):
        job = Job(name=f"first-{name}", watch=watched, recorder=True)
        try:
            job.start(args, logdir)
            job.wait_ready()
            n = 20
            while not job.step_at or job.step_at[-1] < args.first:
                mean = job.block(n)
                n = max(5, int(args.block / max(mean, 1e-6)))
            job.stop()
        finally:
            job.kill()
        longest = max(range(len(job.steps)), key=job.steps.__getitem__)
        gap, gap_at = job.longest_gap
        figures[name] = {"steps": len(job.steps), "median_step_s": statistics.median(job.steps),
                         "longest_step_s": job.steps[longest], "longest_step_at_s": job.step_at[longest],
                         "longest_gap_s": gap, "longest_gap_at_s": gap_at}
        if watched:
            figures[name].update(watch_call_s=job.ready[0]["watch_call_s"], source=job.ready[0]["source"],
                                 first_tick_s=job.final[0]["first_tick_at"], reports=job.final[0]["reports"])
    return figures


def steady(args: argparse.Namespace, logdir: str) -> dict[str, Any]:
    """Three (four with --twin) jobs alive together, given blocks of steps in turn."""
    jobs = [Job("watched", watch=True, recorder=True), Job("plain", watch=False, recorder=True),
            Job("recorder-off", watch=False, recorder=False)]
    if args.twin:
        jobs.append(Job("plain-twin", watch=False, recorder=True))
    try:
        for job in jobs:
            job.start(args, logdir)
        for job in jobs:
            job.wait_ready()
        sizes = {job.name: block_size(job, args.block) for job in jobs}
        n = min(sizes.values())  # the same number of steps for every job
        # the watched job's start-up (its first ticks) is start_up()'s, not steady state's
        started = time.perf_counter()
        while jobs[0].ticks < 2 and time.perf_counter() - started < 10:
            for job in jobs:
                job.block(n, keep=False)
        started, rounds = time.perf_counter(), 0
        while time.perf_counter() - started < args.steady:
            shift = rounds % len(jobs)
            for job in jobs[shift:] + jobs[:shift]:
                job.block(n)
            rounds += 1
        for job in jobs:
            job.stop()
    finally:
        for job in jobs:
            job.kill()
    figures: dict[str, Any] = {"rounds": rounds, "steps_per_block": n, "seconds": time.perf_counter() - started,
                               "source": jobs[0].ready[0]["source"]}
    for job in jobs:
        gap, _ = job.longest_gap
        figures[job.name] = {"steps": len(job.steps), "median_step_s": statistics.median(job.steps),
                             "mean_step_s": statistics.fmean(job.steps), "longest_gap_s": gap,
                             "reports": job.final[0]["reports"]}
    return figures


def ratio(figures: dict[str, Any], a: str, b: str, key: str) -> float:
    return figures[a][key] / figures[b][key]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rank-worker", help=argparse.SUPPRESS)
    parser.add_argument("--first", type=float, default=60.0, help="seconds each start-up job trains")
    parser.add_argument("--steady", type=float, default=20.0, help="seconds of steady-state rounds")
    parser.add_argument("--block", type=float, default=0.25, help="seconds of steps per block")
    parser.add_argument("--ranks", type=int, default=2)
    parser.add_argument("--backend", default="gloo")
    parser.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    parser.add_argument("--width", type=int, default=256)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--twin", action="store_true", help="a fourth job, plain again: the noise floor")
    parser.add_argument("--quick", action="store_true", help="CI: --first 6 --steady 8 (under a minute)")
    parser.add_argument("--json", help="also write the figures here")
    args = parser.parse_args()
    if args.rank_worker:
        rank_main(json.loads(args.rank_worker))
        return 0
    if args.quick:
        args.first, args.steady = min(args.first, 6.0), min(args.steady, 8.0)

    import torch  # only its version, for the header
    print(f"watch()'s cost on a DDP job: {args.ranks} ranks, {args.backend} on {args.device}, "
          f"Linear({args.width}, {args.width}) x {args.batch}, torch {torch.__version__}, "
          f"Python {sys.version.split()[0]}")
    with tempfile.TemporaryDirectory(prefix="bench-watch-cost-") as logdir:
        first = start_up(args, logdir)
        still = steady(args, logdir)
    w, p = first["watched"], first["plain"]
    print(f"progress source: {w['source']}")
    print(f"start-up (fresh jobs, {args.first:g} s each):")
    print(f"  watch() call: {w['watch_call_s'] * 1e3:.1f} ms; its first tick {w['first_tick_s']:.3f} s after it "
          f"(the tick is 1 s)" if w["first_tick_s"] is not None else
          f"  watch() call: {w['watch_call_s'] * 1e3:.1f} ms; no tick seen")
    for label, f in (("without watch()", p), ("with watch()   ", w)):
        print(f"  {label}: median step {f['median_step_s'] * 1e3:.3f} ms, longest step "
              f"{f['longest_step_s'] * 1e3:.1f} ms (at {f['longest_step_at_s']:.2f} s), longest probe gap "
              f"{f['longest_gap_s'] * 1e3:.1f} ms (at {f['longest_gap_at_s']:.2f} s), {f['steps']} steps")
    print(f"  longest step with / without: {w['longest_step_s'] / p['longest_step_s']:.2f}; longest gap with / "
          f"without: {w['longest_gap_s'] / p['longest_gap_s']:.2f} (target: no gap past a few ms after watch())")
    print(f"steady state ({still['rounds']} rounds of {still['steps_per_block']} steps per job, "
          f"{still['seconds']:.1f} s, the watched job's start-up excluded):")
    for name in [k for k in ("watched", "plain", "recorder-off", "plain-twin") if k in still]:
        f = still[name]
        print(f"  {name:13s}: median step {f['median_step_s'] * 1e3:.4f} ms, mean {f['mean_step_s'] * 1e3:.4f} ms, "
              f"longest probe gap {f['longest_gap_s'] * 1e3:.1f} ms")
    print(f"  watched / plain: median {ratio(still, 'watched', 'plain', 'median_step_s'):.4f}, mean "
          f"{ratio(still, 'watched', 'plain', 'mean_step_s'):.4f} (target <= 1.01)")
    print(f"  plain / recorder off (the flight recorder's own cost): median "
          f"{ratio(still, 'plain', 'recorder-off', 'median_step_s'):.4f}, mean "
          f"{ratio(still, 'plain', 'recorder-off', 'mean_step_s'):.4f}")
    if "plain-twin" in still:
        print(f"  plain / plain twin (noise floor): median {ratio(still, 'plain', 'plain-twin', 'median_step_s'):.4f},"
              f" mean {ratio(still, 'plain', 'plain-twin', 'mean_step_s'):.4f}")
    if args.json:
        Path(args.json).write_text(json.dumps({"start_up": first, "steady": still}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
