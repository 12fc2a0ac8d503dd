"""A real TCPStore server (torch's default backend) in a process of its own, for the benchmarks that load one."""

from __future__ import annotations

import atexit
import os
import subprocess
import sys
from pathlib import Path
from typing import Any, Optional

# One process imports torch once and forks a fresh server for each Server(): each its own process, with its own CPU
# time and memory (what the benchmarks read), without an import of torch apiece (a benchmark of a dozen scenarios
# spent more on those imports than on its servers). A server lives until the factory closes its end of the pipe it
# holds; the factory reports each server's pid and port, and "stopped" once one has exited.
FACTORY = """
import datetime, os, signal, sys
import torch.distributed as dist
held = {}  # a server's pid -> the write end of its pipe: closed, the server ends
while True:
    line = sys.stdin.readline()
    if not line:  # the benchmark ended: so do the servers it left (one stopped by SIGSTOP too), waited for here
        for pid, fd in held.items():
            os.close(fd)
            os.kill(pid, signal.SIGCONT)
            os.waitpid(pid, 0)
        break
    word, _, arg = line.strip().partition(" ")
    if word == "start":
        r, w = os.pipe()
        pid = os.fork()
        if pid == 0:
            os.close(w)
            for fd in held.values():
                os.close(fd)
            server = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False,
                                   timeout=datetime.timedelta(seconds=600))
            print(os.getpid(), server.port, flush=True)
            os.read(r, 1)  # until the factory closes the other end
            os._exit(0)
        os.close(r)
        held[pid] = w
    elif word == "stop":
        pid = int(arg)
        os.close(held.pop(pid))
        os.waitpid(pid, 0)
        print("stopped", flush=True)
"""
TICKS = os.sysconf("SC_CLK_TCK")
_factory: Optional[subprocess.Popen] = None


def _the_factory() -> subprocess.Popen:
    global _factory
    if _factory is None or _factory.poll() is not None:
        # torch looks up each peer's name to log it; a resolver that drops queries would stall the server 5 s
        # per lookup (see scripts/test.sh): one try of 1 s
        env = dict(os.environ, RES_OPTIONS=os.environ.get("RES_OPTIONS", "timeout:1 attempts:1"))
        _factory = subprocess.Popen([sys.executable, "-c", FACTORY], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                    text=True, env=env)
        atexit.register(_end_factory, _factory)
    return _factory


def _end_factory(factory: subprocess.Popen) -> None:
    """At the benchmark's exit: the factory ends on its closed stdin, once the servers still running have ended (so
    that nothing outlives the benchmark)."""
    if factory.stdin is not None:
        factory.stdin.close()
    try:
        factory.wait(30)
    except subprocess.TimeoutExpired:
        factory.kill()
        factory.wait()


def _ask(line: str) -> str:
    factory = _the_factory()
    assert factory.stdin is not None and factory.stdout is not None
    factory.stdin.write(line + "\n")
    factory.stdin.flush()
    answer = factory.stdout.readline()
    if not answer:
        raise RuntimeError(f"the TCPStore server factory (pid {factory.pid}) exited (status {factory.wait()}) "
                           f"when asked {line!r}")
    return answer.strip()


class Server:
    """A server's process, whose CPU time and memory are read from /proc; stop() ends it."""

    def __init__(self) -> None:
        pid, port = _ask("start").split()
        self.pid, self.port = int(pid), int(port)

    def cpu_s(self) -> float:
        fields = Path(f"/proc/{self.pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / TICKS  # utime, stime

    def rss_kib(self) -> int:
        return status_kib(self.pid, "VmRSS")

    def stop(self) -> None:
        answer = _ask(f"stop {self.pid}")
        assert answer == "stopped", answer


def status_kib(pid: Any, field: str) -> int:
    """A memory field of /proc/<pid>/status, in KiB (0 when absent)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    return 0
