"""MVAPICH2 mpirun_rsh/mpiexec: MV2_COMM_WORLD_* variables."""

from __future__ import annotations

from .base import _VariableLauncher


class Mvapich2Launcher(_VariableLauncher):
    """MVAPICH2 ``mpirun_rsh``/``mpiexec``."""

    name = "mvapich2"
    description = "MVAPICH2 mpirun_rsh/mpiexec"
    own_daemons = True
    markers = ("MV2_COMM_WORLD_RANK",)
    variables = {"rank": "MV2_COMM_WORLD_RANK", "world_size": "MV2_COMM_WORLD_SIZE",
                 "local_rank": "MV2_COMM_WORLD_LOCAL_RANK", "local_world_size": "MV2_COMM_WORLD_LOCAL_SIZE"}
