"""Prints CI's closing table: each corner's steps and their seconds, the slowest tests of the whole run and those
costing the most CPU, then the failed tests.

    python3 .ci/report.py OUT_DIR [N]

OUT_DIR holds steps.tsv (corner, step, seconds, exit status, % of the machine's CPU time busy, second of CI it
started at: one line a step, written by .ci/run) and the JUnit XML files pytest wrote there (junit-*.xml), with each test's CPU seconds where
tests/gg_testing/cpu_time.py recorded them (this machine is CPU-bound: wall times say more about a test's
neighbours). Last come the failed tests, each with the statement that failed and its error, so that the end of
CI's log (often all that is kept of it) says why. Standard library only: it runs with whatever python3 the
machine has, even when a corner's venv could not be made.
"""

from __future__ import annotations

import sys
import xml.etree.ElementTree as ElementTree
from pathlib import Path


def steps(out: Path) -> list[tuple[str, str, int, int, str, str]]:
    """(corner, step, seconds, exit status, "busy %", second it started at) for each step, in the order they ended."""
    rows = []
    path = out / "steps.tsv"
    if path.exists():
        for line in path.read_text().splitlines():
            corner, step, seconds, status, *rest = line.split("\t")
            busy = f"{rest[0]}%" if rest else ""
            rows.append((corner, step, int(seconds), int(status), busy, rest[1] if len(rest) > 1 else ""))
    return rows


Case = tuple[str, str, ElementTree.Element]  # corner, test, its <testcase>


def cases(out: Path) -> list[Case]:
    """(corner, test, its <testcase>) for every test in every JUnit file, each file parsed once."""
    found = []
    for junit in sorted(out.glob("junit-*.xml")):
        corner = junit.stem.removeprefix("junit-")
        try:
            root = ElementTree.parse(junit).getroot()
        except ElementTree.ParseError as error:  # a pytest killed mid-write: say so, keep the rest of the table
            print(f"ci: {junit.name} is not readable XML ({error})")
            continue
        for case in root.iter("testcase"):
            found.append((corner, f"{case.get('classname', '')}::{case.get('name', '')}", case))
    return found


def test_times(tests: list[Case], what: str = "time") -> list[tuple[float, str, str]]:
    """(seconds, corner, test) for every test: its wall time, or (``what="cpu_s"``) the CPU seconds
    tests/gg_testing/cpu_time.py recorded for it (tests without that property are left out)."""
    times = []
    for corner, name, case in tests:
        if what == "time":
            times.append((float(case.get("time", 0.0)), corner, name))
            continue
        values = [p.get("value") for p in case.iter("property") if p.get("name") == what]
        if values:
            times.append((float(values[0] or 0.0), corner, name))
    return times


def failures(tests: list[Case], width: int) -> list[tuple[str, str, str]]:
    """(corner, test, the start of its failure's text) for every test that failed or errored."""
    return [(corner, name, why(outcome, width)) for corner, name, case in tests
            for outcome in (*case.findall("failure"), *case.findall("error"))]


def why(outcome: ElementTree.Element, width: int) -> str:
    """The statement that failed (pytest's last '>' line) and the start and end of the error's lines ('E'), on
    one line of at most about ``width`` characters; pytest's one-line message where there is no traceback."""
    lines = (outcome.text or "").splitlines()
    statement = next((line[1:].strip() for line in reversed(lines) if line.startswith(">")), "")
    error = " ".join(" ".join(line[1:].split()) for line in lines if line.startswith("E "))
    error = error or " ".join((outcome.get("message") or "").split())
    if len(error) > width:
        error = f"{error[:width // 2]} [...] {error[-width // 2:]}"
    return f"at `{statement[:120]}`: {error}" if statement else error


def slowest_files(tests: list[tuple[float, str, str]], count: int) -> list[tuple[float, int, str, str]]:
    """(seconds, tests, corner, file): where a corner's test time goes, a file at a time."""
    files: dict[tuple[str, str], list[float]] = {}
    for seconds, corner, name in tests:
        files.setdefault((corner, name.split("::")[0]), []).append(seconds)
    return sorted(((sum(t), len(t), corner, name) for (corner, name), t in files.items()), reverse=True)[:count]


def main() -> None:
    out = Path(sys.argv[1])
    count = int(sys.argv[2]) if len(sys.argv) > 2 else 10
    rows = steps(out)
    print("\nci: where the time went")
    print(f"{'corner':<8} {'step':<44} {'seconds':>8} {'CPU busy':>8} {'from s':>7}  status")
    corners: dict[str, int] = {}
    for corner, step, seconds, status, busy, started in rows:
        print(f"{corner:<8} {step:<44} {seconds:>8} {busy:>8} {started:>7}  "
              f"{'ok' if status == 0 else f'FAILED ({status})'}")
        corners[corner] = corners.get(corner, 0) + seconds
    for corner, seconds in corners.items():
        print(f"{corner:<8} {'(corner total)':<44} {seconds:>8}")
    print(f"{'all':<8} {'(steps total)':<44} {sum(corners.values()):>8}   (the two lanes overlap: CI's own time "
          f"is its last line)")
    parsed = cases(out)
    tests = test_times(parsed)
    if tests:
        print(f"\nci: the {count} slowest test files (seconds summed over their tests; parallel steps overlap them)")
        for seconds, n, corner, name in slowest_files(tests, count):
            print(f"{seconds:8.1f} s  {n:4d} tests  {corner:<18} {name}")
        print(f"\nci: the {count} slowest tests")
        for seconds, corner, name in sorted(tests, reverse=True)[:count]:
            print(f"{seconds:8.1f} s  {corner:<18} {name}")
    cpu = test_times(parsed, "cpu_s")
    if cpu:  # on a CPU-bound machine a test's wall time says more about its neighbours than about it
        print(f"\nci: the {count} test files costing the most CPU (seconds of all their processes; "
              f"{sum(t for t, _, _ in cpu):.0f} s for all {len(cpu)} tests)")
        for seconds, n, corner, name in slowest_files(cpu, count):
            print(f"{seconds:8.1f} s  {n:4d} tests  {corner:<18} {name}")
        print(f"\nci: the {count} tests costing the most CPU")
        for seconds, corner, name in sorted(cpu, reverse=True)[:count]:
            print(f"{seconds:8.1f} s  {corner:<18} {name}")
    failed = failures(parsed, 300)  # short: what CI's caller shows of the output is its last few thousand characters
    if failed:
        print(f"\nci: {len(failed)} failed tests, each with the statement that failed and its error (start and end)")
        for corner, name, text in failed:
            print(f"{corner:<18} {name}\n    {text}")


if __name__ == "__main__":
    main()
