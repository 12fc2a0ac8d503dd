"""One rank's identity record, the who-is-where the ranks exchange (``gpuguard::IdentityRecord`` in C++)."""

from __future__ import annotations

from .._core import IdentityRecord

#: The C++ record itself: keyword constructor over every field, ``encode()`` (GpuGuardError naming the bad
#: field), ``RankIdentity.decode(data)`` (ValueError saying what is malformed), ``==``, ``repr`` and pickling.
RankIdentity = IdentityRecord
