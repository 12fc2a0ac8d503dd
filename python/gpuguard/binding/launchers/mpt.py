"""HPE (SGI) MPT mpirun/mpiexec_mpt: MPT_LRANK alone, the rank's index on its host."""

from __future__ import annotations

from .base import _VariableLauncher


class MptLauncher(_VariableLauncher):
    """HPE (SGI) MPT ``mpirun``/``mpiexec_mpt``: it exports MPT_LRANK, the rank's index on its host (the variable
    LAMMPS' and SPARTA's GPU packages read for HPE MPI), and no global rank or size. Those must come from
    another launcher's variables (srun's, under SLURM) or from bind(rank=, world_size=, local_rank=)."""

    name = "mpt"
    description = "HPE MPT mpirun"
    markers = ("MPT_LRANK",)
    variables = {"local_rank": "MPT_LRANK"}
    missing_hint = (" HPE MPT exports only MPT_LRANK: take the rank and size from MPI itself, e.g. "
                    "gpuguard.bind(rank=comm.Get_rank(), world_size=comm.Get_size(), "
                    "local_rank=int(os.environ['MPT_LRANK'])) with mpi4py's comm = MPI.COMM_WORLD.")
