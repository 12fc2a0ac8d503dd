"""The attributes gpuguard.auto replaced on torch's public modules, and how to put every one of them back."""

from __future__ import annotations

import threading
from typing import Any, Callable

_MISSING = object()


class Patches:
    """Replaces ``owner.name`` with a wrapper, remembering the original; ``restore()`` undoes all of them in
    reverse order. Patching an attribute twice keeps the first original (idempotent ``enable()``)."""

    def __init__(self) -> None:
        self._saved: list[tuple[Any, str, Any]] = []
        self._lock = threading.Lock()

    def replace(self, owner: Any, name: str, make: Callable[[Any], Any]) -> None:
        """``owner.name = make(original)``; the original is what ``restore()`` puts back."""
        with self._lock:
            original = owner.__dict__.get(name, _MISSING) if isinstance(owner, type) else getattr(owner, name,
                                                                                                  _MISSING)
            if original is _MISSING:
                return
            if any(o is owner and n == name for o, n, _ in self._saved):
                return
            setattr(owner, name, make(original))
            self._saved.append((owner, name, original))

    def original(self, owner: Any, name: str) -> Any:
        for o, n, value in self._saved:
            if o is owner and n == name:
                return value
        return getattr(owner, name)

    def put_back(self, owner: Any, name: str) -> None:
        """Restores one attribute now (a trigger that has fired is no longer needed on the hot path)."""
        with self._lock:
            for i, (o, n, value) in enumerate(self._saved):
                if o is owner and n == name:
                    setattr(o, n, value)
                    del self._saved[i]
                    return

    def restore(self) -> None:
        with self._lock:
            while self._saved:
                owner, name, value = self._saved.pop()
                setattr(owner, name, value)

    def __len__(self) -> int:
        return len(self._saved)
