"""Where tests/python/gpu/test_gpu_readme.py still finds free_port and run_logged: they live in tests/gg_testing
(ports, procs, ray_head) now; remove this file once that import reads ``from gg_testing...``."""

from gg_testing.ports import free_port  # noqa: F401
from gg_testing.procs import run_logged  # noqa: F401
from gg_testing.ray_head import RayHead  # noqa: F401
