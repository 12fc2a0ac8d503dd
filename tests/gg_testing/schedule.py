"""The order in which pytest-xdist hands a parallel step's test files to its two workers: the costliest first.

CI's parallel steps run `--dist loadfile`: a file's tests go to one worker. xdist hands out the files with the most
tests first (its loadscope reorder), so the few-test files that launch jobs (torchrun, spawn, a SLURM cluster) came
last, and a step ended with one worker on its last such file while the other core stood idle (the steps ran 88-97 %
busy in the CI run of 716b0ba). Handed out first, they end beside the many short tests instead. A file not listed
keeps its place after them; a listed one that is renamed only loses its turn, never a test.
"""

from __future__ import annotations

import pytest

#: The files that cost a parallel step the most (CI's table of 716b0ba: the slowest test files and those costing the
#: most CPU, oldest and newest corners), costliest first.
COSTLIEST = (
    "tests/cluster/test_real_launchers.py",
    "tests/python/test_bind_explicit.py",
    "tests/python/test_framework_lightning.py",
    "tests/python/test_auto.py",
    "tests/python/test_explain_compiled_mismatch.py",
    "tests/python/test_tensor_devices_compiled_distributed.py",
    "tests/python/test_torch_mismatch.py",
    "tests/python/test_placement.py",
    "tests/python/test_verify_nccl.py",
    "tests/python/gpu/test_suite_machinery.py",
    "tests/python/test_documented_usage.py",
    "tests/python/test_gpu_processes.py",
    "tests/python/test_mig.py",
    "tests/python/test_cli_check.py",
)


def pytest_configure(config: pytest.Config) -> None:
    if hasattr(config.option, "loadscopereorder"):  # xdist's controller: keep the workers' order
        config.option.loadscopereorder = False


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if not hasattr(config, "workerinput"):  # one process runs them all: the order changes nothing
        return
    turn = {path: i for i, path in enumerate(COSTLIEST)}
    items.sort(key=lambda item: turn.get(item.nodeid.split("::")[0], len(turn)))  # stable: each file's own order
