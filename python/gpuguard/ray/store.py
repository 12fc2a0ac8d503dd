"""Where the ranks of a Ray job meet: one named async actor per group holding a c10d-style key-value store.

No ports, no MASTER_ADDR: the actor is found by name through Ray's own control plane. It is named
``gpuguard:<job id>:<group>`` in the ``gpuguard`` namespace, so two jobs sharing a cluster, or two groups of
one job (verl-style actor and rollout roles on the same GPUs), never read each other's records.

Lifetime: the actor is not detached. It belongs to whoever created it first: the driver when
``ray_placement`` made the placement (``RayPlacement.remove()`` ends it), otherwise the group's first
``bind()`` (it then lives as long as that rank's process, which keeps the creating handle: Ray ends a
non-detached actor once its creator drops it). A detached store would outlive the job and hand stale records
to the next job that reuses the group name.

Semantics follow ``torch.distributed.Store`` (see ``gpuguard.placement.stores.Store``): ``get`` and ``wait`` block until
the keys exist or a deadline passes. The actor is async and every blocking call awaits an
``asyncio.Event``, so a thousand ranks waiting do not stop the one ``set`` that wakes them. Every call from
a client is bounded by a deadline of its own: a store actor that cannot start or has died is an error that
says so, never a hang.
"""

from __future__ import annotations

import asyncio
import datetime
import sys
from typing import Any, Optional

from ..errors import RayRendezvousError, RendezvousTimeoutError
from ..supported_versions import ray_problem

NAMESPACE = "gpuguard"
# Extra seconds a client waits beyond the store-side deadline, for the call's own round trip.
_CALL_GRACE_S = 30.0
# Bounds on what a peer may put in the store (peers' bytes are untrusted): generous for identity records,
# small enough that a runaway writer cannot exhaust the actor's memory with one call.
MAX_KEY_CHARS = 1024
MAX_VALUE_BYTES = 1 << 20
# An async actor runs at most this many calls at once; every rank of a group may be blocked in wait()
# at the same moment, and a set() must still get through, so this is far above any realistic group size.
_MAX_CONCURRENCY = 100_000


def actor_name(group: str, job_id: str) -> str:
    return f"gpuguard:{job_id}:{group}"


def _store_actor_class() -> type:
    """The store actor's class, made inside a function on purpose: Ray ships a class it cannot import by name
    by value, so the actor's process never imports gpuguard (nor torch with it). It starts in about a second,
    holds little memory, and needs nothing installed beyond Ray."""

    class _StoreActor:
        """The store itself (runs inside the actor). Values are bytes; ``add`` keeps decimal text as c10d does."""

        def __init__(self, group: str) -> None:
            self._group = group
            self._data: dict[str, bytes] = {}
            self._waiters: dict[str, asyncio.Event] = {}  # key → the event set() fires for its waiters
            self._waiting: dict[str, int] = {}  # key → how many calls are blocked on it now

        def _put(self, key: str, value: bytes) -> None:
            self._data[key] = value
            event = self._waiters.pop(key, None)
            if event is not None:
                event.set()

        async def _until_present(self, keys: list[str], timeout_s: float) -> list[str]:
            """Waits for every key; returns those still missing when ``timeout_s`` passes (empty: all there)."""
            loop = asyncio.get_running_loop()
            deadline = loop.time() + max(0.0, timeout_s)
            for key in keys:
                while key not in self._data:
                    remaining = deadline - loop.time()
                    if remaining <= 0:
                        return [k for k in keys if k not in self._data]
                    event = self._waiters.setdefault(key, asyncio.Event())
                    self._waiting[key] = self._waiting.get(key, 0) + 1
                    try:
                        await asyncio.wait_for(event.wait(), remaining)
                    except asyncio.TimeoutError:
                        pass
                    finally:
                        self._waiting[key] -= 1
                        if not self._waiting[key]:
                            del self._waiting[key]
                            if self._waiters.get(key) is event:  # nobody left to wake: drop it
                                del self._waiters[key]
            return []

        async def set(self, key: str, value: bytes) -> None:
            self._put(key, value)

        async def get(self, key: str, timeout_s: float) -> Optional[bytes]:
            """The value, or None when the key did not appear within ``timeout_s``."""
            if await self._until_present([key], timeout_s):
                return None
            return self._data[key]

        async def add(self, key: str, amount: int) -> tuple[bool, Any]:
            """(True, new value), or (False, why) when the key holds something that is not an integer."""
            current = self._data.get(key, b"0")
            try:
                value = int(current.decode("ascii")) + amount
            except (UnicodeDecodeError, ValueError):
                return False, f"key {key!r} holds {current[:40]!r}, not an integer counter"
            self._put(key, str(value).encode("ascii"))
            return True, value

        async def check(self, keys: list[str]) -> bool:
            return all(k in self._data for k in keys)

        async def wait(self, keys: list[str], timeout_s: float) -> list[str]:
            return await self._until_present(keys, timeout_s)

        async def compare_set(self, key: str, expected: bytes, desired: bytes) -> bytes:
            # TCPStore's rule, including its quirk: a missing key is created only when expected is empty.
            if key not in self._data:
                if expected == b"":
                    self._put(key, desired)
                    return desired
                return expected
            if self._data[key] == expected:
                self._put(key, desired)
            return self._data[key]

        async def scan(self, prefix: str) -> dict[str, bytes]:
            """Every key under ``prefix`` (for the driver's report; never used by the exchange itself)."""
            return {k: v for k, v in self._data.items() if k.startswith(prefix)}

        async def waited_keys(self) -> list[str]:
            """Keys some caller is blocked on right now (diagnostics: who is still waiting for whom)."""
            return sorted(self._waiting)

        async def ping(self) -> dict[str, Any]:
            import os
            import sys

            return {"group": self._group, "pid": os.getpid(), "imports_torch": "torch" in sys.modules}

    return _StoreActor


_remote_class: Any = None
_held: dict[str, Any] = {}  # actor name → a handle this process keeps for as long as it lives


def _ray() -> Any:
    try:
        import ray
    except ImportError as exc:  # pragma: no cover - the Ray paths are only reached with Ray installed
        raise RayRendezvousError("gpuguard's Ray rendezvous needs Ray: pip install 'ray[default]>=2.43'") from exc
    problem = ray_problem(ray.__version__)
    if problem:  # an older Ray lacks what gpuguard's Ray integration relies on (supported_versions.py says what)
        raise RayRendezvousError(problem, ray_version=ray.__version__)
    return ray


def in_ray_worker() -> bool:
    """True inside a Ray actor or task. Never imports Ray: a process that has not imported it is not in Ray."""
    ray = sys.modules.get("ray")
    if ray is None or not ray.is_initialized():
        return False
    from ray._private.worker import WORKER_MODE, global_worker

    return global_worker.mode == WORKER_MODE


def in_ray_train_worker() -> bool:
    """True inside a Ray Train training worker, where Ray Train (not the user) calls init_process_group.

    Ray Train V2 (the default in newer Ray: RAY_TRAIN_V2_ENABLED defaults to 1 in 2.60, to 0 in 2.43) sets each
    worker's train context before its backend forms the process group. V1 (2.43's default) forms it from
    ray.train.torch.config before any context exists, and wraps the model from ray.train.torch.train_loop_utils;
    so a frame of either on the stack says Ray Train too. The modules are Ray's internal ones, so anything
    unexpected there means "not known to be Ray Train"."""
    context = sys.modules.get("ray.train.v2._internal.execution.context")
    if getattr(context, "_train_context", None) is not None:
        return True
    frame = sys._getframe(1)
    while frame is not None:
        if frame.f_globals.get("__name__") in _RAY_TRAIN_TORCH_MODULES:
            return True
        frame = frame.f_back
    return False


_RAY_TRAIN_TORCH_MODULES = ("ray.train.torch.config", "ray.train.torch.train_loop_utils")


def current_job_id() -> str:
    return _ray().get_runtime_context().get_job_id()


def store_actor(group: str, *, job_id: Optional[str] = None, create: bool = True) -> Any:
    """The handle of ``group``'s rendezvous actor, created on first use (atomically: get_if_exists).

    ``create=False`` returns None when it does not exist. The store never joins a placement group: its
    scheduling strategy is "DEFAULT", which also stops an actor's ``placement_group_capture_child_tasks``
    from squeezing it into a GPU bundle.
    """
    global _remote_class
    ray = _ray()
    if not ray.is_initialized():
        raise RayRendezvousError("gpuguard's Ray rendezvous needs a running Ray: call ray.init() first")
    name = actor_name(group, job_id or current_job_id())
    if not create:
        try:
            return ray.get_actor(name, namespace=NAMESPACE)
        except ValueError:
            return None
    if _remote_class is None:
        _remote_class = ray.remote(_store_actor_class())
    handle = _remote_class.options(
        name=name, namespace=NAMESPACE, get_if_exists=True, lifetime=None, num_cpus=0,
        max_concurrency=_MAX_CONCURRENCY, scheduling_strategy="DEFAULT", max_restarts=0,
    ).remote(group)
    # Ray ends a non-detached actor once its creator holds no handle to it, named or not: without this, the
    # store would die the moment bind() returned in the rank that created it, under the other ranks' feet.
    # Only the creating call's handle counts (one fetched by name is not counted), so the first handle to a
    # given actor is the one kept; a different actor id means the old store is gone and this is its successor.
    held = _held.get(name)
    if held is None or held._actor_id != handle._actor_id:
        _held[name] = handle
    return handle


def _check_key(key: str) -> str:
    if not isinstance(key, str) or not key or len(key) > MAX_KEY_CHARS:
        raise RayRendezvousError(f"store key must be a non-empty str of at most {MAX_KEY_CHARS} characters, "
                                 f"got {key!r:.80}")
    return key


def _as_bytes(value: Any) -> bytes:
    data = value.encode("utf-8") if isinstance(value, str) else bytes(value)
    if len(data) > MAX_VALUE_BYTES:
        raise RayRendezvousError(f"store value of {len(data)} bytes exceeds gpuguard's limit of "
                                 f"{MAX_VALUE_BYTES} bytes")
    return data


class RayStore:
    """``gpuguard.placement.stores.Store`` over the group's rendezvous actor (client side; one per process and group).

    ``timeout`` is the store's own deadline, used by ``get`` (as ``torch.distributed.Store.timeout`` is).
    A deadline that passes raises ``RendezvousTimeoutError`` naming the keys still missing.
    """

    #: The actor outlives the ranks' processes (an actor restarted by Ray meets the same store): the exchange
    #: then counts checks per rank in the store (``placement.exchange.namespace_for``).
    outlives_ranks = True

    def __init__(self, group: str, *, timeout: float = 300.0, job_id: Optional[str] = None,
                 create: bool = True) -> None:
        self.group = group
        self.timeout = datetime.timedelta(seconds=float(timeout))
        self._actor = store_actor(group, job_id=job_id, create=create)
        if self._actor is None:
            raise RayRendezvousError(
                f"no gpuguard rendezvous actor exists for group {group!r} in this Ray job: no rank of the group "
                f"has called gpuguard.bind() yet, and the group was not made by gpuguard.ray_placement()")

    @property
    def actor(self) -> Any:
        return self._actor

    def set_timeout(self, timeout: datetime.timedelta) -> None:
        """Sets what ``get`` waits for its key (as ``torch.distributed.Store.set_timeout`` does)."""
        self.timeout = timeout

    def _call(self, method: str, *args: Any, wait_s: float = 0.0) -> Any:
        """Runs one actor method, bounded by ``wait_s`` (the store-side wait) plus a grace for the call."""
        ray = _ray()
        ref = getattr(self._actor, method).remote(*args)
        bound = wait_s + _CALL_GRACE_S
        try:
            return ray.get(ref, timeout=bound)
        except ray.exceptions.GetTimeoutError:
            try:
                ray.cancel(ref)
            except Exception:  # best effort: the actor-side wait ends at its own deadline anyway
                pass
            raise RendezvousTimeoutError(
                f"gpuguard's rendezvous actor for group {self.group!r} did not answer store.{method}() within "
                f"{bound:.0f} s. It may be waiting for resources to start (it asks for none: look for a dead "
                f"or overloaded node with `ray status`).", group=self.group, call=method) from None
        except (ray.exceptions.RayActorError, ray.exceptions.ActorUnavailableError) as exc:
            raise RayRendezvousError(
                f"gpuguard's rendezvous actor for group {self.group!r} is gone or could not start "
                f"(store.{method}() failed: {exc}). It belongs to whoever created it first: the driver of "
                f"ray_placement(), or the group's first rank to call bind(); if that one exited, the store "
                f"went with it. The Ray workers must also be able to import gpuguard.",
                group=self.group, call=method) from exc

    def _timed_out(self, method: str, missing: list[str], seconds: float) -> RendezvousTimeoutError:
        return RendezvousTimeoutError(
            f"store.{method}() on gpuguard's Ray rendezvous for group {self.group!r} timed out after "
            f"{seconds:g} s; keys still missing: {', '.join(missing[:20])}"
            f"{' …' if len(missing) > 20 else ''}", group=self.group, missing_keys=missing)

    def set(self, key: str, value: Any) -> None:
        self._call("set", _check_key(key), _as_bytes(value))

    def get(self, key: str) -> bytes:
        seconds = self.timeout.total_seconds()
        value = self._call("get", _check_key(key), seconds, wait_s=seconds)
        if value is None:
            raise self._timed_out("get", [key], seconds)
        return bytes(value)

    def add(self, key: str, amount: int) -> int:
        ok, result = self._call("add", _check_key(key), int(amount))
        if not ok:
            raise RayRendezvousError(f"store.add() on group {self.group!r}: {result}", group=self.group)
        return int(result)

    def check(self, keys: list[str]) -> bool:
        return bool(self._call("check", [_check_key(k) for k in keys]))

    def wait(self, keys: list[str], timeout: Optional[datetime.timedelta] = None) -> None:
        seconds = (timeout or self.timeout).total_seconds()
        missing = self._call("wait", [_check_key(k) for k in keys], seconds, wait_s=seconds)
        if missing:
            raise self._timed_out("wait", list(missing), seconds)

    def compare_set(self, key: str, expected: Any, desired: Any) -> bytes:
        return bytes(self._call("compare_set", _check_key(key), _as_bytes(expected), _as_bytes(desired)))

    def scan(self, prefix: str) -> dict[str, bytes]:
        return {str(k): bytes(v) for k, v in self._call("scan", prefix).items()}

    def waited_keys(self) -> list[str]:
        return [str(k) for k in self._call("waited_keys")]

    def ping(self, timeout: float = _CALL_GRACE_S) -> dict[str, Any]:
        """Once the actor runs, its group, pid and whether it imported torch; a clear error when it cannot
        start in ``timeout`` seconds."""
        return dict(self._call("ping", wait_s=max(0.0, timeout - _CALL_GRACE_S)))

