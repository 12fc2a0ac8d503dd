"""Where ranks meet: the key-value store protocol gpuguard's cross-rank exchange uses, and adapters to it.

Anything with these methods (torch.distributed.Store semantics) works: an explicit ``store=``, the default
process group's store, the torchrun agent store, or gpuguard's Ray rendezvous actor.
"""

from __future__ import annotations

import datetime
from typing import Protocol, runtime_checkable


@runtime_checkable
class Store(Protocol):
    """The subset of ``torch.distributed.Store`` the exchange relies on. Keys are str, values bytes."""

    def set(self, key: str, value: bytes) -> None: ...

    def get(self, key: str) -> bytes:
        """Blocks until ``key`` exists; raises when the store's own timeout passes."""
        ...

    def add(self, key: str, amount: int) -> int: ...

    def check(self, keys: list[str]) -> bool:
        """True when every key exists; never blocks."""
        ...

    def wait(self, keys: list[str], timeout: datetime.timedelta) -> None:
        """Blocks until every key exists; raises when ``timeout`` passes."""
        ...

    def compare_set(self, key: str, expected: bytes, desired: bytes) -> bytes: ...
