"""gpuguard inside the frameworks users train with: one module per framework, each its native hook.

- ``frameworks.lightning``: ``GpuGuardCallback`` for the Trainer, ``FabricCallback`` for Fabric, and the
  ``callbacks_factory`` entry points that add them to every Trainer and Fabric under ``GPUGUARD=1``;
- ``frameworks.transformers``: ``GpuGuardTrainerCallback``, a ``TrainerCallback`` for the Hugging Face Trainer;
- ``frameworks.deepspeed``: ``protect(engine)``, the call to make after ``deepspeed.initialize``.

Each module imports its framework itself, so importing it needs that framework installed; nothing else in
gpuguard imports them. What every hook does once the model is on its device (``guard()`` on its forwards and
``watch()`` of the job's collectives) is ``protection.Protection``. The placement checks of the ranks
themselves happen at ``init_process_group``, before any hook can run (``gpuguard run``, ``GPUGUARD=1``: the
frameworks' ranks are read from that call, ``auto/rank_at_init.py``).
"""
