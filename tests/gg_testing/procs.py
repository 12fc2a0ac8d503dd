"""Running a process for a test and ending it whole: fresh interpreters for code snippets, commands in their own
session killed as a group on timeout, and the processes that left their group (torchrun starts each worker in a
session of its own) found by a mark in their environment."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any, Iterable, Optional

import pytest

#: Set by gg_testing.launch.Job in the environment of what it starts: every descendant inherits it, also those
#: in a session of their own, so kill_marked() finds them (a process renames its command line, not its environment).
JOB_MARK = "GG_TEST_JOB"


#: Seconds a snippet's interpreter may take before it counts as hung. A bound for a hang, not a measure: in CI's
#: main lane, at nice 10 beside a Ray cluster starting at normal priority, a snippet that takes 4 s here alone has
#: run at a twentieth of a core (the torch-warnings test's inner pytest: 16.5 s alone, 214 s in a CI run).
SNIPPET_TIMEOUT_S = 240.0
#: The same for a CPU-bound child (torch.compile at work, a benchmark of many simulated ranks), and the test's own
#: bound around it: such a child took up to 214 s in the CI run of 8cd8552 beside the Ray tests, 8-99 s here alone.
CPU_BOUND_TIMEOUT_S = 480.0
CPU_BOUND_TEST_TIMEOUT_S = CPU_BOUND_TIMEOUT_S + 60


def run_python(code: str, env: dict[str, str], timeout: float = SNIPPET_TIMEOUT_S,
               check: bool = True) -> subprocess.CompletedProcess[str]:
    """Runs `code` in a fresh interpreter; on failure with check=True, fails the test showing its output."""
    proc = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], env=env, capture_output=True,
                          text=True, timeout=timeout)
    if check and proc.returncode != 0:
        pytest.fail(f"subprocess failed ({proc.returncode}):\nstdout:\n{proc.stdout}\nstderr:\n{proc.stderr}")
    return proc


def run_json(code: str, env: dict[str, str], timeout: float = SNIPPET_TIMEOUT_S) -> Any:
    """Runs `code`, which must print one JSON document on a line of its own, last, and returns it."""
    return last_json(run_python(code, env, timeout).stdout)


def last_json(stdout: str) -> Any:
    """The last line of ``stdout`` that is a JSON document (an object, an array, a string or a number: a snippet
    may print any of them). A Ray driver's output can go on after the line it printed last: its raylet's messages
    (a worker that died, printed even with log_to_driver=False) reach the driver's stdout when they arrive, during
    ray.shutdown() too (the oldest corner's CI run of 05bf05d); they are not JSON."""
    for line in reversed(stdout.strip().splitlines()):
        try:
            return json.loads(line)
        except ValueError:
            continue
    raise AssertionError(f"no line of the output is a JSON document:\n{stdout[-4000:]}")


def run_cli(args: list[str], env: dict[str, str], timeout: float = SNIPPET_TIMEOUT_S,
            stdin: Optional[str] = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "gpuguard", *args], env=env, capture_output=True, text=True,
                          timeout=timeout, input=stdin)


def kill_group(pid: int, sig: int = signal.SIGKILL) -> None:
    """Sends ``sig`` to the process group ``pid`` leads (a process started with start_new_session=True)."""
    try:
        os.killpg(pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def run_logged(argv: list[str], env: dict[str, str], timeout: float,
               cwd: Optional[str] = None) -> subprocess.CompletedProcess[str]:
    """Runs a command in its own process group, killed whole on timeout; stdout and stderr together."""
    proc = subprocess.Popen(argv, env=env, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        kill_group(proc.pid)
        out, _ = proc.communicate()
        out += f"\n[killed after {timeout:g} s]"
    return subprocess.CompletedProcess(argv, proc.returncode, out, None)


def marked(mark: str, value: str) -> list[int]:
    """The processes (but this one) whose environment holds ``mark=value``."""
    needle = f"{mark}={value}".encode()
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            if needle in Path(f"/proc/{entry}/environ").read_bytes().split(b"\0"):
                found.append(int(entry))
        except OSError:
            continue
    return found


def alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie, dead but not yet reaped, counts as gone)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state not in ("Z", "X")


def kill_marked(mark: str, value: str, sig: int = signal.SIGKILL, wait: float = 10) -> list[int]:
    """Kills every process marked ``mark=value`` and waits (up to ``wait`` s) until none runs; returns their pids."""
    pids = marked(mark, value)
    for pid in pids:
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            pass
    wait_until(lambda: not any(alive(p) for p in pids), wait, what=None)
    return pids


def wait_until(condition, timeout: float, interval: float = 0.05, what: Optional[str] = "condition") -> bool:
    """Polls ``condition`` until it is true or ``timeout`` s pass; with ``what``, a timeout fails the test."""
    deadline = time.monotonic() + timeout
    while True:
        if condition():
            return True
        if time.monotonic() >= deadline:
            if what:
                pytest.fail(f"{what} did not happen within {timeout:g} s")
            return False
        time.sleep(interval)


def wait_all(procs: Iterable[subprocess.Popen], timeout: float) -> bool:
    """Waits for every process to end within one shared ``timeout``; True when all did."""
    deadline = time.monotonic() + timeout
    for p in procs:
        try:
            p.wait(max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            return False
    return True


#: Prepended to a script run in a fresh interpreter: its tensor checks run in Python (gpuguard.tensors._python_checks), as
#: where gpuguard._libtorch cannot load, without the warning that says so.
USE_PYTHON_CHECKS = ("import gpuguard._libtorch_loader as _loader, gpuguard.tensors._python_checks as _python_checks\n"
                     "_loader._checks = _python_checks\n")
