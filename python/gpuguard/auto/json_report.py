"""`gpuguard run --json-report FILE`: each rank appends one JSON line (its binding and verdict) to the file
named by GPUGUARD_JSON_REPORT; `gpuguard run` folds the lines into one document when the job ends."""

from __future__ import annotations

import json
import os
import socket
from typing import Any, Optional

from .framework_advice import framework_of

VARIABLE = "GPUGUARD_JSON_REPORT"


def write(context: Any, group: str, device_index: Optional[int], chosen_by: str, trigger: str, verdict: str,
          message: str) -> None:
    """Appends this rank's line (one ``write`` of one line under O_APPEND: lines of ranks never interleave)."""
    path = os.environ.get(VARIABLE)
    if not path:
        return
    row: dict[str, Any] = {
        "rank": context.rank, "world_size": context.world_size, "local_rank": context.local_rank,
        "launcher": context.launcher, "framework": framework_of(context), "group": group,
        "host": socket.gethostname(), "pid": os.getpid(),
        "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES"),
        "device": None if device_index is None else f"cuda:{device_index}", "chosen_by": chosen_by,
        "checked_at": trigger, "verdict": verdict, "message": message}
    data = (json.dumps(row, sort_keys=True) + "\n").encode()
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        while data:  # a local file takes it in one write; the loop is for a short write all the same
            data = data[os.write(fd, data):]
    finally:
        os.close(fd)


def collect(lines_path: str) -> dict[str, Any]:
    """The one document: every rank's row, sorted by group and rank, and a count of verdicts."""
    rows: list[dict[str, Any]] = []
    bad = 0
    try:
        with open(lines_path, encoding="utf-8") as f:
            for line in f:
                try:
                    row = json.loads(line)
                except ValueError:
                    bad += 1
                    continue
                if isinstance(row, dict):
                    rows.append(row)
    except FileNotFoundError:
        pass
    rows.sort(key=lambda r: (str(r.get("group")), int(r.get("rank", -1)) if isinstance(r.get("rank"), int) else -1))
    verdicts: dict[str, int] = {}
    for r in rows:
        verdicts[str(r.get("verdict"))] = verdicts.get(str(r.get("verdict")), 0) + 1
    return {"ranks": rows, "verdicts": verdicts, "unreadable_lines": bad}
