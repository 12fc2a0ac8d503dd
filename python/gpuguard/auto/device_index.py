"""torch.cuda.set_device(n) (or Module.to, Module.cuda, DDP's device_ids naming cuda:n) with an n this process cannot see:
a RankMappingError before CUDA's "invalid device ordinal", saying n, the GPUs the host shows, the global and
local rank and the variables that gave them."""

from __future__ import annotations

import os
import socket
from typing import Any, Optional

from ..system.devices import devices
from ..errors import GpuGuardError, RankMappingError
from ..binding.launchers import LaunchContext, detect
from .framework_advice import fewer_per_node, framework_of

_count: Optional[int] = None


def visible_gpu_count() -> int:
    """How many GPUs the driver shows this process (cached: the driver's answer is fixed after cuInit)."""
    global _count
    if _count is None:
        _count = len(devices())
    return _count


def index_of(device: Any) -> Optional[int]:
    """The CUDA index ``set_device`` would use, or None for anything that is not a CUDA index."""
    import torch

    if isinstance(device, bool):
        return None
    if isinstance(device, int):
        return device
    if isinstance(device, str):
        try:
            device = torch.device(device)
        except (RuntimeError, ValueError):
            return None
    if isinstance(device, torch.device) and device.type == "cuda":
        return device.index
    return None


def launch_context() -> Optional[LaunchContext]:
    try:
        return detect()
    except GpuGuardError:  # contradictory launcher variables: the message then goes without ranks
        return None


def check_index(index: int, call: str) -> None:
    """Raises RankMappingError when ``index`` is not a GPU of this process; nothing when no GPU is visible at
    all (torch's own error about a missing GPU then says it best)."""
    n = visible_gpu_count()
    if n == 0 or index < 0 or index < n:
        return
    raise mapping_error(index, n, call, launch_context())


def mapping_error(index: int, n: int, call: str, context: Optional[LaunchContext]) -> RankMappingError:
    host = socket.gethostname()
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    shown = (f"{n} GPU{'s' if n != 1 else ''} (cuda:0..cuda:{n - 1}; "
             + (f"CUDA_VISIBLE_DEVICES={visible}" if visible is not None else "CUDA_VISIBLE_DEVICES unset")
             + ")")
    text = f"{call} asks for cuda:{index}, but this process on {host} sees {shown}; CUDA would stop with " \
           f"'invalid device ordinal'."
    fix = ("Use the local rank: torch.cuda.set_device(int(os.environ['LOCAL_RANK'])) (SLURM_LOCALID under srun, "
           "OMPI_COMM_WORLD_LOCAL_RANK under mpirun), or let gpuguard.bind() choose the GPU.")
    if context is not None and context.local_rank is not None and index == context.local_rank:
        # the index is already the local rank: this node runs more processes than it has GPUs
        lws = context.local_world_size
        fix = (f"The index already is the local rank: this node runs "
               + (f"{lws} processes ({context.source('local_world_size')})" if lws is not None else "more processes")
               + f" but shows {n} GPU{'s' if n != 1 else ''}. {fewer_per_node(n, framework_of(context))}.")
    details: dict[str, Any] = {"requested_index": index, "visible_device_count": n, "host": host,
                               "cuda_visible_devices": visible}
    if context is not None:
        rank_var, local_var = context.source("rank"), context.local_rank_source
        local = context.local_rank
        text += (f" This is rank {context.rank} of {context.world_size} ({context.description}): global rank "
                 f"{context.rank} ({rank_var}), local rank "
                 + (f"{local} ({local_var})" if local is not None else "not given by the launcher") + ".")
        if index == context.rank and index != local:
            where = f"node {context.node_rank}" if context.node_rank is not None else "this node"
            text += (f" {index} equals the global rank: the global rank counts across all {context.world_size} "
                     f"processes of the job, but device indices count from 0 on each node, so on {where} the "
                     f"device is the local rank"
                     + (f" ({local}: cuda:{local})" if local is not None and local < n else "") + ".")
        details.update(rank=context.rank, rank_source=rank_var, local_rank=local, local_rank_source=local_var,
                       world_size=context.world_size, node_rank=context.node_rank)
    return RankMappingError(f"{text} {fix}", fix=fix, **details)
