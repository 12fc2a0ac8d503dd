"""The one interface every failure explain knows implements: its kinds, keywords, patterns, help line, read, build.

Adding a failure is one module in ``recognisers/`` (a Recogniser subclass) and its entry (with its import) in
``registry.py``. A recogniser is stateless: what it learns from the lines it reads goes into the Group of the kind it names
(``Group.facts`` for its own facts, which it must cap), so one instance serves every LogExplainer.
"""

from __future__ import annotations

import re
import socket
from abc import ABC, abstractmethod
from typing import Any, Callable, ClassVar, NamedTuple, Optional, Sequence

from .lines import Origin
from .model import Diagnosis, Group


class Line(NamedTuple):
    """One line offered to a recogniser: its number, its text without prefixes, who printed it, the raw
    lines before it (up to CONTEXT_LINES, oldest first, as ``(number, text)``) and the raw line right after it
    (None when the reader did not hand it over: the log ended, or a line was skipped)."""

    number: int
    body: str
    origin: Origin
    context: Sequence[tuple[int, str]]
    following: Optional[str] = None


#: Gives the Group that accumulates one kind of diagnosis (made on first use).
Groups = Callable[[str], Group]


class Host:
    """This machine, for matching what a log names (PCI bus ids, host names) to it; asked only when needed."""

    def __init__(self, match_local: bool, local_devices: Optional[Sequence[Any]] = None,
                 local_host: Optional[str] = None, log_is_local: bool = False) -> None:
        self.match_local = match_local
        self._devices = list(local_devices) if local_devices is not None else None
        self._name = local_host
        #: the user said the log was written on this machine (`gpuguard explain --this-host`)
        self.log_is_local = log_is_local

    def devices(self) -> Optional[list[Any]]:
        """This host's GPUs (gpuguard.devices(), which initialises the driver); None without match_local."""
        if not self.match_local:
            return None
        if self._devices is None:
            try:
                from ..devices import devices

                self._devices = devices()
            except Exception:  # a broken driver must not stop the explanation
                self._devices = []
        return self._devices

    def name(self) -> str:
        """This host's short name, as NCCL prints it in its WARN prefix."""
        if self._name is None:
            self._name = socket.gethostname().split(".")[0]
        return self._name


class Recogniser(ABC):
    """One failure (or one family printed by the same code) that explain recognises and explains."""

    #: The diagnoses it makes, in the order they are reported.
    kinds: ClassVar[tuple[str, ...]]
    #: A line is offered to it only if it holds one of these; every match of ``patterns`` contains one.
    keywords: ClassVar[tuple[str, ...]]
    #: The texts it matches, each written from the source that prints it (cited beside it).
    patterns: ClassVar[tuple["re.Pattern[str]", ...]]
    #: How `gpuguard explain` names what it recognises, e.g. "CUDA 'invalid device ordinal'".
    help: ClassVar[str]
    #: Kinds whose recogniser reads a line first when its patterns match that line too.
    yields_to: ClassVar[tuple[str, ...]] = ()

    @abstractmethod
    def read(self, line: Line, groups: Groups) -> bool:
        """Records ``line`` in the groups of its kinds if it matches; True when it took the line (no other
        recogniser then reads it)."""

    @abstractmethod
    def build(self, kind: str, group: Group, host: Host) -> Diagnosis:
        """The diagnosis of ``kind`` (one of ``kinds``) from what ``group`` gathered."""
