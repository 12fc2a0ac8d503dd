"""The GPU acceptance report: the facts and figures each check recorded, merged across the suite's pytest runs
and printed as one table (check, outcome, figure).

    python tests/python/gpu/acceptance_report.py OUT.json PART.json... [--note "build: 50 s"]...

merges the parts that pytest wrote (GPUGUARD_GPU_REPORT) into OUT.json and prints the table.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

# the keys of what a check puts in its test's user_properties (tests/python/gpu/conftest.py)
CHECK, FACT, FIGURE = "gpuguard check", "gpuguard fact: ", "gpuguard figure"


def jsonable(value: Any) -> Any:
    """``value`` as plain JSON data (pytest-xdist carries user_properties from its workers as such)."""
    return json.loads(json.dumps(value, default=str))


def check_name(nodeid: str) -> str:
    """'tests/python/gpu/test_gpu_nccl.py::test_x[a]' -> 'test_gpu_nccl.py::test_x[a]'."""
    path, _, rest = nodeid.partition("::")
    return f"{Path(path).name}::{rest}"


def merge(parts: list[dict[str, Any]]) -> dict[str, Any]:
    """One document from several runs' documents: the first's versions, every run's checks (a later run's
    entry for the same check replaces an earlier one's)."""
    doc: dict[str, Any] = {"versions": {}, "checks": {}}
    for part in parts:
        if not doc["versions"]:
            doc["versions"] = part.get("versions", {})
        doc["checks"].update(part.get("checks", {}))
    return doc


def table(doc: dict[str, Any], notes: tuple[str, ...] = ()) -> list[str]:
    """The report's last lines: versions, then one row per check (its outcome and figure), then the notes."""
    lines = [f"{key}: {value}" for key, value in doc.get("versions", {}).items()]
    checks = doc.get("checks", {})
    if not checks:
        return lines + ["(no check ran)"] + list(notes)
    width = min(max(len(name) for name in checks), 100)
    outcome_width = max(len("outcome"), *(len(_short(c["outcome"])) for c in checks.values()))
    lines.append(f"{'check':{width}}  {'outcome':{outcome_width}}  figure")
    for name, check in checks.items():
        lines.append(f"{name:{width}}  {_short(check['outcome']):{outcome_width}}  {check.get('figure') or '-'}")
    counts: dict[str, int] = {}
    for check in checks.values():
        counts[_short(check["outcome"])] = counts.get(_short(check["outcome"]), 0) + 1
    lines.append(", ".join(f"{n} {outcome}" for outcome, n in sorted(counts.items())))
    return lines + list(notes)


def _short(outcome: str) -> str:
    return outcome.split(":", 1)[0]


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out")
    parser.add_argument("parts", nargs="*")
    parser.add_argument("--note", action="append", default=[])
    args = parser.parse_args(argv)
    parts = [json.loads(Path(p).read_text()) for p in args.parts if Path(p).exists()]
    doc = merge(parts)
    doc["notes"] = args.note
    Path(args.out).write_text(json.dumps(doc, indent=2) + "\n")
    print("\n".join(table(doc, tuple(args.note))))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
