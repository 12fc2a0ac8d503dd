"""gpuguard: catch GPU-placement mistakes in multi-GPU PyTorch and Ray jobs before they cost a run.

Importing gpuguard never initialises CUDA: the driver reads CUDA_VISIBLE_DEVICES once, at its first
initialisation, and a library that did so at import would freeze the wrong visibility.
"""

from __future__ import annotations

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
from .tensor_devices import GuardHandle, assert_same_device, find_device_mismatch, guard, same_device
from .ray import PlacementReport, RayPlacement, ray_placement

from ._version import __version__

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
    "find_device_mismatch",
    "guard",
    "init_process_group",
    "ray_placement",
    "same_device",
]
