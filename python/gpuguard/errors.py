"""gpuguard's exceptions: one base, one class per failure, each with structured fields beside the message."""

from __future__ import annotations

from typing import Any


class GpuGuardError(RuntimeError):
    """Base of every error gpuguard raises. ``details`` holds the structured facts behind the message; ``fix``
    is the message's fix sentence(s), word for word as the message ends with them ("" when it names none)."""

    def __init__(self, message: str, *, fix: str = "", **details: Any) -> None:
        super().__init__(message)
        self.fix: str = fix
        self.details: dict[str, Any] = details

    def without_fix(self) -> str:
        """The message up to its fix sentence(s): what is wrong, without how to fix it."""
        message = str(self)
        if self.fix and message.endswith(self.fix):
            return message[: len(message) - len(self.fix)].rstrip()
        return message

    def __getattr__(self, name: str) -> Any:
        details = self.__dict__.get("details", {})
        if name in details:
            return details[name]
        raise AttributeError(name)


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


class RayPlacementError(GpuGuardError):
    """A Ray placement that cannot work: bad arguments, a cluster too small for it, or options that fight it."""


class RayRendezvousError(GpuGuardError):
    """The group's Ray rendezvous actor could not be created or reached, or answered badly."""


class GpuGuardWarning(UserWarning):
    """Something is off but the run can go on (bound to the CPU for want of a GPU, ...)."""
