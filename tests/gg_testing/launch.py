"""The one job launcher of the test suite: a command (torchrun's agent, srun, mpirun, `gpuguard run`, a driver
script) in a session of its own, its stdout and stderr in files, its ranks' results in a folder of their own.

Each rank writes its result with gg_testing.rank.write_result into GG_TEST_RESULTS (one file per rank, written
whole), so no test parses results out of output that several ranks share. The job is ended whole: its process
group (killpg), then every process that carries its mark in the environment (torchrun's workers run in sessions
of their own, so a killed agent would leave them running). Jobs still running when a test ends are ended by the
conftests' autouse fixture (reap_all), so no test leaves a process behind.
"""

from __future__ import annotations

import json
import os
import secrets
import signal
import subprocess
import sys
import textwrap
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable, Optional, Sequence

from .paths import TESTS
from .ports import free_port
from .procs import JOB_MARK, kill_group, kill_marked, wait_all
from .rank import RESULTS_VARIABLE

#: The default bound on one job: every job of the suite ends (or is stopped) well within it on a loaded machine.
TIMEOUT = 240

_live: list["Job"] = []


@dataclass
class Finished:
    """An ended job: what subprocess.run would return, and each rank's result by rank."""
    argv: list[str]
    returncode: Optional[int]
    stdout: str
    stderr: str
    ranks: dict[int, dict] = field(default_factory=dict)
    rank_stdout: dict[int, str] = field(default_factory=dict)  # with torchrun_argv(logs=...): each rank's own

    @property
    def output(self) -> str:
        return self.stdout + self.stderr

    def tail(self, chars: int = 4000) -> str:
        return f"exit {self.returncode}\nstdout:\n{self.stdout[-chars:]}\nstderr:\n{self.stderr[-chars:]}"


def read_results(folder: Path) -> dict[int, dict]:
    """The results the ranks wrote into ``folder`` (rank<N>.json), by rank."""
    return {int(p.name[4:-5]): json.loads(p.read_text()) for p in folder.glob("rank*.json")}


class Job:
    """``argv`` started now in a session of its own, under ``env`` plus its mark, GG_TEST_RESULTS (``results``,
    default ``workdir``/results) and tests/ on PYTHONPATH (for gg_testing.rank). stdout and stderr go to
    ``workdir``/``name``.out and .err (or both to .out with ``merge_output``)."""

    def __init__(self, argv: Sequence[str], env: dict[str, str], workdir: Path, *, name: str = "job",
                 results: Optional[Path] = None, cwd: Optional[str] = None, merge_output: bool = False) -> None:
        self.argv = [str(a) for a in argv]
        self.workdir = Path(workdir)
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.results = Path(results) if results is not None else self.workdir / "results"
        self.results.mkdir(parents=True, exist_ok=True)
        self.mark = f"{name}-{secrets.token_hex(6)}"
        env = dict(env)
        env[JOB_MARK] = self.mark
        env[RESULTS_VARIABLE] = str(self.results)
        env["PYTHONPATH"] = os.pathsep.join([p for p in (env.get("PYTHONPATH"), str(TESTS)) if p])
        self.stdout_path = self.workdir / f"{name}.out"
        self.stderr_path = self.stdout_path if merge_output else self.workdir / f"{name}.err"
        with open(self.stdout_path, "w") as out, open(self.stderr_path, "a") as err:
            self.proc = subprocess.Popen(self.argv, env=env, cwd=cwd, stdin=subprocess.DEVNULL, stdout=out,
                                         stderr=subprocess.STDOUT if merge_output else err, start_new_session=True)
        _live.append(self)

    @property
    def pid(self) -> int:
        return self.proc.pid

    def poll(self) -> Optional[int]:
        return self.proc.poll()

    def ranks(self) -> dict[int, dict]:
        return read_results(self.results)

    def stdout(self) -> str:
        return self.stdout_path.read_text(errors="replace")

    def stderr(self) -> str:
        return self.stderr_path.read_text(errors="replace")

    def rank_logs(self, stream: str = "stdout") -> dict[int, str]:
        """Each local rank's own stdout (or stderr) from torchrun's --log-dir (see torchrun_argv(logs=True))."""
        return {int(p.parent.name): p.read_text(errors="replace")
                for p in (self.workdir / "logs").rglob(f"{stream}.log") if p.parent.name.isdigit()}

    def kill(self) -> None:
        """Ends the job whole: its process group, then the processes that left it but carry its mark."""
        if self.proc.poll() is None:
            kill_group(self.proc.pid, signal.SIGKILL)
        self.proc.wait()
        kill_marked(JOB_MARK, self.mark)
        if self in _live:
            _live.remove(self)

    def wait(self, timeout: float = TIMEOUT, *, kill_on_timeout: bool = True) -> Finished:
        """Waits for the job to end (killing it whole after ``timeout`` s; the returned code is then None's
        stand-in, -SIGKILL, and stderr says so) and returns what it left."""
        timed_out = not wait_all([self.proc], timeout)
        if timed_out and not kill_on_timeout:
            raise subprocess.TimeoutExpired(self.argv, timeout)
        self.kill()  # also when it ended: a rank its agent left behind must not outlive the job
        stderr = self.stderr() if self.stderr_path != self.stdout_path else ""
        if timed_out:
            stderr += f"\n[gg_testing: killed after {timeout:g} s]"
        return Finished(self.argv, self.proc.returncode, self.stdout(), stderr, self.ranks(), self.rank_logs())


def rank_json(finished: Finished) -> dict[int, dict]:
    """The JSON document each rank printed last on its own stdout (torchrun_argv(logs=...)), by local rank: what
    a command such as `gpuguard check --json` prints, read from each rank's own file, never from shared output."""
    out = {}
    for rank, text in finished.rank_stdout.items():
        lines = [line for line in text.splitlines() if line.startswith("{")]
        if lines:
            out[rank] = json.loads(lines[-1])
    return out


def reap_all() -> None:
    """Ends every job still running (the conftests call it after each test)."""
    for job in list(_live):
        job.kill()


def wait_jobs(jobs: Sequence[Job], timeout: float = TIMEOUT) -> list[Finished]:
    """Waits for several jobs (one per node, say) within one shared ``timeout``."""
    wait_all([j.proc for j in jobs], timeout)
    return [j.wait(0) for j in jobs]


def torchrun_argv(*args: str, nproc: int, nnodes: int = 1, node_rank: int = 0, port: Optional[int] = None,
                  rdzv_id: Optional[str] = None, options: Iterable[str] = (), prefix: Iterable[str] = (),
                  logs: Optional[Path] = None) -> list[str]:
    """torchrun's command line: ``--standalone`` for one node without a ``port``, else a static rendezvous at
    127.0.0.1:``port`` (with ``rdzv_id``, a c10d one at a store served there, that numbers the nodes itself);
    ``prefix`` goes before ``-m torch.distributed.run`` (``-m gpuguard run -- python``), ``logs`` asks for each
    rank's stdout and stderr in its own file there (Job.rank_logs)."""
    command = [sys.executable, *prefix, "-m", "torch.distributed.run"]
    if nnodes == 1 and port is None:
        command.append("--standalone")
    elif rdzv_id is not None:
        command += [f"--nnodes={nnodes}", "--rdzv_backend=c10d", f"--rdzv_endpoint=127.0.0.1:{port}",
                    f"--rdzv_id={rdzv_id}", "--rdzv_conf=is_host=0"]
    else:
        command += [f"--nnodes={nnodes}", f"--node_rank={node_rank}", "--rdzv_backend=static",
                    "--master_addr=127.0.0.1", f"--master_port={port}"]
    command.append(f"--nproc_per_node={nproc}")
    if logs is not None:
        command += ["--log-dir", str(logs), "--redirects=3"]
    return [*command, *options, *args]


def torchrun(*args: str, nproc: int, env: dict[str, str], workdir: Path, timeout: float = TIMEOUT,
             logs: bool = False, **argv_options) -> Finished:
    """One torchrun job (see torchrun_argv) run to its end within ``timeout``."""
    job = Job(torchrun_argv(*args, nproc=nproc, logs=workdir / "logs" if logs else None, **argv_options), env,
              workdir, name="torchrun")
    return job.wait(timeout)


def torchrun_nodes(*args: str, nodes: int, nproc: int, env_of_node, workdir: Path, port: Optional[int] = None,
                   prefix: Iterable[str] = (), cwd: Optional[str] = None, merge_output: bool = False) -> list[Job]:
    """``nodes`` torchrun agents of ``nproc`` workers each, as on that many hosts, meeting at one port; their
    ranks share one result folder. ``env_of_node(n)`` is node n's environment."""
    port = port or free_port()
    results = workdir / "results"
    return [Job(torchrun_argv(*args, nproc=nproc, nnodes=nodes, node_rank=n, port=port, prefix=prefix),
                env_of_node(n), workdir, name=f"agent{n}", results=results, cwd=cwd, merge_output=merge_output)
            for n in range(nodes)]


def write(folder: Path, name: str, code: str) -> Path:
    """A script for a job: ``code`` dedented, as ``folder``/``name``."""
    path = Path(folder) / name
    path.write_text(textwrap.dedent(code))
    return path
