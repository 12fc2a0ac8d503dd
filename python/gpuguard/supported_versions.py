"""The Python, PyTorch and Ray versions gpuguard supports (CI tests the corners), and the message for one outside.

One place for the range: the build reads it (cmake/torch_build_flags.py refuses a torch below it), the package
checks Python at import, Ray at its first Ray call, and README.md, docs/versions.md and pyproject.toml state it
(tests/python/test_supported_versions.py holds them to this file). Standard library only, no import of torch or
Ray: the build runs this file on its own.
"""

from __future__ import annotations

import sys
from typing import Optional

# (oldest, newest tested) as (major, minor). The floors and why:
#   Python 3.10: what torch 2.6 and the frameworks built on it (verl, EasyR1) run; 3.9 is past its end of life.
#   torch 2.6: the oldest torch the frameworks gpuguard protects still pin (verl, EasyR1: 2.6-2.7 through 2025);
#     torch.load before 2.6 runs arbitrary code even with weights_only=True (CVE-2025-32434); FSDP2's
#     fully_shard is public from 2.6. Its wheels use the old C++ ABI, which the build follows.
#   Ray 2.43: the Ray of the torch 2.6 generation (February 2025); every Ray from 2.39 gives actors in
#     placement-group bundles the GPU ids of their bundle (older ones can seat two ranks on one GPU with
#     fractional GPUs), and runtime_env's worker_process_setup_hook, which `gpuguard.ray.setup` plugs into, is
#     there. Ray publishes Python 3.13 wheels from 2.45 on.
PYTHON = ((3, 10), (3, 13))
TORCH = ((2, 6), (2, 15))
RAY = ((2, 43), (2, 60))
RAY_FOR_PYTHON_3_13 = (2, 45)


def _text(version: tuple[int, int]) -> str:
    return f"{version[0]}.{version[1]}"


def release(version: str) -> tuple[int, int]:
    """(major, minor) of a version string such as '2.6.0+cu124' or '2.43.0rc1'."""
    parts = version.split("+", 1)[0].split(".")
    digits = [int("".join(ch for ch in p if ch.isdigit()) or 0) for p in parts[:2]]
    return (digits + [0, 0])[0], (digits + [0, 0])[1]


def stated(name: str) -> str:
    """'PyTorch 2.6 to 2.15' and the like: the range as README.md, docs/versions.md and the messages state it."""
    oldest, newest = {"Python": PYTHON, "PyTorch": TORCH, "Ray": RAY}[name]
    return f"{name} {_text(oldest)} to {_text(newest)}"


def python_problem(version: tuple[int, int] = (sys.version_info[0], sys.version_info[1])) -> Optional[str]:
    if version < PYTHON[0]:
        return (f"gpuguard needs Python {_text(PYTHON[0])} or newer ({stated('Python')} are tested); this is Python "
                f"{_text(version)}. Use a newer interpreter (for example a venv made with python{_text(PYTHON[1])}).")
    return None


def torch_problem(version: str) -> Optional[str]:
    """Why a torch of ``version`` cannot be built against, or None. Newer than tested is allowed (see newer())."""
    if release(version) < TORCH[0]:
        return (f"gpuguard supports {stated('PyTorch')}; this Python has torch {version}. Upgrade it "
                f"(pip install 'torch>={_text(TORCH[0])}'), then build gpuguard again against it.")
    return None


def ray_problem(version: str) -> Optional[str]:
    """Why Ray ``version`` cannot serve gpuguard's Ray integration, or None."""
    if release(version) < RAY[0]:
        return (f"gpuguard's Ray integration supports {stated('Ray')}; this Python has Ray {version}. Upgrade it: "
                f"pip install 'ray[default]>={_text(RAY[0])}'.")
    return None


def newer(name: str, version: str) -> Optional[str]:
    """A warning for a release newer than the newest tested, or None."""
    newest = {"Python": PYTHON, "PyTorch": TORCH, "Ray": RAY}[name][1]
    if release(version) > newest:
        return (f"{name} {version} is newer than gpuguard has been tested with ({stated(name)}); it should work, "
                f"and gpuguard doctor reports what it can check.")
    return None
