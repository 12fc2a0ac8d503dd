"""verl's plugin entry point (group ``verl.plugins``): under GPUGUARD=1, arms the zero-code checks in every verl process.

``import verl`` loads every entry point of the group ``verl.plugins`` (verl/__init__.py, 0.9; VERL_USE_EXTERNAL_PLUGINS
=none turns that off), in the driver and in every Ray worker, because each imports verl's Worker. Loading this module is
all it takes: it arms gpuguard.auto (``_gpuguard_autostart``, standard library only) when GPUGUARD asks for it, and
does nothing otherwise, so an installed gpuguard never changes a verl job nobody asked it to check. Unlike a Ray
``worker_process_setup_hook``, it needs no change to the job's runtime_env.
"""

from __future__ import annotations

import _gpuguard_autostart

ORIGIN = "verl's plugin entry point gpuguard.ray.verl_plugin (GPUGUARD=1)"

if _gpuguard_autostart.wanted():
    _gpuguard_autostart.arm(ORIGIN)
