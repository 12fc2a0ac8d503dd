"""The blocks of README.md and docs/*.md marked `gpu` run on the real GPU, each with what it needs around it
(documented_usage.py)."""

from __future__ import annotations

import os

import pytest

from documented_usage import command_shim, documented_blocks, gpu_setup_for, write_program
from gg_testing.ports import free_port
from gg_testing.procs import run_logged

GPU_BLOCKS = [b for b in documented_blocks() if b.kind == "gpu"]


@pytest.mark.gpu
@pytest.mark.parametrize("block", GPU_BLOCKS, ids=[b.id for b in GPU_BLOCKS])
def test_gpu_readme_block_runs_on_the_gpu(block, real_env, tmp_path, report):
    """Each documented block that needs a GPU runs as written, on this machine's GPU."""
    setup = gpu_setup_for(block)
    command = write_program(block, setup, tmp_path)
    env = dict(real_env, MASTER_PORT=str(free_port()), **setup.env)
    env["PATH"] = f"{command_shim(tmp_path)}{os.pathsep}{env.get('PATH', '')}"
    proc = run_logged(command, env, timeout=300, cwd=str(tmp_path))
    report.record("output", proc.stdout[-1500:])
    assert proc.returncode == 0, f"{block.id}:\n{block.code}\n--- output:\n{proc.stdout[-4000:]}"
    for text in setup.expect:
        assert text in proc.stdout, f"missing {text!r}:\n{proc.stdout[-4000:]}"
