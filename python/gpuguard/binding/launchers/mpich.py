"""MPICH's Hydra mpiexec and Intel MPI's mpirun: PMI_RANK with Hydra's MPI_LOCALRANKID."""

from __future__ import annotations

from .base import _VariableLauncher


class MpichLauncher(_VariableLauncher):
    """MPICH's Hydra ``mpiexec`` and Intel MPI's ``mpirun`` (also Hydra): PMI_RANK with Hydra's own
    MPI_LOCALRANKID (src/pm/hydra/proxy/pmip_cb.c). ``srun --mpi=pmi2`` sets PMI_RANK without it (PmiLauncher)."""

    name = "mpich"
    description = "MPICH/Intel MPI (Hydra) mpiexec"
    own_daemons = True
    markers = ("PMI_RANK", "MPI_LOCALRANKID")
    variables = {"rank": "PMI_RANK", "world_size": "PMI_SIZE",
                 "local_rank": "MPI_LOCALRANKID", "local_world_size": "MPI_LOCALNRANKS"}
