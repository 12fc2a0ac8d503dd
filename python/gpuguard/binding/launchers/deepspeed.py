"""The deepspeed launcher (deepspeed.launcher.launch): an agent that spawns the workers itself."""

from __future__ import annotations

from .base import _VariableLauncher


class DeepSpeedLauncher(_VariableLauncher):
    """The ``deepspeed`` launcher (deepspeed.launcher.launch): it also narrows CUDA_VISIBLE_DEVICES per node."""

    name = "deepspeed"
    description = "DeepSpeed launcher"
    agent = True
    markers = ("CROSS_RANK", "LOCAL_SIZE", "RANK")
    variables = {"rank": "RANK", "world_size": "WORLD_SIZE", "local_rank": "LOCAL_RANK",
                 "local_world_size": "LOCAL_SIZE", "node_rank": "CROSS_RANK"}
