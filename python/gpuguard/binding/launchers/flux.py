"""A task of a Flux job (flux run/flux submit): FLUX_TASK_RANK, FLUX_TASK_LOCAL_ID, FLUX_JOB_SIZE."""

from __future__ import annotations

from typing import Mapping

from ...errors import LaunchEnvironmentError
from .base import FORCE_VARIABLE, Reading, _VariableLauncher, read_int


class FluxLauncher(_VariableLauncher):
    """A task of a Flux job (``flux run``/``flux submit``). The job shell sets FLUX_TASK_RANK,
    FLUX_TASK_LOCAL_ID (flux-core src/shell/task.c) and FLUX_JOB_SIZE, the number of tasks in the job, with
    FLUX_JOB_NNODES (src/shell/shell.c; doc/man7/flux-environment.rst). No local task count and no node index
    are exported. Its PMI plugin also sets PMI_RANK and PMI_SIZE (src/shell/pmi/pmi.c): those describe the
    same task and are cross-checked; a PMI_SIZE that differs means an mpiexec was started inside this task."""

    name = "flux"
    description = "Flux job shell"
    markers = ("FLUX_TASK_RANK",)
    variables = {"rank": "FLUX_TASK_RANK", "world_size": "FLUX_JOB_SIZE", "local_rank": "FLUX_TASK_LOCAL_ID"}

    def read(self, env: Mapping[str, str]) -> Reading:
        reading = super().read(env)
        pmi_size, size = read_int(env, "PMI_SIZE"), reading.values.get("world_size")
        if pmi_size is not None and size is not None and pmi_size != size and "MPI_LOCALRANKID" in env:
            raise LaunchEnvironmentError(
                f"This process has Flux's FLUX_JOB_SIZE={size} and Hydra's PMI_SIZE={pmi_size} "
                f"(MPI_LOCALRANKID={env['MPI_LOCALRANKID']}): an mpiexec runs inside a Flux task, and the Flux "
                f"variables describe that task, not this rank. Set {FORCE_VARIABLE}=mpich to read mpiexec's, "
                f"or let Flux start the ranks itself (flux run -n {pmi_size} ...).",
                variables={"FLUX_JOB_SIZE": size, "PMI_SIZE": pmi_size})
        return reading
