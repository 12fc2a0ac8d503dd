"""gpuguard.watch(): a collective watchdog per rank that names the stuck rank, its collective and its stack, live."""

from .watcher import STALL_EXIT_CODE, Watch, running, watch, watch_from_environment

__all__ = ["STALL_EXIT_CODE", "Watch", "running", "watch", "watch_from_environment"]
