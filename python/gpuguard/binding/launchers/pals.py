"""HPE Cray PALS mpiexec (and SLURM's cray_shasta plugin, Cray PMI): PALS_* with their PMI_* twins."""

from __future__ import annotations

from typing import Mapping

from .base import Reading, _VariableLauncher, _disagreement, read_int


class PalsLauncher(_VariableLauncher):
    """HPE Cray PALS ``mpiexec`` (PBS Pro on HPE Cray EX, e.g. Polaris, Aurora, Derecho), and anything that sets
    the same variables: SLURM's ``--mpi=cray_shasta`` plugin (src/plugins/mpi/cray_shasta/mpi_cray_shasta.c,
    ``mpi_p_slurmstepd_task``: PALS_RANKID, PALS_LOCAL_RANKID, PALS_NODEID, PMI_RANK, PMI_SIZE, PMI_LOCAL_RANK,
    PMI_LOCAL_SIZE, one value each per task) and flux-coral2's cray_pals shell plugin. Cray PMI without PALS
    sets only the PMI_* ones, which are read the same way."""

    name = "pals"
    description = "HPE Cray PALS mpiexec"
    variables = {"rank": "PALS_RANKID", "world_size": "PMI_SIZE", "local_rank": "PALS_LOCAL_RANKID",
                 "local_world_size": "PMI_LOCAL_SIZE", "node_rank": "PALS_NODEID"}

    def present(self, env: Mapping[str, str]) -> bool:
        return "PALS_RANKID" in env or ("PMI_RANK" in env and "PMI_LOCAL_RANK" in env)

    def read(self, env: Mapping[str, str]) -> Reading:
        reading = super().read(env)
        # the PMI_* twins of the PALS variables: a missing PALS one is filled, a different one is a contradiction
        for name, var in (("rank", "PMI_RANK"), ("local_rank", "PMI_LOCAL_RANK")):
            value = read_int(env, var)
            if name not in reading.values:
                reading.put(name, value, var)
            elif value is not None and value != reading.values[name]:
                raise _disagreement(name, (reading.sources[name], reading.values[name]), (var, value), self, self)
        return reading
