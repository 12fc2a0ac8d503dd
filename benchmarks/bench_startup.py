"""Start time and peak memory of the command line, beside ``python -c pass`` and ``python -c "import torch"`` in the
same run, as ratios: `gpuguard devices | doctor | check | explain | run` must never import torch. Also what
``gpuguard.bind()`` imports before it does anything (a call stopped by its argument check): its time and how many
modules it loads (issue 36: 71 gpuguard modules through the explainer and all its recognisers, before).

Each command runs as a fresh process, the sides alternating, ``--runs`` times; the table gives the median wall time,
the peak resident memory (the child's own ru_maxrss) and both as ratios to ``python -c pass``. The last column says
whether the command imported torch (``-X importtime``, one extra run each). Target (issue 20): ``gpuguard devices``
at most 0.3 s and 60 MB on a 2-core CI machine.

    python benchmarks/bench_startup.py [--runs 15] [--only bind]   (the installed gpuguard; PYTHONPATH=python: this
                                                                    checkout's; --only: the commands named so)
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

# What bind() imports, and nothing more: a call whose argument check fails before any step runs. Prints its own
# time (the imports, in-process) and the modules it loaded.
BIND_PATH = """
import json, sys, time
start = time.perf_counter()
import gpuguard
try:
    gpuguard.bind(timeout=0)
except ValueError:
    pass
seconds = time.perf_counter() - start
print(json.dumps({"seconds": seconds, "gpuguard_modules": sorted(m for m in sys.modules if m.startswith("gpuguard")),
                  "modules": len(sys.modules), "torch": "torch" in sys.modules}))
"""
COMMANDS["import gpuguard; bind()'s imports"] = ([sys.executable, "-c", BIND_PATH], "")


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
    parser.add_argument("--only", help="run only the commands whose name holds this text (beside python -c pass)")
    args = parser.parse_args()
    commands = {name: c for name, c in COMMANDS.items()
                if args.only is None or args.only in name or name == "python -c pass"}
    env = {k: v for k, v in os.environ.items() if not k.startswith(("GPUGUARD", "TORCHELASTIC", "RANK"))}
    import gpuguard  # which copy is measured: said in the output

    for argv, stdin in commands.values():  # warm the page cache once
        once(argv, stdin, env)
    samples: dict[str, list[tuple[float, float]]] = {name: [] for name in commands}
    for _ in range(args.runs):
        for name, (argv, stdin) in commands.items():
            samples[name].append(once(argv, stdin, env))
    base_s = statistics.median(s for s, _ in samples["python -c pass"])
    base_mb = statistics.median(m for _, m in samples["python -c pass"])
    rows = []
    print(f"gpuguard from {Path(gpuguard.__file__).parent}; python {platform.python_version()}, "
          f"{os.cpu_count()} CPUs, {args.runs} runs each, medians")
    print(f"{'command':34} {'seconds':>8} {'x pass':>7} {'peak MB':>8} {'x pass':>7}  imports torch")
    for name, (argv, stdin) in commands.items():
        seconds = statistics.median(s for s, _ in samples[name])
        mb = statistics.median(m for _, m in samples[name])
        torch = imports_torch(argv, stdin, env)
        rows.append({"command": name, "seconds": seconds, "seconds_ratio": seconds / base_s, "peak_mb": mb,
                     "peak_ratio": mb / base_mb, "imports_torch": torch,
                     "seconds_min": min(s for s, _ in samples[name]), "seconds_max": max(s for s, _ in samples[name])})
        print(f"{name:34} {seconds:8.3f} {seconds / base_s:7.2f} {mb:8.1f} {mb / base_mb:7.2f}  "
              f"{'yes' if torch else 'no'}")
    devices = next((r for r in rows if r["command"] == "gpuguard devices"), None)
    if devices is not None:
        met = devices["seconds"] <= 0.3 and devices["peak_mb"] <= 60
        print(f"target for gpuguard devices (<= 0.3 s, <= 60 MB): {'met' if met else 'NOT met'}")
    bind_path = None
    if "import gpuguard; bind()'s imports" in commands:
        bind_path = bind_imports(env, args.runs)
        print(f"bind()'s imports, in-process: {bind_path['seconds']:.3f} s (median of {args.runs}), "
              f"{len(bind_path['gpuguard_modules'])} gpuguard modules, {bind_path['modules']} modules in all, "
              f"torch {'imported' if bind_path['torch'] else 'not imported'}")
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "startup.json").write_text(json.dumps({"rows": rows, "runs": args.runs, "bind_path": bind_path,
                                                      "python": platform.python_version()}, indent=2))


def bind_imports(env: dict[str, str], runs: int) -> dict:
    """bind()'s imports measured inside the process (BIND_PATH): the median time, and the modules of the last run."""
    results = []
    for _ in range(runs):
        proc = subprocess.run([sys.executable, "-c", BIND_PATH], env=env, capture_output=True, text=True, timeout=120)
        if proc.returncode != 0:
            raise SystemExit(f"bench_startup.py: bind()'s imports failed:\n{proc.stderr}")
        results.append(json.loads(proc.stdout))
    return dict(results[-1], seconds=statistics.median(r["seconds"] for r in results))


if __name__ == "__main__":
    main()
