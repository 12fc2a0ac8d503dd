"""No launcher: one process, rank 0 of 1, unless it is a child of Python's multiprocessing."""

from __future__ import annotations

from typing import Mapping, Optional

from .base import FIELDS, LaunchContext, Launcher, Reading
from .no_launcher import spawned_by


class SingleProcessLauncher(Launcher):
    """No launcher: one process, rank 0 of 1 -- unless this process is a child of Python's multiprocessing
    (``torch.multiprocessing.spawn`` puts nothing in the environment), which ``extra["spawned_by"]`` records
    for ``check_spawned_child`` to refuse once the GPU count is known."""

    name = "single"
    description = "single process (no launcher)"

    def present(self, env: Mapping[str, str]) -> bool:
        return True

    def detect(self, env: Mapping[str, str]) -> Optional[LaunchContext]:
        context = super().detect(env)
        spawned = spawned_by()
        if context is None or spawned is None:
            return context
        return LaunchContext(**{**context.as_dict(), "extra": {**context.extra, **spawned}})

    def read(self, env: Mapping[str, str]) -> Reading:
        reading = Reading(self)
        why = "(no launcher variables: single process)"
        for name in FIELDS:
            reading.put(name, 1 if name.endswith("world_size") else 0, why)
        return reading
