"""A rank for test_fault_matrix.py: gpuguard.bind(store=...) through a wrapper of the job's real TCPStore (one the
test serves for plain processes, torchrun's own under torchrun) that kills, stops or slows this rank at one step
of the exchange, as a user's job would see it happen. Imports no torch (the store client is gpuguard's own).

Environment: FAULT (kill | stop | slow | absent | none), FAULT_RANK, FAULT_STEP (record: right after the rank
published its record, the arrival mark; count: right after it counted itself in, arriving last (it waits for the
others first); compose: rank 0 once every rank arrived, before it writes the verdict), FAULT_TIMEOUT (bind()'s timeout), FAULT_OUT (where each
rank writes started<r>.json (its pid), fault<r>.json before a fault, and rank<r>.json, its outcome), FAULT_STORE (host:port of
the test's store for plain processes; under torchrun, MASTER_ADDR/MASTER_PORT as gpuguard finds them).
"""

import json
import os
import signal
import socket
import sys
import time

import gpuguard
from gpuguard._core import TcpStore

fault = os.environ.get("FAULT", "none")
fault_rank = int(os.environ.get("FAULT_RANK", "-1"))
step = os.environ.get("FAULT_STEP", "record")
timeout = float(os.environ["FAULT_TIMEOUT"])
out = os.environ["FAULT_OUT"]
rank = int(os.environ["RANK"])
mine = rank == fault_rank
stalled = 0.0  # seconds this rank spent in its own "slow" fault: time no deadline of gpuguard's can cover


def note(name: str, doc: dict) -> None:
    with open(os.path.join(out, f"{name}{rank}.json.tmp"), "w") as f:
        json.dump(doc, f)
    os.replace(os.path.join(out, f"{name}{rank}.json.tmp"), os.path.join(out, f"{name}{rank}.json"))


def strike() -> None:
    """The fault, at the chosen step, by a real signal to this real process (or a real delay)."""
    global stalled
    note("fault", {"pid": os.getpid(), "fault": fault, "step": step})
    if fault == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
    elif fault == "stop":
        os.kill(os.getpid(), signal.SIGSTOP)
    elif fault == "slow":
        began = time.monotonic()
        time.sleep(timeout + 2.0)  # past the others' deadline, then on as if nothing happened
        stalled = time.monotonic() - began


class FaultyStore:
    """The real store, and the fault once this rank has done the chosen step through it."""

    def __init__(self, inner: TcpStore) -> None:
        self.inner = inner

    def __getattr__(self, name: str):
        return getattr(self.inner, name)

    @property
    def timeout(self):
        return self.inner.timeout

    def compare_set(self, key: str, expected: bytes, desired: bytes) -> bytes:
        value = self.inner.compare_set(key, expected, desired)
        if mine and step == "record" and key.endswith(f"/rec/{rank}"):
            strike()
        return value

    def add(self, key: str, amount: int) -> int:
        counting_in = mine and step == "count" and key.endswith("/arrived") and amount == 1
        if counting_in:  # arrive last: wait until every other rank counted itself in
            world, give_up = int(os.environ["WORLD_SIZE"]), time.monotonic() + timeout
            while self.inner.add(key, 0) < world - 1 and time.monotonic() < give_up:
                time.sleep(0.05)
        value = self.inner.add(key, amount)
        if counting_in:
            strike()
        return value

    def get(self, key: str) -> bytes:
        value = self.inner.get(key)
        if mine and step == "compose" and key.endswith("/wake"):
            strike()
        return value

    def wait(self, keys, timeout) -> None:
        self.inner.wait(keys, timeout)
        if mine and step == "compose" and keys[0].endswith("/wake"):
            strike()


def store() -> FaultyStore:
    if os.environ.get("FAULT_STORE"):
        host, port = os.environ["FAULT_STORE"].rsplit(":", 1)
        return FaultyStore(TcpStore(host, int(port), 60.0))
    # torchrun's agent store, as gpuguard.bind() itself would join it
    prefix = f"/gpuguard/attempt_{os.environ.get('TORCHELASTIC_RESTART_COUNT', '0')}"
    return FaultyStore(TcpStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), 60.0, prefix))


note("started", {"pid": os.getpid()})
if mine and fault == "absent":
    note("fault", {"pid": os.getpid(), "fault": fault, "step": "before bind"})
    sys.exit(0)  # never reaches bind(); under torchrun the other ranks keep running
the_store = store()
started = time.monotonic()
try:
    gpuguard.bind(store=the_store, timeout=timeout)
    outcome = {"error": None}
except gpuguard.GpuGuardError as exc:
    outcome = {"error": type(exc).__name__, "message": str(exc),
               "details": {k: v for k, v in exc.details.items() if isinstance(v, (int, str, list, float, bool))}}
outcome.update(elapsed=time.monotonic() - started, stalled=stalled, pid=os.getpid(), host=socket.gethostname())
note("rank", outcome)
