"""Which visible GPUs hold a CUDA context of this process: the driver's cuDevicePrimaryCtxGetState, which creates none.

Read at bind() (binding/stray_contexts.py) and later in the run (context_monitor.py), so it sits below both.
"""

from __future__ import annotations

import logging

from .._core import active_primary_contexts

logger = logging.getLogger("gpuguard")


def active_contexts() -> list[int]:
    """The visible devices holding a context of this process; [] when the driver cannot say (logged)."""
    try:
        return list(active_primary_contexts())
    except RuntimeError as exc:  # a driver without cuDevicePrimaryCtxGetState: nothing to check with
        logger.debug("gpuguard: cannot ask the driver for this process's contexts: %s", exc)
        return []
