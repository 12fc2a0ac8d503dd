"""`gpuguard doctor --json` on a real one-GPU machine: --p2p and --nccl say why they did not run; NCCL is torch's."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

pytestmark = pytest.mark.gpu


def test_doctor_json_on_one_gpu(real_env, smi, report):
    """doctor --json lists the GPU nvidia-smi lists; the two-GPU checks say they need two instead of failing."""
    proc = subprocess.run([sys.executable, "-m", "gpuguard", "doctor", "--json", "--p2p", "--nccl"], env=real_env,
                          capture_output=True, text=True, timeout=300)
    report.record("exit", proc.returncode)
    report.record("doctor --json", proc.stdout[-4000:])
    doc = json.loads(proc.stdout)
    assert [d["uuid"] for d in doc["devices"]] == [r["uuid"] for r in smi]
    not_checked = json.dumps(doc.get("not_checked", doc))
    assert "1 GPU visible: a peer copy needs two" in not_checked
    assert "1 GPU visible: an all-reduce across GPUs needs two" in not_checked
    # gpuguard's NCCL is torch's, one file (issue 37: it was the system's 2.28.3 beside torch's 2.28.9)
    assert doc["nccl_libraries"]["same"] is True, doc["nccl_libraries"]
