"""Loads one Python extension module just built, as `import` would, so that a module which links but cannot load
(an undefined symbol from a part built with another C++ ABI, or against another torch) fails the build that made
it, and is removed, rather than failing at the user's first import. Run by CMake after linking each module:
  python cmake/check_module_loads.py PATH gpuguard._libtorch [--after torch]
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import sys


def main(argv: list[str]) -> int:
    path, name = argv[0], argv[1]
    after = argv[3] if len(argv) == 4 and argv[2] == "--after" else None
    try:
        if after:
            importlib.import_module(after)  # the libraries the module links against, loaded as at run time
        spec = importlib.util.spec_from_file_location(name, path)
        if spec is None or spec.loader is None:
            raise ImportError(f"not an extension module Python {sys.version_info[0]}.{sys.version_info[1]} loads")
        spec.loader.exec_module(importlib.util.module_from_spec(spec))
    except Exception as exc:  # noqa: BLE001 - any failure to load is the build's failure
        os.remove(path)
        print(f"gpuguard: the module just built, {path}, cannot be loaded by {sys.executable}"
              f"{' after ' + after if after else ''}: {type(exc).__name__}: {exc}\n"
              f"It was removed. A part of the build was compiled for another C++ ABI or another torch than the one "
              f"this interpreter loads; configure a fresh build folder with this interpreter "
              f"(-DPython_EXECUTABLE={sys.executable}).", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
