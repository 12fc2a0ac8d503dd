"""What a framework hook does once the model sits on its device: guard() its forwards and watch() the collectives."""

from __future__ import annotations

import os
import sys
from types import SimpleNamespace
from typing import Any, Optional

from ..tensors.tensor_devices import GuardHandle, guard
from ..watchdog import Watch, running, watch


class Protection:
    """One training run's checks: ``start`` guards the model (every forward: its parameters, buffers and inputs
    on one device; ``deep=True``: every layer against its own inputs) and, in a job of several ranks whose
    process group exists, starts ``watch()`` unless one runs already (the zero-code mode's GPUGUARD_WATCH=1, the
    user's own) or ``GPUGUARD_WATCH=0``; ``stop`` undoes both. Starting twice guards once."""

    def __init__(self, framework: str, *, deep: bool = False, watch: bool = True,
                 stall_after: Optional[float] = None, on_stall: str = "report") -> None:
        self.framework = framework
        self.deep = deep
        self.watch = watch
        self.stall_after = stall_after
        self.on_stall = on_stall
        self.started = False
        self.guarded: Optional[GuardHandle] = None
        self.watching: Optional[Watch] = None

    def start(self, model: Any, *, rank: int, world_size: int, local_rank: int,
              local_world_size: Optional[int] = None, node_rank: Optional[int] = None) -> None:
        """``model`` None: watch() alone (a model whose parameters' devices say nothing, as under ZeRO-3). The
        ranks are the framework's; the local world size and node rank, where it knows them, let watch() share one
        store read per node past 20,000 ranks (its node tier)."""
        if self.started:
            return
        self.started = True
        said: list[str] = []
        if model is not None:
            self.guarded = guard(model, deep=self.deep)
            said.append(f"guard({'deep=True' if self.deep else ''}) on {type(model).__name__}")
        if self.watch and world_size > 1 and running() is None and _group_exists() \
                and os.environ.get("GPUGUARD_WATCH", "").strip() != "0":
            node = SimpleNamespace(launcher=self.framework, local_rank=local_rank, local_world_size=local_world_size,
                                   node_rank=node_rank)
            self.watching = watch(self.stall_after, on_stall=self.on_stall, launch_context=lambda: node)
            said.append("watch() of the collectives")
        elif running() is not None:
            said.append("the collectives watched already")
        done = " + ".join(said) or "nothing to do"
        sys.stderr.write(f"gpuguard: {self.framework} rank {rank}/{world_size}: {done}\n")
        sys.stderr.flush()

    def stop(self) -> None:
        self.started = False
        if self.guarded is not None:
            self.guarded.remove()
            self.guarded = None
        if self.watching is not None:
            self.watching.stop()
            self.watching = None


def _group_exists() -> bool:
    import torch.distributed as dist

    return bool(dist.is_available() and dist.is_initialized())
