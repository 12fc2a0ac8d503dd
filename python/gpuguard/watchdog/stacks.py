"""The watchdog's GIL-free Python stacks on Pythons that do not export the dumper it calls (3.10, 3.13): faulthandler
runs the same dumper from its handler for a user signal, which the watchdog's thread sends to itself.

Python 3.11 and 3.12 export ``_Py_DumpTracebackThreads``, which the watchdog calls directly; 3.10 and 3.13 keep it
local to libpython. ``faulthandler.register(signum, file, all_threads=True)`` installs a C handler that calls it
(for every thread of the interpreter, without the GIL), so it works while the main thread is blocked in C holding
the GIL, as the direct call does. The signal is a real-time one nothing else claims; a program that already
handles it keeps it, and the reports then say why they have no stack.
"""

from __future__ import annotations

import faulthandler
import signal
import tempfile
from typing import IO, Optional

from .._core import dump_stacks_by_signal, exports_stack_dumper

_file: Optional[IO[bytes]] = None  # faulthandler writes here; kept open for the life of the process


def stack_signal() -> int:
    # near the top of the real-time range: glibc takes the lowest ones for its threads, and libraries that use one
    # (profilers, timers) take them from SIGRTMIN up
    return int(signal.SIGRTMAX) - 2


def arm() -> Optional[str]:
    """Makes the watchdog's stacks work on this Python; returns why they cannot, or None when they can."""
    global _file
    if exports_stack_dumper() or _file is not None:
        return None
    signum = stack_signal()
    current = signal.getsignal(signum)
    if current != signal.SIG_DFL:  # a Python handler, SIG_IGN, or None: one installed from C before Python started
        return (f"signal {signum} (SIGRTMAX-2), through which gpuguard reads stacks on this Python, is handled by "
                f"{current!r}")
    _file = tempfile.TemporaryFile()
    faulthandler.register(signum, file=_file, all_threads=True, chain=False)
    dump_stacks_by_signal(signum, _file.fileno())
    return None
