"""Plain RANK/LOCAL_RANK/WORLD_SIZE variables set by something not recognised as a launcher."""

from __future__ import annotations

from typing import Mapping

from .base import PLAIN_VARIABLES, Reading, _VariableLauncher


class EnvLauncher(_VariableLauncher):
    """``RANK``/``LOCAL_RANK``/``WORLD_SIZE`` set by something not recognised before it in ``LAUNCHERS`` (a
    script, Ray Train's workers outside Ray detection, a custom spawner). Also the generic source every process
    manager is cross-checked against."""

    name = "env"
    description = "environment variables (RANK, LOCAL_RANK, WORLD_SIZE)"
    variables = PLAIN_VARIABLES

    def present(self, env: Mapping[str, str]) -> bool:
        return any(v in env for v in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE"))

    def read(self, env: Mapping[str, str]) -> Reading:
        reading = super().read(env)
        if reading.values.get("world_size") == 1 and "local_rank" not in reading.values:
            reading.put("local_rank", 0, "(implied: WORLD_SIZE=1)")  # leftover RANK=0 WORLD_SIZE=1 in a shell
        return reading
