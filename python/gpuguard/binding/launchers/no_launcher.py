"""Processes no launcher describes: multiprocessing children (spawned_by, check_spawned_child), bind()'s ranks."""

from __future__ import annotations

import os
import sys
from typing import Any, Mapping, Optional

from ...errors import LaunchEnvironmentError
from .base import _MAX_INT, LaunchContext, _check_ranges, read_group


# ---- processes no launcher describes: multiprocessing children and explicit arguments ----------------------

_TORCH_SPAWN_FILE = os.path.join("torch", "multiprocessing", "spawn.py")


def spawned_by() -> Optional[dict[str, Any]]:
    """Evidence that this process is one of several started by Python's multiprocessing: for a child of
    ``torch.multiprocessing.spawn``, its process index (the ``i`` that torch's ``_wrap(fn, i, args, ...)``
    passes to the user's function, read from that frame); for any other multiprocessing child, its name.
    None in a process multiprocessing did not start."""
    import multiprocessing

    parent = multiprocessing.parent_process()
    if parent is None:
        return None
    frame = sys._getframe(1)
    while frame is not None:
        code = frame.f_code
        if code.co_name == "_wrap" and code.co_filename.endswith(_TORCH_SPAWN_FILE):
            index = frame.f_locals.get("i")
            if isinstance(index, int):
                return {"spawned_by": "torch.multiprocessing.spawn", "spawn_index": index,
                        "spawn_parent_pid": parent.pid}
        frame = frame.f_back  # type: ignore[assignment]
    return {"spawned_by": f"Python multiprocessing ({multiprocessing.current_process().name})",
            "spawn_index": None, "spawn_parent_pid": parent.pid}


def check_spawned_child(context: LaunchContext, visible_devices: int) -> None:
    """Refuses to call a multiprocessing child "rank 0 of 1" where that is evidently wrong: a
    ``torch.multiprocessing.spawn`` process other than the first, or any multiprocessing child that sees
    several GPUs (each of its siblings would take cuda:0 as well)."""
    spawned = context.extra.get("spawned_by")
    if context.launcher != "single" or not spawned:
        return
    index = context.extra.get("spawn_index")
    if not (isinstance(index, int) and index > 0) and visible_devices <= 1:
        return
    who = f"process {index} of {spawned}" if isinstance(index, int) else f"a child of {spawned}"
    seen = f"it sees {visible_devices} GPUs" if visible_devices > 1 else "it is not the first process"
    raise LaunchEnvironmentError(
        f"This process is {who} (parent pid {context.extra.get('spawn_parent_pid')}) and no launcher variables "
        f"give its rank, so gpuguard would have to call it rank 0 of 1 on cuda:0 -- as it would every sibling -- "
        f"while {seen}. {spawned.split(' (')[0]} puts nothing in the environment: pass the rank yourself, e.g. "
        f"gpuguard.bind(rank=i, world_size=nprocs, local_rank=i, store=store) with the index i your function "
        f"receives and a store every process can reach (torch.distributed.TCPStore or FileStore), or "
        f"gpuguard.init_process_group('nccl', rank=i, world_size=nprocs, local_rank=i, "
        f"init_method='tcp://127.0.0.1:29500'). On several nodes rank = node_rank * nprocs + i.",
        launcher=spawned, spawn_index=index, visible_devices=visible_devices)


def explicit_context(rank: Any, world_size: Any, local_rank: Any,
                     env: Optional[Mapping[str, str]] = None) -> LaunchContext:
    """The launch context given as ``bind(rank=, world_size=, local_rank=)``, for processes no launcher
    describes (torch.multiprocessing.spawn, Lightning's launcher, MPI ranks read through mpi4py). All three
    are required; the environment is not consulted except for GPUGUARD_GROUP."""
    env = os.environ if env is None else env
    given = {"rank": rank, "world_size": world_size, "local_rank": local_rank}
    missing = [f"{n}=" for n, v in given.items() if v is None]
    if missing:
        have = ", ".join(f"{n}={v!r}" for n, v in given.items() if v is not None)
        raise ValueError(
            f"bind({have}) also needs {' and '.join(missing)}: with explicit ranks gpuguard reads nothing from "
            f"the environment, and the local rank picks the GPU. Under torch.multiprocessing.spawn use "
            f"rank=i, world_size=nprocs, local_rank=i (on one node).")
    for n, v in given.items():
        if isinstance(v, bool) or not isinstance(v, int) or not 0 <= v < _MAX_INT:
            raise ValueError(f"bind({n}={v!r}): give a non-negative integer")
    sources = {n: f"bind({n}=)" for n in given}
    _check_ranges(given, sources)
    return LaunchContext(launcher="explicit", description="bind(rank=, world_size=, local_rank=)", rank=rank,
                         world_size=world_size, local_rank=local_rank, local_world_size=None, node_rank=None,
                         sources=sources, group=read_group(env))
