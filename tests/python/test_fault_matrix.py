"""The fault matrix of bind()'s cross-rank check: a fault x a launcher x the step it strikes at, each giving every
surviving rank an error within the timeout plus the 5-second grace that names the culprit rank, with its host and
pid when it arrived, or says it never arrived.

Faults are real: a rank SIGKILLs or SIGSTOPs itself, sleeps past the others' deadline, or exits before bind()
(fault_worker.py), through a wrapper of the job's real store passed as bind(store=...). Launchers: plain
processes (RANK/WORLD_SIZE, 6 ranks, a TCPStore the test serves, as a notebook or a long-lived store server
would), torchrun with 4 ranks (its agent store), and two torchrun agents of 2 ranks meeting through a c10d
rendezvous whose store the test serves (so that it outlives an agent that gives up).

Which combinations. Every fault at every step under plain processes (where nothing but gpuguard reacts), plus the
two first-class absences (a rank, and rank 0, never arriving). Under one torchrun agent a SIGKILLed worker makes
torchrun stop every other worker at once and name it itself (observed: within 0.1 s), so only what torchrun
cannot see is run there: a stopped rank (at its record, and rank 0 before the verdict) and a slow one. Under two
agents a SIGKILL ends its own agent's ranks and leaves the other agent's, which only gpuguard can tell: a rank of
the second agent killed at its record, and after counting in last (the survivors are the first agent's), and
rank 0 stopped before the verdict. (The first agent serves the workers' store, so a SIGKILL there ends the store
with it: every survivor then gets "the store ... closed the connection", which no rank can trace further; rank 0
is stopped instead.) 15 cases, run 4 at a time: about a minute on 2 cores (each case is one timeout plus
start-up; the ranks import no torch).
"""

from __future__ import annotations

import concurrent.futures
import datetime
import json
import os
import socket
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

import pytest
import torch.distributed as dist

from gg_testing import launch
from gg_testing.env import scrubbed
from gpuguard.placement.stores import ABANDON_AFTER_S

pytestmark = pytest.mark.wall_clock

WORKER = Path(__file__).with_name("fault_worker.py")
T = 6.0  # bind()'s timeout in every case
GRACE = 5.0  # the exchange's TIMEOUT_GRACE_S: every survivor must have its error by T + GRACE
SLACK = ABANDON_AFTER_S  # a store call left behind when its server stops answering
START_UP = 40.0  # what a loaded machine may take to start a launcher and its ranks
PARALLEL = 4


@dataclass(frozen=True)
class Case:
    launcher: str  # plain | torchrun | two_agents
    fault: str  # kill | stop | slow | absent
    rank: int
    step: str  # record | count | compose (see fault_worker.py)

    @property
    def id(self) -> str:
        return f"{self.launcher}-{self.fault}-rank{self.rank}-{self.step}"

    @property
    def world(self) -> int:
        return 6 if self.launcher == "plain" else 4

    def survivors(self) -> list[int]:
        """The ranks that must report: all but the culprit (the slow one reports too); under two agents, a
        killed rank's agent ends its other rank, so only the other agent's ranks remain."""
        if self.launcher == "two_agents" and self.fault == "kill":
            node = self.rank // 2
            return [r for r in range(4) if r // 2 != node]
        return [r for r in range(self.world) if r != self.rank or self.fault == "slow"]


CASES = [
    Case("plain", "kill", 3, "record"),
    Case("plain", "stop", 3, "record"),
    Case("plain", "kill", 5, "count"),
    Case("plain", "stop", 5, "count"),
    Case("plain", "kill", 0, "compose"),
    Case("plain", "stop", 0, "compose"),
    Case("plain", "slow", 4, "record"),
    Case("plain", "absent", 2, "record"),
    Case("plain", "absent", 0, "record"),
    Case("torchrun", "stop", 2, "record"),
    Case("torchrun", "stop", 0, "compose"),
    Case("torchrun", "slow", 1, "record"),
    Case("two_agents", "kill", 3, "record"),
    Case("two_agents", "kill", 2, "count"),
    Case("two_agents", "stop", 0, "compose"),
]


@dataclass
class Outcome:
    ranks: dict[int, dict[str, Any]]  # rank -> its rank<r>.json
    culprit_pid: Optional[int]
    started_pids: dict[int, int]  # rank -> the pid in its started<r>.json


def _started_pid(outcome: Outcome, rank: int) -> Optional[int]:
    return outcome.started_pids.get(rank)


def _json(path: Path) -> Optional[dict[str, Any]]:
    try:
        return json.loads(path.read_text())  # type: ignore[no-any-return]
    except (OSError, ValueError):
        return None


def run_case(case: Case, fake_gpus: Any, tmp: Path) -> Outcome:
    out = tmp / case.id
    out.mkdir(parents=True)
    env = dict(FAULT=case.fault, FAULT_RANK=str(case.rank), FAULT_STEP=case.step, FAULT_TIMEOUT=f"{T:g}",
               FAULT_OUT=str(out))
    launched: list[launch.Job] = []
    store = None

    def start(argv: list[str], env: dict[str, str], name: str) -> None:  # the ranks write into `out` themselves
        launched.append(launch.Job(argv, env, out, name=name, results=out, merge_output=True))
    try:
        if case.launcher == "plain":
            store = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False,
                                  timeout=datetime.timedelta(seconds=60))
            for r in range(case.world):
                rank_env = dict(scrubbed(fake_gpus.env("h100x8", **env)), RANK=str(r), WORLD_SIZE=str(case.world),
                                LOCAL_RANK=str(r), LOCAL_WORLD_SIZE=str(case.world),
                                FAULT_STORE=f"127.0.0.1:{store.port}")
                start([sys.executable, str(WORKER)], rank_env, f"launcher{r}")
        elif case.launcher == "torchrun":
            start(launch.torchrun_argv(str(WORKER), nproc=4), scrubbed(fake_gpus.env("h100x8", **env)), "launcher0")
        else:  # two agents of 2 ranks, on GPUs 0,1 and 2,3 of one host, through a rendezvous store served here
            store = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False,
                                  timeout=datetime.timedelta(seconds=60))
            for node, visible in enumerate(("0,1", "2,3")):
                start(launch.torchrun_argv(str(WORKER), nproc=2, nnodes=2, port=store.port, rdzv_id=case.id),
                      scrubbed(fake_gpus.env("h100x8", visible=visible, **env)), f"launcher{node}")
        give_up = time.monotonic() + START_UP + T + GRACE
        wanted = case.survivors()
        while time.monotonic() < give_up and not all((out / f"rank{r}.json").exists() for r in wanted):
            time.sleep(0.2)
        ranks = {r: doc for r in range(case.world) if (doc := _json(out / f"rank{r}.json")) is not None}
        fault = _json(out / f"fault{case.rank}.json")
        started_pids = {r: int(doc["pid"]) for r in range(case.world)
                        if (doc := _json(out / f"started{r}.json")) is not None}
        return Outcome(ranks, fault["pid"] if fault else None, started_pids)
    finally:
        # the launchers and every rank they started (a stopped one too, in a session of its own): only what
        # this case started, found by its job's mark
        for job in launched:
            job.kill()
        del store


@pytest.fixture(scope="module")
def matrix(fake_gpus, tmp_path_factory, request) -> dict[str, Outcome]:
    """Runs the selected cases, PARALLEL at a time (each mostly waits out its timeout)."""
    selected = {item.callspec.params["case"] for item in request.session.items
                if item.module is request.module and hasattr(item, "callspec")}
    tmp = tmp_path_factory.mktemp("fault_matrix")
    with concurrent.futures.ThreadPoolExecutor(PARALLEL) as pool:
        futures = {case.id: pool.submit(run_case, case, fake_gpus, tmp) for case in CASES if case in selected}
        return {name: future.result() for name, future in futures.items()}


def _where(host: str, pid: Optional[int]) -> str:
    return f"(host {host}, pid {pid})"


@pytest.mark.slow
@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_every_survivor_names_the_culprit_in_time(matrix, case):
    outcome = matrix[case.id]
    host = socket.gethostname()
    missing = [r for r in case.survivors() if r not in outcome.ranks]
    assert not missing, f"ranks {missing} never reported; see {case.id}/launcher*.log"
    for r in case.survivors():
        got = outcome.ranks[r]
        assert got["error"] == "RendezvousTimeoutError", (r, got)
        # the slow rank's own sleep is its fault's, not gpuguard's: its deadline covers the rest (CI saw it start up
        # for 4 s on a loaded machine, then sleep 8 s past the others' deadline)
        assert got["elapsed"] - got["stalled"] <= T + GRACE + SLACK, (r, got["elapsed"], got["stalled"])
        message, details = got["message"], got["details"]
        if case.fault == "slow" and r == case.rank:  # the late rank is told that it was late, not absent
            assert message.startswith(f"this rank ({r}) of group 'default' reached gpuguard's placement check but "
                                      f"did not finish it before the other ranks stopped waiting"), message
            continue
        silent, late = [case.rank], []
        if case.launcher == "two_agents" and case.fault == "kill" and details["missing_ranks"] != [case.rank]:
            # the killed rank's agent ends its other rank too. Where the agent gets there first decides how that
            # rank is named: after its part, not at all (only the culprit is missing); after its record, silent as
            # well (seen in CI on torch 2.6); before its record, never arrived (seen in CI on torch 2.15)
            mate = case.rank ^ 1
            if details["never_arrived"] == [mate]:
                late = [mate]
            else:
                silent = sorted([case.rank, mate])
        assert details["missing_ranks"] == sorted(silent + late), (r, details)
        if late:
            assert details["silent_ranks"] == silent, (r, details)
            assert message.startswith(f"rank {case.rank} {_where(host, outcome.culprit_pid)} of group 'default' "
                                      f"reached gpuguard's placement check and then went silent before finishing "
                                      f"it, and rank {late[0]} never arrived within {T:g} s ({case.world - 1} of "
                                      f"{case.world} arrived, {case.world - 2} finished)."), message
            continue
        if case.fault == "absent":
            assert details["never_arrived"] == [case.rank], (r, details)
            assert message.startswith(f"rank {case.rank} of group 'default' did not reach gpuguard's placement "
                                      f"check within {T:g} s"), message
        elif case.step == "compose":
            assert details["silent_ranks"] == [0] and details["never_arrived"] == [], (r, details)
            assert message.startswith(f"every rank of group 'default' reached gpuguard's placement check within "
                                      f"{T:g} s, but rank 0 {_where(host, outcome.culprit_pid)}, which writes the "
                                      f"verdict once all have arrived, went silent before writing it"), message
        else:
            assert details["silent_ranks"] == silent and details["never_arrived"] == [], (r, details)
            pids = {case.rank: outcome.culprit_pid}
            pids.update({m: _started_pid(outcome, m) for m in silent if m != case.rank})
            named = "; ".join(f"{m} {_where(host, pids[m])}" for m in silent)
            assert message.startswith(f"{'rank' if len(silent) == 1 else 'ranks'} {named} of group 'default' "
                                      f"reached gpuguard's placement check and then went silent before finishing "
                                      f"it within {T:g} s ({case.world} of {case.world} arrived, "
                                      f"{case.world - len(silent)} finished)."), message
