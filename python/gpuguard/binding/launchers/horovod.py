"""horovodrun with Gloo (and Horovod's Spark, Ray and elastic drivers): HOROVOD_* variables."""

from __future__ import annotations

from .base import _VariableLauncher


class HorovodLauncher(_VariableLauncher):
    """``horovodrun`` with Gloo (and Horovod's Spark, Ray and elastic drivers), which start every worker with
    HOROVOD_RANK, HOROVOD_SIZE, HOROVOD_LOCAL_RANK, HOROVOD_LOCAL_SIZE, HOROVOD_CROSS_RANK and
    HOROVOD_CROSS_SIZE (horovod/runner/gloo_run.py, ``_alloc_info_to_command_fn`` / ``get_command``).
    ``horovodrun --mpi`` exports none of them: its ranks are Open MPI's (or MPICH's) and are read as such.

    The workers are spawned by horovodrun itself, so any SLURM or MPI variables around them are horovodrun's.
    HOROVOD_CROSS_RANK is not taken as the node rank: it is the index among the workers that have the same
    local rank, which is the host's index only when every host runs the same number of workers.
    """

    name = "horovod"
    description = "horovodrun (Gloo)"
    agent = True
    markers = ("HOROVOD_RANK",)
    variables = {"rank": "HOROVOD_RANK", "world_size": "HOROVOD_SIZE", "local_rank": "HOROVOD_LOCAL_RANK",
                 "local_world_size": "HOROVOD_LOCAL_SIZE"}
