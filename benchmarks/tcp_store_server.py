"""A real TCPStore server (torch's default backend) in a process of its own, for the benchmarks that load one."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

SERVER = """
import sys, datetime, torch.distributed as dist
server = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False,
                       timeout=datetime.timedelta(seconds=600))
print(server.port, flush=True)
sys.stdin.read()  # until the benchmark closes our stdin
"""
TICKS = os.sysconf("SC_CLK_TCK")


class Server:
    """The server's process, whose CPU time and memory are read from /proc; stop() ends it."""

    def __init__(self) -> None:
        # torch looks up each peer's name to log it; a resolver that drops queries would stall the server 5 s
        # per lookup (see scripts/test.sh): one try of 1 s
        env = dict(os.environ, RES_OPTIONS=os.environ.get("RES_OPTIONS", "timeout:1 attempts:1"))
        self.proc = subprocess.Popen([sys.executable, "-c", SERVER], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     text=True, env=env)
        assert self.proc.stdout is not None
        self.port = int(self.proc.stdout.readline())

    def cpu_s(self) -> float:
        fields = Path(f"/proc/{self.proc.pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / TICKS  # utime, stime

    def rss_kib(self) -> int:
        return status_kib(self.proc.pid, "VmRSS")

    def stop(self) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.close()
        self.proc.wait(30)


def status_kib(pid: Any, field: str) -> int:
    """A memory field of /proc/<pid>/status, in KiB (0 when absent)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    return 0
