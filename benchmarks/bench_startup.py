"""Start time and peak memory of the command line, beside ``python -c pass`` and ``python -c "import torch"`` in the
same run, as ratios: `gpuguard devices | doctor | check | explain | run` must never import torch.

Each command runs as a fresh process, the sides alternating, ``--runs`` times; the table gives the median wall time,
the peak resident memory (the child's own ru_maxrss) and both as ratios to ``python -c pass``. The last column says
whether the command imported torch (``-X importtime``, one extra run each). Target (issue 20): ``gpuguard devices``
at most 0.3 s and 60 MB on a 2-core CI machine.

    python benchmarks/bench_startup.py [--runs 15]     (the installed gpuguard; PYTHONPATH=python: this checkout's)
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "results"
GG = [sys.executable, "-m", "gpuguard"]

COMMANDS: dict[str, tuple[list[str], str]] = {  # name -> (argv, stdin)
    "python -c pass": ([sys.executable, "-c", "pass"], ""),
    "gpuguard devices": (GG + ["devices"], ""),
    "gpuguard doctor": (GG + ["doctor"], ""),
    "gpuguard check": (GG + ["check"], ""),
    "gpuguard explain": (GG + ["explain"], "[rank1]: RuntimeError: CUDA error: invalid device ordinal\n"),
    "gpuguard run -- python -c pass": (GG + ["run", "--", sys.executable, "-c", "pass"], ""),
    "python -c 'import torch'": ([sys.executable, "-c", "import torch"], ""),
}


def once(argv: list[str], stdin: str, env: dict[str, str]) -> tuple[float, float]:
    """(seconds, peak MB) of one run; the peak is the child's own, from wait4."""
    start = time.perf_counter()
    proc = subprocess.Popen(argv, env=env, stdin=subprocess.PIPE, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    assert proc.stdin is not None
    proc.stdin.write(stdin.encode())
    proc.stdin.close()
    _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    elapsed = time.perf_counter() - start
    return elapsed, usage.ru_maxrss / 1024


def imports_torch(argv: list[str], stdin: str, env: dict[str, str]) -> bool:
    proc = subprocess.run([argv[0], "-X", "importtime", *argv[1:]], env=env, input=stdin, capture_output=True,
                          text=True, timeout=300)
    return any(line.rsplit("|", 1)[-1].strip() == "torch" for line in proc.stderr.splitlines())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=15)
    args = parser.parse_args()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("GPUGUARD", "TORCHELASTIC", "RANK"))}
    import gpuguard  # which copy is measured: said in the output

    for argv, stdin in COMMANDS.values():  # warm the page cache once
        once(argv, stdin, env)
    samples: dict[str, list[tuple[float, float]]] = {name: [] for name in COMMANDS}
    for _ in range(args.runs):
        for name, (argv, stdin) in COMMANDS.items():
            samples[name].append(once(argv, stdin, env))
    base_s = statistics.median(s for s, _ in samples["python -c pass"])
    base_mb = statistics.median(m for _, m in samples["python -c pass"])
    rows = []
    print(f"gpuguard from {Path(gpuguard.__file__).parent}; python {platform.python_version()}, "
          f"{os.cpu_count()} CPUs, {args.runs} runs each, medians")
    print(f"{'command':34} {'seconds':>8} {'x pass':>7} {'peak MB':>8} {'x pass':>7}  imports torch")
    for name, (argv, stdin) in COMMANDS.items():
        seconds = statistics.median(s for s, _ in samples[name])
        mb = statistics.median(m for _, m in samples[name])
        torch = imports_torch(argv, stdin, env)
        rows.append({"command": name, "seconds": seconds, "seconds_ratio": seconds / base_s, "peak_mb": mb,
                     "peak_ratio": mb / base_mb, "imports_torch": torch,
                     "seconds_min": min(s for s, _ in samples[name]), "seconds_max": max(s for s, _ in samples[name])})
        print(f"{name:34} {seconds:8.3f} {seconds / base_s:7.2f} {mb:8.1f} {mb / base_mb:7.2f}  "
              f"{'yes' if torch else 'no'}")
    devices = next(r for r in rows if r["command"] == "gpuguard devices")
    met = devices["seconds"] <= 0.3 and devices["peak_mb"] <= 60
    print(f"target for gpuguard devices (<= 0.3 s, <= 60 MB): {'met' if met else 'NOT met'}")
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "startup.json").write_text(json.dumps({"rows": rows, "runs": args.runs,
                                                      "python": platform.python_version()}, indent=2))


if __name__ == "__main__":
    main()
