"""``worker_process_setup_hook="gpuguard.ray.setup"``: the zero-code checks in every Ray worker of a job.

Ray runs the hook in each worker process as it starts, before any actor is placed in it, so no GPU is
assigned yet: the hook binds nothing. It arms gpuguard.auto for the moment the actor imports torch
(``_gpuguard_autostart``, standard library only); an actor whose RANK/WORLD_SIZE (and GPUGUARD_GROUP) are set
is then checked across its group, at its NCCL init_process_group, through the group's Ray rendezvous actor.
"""

from __future__ import annotations


def setup() -> None:
    """Ray's worker_process_setup_hook (pass the string ``"gpuguard.ray.setup"``)."""
    import _gpuguard_autostart

    _gpuguard_autostart.arm("the Ray worker_process_setup_hook gpuguard.ray.setup")
