"""DeepSpeed's hook: protect(engine), the call to make after deepspeed.initialize (DeepSpeed has no callbacks).

The engine knows its module, device and ranks (engine.module, engine.global_rank, engine.world_size,
engine.local_rank). ``protect`` guards the module, whose forward the engine calls every step, and starts
``watch()`` in a job of several ranks (protection.Protection). Under ZeRO stage 3 the engine partitions the
parameters and gathers each layer's just before its forward, and may keep them in CPU memory between steps
(offload_param), so a parameter's device says nothing of where the layer runs: there it watches only, and says
so. The ranks' placement itself is checked at init_process_group, which ``deepspeed.initialize`` calls
(``gpuguard run``: DeepSpeed passes device_id=cuda:LOCAL_RANK there on CUDA).
"""

from __future__ import annotations

import sys
from typing import Any, Optional

from .protection import Protection

__all__ = ["protect"]


def protect(engine: Any, *, deep: bool = False, watch: bool = True, stall_after: Optional[float] = None,
            on_stall: str = "report") -> Protection:
    """Guards ``engine.module`` (not under ZeRO-3) and starts watch(); returns the Protection (``stop()`` undoes
    it). ``deep``, ``watch``, ``stall_after``, ``on_stall``: as guard() and watch() take them."""
    stage = engine.zero_optimization_stage() if hasattr(engine, "zero_optimization_stage") else 0
    protection = Protection("DeepSpeed", deep=deep, watch=watch, stall_after=stall_after, on_stall=on_stall)
    model = engine.module
    if stage >= 3:
        sys.stderr.write("gpuguard: DeepSpeed ZeRO stage 3 gathers each layer's parameters just before its forward "
                         "(and may keep them on the CPU between steps): guard() would read their placeholders, so "
                         "only watch() runs\n")
        model = None
    protection.start(model, rank=engine.global_rank, world_size=engine.world_size, local_rank=engine.local_rank)
    return protection
