"""Loads the compiled core, gpuguard._C, after torch, and turns a version mismatch into one clear error.

Every module refers to the core by its one name, ``from . import _C`` (or ``from .. import _C``); the package's
``__getattr__`` sends that here the first time, so torch is imported only when something needs the core.
(gpuguard._scan, the log reader, links neither and is imported directly.)
"""

from __future__ import annotations

import importlib
from typing import Any

import torch  # noqa: F401  (must come first: _C links against torch's libraries)


def _base_version(version: str) -> str:
    return version.split("+", 1)[0]


def _load() -> None:
    try:
        from . import _build_info
    except ImportError:  # pragma: no cover - only a broken checkout lacks it
        _build_info = None  # type: ignore[assignment]
    built_for = getattr(_build_info, "TORCH_VERSION", None)
    installed = torch.__version__
    reinstall = "pip install --no-build-isolation --force-reinstall --no-deps gpuguard"
    if built_for is not None and _base_version(built_for) != _base_version(installed):
        raise ImportError(
            f"gpuguard was built for PyTorch {built_for}, but PyTorch {installed} is installed. "
            f"Rebuild it against this torch: {reinstall} (or, in a source checkout, "
            f"pip install --no-build-isolation .)"
        )
    try:
        importlib.import_module("._C", __package__)
    except ImportError as exc:
        if built_for is None:
            raise ImportError(
                f"gpuguard's compiled core (gpuguard._C) is missing or unloadable: {exc}. "
                f"Build it with: pip install --no-build-isolation ."
            ) from exc
        raise ImportError(
            f"gpuguard's compiled core failed to load ({exc}). It was built for PyTorch {built_for}; "
            f"PyTorch {installed} is installed. Rebuild: {reinstall}"
        ) from exc


_load()


def load() -> Any:
    """The loaded core module (gpuguard._C)."""
    return importlib.import_module("._C", __package__)


TORCH_VERSION_BUILT_FOR: str | None = getattr(
    __import__("gpuguard._build_info", fromlist=["TORCH_VERSION"]), "TORCH_VERSION", None
)
