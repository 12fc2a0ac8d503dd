"""Real-launcher tests on a SLURM cluster brought up on this machine (a package, so that its conftest does not
shadow tests/python/conftest.py when both folders are collected in one run)."""
