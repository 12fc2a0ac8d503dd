"""The one interface every failure explain knows implements: its kinds, keywords, patterns, help line, examples,
read, build.

Adding a failure is one module in ``recognisers/`` (a Recogniser subclass) and its entry (with its import) in
``registry.py``. A recogniser is stateless: what it learns from the lines it reads goes into the Group of the kind it names
(``Group.facts`` for its own facts, which it must cap), so one instance serves every LogExplainer. It reads every
number through ``Line.number`` (a number a paste broke across lines may be unreadable: it then notes that with
``Group.unreadable`` instead of guessing), and declares ``examples``: its own clean texts with the values they must
give, from which the corpus of pasted shapes is generated (tests/python/paste_corpus.py).
"""

from __future__ import annotations

import re
import socket
from abc import ABC, abstractmethod
from typing import TYPE_CHECKING, Any, Callable, ClassVar, NamedTuple, Optional, Sequence, Union

from .lines import Origin
from .model import Diagnosis, Group

if TYPE_CHECKING:
    from .wrapping import Message


class Line(NamedTuple):
    """One message offered to a recogniser: the number of its first line, its text (normalised: what a paste and a
    log store added removed, without launcher prefixes and log headers; the pieces of a wrapped message joined),
    who printed it, the lines before it (up to CONTEXT_LINES, oldest first, as ``(number, text)``, each as its
    program printed it: launcher prefixes kept), the Message it was joined from (None: one whole line), the
    message as printed and the line after it."""

    number: int
    body: str
    origin: Origin
    context: Sequence[tuple[int, str]]
    message: Optional["Message"] = None
    #: the message as its program printed it: launcher prefixes kept for a line read alone, the leading blanks of
    #: a first piece without prefixes kept (a long message's own assembly needs them); None when not known
    printed: Optional[str] = None
    #: the line right after the message (after the last line it was joined from), as its program printed it:
    #: launcher prefixes kept; None when the log has no such line next to it
    following: Optional[str] = None

    def value(self, m: "re.Match[str]", group: str, parse: Callable[[str], Any] = str) -> Any:
        """``parse`` of what ``group`` (a number, or a list of numbers) matched, when it is whole: every reading of
        the line breaks it touches gives the same, and no letter or digit is glued to it. None when it is
        unreadable (or absent, or ``parse`` refuses it)."""
        if self.message is not None:
            return self.message.value(m, group, parse)
        text = m.group(group)
        if text is None:
            return None
        s, e = m.span(group)
        whole = (s == 0 or not m.string[s - 1].isalnum()) and (e >= len(m.string) or not m.string[e].isalnum())
        try:
            return parse(text) if whole else None
        except ValueError:
            return None

    def integer(self, m: "re.Match[str]", group: str) -> Optional[int]:
        """``value`` as an int."""
        return self.value(m, group, int)


class ContextText(str):
    """A line before a message (Line.context), as its program printed it. ``readings`` are its texts with the
    lines that go on from it joined: one when the next line certainly goes on from it (or certainly not), one
    for each way it may go on when the text cannot tell (the line itself first: it may end there); ``following``
    is the line after it. They are worked out only when asked for."""

    def __new__(cls, text: str, readings: Union[tuple[str, ...], Callable[[], tuple[str, ...]]] = (),
                following: Optional[Callable[[], Optional["ContextText"]]] = None) -> "ContextText":
        self = super().__new__(cls, text)
        self._readings = readings
        self._following = following
        return self

    @property
    def following(self) -> Optional["ContextText"]:
        """The log's next line (None when the reader does not hold it): asked only while a recogniser reads."""
        return self._following() if self._following is not None else None

    @property
    def readings(self) -> tuple[str, ...]:
        if callable(self._readings):
            self._readings = self._readings()
        return self._readings or (str(self),)


class ContextField(NamedTuple):
    """A field read from a context line: whether it is there at all, and its value when every reading of the
    line gives the same (None: unreadable)."""

    found: bool
    value: Optional[str]


def context_field(text: str, pattern: "re.Pattern[str]", group: str,
                  prepare: Callable[[str], str] = lambda t: t) -> ContextField:
    """``group`` of ``pattern`` in a context line, read in every reading of it (``prepare`` applied first, e.g.
    stripping prefixes): found when some reading holds it; its value when those that do agree and none has a
    letter or digit glued to it."""
    values = []
    for reading in getattr(text, "readings", (text,)):
        t = prepare(reading)
        m = pattern.search(t)
        if m is None or m.group(group) is None:
            continue
        s, e = m.span(group)
        whole = (s == 0 or not t[s - 1].isalnum()) and (e >= len(t) or not t[e].isalnum())
        value = m.group(group) if whole else None
        if value not in values:
            values.append(value)
    if not values:
        return ContextField(False, None)
    return ContextField(True, values[0] if len(values) == 1 else None)


class Example(NamedTuple):
    """A clean text a recogniser reads, with what it must give: the kind, the ranks, and strings its summary or
    devices must hold (the decoded numbers). The corpus of pasted shapes is generated from these."""

    text: str
    kind: str
    ranks: tuple[int, ...] = ()
    values: tuple[str, ...] = ()


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
                from ..system.devices import devices

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
    #: Its clean texts and what each must give (at least one per kind, each the real library's wording).
    examples: ClassVar[tuple[Example, ...]] = ()

    @abstractmethod
    def read(self, line: Line, groups: Groups) -> bool:
        """Records ``line`` in the groups of its kinds if it matches; True when it took the line (no other
        recogniser then reads it)."""

    @abstractmethod
    def build(self, kind: str, group: Group, host: Host) -> Diagnosis:
        """The diagnosis of ``kind`` (one of ``kinds``) from what ``group`` gathered."""
