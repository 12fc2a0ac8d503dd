"""GPU acceptance fixtures: a real NVIDIA GPU or a clear skip, the real driver's environment, and the report.

Every test here compares gpuguard with the real thing (nvidia-smi, torch.cuda, NCCL's own text), never with
itself. Without a GPU each test is collected and skipped with the reason; `scripts/gpu_acceptance.sh` runs
them on a lent GPU machine and prints the report this module assembles (versions, then each check's outcome,
the facts it recorded and its figure). A test marked `gpu_alone` measures something another test on the same GPU
would disturb (a time, the GPU's memory, the processes on it): the script runs those after the others, one at a
time.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any, Optional

import pytest

from .acceptance_report import CHECK, FACT, FIGURE, check_name, jsonable, table
from .gpu_support import RESULTS_VARIABLE, nvidia_smi

ROOT = Path(__file__).resolve().parents[3]
# variables that point gpuguard at the fakes, or that a launcher running this suite would leak into children
_SCRUB = ("GPUGUARD_LIBCUDA", "GPUGUARD_LIBNCCL", "GPUGUARD_LIBNVML", "GPUGUARD_FAKE_GPU_STATE_DIR",
          "GPUGUARD_FAKE_TOPOLOGY", "GPUGUARD_FAKE_CALL_LOG", "GPUGUARD", "GPUGUARD_LAUNCHER", RESULTS_VARIABLE,
          "GPUGUARD_FAKE_NCCL_DIR", "CUDA_VISIBLE_DEVICES", "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE",
          "MASTER_ADDR", "MASTER_PORT", "TORCHELASTIC_RUN_ID", "GROUP_RANK")


_SMI_ROWS, _NO_GPU_REASON = nvidia_smi()


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "gpu_alone: measures what another test on the GPU would disturb (a time, "
                                       "its memory, its processes): scripts/gpu_acceptance.sh runs it alone")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    # the marker, not item.keywords: those hold this package's name, "gpu", for every test in it
    skip = pytest.mark.skip(reason=f"needs a real NVIDIA GPU: {_NO_GPU_REASON}")
    for item in items:
        if item.get_closest_marker("gpu") is None:
            continue
        item.user_properties.append((CHECK, True))  # its reports, wherever pytest-xdist ran it, say it is a check
        if not _SMI_ROWS:
            item.add_marker(skip)


@pytest.fixture(scope="session")
def smi() -> list[dict[str, str]]:
    """nvidia-smi's rows for the GPUs of this machine."""
    return _SMI_ROWS


@pytest.fixture(scope="session")
def real_env() -> dict[str, str]:
    """An environment in which gpuguard loads the real libcuda and NCCL, and imports from this source tree."""
    env = {k: v for k, v in os.environ.items() if k not in _SCRUB}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT / "python")] + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
    env["PYTHONUNBUFFERED"] = "1"
    return env


class Report:
    """What one test records for the report: facts (texts, versions, timings) and its figure, the one measured
    number that sums the check up. Kept in the test's user_properties, which pytest-xdist carries from its
    workers to the process that prints the report."""

    def __init__(self, node: pytest.Item) -> None:
        self.node = node

    def record(self, key: str, value: Any) -> None:
        self.node.user_properties.append((FACT + key, jsonable(value)))

    def figure(self, value: float, unit: str, what: str = "") -> None:
        """The check's figure, e.g. figure(1.1, "s", "both ranks stopped"): '1.1 s (both ranks stopped)'."""
        text = f"{value:.4g} {unit}".rstrip() + (f" ({what})" if what else "")
        self.node.user_properties.append((FIGURE, text))


@pytest.fixture
def report(request: pytest.FixtureRequest) -> Report:
    return Report(request.node)


class _Checks:
    """The controller's view of every `gpu` check: outcome, facts, figure (by check name, in run order)."""

    def __init__(self) -> None:
        self.checks: dict[str, dict[str, Any]] = {}

    def add(self, report: pytest.TestReport) -> None:
        if (CHECK, True) not in report.user_properties:
            return
        check = self.checks.setdefault(check_name(report.nodeid), {"outcome": "", "facts": {}, "figure": None})
        for key, value in report.user_properties:
            if key == FIGURE:
                check["figure"] = value
            elif key.startswith(FACT):
                check["facts"][key[len(FACT):]] = value
        if (report.when == "call" or (report.when == "setup" and not report.passed)
                or (report.when == "teardown" and report.failed and not check["outcome"].startswith("failed"))):
            outcome = report.outcome
            if report.skipped and isinstance(report.longrepr, tuple):
                outcome = f"skipped: {report.longrepr[2].removeprefix('Skipped: ')}"
            elif report.failed:
                where = "" if report.when == "call" else f" in {report.when}"
                crash = getattr(report.longrepr, "reprcrash", None)  # the exception's own line
                said = crash.message if crash is not None else str(report.longrepr)
                outcome = f"failed{where}: " + (said.strip().splitlines() or [""])[0][:300]
            check["outcome"] = outcome


CHECKS = _Checks()


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    CHECKS.add(report)


def _versions(rows: list[dict[str, str]]) -> dict[str, Any]:
    versions: dict[str, Any] = {"python": sys.version.split()[0]}
    if rows:
        versions["gpu"] = [f"{r['index']}: {r['name']} {r['uuid']} {r['pci.bus_id']} {r['memory.total']} MiB"
                           for r in rows]
        versions["driver"] = rows[0]["driver_version"]
    try:
        import torch
        versions["torch"] = torch.__version__
        versions["torch CUDA"] = torch.version.cuda
        nccl = torch.cuda.nccl.version() if torch.cuda.is_available() else None
        versions["NCCL (torch)"] = ".".join(map(str, nccl)) if isinstance(nccl, tuple) else nccl
    except Exception as e:  # the report must come out even when torch is broken
        versions["torch"] = f"could not collect: {e}"
    return versions


def pytest_terminal_summary(terminalreporter: Any, config: pytest.Config) -> None:
    if hasattr(config, "workerinput"):  # a pytest-xdist worker: the controller reports
        return
    path: Optional[str] = os.environ.get("GPUGUARD_GPU_REPORT")
    checks = CHECKS.checks
    ran = any(not c["outcome"].startswith("skipped") for c in checks.values())
    if not checks or not (ran or path):
        return
    doc = {"versions": _versions(_SMI_ROWS), "checks": checks}
    out = terminalreporter
    out.section("gpuguard GPU acceptance report")
    for name, check in checks.items():
        out.line(f"{name}: {check['outcome']}")
        for key, value in check["facts"].items():
            text = value if isinstance(value, str) else json.dumps(value)
            out.line(f"    {key}: {text[:2000]}")
    out.line("")
    for line in table(doc):
        out.line(line)
    if path:
        Path(path).write_text(json.dumps(doc, indent=2, default=str) + "\n")
