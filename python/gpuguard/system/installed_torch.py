"""The torch installed beside gpuguard, read from its files without importing it: its version, its CUDA build and
the NCCL wheel that build loads (importing torch costs seconds and most of a gigabyte, too much for doctor)."""

from __future__ import annotations

import ast
import functools
import importlib.metadata
import importlib.util
import os
import sys
from dataclasses import dataclass
from typing import Any, Optional


@dataclass(frozen=True)
class InstalledTorch:
    version: str           # torch.__version__, e.g. "2.6.0+cu124"
    cuda: Optional[str]    # torch.version.cuda: None for a CPU-only build
    location: str          # the package's folder


@dataclass(frozen=True)
class NcclWheel:
    distribution: str      # "nvidia-nccl-cu12"
    version: str           # the wheel's version is NCCL's
    library: Optional[str]  # its libnccl.so.2, where the file is there


def _literals(source: str) -> dict[str, Any]:
    """Module-level ``name = literal`` and ``name: T = literal`` assignments of a Python file, never executed."""
    out: dict[str, Any] = {}
    for node in ast.parse(source).body:
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            target, value = node.targets[0].id, node.value
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and node.value is not None:
            target, value = node.target.id, node.value
        else:
            continue
        try:
            out[target] = ast.literal_eval(value)
        except ValueError:
            continue
    return out


def installed_torch() -> Optional[InstalledTorch]:
    """The torch this interpreter would import (the imported one when it is already loaded); None without one."""
    loaded = sys.modules.get("torch")
    if loaded is not None and hasattr(loaded, "version"):
        return InstalledTorch(str(loaded.__version__), getattr(loaded.version, "cuda", None),
                              os.path.dirname(loaded.__file__ or ""))
    return _from_files()


@functools.lru_cache(maxsize=1)
def _from_files() -> Optional[InstalledTorch]:
    """torch/version.py, parsed once per process (doctor asks three times)."""
    try:
        spec = importlib.util.find_spec("torch")
    except (ImportError, ValueError):
        return None
    for location in (spec.submodule_search_locations or []) if spec else []:
        try:
            with open(os.path.join(location, "version.py"), encoding="utf-8") as f:
                values = _literals(f.read())
        except (OSError, SyntaxError, ValueError):
            continue
        version = values.get("__version__")
        if isinstance(version, str):
            cuda = values.get("cuda")
            return InstalledTorch(version, cuda if isinstance(cuda, str) else None, location)
    return None


# The nvidia-nccl wheels, newest CUDA first: torch's CUDA builds from PyPI depend on one of them.
NCCL_WHEELS = ("nvidia-nccl-cu13", "nvidia-nccl-cu12", "nvidia-nccl-cu11")


def nccl_wheel() -> Optional[NcclWheel]:
    """The nvidia-nccl wheel a CUDA build of torch from PyPI loads its NCCL from; None where there is none. Its
    library is the one its own RECORD lists, not whichever ``nvidia`` package comes first on sys.path."""
    for distribution in NCCL_WHEELS:
        try:
            dist = importlib.metadata.distribution(distribution)
        except importlib.metadata.PackageNotFoundError:
            continue
        library = None
        for file in dist.files or []:
            if file.name == "libnccl.so.2":
                candidate = str(dist.locate_file(file))
                if os.path.exists(candidate):
                    library = os.path.normpath(candidate)
                    break
        return NcclWheel(distribution, dist.version, library)
    return None
