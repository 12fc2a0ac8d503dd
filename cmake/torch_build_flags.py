"""What a build against the installed PyTorch must use, read from that torch: its folders, its C++ ABI and the
pybind11 flags its own extensions get, its version. Refuses a torch outside gpuguard's supported range.

CMake (cmake/TorchFromPython.cmake) and scripts/fuzz.sh run it with the interpreter they build for:
  python cmake/torch_build_flags.py --cmake        KEY=VALUE lines (lists joined with '|')
  python cmake/torch_build_flags.py --abi-flag     -D_GLIBCXX_USE_CXX11_ABI=<0|1>, for parts that do not link torch
  python cmake/torch_build_flags.py --cmake --torch-dir DIR
                                                   the same facts read from the files of a torch package folder that
                                                   is not installed (scripts/build_wheels.sh unpacks one torch wheel
                                                   per minor and builds a _libtorch for every Python against it)
Exit status 2 with the reason on stderr when torch cannot be imported or is too old.
"""

from __future__ import annotations

import ast
import re
import runpy
import sys
from pathlib import Path

SUPPORT = runpy.run_path(str(Path(__file__).resolve().parents[1] / "python" / "gpuguard" / "supported_versions.py"))


def facts_from_files(torch_dir: Path) -> dict[str, str]:
    """What --cmake prints, read from an unpacked torch package (its version.py, headers, libraries and CMake
    config) without importing it: a CUDA build of torch imports only beside its CUDA libraries, which a build for
    each torch minor does not need."""
    tree = ast.parse((torch_dir / "version.py").read_text())
    version = next(ast.literal_eval(node.value) for node in tree.body if isinstance(node, ast.Assign)
                   and any(isinstance(t, ast.Name) and t.id == "__version__" for t in node.targets))
    # torch's CMake config names the old ABI where the wheel uses it (2.6); later wheels leave the default, the new one
    config = (torch_dir / "share" / "cmake" / "Torch" / "TorchConfig.cmake").read_text()
    abi_flag = re.search(r"-D_GLIBCXX_USE_CXX11_ABI=([01])", config)
    # torch <= 2.9's pybind11 flags, as torch._C._PYBIND11_* would give them: the three parts of the pybind11
    # internals id compiled into libtorch_python ("__pybind11_internals_v4_gcc_libstdcpp_cxxabi1011__")
    pybind11 = []
    major, minor = (int(part) for part in version.split("+")[0].split(".")[:2])
    if (major, minor) <= (2, 9):
        binary = (torch_dir / "lib" / "libtorch_python.so").read_bytes()
        found = re.search(rb"__pybind11_internals_v\d+(_gcc|_clang|_icc)(_libstdcpp|_libcpp)(_cxxabi\d+)__", binary)
        if found:
            pybind11 = [f'PYBIND11_{name}="{value.decode()}"'
                        for name, value in zip(("COMPILER_TYPE", "STDLIB", "BUILD_ABI"), found.groups())]
        # 2.9 bundles pybind11 3, whose id ("__pybind11_internals_v11_system_libstdcpp_gxx_abi_1xxx_...") no such
        # flag changes: none, as for 2.10 on
        elif not re.search(rb"__pybind11_internals_v\d+_system_", binary):
            raise SystemExit(f"cmake/torch_build_flags.py: no pybind11 internals id in {torch_dir}/lib/"
                             f"libtorch_python.so, which torch {version} should carry")
    # as cpp_extension.include_paths() lists them (include/TH and include/THC up to 2.6)
    include = [torch_dir / "include", torch_dir / "include" / "torch" / "csrc" / "api" / "include",
               torch_dir / "include" / "TH", torch_dir / "include" / "THC"]
    return {
        "TORCH_INCLUDE_DIRS": "|".join(str(path) for path in include if path.is_dir()),
        "TORCH_LIBRARY_DIRS": str(torch_dir / "lib"),
        "TORCH_CXX11_ABI": abi_flag.group(1) if abi_flag else "1",
        "TORCH_VERSION": version,
        "TORCH_PYBIND11_DEFINITIONS": "|".join(pybind11),
        "TORCH_NEWER_THAN_TESTED": SUPPORT["newer"]("PyTorch", version) or "",
    }


def main(argv: list[str]) -> int:
    if len(argv) == 3 and argv[0] == "--cmake" and argv[1] == "--torch-dir":
        facts = facts_from_files(Path(argv[2]))
        problem = SUPPORT["torch_problem"](facts["TORCH_VERSION"])
        if problem:
            print(problem, file=sys.stderr)
            return 2
        for key, value in facts.items():
            print(f"{key}={value}")
        return 0
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
