"""The session's real SLURM cluster (tests/cluster/cluster.py) and helpers to run a rank program under it.

Skips every test here, with the reason, where the machine cannot run it (not root, no namespaces, no slurm).
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Iterator

import pytest

from gg_testing.env import fakes_dir
from gg_testing.cpu_time import *  # noqa: F401,F403  (each test's CPU seconds, for CI's table)

pytest_plugins = ("gg_testing.schedule",)  # a parallel step's costliest files first

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]

from .cluster import Cluster, missing_requirements

RANK_PROGRAM = HERE / "rank_program.py"


@pytest.fixture(scope="session")
def cluster() -> Iterator[Cluster]:
    reason = missing_requirements()
    if reason:
        pytest.skip(reason)
    fakes = fakes_dir(build=False)
    if fakes is None:
        pytest.skip("the fake CUDA driver is not built (run scripts/test.sh, or set GPUGUARD_FAKES_DIR)")
    # GPUGUARD_CLUSTER_PYTHONPATH: run these tests against another gpuguard tree (e.g. an older commit's)
    python_path = os.environ.get("GPUGUARD_CLUSTER_PYTHONPATH") or str(ROOT / "python")
    with Cluster(nodes=3, cpus=8, gpus=4, fakes_dir=fakes, python_path=python_path) as c:
        print(f"\ncluster: {c.nodes} nodes up in {c.timings['up_s']:.1f} s", file=sys.stderr)
        yield c


def results(text: str) -> list[dict]:
    """Every rank's result line (``GGRESULT {json}``) in ``text``, sorted by rank."""
    decoder = json.JSONDecoder()
    out = []
    at = text.find("GGRESULT ")
    while at >= 0:  # ranks share one pipe: a line may hold two results when their writes interleave
        doc, end = decoder.raw_decode(text, at + len("GGRESULT "))
        out.append(doc)
        at = text.find("GGRESULT ", end)
    return sorted(out, key=lambda r: (r.get("rank") if r.get("rank") is not None else -1))


def program(*args: str) -> list[str]:
    return [sys.executable, str(RANK_PROGRAM), *args]
