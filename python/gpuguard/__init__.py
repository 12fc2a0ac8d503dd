"""gpuguard: catch GPU-placement mistakes in multi-GPU PyTorch and Ray jobs before they cost a run.

Importing gpuguard never initialises CUDA: the driver reads CUDA_VISIBLE_DEVICES once, at its first
initialisation, and a library that did so at import would freeze the wrong visibility.
"""

from __future__ import annotations

import importlib
import sys
import types
from typing import TYPE_CHECKING, Any

from ._version import __version__

# Names load on first use (PEP 562), so that importing gpuguard, or gpuguard.ray for the Ray setup hook
# "gpuguard.ray.setup", loads nothing but the standard library: torch and the extension come with the first
# name that needs them. The imports below are the map, read by type checkers and by _LAZY.
if TYPE_CHECKING:
    from ._load_core import TORCH_VERSION_BUILT_FOR
    from .binding import Binding, bind, init_process_group
    from .devices import CudaStatus, Device, cuda_status, devices
    from .doctor import DoctorReport, Finding
    from .doctor import run_doctor as doctor
    from .errors import (
        CudaStateError,
        DeviceMismatchError,
        DuplicateDeviceError,
        GpuGuardError,
        GpuGuardWarning,
        LaunchEnvironmentError,
        RankMappingError,
        RayPlacementError,
        RayRendezvousError,
        RendezvousTimeoutError,
    )
    from .explain import Diagnosis, Evidence, explain, explain_file
    from .binding.launchers import LaunchContext, detect as detect_launcher
    from .tensor_devices import GuardHandle, assert_same_device, guard, same_device
    from .ray import PlacementReport, RayPlacement, ray_placement

__all__ = [
    "Binding",
    "CudaStateError",
    "CudaStatus",
    "Device",
    "DeviceMismatchError",
    "Diagnosis",
    "DoctorReport",
    "DuplicateDeviceError",
    "Evidence",
    "Finding",
    "GpuGuardError",
    "GpuGuardWarning",
    "GuardHandle",
    "LaunchContext",
    "LaunchEnvironmentError",
    "PlacementReport",
    "RankMappingError",
    "RayPlacement",
    "RayPlacementError",
    "RayRendezvousError",
    "RendezvousTimeoutError",
    "TORCH_VERSION_BUILT_FOR",
    "__version__",
    "assert_same_device",
    "bind",
    "cuda_status",
    "detect_launcher",
    "devices",
    "doctor",
    "explain",
    "explain_file",
    "guard",
    "init_process_group",
    "ray_placement",
    "same_device",
]


def _lazy_map() -> dict[str, tuple[str, str]]:
    """name -> (module, attribute), read from the TYPE_CHECKING block above (one place to add an export)."""
    import ast
    import pathlib

    tree = ast.parse(pathlib.Path(__file__).read_text(encoding="utf-8"))
    found: dict[str, tuple[str, str]] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and isinstance(node.test, ast.Name) and node.test.id == "TYPE_CHECKING":
            for stmt in node.body:
                if isinstance(stmt, ast.ImportFrom):
                    for alias in stmt.names:
                        found[alias.asname or alias.name] = ("." * stmt.level + (stmt.module or ""), alias.name)
    return found


_LAZY: dict[str, tuple[str, str]] = {}


def _load_all() -> None:
    """Imports every public name, as an eager package would: torch first, then the extension (with its "built
    for PyTorch X, you have Y" check), then the rest, in the order of the map."""
    if not _LAZY:
        _LAZY.update(_lazy_map())
    g = globals()
    for name, (module, attribute) in _LAZY.items():
        g[name] = getattr(importlib.import_module(module, __name__), attribute)


def __getattr__(name: str) -> Any:
    # only the public names load anything: `from . import _C` and other submodule imports must find no
    # attribute, so that the import system imports the submodule itself
    if not _LAZY:
        _LAZY.update(_lazy_map())
    if name not in _LAZY:
        raise AttributeError(f"module 'gpuguard' has no attribute {name!r}")
    _load_all()
    return globals()[name]


# devices(), doctor() and explain() share their names with the submodules that define them; importing such a
# submodule first (gpuguard.auto does, under the Ray hook) sets the package attribute to the module, so the
# function is put back on access.
_SHADOWED = frozenset({"devices", "doctor", "explain"})


class _Package(types.ModuleType):
    def __getattribute__(self, name: str) -> Any:
        value = super().__getattribute__(name)
        if name in _SHADOWED and isinstance(value, types.ModuleType):
            _load_all()
            value = globals()[name]
        return value


sys.modules[__name__].__class__ = _Package
if "torch" in sys.modules:  # torch is there anyway: load now, so that a bad build fails at import as before
    _load_all()
