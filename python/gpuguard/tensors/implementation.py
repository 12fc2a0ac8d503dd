"""Which implementation the tensor checks run: gpuguard._libtorch when it loads, else _python_checks.py (the same
functions, reports and errors, in Python), after one warning per process that says why and how to rebuild.

The choice lives here, beside both implementations, so that the loader of the compiled modules (_libtorch_loader)
imports nothing above it: it only loads _libtorch, or says why it cannot.
"""

from __future__ import annotations

import warnings
from types import ModuleType
from typing import Optional

from .._libtorch_loader import libtorch
from ..errors import GpuGuardWarning

_checks: Optional[ModuleType] = None  # what tensor_checks() answers, once decided (the tests set it)


def tensor_checks() -> ModuleType:
    """The tensor checks' implementation: gpuguard._libtorch when it loads, else gpuguard.tensors._python_checks,
    after one GpuGuardWarning per process that says why and how to rebuild. Decided on the first call."""
    global _checks
    if _checks is not None:
        return _checks
    try:
        _checks = libtorch()
    except ImportError as exc:
        from . import _python_checks

        _checks = _python_checks
        warnings.warn(fallback_warning(str(exc)), GpuGuardWarning, stacklevel=3)
    return _checks


def fallback_warning(reason: str) -> str:
    """The one warning printed when the tensor checks run in Python: why, what it costs, and the rebuild command."""
    return (f"gpuguard: {reason}\n"
            f"Until then, assert_same_device, same_device, guard and find_device_mismatch run in Python: the same "
            f"checks and reports, but slower (about a millisecond a call on a model of a thousand tensors).")
