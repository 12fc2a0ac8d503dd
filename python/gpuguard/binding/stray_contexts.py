"""A rank holding a CUDA context on a GPU other than its own, made before set_device: found with the driver's
cuDevicePrimaryCtxGetState (which creates none) and reported with what the context costs.

Error or warning, by cost. A primary context stays until the process exits (PyTorch's maintainers: it cannot be
freed, pytorch/pytorch#20532, #109888) and holds some hundreds of MiB (system/processes.py's TYPICAL_CONTEXT_COST;
NVML's per-process figure for this pid when it is available). The usual causes (a checkpoint loaded without
map_location, a torch.cuda call at import time) run on every rank, so the GPU they touch, cuda:0, carries one
context per rank of the host: 7 x 414-871 MiB on an 8-GPU node in the reports cited there, 3-6 GiB taken from the
rank that trains on it, which then runs out of memory first. That is worth stopping the job for, so a stray context
on a GPU that a rank of this host is bound to (or may be: the mapping is not known) is an error; one on a GPU no
rank of this host uses costs nobody but the memory itself, and is a warning.
"""

from __future__ import annotations

import logging
import os
from typing import Any, Optional, Sequence

from ..errors import StrayContextError
from ..system.contexts import active_contexts
from ..system.processes import TYPICAL_CONTEXT_COST, format_bytes, process_memory, usage_of

logger = logging.getLogger("gpuguard")

CAUSES = ("Likely causes (until set_device is called, the current device is cuda:0): torch.load "
          "without map_location (tensors saved from a GPU come back on that GPU); a torch.cuda call at import time "
          "or before set_device (torch.cuda.synchronize(), torch.cuda.mem_get_info(), torch.cuda.empty_cache(), "
          "torch.cuda.memory_allocated(), torch.zeros(..., device='cuda')); a library that touches the current "
          "device (a DataLoader with pin_memory=True, a CUDA extension initialised at import).")
FIX = ("Fix: call torch.cuda.set_device(int(os.environ['LOCAL_RANK'])) (or gpuguard.bind()) first, before anything "
       "else touches CUDA, and load checkpoints with torch.load(path, map_location='cpu'); or give each rank only "
       "its own GPU with CUDA_VISIBLE_DEVICES.")


def _used_by(index: int, own: int, local_rank: Optional[int], local_world_size: Optional[int]) -> Optional[str]:
    """Which rank of this host uses visible device ``index``, when the mapping is the usual one (local rank k on
    cuda:k, and this rank's device is its local rank); "" when no rank of the host does; None when unknown."""
    if local_rank is None or local_world_size is None or own != local_rank:
        return None
    return f"local rank {index}'s GPU" if index < local_world_size else ""


def stray_context_failure(*, rank: int, host: str, own_index: int, found: Sequence[Any],
                          local_rank: Optional[int], local_world_size: Optional[int],
                          active: Optional[Sequence[int]] = None) -> Optional[StrayContextError]:
    """The error for a context of this process on a GPU a rank of this host uses (a warning is logged for one on
    a GPU none uses); None when every context of this process is on its own GPU."""
    active = active_contexts() if active is None else list(active)
    strays = [i for i in active if i != own_index and 0 <= i < len(found)]
    if not strays or not 0 <= own_index < len(found):
        return None
    own = found[own_index]
    lines: list[str] = []
    details: list[dict[str, Any]] = []
    costs: list[str] = []
    blocking = False
    for index in strays:
        device = found[index]
        usage, _why = usage_of(device.uuid, device.pci_bus_id)
        held = process_memory(usage, os.getpid())
        used_by = _used_by(index, own_index, local_rank, local_world_size)
        blocking = blocking or used_by != ""
        whose = f", {used_by}" if used_by else (", a GPU no rank of this host is bound to" if used_by == "" else "")
        cost = (f"it holds {format_bytes(held)} there (NVML, pid {os.getpid()})" if held is not None
                else f"a CUDA context holds {TYPICAL_CONTEXT_COST}")
        costs.append(cost)
        lines.append(f"cuda:{index} ({device.uuid}{whose}): {cost}")
        details.append({"index": index, "uuid": device.uuid, "bytes": held, "used_by": used_by})
    where = f"host {host}, pid {os.getpid()}"
    listed = "; ".join(lines)
    message = (f"rank {rank} ({where}) is bound to cuda:{own_index} ({own.uuid}) but already has a CUDA context on "
               f"{', '.join(f'cuda:{i}' for i in strays)}: {listed}. Something in this process used "
               f"{'that GPU' if len(strays) == 1 else 'those GPUs'} before torch.cuda.set_device. The context stays "
               f"until the process exits, and every rank that does the same adds one, so that GPU runs out of memory "
               f"first.\n{CAUSES}\n{FIX}")
    if not blocking:
        logger.warning("gpuguard: %s", message)
        return None
    return StrayContextError(message, fix=FIX, rank=rank, device=f"cuda:{own_index}", uuid=own.uuid,
                             stray_devices=details, cost=costs[0])
