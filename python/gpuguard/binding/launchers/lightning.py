"""PyTorch Lightning's own subprocess launcher: LOCAL_RANK, NODE_RANK, WORLD_SIZE and no RANK."""

from __future__ import annotations

from typing import Mapping

from ...errors import LaunchEnvironmentError
from .base import Reading, _VariableLauncher


class LightningLauncher(_VariableLauncher):
    """PyTorch Lightning's own launcher (Trainer/Fabric with ``strategy="ddp"`` started as ``python train.py``):
    it re-runs the script for local ranks 1.. with MASTER_ADDR, MASTER_PORT, NODE_RANK, LOCAL_RANK and
    WORLD_SIZE (= devices x num_nodes) and no RANK (lightning/fabric/strategies/launchers/subprocess_script.py,
    ``_call_children_scripts``); Lightning computes the global rank itself, in the Trainer. Without RANK and
    the number of devices per node the rank cannot be read, so this is an error that says what to pass."""

    name = "lightning"
    description = "Lightning's subprocess launcher"
    markers = ("LOCAL_RANK", "NODE_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")
    variables = {"world_size": "WORLD_SIZE", "local_rank": "LOCAL_RANK", "node_rank": "NODE_RANK"}

    def present(self, env: Mapping[str, str]) -> bool:
        return super().present(env) and "RANK" not in env and "LOCAL_WORLD_SIZE" not in env

    def read(self, env: Mapping[str, str]) -> Reading:
        reading = super().read(env)
        raise LaunchEnvironmentError(
            f"This process has LOCAL_RANK={env['LOCAL_RANK']}, NODE_RANK={env['NODE_RANK']} and "
            f"WORLD_SIZE={env['WORLD_SIZE']} but no RANK: it was started by Lightning's own launcher "
            f"(strategy='ddp' run as `python train.py`), which never exports the global rank, so gpuguard "
            f"cannot know it. Call gpuguard.bind(rank=trainer.global_rank, world_size=trainer.world_size, "
            f"local_rank=trainer.local_rank) once Lightning has set up (e.g. in setup() of your "
            f"LightningModule; fabric.global_rank etc. with Fabric), or start the script with torchrun "
            f"(torchrun --nproc_per_node=<devices> train.py), whose variables Lightning and gpuguard both read.",
            variables={n: reading.values[n] for n in reading.values}, launcher=self.name)
