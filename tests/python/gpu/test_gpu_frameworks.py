"""Lightning and accelerate on a real GPU, where the CPU cannot take them: Lightning's NCCL Trainer (set_device,
then init_process_group(device_id=)) passes under `gpuguard run`, and `accelerate launch --num_processes 2` on
one GPU (accelerate's set_device(local_process_index % device_count) after init) is stopped, naming
--num_processes, before NCCL's "Duplicate GPU detected".

The lent machine has no network: lightning and accelerate must be installed there beforehand (a wheelhouse
carried with the tree: pip install --no-index --find-links <wheelhouse> lightning accelerate); each test says
so and skips where one is missing.
"""

from __future__ import annotations

import importlib.util
import os
import sys

import pytest

from gg_testing.framework_jobs import LIGHTNING_MODULE
from gg_testing.paths import ROOT
from .gpu_support import run_job, worker

pytestmark = [pytest.mark.gpu, pytest.mark.slow]

_TRAINER = LIGHTNING_MODULE + '''
from lightning.pytorch.strategies import DDPStrategy
from gpuguard.frameworks.lightning import GpuGuardCallback  # the entry points need gpuguard pip-installed

if __name__ == "__main__":
    trainer = L.Trainer(accelerator="gpu", devices=1, strategy=DDPStrategy(process_group_backend="nccl"),
                        max_epochs=1, logger=False, enable_checkpointing=False, enable_progress_bar=False,
                        callbacks=[GpuGuardCallback()])
    trainer.fit(Regression(), train_loader)
    report_result(rank=trainer.global_rank, device=str(trainer.strategy.root_device))
'''

_ACCELERATOR = '''
from accelerate import Accelerator

accelerator = Accelerator()
report_result(rank=accelerator.process_index, device=str(accelerator.device))
'''


def needs(module: str) -> None:
    if importlib.util.find_spec(module) is None:
        pytest.skip(f"{module} is not installed on this machine, which has no network: carry a wheelhouse and "
                    f"pip install --no-index --find-links <wheelhouse> {module}")


def gpuguard_run(real_env: dict[str, str]) -> dict[str, str]:
    """The environment `gpuguard run` arms the zero-code mode in, as an installed gpuguard's .pth does
    (tests/python/auto_site)."""
    return dict(real_env, GPUGUARD_TEST_SITE=str(ROOT / "python"),
                PYTHONPATH=os.pathsep.join([str(ROOT / "tests" / "python" / "auto_site"), real_env["PYTHONPATH"]]))


def test_a_lightning_nccl_trainer_on_the_gpu_passes_under_gpuguard_run(tmp_path, real_env, report):
    """Trainer(accelerator='gpu', devices=1, DDP on NCCL) fits to its end under `gpuguard run`, its callback on."""
    needs("lightning")
    script = worker(tmp_path, "train.py", _TRAINER)
    job = run_job([sys.executable, "-m", "gpuguard", "run", "--", sys.executable, str(script)],
                  gpuguard_run(real_env), 300)
    report.figure(job.seconds, "s", "the job")
    assert job.returncode == 0, job.output[-4000:]
    assert job.results[0]["device"] == "cuda:0"
    assert "gpuguard: Lightning rank 0/1: guard() on " in job.output


def test_accelerate_launch_of_two_processes_on_one_gpu_stops_naming_num_processes(tmp_path, real_env, report):
    """Both ranks stop at accelerate's set_device, before NCCL, and the note names --num_processes."""
    needs("accelerate")
    script = worker(tmp_path, "train.py", _ACCELERATOR)
    job = run_job([sys.executable, "-m", "gpuguard", "run", "--", sys.executable, "-m", "accelerate.commands.launch",
                   "--multi_gpu", "--num_processes", "2", "--num_machines", "1", "--mixed_precision", "no",
                   "--dynamo_backend", "no", str(script)], gpuguard_run(real_env), 300)
    report.record("output", job.output[-3000:])
    assert job.returncode not in (0, None), job.output[-4000:]
    assert job.output.count("DuplicateDeviceError: 2 ranks of group 'default' share 1 GPU") >= 2, job.output[-4000:]
    assert ("This node runs 2 processes (LOCAL_WORLD_SIZE) but shows 1 GPU. Start at most 1 per node: accelerate "
            "launch --num_processes 1") in job.output
