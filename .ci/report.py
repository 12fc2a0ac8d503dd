"""Prints CI's closing table: each corner's steps and their seconds, then the slowest tests of the whole run.

    python3 .ci/report.py OUT_DIR [N]

OUT_DIR holds steps.tsv (corner, step, seconds, exit status: one line a step, written by .ci/run) and the
JUnit XML files pytest wrote there (junit-*.xml). Standard library only: it runs with whatever python3 the
machine has, even when a corner's venv could not be made.
"""

from __future__ import annotations

import sys
import xml.etree.ElementTree as ElementTree
from pathlib import Path


def steps(out: Path) -> list[tuple[str, str, int, int]]:
    rows = []
    path = out / "steps.tsv"
    if path.exists():
        for line in path.read_text().splitlines():
            corner, step, seconds, status = line.split("\t")
            rows.append((corner, step, int(seconds), int(status)))
    return rows


def slowest_tests(out: Path, count: int) -> list[tuple[float, str, str]]:
    tests = []
    for junit in sorted(out.glob("junit-*.xml")):
        corner = junit.stem.removeprefix("junit-")
        try:
            root = ElementTree.parse(junit).getroot()
        except ElementTree.ParseError as error:  # a pytest killed mid-write: say so, keep the rest of the table
            print(f"ci: {junit.name} is not readable XML ({error})")
            continue
        for case in root.iter("testcase"):
            name = f"{case.get('classname', '')}::{case.get('name', '')}"
            tests.append((float(case.get("time", 0.0)), corner, name))
    return sorted(tests, reverse=True)[:count]


def main() -> None:
    out = Path(sys.argv[1])
    count = int(sys.argv[2]) if len(sys.argv) > 2 else 10
    rows = steps(out)
    print("\nci: where the time went")
    print(f"{'corner':<8} {'step':<44} {'seconds':>8}  status")
    corners: dict[str, int] = {}
    for corner, step, seconds, status in rows:
        print(f"{corner:<8} {step:<44} {seconds:>8}  {'ok' if status == 0 else f'FAILED ({status})'}")
        corners[corner] = corners.get(corner, 0) + seconds
    for corner, seconds in corners.items():
        print(f"{corner:<8} {'(corner total)':<44} {seconds:>8}")
    print(f"{'all':<8} {'(steps total)':<44} {sum(corners.values()):>8}")
    slow = slowest_tests(out, count)
    if slow:
        print(f"\nci: the {len(slow)} slowest tests")
        for seconds, corner, name in slow:
            print(f"{seconds:8.1f} s  {corner:<14} {name}")


if __name__ == "__main__":
    main()
