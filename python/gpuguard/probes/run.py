"""Runs GPU probes in child processes under a deadline, so that a hang in the driver or NCCL cannot hang us.

Each child (python -m gpuguard.probes.child ...) prints one JSON object per line as it goes, flushing each; when the
deadline passes, its whole process group is killed and what it printed so far says how far it got (which
GPU pair was being copied, which rank never finished its all-reduce).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from typing import IO, Any, Optional, Sequence

# What is kept of a child's output, whatever it prints.
MAX_EVENTS = 10_000
STDERR_TAIL = 4096
# Starting a child (python, torch, gpuguard, the driver) before its probe's own deadline starts counting.
STARTUP_ALLOWANCE_S = 60.0


@dataclass
class ChildRun:
    """What one probe child did: its events (parsed JSON lines), how it ended, and its last stderr."""

    events: list[dict[str, Any]] = field(default_factory=list)
    returncode: Optional[int] = None
    timed_out: bool = False
    seconds: float = 0.0
    stderr_tail: str = ""


def _read_events(stream: IO[bytes], run: ChildRun) -> None:
    for raw in iter(stream.readline, b""):
        if len(run.events) >= MAX_EVENTS:
            continue
        try:
            event = json.loads(raw.decode("utf-8", "replace"))
        except ValueError:
            continue  # stray output from a library in the child is not an event
        if isinstance(event, dict):
            run.events.append(event)


def _read_tail(stream: IO[bytes], run: ChildRun) -> None:
    tail = b""
    for chunk in iter(lambda: stream.read(1024), b""):
        tail = (tail + chunk)[-STDERR_TAIL:]
    run.stderr_tail = tail.decode("utf-8", "replace")


def probe_command(*args: str) -> list[str]:
    return [sys.executable, "-m", "gpuguard.probes.child", *args]


class Child:
    """One running probe child; wait() enforces the deadline."""

    def __init__(self, args: Sequence[str], env: dict[str, str], stdin: bool = False) -> None:
        self.run = ChildRun()
        self._start = time.monotonic()
        self.proc = subprocess.Popen(
            list(args), env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
            stdin=subprocess.PIPE if stdin else subprocess.DEVNULL, start_new_session=True)
        assert self.proc.stdout is not None and self.proc.stderr is not None
        self._threads = [threading.Thread(target=_read_events, args=(self.proc.stdout, self.run), daemon=True),
                         threading.Thread(target=_read_tail, args=(self.proc.stderr, self.run), daemon=True)]
        for t in self._threads:
            t.start()

    def send(self, line: str) -> None:
        assert self.proc.stdin is not None
        try:
            self.proc.stdin.write(line.encode() + b"\n")
            self.proc.stdin.flush()
        except OSError:  # it already exited; its events and status say why
            pass

    def events_of(self, kind: str) -> list[dict[str, Any]]:
        return [e for e in list(self.run.events) if e.get("event") == kind]

    def wait_for_event(self, kind: str, deadline: float) -> Optional[dict[str, Any]]:
        """The first event of `kind`, or None if the child exits or the deadline passes first."""
        while time.monotonic() < deadline:
            found = self.events_of(kind)
            if found:
                return found[0]
            if self.proc.poll() is not None:
                for t in self._threads:
                    t.join(timeout=1.0)
                found = self.events_of(kind)
                return found[0] if found else None
            time.sleep(0.02)
        return None

    def wait(self, deadline: float) -> ChildRun:
        try:
            self.proc.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            self.kill()
            self.run.timed_out = True
        for t in self._threads:
            t.join(timeout=2.0)
        self._close_pipes()
        self.run.returncode = self.proc.returncode
        self.run.seconds = time.monotonic() - self._start
        return self.run

    def _close_pipes(self) -> None:
        for stream in (self.proc.stdin, self.proc.stdout, self.proc.stderr):
            if stream is not None:
                try:
                    stream.close()
                except OSError:  # a reader thread still holding it after the kill
                    pass

    def kill(self) -> None:
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)  # the child's own session: it and anything it started
        except (ProcessLookupError, PermissionError):
            pass
        try:
            self.proc.wait(timeout=5.0)
        except subprocess.TimeoutExpired:  # pragma: no cover - SIGKILL does not fail
            pass


def run_child(args: Sequence[str], env: dict[str, str], timeout: float) -> ChildRun:
    child = Child(args, env)
    return child.wait(time.monotonic() + timeout)


def child_env(**overrides: Optional[str]) -> dict[str, str]:
    """This process's environment with `overrides` applied (None removes a variable), and this gpuguard first
    on PYTHONPATH, so that the child runs the same gpuguard as the parent."""
    env = dict(os.environ)
    path = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    env["PYTHONPATH"] = os.pathsep.join([path] + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
    for k, v in overrides.items():
        if v is None:
            env.pop(k, None)
        else:
            env[k] = v
    return env


# ---- the probes ------------------------------------------------------------------------------------------

@dataclass
class PeerCopyReport:
    """Every ordered pair copied (or not) within the deadline."""

    pairs: list[dict[str, Any]]
    hung_pair: Optional[tuple[int, int]]
    timed_out: bool
    failed_to_start: Optional[str]
    seconds: float

    def as_dict(self) -> dict[str, Any]:
        return {"pairs": self.pairs, "hung_pair": list(self.hung_pair) if self.hung_pair else None,
                "timed_out": self.timed_out, "failed_to_start": self.failed_to_start,
                "seconds": round(self.seconds, 3)}


def peer_copy_all_pairs(timeout: float, nbytes: int = 8 << 20) -> PeerCopyReport:
    """Copies between every ordered pair of visible GPUs in one child process, verified; the copies get
    `timeout` s from the moment the child has started (python, torch and the driver loaded)."""
    start = time.monotonic()
    child = Child(probe_command("p2p", "--bytes", str(nbytes)), child_env())
    ready = child.wait_for_event("devices", start + STARTUP_ALLOWANCE_S)
    if ready is None:
        run = child.wait(time.monotonic())  # kills it if it is still starting
        errors = [e for e in run.events if e.get("event") == "error"]
        why = (errors[0].get("message") if errors else
               f"it did not start within {STARTUP_ALLOWANCE_S:g} s" if run.timed_out else
               f"it exited with status {run.returncode}: {run.stderr_tail.strip()[-500:]}")
        return PeerCopyReport([], None, False, f"the probe process failed before copying: {why}",
                              time.monotonic() - start)
    run = child.wait(time.monotonic() + timeout)
    pairs = [e for e in run.events if e.get("event") == "result"]
    started = [e for e in run.events if e.get("event") == "start"]
    hung: Optional[tuple[int, int]] = None
    if run.timed_out and started and len(started) > len(pairs):
        hung = (int(started[-1]["src"]), int(started[-1]["dst"]))
    failed = None
    if not run.timed_out and run.returncode != 0:
        failed = f"the probe process exited with status {run.returncode}: {run.stderr_tail.strip()[-500:]}"
    return PeerCopyReport(pairs, hung, run.timed_out, failed, time.monotonic() - start)


@dataclass
class AllReduceReport:
    """One all-reduce across the local GPUs: per rank, how it ended."""

    p2p_disabled: bool
    verdict: str                      # ok | failed | timed out
    ranks: list[dict[str, Any]]       # the child's result (nccl_probe's dict), or what is known of a killed one
    seconds: float
    problem: str = ""                 # one sentence when not ok

    def as_dict(self) -> dict[str, Any]:
        return {"p2p_disabled": self.p2p_disabled, "verdict": self.verdict, "ranks": self.ranks,
                "seconds": round(self.seconds, 3), "problem": self.problem}


def nccl_all_reduce(nranks: int, timeout: float, *, p2p_disabled: bool) -> AllReduceReport:
    """Forms an NCCL communicator over GPUs 0..nranks-1, one child process per GPU as a job would, and runs a
    small all-reduce, each rank under `timeout` s (NCCL's non-blocking init, aborted when late), the whole
    under `timeout` plus a start-up allowance, after which every child is killed."""
    start = time.monotonic()
    env = child_env(NCCL_P2P_DISABLE="1" if p2p_disabled else None)
    # ranks started with one run's unique id; the per-probe deadline covers init and the all-reduce
    children = [Child(probe_command("nccl", "--rank", str(r), "--nranks", str(nranks), "--device", str(r),
                                    "--timeout", f"{timeout:g}"), env, stdin=r > 0) for r in range(nranks)]
    deadline = start + timeout + STARTUP_ALLOWANCE_S
    try:
        first = children[0].wait_for_event("unique_id", deadline)
        if first is None:
            errors = children[0].events_of("error")
            why = errors[0]["message"] if errors else (children[0].run.stderr_tail.strip()[-300:] or "no output")
            return AllReduceReport(p2p_disabled, "failed", [], time.monotonic() - start,
                                   f"rank 0 could not create an NCCL unique id: {why}")
        for child in children[1:]:
            child.send(str(first["hex"]))
        runs = [child.wait(deadline) for child in children]
    finally:
        for child in children:
            if child.proc.poll() is None or child.run.returncode is None:
                child.wait(time.monotonic())  # kills what still runs, closes its pipes
    ranks: list[dict[str, Any]] = []
    for r, (child, run) in enumerate(zip(children, runs)):
        results = child.events_of("result")
        if results:
            ranks.append(results[0])
        else:
            state = "killed at the deadline" if run.timed_out else f"exited with status {run.returncode}"
            ranks.append({"rank": r, "device": r, "verdict": "timed out" if run.timed_out else "failed", "ok": False,
                          "stage": "process", "error": {"message": f"the rank's process {state}: "
                                                                   f"{run.stderr_tail.strip()[-300:]}"}})
    verdicts = [str(x.get("verdict")) for x in ranks]
    if all(x.get("ok") for x in ranks):
        return AllReduceReport(p2p_disabled, "ok", ranks, time.monotonic() - start)
    verdict = "timed out" if "timed out" in verdicts else "failed"
    bad = [x for x in ranks if not x.get("ok")]
    first_bad = bad[0]
    stage = first_bad.get("stage") or "an unknown stage"
    if verdict == "timed out":
        problem = (f"{len(bad)} of {nranks} ranks did not finish within {timeout:g} s "
                   f"(rank {first_bad.get('rank')} was at {stage})")
    else:
        message = (first_bad.get("error") or {}).get("message", "")
        problem = (f"{len(bad)} of {nranks} ranks failed (rank {first_bad.get('rank')} at {stage}"
                   + (f": {message}" if message else "") + ")")
    return AllReduceReport(p2p_disabled, verdict, ranks, time.monotonic() - start, problem)
