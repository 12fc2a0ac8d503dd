"""`gpuguard run [--json-report FILE] -- CMD ARGS...`: runs the job with GPUGUARD=1, so every Python process
it starts (torchrun's workers, srun/mpirun ranks, Ray workers inheriting the variable) arms gpuguard.auto at
interpreter start; with --json-report, folds every rank's line into one JSON document when the job ends."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from typing import Any, Optional, Sequence

from . import json_report


def run(command: Sequence[str], report_path: Optional[str] = None) -> int:
    if not command:
        print("gpuguard run: give the command to run after --, e.g. gpuguard run -- torchrun "
              "--nproc_per_node 8 train.py", file=sys.stderr)
        return 2
    env = dict(os.environ, GPUGUARD="1")
    lines_path = None
    if report_path:
        lines_path = f"{report_path}.{os.getpid()}.lines"
        try:
            os.unlink(lines_path)
        except FileNotFoundError:
            pass
        env[json_report.VARIABLE] = os.path.abspath(lines_path)
    try:
        proc = subprocess.Popen(list(command), env=env)
    except OSError as exc:
        print(f"gpuguard run: cannot start {command[0]!r}: {exc.strerror or exc}", file=sys.stderr)
        return 127

    def forward(signum: int, _frame: Any) -> None:
        proc.send_signal(signum)

    previous = {s: signal.signal(s, forward) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        status = proc.wait()
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
    if report_path and lines_path:
        document = dict(json_report.collect(lines_path), command=list(command), exit_status=status)
        with open(report_path, "w", encoding="utf-8") as f:
            json.dump(document, f, indent=2, sort_keys=True)
            f.write("\n")
        try:
            os.unlink(lines_path)
        except FileNotFoundError:
            pass
    return status if status >= 0 else 128 - status
