"""gpuguard's version, in one place (pyproject.toml carries the same number for the package metadata)."""

__version__ = "0.1.0"
