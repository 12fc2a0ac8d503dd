"""Where CI's CPU went, by kind of process: samples every process's CPU time from /proc every 3 seconds, adds each
one's growth to its kind (Ray's servers and workers, torchrun's agents, rank and driver scripts, pytest, compilers),
and writes the totals when it is stopped (SIGTERM) or every minute. Tests see only the CPU of the processes they
waited for (tests/gg_testing/cpu_time.py); daemons that outlive their parent, such as a Ray cluster's, are counted
here. A process that lives less than a sample's interval, or its last interval, is missed.

    python3 .ci/cpu_by_process.py OUT.tsv        (runs until stopped; OUT.tsv: kind, CPU seconds, processes)
    python3 .ci/cpu_by_process.py --print OUT.tsv [N]

Standard library only, like .ci/report.py.
"""

from __future__ import annotations

import os
import signal
import sys
import time
from pathlib import Path

TICKS = os.sysconf("SC_CLK_TCK")
INTERVAL_S = 3.0

# (kind, a word in the process name or command line that marks it), the first match wins: a Ray worker's command
# line names the raylet and the dashboard too, so workers come first
KINDS = [
    ("ray: dashboard agent", "ray::DashboardAgent"), ("ray: runtime env agent", "ray::RuntimeEnvAgent"),
    ("ray: workers", "ray::"), ("ray: workers", "default_worker.py"),
    ("ray: gcs_server", "gcs_server"), ("ray: raylet", "raylet"), ("ray: dashboard agent", "dashboard/agent.py"),
    ("ray: dashboard", "dashboard/dashboard.py"), ("ray: runtime env agent", "runtime_env/agent"),
    ("ray: log monitor", "log_monitor.py"), ("ray: autoscaler monitor", "autoscaler/_private/monitor.py"),
    ("ray: client server", "ray_client_server"),
    ("torchrun agents", "torch.distributed.run"), ("torchrun agents", "/torchrun"),
    ("pytest workers", "exec(eval(sys.stdin.readline()))"), ("pytest", "-m pytest"), ("pytest", "bin/pytest "),
    ("SLURM", "slurm"), ("MPI", "orted"), ("MPI", "prte"), ("MPI", "mpirun"), ("MPI", "hydra"),
    ("compilers and linkers", "cc1plus"), ("compilers and linkers", "/ld"), ("compilers and linkers", "clang"),
    ("compilers and linkers", "ninja"), ("compilers and linkers", "cmake"), ("ccache", "ccache"),
    ("pip", "pip"), ("fuzzers", "fuzz"), ("benchmarks", "benchmarks/"),
]


def kind_of(pid: str) -> str:
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        comm = Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return "gone"
    text = f"{comm} {cmdline}"
    for kind, mark in KINDS:
        if mark in text:
            return kind
    if "python" in comm or "python" in cmdline.split(" ", 1)[0]:
        script = next((word for word in cmdline.split()[1:] if word.endswith(".py")), "")
        return f"python: {os.path.basename(script)}" if script else "python: -c and -m"
    return f"other: {comm}"


def cpu_and_start(pid: str) -> tuple[float, str]:
    """A process's CPU seconds so far (user and system) and its start time, which with its pid names it."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICKS, fields[19]


def sample(seen: dict[tuple[str, str], tuple[float, str, int]], totals: dict[str, list[float]]) -> None:
    """Adds every process's CPU growth since the last sample to its kind."""
    for pid in os.listdir("/proc"):
        if not pid.isdigit() or pid == str(os.getpid()):
            continue
        try:
            cpu, started = cpu_and_start(pid)
        except (OSError, IndexError):
            continue
        key = (pid, started)
        before, kind, sightings = seen.get(key, (None, "", 0))
        if kind != "before CI" and sightings < 3:  # read again: one seen between its fork and its exec changes
            kind = kind_of(pid)
        if before is None:  # new since the last sample: count what it used before this one, too
            before = 0.0
            totals.setdefault(kind, [0.0, 0])[1] += 1
        totals.setdefault(kind, [0.0, 0])[0] += cpu - before
        seen[key] = (cpu, kind, sightings + 1)


def write(out: Path, totals: dict[str, list[float]]) -> None:
    tmp = out.with_suffix(".tmp")
    tmp.write_text("".join(f"{kind}\t{seconds:.1f}\t{count}\n" for kind, (seconds, count) in totals.items()))
    tmp.replace(out)


def run(out: Path) -> None:
    seen: dict[tuple[str, str], tuple[float, str, int]] = {}
    totals: dict[str, list[float]] = {}
    for pid in os.listdir("/proc"):  # what ran before CI is not CI's
        if pid.isdigit():
            try:
                cpu, started = cpu_and_start(pid)
            except (OSError, IndexError):
                continue
            seen[(pid, started)] = (cpu, "before CI", 0)
    stop = False

    def on_term(signum, frame):
        nonlocal stop
        stop = True

    signal.signal(signal.SIGTERM, on_term)
    last_write = time.monotonic()
    while not stop:
        time.sleep(INTERVAL_S)
        sample(seen, totals)
        if time.monotonic() - last_write > 60:
            write(out, totals)
            last_write = time.monotonic()
    totals.pop("before CI", None)
    write(out, totals)


def show(out: Path, count: int) -> None:
    rows = []
    for line in out.read_text().splitlines():
        kind, seconds, processes = line.split("\t")
        if kind not in ("before CI", "gone"):
            rows.append((float(seconds), kind, int(processes)))
    total = sum(seconds for seconds, _, _ in rows)
    print(f"\nci: where the CPU went, by kind of process ({total:.0f} CPU seconds sampled; tests count only what they "
          f"waited for)")
    for seconds, kind, processes in sorted(rows, reverse=True)[:count]:
        print(f"{seconds:8.0f} s  {100 * seconds / max(total, 1):4.1f} %  {processes:6d} processes  {kind}")


if __name__ == "__main__":
    if sys.argv[1] == "--print":
        show(Path(sys.argv[2]), int(sys.argv[3]) if len(sys.argv) > 3 else 15)
    else:
        run(Path(sys.argv[1]))
