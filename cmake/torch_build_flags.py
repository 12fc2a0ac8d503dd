"""What a build against the installed PyTorch must use, read from that torch: its folders, its C++ ABI and the
pybind11 flags its own extensions get, its version. Refuses a torch outside gpuguard's supported range.

CMake (cmake/TorchFromPython.cmake) and scripts/fuzz.sh run it with the interpreter they build for:
  python cmake/torch_build_flags.py --cmake        KEY=VALUE lines (lists joined with '|')
  python cmake/torch_build_flags.py --abi-flag     -D_GLIBCXX_USE_CXX11_ABI=<0|1>, for parts that do not link torch
Exit status 2 with the reason on stderr when torch cannot be imported or is too old.
"""

from __future__ import annotations

import runpy
import sys
from pathlib import Path

SUPPORT = runpy.run_path(str(Path(__file__).resolve().parents[1] / "python" / "gpuguard" / "supported_versions.py"))


def main(argv: list[str]) -> int:
    if len(argv) != 1 or argv[0] not in ("--cmake", "--abi-flag"):
        print(__doc__, file=sys.stderr)
        return 2
    try:
        import torch
        from torch.utils import cpp_extension
    except Exception as exc:  # noqa: BLE001 - any failure to import torch is reported the same way
        print(f"gpuguard builds against the installed PyTorch, but '{sys.executable} -c \"import torch\"' failed: "
              f"{type(exc).__name__}: {exc}. Install torch first (pip install 'torch>="
              f"{SUPPORT['TORCH'][0][0]}.{SUPPORT['TORCH'][0][1]}'), then build with: pip install "
              f"--no-build-isolation .", file=sys.stderr)
        return 2
    version = str(torch.__version__)
    problem = SUPPORT["torch_problem"](version)
    if problem:
        print(problem, file=sys.stderr)
        return 2
    abi = int(bool(torch._C._GLIBCXX_USE_CXX11_ABI))
    if argv[0] == "--abi-flag":
        print(f"-D_GLIBCXX_USE_CXX11_ABI={abi}")
        return 0
    # torch <= 2.9 hands its extensions the pybind11 ABI it was built with (cpp_extension's
    # _get_pybind11_abi_build_flags), so that their pybind11 shares torch's registry; later torch leaves it to
    # pybind11 itself (the attributes are gone).
    pybind11 = [f'PYBIND11_{name}="{getattr(torch._C, f"_PYBIND11_{name}")}"'
                for name in ("COMPILER_TYPE", "STDLIB", "BUILD_ABI")
                if getattr(torch._C, f"_PYBIND11_{name}", None) is not None]
    facts = {
        "TORCH_INCLUDE_DIRS": "|".join(cpp_extension.include_paths()),
        "TORCH_LIBRARY_DIRS": "|".join(cpp_extension.library_paths()),
        "TORCH_CXX11_ABI": str(abi),
        "TORCH_VERSION": version,
        "TORCH_PYBIND11_DEFINITIONS": "|".join(pybind11),
        "TORCH_NEWER_THAN_TESTED": SUPPORT["newer"]("PyTorch", version) or "",
    }
    for key, value in facts.items():
        print(f"{key}={value}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
