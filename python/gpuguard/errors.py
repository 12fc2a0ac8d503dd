"""gpuguard's exceptions: one base, one class per failure, each with structured fields beside the message; notes
on an exception (``add_note``) and their printing, alike on every supported Python."""

from __future__ import annotations

import sys
import traceback
from typing import Any, Optional

# BaseException.add_note and the printing of __notes__ arrived in Python 3.11 (PEP 678). On 3.10 a note is kept in
# the same attribute, __notes__, and printed by format_exception() below and by the str() of gpuguard's own errors.
NOTES_PRINTED_BY_PYTHON = sys.version_info >= (3, 11)


class GpuGuardError(RuntimeError):
    """Base of every error gpuguard raises. ``details`` holds the structured facts behind the message; ``fix``
    is the message's fix sentence(s), word for word as the message ends with them ("" when it names none)."""

    def __init__(self, message: str, *, fix: str = "", **details: Any) -> None:
        super().__init__(message)
        self.fix: str = fix
        self.details: dict[str, Any] = details

    def without_fix(self) -> str:
        """The message up to its fix sentence(s): what is wrong, without how to fix it."""
        message = RuntimeError.__str__(self)
        if self.fix and message.endswith(self.fix):
            return message[: len(message) - len(self.fix)].rstrip()
        return message

    def __getattr__(self, name: str) -> Any:
        details = self.__dict__.get("details", {})
        if name in details:
            return details[name]
        raise AttributeError(name)

    if not NOTES_PRINTED_BY_PYTHON:
        def __str__(self) -> str:
            # Python 3.10 prints no __notes__: the message carries them, so that every printer shows them (Ray's
            # remote tracebacks, logging, torchrun's error files), as 3.11 prints them under the message.
            notes = self.__dict__.get("__notes__")
            base = RuntimeError.__str__(self)
            if not isinstance(notes, list) or not notes:
                return base
            return "\n".join([base] + [n if isinstance(n, str) else repr(n) for n in notes])


class DuplicateDeviceError(GpuGuardError):
    """Two or more ranks of one group are on the same GPU."""


class DeviceMismatchError(GpuGuardError):
    """Tensors (parameters, buffers, inputs) that must share a device do not.

    Fields: ``groups`` (one dict per device: ``device``, ``parameters`` and ``buffers`` by qualified name,
    ``inputs`` as ``{name, shape, dtype}``, ``summary`` with runs compressed), ``devices`` (the devices, in
    the order of ``groups``), ``expected`` (the device asked for, or None), ``layer`` (guard(deep=True):
    the qualified name of the layer whose inputs disagree with its weights, else None), ``cause`` (the
    message's "Likely cause: ..." line) and ``fix`` (its last line, "Fix: ...").
    """


class RankMappingError(GpuGuardError):
    """This process's rank cannot be mapped to a GPU of this host."""


class StrayContextError(GpuGuardError):
    """This process holds a CUDA context on a GPU other than its own (something used that GPU before set_device).

    Fields: ``rank``, ``device`` and ``uuid`` (its own GPU), ``stray_devices`` (one dict per other GPU: ``index``,
    ``uuid``, ``bytes`` held there per NVML or None, ``used_by``: what the job uses it for), ``cost`` (what the
    message says a context costs).
    """


class ForeignProcessError(GpuGuardError):
    """bind(require_exclusive=True): the rank's GPU holds memory of processes that are not ranks of this job.

    Fields: ``rank``, ``uuid``, ``processes`` (one dict per process: ``pid``, ``bytes``, ``description``).
    """


class RendezvousTimeoutError(GpuGuardError):
    """Some ranks did not arrive at the placement check before the deadline."""


class CudaStateError(GpuGuardError):
    """CUDA was initialised in this process in a state that contradicts the environment."""


class LaunchEnvironmentError(GpuGuardError):
    """The launcher's environment variables are missing, malformed or contradict each other."""


class LaunchVariablesIncompleteError(LaunchEnvironmentError):
    """The launcher's variables agree but lack a field, typically the global rank: Lightning's own launcher,
    ddp_spawn and torch.multiprocessing.spawn name it only in their init_process_group(rank=, world_size=) call,
    which the zero-code check reads instead (auto/rank_at_init.py)."""


class RayPlacementError(GpuGuardError):
    """A Ray placement that cannot work: bad arguments, a cluster too small for it, or options that fight it."""


class RayRendezvousError(GpuGuardError):
    """The group's Ray rendezvous actor could not be created or reached, or answered badly."""


class GpuGuardWarning(UserWarning):
    """Something is off but the run can go on (bound to the CPU for want of a GPU, ...)."""


def add_note(exc: BaseException, note: str) -> None:
    """``exc.add_note(note)`` on every supported Python: on 3.10, which lacks it, the note goes into
    ``exc.__notes__`` as 3.11 would put it (a list, created on the first note), and format_exception() prints it."""
    if not isinstance(note, str):
        raise TypeError(f"a note must be a str, not {type(note).__name__}")
    if NOTES_PRINTED_BY_PYTHON:
        BaseException.add_note(exc, note)  # type: ignore[attr-defined]  # not exc.add_note: subclasses' __getattr__
        return
    notes = exc.__dict__.get("__notes__")
    if notes is None:
        notes = exc.__notes__ = []  # type: ignore[attr-defined]
    elif not isinstance(notes, list):
        raise TypeError("cannot add a note: __notes__ is not a list")
    notes.append(note)


def format_exception(exc_type: Optional[type], exc: Optional[BaseException], tb: Any) -> list[str]:
    """``traceback.format_exception`` with every exception's notes under its message, on 3.10 too (where Python
    prints none; gpuguard's own errors carry theirs in their message there, and are not printed twice)."""
    if NOTES_PRINTED_BY_PYTHON or exc is None:
        return traceback.format_exception(exc_type, exc, tb)
    described = traceback.TracebackException(type(exc), exc, tb, compact=True)
    chain: list[tuple[Optional[str], traceback.TracebackException, BaseException]] = []
    te: Optional[traceback.TracebackException] = described
    current: Optional[BaseException] = exc
    while te is not None and current is not None:  # TracebackException's own chain, walked beside the exceptions
        if te.__cause__ is not None:
            link, next_te, next_exc = _CAUSE, te.__cause__, current.__cause__
        elif te.__context__ is not None and not te.__suppress_context__:
            link, next_te, next_exc = _CONTEXT, te.__context__, current.__context__
        else:
            link, next_te, next_exc = None, None, None
        chain.append((link, te, current))  # link: printed before this exception, after the one it links to
        te, current = next_te, next_exc
    lines: list[str] = []
    for link, te_, current_ in reversed(chain):
        if link is not None:
            lines.append(link)
        if te_.stack:
            lines.append("Traceback (most recent call last):\n")
            lines.extend(te_.stack.format())
        if getattr(te_, "__notes__", None) is not None:  # a Python that prints notes itself (tests run this path)
            te_.__notes__ = None
        lines.extend(te_.format_exception_only())
        notes = getattr(current_, "__notes__", None)
        if isinstance(notes, list) and not isinstance(current_, GpuGuardError):
            lines.extend((n if isinstance(n, str) else repr(n)) + "\n" for n in notes)
    return lines


_CAUSE = "\nThe above exception was the direct cause of the following exception:\n\n"
_CONTEXT = "\nDuring handling of the above exception, another exception occurred:\n\n"
