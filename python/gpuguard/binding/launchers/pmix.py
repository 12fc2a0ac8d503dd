"""A PMIx server (prun/prterun, srun --mpi=pmix): PMIX_RANK, the only variable it exports."""

from __future__ import annotations

from .base import _VariableLauncher


class PmixLauncher(_VariableLauncher):
    """A PMIx server (``prun``/``prterun``, ``srun --mpi=pmix``). Only the rank is exported; the size and
    local rank are available through the PMIx API alone, so they must come from another variable."""

    name = "pmix"
    description = "PMIx launcher"
    markers = ("PMIX_RANK",)
    variables = {"rank": "PMIX_RANK"}
