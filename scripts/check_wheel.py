"""Checks a repaired gpuguard wheel, or one compiled module, against manylinux_2_28 before it is kept: no module
needs a glibc, libstdc++ or C++ runtime newer than the policy's maxima (GLIBC 2.28, GLIBCXX 3.4.24, CXXABI 1.3.11),
each exports its PyInit_ alone (cmake/check_module_exports.py), _core loads no libstdc++ at all, and none links the
CUDA driver, NCCL or NVML (dlopen'ed at run time). Prints one line per module with what it needs. Run by
scripts/build_wheels.sh:
  python scripts/check_wheel.py WHEEL...               every .so in each wheel; exit 1 naming each violation
  python scripts/check_wheel.py --module PATH NAME     one module before it is packed (a _libtorch variant): exit 1
                                                       when it is over the maxima, so the build leaves it out
"""

from __future__ import annotations

import re
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "cmake"))
from check_module_exports import corrupt_entries, exported_symbols  # noqa: E402 - cmake/ is not a package

#: manylinux_2_28's maxima (auditwheel's src/auditwheel/policy/manylinux-policy.json)
MAXIMA = {"GLIBC": (2, 28), "GLIBCXX": (3, 4, 24), "CXXABI": (1, 3, 11)}
#: libraries gpuguard loads with dlopen, never through DT_NEEDED: the user's driver and the job's NCCL
DLOPENED = ("libcuda.so", "libnccl.so", "libnvidia-ml.so")


def needed_versions(path: Path) -> dict[str, tuple[int, ...]]:
    """The newest version of each of GLIBC, GLIBCXX and CXXABI that the module's symbols ask for."""
    out = subprocess.run(["objdump", "-T", str(path)], check=True, capture_output=True, text=True).stdout
    newest: dict[str, tuple[int, ...]] = {}
    for name, version in re.findall(r"\b(GLIBC|GLIBCXX|CXXABI)_([0-9.]+)\b", out):
        parsed = tuple(int(part) for part in version.split("."))
        newest[name] = max(newest.get(name, parsed), parsed)
    return newest


def needed_libraries(path: Path) -> list[str]:
    out = subprocess.run(["readelf", "-d", str(path)], check=True, capture_output=True, text=True).stdout
    return re.findall(r"\(NEEDED\)\s+Shared library: \[([^\]]+)\]", out)


def problems(path: Path, module: str) -> tuple[str, list[str]]:
    """(a line saying what the module needs, what breaks the policy or gpuguard's rules)"""
    found = []
    newest = needed_versions(path)
    for name, maximum in MAXIMA.items():
        if name in newest and newest[name] > maximum:
            found.append(f"needs {name}_{'.'.join(map(str, newest[name]))}, newer than manylinux_2_28's "
                         f"{name}_{'.'.join(map(str, maximum))}")
    libraries = needed_libraries(path)
    found += [f"links {lib}, which gpuguard must dlopen at run time" for lib in libraries if lib.startswith(DLOPENED)]
    if module.endswith("._core"):
        found += [f"links {lib}: _core carries its C++ runtime (zig's libc++, static)"
                  for lib in libraries if lib.startswith(("libstdc++", "libc++"))]
    found += [f"has a corrupt dynamic symbol: {entry}" for entry in corrupt_entries("readelf", str(path))]
    allowed = "PyInit_" + module.rsplit(".", 1)[-1]
    exported = [name for name, _ in exported_symbols("readelf", str(path))]
    if allowed not in exported:
        found.append(f"does not export {allowed}")
    extra = [name for name in exported if name != allowed]
    if extra:
        found.append(f"exports {len(extra)} symbol(s) besides {allowed}: {', '.join(extra[:8])}")
    summary = (", ".join(f"{name} {'.'.join(map(str, newest[name]))}" for name in MAXIMA if name in newest)
               + f"; needs {' '.join(libraries)}")
    return summary, found


def module_name(member: str) -> str:
    """gpuguard._core for gpuguard/_core.cpython-311-x86_64-linux-gnu.so, gpuguard._libtorch for a variant."""
    return "gpuguard." + Path(member).name.split(".", 1)[0]


def main(argv: list[str]) -> int:
    if len(argv) == 3 and argv[0] == "--module":
        summary, found = problems(Path(argv[1]), argv[2])
        print(f"check_wheel: {argv[1]}: {summary}")
        for problem in found:
            print(f"check_wheel: {argv[1]} {problem}", file=sys.stderr)
        return 1 if found else 0
    if not argv or argv[0].startswith("-"):
        print(__doc__, file=sys.stderr)
        return 2
    failed = False
    for wheel in argv:
        with tempfile.TemporaryDirectory() as unpacked, zipfile.ZipFile(wheel) as archive:
            members = [m for m in archive.namelist() if m.endswith(".so")]
            archive.extractall(unpacked, members)
            if not any(Path(m).name.startswith("_core.") for m in members):
                print(f"check_wheel: {wheel} holds no gpuguard._core", file=sys.stderr)
                failed = True
            for member in sorted(members):
                summary, found = problems(Path(unpacked) / member, module_name(member))
                print(f"check_wheel: {Path(wheel).name}: {member}: {summary}")
                for problem in found:
                    print(f"check_wheel: {Path(wheel).name}: {member} {problem}", file=sys.stderr)
                failed = failed or bool(found)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
