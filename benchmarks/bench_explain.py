"""gpuguard explain over large logs vs the obvious alternatives, and its time per MB as logs grow and change shape.

Part 1, one ordinary NCCL_DEBUG=INFO-like log (--mb, default 64 MiB), each contender in its own process:
  - gpuguard explain_file: the C++ reader (gpuguard._core.Scanner) hands Python only the lines with a keyword;
  - the Python line loop explain used before it (iter_lines, a substring test per keyword per line), and with
    --before, the explain_file of a checkout from before the C++ reader (its own keywords and recognisers);
  - `grep -c -F` with the same keywords (the floor: one C pass that only counts).
  Prints seconds, MiB/s and the ratios (targets: >= 10x the Python loop, within 3x of grep).
Part 2, time per MiB at 1, 4, 16 and 64 MiB for an ordinary log and for the long-line shapes of issue 15 (16 KB
  lines opening like a known message; lines of 16,000 letters ending in " invalid device ordinal"), plus one
  --big-mb (default 200) MiB ordinary log: a reader linear in its input shows a flat column (printed, not asserted).
Saves JSON under benchmarks/results/. Usage: python benchmarks/bench_explain.py [--mb 64] [--big-mb 200] [--repeat 3] [--before ../main/python]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Callable

ROOT = Path(__file__).resolve().parents[1]
ENV = dict(os.environ)  # the installed gpuguard; PYTHONPATH=python measures this checkout's in-place build

CONTENDERS = {
    "gpuguard explain_file": """
from gpuguard.logs import explain_file
kinds = [d.kind for d in explain_file(PATH, match_local=False)]
""",
    "Python line loop (before)": """
from gpuguard.logs import KEYWORDS, iter_lines
hits = 0
with open(PATH, "rb") as f:
    for line in iter_lines(f):
        for k in KEYWORDS:
            if k in line:
                hits += 1
                break
kinds = [f"{hits} lines with a keyword (no diagnosis)"]
""",
}

RUNNER = """
import json, sys, time
PATH = sys.argv[1]
import gpuguard.logs  # imports are not part of the measurement
start = time.perf_counter()
{body}
print(json.dumps({{"seconds": time.perf_counter() - start, "kinds": kinds}}))
"""


def ordinary_block() -> bytes:
    lines = []
    for r in range(4000):
        rank, dev = r % 64, r % 8
        lines.append(f"node{rank // 8:02d}:{41000 + rank}:{41100 + rank} [{dev}] NCCL INFO Channel {r % 32:02d}/0 : "
                     f"{rank}[{dev}] -> {(rank + 1) % 64}[{(dev + 1) % 8}] via P2P/CUMEM/read\n")
        lines.append(f"[rank{rank}]:[I1121 05:00:{r % 60:02d} train.py:{r}] step {r} loss 0.{r:04d} lr 3e-4 "
                     f"tok/s 81234\n")
    return "".join(lines).encode()


def long_openings_block() -> bytes:
    openings = ["Duplicate GPU detected ", "WorkNCCL(SeqNum=1, OpType=ALLREDUCE",
                "Expected all tensors to be on the same device, but found at least two devices, "]
    return "".join(o + "a" * 16000 + "\n" for o in openings).encode()


def long_ordinal_block() -> bytes:
    return ("a" * 16000 + " invalid device ordinal\n").encode()


SHAPES: dict[str, Callable[[], bytes]] = {
    "ordinary NCCL INFO log": ordinary_block,
    "16 KB lines opening like a message": long_openings_block,
    "16,000 letters + ' invalid device ordinal'": long_ordinal_block,
}


def make_log(path: Path, mib: float, block: bytes) -> None:
    with open(path, "wb") as f:
        f.write(b"[rank7]: Duplicate GPU detected : rank 7 and rank 3 both on CUDA device 10000\n")
        while f.tell() < mib * 2**20:
            f.write(block)
        f.write(b"[rank12]: torch.AcceleratorError: CUDA error: invalid device ordinal\n")


def run(body: str, path: Path, pythonpath: str = "") -> dict:
    env = dict(ENV, PYTHONPATH=pythonpath) if pythonpath else ENV
    proc = subprocess.run([sys.executable, "-c", RUNNER.format(body=body), str(path)], env=env,
                          capture_output=True, text=True, timeout=3600)
    if proc.returncode != 0:
        raise SystemExit(proc.stderr)
    return json.loads(proc.stdout.strip().splitlines()[-1])


def grep_seconds(path: Path) -> float:
    from gpuguard.logs import KEYWORDS

    args = ["grep", "-c", "-F"] + [a for k in KEYWORDS for a in ("-e", k)] + [str(path)]
    start = time.perf_counter()
    # output to a pipe, not /dev/null: GNU grep stops at the first match when its output is /dev/null
    subprocess.run(args, stdout=subprocess.PIPE, check=False)
    return time.perf_counter() - start


def best(f: Callable[[], float], repeat: int) -> float:
    return min(f() for _ in range(repeat))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--mb", type=float, default=64)
    parser.add_argument("--big-mb", type=float, default=200)
    parser.add_argument("--sizes", default="1,4,16,64")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--before", metavar="PYTHONPATH",
                        help="the python/ folder of a checkout before the C++ reader (e.g. main's): its explain_file "
                             "joins part 1 as 'explain_file before'")
    args = parser.parse_args()
    results: dict = {"machine": platform.processor() or platform.machine(), "repeat": args.repeat}
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "job.log"
        make_log(path, args.mb, ordinary_block())
        size = path.stat().st_size / 2**20
        head = {}
        for name, body in CONTENDERS.items():
            head[name] = best(lambda: run(body, path)["seconds"], args.repeat)
        if args.before:
            head["explain_file before"] = best(
                lambda: run(CONTENDERS["gpuguard explain_file"], path, args.before)["seconds"], args.repeat)
        head["grep -c -F (same keywords)"] = best(lambda: grep_seconds(path), args.repeat)
        kinds = run(CONTENDERS["gpuguard explain_file"], path)["kinds"]
        print(f"1. an ordinary log of {size:.0f} MiB, best of {args.repeat}, {results['machine']}; "
              f"gpuguard found {kinds}")
        print(f"   {'contender':<30} {'seconds':>8} {'MiB/s':>8}")
        for name, seconds in head.items():
            print(f"   {name:<30} {seconds:>8.3f} {size / seconds:>8.0f}")
        ours = head["gpuguard explain_file"]
        print(f"   gpuguard vs the Python line loop: {head['Python line loop (before)'] / ours:.1f}x faster "
              f"(target >= 10x)")
        if args.before:
            print(f"   gpuguard vs explain_file before: {head['explain_file before'] / ours:.1f}x faster "
                  f"(target >= 10x)")
        print(f"   gpuguard vs grep -c -F: {ours / head['grep -c -F (same keywords)']:.2f}x grep's time (target <= 3x)")
        results["ordinary"] = {"mib": size, "seconds": head}

        print("2. time per MiB as the log grows (a linear reader gives a flat row)")
        sizes = [float(s) for s in args.sizes.split(",")]
        print(f"   {'shape':<44}" + "".join(f"{f'{s:g} MiB':>10}" for s in sizes) + f"{'max/min':>9}")
        results["scaling"] = {}
        for shape, block in SHAPES.items():
            per_mb = []
            for s in sizes:
                make_log(path, s, block())
                mib = path.stat().st_size / 2**20
                per_mb.append(best(lambda: run(CONTENDERS["gpuguard explain_file"], path)["seconds"],
                                   args.repeat) / mib)
            results["scaling"][shape] = dict(zip(map(str, sizes), per_mb))
            print(f"   {shape:<44}" + "".join(f"{t * 1000:>8.2f}ms" for t in per_mb) +
                  f"{max(per_mb) / min(per_mb):>9.2f}")
        make_log(path, args.big_mb, ordinary_block())
        mib = path.stat().st_size / 2**20
        seconds = best(lambda: run(CONTENDERS["gpuguard explain_file"], path)["seconds"], 1)
        results["big"] = {"mib": mib, "seconds": seconds}
        print(f"   an ordinary log of {mib:.0f} MiB: {seconds:.2f} s, {seconds / mib * 1000:.2f} ms per MiB "
              f"({mib / seconds:.0f} MiB/s)")
    out = ROOT / "benchmarks" / "results"
    out.mkdir(parents=True, exist_ok=True)
    (out / "explain.json").write_text(json.dumps(results, indent=2))
    print(f"saved {out / 'explain.json'}")


if __name__ == "__main__":
    main()
