"""CUDA_VISIBLE_DEVICES as the driver reads it (parsed in the C++ core), with the entries it drops named."""

from __future__ import annotations

import os
from typing import Any, Optional, Sequence

# VisibleEntry: one entry: ``kind`` is "index", "uuid", "uuid_prefix" or "mig"; ``index``/``uuid`` None where they
# do not apply. VisibilityProblem: the first entry the driver stops at: ``kind`` is "empty", "malformed",
# "duplicate" or "rejected". VisibleDevices: the parse: ``set``, ``raw`` (None when unset), ``entries`` honoured,
# ``problem``, ``hides_all_on_purpose``.
from .._core import VisibilityProblem, VisibleDevices, VisibleEntry
from .._core import find_rejected_entry as _find_rejected_entry
from .._core import parse_visible_devices as _parse_visible_devices

_FROM_ENVIRONMENT: Any = object()


def parse_visible_devices(raw: Optional[str] = _FROM_ENVIRONMENT) -> VisibleDevices:
    """Parses ``raw`` (default: the environment's value now; None: unset) without touching the driver."""
    if raw is _FROM_ENVIRONMENT:
        raw = os.environ.get("CUDA_VISIBLE_DEVICES")
    return _parse_visible_devices(raw)


def rejected_entry(raw: Optional[str], visible_uuids: Sequence[str]) -> Optional[VisibilityProblem]:
    """The entry of ``raw`` the driver rejected, given the UUIDs it enumerated; None when it took them all."""
    return _find_rejected_entry(raw, list(visible_uuids))
