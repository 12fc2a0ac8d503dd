"""The cross-rank step of bind(): every rank of a group meets the others before NCCL does.

This is the seam the duplicate-device check plugs into. bind() always calls ``check_across_ranks``, also
when this rank's own resolution failed, so that a failed rank can tell the others instead of leaving them
waiting. For now (one process, no exchange) it only re-raises this rank's own failure.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Optional

from .errors import GpuGuardError

if TYPE_CHECKING:
    from .binding import Binding
    from .launchers import LaunchContext


def check_across_ranks(binding: Optional["Binding"], failure: Optional[GpuGuardError], context: "LaunchContext",
                       *, group: str, store: Any, timeout: float, verify_nccl: bool) -> None:
    """Raises ``failure`` (this rank's own) when given; otherwise returns: no exchange yet."""
    if failure is not None:
        raise failure
