"""The verdict of one cross-rank check: what every rank learns, its strict codec, and the error it raises."""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass, field
from typing import Any, Optional

from .. import errors
from ..errors import DuplicateDeviceError, GpuGuardError, RendezvousTimeoutError
from .identity import RankIdentity

log = logging.getLogger("gpuguard")

#: Bound on a verdict a rank will parse (it is written by a peer, so it is untrusted input too).
MAX_VERDICT_BYTES = 256 * 1024
#: "moved" is never raised: a later run's leader writes it into an epoch an earlier run left (exchange.py).
KINDS = frozenset({"ok", "warning", "duplicate", "failure", "timeout", "error", "moved"})


@dataclass
class Verdict:
    """What every rank of one check learns: ``kind`` is ok | warning | duplicate | failure | timeout | error.
    ``namespace``: where the check took place (its epoch's keys), set by the exchange, never encoded."""

    kind: str
    message: str = ""
    details: dict[str, Any] = field(default_factory=dict)
    namespace: str = field(default="", compare=False, repr=False)

    def encode(self) -> bytes:
        data = json.dumps({"v": 1, "kind": self.kind, "message": self.message, "details": self.details},
                          sort_keys=True).encode()
        if len(data) > MAX_VERDICT_BYTES:  # never happens with bounded reports; keep the promise anyway
            data = json.dumps({"v": 1, "kind": self.kind, "message": self.message[:MAX_VERDICT_BYTES // 2],
                               "details": {}}).encode()
        return data

    @classmethod
    def decode(cls, data: bytes, key: str) -> "Verdict":
        def bad(why: str) -> GpuGuardError:
            return GpuGuardError(f"the placement verdict at store key {key!r} is malformed ({why}); another "
                                 f"program, or a different gpuguard version, wrote it", key=key)
        if len(data) > MAX_VERDICT_BYTES:
            raise bad(f"{len(data)} bytes")
        try:
            doc = json.loads(data.decode("utf-8"))
        except (UnicodeDecodeError, ValueError) as exc:
            raise bad(str(exc)) from None
        if (not isinstance(doc, dict) or doc.get("v") != 1 or doc.get("kind") not in KINDS
                or not isinstance(doc.get("message"), str) or not isinstance(doc.get("details"), dict)):
            raise bad("unexpected structure")
        return cls(doc["kind"], doc["message"], doc["details"])


def _error_class(name: Optional[str]) -> type[GpuGuardError]:
    """The gpuguard error class a peer's failure names, from gpuguard's own classes only."""
    cls = getattr(errors, name or "", None)
    if isinstance(cls, type) and issubclass(cls, GpuGuardError):
        return cls
    return GpuGuardError


def raise_for(verdict: Verdict, me: RankIdentity, failure: Optional[BaseException] = None) -> None:
    """Raises what ``verdict`` means on this rank (nothing for ok; a log warning for warning).

    ``failure``: this rank's own error, raised instead: it says more than the verdict about it."""
    if failure is not None:
        raise failure
    if verdict.kind == "ok":
        return
    if verdict.kind == "warning":
        log.warning("gpuguard: %s", verdict.message)
        return
    details = dict(verdict.details, rank=me.rank, group=me.group)
    if verdict.kind == "duplicate":
        raise DuplicateDeviceError(verdict.message, **details)
    if verdict.kind == "timeout":
        raise RendezvousTimeoutError(_as_seen_by(verdict, me), **details)
    if verdict.kind == "failure":
        raise _error_class(verdict.details.get("failure_kind"))(verdict.message, peer_failure=True, **details)
    raise GpuGuardError(verdict.message, **details)


def _as_seen_by(verdict: Verdict, me: RankIdentity) -> str:
    """A timeout verdict's message for the rank reading it: the late rank is not told that it never came."""
    late = me.rank in (verdict.details.get("never_arrived") or [])
    slow = me.rank in (verdict.details.get("silent_ranks") or [])
    if not (late or slow):
        return verdict.message
    timeout = verdict.details.get("timeout")
    waited = f"their {timeout:g} s timeout" if isinstance(timeout, (int, float)) else "their timeout"
    if late:
        head = (f"this rank ({me.rank}) of group '{me.group}' reached gpuguard's placement check after the other "
                f"ranks had stopped waiting for it ({waited} passed first), so the check ended without it: it "
                f"started late, or was slowed down before bind(). Give bind() a longer timeout if ranks start "
                f"this far apart, or find what delays this one.")
    else:
        head = (f"this rank ({me.rank}) of group '{me.group}' reached gpuguard's placement check but did not "
                f"finish it before the other ranks stopped waiting ({waited} passed): it was slowed down or "
                f"stopped in the middle of it (an overloaded host, swapping, a debugger, SIGSTOP).")
    return f"{head} The other ranks' report:\n  {verdict.message}"
