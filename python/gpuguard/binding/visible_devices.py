"""CUDA_VISIBLE_DEVICES as the driver reads it (parsed in the C++ core), with the entries it drops named."""

from __future__ import annotations

import os
from typing import Any, Optional, Sequence

from .. import _C

_FROM_ENVIRONMENT: Any = object()


#: One entry: ``kind`` is "index", "uuid", "uuid_prefix" or "mig"; ``index``/``uuid`` None where they do not apply.
VisibleEntry = _C.VisibleEntry
#: The first entry the driver stops at: ``kind`` is "empty", "malformed", "duplicate" or "rejected".
VisibilityProblem = _C.VisibilityProblem
#: The parse: ``set``, ``raw`` (None when unset), ``entries`` honoured, ``problem``, ``hides_all_on_purpose``.
VisibleDevices = _C.VisibleDevices


def parse_visible_devices(raw: Optional[str] = _FROM_ENVIRONMENT) -> VisibleDevices:
    """Parses ``raw`` (default: the environment's value now; None: unset) without touching the driver."""
    if raw is _FROM_ENVIRONMENT:
        raw = os.environ.get("CUDA_VISIBLE_DEVICES")
    return _C.parse_visible_devices(raw)


def rejected_entry(raw: Optional[str], visible_uuids: Sequence[str]) -> Optional[VisibilityProblem]:
    """The entry of ``raw`` the driver rejected, given the UUIDs it enumerated; None when it took them all."""
    return _C.find_rejected_entry(raw, list(visible_uuids))
