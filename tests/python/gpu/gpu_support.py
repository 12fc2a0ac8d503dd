"""Helpers of the GPU acceptance tests: nvidia-smi's view of the GPUs, bus id spelling, launching jobs whose
ranks each write their result to a file of their own, and NCCL's own lines in a job's output."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

from gg_testing import launch
from gg_testing.launch import read_results  # noqa: F401  (the suite's tests read a results folder with it)
from gg_testing.rank import RESULTS_VARIABLE  # noqa: F401  (the variable naming a job's results folder)

SMI_FIELDS = ("index", "uuid", "pci.bus_id", "name", "memory.total", "driver_version")


#: Put at the top of a worker script: report_result(**fields) writes this rank's result as JSON to its own file,
#: atomically (a temporary file, then os.replace), so that ranks printing at the same time cannot corrupt it
#: (two ranks' lines of torchrun's shared stdout arrived glued together on the lent GPU machine). Called again,
#: the newer result replaces the older.
REPORT_RESULT = r'''
def report_result(**fields):
    import json as _json, os as _os
    _rank = int(_os.environ.get("RANK", "0"))
    _path = _os.path.join(_os.environ["GG_TEST_RESULTS"], f"rank{_rank}.json")
    _tmp = f"{_path}.{_os.getpid()}.tmp"
    with open(_tmp, "w") as _f:
        _json.dump({"rank": _rank, **fields}, _f)
    _os.replace(_tmp, _path)
'''


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


@dataclass
class Job:
    """A finished (or killed) job: its exit code (None: killed at its timeout), its output (stdout and stderr
    together, for a failure message and for explain), its wall time, and each rank's result by rank."""

    returncode: Optional[int]
    output: str
    seconds: float
    results: dict[int, dict[str, Any]] = field(default_factory=dict)


def run_job(argv: list[str], env: dict[str, str], timeout: float) -> Job:
    """Runs a launcher through the test-support package's one launcher (tests/gg_testing: its own session, its
    ranks' results in a fresh folder named by RESULTS_VARIABLE, the whole job killed at ``timeout``)."""
    workdir = Path(tempfile.mkdtemp(prefix="gpuguard-gpu-job-"))
    try:
        start = time.monotonic()
        finished = launch.Job(argv, env, workdir, merge_output=True).wait(timeout)
        seconds = time.monotonic() - start
        timed_out = seconds >= timeout
        return Job(None if timed_out else finished.returncode, finished.output, seconds, finished.ranks)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


def torchrun(script: Path, nproc: int, env: dict[str, str], timeout: float, *args: str) -> Job:
    """`torchrun --standalone --nproc_per_node=<nproc> script args...`; the script defines or includes
    REPORT_RESULT and each rank calls report_result(...)."""
    return run_job([sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}",
                    str(script), *args], env, timeout)


def worker(folder: Path, name: str, code: str) -> Path:
    """Writes a worker script: REPORT_RESULT, then ``code``. Returns its path."""
    path = folder / name
    path.write_text(REPORT_RESULT + code)
    return path


# NCCL's own log lines (src/debug.cc, ncclDebugLogV): "[timestamp] host:pid:tid [cudaDev] NCCL INFO ..." and
# "[timestamp] host:pid:tid [cudaDev] file:line (func) NCCL WARN ..." (the timestamp by default on WARN only, the
# "(func)" on newer NCCL), possibly behind a launcher's prefix ("[rank1]:", torchrun's "[default1]:", Ray's
# "(RayTrainWorker pid=12)"). A line that merely quotes NCCL's words (gpuguard's messages, torch's "Last error:"
# text) has none of this at its start, so it is not NCCL speaking.
_LAUNCHER_PREFIX = r"(?:\[[A-Za-z_-]*\d+\]:\s*|\([^()\s]+ pid=\d+[^()]*\)\s*)*"
_NCCL_TIMESTAMP = r"(?:\[[^\[\]]{1,64}\]\s*)?"
NCCL_OWN_LINE = re.compile(
    rf"^{_LAUNCHER_PREFIX}{_NCCL_TIMESTAMP}(?P<host>[^\s:\[\]]+):(?P<pid>\d+):(?P<tid>\d+) \[(?P<dev>\d+)\] "
    r"(?:NCCL INFO |[^\s:]+:\d+(?: \([^()]*\))? NCCL WARN )(?P<text>.*)$")


def nccl_lines(output: str, level: str = "") -> list[str]:
    """The lines of ``output`` that NCCL itself printed (``level`` 'WARN' or 'INFO': only those)."""
    found = []
    for line in output.splitlines():
        m = NCCL_OWN_LINE.match(line)
        if m and (not level or f" NCCL {level} " in line[:m.start("text")]):
            found.append(line)
    return found
