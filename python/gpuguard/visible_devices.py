"""CUDA_VISIBLE_DEVICES read entry by entry as the driver reads it, so that each bad entry can be named.

The driver takes comma-separated entries, each a device index, a GPU UUID or a unique UUID prefix (with or
without "GPU-"), and stops enumerating at the first entry that is invalid, out of range, ambiguous or a
repeat: "1,99,2" shows GPU 1 only, silently. This module replays that rule against the GPUs the driver lists
with no CUDA_VISIBLE_DEVICES at all (the physical GPUs), and says what happened to every entry.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Optional, Sequence

_HEX_PREFIX = re.compile(r"^[0-9a-f-]+$")


@dataclass(frozen=True)
class VisibleEntry:
    """One CUDA_VISIBLE_DEVICES entry and what the driver makes of it."""

    position: int                   # 0-based position in the list
    text: str                       # the entry as written
    status: str                     # visible | out_of_range | unknown | ambiguous | duplicate | malformed |
                                    # empty | ignored (after the entry that stopped enumeration) | unchecked
    physical_index: Optional[int]   # the GPU it names in driver order without CUDA_VISIBLE_DEVICES
    visible_index: Optional[int]    # the cuda:N it becomes in this process
    reason: str                     # one sentence for the report

    @property
    def ok(self) -> bool:
        return self.status in ("visible", "unchecked")

    def as_dict(self) -> dict[str, Any]:
        return {"position": self.position, "text": self.text, "status": self.status,
                "physical_index": self.physical_index, "visible_index": self.visible_index, "reason": self.reason}


@dataclass(frozen=True)
class VisibleDevices:
    """The whole variable: raw text, every entry, and where the driver stops."""

    raw: Optional[str]
    entries: tuple[VisibleEntry, ...]
    stopped_at: Optional[int]        # position of the entry at which enumeration stops; None if it does not
    physical_count: Optional[int]    # GPUs on the host, when they could be listed

    @property
    def invalid(self) -> tuple[VisibleEntry, ...]:
        return tuple(e for e in self.entries if e.status not in ("visible", "unchecked", "ignored", "duplicate"))

    @property
    def duplicates(self) -> tuple[VisibleEntry, ...]:
        return tuple(e for e in self.entries if e.status == "duplicate")

    @property
    def ignored(self) -> tuple[VisibleEntry, ...]:
        return tuple(e for e in self.entries if e.status == "ignored")

    def as_dict(self) -> dict[str, Any]:
        return {
            "raw": self.raw,
            "entries": [e.as_dict() for e in self.entries],
            "stopped_at": self.stopped_at,
            "invalid": [e.text for e in self.invalid],
            "duplicates": [e.text for e in self.duplicates],
            "ignored": [e.text for e in self.ignored],
            "physical_count": self.physical_count,
        }


def _uuid_body(uuid: str) -> str:
    u = uuid.lower()
    return u[4:] if u.startswith("gpu-") else u


def parse_visible_devices(raw: Optional[str], physical_uuids: Optional[Sequence[str]]) -> VisibleDevices:
    """Replays the driver's reading of `raw` against the host's GPUs (their UUIDs in driver order).

    With ``physical_uuids`` None (the GPUs could not be listed), only what the text alone shows is judged:
    malformed and repeated entries; the others are "unchecked".
    """
    if raw is None:
        return VisibleDevices(None, (), None, len(physical_uuids) if physical_uuids is not None else None)
    entries: list[VisibleEntry] = []
    seen: dict[Any, int] = {}
    stopped_at: Optional[int] = None
    visible = 0
    bodies = [_uuid_body(u) for u in physical_uuids] if physical_uuids is not None else None
    n = len(bodies) if bodies is not None else None
    for position, piece in enumerate(raw.split(",")):
        text = piece.strip()
        if stopped_at is not None:
            entries.append(VisibleEntry(position, text, "ignored", None, None,
                                        f"the driver stopped at entry {stopped_at + 1}"))
            continue
        status, physical, reason = _judge(text, bodies, n)
        if status in ("visible", "unchecked"):
            key = physical if physical is not None else text.lower()
            if key in seen:
                status, reason = "duplicate", f"repeats entry {seen[key] + 1} ({raw.split(',')[seen[key]].strip()!r})"
            else:
                seen[key] = position
        if status == "visible":
            entries.append(VisibleEntry(position, text, status, physical, visible, reason or f"GPU {physical} "
                                        f"of the host becomes cuda:{visible}"))
            visible += 1
        elif status == "unchecked":
            entries.append(VisibleEntry(position, text, status, None, None, reason))
        else:
            entries.append(VisibleEntry(position, text, status, physical, None, reason))
            stopped_at = position
    return VisibleDevices(raw, tuple(entries), stopped_at, n)


def _judge(text: str, bodies: Optional[list[str]], n: Optional[int]) -> tuple[str, Optional[int], str]:
    if not text:
        return "empty", None, "an empty entry"
    if text.isdigit():
        index = int(text)
        if len(text) > 6 or (n is not None and index >= n):
            return "out_of_range", None, (f"there is no GPU {index}: the host has {n}" if n is not None
                                          else f"there is no GPU {index}")
        if n is None:
            return "unchecked", None, "a device index (not checked: the host's GPUs could not be listed)"
        return "visible", index, ""
    if text.startswith("-") and text[1:].isdigit():
        return "malformed", None, f"{text!r} is not a device (a common way to hide every GPU)"
    lowered = text.lower()
    if lowered.startswith("mig-"):
        return "unchecked", None, "a MIG instance (not checked: gpuguard does not list MIG instances)"
    prefix = lowered[4:] if lowered.startswith("gpu-") else lowered
    if not prefix or not _HEX_PREFIX.match(prefix):
        return "malformed", None, f"{text!r} is neither a device index nor a GPU UUID"
    if bodies is None:
        return "unchecked", None, "a GPU UUID (not checked: the host's GPUs could not be listed)"
    matches = [i for i, body in enumerate(bodies) if body.startswith(prefix)]
    if not matches:
        return "unknown", None, "no GPU of this host has a UUID starting with this"
    if len(matches) > 1:
        return "ambiguous", None, f"matches {len(matches)} GPUs ({', '.join(str(i) for i in matches)}): give more of the UUID"
    return "visible", matches[0], ""
