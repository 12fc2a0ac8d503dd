"""Loads gpuguard._libtorch, the tensor checks' compiled module, after torch, or says why it cannot and what to do:
then the tensor checks run in Python instead (tensors/implementation.py), after one warning, and never stop a job.

_libtorch links LibTorch, so it is bound to the torch it was compiled against: pip upgrades torch freely, and
after that the module's symbols no longer match. Everything else gpuguard does (bind(), the zero-code checks,
watch(), the command line, explain) lives in the torch-free gpuguard._core and keeps working. The tensor checks
(assert_same_device, @same_device, guard() and find_device_mismatch) take their implementation from
tensors.implementation.tensor_checks(): the compiled module when it loads, else gpuguard.tensors._python_checks,
which computes and words the same reports; the first fallback warns once, naming the fix, and ``gpuguard doctor``
says which path runs. Only the flight recorder reader (watch()) has no Python twin: libtorch() raises for it.

Two kinds of install carry the module:
- a source build (pip install --no-build-isolation . in a clone): one _libtorch beside this file, and its build
  record (_build_info_<soabi>.py) naming the torch it was built for; another torch version, even a patch release,
  is refused from the record without loading the module;
- a binary wheel (scripts/build_wheels.sh): one variant per torch minor under _torch/torch<major>_<minor>/, each a
  _libtorch and its record; the installed torch's minor picks one, whose C++ ABI must be torch's. No variant for
  that minor (a torch newer than the wheel), another ABI, or a variant that fails to load: the Python checks.
Which one applies is decided from the files alone (choice()), so that ``gpuguard doctor`` answers without torch.
"""

from __future__ import annotations

import ast
import importlib
import importlib.machinery
import importlib.metadata
import importlib.util
import re
import sys
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Optional

#: The rebuild, as docs/building-and-testing.md builds gpuguard from source: from its clone, against the torch of
#: the environment it runs in (--force-reinstall: even at the same version; --no-deps: leaves torch as it is).
REINSTALL = ("pip install --no-build-isolation --force-reinstall --no-deps . (run in the gpuguard clone it was "
             "installed from, in the environment that holds this torch)")
#: The fix where a binary wheel has no variant for the installed torch.
WHEEL_FIX = ("install a gpuguard wheel built for this torch (scripts/build_wheels.sh builds one variant per torch "
             "minor), or build gpuguard from source against it (docs/building-and-testing.md): in a clone, pip "
             "install --no-build-isolation --force-reinstall --no-deps .")

PACKAGE = Path(__file__).resolve().parent
#: where a binary wheel keeps its variants, one folder per torch minor: torch2_15/
VARIANTS = PACKAGE / "_torch"
SUFFIX = importlib.machinery.EXTENSION_SUFFIXES[0]  # ".cpython-310-x86_64-linux-gnu.so"


def build_record_name() -> str:
    """The build record's module name for this interpreter: _build_info_ and the extension suffix the compiled
    modules carry (``_build_info_cpython_310_x86_64_linux_gnu``), as csrc/python/CMakeLists.txt names it, so that
    builds for several Pythons in one folder each keep their own."""
    soabi = SUFFIX[1:-3] if SUFFIX.endswith(".so") else SUFFIX[1:]
    return "_build_info_" + re.sub(r"[^A-Za-z0-9]", "_", soabi)


@dataclass(frozen=True)
class Build:
    """One compiled gpuguard._libtorch: its file and the torch its build record names."""

    module: Path
    torch_version: str
    cxx11_abi: Optional[int]
    variant: bool  # a binary wheel's variant (chosen by torch minor), not a source build (by exact version)


def _minor(version: str) -> tuple[int, int]:
    major, minor = (re.match(r"\d+", part) for part in version.split("+", 1)[0].split(".")[:2])
    return (int(major.group()) if major else 0, int(minor.group()) if minor else 0)


def _read_record(path: Path) -> Optional[dict[str, object]]:
    """The assignments of a build record (TORCH_VERSION, TORCH_CXX11_ABI), read without running it."""
    try:
        tree = ast.parse(path.read_text())
    except (OSError, SyntaxError, ValueError):
        return None
    record = {}
    for node in tree.body:
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            try:
                record[node.targets[0].id] = ast.literal_eval(node.value)
            except ValueError:
                continue
    return record if isinstance(record.get("TORCH_VERSION"), str) else None


def _build_from(folder: Path, variant: bool) -> Optional[Build]:
    record = _read_record(folder / f"{build_record_name()}.py")
    if record is None:
        return None
    abi = record.get("TORCH_CXX11_ABI")
    return Build(folder / f"_libtorch{SUFFIX}", str(record["TORCH_VERSION"]), abi if isinstance(abi, int) else None,
                 variant)


def source_build() -> Optional[Build]:
    """The source build's _libtorch and record beside this file, or None (a wheel, or a build without it)."""
    return _build_from(PACKAGE, variant=False)


def wheel_variants() -> dict[tuple[int, int], Build]:
    """A binary wheel's variants for this Python, by torch (major, minor); empty for a source build."""
    found = {}
    for folder in sorted(VARIANTS.glob("torch*_*")) if VARIANTS.is_dir() else []:
        build = _build_from(folder, variant=True)
        if build is not None and build.module.is_file():
            found[_minor(build.torch_version)] = build
    return found


def _stated(versions: list[tuple[int, int]]) -> str:
    names = [f"{major}.{minor}" for major, minor in sorted(versions)]
    return ", ".join(names[:-1]) + " and " + names[-1] if len(names) > 1 else names[0]


@dataclass(frozen=True)
class Choice:
    """What _libtorch_loader does for one installed torch: the build it loads, or why none (the warning's text,
    and a finding's code for doctor: tensor_checks_missing, torch_build_mismatch or no_variant_for_torch)."""

    build: Optional[Build]
    problem: Optional[str] = None
    code: Optional[str] = None


def choice(installed: str) -> Choice:
    """The build to load under torch ``installed``, judged from the files alone (the C++ ABI aside: _load checks it
    against the imported torch)."""
    source = source_build()
    if source is not None:
        if source.torch_version.split("+", 1)[0] != installed.split("+", 1)[0]:
            return Choice(None, f"gpuguard was built for PyTorch {source.torch_version}, but PyTorch {installed} is "
                                f"installed, so gpuguard._libtorch (its compiled tensor checks) cannot load. Rebuild "
                                f"it against this torch: {REINSTALL}", "torch_build_mismatch")
        return Choice(source)
    variants = wheel_variants()
    if not variants and not VARIANTS.is_dir():
        return Choice(None, f"gpuguard._libtorch (its compiled tensor checks) is missing or unloadable: No module "
                            f"named 'gpuguard._libtorch'. Build it with: {REINSTALL}", "tensor_checks_missing")
    build = variants.get(_minor(installed))
    if build is None:
        carried = f"for PyTorch {_stated(list(variants))}" if variants else "for no PyTorch"
        return Choice(None, f"this gpuguard wheel carries compiled tensor checks (gpuguard._libtorch) {carried}, "
                            f"none for PyTorch {installed}, which is installed. To have them: {WHEEL_FIX}",
                      "no_variant_for_torch")
    return Choice(build)


def _installed_torch_version() -> Optional[str]:
    """The version of the torch distribution `import torch` would load, from its metadata (torch not imported)."""
    try:
        return importlib.metadata.version("torch")
    except importlib.metadata.PackageNotFoundError:
        return None


def _built_for() -> Optional[str]:
    source = source_build()
    if source is not None:
        return source.torch_version
    installed = _installed_torch_version()
    build = choice(installed).build if installed else None
    return build.torch_version if build else None


TORCH_VERSION_BUILT_FOR: Optional[str] = _built_for()
"""The torch that the gpuguard._libtorch this process would load was compiled against: the source build's, or the
binary wheel's variant for the installed torch's minor; None without one."""

_module: Optional[ModuleType] = None
_failure: Optional[str] = None


def built_for_another_torch(installed: str) -> bool:
    """Whether a source build's _libtorch was built for another torch than ``installed`` (local versions such as
    +cu124 aside). A wheel's variants are matched by minor: choice()."""
    return choice(installed).code == "torch_build_mismatch"


def _import_variant(build: Build) -> ModuleType:
    """A wheel's variant, imported as gpuguard._libtorch (its PyInit__libtorch) from its folder."""
    spec = importlib.util.spec_from_file_location(f"{__package__}._libtorch", build.module)
    if spec is None or spec.loader is None:
        raise ImportError(f"{build.module} is not an extension module this Python loads")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    sys.modules[spec.name] = module
    return module


def _load() -> ModuleType:
    import torch  # must come first: _libtorch links against the libraries this import loads

    installed = str(torch.__version__)
    chosen = choice(installed)
    if chosen.build is None:
        raise ImportError(chosen.problem)
    build = chosen.build
    if build.variant:
        torch_abi = int(bool(torch._C._GLIBCXX_USE_CXX11_ABI))
        if build.cxx11_abi is not None and build.cxx11_abi != torch_abi:
            raise ImportError(
                f"this gpuguard wheel's compiled tensor checks for PyTorch {_minor(installed)[0]}."
                f"{_minor(installed)[1]} were built for the C++ ABI of PyPI's torch wheels "
                f"(_GLIBCXX_USE_CXX11_ABI={build.cxx11_abi}), but the torch installed here ({installed}) uses "
                f"_GLIBCXX_USE_CXX11_ABI={torch_abi}, so they cannot load. To have them: {WHEEL_FIX}")
        try:
            return _import_variant(build)
        except ImportError as exc:
            raise ImportError(
                f"this gpuguard wheel's compiled tensor checks for PyTorch {build.torch_version} failed to load "
                f"under PyTorch {installed} ({exc}). To have them: {WHEEL_FIX}") from exc
    try:
        return importlib.import_module("._libtorch", __package__)
    except ImportError as exc:
        if isinstance(exc, ModuleNotFoundError):  # removed from the package
            raise ImportError(
                f"gpuguard._libtorch (its compiled tensor checks) is missing or unloadable: {exc}. Build it with: "
                f"{REINSTALL}"
            ) from exc
        raise ImportError(
            f"gpuguard._libtorch (its compiled tensor checks) failed to load ({exc}). It was built for PyTorch "
            f"{build.torch_version}; PyTorch {installed} is installed. Rebuild: {REINSTALL}"
        ) from exc


def libtorch() -> ModuleType:
    """gpuguard._libtorch, loaded on the first call; raises ImportError saying why and what to do when it cannot
    load (the same error on every call: a failed load is not retried)."""
    global _module, _failure
    if _module is not None:
        return _module
    if _failure is None:
        try:
            _module = _load()
            return _module
        except ImportError as exc:
            _failure = str(exc)
    raise ImportError(_failure)
