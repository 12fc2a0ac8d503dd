"""gpuguard explain over a large multi-rank log vs the obvious alternative (read the file, run the regexes).

Each contender runs in its own process so that peak RSS (ru_maxrss) is its own. Prints a table with ratios and
saves JSON under benchmarks/results/. Usage: python benchmarks/bench_explain.py [--mb 100] [--repeat 3]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

CONTENDERS = {
    # gpuguard: streamed line by line, keyword pre-filter, bounded state
    "gpuguard explain_file": """
from gpuguard.explain import explain_file
found = explain_file(PATH, match_local=False)
kinds = [d.kind for d in found]
""",
    # the obvious alternative: the whole file in memory, every pattern over it
    "read() + regex finditer": """
import re
import importlib
e = importlib.import_module("gpuguard.explain")  # the package attribute `explain` is the function
text = open(PATH, encoding="utf-8", errors="replace").read()
patterns = [p for r in e.RECOGNISERS for p in r.patterns]  # every recogniser's patterns
hits = sum(1 for p in patterns for _ in p.finditer(text))
kinds = ["(matches only: no grouping, ranks or explanation)"]
""",
    # the same per-line work as gpuguard, but the whole file read into a list of lines first
    "readlines() + LogExplainer": """
from gpuguard.explain import LogExplainer
lines = open(PATH, encoding="utf-8", errors="replace").readlines()
x = LogExplainer(match_local=False)
for line in lines:
    x.feed(line)
kinds = [d.kind for d in x.diagnoses()]
""",
}

RUNNER = """
import json, resource, sys, time
PATH = sys.argv[1]
import gpuguard.explain  # imports (torch included) are not part of the measurement
base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
start = time.perf_counter()
{body}
seconds = time.perf_counter() - start
peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
print(json.dumps({{"seconds": seconds, "rss_growth_mib": (peak - base) / 1024, "kinds": kinds}}))
"""


def make_log(path: Path, megabytes: int) -> None:
    noise = "".join(
        f"[rank{r % 64}]:[I1121 05:00:{r % 60:02d} train.py:{r}] step {r} loss 0.{r:04d} lr 3e-4 tok/s 81234\n"
        for r in range(4000)).encode()
    with open(path, "wb") as f:
        f.write(b"[rank7]: Duplicate GPU detected : rank 7 and rank 3 both on CUDA device 10000\n")
        while f.tell() < megabytes * 2**20:
            f.write(noise)
        f.write(b"[rank12]: torch.AcceleratorError: CUDA error: invalid device ordinal\n")


def run(body: str, path: Path) -> dict:
    env = dict(os.environ, PYTHONPATH=str(ROOT / "python"))
    proc = subprocess.run([sys.executable, "-c", RUNNER.format(body=body), str(path)], env=env,
                          capture_output=True, text=True, timeout=1800)
    if proc.returncode != 0:
        raise SystemExit(proc.stderr)
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--mb", type=int, default=100)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "job.log"
        make_log(path, args.mb)
        size_mib = path.stat().st_size / 2**20
        results = {}
        for name, body in CONTENDERS.items():
            runs = [run(body, path) for _ in range(args.repeat)]
            best = min(runs, key=lambda r: r["seconds"])
            results[name] = {"seconds": best["seconds"], "mib_per_s": size_mib / best["seconds"],
                             "rss_growth_mib": max(r["rss_growth_mib"] for r in runs), "kinds": best["kinds"]}
    ours = results["gpuguard explain_file"]
    print(f"log: {size_mib:.0f} MiB, best of {args.repeat}, {platform.processor() or platform.machine()}")
    print(f"{'contender':<26} {'seconds':>8} {'MiB/s':>8} {'peak RSS growth MiB':>20}")
    for name, r in results.items():
        print(f"{name:<26} {r['seconds']:>8.2f} {r['mib_per_s']:>8.1f} {r['rss_growth_mib']:>20.1f}")
    for name, r in results.items():
        if r is ours:
            continue
        print(f"gpuguard vs {name}: {r['seconds'] / ours['seconds']:.1f}x faster, peak RSS growth "
              f"{ours['rss_growth_mib']:.1f} MiB vs {r['rss_growth_mib']:.1f} MiB")
    out = ROOT / "benchmarks" / "results"
    out.mkdir(parents=True, exist_ok=True)
    (out / "explain.json").write_text(json.dumps({"log_mib": size_mib, "repeat": args.repeat,
                                                  "results": results}, indent=2))
    print(f"saved {out / 'explain.json'}")


if __name__ == "__main__":
    main()
