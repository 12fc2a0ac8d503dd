"""gpuguard.watch() under a real torchrun (gloo on the CPU): 3 ranks on one agent, rank 2 the stuck one; 4 on several
agents, as on that many nodes (a killed rank, the per-node tier); the 10,000-step healthy loop on 2. Every rank
prints one report of each stall, naming the stuck rank, its collective, where it was issued and where each CPU
waits, within the stall threshold, the window in which it gathers the ranks' states (here the threshold again) and
15 s. Five of the scenarios run in one job, one after another (the chained job, `chained`): a watch reports each
stall of a job that goes on; so do the healthy DDP loop and the DDP stall (`ddp_chained`), and the node tier's
healthy loop and its stopped leader (`node_tier_chained`).
Progress comes from torch's flight recorder (asynchronous collectives and DDP's own all-reduce included), or from
the wrappers where it is not used; the fake NCCL, asynchronous like the real one, stands in for a hung or
peer-blind NCCL. The worker is tests/python/watch_worker.py."""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Optional, Union

import pytest

from gg_testing import launch
from gg_testing.env import auto_env, scrubbed
from gg_testing.paths import ROOT
from gg_testing.procs import wait_all, wait_until

pytestmark = pytest.mark.wall_clock

WORKER = Path(__file__).with_name("watch_worker.py")
STALL_AFTER = 8  # not shorter: on CI's loaded machine ranks started or ran 3 s apart, a real stall to the watchdog
#                  (a report on collective #1, before the scenario's own stall)
REPORT_WITHIN = 2 * STALL_AFTER + 15  # the threshold, then the gather window (watch_worker: the threshold), + 15 s
HEALTHY_TIER_STEPS, HEALTHY_TIER_IDLE_S = 2000, 6  # all-reduces, then seconds idle: several ticks on any machine
# the node tier's stall: the collective after its healthy all-reduces, the barrier of every 100th, and a stage's 4
TIER_STALL_SEQ = HEALTHY_TIER_STEPS + HEALTHY_TIER_STEPS // 100 + 5


def worker_line(marker: str) -> int:
    """The line number of the worker's line containing `marker`."""
    for number, line in enumerate(WORKER.read_text().splitlines(), 1):
        if marker in line:
            return number
    raise AssertionError(marker)


class Job:
    """One torchrun job running the worker, its output in files: one agent for `nproc` ranks, or `agents` agents of
    `nproc` / `agents` ranks each, as on that many nodes (an agent whose worker dies leaves the others running).
    One agent runs 3 ranks: the stuck rank 2 and two that wait for it show every part of a report (the waiting
    ranks, the stuck one's stack, where each CPU waits); a fourth rank costs CI a rank's start-up (torch, and on
    torch 2.15 the first symbolisation, about 6 CPU-s) in each of these jobs, and says nothing more. The reports
    with a waiting rank after the stuck one (ranks 0, 1, 3) are the jobs of several agents (4 ranks)."""

    def __init__(self, scenario: str, tmp_path: Path, env: dict[str, str], agents: int = 1,
                 extra: tuple[str, ...] = (), prefix: tuple[str, ...] = (), nproc: int = 3) -> None:
        self.world = nproc
        self.dir = tmp_path / "reports"
        self.dir.mkdir()
        # the worker starts the watch after init_process_group: torch before 2.11 keeps no recorder entries unless
        # asked, so the job asks as gpuguard's warning says
        env = scrubbed({"TORCH_NCCL_TRACE_BUFFER_SIZE": "2000", **env, "WATCH_DIR": str(self.dir),
                        "GPUGUARD_WATCH_DIR": str(self.dir), "GPUGUARD_FAKE_NCCL_DIR": str(tmp_path / "nccl")})
        args = [str(WORKER), scenario, str(STALL_AFTER), *extra]
        if agents == 1:
            self.jobs = [launch.Job(launch.torchrun_argv(*args, nproc=nproc, prefix=prefix), env, tmp_path,
                                    name="agent0", cwd=str(ROOT), merge_output=True)]
        else:
            self.jobs = launch.torchrun_nodes(*args, nodes=agents, nproc=nproc // agents, env_of_node=lambda n: env,
                                              workdir=tmp_path, prefix=prefix, cwd=str(ROOT), merge_output=True)
        self.procs = [job.proc for job in self.jobs]

    def reports(self) -> dict[int, dict]:
        out = {}
        for path in self.dir.glob("gpuguard-stall-rank*-pid*.json"):
            text = path.read_text()
            if text.endswith("\n"):
                out[int(re.search(r"rank(\d+)", path.name).group(1))] = json.loads(text)
        return out

    def wait_for_reports(self, ranks: set[int], timeout: float = 150, seq: Optional[int] = None) -> "Snapshot":
        """Waits for each of `ranks` to report the scenario's stall (of collective `seq`, where given: a chained
        job's stage), then releases the stuck rank and returns the job as it was before (the next stage's stall
        starts at once); fails, naming what came, when they have not within `timeout` s of this call, nor within
        REPORT_WITHIN + 30 s of the stall's start (its mark): the job's start (torchrun, its ranks importing torch
        beside CI's other lane) is not the subject, and a release before the reports would make them describe a
        job that moved on. A "rank_slow" report is the loaded machine's, not the scenario's (no scenario stages
        one): a rank that got no CPU for the threshold while a peer completed the collective, reported truthfully;
        the scenario's report comes later and replaces it in the rank's file, so the wait goes on for that."""
        called = time.monotonic()

        def scenario_reports() -> dict[int, dict]:
            return {rank: report for rank, report in self.reports().items()
                    if report["gpuguard_stall"]["kind"] != "rank_slow"
                    and (seq is None or report["gpuguard_stall"]["seq"] == seq)}

        def out_of_time() -> bool:
            marks = list(self.dir.glob("stall_start*"))
            # no mark yet (a scenario that marks none, or a job still starting): the call's timeout alone
            since_stall = time.time() - min(float(m.read_text() or "inf") for m in marks) if marks else float("inf")
            return time.monotonic() - called > timeout and since_stall > REPORT_WITHIN + 30

        while not (ranks <= set(scenario_reports()) or all(p.poll() is not None for p in self.procs)):
            if out_of_time():
                kinds = {rank: r["gpuguard_stall"]["kind"] for rank, r in self.reports().items()}
                self.release()
                pytest.fail(f"ranks {sorted(ranks)} had not all reported the scenario's stall "
                            f"{time.monotonic() - called:.0f} s after the job started (reports so far, by rank: "
                            f"{kinds}):\n{self.output()[-6000:]}")
            time.sleep(0.5)
        # a rank writes its report's file, then prints the report in one write that ends with the file's JSON:
        # once every file's JSON is in the output, so is every report (bounded: the assertions say what is missing)
        texts = [p.read_text().strip() for p in self.dir.glob("gpuguard-stall-rank*-pid*.json")]
        wait_until(lambda: all(text in self.output() for text in texts if text), 10, what=None)
        snapshot = Snapshot(self.world, self.reports(), self.output(),
                            {rank: self.report_time(rank) for rank in ranks},
                            {mark.name: float(mark.read_text()) for mark in self.dir.glob("stall_start*")})
        self.release()
        return snapshot

    def output(self) -> str:
        return "\n".join(job.stdout() for job in self.jobs)

    def release(self) -> None:
        """Ends the stuck rank's hold where it has one, as hold.pid says (watch_worker.holding): its sleep
        (SIGUSR1 to watch_worker.until_released) or its stop (SIGCONT). The reports are in: the job may go on and
        end instead of waiting the hold out."""
        try:
            pid, *kind = (self.dir / "hold.pid").read_text().split()
            os.kill(int(pid), signal.SIGCONT if kind == ["stop"] else signal.SIGUSR1)
        except (OSError, ValueError):
            pass

    def end(self, timeout: float = 60) -> str:
        """Lets a job that finishes on its own finish; kills one that does not, with the workers a killed agent
        leaves behind (a stopped or hung rank). Returns the output."""
        wait_all(self.procs, timeout)
        for job in self.jobs:
            job.kill()
        return self.output()

    def stall_start(self, name: str = "stall_start") -> float:
        return float((self.dir / name).read_text())

    def report_time(self, rank: int) -> float:
        return next(self.dir.glob(f"gpuguard-stall-rank{rank}-pid*.json")).stat().st_mtime


@dataclass
class Snapshot:
    """A job as Job.wait_for_reports found it once every rank had reported: what the checks read from a Job (its
    reports, output, their times, the stall's start), kept while the job goes on to its next stall."""
    world: int
    saved_reports: dict[int, dict]
    saved_output: str
    report_times: dict[int, float]
    marks: dict[str, float]  # the stall's start, as the worker marked it (stall_start, or one per rank)

    def reports(self) -> dict[int, dict]:
        return self.saved_reports

    def output(self) -> str:
        return self.saved_output

    def report_time(self, rank: int) -> float:
        return self.report_times[rank]

    def stall_start(self, name: str = "stall_start") -> float:
        return self.marks[name]


def rank_reports(output: str, rank: int) -> list[str]:
    """The report rank `rank` printed: its first line and the indented lines that follow."""
    lines = output.splitlines()
    found = []
    for i, line in enumerate(lines):
        if line.startswith(f"[rank {rank}] gpuguard: collective stall:"):
            block = [line]
            for follow in lines[i + 1:]:
                if not follow.startswith("  "):
                    break
                block.append(follow)
            found.append("\n".join(block))
    return found


def check_on_every_rank(job: Union[Job, Snapshot], output: str, ranks: set[int], kind: str,
                        *needles: str) -> dict[int, dict]:
    reports = job.reports()
    assert ranks <= set(reports), output[-6000:]
    for rank in ranks:
        stall = reports[rank]["gpuguard_stall"]
        # the printed report of the stall in the rank's file (its last): a loaded machine's "rank_slow" report of
        # an earlier collective may come first (Job.wait_for_reports)
        first_line = f"[rank {rank}] " + stall["message"].splitlines()[0]
        printed = [text for text in rank_reports(output, rank) if text.splitlines()[0] == first_line]
        assert printed, f"rank {rank} did not print the report in its file ({first_line!r}):\n{output[-6000:]}"
        for needle in needles:
            assert needle in printed[-1], f"rank {rank}: {needle!r} not in:\n{printed[-1]}"
        assert stall["kind"] == kind
        assert stall["group"] == "default_pg" and stall["group_ranks"] == list(range(job.world))
    messages = {reports[r]["gpuguard_stall"]["message"] for r in ranks}
    assert len(messages) == 1, "every rank must print the same report"
    return reports


# A rank as watch() leaves it on a loaded machine: a truthful rank_slow report of an earlier collective, then the
# scenario's report, each written to its file and printed, then its hold, until the test's SIGUSR1.
TWO_REPORTS = """
import json, os, signal, sys, time
out = sys.argv[1]
signal.signal(signal.SIGUSR1, lambda *_: sys.exit(0))
with open(os.path.join(out, "hold.pid"), "w") as f:
    f.write(str(os.getpid()))
path = os.path.join(out, f"gpuguard-stall-rank0-pid{os.getpid()}.json")
for kind, message in (("rank_slow", "gpuguard: collective stall: every rank entered ALL_REDUCE #3 on group "
                                    "'default_pg' (ranks 0-3); rank 3 completed it, but ranks 0, 1, 2 have not"),
                      ("rank_behind", "gpuguard: collective stall: rank 2 never entered ALL_REDUCE #5 on group "
                                      "'default_pg' (ranks 0-3)\\n  the stack")):
    report = json.dumps({"gpuguard_stall": {"kind": kind, "message": message, "group": "default_pg",
                                            "group_ranks": [0, 1, 2, 3]}})
    with open(path, "w") as f:
        f.write(report + "\\n")
    print(f"[rank 0] {message}\\n[rank 0] gpuguard: the report as JSON: {path}\\n{report}", flush=True)
    time.sleep(1.5)
time.sleep(60)
"""


def test_the_helpers_wait_past_a_loaded_machines_rank_slow_report_for_the_scenarios(tmp_path):
    """CI of 054b1f9: a rank printed a rank_slow report of an earlier collective before the scenario's, and the
    check read the first printed report as the scenario's."""
    job = Job.__new__(Job)
    job.world = 4  # the canned reports' group
    job.dir = tmp_path / "reports"
    job.dir.mkdir()
    job.jobs = [launch.Job([sys.executable, "-c", TWO_REPORTS, str(job.dir)], scrubbed({}), tmp_path,
                           merge_output=True)]
    job.procs = [j.proc for j in job.jobs]
    assert job.wait_for_reports({0}, timeout=30).reports()[0]["gpuguard_stall"]["kind"] == "rank_behind"
    output = job.end(timeout=30)
    assert job.procs[0].returncode == 0, output  # released once the scenario's report came
    assert len(rank_reports(output, 0)) == 2
    check_on_every_rank(job, output, {0}, "rank_behind", "rank 2 never entered ALL_REDUCE #5", "the stack")


def assert_reported_in_time(job: Union[Job, Snapshot], ranks) -> None:
    """Each rank's report came within the stall threshold, the gather window and 15 s of the stall's start (the
    promise above; the worker's gather window is the threshold)."""
    late = {rank: round(job.report_time(rank) - job.stall_start(), 1) for rank in ranks}
    assert max(late.values()) <= REPORT_WITHIN, f"seconds from the stall's start to each rank's report: {late}"


def behind(job: Union[Job, Snapshot], output: str, marker: str, seq: int = 5) -> None:
    line = worker_line(marker)
    reports = check_on_every_rank(
        job, output, {0, 1, 2}, "rank_behind",
        f"rank 2 never entered ALL_REDUCE #{seq} on group 'default_pg' (ranks 0-2); ranks 0, 1 have waited in it",
        f"its last collective there was ALL_REDUCE #{seq - 1} (float32[4])",
        f'File "{WORKER}", line {line} in <module>')
    stall = reports[0]["gpuguard_stall"]
    assert (stall["seq"], stall["op"], stall["stuck_ranks"], stall["waiting_ranks"]) == (seq, "ALL_REDUCE", [2],
                                                                                          [0, 1])
    assert f"line {line} in <module>" in stall["stack"]
    assert_reported_in_time(job, range(3))


# The chained job: rank 2 stalls these ways one after another, each the 5th all-reduce of its stage (collectives 5,
# 10, 15, 20, 25), released by the test once every rank that can has reported (a stopped rank cannot); desync last,
# as nothing goes on after it. One job, not five: each job costs CI a torchrun agent and 3 ranks importing torch
# (about 20 CPU-s on torch 2.15), and a watch must report the next stall after one it reported, which only a job
# that goes on shows.
CHAIN = ("behind_python", "behind_gil", "async_wait", "stopped", "desync")
REPORTING = {"stopped": {0, 1}}  # the ranks that report a stage, where not all three
CHAIN_TIMEOUT_S = 600  # pytest-timeout's bound on its first test, which waits for the stages (49-62 s in CI for four)


@pytest.fixture(scope="module")
def chained(fake_gpus, tmp_path_factory) -> dict[str, Union[Snapshot, str]]:
    """Each stage of the chained job as its reports left it, or why they did not come."""
    job = Job(",".join(CHAIN), tmp_path_factory.mktemp("chained"), fake_gpus.env("h100x4"))
    stages: dict[str, Union[Snapshot, str]] = {}
    try:
        for number, scenario in enumerate(CHAIN, 1):
            try:
                stages[scenario] = job.wait_for_reports(REPORTING.get(scenario, {0, 1, 2}), seq=5 * number)
            except pytest.fail.Exception as failed:
                stages[scenario] = str(failed)
                break
    finally:
        job.end(timeout=1)
    for scenario in CHAIN:
        stages.setdefault(scenario, f"the chained job never reached {scenario}: an earlier stage failed")
    return stages


def stage(chained: dict[str, Union[Snapshot, str]], scenario: str) -> Snapshot:
    return arrived(chained[scenario])


def arrived(got: Union[Snapshot, str]) -> Snapshot:
    """A chained job's stage as it came, or its test's failure naming why it did not."""
    if isinstance(got, str):
        pytest.fail(got, pytrace=False)
    return got


def healthy_stage(job: Job, stage: str, what: str) -> Union[Snapshot, str]:
    """A job's healthy stage as it was once every rank printed "rank R: <stage> done," (the stall stages after it go
    on), or why it did not get there: the job ended, or still ran at the bound."""
    ended = wait_until(lambda: all(f"rank {rank}: {stage} done," in job.output() for rank in range(job.world))
                       or any(p.poll() is not None for p in job.procs), CHAIN_TIMEOUT_S / 2, what=None)
    if ended and all(p.poll() is None for p in job.procs):
        return Snapshot(job.world, job.reports(), job.output(), {}, {})
    return (f"{what} {'ended' if ended else 'was still running'} before every rank ended its healthy steps:\n"
            f"{job.output()[-6000:]}")


@pytest.mark.follows_torch
@pytest.mark.slow
@pytest.mark.timeout(CHAIN_TIMEOUT_S)
def test_rank_behind_sleeping_in_python_is_named_with_its_stack(fake_gpus, chained):
    job = stage(chained, "behind_python")
    behind(job, job.output(), "# rank 2 sleeps here", seq=5)
    # report mode must never stop the job: it went on, and rank 2 stalled again
    assert isinstance(chained["behind_gil"], Snapshot), chained["behind_gil"]
    # what the job printed is what `gpuguard explain` is pasted: it reads the stall report back
    explained = subprocess.run([sys.executable, "-m", "gpuguard", "explain", "-"], input=job.output(), text=True,
                               capture_output=True, env=scrubbed(fake_gpus.env("h100x4")), timeout=120)
    assert explained.returncode == 0, explained.stderr
    assert "Rank 2 never entered ALL_REDUCE #5 on group 'default_pg'" in explained.stdout, explained.stdout


RECORDER = "(progress from torch {}'s flight recorder (gloo): a collective is complete when torch says it completed)"


def torch_version() -> str:
    import torch
    return torch.__version__.split("+")[0]


def gloo_recorder_missing() -> str:
    """Why gpuguard cannot read torch's flight recorder for gloo, the backend these jobs run on ('' when it can):
    then the watchdog follows the wrappers of the Python collective functions, and cannot see DDP's reducer."""
    from gpuguard._libtorch_loader import libtorch
    from gpuguard.watchdog.recorder import read_flight_recorder
    try:
        read_flight_recorder(libtorch().flight_recorder_reader(), "gloo")
    except RuntimeError as exc:
        return str(exc)
    return ""


def progress_note() -> str:
    """The last line of a report on this torch: the recorder's, or the wrappers' and why the recorder is not used."""
    missing = gloo_recorder_missing()
    if not missing:
        return RECORDER.format(torch_version())
    return (f"(progress from gpuguard's wrappers of torch.distributed's collective functions and w.collective(): "
            f"complete when the call returned, when an async_op work completed, or when the CUDA event after a "
            f"w.collective(stream=...) did; torch's flight recorder is not used: backend 'gloo': {missing})")


@pytest.mark.follows_torch
@pytest.mark.slow
@pytest.mark.timeout(CHAIN_TIMEOUT_S)
def test_async_all_reduce_left_waiting_by_a_sleeping_rank_is_reported_from_the_flight_recorder(chained):
    # the shape of every NCCL collective: the call returns at once, the CPU waits later (here in work.wait())
    job = stage(chained, "async_wait")
    output = job.output()
    issued, waits = worker_line("# the async_wait all-reduce"), worker_line("# the others' CPU waits here")
    reports = check_on_every_rank(
        job, output, {0, 1, 2}, "rank_behind",
        "rank 2 never entered ALL_REDUCE #15 on group 'default_pg' (ranks 0-2); ranks 0, 1 have waited in it",
        f"ranks 0, 1 issued it at {WORKER}:{issued}; their CPU waits now: rank 0 at {WORKER}:{waits} in <module>",
        f"rank 2 is at {WORKER}:{worker_line('# rank 2 sleeps (async scenario)')} in <module>:",
        progress_note())
    stall = reports[2]["gpuguard_stall"]
    assert stall["issued_at"] == f"{WORKER}:{issued}" and stall["cpu_at"]["1"] == f"{WORKER}:{waits} in <module>"
    assert_reported_in_time(job, range(3))
    assert "gpuguard-watch-sites" not in output and "recorder.py" not in stall["stack"], "our own thread is no news"


# The DDP job: the healthy loop, then rank 2 sleeping before a backward, one after the other on one model. One job,
# not two: each costs CI a torchrun agent and 3 ranks importing torch and building DDP (which imports Dynamo, about
# 2.5 CPU-s a rank on torch 2.15), and a watch quiet through the healthy steps must still report the stall after them.
HEALTHY_DDP_STEPS = 300


@dataclass
class DdpChain:
    """The DDP job as each of its two stages left it, or why a stage did not come."""
    healthy: Union[Snapshot, str]  # once every rank printed the end of its healthy steps
    stall: Union[Snapshot, str]  # once every rank reported the stall; without the recorder, its threshold + 10 s on
    output: str  # the whole job's, once it ended
    returncode: Optional[int]


@pytest.fixture(scope="module")
def ddp_chained(fake_gpus, tmp_path_factory) -> DdpChain:
    job = Job("healthy_ddp,ddp", tmp_path_factory.mktemp("ddp"), fake_gpus.env("h100x4"),
              extra=(str(HEALTHY_DDP_STEPS),))
    stall: Union[Snapshot, str] = "the DDP job never reached its stall: its healthy steps did not end"
    try:
        # no stall report can be in the healthy snapshot: rank 2 stalls 3 steps later, and reports come its
        # threshold after that
        healthy = healthy_stage(job, "healthy_ddp", "the DDP job")
        if isinstance(healthy, Snapshot):
            stall = ddp_stall(job)
    finally:
        output = job.end(timeout=300 if isinstance(stall, Snapshot) else 1)  # released: it ends by itself
    return DdpChain(healthy, stall, output, job.procs[0].returncode)


def ddp_stall(job: Job) -> Union[Snapshot, str]:
    """The stall's reports; where the recorder cannot be read (DDP's reducer calls C++ directly, so no wrapper sees
    its all-reduce), the job once rank 2 has held it for the threshold and 10 s more (several ticks, in which a
    report would have come), released."""
    if not gloo_recorder_missing():
        try:
            return job.wait_for_reports({0, 1, 2})
        except pytest.fail.Exception as failed:
            return str(failed)
    if not wait_until(lambda: (job.dir / "stall_start").exists(), 150, what=None):
        return "rank 2 never started its stall"
    time.sleep(max(0.0, job.stall_start() + STALL_AFTER + 10 - time.time()))
    snapshot = Snapshot(job.world, job.reports(), job.output(), {}, {"stall_start": job.stall_start()})
    job.release()
    return snapshot


@pytest.mark.follows_torch
@pytest.mark.slow
@pytest.mark.timeout(CHAIN_TIMEOUT_S)
def test_ddp_gradient_all_reduce_waiting_for_a_sleeping_rank_is_named_as_ddps(ddp_chained):
    job = arrived(ddp_chained.stall)
    missing = gloo_recorder_missing()
    if missing:  # the subject is a stall that goes unreported, and rank 0 saying why
        assert not job.reports() and "collective stall" not in job.output(), job.output()[-4000:]
        assert "collective stall" not in ddp_chained.output, ddp_chained.output[-4000:]  # nor once it went on
        assert (f"gpuguard.watch: torch's flight recorder is not used (backend 'gloo': {missing}), so progress "
                f"comes from gpuguard's wrappers of torch.distributed's Python collective functions: a stall in a "
                f"collective issued from C++ (DDP's gradient all-reduce, FSDP's all-gathers and reduce-scatters) "
                f"is not reported") in ddp_chained.output, ddp_chained.output[-4000:]
        return
    backward = worker_line("# DDP's reducer all-reduces the gradients in here")
    reports = check_on_every_rank(
        job, job.output(), {0, 1, 2}, "rank_behind", "rank 2 never entered ALL_REDUCE #",
        f"ranks 0, 1 issued it at {WORKER}:{backward} (the backward pass: DDP's gradient all-reduce, from its C++ "
        f"reducer); their CPU waits now: rank 0 at ",
        f"_engine_run_backward, called from {WORKER}:{backward} in <module>",
        f"rank 2 is at {WORKER}:{worker_line('# rank 2 sleeps before its backward')} in <module>:")
    assert reports[0]["gpuguard_stall"]["stuck_ranks"] == [2]
    assert_reported_in_time(job, range(3))


@pytest.mark.slow
def test_without_the_flight_recorder_the_wrappers_see_an_async_all_reduce_and_say_so(fake_gpus, tmp_path):
    # what a torch without the recorder's group status gets (GPUGUARD_WATCH_SOURCE=wrappers forces it here)
    job = Job("async_wait", tmp_path, fake_gpus.env("h100x4", GPUGUARD_WATCH_SOURCE="wrappers"))
    job.wait_for_reports({0, 1, 2})
    output = job.end()
    check_on_every_rank(
        job, output, {0, 1, 2}, "rank_behind",
        "rank 2 never entered ALL_REDUCE #5 on group 'default_pg' (ranks 0-2)",
        f"ranks 0, 1 issued it at {WORKER}:{worker_line('# the async_wait all-reduce')};",
        "(progress from gpuguard's wrappers of torch.distributed's collective functions and w.collective(): "
        "complete when the call returned, when an async_op work completed, or when the CUDA event after a "
        "w.collective(stream=...) did; torch's flight recorder is not used: GPUGUARD_WATCH_SOURCE=wrappers)")


@pytest.mark.slow
def test_gpuguard_run_with_gpuguard_watch_takes_the_same_path(fake_gpus, tmp_path):
    env = auto_env(fake_gpus.env("h100x4"), GPUGUARD_WATCH="1", GPUGUARD_STALL_AFTER=str(STALL_AFTER))
    env.pop("GPUGUARD")  # `gpuguard run` sets it
    job = Job("async_wait", tmp_path, env, prefix=("-m", "gpuguard", "run", "--", sys.executable))
    job.wait_for_reports({0, 1, 2})
    output = job.end()
    assert "+ a collective watchdog (GPUGUARD_WATCH)" in output, output[-3000:]
    check_on_every_rank(
        job, output, {0, 1, 2}, "rank_behind",
        "rank 2 never entered ALL_REDUCE #5 on group 'default_pg' (ranks 0-2)",
        f"ranks 0, 1 issued it at {WORKER}:{worker_line('# the async_wait all-reduce')};",
        progress_note())


@pytest.mark.follows_torch
@pytest.mark.slow
@pytest.mark.timeout(CHAIN_TIMEOUT_S)
def test_healthy_ddp_loop_never_reports(ddp_chained):
    healthy = arrived(ddp_chained.healthy)
    assert "collective stall" not in healthy.output()
    for rank in range(3):
        assert f"rank {rank}: healthy_ddp done, 0 reports" in healthy.output(), healthy.output()[-4000:]
    assert not healthy.reports()
    # and the job went on, through the stall once released, to its end
    assert ddp_chained.returncode == 0, ddp_chained.output[-4000:]


@pytest.mark.slow
@pytest.mark.timeout(CHAIN_TIMEOUT_S)
def test_rank_behind_blocked_in_c_holding_the_gil_is_named_with_its_stack(chained):
    job = stage(chained, "behind_gil")
    behind(job, job.output(), "# a C call that keeps the GIL", seq=10)


@pytest.mark.slow
def test_on_stall_raise_ends_every_rank_with_the_report_and_exit_code_75(fake_gpus, tmp_path):
    job = Job("behind_python", tmp_path, fake_gpus.env("h100x4", ON_STALL="raise"))
    output = job.end(timeout=150)
    assert rank_reports(output, 0), output[-4000:]
    assert "[rank 0] gpuguard: on_stall='raise': ending this process with exit code 75" in output
    assert "exitcode: 75" in output and job.procs[0].returncode != 0
    assert "rank 2: done" not in output


@pytest.mark.follows_torch
@pytest.mark.slow
@pytest.mark.timeout(CHAIN_TIMEOUT_S)
def test_desync_names_both_collectives(chained):
    job = stage(chained, "desync")
    reports = check_on_every_rank(
        job, job.output(), {0, 1, 2}, "desync",
        "desync on collective #25 of group 'default_pg' (ranks 0-2)",
        f"ranks 0, 1 called ALL_REDUCE #25 (float32[4]) at "
        f"{WORKER}:{worker_line('# the async all-reduce of the scenarios')}",
        f"rank 2 called BROADCAST #25 (float32[4]) at {WORKER}:{worker_line('dist.broadcast(t, src=0')}")
    assert reports[1]["gpuguard_stall"]["stuck_ranks"] == [2]


@pytest.mark.slow
@pytest.mark.timeout(CHAIN_TIMEOUT_S)
def test_stopped_rank_is_named_unreachable(chained):
    job = stage(chained, "stopped")
    reports = check_on_every_rank(job, job.output(), {0, 1}, "rank_gone",
                                  "rank 2 of ALL_REDUCE #20 on group 'default_pg' (ranks 0-2) is gone or unreachable",
                                  ") is stopped (SIGSTOP or a debugger)", "ranks 0, 1 have waited in ALL_REDUCE #20")
    assert reports[0]["gpuguard_stall"]["gone_ranks"] == [2]
    assert_reported_in_time(job, [0])
    # continued, it caught up: the job went on to the desync after it
    assert isinstance(chained["desync"], Snapshot), chained["desync"]


def tier_pages() -> set[Path]:
    """The node tier's pages on this machine now (node_tier.py names them)."""
    from gpuguard.watchdog.node_tier import PAGE_PREFIX, page_directory
    return set(Path(page_directory()).glob(PAGE_PREFIX + "*"))


# The node tier's job: two nodes of two ranks, the healthy loop, then rank 2, which leads the second node's
# watchdogs, stopping itself. One job, not two: each costs CI two torchrun agents and 4 ranks importing torch, and a
# tier that was quiet through the healthy steps must still report the stall after them.
@dataclass
class TierChain:
    """The node tier's job as each of its two stages left it, or why a stage did not come."""
    healthy: Union[Snapshot, str]  # once every rank printed the end of its healthy steps (and counts)
    stopped: Union[Snapshot, str]  # once ranks 0, 1, 3 reported the stopped leader
    output: str  # the whole job's, once it ended
    returncodes: list[Optional[int]]  # each agent's
    pages_left: set[Path]  # the tier's pages the job left on this machine (removed since)


@pytest.fixture(scope="module")
def node_tier_chained(fake_gpus, tmp_path_factory) -> TierChain:
    pages_before = tier_pages()
    job = Job("healthy,stopped", tmp_path_factory.mktemp("tier"),
              dict(fake_gpus.env("h100x4"), GPUGUARD_WATCH_NODE_TIER="1"), agents=2, nproc=4,
              extra=(str(HEALTHY_TIER_STEPS), str(HEALTHY_TIER_IDLE_S)))
    stopped: Union[Snapshot, str] = "the node tier's job never stopped its leader: its healthy steps did not end"
    try:
        # no stall report can be in the healthy snapshot: rank 2 stops 4 all-reduces later, and reports come its
        # threshold after that
        healthy = healthy_stage(job, "healthy", "the node tier's job")
        if isinstance(healthy, Snapshot):
            try:
                stopped = job.wait_for_reports({0, 1, 3})
            except pytest.fail.Exception as failed:
                stopped = str(failed)
    finally:
        output = job.end(timeout=120 if isinstance(stopped, Snapshot) else 1)  # continued: it ends by itself
    left = tier_pages() - pages_before
    for page in left:
        page.unlink()  # a killed job's leaders: a later leader would remove their pages after 10 idle minutes
    return TierChain(healthy, stopped, output, [p.returncode for p in job.procs], left)


@pytest.mark.slow
@pytest.mark.timeout(CHAIN_TIMEOUT_S)
def test_node_tier_a_stopped_leader_leaves_its_node_asking_the_store_and_every_rank_reports(node_tier_chained):
    # rank 2 leads the second node's watchdogs, and stops itself; rank 3 then finds its leader's answer too old,
    # asks the store itself, and reports like ranks 0 and 1
    job = arrived(node_tier_chained.stopped)
    seq = job.reports()[0]["gpuguard_stall"]["seq"]
    assert seq == TIER_STALL_SEQ, job.reports()[0]
    reports = check_on_every_rank(job, job.output(), {0, 1, 3}, "rank_gone",
                                  f"rank 2 of ALL_REDUCE #{seq} on group 'default_pg' (ranks 0-3) is gone or "
                                  f"unreachable", ") is stopped (SIGSTOP or a debugger)",
                                  f"ranks 0, 1, 3 have waited in ALL_REDUCE #{seq}")
    assert reports[3]["gpuguard_stall"]["gone_ranks"] == [2]
    # the tier adds at most its leader's three ticks (1 s each) to the follower's report
    assert job.report_time(3) - job.stall_start() <= REPORT_WITHIN
    # continued, the leader led its node again: every rank ended the job
    assert node_tier_chained.returncodes == [0, 0], node_tier_chained.output[-4000:]


@pytest.mark.slow
@pytest.mark.timeout(CHAIN_TIMEOUT_S)
def test_node_tier_healthy_followers_read_their_leader_instead_of_the_store(node_tier_chained):
    healthy = arrived(node_tier_chained.healthy)
    output = healthy.output()
    assert "collective stall" not in output and not healthy.reports()
    counts = {int(m[0]): tuple(int(x) for x in m[1:]) for m in re.findall(
        r"rank (\d+): healthy done, (\d+) store operations, (\d+) reports, (\d+) relayed, (\d+) unrelayed ticks",
        output)}
    assert set(counts) == {0, 1, 2, 3}, output[-4000:]
    for leader in (0, 2):  # local rank 0 of each node asks every tick, and relays nothing
        ops, _, relayed, unrelayed = counts[leader]
        assert ops >= 5 and relayed == unrelayed == 0, counts
    for follower in (1, 3):  # the others ask the store once (their hello) and then only while no answer was there
        ops, _, relayed, unrelayed = counts[follower]
        # most ticks relayed: on a loaded machine a leader's late tick leaves a follower asking the store itself
        assert relayed >= 4 and ops == 1 + unrelayed and unrelayed < relayed / 2, counts
    # and once the job ended (through the stall, continued), no page was left
    assert node_tier_chained.returncodes == [0, 0], node_tier_chained.output[-4000:]
    assert not node_tier_chained.pages_left, \
        f"each leader removes its node's page when its watch stops: {node_tier_chained.pages_left}"


@pytest.mark.slow
def test_killed_rank_is_named_gone_with_its_host(fake_gpus, tmp_path):
    job = Job("killed", tmp_path, fake_gpus.env("h100x4"), agents=4, nproc=4)
    job.wait_for_reports({0, 1, 3})
    output = job.end(timeout=1)
    check_on_every_rank(job, output, {0, 1, 3}, "rank_gone",
                        f"rank 2 ({socket.gethostname()}, pid ",
                        ") is gone: it died (look for an OOM kill, a crash or a signal in its log)")
    assert job.report_time(0) - job.stall_start() <= REPORT_WITHIN


@pytest.mark.slow
def test_everyone_in_a_hung_nccl_all_reduce_points_at_the_fabric(fake_gpus, tmp_path):
    # NCCL called directly (a PyNccl communicator), marked with w.collective(stream=...): the all-reduce returns
    # at once, as on a GPU; the CUDA event the watchdog records after it never completes
    job = Job("nccl_hang", tmp_path, fake_gpus.env("h100x4_nccl_hang_all_reduce"))
    job.wait_for_reports({0, 1, 2})
    output = job.end(timeout=1)
    # with the recorder, the marked collectives are numbered apart from gloo's; the wrappers number both together
    # (the job's 4 gloo all-reduces come first)
    number = 5 if gloo_recorder_missing() else 1
    reports = check_on_every_rank(
        job, output, {0, 1, 2}, "no_progress",
        f"every rank entered ALL_REDUCE #{number} on group 'default_pg' (ranks 0-2) and it has not completed on any of them",
        "run `gpuguard doctor --p2p --nccl`", "NCCL_P2P_DISABLE=1",
        f"ranks 0-2 issued it at {WORKER}:{worker_line('with w.collective(')}; their CPU waits now: rank 0 at ",
        "fake_pynccl.py:", f", called from {WORKER}:{worker_line('# the CPU waits here, as in torch.cuda')} in "
        "nccl_all_reduce",
        "(progress from w.collective(): complete when its block ended, or when the CUDA event recorded on the "
        "stream after a w.collective(stream=...) block did)" if not gloo_recorder_missing() else progress_note())
    assert reports[0]["gpuguard_stall"]["waiting_ranks"] == [0, 1, 2]
    assert job.report_time(0) - job.stall_start("stall_start.0") <= REPORT_WITHIN


@pytest.mark.slow
def test_healthy_loop_never_reports(fake_gpus, tmp_path):
    # the 10,000-step loop, all-reducing as fast as gloo goes, on 2 ranks: the watchdog's checks are those of
    # 4 (one store key per rank, the same verdicts), and 4 ranks spinning on CI's 2 cores were its costliest test
    # (94 CPU seconds), starving every other test for two minutes
    steps = 10000
    job = Job("healthy", tmp_path, fake_gpus.env("h100x4"), extra=(str(steps),), nproc=2)
    output = job.end(timeout=300)
    assert job.procs[0].returncode == 0, output[-4000:]
    assert "collective stall" not in output
    for rank in range(2):
        assert re.search(rf"rank {rank}: healthy done, \d+ store operations, 0 reports,", output), output[-4000:]
    assert not job.reports()


WATCH_ONE_RANK = """
import datetime, json, torch, torch.distributed as dist, gpuguard
from gpuguard.watchdog import watcher
server = dist.TCPStore("127.0.0.1", 0, 1, True, wait_for_workers=False)
binding = gpuguard.bind(watch=True)
started_before_init = watcher._active is not None and watcher._active._dog is None
wrapped_before_init = hasattr(dist.all_reduce, "__gpuguard_original__")
dist.init_process_group("gloo", store=server, rank=0, world_size=1, timeout=datetime.timedelta(seconds=30))
w = watcher._active
started_at_init = w._dog is not None  # right after init_process_group, before any collective
dist.all_reduce(torch.ones(2))
print(json.dumps({"lazy": started_before_init, "wrapped_before": wrapped_before_init, "at_init": started_at_init,
                  "threshold": w.stall_threshold_s, "tick": w.tick_s, "ops": w.store_ops,
                  "recorder": w.source.reader is not None,
                  "wrapped_after": hasattr(dist.all_reduce, "__gpuguard_original__")}))
w.stop()
print(json.dumps({"restored": not hasattr(dist.all_reduce, "__gpuguard_original__")
                  and not hasattr(dist.init_process_group, "__gpuguard_original__")}))
"""


@pytest.mark.follows_torch
def test_bind_watch_starts_at_init_with_the_adaptive_floor_and_stop_restores(fake_gpus):
    proc = subprocess.run([sys.executable, "-c", WATCH_ONE_RANK], env=scrubbed(fake_gpus.env("h100x1")),
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    first, second = (json.loads(line) for line in proc.stdout.strip().splitlines()[-2:])
    assert first["lazy"] and first["wrapped_before"] and first["at_init"] and first["ops"] >= 1, first
    # torch's flight recorder sees every collective: the wrappers are put back once it is read (kept without it)
    recorder = not gloo_recorder_missing()
    assert first["recorder"] == recorder and first["wrapped_after"] == (not recorder), first
    assert first["threshold"] == 60.0  # adaptive: nothing seen yet, so the floor
    assert first["tick"] == 1.0  # bind(watch=True) gives no tick: a job this size checks every second
    assert second == {"restored": True}


FIRST_SYMBOLISATION = """
import datetime, json, os, sys, time, torch, torch.distributed as dist, gpuguard
from gpuguard.watchdog.recorder import site_of
server = dist.TCPStore("127.0.0.1", 0, 1, True, wait_for_workers=False)
os.environ.setdefault("TORCH_NCCL_TRACE_BUFFER_SIZE", "2000")
dist.init_process_group("gloo", store=server, rank=0, world_size=1, timeout=datetime.timedelta(seconds=30))
modules = len(sys.modules)
w = gpuguard.watch(store=server, tick=0.2, report_dir=sys.argv[1])
in_watch = len(sys.modules) - modules
t = torch.ones(2)
for _ in range(50):
    dist.all_reduce(t)
time.sleep(1.0)  # fixed on purpose: 5 ticks after the collectives, in which nothing may ask for a call site
answered, modules = w._sites.answered, len(sys.modules)
started = time.monotonic()
site = site_of("gloo", "0", 50)  # what a report about the 50th all-reduce reads
print(json.dumps({"in_watch": in_watch, "answered": answered, "imported_by_a_report": len(sys.modules) - modules,
                  "site": site, "report_s": time.monotonic() - started, "reports": w.reports}))
w.stop()
"""


@pytest.mark.follows_torch
def test_watch_pays_the_slow_first_symbolisation_itself_before_the_job_trains(fake_gpus, tmp_path):
    # torch's first symbolisation of stack traces imports 908 modules (torch 2.15: torch._inductor among them), 1-3 s
    # holding the GIL. Paid by the helper thread at the first collective, it stopped the training thread that long
    # (bench_watch_cost.py's probe: 2.0-2.6 s); paid by a report, it lost the report its call sites. watch() pays it.
    if gloo_recorder_missing():
        pytest.skip(f"no flight recorder for gloo here: {gloo_recorder_missing()}")
    proc = subprocess.run([sys.executable, "-c", FIRST_SYMBOLISATION, str(tmp_path)],
                          env=scrubbed(fake_gpus.env("h100x1")), capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result["in_watch"] > 100, result  # the symbolizer's imports, inside watch()
    # a healthy job: nothing asked for a call site, so gpuguard took the GIL for none; a report imports nothing more
    assert (result["answered"], result["imported_by_a_report"], result["reports"]) == (0, 0, 0), result
    assert result["site"] == "<string>:12", result


@pytest.mark.follows_torch
@pytest.mark.parametrize("version, asked", [("2.6.0+cu124", True), ("2.10.0", True), ("2.11.0", False),
                                             ("2.15.0+cu132", False)])
def test_a_torch_whose_recorder_keeps_nothing_unasked_is_asked_before_init_and_named_after(monkeypatch, version,
                                                                                          asked):
    import torch
    from gpuguard.watchdog import recorder
    monkeypatch.setattr(torch, "__version__", version)
    environ: dict[str, str] = {}
    assert recorder.ask_torch_to_record(environ) is asked
    assert environ == ({"TORCH_NCCL_TRACE_BUFFER_SIZE": "2000"} if asked else {})
    assert recorder._buffer_off(environ) is None  # asked (or not needed): the recorder is read
    late = recorder._buffer_off({})  # the process group came first, nobody asked
    if not asked:
        assert late is None
    else:
        assert late == (f"torch {version.split('+')[0]} keeps no flight recorder entries unless "
                        f"TORCH_NCCL_TRACE_BUFFER_SIZE is set (from torch 2.11 it keeps 2000), and the process group "
                        f"existed before gpuguard.watch() could set it: set TORCH_NCCL_TRACE_BUFFER_SIZE=2000 in the "
                        f"job's environment, or start the watch before init_process_group (bind(watch=True) does)")
    set_by_user = {"TORCH_NCCL_TRACE_BUFFER_SIZE": "0"}
    assert not recorder.ask_torch_to_record(set_by_user) and set_by_user == {"TORCH_NCCL_TRACE_BUFFER_SIZE": "0"}
    assert recorder._buffer_off(set_by_user) == "TORCH_NCCL_TRACE_BUFFER_SIZE=0 turns torch's flight recorder off"


def test_arguments_are_checked():
    from gpuguard.watchdog.watcher import _check_arguments
    with pytest.raises(ValueError, match=r"stall_after=0: give the seconds a collective may wait"):
        _check_arguments(0, "report", 1, 5)
    with pytest.raises(ValueError, match=r"on_stall='abort': use 'report' .* or 'raise'"):
        _check_arguments(None, "abort", 1, 5)


def test_a_store_the_thread_cannot_reach_without_python_is_refused(tmp_path):
    import torch.distributed as dist
    from gpuguard.watchdog.watcher import _store_address
    with pytest.raises(ValueError, match=r"needs the job's TCPStore .* the store is a FileStore"):
        _store_address(dist.FileStore(str(tmp_path / "store"), 1))
    server = dist.TCPStore("127.0.0.1", 0, 1, True, wait_for_workers=False)
    assert _store_address(dist.PrefixStore("default_pg", server)) == ("127.0.0.1", server.port)


def test_the_stack_dumper_reads_this_thread_or_says_why_it_cannot():
    from gpuguard import _core
    from gpuguard.watchdog import stacks

    assert stacks.arm() is None  # 3.11, 3.12: nothing to do; 3.10, 3.13: faulthandler's handler for SIGRTMAX-2
    text = _core.dump_python_stacks()
    assert f'File "{__file__}"' in text and "test_the_stack_dumper_reads_this_thread" in text, text
    if sys.version_info[:2] in ((3, 11), (3, 12)):  # the versions whose libpython exports the dumper
        return
    # before arm(), in a fresh interpreter: the report says why it has no stack
    probe = "from gpuguard import _core; print(_core.dump_python_stacks(), end='')"
    unarmed = subprocess.run([sys.executable, "-c", probe],
                             capture_output=True, text=True, timeout=60, env=dict(os.environ))
    assert unarmed.stdout == (f"(no stack: Python {sys.version.split()[0]} does not export _Py_DumpTracebackThreads, "
                              f"which gpuguard needs to read stacks without the GIL, and faulthandler's signal "
                              f"handler was not registered in its place)\n"), unarmed.stderr


def test_the_default_tick_keeps_a_whole_jobs_checks_within_one_stores_reach():
    """One check per rank per tick; bench_scale.py measured ~105,000 requests/s on one TCPStore's thread."""
    from gpuguard.watchdog.watcher import JOB_CHECKS_PER_S, default_tick

    assert [default_tick(n) for n in (1, 8, 16_384, 20_000)] == [1.0] * 4  # nothing changes below 20,000 ranks
    assert (default_tick(40_000), default_tick(100_000)) == (2.0, 5.0)
    for n in (1, 1_000, 16_384, 50_000, 100_000, 1_000_000):
        assert n / default_tick(n) <= JOB_CHECKS_PER_S


TORCHRUN_NODE = {"TORCHELASTIC_RUN_ID": "job", "RANK": "5", "WORLD_SIZE": "8", "LOCAL_RANK": "1",
                 "LOCAL_WORLD_SIZE": "4", "GROUP_RANK": "1"}


def test_the_node_tier_is_chosen_by_argument_then_variable_then_size():
    from gpuguard.watchdog.node_tier import VARIABLE, wanted
    assert wanted(True, 8, 20_000, {VARIABLE: "0"}) and not wanted(False, 10**6, 20_000, {VARIABLE: "1"})
    assert wanted(None, 8, 20_000, {VARIABLE: "1"}) and not wanted(None, 10**6, 20_000, {VARIABLE: "0"})
    assert not wanted(None, 20_000, 20_000, {}) and wanted(None, 20_001, 20_000, {})  # nothing changes below
    with pytest.raises(ValueError, match=r"GPUGUARD_WATCH_NODE_TIER='yes': use 1 \(each node's leader asks the "
                                         r"store for its node\), 0 \(every rank asks\), or leave it unset"):
        wanted(None, 8, 20_000, {VARIABLE: "yes"})


def place(store_host, store_port, prefix, environ):
    """The node tier's place for a rank whose launcher set ``environ``, read as gpuguard.watch() hands it over."""
    from gpuguard.binding.launchers import detect
    from gpuguard.watchdog import node_tier
    return node_tier.place(store_host, store_port, prefix, lambda: detect(environ))


def test_the_ranks_of_one_node_share_one_page_and_local_rank_0_writes_it():
    follower = place("10.0.0.1", 29500, "gpuguard/watch/job/0/1/", TORCHRUN_NODE)
    leader = place("10.0.0.1", 29500, "gpuguard/watch/job/0/1/", dict(TORCHRUN_NODE, RANK="4", LOCAL_RANK="0"))
    other_node = place("10.0.0.1", 29500, "gpuguard/watch/job/0/1/", dict(TORCHRUN_NODE, RANK="0", LOCAL_RANK="0",
                                                                           GROUP_RANK="0"))
    other_watch = place("10.0.0.1", 29500, "gpuguard/watch/job/0/2/", TORCHRUN_NODE)
    assert follower is not None and leader is not None and other_node is not None and other_watch is not None
    assert (follower.leader, leader.leader, follower.local_world_size) == (False, True, 4)
    assert follower.path == leader.path and os.path.basename(leader.path).startswith("gpuguard-watch-")
    assert other_node.path != leader.path  # two agents on one host are two nodes
    assert other_watch.path != leader.path  # a later watch() never reads an earlier one's page


def test_no_tier_where_the_launcher_does_not_say_who_shares_the_node(caplog):
    alone = dict(TORCHRUN_NODE, LOCAL_WORLD_SIZE="1", LOCAL_RANK="0", WORLD_SIZE="2", RANK="1")
    assert place("h", 1, "p/", alone) is None  # one rank on its node: nothing to share
    with caplog.at_level("WARNING", logger="gpuguard"):
        assert place("h", 1, "p/", {"RANK": "1", "WORLD_SIZE": "8", "LOCAL_RANK": "1"}) is None
        assert place("h", 1, "p/", {"RANK": "1", "WORLD_SIZE": "8"}) is None
    assert ("gpuguard.watch: no per-node tier: the launcher (env) does not say which ranks share this node (no local "
            "rank and local world size); every rank asks the job's store") in caplog.text
    assert "gpuguard.watch: no per-node tier: This process looks started by environment variables" in caplog.text


def test_watch_refuses_a_node_tier_it_cannot_read(monkeypatch):
    monkeypatch.setenv("GPUGUARD_WATCH_NODE_TIER", "on")
    with pytest.raises(ValueError, match="GPUGUARD_WATCH_NODE_TIER='on'"):
        gpuguard_watch()
    monkeypatch.delenv("GPUGUARD_WATCH_NODE_TIER")
    with pytest.raises(ValueError, match=r"node_tier='yes': give True, False or None"):
        gpuguard_watch(node_tier="yes")


def gpuguard_watch(**kwargs):
    from gpuguard.watchdog.watcher import watch
    return watch(**kwargs)
