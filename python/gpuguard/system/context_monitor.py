"""CUDA contexts a rank makes on another GPU after it was bound (a late torch.load, a set_device to the wrong
index): reported once per GPU, naming the rank and, when a watched call made it, the Python stack that did.

The zero-code mode and gpuguard.watch() start one monitor per process once the rank's GPU is known. It asks the
driver with cuDevicePrimaryCtxGetState (never a context of its own): after each watched call (``after_call``:
torch.load, torch.cuda.set_device, synchronize, mem_get_info, empty_cache, in the zero-code mode), where the stack
is at hand, and every ``interval`` seconds from a daemon thread for everything else, where it is not.
"""

from __future__ import annotations

import logging
import os
import socket
import sys
import threading
import time
import traceback
from types import FrameType
from typing import Optional

from .contexts import active_contexts
from .processes import TYPICAL_CONTEXT_COST, format_bytes, process_memory, usage_of

logger = logging.getLogger("gpuguard")

#: Seconds between the thread's checks (GPUGUARD_CONTEXT_POLL_S overrides; each check is one driver call per GPU).
DEFAULT_INTERVAL_S = 5.0
#: Frames of the stack a report shows (the innermost, the job's own).
STACK_FRAMES = 12


class ContextMonitor:
    """Watches this process's primary contexts for ones on GPUs other than ``own_index``."""

    def __init__(self, rank: int, own_index: int, *, interval: float = DEFAULT_INTERVAL_S) -> None:
        self.rank = rank
        self.own_index = own_index
        self.interval = interval
        self._lock = threading.Lock()
        # contexts there already (the bind-time check reported those) are not reported again
        self._known = set(active_contexts())
        self._last_poll = time.time()
        self.reports: list[str] = []
        self._stop = threading.Event()
        self._thread: Optional[threading.Thread] = None

    def start_thread(self) -> None:
        if self._thread is None and self.interval > 0:
            self._thread = threading.Thread(target=self._loop, name="gpuguard-context-monitor", daemon=True)
            self._thread.start()

    def stop(self) -> None:
        self._stop.set()

    def _loop(self) -> None:
        while not self._stop.wait(self.interval):
            self.check(None)

    def check(self, call: Optional[str], frame: Optional[FrameType] = None) -> Optional[str]:
        """Reports (once per GPU) a context that appeared since the last check; ``call`` names the watched call
        just made, called from ``frame`` (its stack is read only for a report). Returns the report, or None."""
        with self._lock:
            now = time.time()
            since = self._last_poll
            self._last_poll = now
            new = [i for i in active_contexts() if i not in self._known]
            if not new:
                return None
            self._known.update(new)
            strays = [i for i in new if i != self.own_index]
            if not strays:
                return None
            stack = traceback.extract_stack(frame) if frame is not None else None
            report = self._report(strays, call, stack, since, now)
            self.reports.append(report)
        sys.stderr.write(report + "\n")  # one write: whole among the other ranks' output
        sys.stderr.flush()
        return report

    def _report(self, strays: list[int], call: Optional[str], stack: Optional[traceback.StackSummary],
                since: float, now: float) -> str:
        from .devices import devices

        found = devices()
        parts = []
        for index in strays:
            uuid = found[index].uuid if index < len(found) else "?"
            usage, _ = usage_of(uuid, found[index].pci_bus_id) if index < len(found) else (None, "")
            held = process_memory(usage, os.getpid())
            cost = (f"{format_bytes(held)} there now (NVML)" if held is not None
                    else f"a context holds {TYPICAL_CONTEXT_COST}")
            parts.append(f"cuda:{index} ({uuid}): {cost}")
        own = found[self.own_index].uuid if self.own_index < len(found) else "?"
        head = (f"gpuguard: rank {self.rank} (host {socket.gethostname()}, pid {os.getpid()}), bound to "
                f"cuda:{self.own_index} ({own}), made a CUDA context on another GPU after it was bound: "
                + "; ".join(parts) + ". It stays until the process exits.")
        if call is not None and stack is not None:
            frames = "".join(traceback.format_list(stack[-STACK_FRAMES:])).rstrip()
            where = f"\nMade by {call}, called from:\n{frames}"
        else:
            window = f"{time.strftime('%H:%M:%S', time.localtime(since))}-{time.strftime('%H:%M:%S', time.localtime(now))}"
            where = (f"\nMade between {window} by a call gpuguard does not watch (the zero-code mode names the stack "
                     f"of torch.load, torch.cuda.set_device, synchronize, mem_get_info and empty_cache).")
        fix = ("\nFix: give every CUDA call of this rank its own device (torch.load(..., map_location=f'cuda:"
               "{local_rank}') or 'cpu', tensors created with device=, no set_device to another index).")
        return head + where + fix


_monitor: Optional[ContextMonitor] = None
_monitor_lock = threading.Lock()


def interval_from_environment() -> float:
    raw = os.environ.get("GPUGUARD_CONTEXT_POLL_S", "")
    try:
        return float(raw) if raw else DEFAULT_INTERVAL_S
    except ValueError:
        logger.warning("gpuguard: GPUGUARD_CONTEXT_POLL_S=%r is not a number of seconds; using %g", raw,
                       DEFAULT_INTERVAL_S)
        return DEFAULT_INTERVAL_S


def start(rank: int, own_index: int) -> ContextMonitor:
    """The process's monitor for a rank bound to cuda:``own_index`` (replacing an earlier one), its thread running."""
    global _monitor
    with _monitor_lock:
        if _monitor is not None:
            _monitor.stop()
        _monitor = ContextMonitor(rank, own_index, interval=interval_from_environment())
        _monitor.start_thread()
        return _monitor


def stop() -> None:
    global _monitor
    with _monitor_lock:
        if _monitor is not None:
            _monitor.stop()
            _monitor = None


def after_call(call: str) -> None:
    """Called right after a watched call returns: a context it made is reported with the caller's stack."""
    monitor = _monitor
    if monitor is None:
        return
    try:
        monitor.check(call, sys._getframe(2))  # the caller of the wrapper that called this
    except Exception as exc:  # noqa: BLE001 - a report must never break the job's own call
        logger.debug("gpuguard: context check after %s failed: %s", call, exc)


def current() -> Optional[ContextMonitor]:
    return _monitor
