"""A local Ray cluster of the tests' own, started as users start one (`ray start --head`) and always stopped.

Its ports, temp folder and auth token are its own, so it never meets another Ray on the machine. Stopping it
ends exactly the processes of this cluster, never `ray stop`, which would end every Ray on the machine: each
of them inherited a variable naming this cluster (Ray renames its workers' command lines, not their
environment). Drivers join it with ``ray.init()`` through ``env()`` (RAY_ADDRESS), and jobs are
submitted to ``dashboard_url`` with ``ray job submit``.
"""

from __future__ import annotations

import os
import secrets
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Optional


#: Set in the environment of `ray start`, so every process of the cluster (and every driver joining it) has it.
MARK = "GPUGUARD_TEST_RAY_CLUSTER"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class RayHead:
    """`ray start --head` with ``num_gpus`` GPUs (the fake driver's, through ``env``) and ``num_cpus`` CPUs."""

    def __init__(self, env: dict[str, str], *, num_gpus: int, num_cpus: int, dashboard: bool = False) -> None:
        # short: Ray puts socket paths under it, and a Unix socket path must stay under 108 bytes
        self.temp_dir = Path(tempfile.mkdtemp(prefix="gg-ray-", dir="/tmp"))
        token = self.temp_dir / "auth_token"
        token.write_text(secrets.token_hex(32))
        self.port = free_port()
        self.dashboard_port = free_port()
        self.dashboard_url = f"http://127.0.0.1:{self.dashboard_port}"
        self._env = dict(env, RAY_ADDRESS=f"127.0.0.1:{self.port}", RAY_AUTH_MODE="token",
                         RAY_AUTH_TOKEN_PATH=str(token), RAY_DISABLE_USAGE_STATS="1")
        self._env[MARK] = str(self.temp_dir)
        self._env.pop("RAY_AUTH_TOKEN", None)
        self._args = [
            "ray", "start", "--head", "--node-ip-address=127.0.0.1", f"--port={self.port}",
            f"--temp-dir={self.temp_dir}", f"--num-gpus={num_gpus}", f"--num-cpus={num_cpus}",
            "--object-store-memory=100000000", "--disable-usage-stats",
            f"--ray-client-server-port={free_port()}", f"--node-manager-port={free_port()}",
            f"--object-manager-port={free_port()}", f"--runtime-env-agent-port={free_port()}",
            f"--metrics-export-port={free_port()}", f"--dashboard-agent-listen-port={free_port()}",
            f"--dashboard-agent-grpc-port={free_port()}"]
        if dashboard:  # the Jobs API lives in the dashboard
            self._args += ["--include-dashboard=true", "--dashboard-host=127.0.0.1",
                           f"--dashboard-port={self.dashboard_port}"]
        else:
            self._args += ["--include-dashboard=false"]

    def env(self, **extra: str) -> dict[str, str]:
        """The environment of a process that joins this cluster: ``ray.init()`` and ``ray job`` find it."""
        return dict(self._env, **extra)

    def start(self, timeout: float = 180) -> "RayHead":
        proc = subprocess.run(self._args, env=self._env, capture_output=True, text=True, timeout=timeout)
        if proc.returncode != 0:
            self.stop()
            raise RuntimeError(f"ray start --head failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}")
        return self

    def _pids(self) -> list[int]:
        """The processes of this cluster, and drivers started with ``env()``: those whose environment names it
        and their descendants (Ray starts its agents with an environment of their own)."""
        mark = f"{MARK}={self.temp_dir}".encode()
        marked, parent = set(), {}
        for entry in os.listdir("/proc"):
            if not entry.isdigit() or int(entry) == os.getpid():
                continue
            try:
                environ = Path(f"/proc/{entry}/environ").read_bytes().split(b"\0")
                stat = Path(f"/proc/{entry}/stat").read_text()
            except OSError:
                continue
            parent[int(entry)] = int(stat.rsplit(")", 1)[1].split()[1])
            if mark in environ:
                marked.add(int(entry))
        found, grew = set(marked), True
        while grew:
            more = {pid for pid, ppid in parent.items() if ppid in found and pid not in found}
            found |= more
            grew = bool(more)
        return sorted(found)

    def stop(self, grace: float = 5) -> None:
        """Ends this cluster's processes (SIGTERM, then SIGKILL after ``grace`` s) and removes its folder."""
        for sig, wait in ((signal.SIGTERM, grace), (signal.SIGKILL, 5.0)):
            pids = self._pids()
            for pid in pids:
                try:
                    os.kill(pid, sig)
                except ProcessLookupError:
                    pass
            deadline = time.monotonic() + wait
            while pids and time.monotonic() < deadline:
                time.sleep(0.2)
                pids = self._pids()
            if not pids:
                break
        shutil.rmtree(self.temp_dir, ignore_errors=True)

    def __enter__(self) -> "RayHead":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def run_logged(argv: list[str], env: dict[str, str], timeout: float,
               cwd: Optional[str] = None) -> subprocess.CompletedProcess[str]:
    """Runs a command in its own process group, killed whole on timeout; stdout and stderr together."""
    proc = subprocess.Popen(argv, env=env, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, _ = proc.communicate()
        out += f"\n[killed after {timeout:g} s]"
    return subprocess.CompletedProcess(argv, proc.returncode, out, None)
