"""Which NCCL gpuguard loads: the one the job loads, found from torch's files without importing torch.

The first library named libnccl.so.2 in a process is the one every later user of that name binds to: the dynamic
loader matches a DT_NEEDED entry against the sonames already loaded before it searches any folder, RTLD_LOCAL or
not. So where gpuguard loads NCCL first (bind() before ``import torch``, ``gpuguard check``, ``gpuguard doctor``),
loading another copy than torch's would make gpuguard's NCCL probes and unique-id exchange speak for a library the
job never meant to use, and could hand torch that library instead of its own.

gpuguard takes the first of these (the C++ loader, csrc/gpuguard/nccl.cc, does 1, 2 and 5; this module finds 3
and 4 and hands the file over with ``_core.nccl_prefer`` before the first NCCL call):

1. ``$GPUGUARD_LIBNCCL``, alone: an override, for tests and for the user who knows better.
2. A libnccl.so.2 already loaded in this process (torch imported first): the copy the job uses.
3. torch's NCCL: the libnccl.so.2 that the installed torch's ``lib/libtorch_cuda.so`` resolves, read from its
   DT_NEEDED and DT_RPATH/DT_RUNPATH as the loader reads them. For torch from PyPI that is the nvidia-nccl wheel
   beside it (``site-packages/nvidia/nccl/lib``, through torch's DT_RPATH ``$ORIGIN/../../nvidia/nccl/lib``).
   Where libtorch_cuda.so cannot be read, the nvidia-nccl wheel's library beside torch.
4. Without torch, or with a CPU-only one: the nvidia-nccl wheel installed for this interpreter (the NCCL that the
   Python libraries here load, torch's CUDA builds included once installed).
5. ``libnccl.so.2``, then ``libnccl.so``, by the loader's own search (LD_LIBRARY_PATH, /etc/ld.so.cache, /lib).
"""

from __future__ import annotations

import importlib.metadata
import os
import threading
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Optional

from .elf_dynamic import read_dynamic_section
from .installed_torch import NCCL_WHEELS, InstalledTorch, installed_torch, nccl_wheel

if TYPE_CHECKING:
    from .._core import NcclProbeOutcome, NcclStatus


@dataclass(frozen=True)
class TorchNccl:
    """The NCCL the installed torch loads, as its files say."""

    library: Optional[str]  # the file; None: linked into torch, or left to the loader's search (see `how`)
    how: str                # how it was found: "libtorch_cuda.so's DT_RPATH entry $ORIGIN/../../nvidia/nccl/lib"
    static: bool = False    # linked into libtorch_cuda.so: no file any other library can load

    def as_dict(self) -> dict[str, Any]:
        return {"library": self.library, "how": self.how, "static": self.static}


def _torch_library(torch: InstalledTorch) -> str:
    return os.path.join(torch.location, "lib", "libtorch_cuda.so")


def torch_nccl(torch: Optional[InstalledTorch] = None) -> Optional[TorchNccl]:
    """torch's NCCL (rule 3 of the module's docstring); None without torch or for a CPU-only build."""
    torch = torch or installed_torch()
    if torch is None or torch.cuda is None:
        return None
    path = _torch_library(torch)
    dynamic = read_dynamic_section(path)
    if dynamic is not None:
        needed = next((n for n in dynamic.needed if n.startswith("libnccl.so")), None)
        if needed is None:
            return TorchNccl(None, f"linked into {path} (it needs no libnccl.so)", static=True)
        found = dynamic.resolve(needed, os.environ.get("LD_LIBRARY_PATH"))
        if found is not None:
            file, entry = found
            how = (f"libtorch_cuda.so's {entry}" if entry.startswith("DT_")
                   else f"{entry}, searched for libtorch_cuda.so's {needed}")
            return TorchNccl(os.path.normpath(file), how)
        return TorchNccl(None, f"the loader's search for {needed}: no folder libtorch_cuda.so names holds it")
    beside = os.path.join(os.path.dirname(torch.location), "nvidia", "nccl", "lib", "libnccl.so.2")
    if os.path.isfile(beside):
        return TorchNccl(beside, f"the nvidia-nccl wheel beside torch ({path} could not be read)")
    return TorchNccl(None, f"unknown: {path} could not be read and no nvidia-nccl wheel is beside torch")


def job_nccl() -> Optional[tuple[str, str]]:
    """The file gpuguard prefers (rules 3 and 4), with the rule that found it for reports; None: rule 5."""
    torch = torch_nccl()
    if torch is not None and torch.library is not None:
        return torch.library, f"torch's NCCL ({torch.how})"
    if torch is None:
        wheel = nccl_wheel()
        if wheel is not None and wheel.library is not None:
            installed = installed_torch()
            why = "torch is not installed" if installed is None else "torch is a CPU-only build"
            return wheel.library, f"the {wheel.distribution} wheel ({why})"
    return None


_prefer_lock = threading.Lock()
_preferred = False


def prefer_job_nccl() -> None:
    """Hands job_nccl() to the C++ loader, once per process, before gpuguard's first NCCL call. Nothing to do under
    $GPUGUARD_LIBNCCL, which wins anyway."""
    global _preferred
    with _prefer_lock:
        if _preferred:
            return
        _preferred = True
        if os.environ.get("GPUGUARD_LIBNCCL"):
            return
        choice = job_nccl()
        if choice is not None:
            from .._core import nccl_prefer

            nccl_prefer(*choice)


# gpuguard's NCCL calls, each after prefer_job_nccl(): the only way the Python layer reaches _core's NCCL.

def nccl_status() -> NcclStatus:
    """_core.nccl_status() of the NCCL this module chose (NcclStatus)."""
    prefer_job_nccl()
    from .._core import nccl_status as status

    return status()


def nccl_unique_id() -> bytes:
    prefer_job_nccl()
    from .._core import nccl_unique_id as unique_id

    return unique_id()


def nccl_probe(nranks: int, rank: int, unique_id: bytes, device: int, timeout_s: float,
               all_reduce: bool = False) -> NcclProbeOutcome:
    prefer_job_nccl()
    from .._core import nccl_probe as probe

    return probe(nranks, rank, unique_id, device, timeout_s, all_reduce)


def wheel_version_of(library: Optional[str]) -> Optional[tuple[str, str]]:
    """(distribution, version) of the nvidia-nccl wheel that installed `library`; None for any other file."""
    if not library:
        return None
    target = os.path.realpath(library)
    for name in NCCL_WHEELS:
        try:
            dist = importlib.metadata.distribution(name)
        except importlib.metadata.PackageNotFoundError:
            continue
        for file in dist.files or []:
            if file.name.startswith("libnccl.so") and os.path.realpath(str(dist.locate_file(file))) == target:
                return name, dist.version
    return None
