"""Auto mode's uncaught-exception hooks: gpuguard's report on a device mismatch, and every report printed whole.

The ranks of a job share one stderr (torchrun, srun and mpirun pass their workers' output through as it
comes), and Python's own printer writes a traceback in many small pieces, so two ranks stopping at once cut
into each other's report mid-line. A gpuguard error, or an exception carrying gpuguard's report, is therefore
formatted first and written with one ``write`` (one flush), which a pipe keeps whole up to PIPE_BUF (4 KiB
on Linux) and which torch's own ``[rankN]:`` excepthook (installed by init_process_group, around this one)
still captures and prefixes. Every other exception goes to the hook that was there before, unchanged.
"""

from __future__ import annotations

import sys
import threading
from typing import Any

from ..errors import NOTES_PRINTED_BY_PYTHON, GpuGuardError, format_exception
from . import enrich as _enrich


def _ours(exc: BaseException) -> bool:
    notes = getattr(exc, "__notes__", None) or []
    return isinstance(exc, GpuGuardError) or any(
        isinstance(n, str) and n.startswith(_enrich.NOTE_PREFIX) for n in notes)


def print_whole(exc_type: type, exc: BaseException, tb: Any, stream: Any = None) -> None:
    """The traceback as Python prints it, in one write to ``stream`` (sys.stderr when None)."""
    stream = sys.stderr if stream is None else stream
    if stream is None:  # pythonw, or stderr closed: nowhere to print, as with Python's own hook
        return
    stream.write("".join(format_exception(exc_type, exc, tb)))  # with the notes, on Python 3.10 too
    stream.flush()


def _notes_after(exc: BaseException) -> None:
    """Python 3.10 only: the notes of an exception that another hook printed (which leaves them out), after it.
    gpuguard's own errors carry their notes in their message there."""
    notes = getattr(exc, "__notes__", None)
    if NOTES_PRINTED_BY_PYTHON or isinstance(exc, GpuGuardError) or not isinstance(notes, list) or not notes \
            or sys.stderr is None:
        return
    sys.stderr.write("".join(f"{n}\n" for n in notes))
    sys.stderr.flush()


def excepthook(original: Any) -> Any:
    def hook(exc_type: type, exc: BaseException, tb: Any) -> Any:
        if exc is not None and _enrich.is_device_mismatch(exc) and _enrich.first_time():
            _enrich.enrich(exc)
        if exc is not None and original is sys.__excepthook__ and _ours(exc):
            return print_whole(exc_type, exc, tb)
        result = original(exc_type, exc, tb)
        if exc is not None and _ours(exc):
            _notes_after(exc)
        return result
    hook.__wrapped__ = original  # type: ignore[attr-defined]
    return hook


def thread_excepthook(original: Any) -> Any:
    def hook(args: Any) -> Any:
        exc = args.exc_value
        if exc is not None and _enrich.is_device_mismatch(exc) and _enrich.first_time():
            _enrich.enrich(exc)
        result = original(args)
        if exc is not None and _ours(exc):
            _notes_after(exc)
        return result
    hook.__wrapped__ = original  # type: ignore[attr-defined]
    return hook


def install(patches: Any) -> None:
    patches.replace(sys, "excepthook", excepthook)
    patches.replace(threading, "excepthook", thread_excepthook)
