"""Helpers of the GPU acceptance tests: nvidia-smi's view of the GPUs, bus id spelling, and launching jobs."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Optional

SMI_FIELDS = ("index", "uuid", "pci.bus_id", "name", "memory.total", "driver_version")


def nvidia_smi() -> tuple[list[dict[str, str]], str]:
    """The GPUs nvidia-smi lists, one dict per GPU; or [] and why there are none."""
    exe = shutil.which("nvidia-smi")
    if exe is None:
        return [], "nvidia-smi not found: no NVIDIA driver on this machine"
    try:
        proc = subprocess.run([exe, f"--query-gpu={','.join(SMI_FIELDS)}", "--format=csv,noheader,nounits"],
                              capture_output=True, text=True, timeout=60)
    except subprocess.TimeoutExpired:
        return [], "nvidia-smi did not answer within 60 s"
    if proc.returncode != 0:
        return [], f"nvidia-smi failed (exit {proc.returncode}): {(proc.stderr or proc.stdout).strip()[:300]}"
    rows = [dict(zip(SMI_FIELDS, (c.strip() for c in line.split(","))))
            for line in proc.stdout.splitlines() if line.strip()]
    if not rows:
        return [], "nvidia-smi lists no GPU"
    return rows, ""


def normalise_bus_id(bus_id: str) -> str:
    """'00000000:19:00.0' (nvidia-smi) and '0000:19:00.0' (cuDeviceGetPCIBusId) -> '0000:19:00.0'."""
    parts = bus_id.strip().lower().split(":")
    if len(parts) != 3:
        return bus_id.strip().lower()
    return f"{int(parts[0], 16):04x}:{parts[1]}:{parts[2]}"


def run_job(argv: list[str], env: dict[str, str], timeout: float) -> tuple[Optional[int], str, float]:
    """Runs a launcher in its own process group; on timeout kills the whole group. (exit code or None, output, s)."""
    start = time.monotonic()
    proc = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)
    try:
        output, _ = proc.communicate(timeout=timeout)
        return proc.returncode, output, time.monotonic() - start
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        output, _ = proc.communicate()
        return None, output, time.monotonic() - start


def torchrun(script: Path, nproc: int, env: dict[str, str], timeout: float, *args: str) -> tuple[Optional[int], str, float]:
    return run_job([sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}",
                    str(script), *args], env, timeout)
