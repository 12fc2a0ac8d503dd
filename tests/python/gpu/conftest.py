"""GPU acceptance fixtures: a real NVIDIA GPU or a clear skip, the real driver's environment, and the report.

Every test here compares gpuguard with the real thing (nvidia-smi, torch.cuda, NCCL's own text), never with
itself. Without a GPU each test is collected and skipped with the reason; `scripts/gpu_acceptance.sh` runs
them on a lent GPU machine and prints the report this module assembles (versions, then each check's outcome
and the facts it recorded).
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

import pytest

from .gpu_support import nvidia_smi

ROOT = Path(__file__).resolve().parents[3]
# variables that point gpuguard at the fakes, or that a launcher running this suite would leak into children
_SCRUB = ("GPUGUARD_LIBCUDA", "GPUGUARD_LIBNCCL", "GPUGUARD_LIBNVML", "GPUGUARD_FAKE_GPU_STATE_DIR",
          "GPUGUARD_FAKE_TOPOLOGY", "GPUGUARD_FAKE_CALL_LOG",
          "GPUGUARD_FAKE_NCCL_DIR", "CUDA_VISIBLE_DEVICES", "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE",
          "MASTER_ADDR", "MASTER_PORT", "TORCHELASTIC_RUN_ID", "GROUP_RANK")


_SMI_ROWS, _NO_GPU_REASON = nvidia_smi()


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if _SMI_ROWS:
        return
    skip = pytest.mark.skip(reason=f"needs a real NVIDIA GPU: {_NO_GPU_REASON}")
    for item in items:
        if "gpu" in item.keywords:
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
    """Facts the GPU tests record (versions, texts, timings), keyed by test; printed and saved at the end."""

    def __init__(self) -> None:
        self.facts: dict[str, dict[str, Any]] = {}
        self.outcomes: dict[str, str] = {}
        self.current = "session"

    def record(self, key: str, value: Any) -> None:
        self.facts.setdefault(self.current, {})[key] = value


REPORT = Report()


@pytest.fixture
def report(request: pytest.FixtureRequest) -> Report:
    REPORT.current = request.node.name
    return REPORT


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    name = report.nodeid.rsplit("::", 1)[-1]
    if "gpu" not in report.keywords:
        return
    if report.when == "call" or (report.when == "setup" and report.outcome != "passed"):
        outcome = report.outcome
        if report.skipped and isinstance(report.longrepr, tuple):
            outcome = f"skipped: {report.longrepr[2]}"
        elif report.failed:
            outcome = "FAILED: " + str(report.longrepr).strip().splitlines()[-1][:300]
        REPORT.outcomes[name] = outcome


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


def pytest_terminal_summary(terminalreporter: Any) -> None:
    ran = any(not o.startswith("skipped") for o in REPORT.outcomes.values())
    if not REPORT.outcomes or not (ran or os.environ.get("GPUGUARD_GPU_REPORT")):
        return
    doc = {"versions": _versions(_SMI_ROWS), "outcomes": REPORT.outcomes, "facts": REPORT.facts}
    out = terminalreporter
    out.section("gpuguard GPU acceptance report")
    for key, value in doc["versions"].items():
        out.line(f"{key}: {value}")
    for name, outcome in REPORT.outcomes.items():
        out.line(f"{outcome.split(':')[0].upper():8} {name}" + (f"  ({outcome})" if ":" in outcome else ""))
        for key, value in REPORT.facts.get(name, {}).items():
            text = value if isinstance(value, str) else json.dumps(value)
            out.line(f"    {key}: {text[:2000]}")
    path = os.environ.get("GPUGUARD_GPU_REPORT")
    if path:
        Path(path).write_text(json.dumps(doc, indent=2, default=str) + "\n")
