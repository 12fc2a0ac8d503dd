"""Writes the corpus of pasted shapes (tests/python/paste_corpus.py) as seeds for the log reader's fuzz target.

The shapes come from the recognisers' examples and the transformations alone, no compiled code: where gpuguard's
core module is not built (scripts/fuzz.sh builds only the C++ targets), a stand-in lets explain's modules load.

  PYTHONPATH=python:tests/python python3 tests/fuzz/write_paste_seeds.py DIR
"""

from __future__ import annotations

import sys
import types
from pathlib import Path

try:
    import gpuguard._core  # noqa: F401
except ImportError:  # explain imports its reader at load; writing the shapes never runs it
    stand_in = types.ModuleType("gpuguard._core")
    stand_in.Scanner = None  # type: ignore[attr-defined]
    sys.modules["gpuguard._core"] = stand_in

import paste_corpus  # noqa: E402

if __name__ == "__main__":
    if len(sys.argv) != 2:
        raise SystemExit("usage: write_paste_seeds.py DIR")
    print(f"write_paste_seeds.py: {paste_corpus.write(Path(sys.argv[1]))} pasted shapes written to {sys.argv[1]}")
