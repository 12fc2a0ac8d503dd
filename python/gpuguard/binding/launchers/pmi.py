"""PMI_RANK/PMI_SIZE from a process manager that is not Hydra (srun --mpi=pmi2, unknown PMI launchers)."""

from __future__ import annotations

from .base import _VariableLauncher


class PmiLauncher(_VariableLauncher):
    """PMI_RANK/PMI_SIZE from a process manager that is not Hydra: ``srun --mpi=pmi2`` (then SLURM, tried
    first, names the launcher and this only cross-checks it), or a PMI launcher gpuguard does not know."""

    name = "pmi"
    description = "a PMI process manager (PMI_RANK, PMI_SIZE)"
    markers = ("PMI_RANK",)
    variables = {"rank": "PMI_RANK", "world_size": "PMI_SIZE"}
