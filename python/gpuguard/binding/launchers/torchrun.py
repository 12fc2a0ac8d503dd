"""torchrun / torch.distributed.run (TorchElastic): an agent that spawns the workers itself."""

from __future__ import annotations

from .base import _VariableLauncher


class TorchrunLauncher(_VariableLauncher):
    """torchrun / torch.distributed.run (TorchElastic); also ``python -m torch.distributed.launch``."""

    name = "torchrun"
    description = "torchrun (TorchElastic)"
    agent = True
    markers = ("TORCHELASTIC_RUN_ID",)
    variables = {"rank": "RANK", "world_size": "WORLD_SIZE", "local_rank": "LOCAL_RANK",
                 "local_world_size": "LOCAL_WORLD_SIZE", "node_rank": "GROUP_RANK"}
