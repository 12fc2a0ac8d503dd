"""gpuguard.init_process_group(): bind(), then torch.distributed.init_process_group on the bound GPU."""

from __future__ import annotations

import datetime
import inspect
from typing import Any, Optional

from ..deadline import Deadline
from ..placement import env_store_for_init
from .steps import bind_in, check_arguments, detect_or_hint
from .binding import Binding
from .launchers import explicit_context


def _supports_device_id() -> bool:
    import torch.distributed as dist

    try:
        return "device_id" in inspect.signature(dist.init_process_group).parameters
    except (TypeError, ValueError):  # pragma: no cover - a wrapped function without a signature
        return False


def init_process_group(backend: str = "nccl", *, group: str = "default", verify_nccl: bool = False,
                       require_gpu: Optional[bool] = None, bind_timeout: float = 60,
                       require_exclusive: bool = False, **kwargs: Any) -> Binding:
    """``bind()``, then ``torch.distributed.init_process_group(backend, device_id=<the bound GPU>, ...)``.

    ``rank`` and ``world_size`` default to the launcher's (so ``srun``/``mpirun`` need no RANK/WORLD_SIZE);
    ``store=`` is also the store bind() meets the other ranks through. Where no launcher describes the process
    (torch.multiprocessing.spawn), pass ``rank=``, ``world_size=`` and ``local_rank=`` (gpuguard's, not
    torch's) with ``store=`` or an ``init_method`` (tcp://, file://): its store is made once, used by bind()
    and handed to torch. ``require_gpu`` defaults to whether
    the backend is NCCL. ``bind_timeout`` bounds the whole of bind(), the store creation included. Other
    keyword arguments go to torch unchanged. ``require_exclusive`` is bind()'s. Returns the Binding.
    """
    import torch
    import torch.distributed as dist

    check_arguments(group, bind_timeout)
    deadline = Deadline(bind_timeout)
    if require_gpu is None:
        require_gpu = "nccl" in str(backend).lower()
    explicit = "local_rank" in kwargs
    local_rank = kwargs.pop("local_rank", None)
    if explicit:
        context, failure = explicit_context(kwargs.get("rank"), kwargs.get("world_size"), local_rank), None
    else:
        context, failure = detect_or_hint()
    store_owner = False
    if explicit and kwargs.get("store") is None and kwargs.get("init_method") not in (None, "env://"):
        # the store torch would make from init_method, made once here: bind() meets the ranks in it first
        kwargs["store"] = next(dist.rendezvous(kwargs.pop("init_method"), context.rank, context.world_size,
                                               timeout=datetime.timedelta(seconds=float(bind_timeout))))[0]
    if kwargs.get("store") is None and kwargs.get("init_method") in (None, "env://"):
        # srun/mpirun/plain variables have no store before init: create the one env:// would, so that bind()'s
        # cross-rank check can run first, and hand it to torch.
        env_store = env_store_for_init(context.rank, context.world_size, float(bind_timeout))
        if env_store is not None:
            kwargs.pop("init_method", None)
            kwargs["store"] = env_store
            store_owner = context.rank == 0
    binding = bind_in(context, group=group, store=kwargs.get("store"), deadline=deadline,
                      verify_nccl=verify_nccl, require_gpu=require_gpu, failure=failure, store_owner=store_owner,
                      require_exclusive=require_exclusive)
    if "rank" not in kwargs and "world_size" not in kwargs:
        kwargs["rank"], kwargs["world_size"] = binding.rank, binding.world_size
    if binding.is_gpu and torch.cuda.is_available() and "device_id" not in kwargs and _supports_device_id():
        kwargs["device_id"] = binding.device
    dist.init_process_group(backend=backend, **kwargs)
    return binding
