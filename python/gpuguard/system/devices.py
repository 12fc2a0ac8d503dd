"""The CUDA devices this process can see, read from the driver (loaded at run time by the C++ core)."""

from __future__ import annotations

# Device: one visible CUDA device (``index`` is its ordinal in this process: what ``cuda:N`` means here); the C++
# record, with ``total_memory_gib`` and ``as_dict()``. CudaStatus: what the driver said: loaded or not, its
# version, how many devices, and why there are none.
from .._core import CudaStatus, Device, enumerate_devices
from .._core import cuda_status as _cuda_status


def cuda_status() -> CudaStatus:
    """Loads the driver and calls cuInit if that has not happened yet; never raises."""
    return _cuda_status()


def devices() -> list[Device]:
    """The CUDA devices visible to this process, in visible order; ``[]`` without a driver or a GPU.

    The first call initialises the CUDA driver (``cuInit``), which fixes ``CUDA_VISIBLE_DEVICES`` for the
    life of the process, exactly as torch's first CUDA call would. ``cuda_status().reason`` says why the
    list is empty.
    """
    found, _error = enumerate_devices()
    return found
