"""Lightning's native hooks: GpuGuardCallback (Trainer), FabricCallback (Fabric), and their zero-code entry points.

``GpuGuardCallback`` guards the model once the strategy has put it on its device (``on_fit_start``, and the
validate/test/predict starts for a run without fit), the DDP-wrapped model where there is one, so every step's
batch is checked against the weights, and starts ``watch()`` (protection.Protection); ``teardown`` undoes both.
``FabricCallback.on_after_setup`` does the same for the module ``fabric.setup()`` returns. The ranks come from
the Trainer and Fabric themselves (global_rank, world_size, local_rank): Lightning's own launcher never exports
RANK.

Zero code: pyproject.toml registers ``trainer_callbacks`` under ``lightning.pytorch.callbacks_factory``,
``standalone_trainer_callbacks`` under ``pytorch_lightning.callbacks_factory`` and ``fabric_callbacks`` under
``lightning.fabric.callbacks_factory``; Lightning calls every factory of those groups for every Trainer and
Fabric it builds (lightning/fabric/utilities/registry.py, ``_load_external_callbacks``), so each returns nothing
unless GPUGUARD=1 (``gpuguard run`` sets it), and never raises into the user's job.

The placement of the ranks themselves is checked at ``init_process_group``, which Lightning calls in
``setup_environment`` before any callback runs: that is the zero-code mode's patch, not a hook of this module.
"""

from __future__ import annotations

import importlib
import sys
from functools import lru_cache
from typing import Any

import _gpuguard_autostart

from .protection import Protection

__all__ = ["FabricCallback", "GpuGuardCallback", "callback_class", "fabric_callbacks", "standalone_trainer_callbacks",
           "trainer_callbacks"]


@lru_cache(maxsize=None)
def callback_class(package: str = "lightning.pytorch") -> type:
    """GpuGuardCallback as a Callback of ``package``: "lightning.pytorch" (the ``lightning`` package) or
    "pytorch_lightning" (the standalone one); a Trainer accepts only its own package's callbacks."""
    base = importlib.import_module(package).Callback

    class GpuGuardCallback(base):  # type: ignore[misc, valid-type]
        """Guards the model on its device and watches the collectives, for every run of the Trainer.

        ``deep=True``: every layer against its own inputs (the exact layer that would fail); ``watch``: start
        gpuguard.watch() in a job of several ranks (``stall_after``, ``on_stall`` as watch() takes them)."""

        def __init__(self, *, deep: bool = False, watch: bool = True, stall_after: Any = None,
                     on_stall: str = "report") -> None:
            super().__init__()
            self.protection = Protection("Lightning", deep=deep, watch=watch, stall_after=stall_after,
                                         on_stall=on_stall)

        def _start(self, trainer: Any, pl_module: Any) -> None:
            model = getattr(trainer.strategy, "model", None) or pl_module
            self.protection.start(model, rank=trainer.global_rank, world_size=trainer.world_size,
                                  local_rank=trainer.local_rank, local_world_size=trainer.num_devices,
                                  node_rank=trainer.node_rank)

        def on_fit_start(self, trainer: Any, pl_module: Any) -> None:
            self._start(trainer, pl_module)

        def on_validation_start(self, trainer: Any, pl_module: Any) -> None:
            self._start(trainer, pl_module)

        def on_test_start(self, trainer: Any, pl_module: Any) -> None:
            self._start(trainer, pl_module)

        def on_predict_start(self, trainer: Any, pl_module: Any) -> None:
            self._start(trainer, pl_module)

        def teardown(self, trainer: Any, pl_module: Any, stage: str) -> None:
            self.protection.stop()

    GpuGuardCallback.__module__ = __name__
    GpuGuardCallback.__qualname__ = "GpuGuardCallback"
    return GpuGuardCallback


def __getattr__(name: str) -> Any:
    if name == "GpuGuardCallback":  # the lightning package's, made on first use (importing lightning)
        return callback_class("lightning.pytorch")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


class FabricCallback:
    """Fabric's hook: ``on_after_setup`` guards the module ``fabric.setup()`` returned and starts watch()."""

    def __init__(self, *, deep: bool = False, watch: bool = True, stall_after: Any = None,
                 on_stall: str = "report") -> None:
        self.protection = Protection("Fabric", deep=deep, watch=watch, stall_after=stall_after, on_stall=on_stall)

    def on_after_setup(self, fabric: Any, module: Any) -> None:
        self.protection.start(module, rank=fabric.global_rank, world_size=fabric.world_size,
                              local_rank=fabric.local_rank)


def _from_entry_point(make: Any) -> list[Any]:
    """What a callbacks_factory entry point returns: nothing unless GPUGUARD=1; an error here is said, never raised
    into a job that did not ask for gpuguard's checks to stop it."""
    if not _gpuguard_autostart.wanted():  # GPUGUARD, read as the .pth and verl's plugin read it
        return []
    try:
        return [make()]
    except Exception as exc:  # noqa: BLE001 - the job runs without the hook rather than not at all
        sys.stderr.write(f"gpuguard: could not add its Lightning callback ({type(exc).__name__}: {exc}); the job runs "
                         f"without it\n")
        return []


# The entry points' hooks guard shallowly: with GPUGUARD_GUARD=1 the zero-code mode already guards every module
# given to DDP/FSDP deeply (gpuguard.auto), and a second deep guard would double each layer's hooks.

def trainer_callbacks() -> list[Any]:
    """Entry point of ``lightning.pytorch.callbacks_factory``."""
    return _from_entry_point(lambda: callback_class("lightning.pytorch")())


def standalone_trainer_callbacks() -> list[Any]:
    """Entry point of ``pytorch_lightning.callbacks_factory`` (the standalone pytorch_lightning package)."""
    return _from_entry_point(lambda: callback_class("pytorch_lightning")())


def fabric_callbacks() -> list[Any]:
    """Entry point of ``lightning.fabric.callbacks_factory``."""
    return _from_entry_point(FabricCallback)
