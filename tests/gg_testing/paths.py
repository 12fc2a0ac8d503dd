"""Where things are: the repository root, the fake topologies, and this package's folder (tests/)."""

from __future__ import annotations

from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]
ROOT = TESTS.parent
TOPOLOGIES = TESTS / "fakes" / "topologies"
SITE_HOOK = TESTS / "python" / "auto_site"  # sitecustomize that adds python/ as an installed site dir would
