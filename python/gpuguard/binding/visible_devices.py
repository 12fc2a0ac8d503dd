"""CUDA_VISIBLE_DEVICES as the driver reads it (parsed in the C++ core), with the entries it drops named."""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any, Optional, Sequence

from .. import _C

_FROM_ENVIRONMENT: Any = object()


@dataclass(frozen=True)
class VisibleEntry:
    """One entry: ``kind`` is "index", "uuid", "uuid_prefix" or "mig"."""

    kind: str
    text: str
    index: Optional[int]
    uuid: Optional[str]


@dataclass(frozen=True)
class VisibilityProblem:
    """The first entry the driver stops at: ``kind`` is "empty", "malformed", "duplicate" or "rejected"."""

    kind: str
    position: int              # 0-based
    entry: str
    same_as: Optional[int]     # "duplicate": the earlier entry naming the same GPU
    reason: str


@dataclass(frozen=True)
class VisibleDevices:
    set: bool                  # the variable exists
    raw: Optional[str]
    entries: tuple[VisibleEntry, ...]   # what the driver honours: the entries before the first problem
    problem: Optional[VisibilityProblem]
    hides_all_on_purpose: bool          # "", "-1" or "NoDevFiles"

    def describe(self) -> str:
        """For messages: ``CUDA_VISIBLE_DEVICES='0,1'`` or ``CUDA_VISIBLE_DEVICES unset``."""
        return f"CUDA_VISIBLE_DEVICES={self.raw!r}" if self.set else "CUDA_VISIBLE_DEVICES unset"


def _problem(d: Optional[dict[str, Any]]) -> Optional[VisibilityProblem]:
    return VisibilityProblem(**d) if d is not None else None


def parse_visible_devices(raw: Optional[str] = _FROM_ENVIRONMENT) -> VisibleDevices:
    """Parses ``raw`` (default: the environment's value now; None: unset) without touching the driver."""
    if raw is _FROM_ENVIRONMENT:
        raw = os.environ.get("CUDA_VISIBLE_DEVICES")
    d = _C.parse_visible_devices(raw)
    return VisibleDevices(set=d["set"], raw=d["raw"], entries=tuple(VisibleEntry(**e) for e in d["entries"]),
                          problem=_problem(d["problem"]), hides_all_on_purpose=d["hides_all_on_purpose"])


def rejected_entry(raw: Optional[str], visible_uuids: Sequence[str]) -> Optional[VisibilityProblem]:
    """The entry of ``raw`` the driver rejected, given the UUIDs it enumerated; None when it took them all."""
    return _problem(_C.find_rejected_entry(raw, list(visible_uuids)))
