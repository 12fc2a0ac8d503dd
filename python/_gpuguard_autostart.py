"""gpuguard's zero-code start: standard library only; arms gpuguard.auto the moment the job imports torch.

Loaded by ``gpuguard_auto.pth`` (installed with the package) only when ``GPUGUARD`` is set and not "0", by the
Ray setup hook ``gpuguard.ray.setup`` and by verl's plugin entry point ``gpuguard.ray.verl_plugin``. It never
imports torch nor initialises CUDA itself: it adds one finder to ``sys.meta_path`` that waits for ``import torch``
and, once torch's own module has finished loading, imports ``gpuguard.auto`` and calls ``enable()``. A job that
never imports torch never loads gpuguard.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import os
import sys
from typing import Any, Optional, Sequence

_VARIABLE = "GPUGUARD"


def wanted(environ: Any = None) -> bool:
    """Whether ``GPUGUARD`` asks for the zero-code mode ("" and "0" do not)."""
    value = (os.environ if environ is None else environ).get(_VARIABLE, "")
    return value.strip().lower() not in ("", "0", "false", "no", "off")


def _enable_now(origin: str) -> None:
    try:
        from gpuguard.auto import enable
        enable(origin=origin)
    except Exception as exc:  # noqa: BLE001 - the job must run even when gpuguard cannot arm itself
        sys.stderr.write(f"gpuguard: could not switch on the automatic checks ({type(exc).__name__}: {exc}); "
                         f"the job runs without them\n")


class _Loader(importlib.abc.Loader):
    """Runs torch's own loader, then arms gpuguard (the module is complete by then)."""

    def __init__(self, inner: importlib.abc.Loader, origin: str) -> None:
        self._inner = inner
        self._origin = origin

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> Optional[Any]:
        return self._inner.create_module(spec)

    def exec_module(self, module: Any) -> None:
        self._inner.exec_module(module)  # type: ignore[attr-defined]
        _enable_now(self._origin)


class _TorchImportFinder(importlib.abc.MetaPathFinder):
    """Finds nothing itself: it asks the other finders for torch's spec and wraps its loader, once."""

    def __init__(self, origin: str) -> None:
        self.origin = origin

    def find_spec(self, fullname: str, path: Optional[Sequence[str]], target: Any = None) -> Any:
        if fullname != "torch":
            return None
        uninstall()
        for finder in sys.meta_path:
            find = getattr(finder, "find_spec", None)
            if find is None:
                continue
            spec = find(fullname, path, target)
            if spec is not None and spec.loader is not None:
                spec.loader = _Loader(spec.loader, self.origin)
                return spec
        return None


def uninstall() -> None:
    sys.meta_path[:] = [f for f in sys.meta_path if not isinstance(f, _TorchImportFinder)]


def arm(origin: str) -> None:
    """Enables gpuguard.auto now if torch is already imported, else the moment it is."""
    if "torch" in sys.modules:
        _enable_now(origin)
        return
    if not any(isinstance(f, _TorchImportFinder) for f in sys.meta_path):
        sys.meta_path.insert(0, _TorchImportFinder(origin))


def arm_from_environment() -> None:
    """What gpuguard_auto.pth runs at interpreter start: arms when ``GPUGUARD`` asks for it. Importing this module
    arms nothing by itself, so that a caller that arms it (the Ray hook, verl's plugin) is the one the start-up line
    names."""
    if wanted():
        arm(f"{_VARIABLE}={os.environ.get(_VARIABLE)}")
