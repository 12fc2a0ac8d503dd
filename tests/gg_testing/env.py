"""The environments test processes run in: the fake GPUs (tests/fakes), no driver at all, the zero-code start-up
path, and the same without the launcher variables of whatever runs the suite. Also the launcher variable sets
that several launcher tests share."""

from __future__ import annotations

import json
import os
import subprocess
import tempfile
from pathlib import Path
from typing import Any, Optional

from .paths import ROOT, SITE_HOOK, TOPOLOGIES

LAUNCHER_PREFIXES = ("TORCHELASTIC_", "SLURM_", "OMPI_", "PMI_", "PMIX_", "MV2_", "JSM_", "MPI_LOCAL", "KUBERNETES_",
                     "PET_", "GPUGUARD_LAUNCHER", "GPUGUARD_GROUP", "RAY_EXPERIMENTAL_NOSET")
LAUNCHER_NAMES = {"RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK", "NODE_RANK", "LOCAL_SIZE",
                  "CROSS_RANK", "CROSS_SIZE"}

TORCHRUN = {  # torchrun --nnodes=2 --nproc_per_node=4, second node, its second worker
    "TORCHELASTIC_RUN_ID": "job-42", "TORCHELASTIC_RESTART_COUNT": "0", "TORCHELASTIC_MAX_RESTARTS": "0",
    "TORCHELASTIC_USE_AGENT_STORE": "True", "MASTER_ADDR": "node0", "MASTER_PORT": "29500",
    "RANK": "5", "LOCAL_RANK": "1", "WORLD_SIZE": "8", "LOCAL_WORLD_SIZE": "4", "GROUP_RANK": "1",
    "ROLE_RANK": "5", "ROLE_WORLD_SIZE": "8", "GROUP_WORLD_SIZE": "2",
}

SLURM_2x5_RANK7 = {  # srun -N2 --ntasks-per-node=5: global rank 7 is local rank 2 on node 1
    "SLURM_JOB_ID": "1234", "SLURM_STEP_ID": "0", "SLURM_STEPID": "0", "SLURM_PROCID": "7",
    "SLURM_LOCALID": "2", "SLURM_NODEID": "1", "SLURM_NTASKS": "10", "SLURM_NPROCS": "10",
    "SLURM_STEP_NUM_TASKS": "10", "SLURM_STEP_NUM_NODES": "2", "SLURM_NNODES": "2",
    "SLURM_TASKS_PER_NODE": "5(x2)", "SLURM_STEP_TASKS_PER_NODE": "5(x2)", "SLURM_NTASKS_PER_NODE": "5",
    "SLURM_JOB_NUM_NODES": "2", "SLURMD_NODENAME": "gpu-n1",
}


def scrubbed(env: dict[str, str]) -> dict[str, str]:
    """Without the launcher variables of whatever runs this test suite (CI under srun, say)."""
    return {k: v for k, v in env.items() if k not in LAUNCHER_NAMES and not k.startswith(LAUNCHER_PREFIXES)}


def with_source_tree(env: dict[str, str]) -> dict[str, str]:
    """``env`` importing gpuguard from this source tree (python/) before anything on its PYTHONPATH."""
    env["PYTHONPATH"] = os.pathsep.join(
        [str(ROOT / "python")] + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
    return env


def no_driver_env(**extra: str) -> dict[str, str]:
    """A machine without an NVIDIA driver: libcuda and NVML paths that do not exist."""
    env = dict(os.environ)
    env["GPUGUARD_LIBCUDA"] = "/nonexistent/libcuda.so.1"
    env["GPUGUARD_LIBNVML"] = "/nonexistent/libnvidia-ml.so.1"
    with_source_tree(env)
    env.update(extra)
    return env


def auto_env(env: dict[str, str], **extra: str) -> dict[str, str]:
    """``env`` with the installed-package start-up path (the .pth) and GPUGUARD=1."""
    env = scrubbed(dict(env))
    env["PYTHONPATH"] = os.pathsep.join([str(SITE_HOOK), env.get("PYTHONPATH", str(ROOT / "python"))])
    env["GPUGUARD_TEST_SITE"] = str(ROOT / "python")
    env["GPUGUARD"] = "1"
    env.update(extra)
    return env


def fakes_dir(build: bool = True) -> Optional[Path]:
    """The folder holding libgpuguard_fake_cuda.so: $GPUGUARD_FAKES_DIR, the dev build, or (``build``) a fresh
    build of tests/fakes; None where there is none and ``build`` is false."""
    for c in (os.environ.get("GPUGUARD_FAKES_DIR"), str(ROOT / "build" / "dev" / "tests" / "fakes")):
        if c and (Path(c) / "libgpuguard_fake_cuda.so").exists():
            return Path(c)
    if not build:
        return None
    out = ROOT / "build" / "fakes-pytest"
    subprocess.run(["cmake", "-S", str(ROOT / "tests" / "fakes"), "-B", str(out)], check=True,
                   stdout=subprocess.DEVNULL)
    subprocess.run(["cmake", "--build", str(out)], check=True, stdout=subprocess.DEVNULL)
    return out


class FakeGpus:
    """Environment for a process that should see the fake driver with a given topology. Its per-environment
    folders (the fake NVML's contexts, the fake NCCL's meeting place) go under ``state_root``, pytest's temporary
    folder, never into /tmp."""

    def __init__(self, fakes: Path, state_root: str) -> None:
        self.fakes = fakes
        self.state_root = state_root

    def topology(self, name: str) -> dict[str, Any]:
        return json.loads((TOPOLOGIES / f"{name}.json").read_text())

    def env(self, topology: str = "h100x8", visible: Optional[str] = None, **extra: str) -> dict[str, str]:
        env = dict(os.environ)
        env.pop("CUDA_VISIBLE_DEVICES", None)
        path = Path(topology) if topology.endswith(".json") else TOPOLOGIES / f"{topology}.json"
        env["GPUGUARD_LIBCUDA"] = str(self.fakes / "libgpuguard_fake_cuda.so")
        nccl = self.fakes / "libgpuguard_fake_nccl.so"
        if nccl.exists():
            env["GPUGUARD_LIBNCCL"] = str(nccl)
        nvml = self.fakes / "libgpuguard_fake_nvml.so"
        if nvml.exists():
            env["GPUGUARD_LIBNVML"] = str(nvml)
        # the contexts the fake driver's processes hold, for the fake NVML: one folder per environment, so that
        # processes of other tests never show up on this one's GPUs
        env["GPUGUARD_FAKE_GPU_STATE_DIR"] = tempfile.mkdtemp(prefix="gg-fake-gpu-", dir=self.state_root)
        env["GPUGUARD_FAKE_TOPOLOGY"] = str(path)
        # where the fake NCCL's ranks meet, under pytest's own temporary folder rather than the fake's default in /tmp
        env.setdefault("GPUGUARD_FAKE_NCCL_DIR", os.path.join(self.state_root, "fake-nccl"))
        if visible is not None:
            env["CUDA_VISIBLE_DEVICES"] = visible
        with_source_tree(env)
        env.update(extra)
        return env
