"""PyTorch Lightning's own subprocess launcher: LOCAL_RANK, NODE_RANK, WORLD_SIZE and no RANK."""

from __future__ import annotations

from typing import Mapping

from ...errors import LaunchVariablesIncompleteError
from .base import Reading, _VariableLauncher


class LightningLauncher(_VariableLauncher):
    """PyTorch Lightning's own launcher (Trainer/Fabric with ``strategy="ddp"`` started as ``python train.py``):
    it re-runs the script for local ranks 1.. with MASTER_ADDR, MASTER_PORT, NODE_RANK, LOCAL_RANK and
    WORLD_SIZE (= devices x num_nodes) and no RANK (lightning/pytorch/strategies/launchers/subprocess_script.py,
    ``_call_children_scripts``); Lightning computes the global rank itself and passes it to
    ``init_process_group(rank=, world_size=)`` (lightning/fabric/utilities/distributed.py,
    ``_init_dist_connection``). The environment is consistent, only incomplete until that call: the zero-code
    check reads the rank there (auto/rank_at_init.py); ``bind()`` before it is told what to pass."""

    name = "lightning"
    description = "Lightning's subprocess launcher"
    markers = ("LOCAL_RANK", "NODE_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")
    variables = {"world_size": "WORLD_SIZE", "local_rank": "LOCAL_RANK", "node_rank": "NODE_RANK"}

    def present(self, env: Mapping[str, str]) -> bool:
        return super().present(env) and "RANK" not in env and "LOCAL_WORLD_SIZE" not in env

    def read(self, env: Mapping[str, str]) -> Reading:
        reading = super().read(env)
        raise LaunchVariablesIncompleteError(
            f"This process has LOCAL_RANK={env['LOCAL_RANK']}, NODE_RANK={env['NODE_RANK']} and "
            f"WORLD_SIZE={env['WORLD_SIZE']} but no RANK: it was started by Lightning's own launcher "
            f"(strategy='ddp' run as `python train.py`), which never exports the global rank; Lightning names "
            f"it only in its init_process_group call. Run the job under `gpuguard run`, which reads the rank from "
            f"that call; or start the script with torchrun (torchrun --nproc_per_node=<devices> train.py), whose "
            f"variables Lightning and gpuguard both read; or, where the Trainer's devices are 0..N-1 (devices=N, "
            f"so local rank k runs on cuda:k), call gpuguard.bind(rank=trainer.global_rank, "
            f"world_size=trainer.world_size, local_rank=trainer.local_rank) once Lightning has set up "
            f"(fabric.global_rank etc. with Fabric).",
            variables={n: reading.values[n] for n in reading.values}, launcher=self.name)
