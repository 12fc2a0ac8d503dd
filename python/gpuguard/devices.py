"""The CUDA devices this process can see, read from the driver (loaded at run time by the C++ core)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

from . import _C


@dataclass(frozen=True)
class Device:
    """One visible CUDA device. ``index`` is its ordinal in this process (what ``cuda:N`` means here)."""

    index: int
    name: str
    uuid: str
    pci_bus_id: str
    total_memory: int
    compute_capability: tuple[int, int]
    multiprocessors: int = 0

    @property
    def total_memory_gib(self) -> float:
        return self.total_memory / 2**30

    def as_dict(self) -> dict[str, Any]:
        return {
            "index": self.index,
            "name": self.name,
            "uuid": self.uuid,
            "pci_bus_id": self.pci_bus_id,
            "total_memory": self.total_memory,
            "compute_capability": list(self.compute_capability),
            "multiprocessors": self.multiprocessors,
        }


@dataclass(frozen=True)
class CudaStatus:
    """What the driver said: loaded or not, its version, how many devices, and why there are none."""

    library_loaded: bool
    initialized: bool
    library: str
    driver_version: int
    device_count: int
    visible_devices_at_init: Optional[str]
    reason: str

    @property
    def driver_version_string(self) -> str:
        if not self.driver_version:
            return "unknown"
        return f"{self.driver_version // 1000}.{(self.driver_version % 1000) // 10}"

    def as_dict(self) -> dict[str, Any]:
        return {
            "library_loaded": self.library_loaded,
            "initialized": self.initialized,
            "library": self.library,
            "driver_version": self.driver_version,
            "device_count": self.device_count,
            "visible_devices_at_init": self.visible_devices_at_init,
            "reason": self.reason,
        }


def cuda_status() -> CudaStatus:
    """Loads the driver and calls cuInit if that has not happened yet; never raises."""
    return CudaStatus(**_C.cuda_status())


def devices() -> list[Device]:
    """The CUDA devices visible to this process, in visible order; ``[]`` without a driver or a GPU.

    The first call initialises the CUDA driver (``cuInit``), which fixes ``CUDA_VISIBLE_DEVICES`` for the
    life of the process, exactly as torch's first CUDA call would. ``cuda_status().reason`` says why the
    list is empty.
    """
    found, _error = _C.enumerate_devices()
    return [
        Device(
            index=d["index"],
            name=d["name"],
            uuid=d["uuid"],
            pci_bus_id=d["pci_bus_id"],
            total_memory=d["total_memory"],
            compute_capability=tuple(d["compute_capability"]),
            multiprocessors=d["multiprocessors"],
        )
        for d in found
    ]
