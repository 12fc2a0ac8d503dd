"""One deadline for a whole call: every wait inside bind() (CUDA check, store, exchange, NCCL) draws on it."""

from __future__ import annotations

import time


#: How long past a deadline a call may still wait for the one peer that reports on it (bind()'s timeout verdict);
#: every store call of a cross-rank check is bounded by what is left of the deadline plus this.
GRACE_S = 5.0


class Deadline:
    """A point in time ``seconds`` from now (monotonic clock). ``total`` is what the caller asked for, for
    messages ("within 60 s"); ``remaining()`` is what is left of it for the next wait."""

    __slots__ = ("total", "_end")

    def __init__(self, seconds: float) -> None:
        self.total = float(seconds)
        self._end = time.monotonic() + self.total

    def remaining(self, grace: float = 0.0) -> float:
        """Seconds left, never negative; with ``grace``, of the deadline moved that much later."""
        return max(0.0, self._end + grace - time.monotonic())

    def expired(self) -> bool:
        return time.monotonic() >= self._end

    def __repr__(self) -> str:
        return f"Deadline(total={self.total:g}, remaining={self.remaining():.3f})"
