"""Open MPI mpirun/mpiexec (ORTE or PRRTE): OMPI_COMM_WORLD_* variables."""

from __future__ import annotations

from .base import _VariableLauncher


class OpenMpiLauncher(_VariableLauncher):
    """Open MPI ``mpirun``/``mpiexec`` (ORTE or PRRTE). OMPI_COMM_WORLD_NODE_RANK is not a node index."""

    name = "openmpi"
    description = "Open MPI mpirun"
    own_daemons = True
    run_id_variable = "OMPI_MCA_ess_base_jobid"  # the job id every rank of one mpirun shares (ORTE)
    markers = ("OMPI_COMM_WORLD_RANK",)
    variables = {"rank": "OMPI_COMM_WORLD_RANK", "world_size": "OMPI_COMM_WORLD_SIZE",
                 "local_rank": "OMPI_COMM_WORLD_LOCAL_RANK", "local_world_size": "OMPI_COMM_WORLD_LOCAL_SIZE"}
