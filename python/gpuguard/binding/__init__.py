"""Which GPU is this process's, decided once every rank agreed: bind() and init_process_group().

Modules, in the order bind() uses them: ``launchers`` (who started this process, its ranks),
``visible_devices`` (CUDA_VISIBLE_DEVICES as the driver reads it), ``cuda_state`` (CUDA initialised earlier
with another visibility), ``device_choice`` (local rank -> device, or why not), ``binding`` (the result),
``steps`` (bind() itself: its steps, under one deadline), ``process_group`` (bind(), then torch's init_process_group).
"""

from .steps import bind
from .binding import Binding
from .process_group import init_process_group

__all__ = ["Binding", "bind", "init_process_group"]
