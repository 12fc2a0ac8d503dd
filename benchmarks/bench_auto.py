"""Cost of the zero-code mode (gpuguard.auto), each beside the same thing without gpuguard, as ratios:

1. interpreter start (``python -c pass``) with gpuguard's .pth installed and GPUGUARD unset, vs not installed;
2. ``import torch`` plus ``gpuguard.auto``'s arming under GPUGUARD=1, vs ``import torch`` alone;
3. a 1,000-step forward loop of a small model under GPUGUARD=1 (the excepthook, the set_device wrapper and
   the DDP/FSDP wrappers in place), vs without.

"Installed" is a site folder holding gpuguard_auto.pth (read at start-up through ``site.addsitedir``, exactly as
site-packages is), beside an identical site folder without it, so both sides pay the same sitecustomize.
Each case runs fresh interpreters, alternating the two sides, and reports medians.

    python benchmarks/bench_auto.py [--starts 40] [--imports 8] [--steps 1000]
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

SITE_HOOK = "import os, site\nif os.environ.get('BENCH_SITE'):\n    site.addsitedir(os.environ['BENCH_SITE'])\n"

LOOP = """
import sys, time, torch
from torch import nn
torch.manual_seed(0)
model = nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 64), nn.ReLU(), nn.Linear(64, 10))
x = torch.randn(32, 64)
with torch.no_grad():
    for _ in range(50):
        model(x)
    start = time.perf_counter()
    for _ in range({steps}):
        model(x)
    print(time.perf_counter() - start)
"""

IMPORT = """
import time
start = time.perf_counter()
import torch
print(time.perf_counter() - start)
"""


def folders(tmp: Path) -> tuple[Path, Path, Path]:
    hook = tmp / "hook"
    hook.mkdir()
    (hook / "sitecustomize.py").write_text(SITE_HOOK)
    with_pth, without = tmp / "with", tmp / "without"
    with_pth.mkdir()
    without.mkdir()
    shutil.copy(ROOT / "python" / "gpuguard_auto.pth", with_pth)
    return hook, with_pth, without


def env_for(hook: Path, site: Path, gpuguard: bool) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("GPUGUARD", "PYTHONPATH")}
    # the installed gpuguard, or the caller's PYTHONPATH=python for this checkout's in-place build
    inherited = [os.environ["PYTHONPATH"]] if os.environ.get("PYTHONPATH") else []
    env["PYTHONPATH"] = os.pathsep.join([str(hook)] + inherited)
    env["BENCH_SITE"] = str(site)
    env["OMP_NUM_THREADS"] = "1"  # one thread: the loop measures the Python path, not the scheduler
    if gpuguard:
        env["GPUGUARD"] = "1"
    return env


def wall(cmd: list[str], env: dict[str, str]) -> float:
    start = time.perf_counter()
    subprocess.run(cmd, env=env, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return time.perf_counter() - start


def reported(code: str, env: dict[str, str]) -> float:
    out = subprocess.run([sys.executable, "-c", code], env=env, check=True, capture_output=True, text=True)
    return float(out.stdout.strip().splitlines()[-1])


def compare(name: str, a: list[float], b: list[float], unit: str = "ms", scale: float = 1e3) -> None:
    ma, mb = statistics.median(a), statistics.median(b)
    spread = statistics.pstdev(b) * scale
    print(f"{name:62s} {ma * scale:9.2f} {unit} vs {mb * scale:9.2f} {unit}   ratio {ma / mb:.3f}   "
          f"(baseline spread ±{spread:.2f} {unit})")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--starts", type=int, default=40)
    parser.add_argument("--imports", type=int, default=8)
    parser.add_argument("--steps", type=int, default=1000)
    parser.add_argument("--loops", type=int, default=5)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        hook, with_pth, without = folders(Path(tmp))
        installed, bare = env_for(hook, with_pth, False), env_for(hook, without, False)
        a, b = [], []
        for _ in range(args.starts):
            a.append(wall([sys.executable, "-c", "pass"], installed))
            b.append(wall([sys.executable, "-c", "pass"], bare))
        compare("interpreter start, .pth installed + GPUGUARD unset vs none", a, b)

        on, off = env_for(hook, with_pth, True), env_for(hook, without, False)
        a, b = [], []
        for _ in range(args.imports):
            a.append(reported(IMPORT, on))
            b.append(reported(IMPORT, off))
        compare("import torch (+ gpuguard.auto armed) under GPUGUARD=1 vs without", a, b)

        loop = LOOP.replace("{steps}", str(args.steps))
        a, b = [], []
        for _ in range(args.loops):
            a.append(reported(loop, on))
            b.append(reported(loop, off))
        compare(f"{args.steps}-step forward loop under GPUGUARD=1 vs without", a, b)


if __name__ == "__main__":
    main()
