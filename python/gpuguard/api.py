"""The public calls that compose layers which never import each other: bind(watch=True) (binding, then the
watchdog) and watch() (the watchdog, handed the launchers' reading of this rank's node for its per-node tier).

Each layer is imported when its call runs, so that gpuguard.bind never loads the watchdog (nor torch) unless asked.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any, Optional, Union

if TYPE_CHECKING:
    from .binding.binding import Binding
    from .binding.launchers import LaunchContext
    from .watchdog import Watch


def bind(*, group: str = "default", store: Any = None, timeout: float = 60, verify_nccl: bool = False,
         require_gpu: bool = False, watch: bool = False, rank: Optional[int] = None,
         world_size: Optional[int] = None, local_rank: Optional[int] = None,
         require_exclusive: bool = False) -> "Binding":
    """Binds this process to its GPU under whichever launcher started it, and returns the Binding.

    group: the rank's group; ranks of different groups may share a GPU (colocated roles). The default
      yields to ``GPUGUARD_GROUP`` in the environment.
    store: where ranks meet for the cross-rank check (a torch.distributed Store); found automatically
      when None. timeout: seconds for the whole call (the CUDA-state check, the other ranks, NCCL), after
      which it returns or raises within a few seconds.
    verify_nccl: also form a real NCCL communicator and run one small all-reduce on it under the deadline
      (on a hang, again with NCCL_P2P_DISABLE=1, saying whether that cures it).
    require_gpu: no GPU is an error instead of a warning and a CPU binding.
    require_exclusive: a rank's GPU holding memory of processes outside this job (a leftover run, another user's
      job) stops every rank with ForeignProcessError instead of a warning naming them.
    watch: also start gpuguard.watch() (the collective watchdog, default settings) once bound.
    rank, world_size, local_rank: for processes no launcher describes (torch.multiprocessing.spawn, Lightning's
      own launcher, MPT): all three together, and the environment's launcher variables are then not read.
      With more than one rank, pass store= too unless a default process group exists.

    Raises LaunchEnvironmentError (launcher variables or CUDA_VISIBLE_DEVICES malformed or contradictory),
    RankMappingError (no GPU for this local rank), CudaStateError (CUDA initialised with another
    visibility), StrayContextError (a CUDA context of this process on another rank's GPU, made before
    set_device), ForeignProcessError (require_exclusive); all are GpuGuardError.
    """
    from .binding import steps

    binding = steps.bind(group=group, store=store, timeout=timeout, verify_nccl=verify_nccl, require_gpu=require_gpu,
                         rank=rank, world_size=world_size, local_rank=local_rank, require_exclusive=require_exclusive)
    if watch:
        _start_watch()  # starts with the first collective if the process group does not exist yet
    return binding


def watch(stall_after: Optional[float] = None, *, on_stall: str = "report",
          store: Union[None, Any, tuple[str, int]] = None, report_dir: Optional[str] = None,
          tick: Optional[float] = None, gather: float = 5.0, node_tier: Optional[bool] = None) -> "Watch":
    """Watches this rank's collectives; call it on every rank. Returns the running Watch (stop() ends it).

    gpuguard.watchdog.watch() with this rank's launch context, which its per-node tier reads; that function's
    docstring describes every argument (``help(gpuguard.watchdog.watch)``).
    """
    from .watchdog import watch as start_watch

    return start_watch(stall_after, on_stall=on_stall, store=store, report_dir=report_dir, tick=tick, gather=gather,
                       node_tier=node_tier, launch_context=launch_context)


#: watch(), by a name bind()'s argument ``watch`` does not hide
_start_watch = watch


def launch_context() -> "LaunchContext":
    """This process's launch context, read from the environment when the watchdog asks (its node tier)."""
    from .binding.launchers import detect

    return detect(os.environ)
