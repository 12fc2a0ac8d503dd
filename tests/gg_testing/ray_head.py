"""A local Ray cluster of the tests' own, started as users start one (`ray start --head`) and always stopped.

Its ports (gg_testing.ports.free_port: below the kernel's ephemeral range), temp folder and auth token are its
own, so it never meets another Ray on the machine. Stopping it ends exactly the processes of this cluster, never `ray stop`,
which would end every Ray on the machine: each of them inherited a variable naming this cluster (Ray renames its
workers' command lines, not their environment). Drivers join it with ``ray.init()`` through ``env()`` (RAY_ADDRESS), and jobs are
submitted to ``dashboard_url`` with ``ray job submit``.
"""

from __future__ import annotations

import os
import secrets
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path

from .ports import free_port
from .ray_start import starting_alone

#: Set in the environment of `ray start`, so every process of the cluster (and every driver joining it) has it.
MARK = "GPUGUARD_TEST_RAY_CLUSTER"
#: How many times start() tries again, with other ports, when one was taken between choosing and binding.
START_TRIES = 3
#: What `ray start` prints when a port it was given is taken: at its own check, and when binding it after that.
PORT_TAKEN = ("already occupied", "address already in use")


class RayHead:
    """`ray start --head` with ``num_gpus`` GPUs (the fake driver's, through ``env``) and ``num_cpus`` CPUs."""

    def __init__(self, env: dict[str, str], *, num_gpus: int, num_cpus: int, dashboard: bool = False) -> None:
        # short: Ray puts socket paths under it, and a Unix socket path must stay under 108 bytes
        self.temp_dir = Path(tempfile.mkdtemp(prefix="gg-ray-", dir="/tmp"))
        token = self.temp_dir / "auth_token"
        token.write_text(secrets.token_hex(32))
        self._env = dict(env, RAY_AUTH_MODE="token", RAY_AUTH_TOKEN_PATH=str(token), RAY_DISABLE_USAGE_STATS="1")
        self._env[MARK] = str(self.temp_dir)
        self._env.pop("RAY_AUTH_TOKEN", None)
        self._num_gpus, self._num_cpus, self._dashboard = num_gpus, num_cpus, dashboard
        self._choose_ports()

    def _choose_ports(self) -> None:
        self.port = free_port()
        self.dashboard_port = free_port()
        self.dashboard_url = f"http://127.0.0.1:{self.dashboard_port}"
        self._env["RAY_ADDRESS"] = f"127.0.0.1:{self.port}"
        self._args = [
            "ray", "start", "--head", "--node-ip-address=127.0.0.1", f"--port={self.port}",
            f"--temp-dir={self.temp_dir}", f"--num-gpus={self._num_gpus}", f"--num-cpus={self._num_cpus}",
            "--object-store-memory=100000000", "--disable-usage-stats",
            f"--ray-client-server-port={free_port()}", f"--node-manager-port={free_port()}",
            f"--object-manager-port={free_port()}", f"--runtime-env-agent-port={free_port()}",
            f"--metrics-export-port={free_port()}", f"--dashboard-agent-listen-port={free_port()}",
            f"--dashboard-agent-grpc-port={free_port()}"]
        if self._dashboard:  # the Jobs API lives in the dashboard
            self._args += ["--include-dashboard=true", "--dashboard-host=127.0.0.1",
                           f"--dashboard-port={self.dashboard_port}"]
        else:
            self._args += ["--include-dashboard=false"]

    def env(self, **extra: str) -> dict[str, str]:
        """The environment of a process that joins this cluster: ``ray.init()`` and ``ray job`` find it."""
        return dict(self._env, **extra)

    def start(self, timeout: float = 180) -> "RayHead":
        """Starts the cluster; when a port it was given was taken meanwhile, stops what started and tries again
        with other ports (START_TRIES in all)."""
        attempt = 1
        while True:
            with starting_alone():  # no other test's cluster starting beside it (gg_testing.ray_start)
                proc = subprocess.run(self._args, env=self._env, capture_output=True, text=True, timeout=timeout)
            if proc.returncode == 0:
                return self
            self._end_processes()
            output = f"{proc.stdout}\n{proc.stderr}"
            taken = any(text in output.lower() for text in PORT_TAKEN)
            if not taken or attempt == START_TRIES:
                self.stop()
                raise RuntimeError(f"ray start --head failed ({proc.returncode}, try {attempt} of {START_TRIES}):"
                                   f"\n{output}")
            attempt += 1
            self._choose_ports()

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
        self._end_processes(grace)
        shutil.rmtree(self.temp_dir, ignore_errors=True)

    def _end_processes(self, grace: float = 5) -> None:
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

    def __enter__(self) -> "RayHead":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

