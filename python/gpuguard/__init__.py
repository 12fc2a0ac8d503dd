"""gpuguard: catch GPU-placement mistakes in multi-GPU PyTorch and Ray jobs before they cost a run.

Importing gpuguard imports neither torch nor a compiled module until a name that needs them is used, and never
initialises CUDA: the driver reads CUDA_VISIBLE_DEVICES once, at its first
initialisation, and a library that did so at import would freeze the wrong visibility.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # what the names below are, for type checkers; at run time each loads on first use
    from ._libtorch_loader import TORCH_VERSION_BUILT_FOR
    from .api import bind, watch
    from .binding import Binding, init_process_group
    from .doctor_report import DoctorReport, Finding
    from .doctor_report import run_doctor as doctor
    from .errors import (
        CudaStateError,
        DeviceMismatchError,
        DuplicateDeviceError,
        ForeignProcessError,
        GpuGuardError,
        GpuGuardWarning,
        LaunchEnvironmentError,
        RankMappingError,
        RayPlacementError,
        RayRendezvousError,
        RendezvousTimeoutError,
        StrayContextError,
    )
    from .logs import Diagnosis, Evidence, explain, explain_file
    from .binding.launchers import LaunchContext, detect as detect_launcher
    from .system.devices import CudaStatus, Device, cuda_status, devices
    from .tensors.tensor_devices import GuardHandle, assert_same_device, find_device_mismatch, guard, same_device
    from .ray import PlacementReport, RayPlacement, ray_placement
    from .watchdog import Watch

from ._version import __version__
from .supported_versions import python_problem as _python_problem

if _python_problem():  # an older Python fails later, somewhere, with a less clear error (PEP 604, add_note, ...)
    raise ImportError(_python_problem())

# Public name -> (module, attribute). Loaded on first use (PEP 562), so that the command line and anything else
# that needs no torch starts without importing it: torch alone costs seconds and most of a gigabyte. The compiled
# modules are imported by the modules that use them: gpuguard._core (no torch) directly, gpuguard._libtorch (the
# tensor checks) through _libtorch_loader, which imports torch first and checks the version it was built for.
# No module shares its name with a public function (devices(): system/devices.py, doctor(): doctor_report.py,
# explain(): logs/), so importing a module never replaces a name here.
_LAZY: dict[str, tuple[str, str]] = {
    "TORCH_VERSION_BUILT_FOR": ("._libtorch_loader", "TORCH_VERSION_BUILT_FOR"),
    "Binding": (".binding", "Binding"),
    "bind": (".api", "bind"),
    "init_process_group": (".binding", "init_process_group"),
    "CudaStatus": (".system.devices", "CudaStatus"),
    "Device": (".system.devices", "Device"),
    "cuda_status": (".system.devices", "cuda_status"),
    "devices": (".system.devices", "devices"),
    "DoctorReport": (".doctor_report", "DoctorReport"),
    "Finding": (".doctor_report", "Finding"),
    "doctor": (".doctor_report", "run_doctor"),
    **{name: (".errors", name) for name in (
        "CudaStateError", "DeviceMismatchError", "DuplicateDeviceError", "ForeignProcessError", "GpuGuardError",
        "GpuGuardWarning", "LaunchEnvironmentError", "RankMappingError", "RayPlacementError", "RayRendezvousError",
        "RendezvousTimeoutError", "StrayContextError")},
    "Diagnosis": (".logs", "Diagnosis"),
    "Evidence": (".logs", "Evidence"),
    "explain": (".logs", "explain"),
    "explain_file": (".logs", "explain_file"),
    "LaunchContext": (".binding.launchers", "LaunchContext"),
    "detect_launcher": (".binding.launchers", "detect"),
    "GuardHandle": (".tensors.tensor_devices", "GuardHandle"),
    "assert_same_device": (".tensors.tensor_devices", "assert_same_device"),
    "guard": (".tensors.tensor_devices", "guard"),
    "find_device_mismatch": (".tensors.tensor_devices", "find_device_mismatch"),
    "same_device": (".tensors.tensor_devices", "same_device"),
    "PlacementReport": (".ray", "PlacementReport"),
    "RayPlacement": (".ray", "RayPlacement"),
    "ray_placement": (".ray", "ray_placement"),
    "Watch": (".watchdog", "Watch"),
    "watch": (".api", "watch"),
}


def __getattr__(name: str) -> Any:
    target = _LAZY.get(name)
    if target is None:
        raise AttributeError(f"module 'gpuguard' has no attribute {name!r}")
    value = getattr(importlib.import_module(target[0], __name__), target[1])
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))


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
    "ForeignProcessError",
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
    "StrayContextError",
    "TORCH_VERSION_BUILT_FOR",
    "Watch",
    "__version__",
    "assert_same_device",
    "bind",
    "cuda_status",
    "detect_launcher",
    "devices",
    "doctor",
    "explain",
    "explain_file",
    "find_device_mismatch",
    "guard",
    "init_process_group",
    "ray_placement",
    "same_device",
    "watch",
]
