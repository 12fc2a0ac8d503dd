"""A task of a SLURM job step (srun): SLURM_PROCID, SLURM_LOCALID, and SLURM's compressed task lists."""

from __future__ import annotations

import re
from typing import Mapping

from ...errors import LaunchEnvironmentError
from .base import _MAX_INT, Reading, _VariableLauncher, read_int


def parse_tasks_per_node(text: str) -> list[int]:
    """SLURM's compressed list: ``"5(x2),3"`` -> ``[5, 5, 3]``. Raises ValueError on anything else."""
    out: list[int] = []
    for part in text.split(","):
        m = re.fullmatch(r"\s*([0-9]{1,6})(?:\(x([0-9]{1,6})\))?\s*", part)
        if not m:
            raise ValueError(part)
        count = int(m.group(2) or 1)
        if len(out) + count > _MAX_INT:
            raise ValueError(part)
        out.extend([int(m.group(1))] * count)
    return out


class SlurmLauncher(_VariableLauncher):
    """A task of a SLURM job *step* (``srun``). The batch script itself (no SLURM_STEP_ID) is one process."""

    name = "slurm"
    description = "SLURM srun"
    variables = {"rank": "SLURM_PROCID", "world_size": "SLURM_STEP_NUM_TASKS", "local_rank": "SLURM_LOCALID",
                 "local_world_size": "SLURM_STEP_TASKS_PER_NODE", "node_rank": "SLURM_NODEID"}

    def present(self, env: Mapping[str, str]) -> bool:
        return "SLURM_PROCID" in env and ("SLURM_STEP_ID" in env or "SLURM_STEPID" in env)

    def read(self, env: Mapping[str, str]) -> Reading:
        reading = Reading(self)
        reading.put("rank", read_int(env, "SLURM_PROCID"), "SLURM_PROCID")
        for var in ("SLURM_STEP_NUM_TASKS", "SLURM_NTASKS", "SLURM_NPROCS"):
            if var in env:
                reading.put("world_size", read_int(env, var), var)
                break
        reading.put("local_rank", read_int(env, "SLURM_LOCALID"), "SLURM_LOCALID")
        node = read_int(env, "SLURM_NODEID")
        reading.put("node_rank", node, "SLURM_NODEID")
        for var in ("SLURM_STEP_TASKS_PER_NODE", "SLURM_TASKS_PER_NODE"):
            if var in env and node is not None:
                try:
                    per_node = parse_tasks_per_node(env[var])
                except ValueError:
                    raise LaunchEnvironmentError(
                        f"{var}={env[var]!r} is not a SLURM task list such as '4(x2),3'.",
                        variable=var, value=env[var]) from None
                if node < len(per_node):
                    reading.put("local_world_size", per_node[node], f"{var}[SLURM_NODEID]")
                break
        return reading
