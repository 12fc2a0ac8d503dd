"""What explain produces (Diagnosis, Evidence) and what it accumulates per diagnosis (Group), with their bounds."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Iterable, NamedTuple, Optional

if TYPE_CHECKING:
    from .lines import Origin

# What one diagnosis keeps, however many times its failure repeats in the log.
MAX_EVIDENCE = 6
MAX_RANKS = 4096
MAX_DEVICES = 256


class Evidence(NamedTuple):
    """One input line that supports a diagnosis: its 1-based line number and its text (cut at 300 chars)."""

    line: int
    text: str


@dataclass(frozen=True)
class Diagnosis:
    """One failure recognised in the text: what it is, who and what it involves, why, and how to fix it."""

    kind: str
    summary: str
    ranks: tuple[int, ...]
    devices: tuple[str, ...]
    cause: str
    fix: str
    evidence: tuple[Evidence, ...]
    occurrences: int = 1
    #: The values the text shows but does not give for certain (a number broken across lines by a paste), each
    #: named; the summary says so, and cause and fix still hold.
    unreadable: tuple[str, ...] = ()

    def as_dict(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "summary": self.summary,
            "ranks": list(self.ranks),
            "devices": list(self.devices),
            "cause": self.cause,
            "fix": self.fix,
            "evidence": [{"line": e.line, "text": e.text} for e in self.evidence],
            "occurrences": self.occurrences,
            "unreadable": list(self.unreadable),
        }


def clip(text: str, limit: int = 300) -> str:
    text = text.rstrip("\r\n")
    return text if len(text) <= limit else text[: limit - 1] + "…"


def ranks_phrase(ranks: Iterable[int]) -> str:
    ordered = sorted(set(ranks))
    return ("rank " if len(ordered) == 1 else "ranks ") + ranks_text(ordered)


def ranks_text(ranks: Iterable[int], limit: int = 16) -> str:
    ordered = sorted(set(ranks))
    shown = ", ".join(str(r) for r in ordered[:limit])
    return shown + (f" and {len(ordered) - limit} more" if len(ordered) > limit else "")


@dataclass
class Group:
    """What accumulates for one diagnosis while the log streams by; every collection is capped."""

    occurrences: int = 0
    ranks: set[int] = field(default_factory=set)
    devices: dict[str, None] = field(default_factory=dict)  # insertion-ordered set
    evidence: list[Evidence] = field(default_factory=list)
    facts: dict[str, Any] = field(default_factory=dict)     # the recogniser's own, capped by it

    def add(self, lineno: int, text: str, ranks: Iterable[Optional[int]] = (), devices: Iterable[str] = ()) -> None:
        self.occurrences += 1
        for r in ranks:
            if r is not None and len(self.ranks) < MAX_RANKS:
                self.ranks.add(r)
        for d in devices:
            if len(self.devices) < MAX_DEVICES:
                self.devices.setdefault(d, None)
        self.evidence_line(lineno, text)

    def source(self, origin: "Origin") -> None:
        """Remembers who printed a line when no rank says it (a Ray worker's pid and ip)."""
        if origin.rank is None and origin.local_rank is None and (origin.pid is not None or origin.host):
            sources = self.facts.setdefault("sources", {})
            if len(sources) < 16:
                sources.setdefault(origin.describe(), None)

    def who(self) -> str:
        """' on ranks 1, 2' / ' in pid 123, host 10.0.0.5' / '' when the lines do not say."""
        if self.ranks:
            return " on " + ranks_phrase(self.ranks)
        if self.facts.get("local_ranks"):
            return " on local " + ranks_phrase(self.facts["local_ranks"])
        if self.facts.get("sources"):
            return " in " + "; ".join(self.facts["sources"])
        return ""

    def unreadable(self, what: str) -> None:
        """Notes a value the text shows but does not give for certain (``what`` names it, e.g. "the PCI bus id NCCL
        printed"); the diagnosis then says it is unreadable instead of guessing."""
        notes: dict[str, None] = self.facts.setdefault("unreadable", {})
        if len(notes) < 8:
            notes.setdefault(what, None)

    def sorted_evidence(self) -> tuple[Evidence, ...]:
        return tuple(sorted(self.evidence))

    def evidence_line(self, lineno: int, text: str) -> None:
        clipped = clip(text)
        if len(self.evidence) < MAX_EVIDENCE and all(e.text != clipped for e in self.evidence):
            self.evidence.append(Evidence(lineno, clipped))
