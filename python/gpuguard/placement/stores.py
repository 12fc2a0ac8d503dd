"""Where ranks meet: the key-value store protocol, the one checked wrapper every store call goes through, and
discovery of the job's store in the documented order.

Anything with the methods of :class:`Store` (``torch.distributed.Store`` semantics) works. Found in this order:

1. an explicit ``store=``;
2. a job of one process needs none (nothing to compare);
3. the default process group's store, after ``torch.distributed.init_process_group``;
4. the torchrun agent store before it (``TORCHELASTIC_USE_AGENT_STORE=True``, ``MASTER_ADDR``/``MASTER_PORT``;
   joined as a ``TCPStore`` client, ``is_master=False``, under ``/gpuguard/attempt_<restart>``);
5. inside Ray, a named rendezvous actor per group (:mod:`gpuguard.ray.store`);
6. anything else is an error that says how to give the ranks a place to meet.

``gpuguard.init_process_group`` under env:// without torchrun (srun, mpirun, plain variables) first creates the
TCPStore env:// would (:func:`env_store_for_init`), so that the check runs through it before torch starts.
"""

from __future__ import annotations

import datetime
import os
import sys
import time
from typing import Any, Optional, Protocol, runtime_checkable

from ..deadline import Deadline
from ..errors import GpuGuardError


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


_STORE_METHODS = ("set", "get", "add", "check", "wait", "compare_set")


class CheckedStore:
    """A store seen through one namespace, every call checked: keys are given relative to ``namespace``, and a
    failure names the operation and the full key (any store, c10d or Ray, may raise anything)."""

    def __init__(self, store: Store, namespace: str) -> None:
        self.raw = store
        self.namespace = namespace

    def key(self, relative: str) -> str:
        return f"{self.namespace}/{relative}" if self.namespace else relative

    def child(self, relative: str) -> "CheckedStore":
        """The same store under ``<namespace>/<relative>``."""
        return CheckedStore(self.raw, self.key(relative))

    def _call(self, what: str, relative: str, *args: Any) -> Any:
        key = self.key(relative)
        try:
            return getattr(self.raw, what)(key, *args)
        except GpuGuardError:
            raise
        except Exception as exc:  # noqa: BLE001 - any store (c10d, Ray) may raise anything
            raise GpuGuardError(f"store.{what}({key!r}) failed during gpuguard's cross-rank check: "
                                f"{type(exc).__name__}: {exc}", store_operation=what, key=key) from exc

    def set(self, relative: str, value: bytes) -> None:
        self._call("set", relative, value)

    def get(self, relative: str) -> bytes:
        return bytes(self._call("get", relative))

    def add(self, relative: str, amount: int) -> int:
        return int(self._call("add", relative, amount))

    def counter(self, relative: str) -> int:
        """The value of a counter without changing it (``add`` of 0, as c10d offers no plain read)."""
        return self.add(relative, 0)

    def compare_set(self, relative: str, expected: bytes, desired: bytes) -> bytes:
        return bytes(self._call("compare_set", relative, expected, desired))

    def has(self, *relatives: str) -> bool:
        """True when every key exists; never blocks."""
        keys = [self.key(r) for r in relatives]
        try:
            return bool(self.raw.check(keys))
        except Exception as exc:  # noqa: BLE001 - as in _call
            raise GpuGuardError(f"store.check({keys[0]!r}...) failed during gpuguard's cross-rank check: "
                                f"{type(exc).__name__}: {exc}", store_operation="check", key=keys[0]) from exc

    def wait_for(self, relative: str, seconds: float) -> bool:
        """True when the key exists within ``seconds``; False on timeout. Other store failures raise."""
        if seconds <= 0:
            return self.has(relative)
        key = self.key(relative)
        started = time.monotonic()
        try:
            self.raw.wait([key], datetime.timedelta(seconds=seconds))
            return True
        except Exception as exc:  # noqa: BLE001 - the protocol does not fix the timeout exception's type
            if time.monotonic() - started >= seconds * 0.9 or "timeout" in str(exc).lower():
                return self.has(relative)
            raise GpuGuardError(f"store.wait({key!r}) failed during gpuguard's cross-rank check: "
                                f"{type(exc).__name__}: {exc}", store_operation="wait", key=key) from exc


# ---- discovery ---------------------------------------------------------------------------------------------

def _master_port(port: str) -> int:
    try:
        return int(port)
    except ValueError:
        raise GpuGuardError(f"MASTER_PORT={port!r} is not a port number", variable="MASTER_PORT") from None


def _uses_agent_store() -> bool:
    return os.environ.get("TORCHELASTIC_USE_AGENT_STORE", "").lower() == "true"


def _agent_store(deadline: Deadline) -> Optional[Store]:
    """The torchrun agent's TCPStore, joined as a client, when torchrun says workers may use it."""
    if not _uses_agent_store():
        return None
    host, port = os.environ.get("MASTER_ADDR"), os.environ.get("MASTER_PORT")
    if not host or not port:
        raise GpuGuardError(
            "TORCHELASTIC_USE_AGENT_STORE=True but MASTER_ADDR/MASTER_PORT are not both set, so gpuguard cannot "
            "reach torchrun's store; launch with torchrun unchanged, or pass store=", variable="MASTER_PORT")
    port_number = _master_port(port)
    prefix = f"/gpuguard/attempt_{os.environ.get('TORCHELASTIC_RESTART_COUNT', '0')}"
    timeout = max(deadline.remaining(), 0.001)
    try:
        if "torch" not in sys.modules:  # `gpuguard check` under torchrun: the core's own client, no torch
            from .._core import TcpStore

            return TcpStore(host, port_number, timeout, prefix)  # type: ignore[no-any-return]
        import torch.distributed as dist

        tcp = dist.TCPStore(host, port_number, is_master=False, timeout=datetime.timedelta(seconds=timeout),
                            wait_for_workers=False)
    except Exception as exc:  # noqa: BLE001 - c10d raises several types; say which store and why
        raise GpuGuardError(f"could not connect to torchrun's agent store at {host}:{port_number}: {exc}",
                            host=host, port=port_number) from exc
    return dist.PrefixStore(prefix, tcp)  # type: ignore[no-any-return]


def _default_group_store() -> Optional[Store]:
    if "torch" not in sys.modules:  # no process group without torch (and `gpuguard check` never imports it)
        return None
    try:
        import torch.distributed as dist
    except ImportError:  # pragma: no cover - torch without distributed
        return None
    if not (dist.is_available() and dist.is_initialized()):
        return None
    from torch.distributed import distributed_c10d

    return distributed_c10d._get_default_store()  # type: ignore[no-any-return]


def _ray_store(group: str) -> Optional[Store]:
    """The Ray rendezvous actor's store for ``group`` when this process is a Ray actor; None elsewhere.

    The actor (``gpuguard:<job id>:<group>`` in namespace ``gpuguard``) is created by the group's first rank
    unless ``ray_placement`` made it already; Ray itself is never imported here.
    """
    from ..ray.store import RayStore, in_ray_worker

    if not in_ray_worker():
        return None
    return RayStore(group)


def env_store_for_init(rank: int, world_size: int, timeout: float) -> Optional[Store]:
    """For ``gpuguard.init_process_group`` under env:// without torchrun (srun, mpirun, plain variables): the
    TCPStore torch's env:// rendezvous would create (rank 0 serves it on MASTER_ADDR:MASTER_PORT), created
    here so that bind() can meet the other ranks through it first; it is then handed to torch as ``store=``,
    so ``timeout`` is the store's own timeout for torch's later use. None where there is nothing to create:
    one process, torchrun's agent store, or no MASTER_ADDR/MASTER_PORT.
    """
    if world_size <= 1 or _uses_agent_store():
        return None
    host, port = os.environ.get("MASTER_ADDR"), os.environ.get("MASTER_PORT")
    if not host or not port:
        return None
    port_number = _master_port(port)
    import torch.distributed as dist

    try:
        return dist.TCPStore(host, port_number, world_size, is_master=rank == 0,  # type: ignore[no-any-return]
                             timeout=datetime.timedelta(seconds=timeout), wait_for_workers=False,
                             multi_tenant=True)
    except Exception as exc:  # noqa: BLE001 - c10d raises several types; say which store and why
        raise GpuGuardError(f"could not {'serve' if rank == 0 else 'reach'} the rendezvous store at "
                            f"{host}:{port_number} (MASTER_ADDR/MASTER_PORT): {exc}", host=host,
                            port=port_number) from exc


def find_store(store: Optional[Store], *, group: str, world_size: int, deadline: Deadline) -> Optional[Store]:
    """The store the ranks of ``group`` meet in, in the documented order; None for a single process."""
    if store is not None:
        missing = [m for m in _STORE_METHODS if not hasattr(store, m)]
        if missing:
            raise TypeError(f"store= must implement gpuguard.placement.stores.Store (c10d semantics); "
                            f"{type(store).__name__} lacks {', '.join(missing)}")
        return store
    if world_size <= 1:
        return None
    found = _default_group_store() or _agent_store(deadline) or _ray_store(group)
    if found is not None:
        return found
    raise GpuGuardError(
        f"gpuguard.bind() found {world_size} ranks but no place where they can meet to compare GPUs. Call it "
        f"after torch.distributed.init_process_group(), launch with torchrun (its agent store is used), run "
        f"inside Ray, or pass store= (any torch.distributed.Store, e.g. a TCPStore every rank can reach).",
        world_size=world_size)
