"""The Hugging Face Trainer's native hook: GpuGuardTrainerCallback, a TrainerCallback passed in callbacks=.

``on_train_begin`` comes once accelerate has prepared the model (moved, and wrapped in DDP where it runs
distributed); the callback guards the model the Trainer passes (the unwrapped one, whose forward DDP calls every
step, so each batch is checked against the weights) and starts ``watch()`` in a job of several ranks
(protection.Protection); ``on_train_end`` undoes both. The ranks are the TrainingArguments' own
(process_index, world_size, local_process_index), accelerate's PartialState. transformers discovers no plugins,
so the zero-code mode stays with gpuguard's patches of torch (``gpuguard run``), which check the ranks'
placement at init_process_group whichever launcher started them (torchrun, ``accelerate launch``, ``deepspeed``).
"""

from __future__ import annotations

from typing import Any, Optional

from transformers import TrainerCallback

from .protection import Protection

__all__ = ["GpuGuardTrainerCallback"]


class GpuGuardTrainerCallback(TrainerCallback):  # type: ignore[misc]
    """Guards the model on its device and watches the collectives while the Trainer trains.

    ``deep=True``: every layer against its own inputs; ``watch``: start gpuguard.watch() in a job of several ranks
    (``stall_after``, ``on_stall`` as watch() takes them)."""

    def __init__(self, *, deep: bool = False, watch: bool = True, stall_after: Optional[float] = None,
                 on_stall: str = "report") -> None:
        self.protection = Protection("Trainer", deep=deep, watch=watch, stall_after=stall_after, on_stall=on_stall)

    def on_train_begin(self, args: Any, state: Any, control: Any, model: Any = None, **kwargs: Any) -> None:
        if model is not None:
            self.protection.start(model, rank=args.process_index, world_size=args.world_size,
                                  local_rank=args.local_process_index)

    def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.protection.stop()
