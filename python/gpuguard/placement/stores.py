"""Where ranks meet: the key-value store protocol, the one checked wrapper every store call goes through (which
also holds each call to the caller's deadline), and discovery of the job's store in the documented order.

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

import contextlib
import datetime
import os
import queue
import sys
import threading
import time
from typing import Any, Callable, Iterator, Optional, Protocol, runtime_checkable

from ..deadline import Deadline
from ..errors import GpuGuardError, RendezvousTimeoutError


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


#: How much longer than an operation's own bound a caller waits for the store call to return before it gives up
#: on it: a c10d TCPStore client whose server is stopped (SIGSTOP) stays blocked even past its own timeout (it
#: waits, with no bound, for the server to confirm a cancelled wait). Not shorter: on a rank whose cores are
#: shared (data-loader workers, other jobs, a loaded node) a call that timed out on time can take over a second
#: to hand its answer back, and a call given up on early reads as a store that stopped answering (CI saw 0.5 s
#: do that to a rank that came late, on a loaded 2-core machine).
ABANDON_AFTER_S = 2.0
#: The shortest timeout handed to a store for one operation: c10d reads a zero timeout as "no timeout".
MIN_OP_TIMEOUT_S = 0.01


class StoreDeadlineError(RendezvousTimeoutError):
    """A store operation did not return within what was left of the caller's deadline."""


def _looks_like_a_timeout(exc: BaseException, elapsed: float, seconds: float) -> bool:
    """Whether a store's exception means "the wait timed out" (the protocol does not fix its type: c10d raises
    DistStoreError "wait timeout after ...", Ray's store RendezvousTimeoutError, gpuguard's client RuntimeError)."""
    text = str(exc).lower()
    return elapsed >= seconds * 0.9 or "timeout" in text or "timed out" in text


# ---- the store's own timeout, bounded per operation and restored after ---------------------------------------

_timeouts_lock = threading.Lock()
#: id(store) -> [the user's timeout, operations in flight]: the first operation saves it, the last restores it, so
#: that threads sharing one store object never leave it with one of gpuguard's bounds.
_saved_timeouts: dict[int, list[Any]] = {}


def _settable_timeout(store: Any) -> bool:
    return callable(getattr(store, "set_timeout", None)) and isinstance(getattr(store, "timeout", None),
                                                                       datetime.timedelta)


@contextlib.contextmanager
def _store_timeout(store: Any, seconds: float) -> Iterator[None]:
    """The store's own timeout (what a c10d ``get`` waits for its key) set to ``seconds`` for one operation, and
    the user's put back after: a store made with a 24 s timeout must not hold bind(timeout=6) for 24 s."""
    if not _settable_timeout(store):
        yield
        return
    with _timeouts_lock:
        entry = _saved_timeouts.setdefault(id(store), [store.timeout, 0])
        entry[1] += 1
        store.set_timeout(datetime.timedelta(seconds=max(seconds, MIN_OP_TIMEOUT_S)))
    try:
        yield
    finally:
        with _timeouts_lock:
            entry[1] -= 1
            if entry[1] == 0:
                del _saved_timeouts[id(store)]
                try:
                    store.set_timeout(entry[0])
                except Exception:  # noqa: BLE001 - a store that fails here failed the operation already
                    pass


class _NoAnswer(Exception):
    """A store call that did not return in time (left behind on its helper thread)."""


class _Caller:
    """A helper thread that runs one calling thread's store calls, one at a time, so that the caller can stop
    waiting for a call that never returns (a c10d client whose server is stopped). It is kept between calls
    (handing a call over costs tens of microseconds; starting a thread per call, hundreds) and ends after
    IDLE_S without work; one left behind on a call that never returned is replaced."""

    IDLE_S = 5.0

    def __init__(self) -> None:
        self._jobs: queue.SimpleQueue[tuple[Callable[[], Any], list[Any], threading.Event]] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self.alive = True
        self.stuck = False
        # started by the first submit, with that call already queued: a thread started here could wait out IDLE_S
        # and end before its first call came (1,024 ranks' threads in one process, the GIL shared among them)
        self._thread: Optional[threading.Thread] = None

    def _serve(self) -> None:
        while True:
            try:
                fn, outcome, done = self._jobs.get(timeout=self.IDLE_S)
            except queue.Empty:
                with self._lock:
                    if self._jobs.empty():
                        self.alive = False
                        return
                continue
            try:
                outcome.append((True, fn()))
            except BaseException as exc:  # noqa: BLE001 - handed to the caller
                outcome.append((False, exc))
            done.set()

    def submit(self, fn: Callable[[], Any]) -> Optional[tuple[list[Any], threading.Event]]:
        """Queues ``fn``; None when this helper has ended (idle) and cannot take it."""
        with self._lock:
            if not self.alive:
                return None
            outcome: list[Any] = []
            done = threading.Event()
            self._jobs.put((fn, outcome, done))
            if self._thread is None:
                self._thread = threading.Thread(target=self._serve, name="gpuguard-store-call", daemon=True)
                self._thread.start()
            return outcome, done


_callers = threading.local()


def _call_within(fn: Callable[[], Any], seconds: float) -> Any:
    """``fn()`` on this thread's helper thread, waited for at most ``seconds``: a store call that does not return
    by then (its server stopped or hung) is left behind on that helper, which is a daemon and is replaced.
    Raises what ``fn`` raised, or _NoAnswer when it did not return; a call that failed only after ``seconds`` (this
    thread woke late, on a loaded machine, to find it done) did not answer in time either."""
    started = time.monotonic()
    caller: Optional[_Caller] = getattr(_callers, "caller", None)
    job = None if caller is None or caller.stuck else caller.submit(fn)
    if job is None:
        caller = _callers.caller = _Caller()
        job = caller.submit(fn)
        assert job is not None
    outcome, done = job
    if not done.wait(seconds):
        caller.stuck = True
        raise _NoAnswer
    ok, value = outcome[0]
    if ok:
        return value
    if time.monotonic() - started > seconds:
        # its client gave up on the server after our bound (the scale test's wire client waits 5 s for a stopped
        # server to confirm a cancelled wait), and that failure must not read as the wait's own timeout: that made
        # ranks waiting for rank 0 name rank 0 missing while the store was stopped (CI of e2167aa)
        raise _NoAnswer
    raise value


class CheckedStore:
    """A store seen through one namespace, every call checked and bounded: keys are given relative to
    ``namespace``; a failure names the operation and the full key (any store, c10d or Ray, may raise anything);
    with a ``deadline``, every call returns by what is left of it plus ``grace`` seconds, whatever the store's own
    timeout (set for each call and restored after) and even when its server stopped answering."""

    def __init__(self, store: Store, namespace: str, deadline: Optional[Deadline] = None, *,
                 grace: float = 0.0) -> None:
        self.raw = store
        self.namespace = namespace
        self.deadline = deadline
        self.grace = grace

    def key(self, relative: str) -> str:
        return f"{self.namespace}/{relative}" if self.namespace else relative

    def child(self, relative: str) -> "CheckedStore":
        """The same store under ``<namespace>/<relative>``, with the same bound."""
        return CheckedStore(self.raw, self.key(relative), self.deadline, grace=self.grace)

    def bound(self) -> Optional[float]:
        """Seconds the next call may take; None without a deadline."""
        return None if self.deadline is None else self.deadline.remaining(self.grace)

    def _call(self, what: str, relative: str, fn: Callable[[], Any], *, within: Optional[float] = None,
              timeout_is_an_answer: bool = False) -> Any:
        """Runs one store call. ``within``: a shorter bound for this call (a wait's own length). With
        ``timeout_is_an_answer``, a call that times out returns _TIMED_OUT instead of raising."""
        key = self.key(relative)
        bound = self.bound()
        seconds = bound if within is None else (within if bound is None else min(within, bound))
        started = time.monotonic()
        try:
            if seconds is None:
                return fn()
            if seconds <= 0:
                if timeout_is_an_answer:
                    return _TIMED_OUT
                raise StoreDeadlineError(
                    f"no time was left of the deadline for store.{what}({key!r}) in gpuguard's cross-rank check",
                    store_operation=what, key=key)
            with _store_timeout(self.raw, seconds):
                return _call_within(fn, seconds + ABANDON_AFTER_S)
        except GpuGuardError as exc:
            if timeout_is_an_answer and seconds and _looks_like_a_timeout(exc, time.monotonic() - started, seconds):
                return _TIMED_OUT
            raise
        except _NoAnswer:  # the call never returned: the store's server does not answer at all
            raise _not_answering(what, key, seconds) from None
        except Exception as exc:  # noqa: BLE001 - any store (c10d, Ray) may raise anything
            timed_out = bool(seconds) and _looks_like_a_timeout(exc, time.monotonic() - started, seconds or 0.0)
            if timeout_is_an_answer and timed_out:
                return _TIMED_OUT
            if timed_out and what in _NEVER_WAITS:
                # its client kept to the timeout set above (the scale test's wire client, Ray's store): a call that
                # waits for no key and got no answer in it got none from the server (CI of 199ddea: a rank's
                # compare_set on a stopped store said "TimeoutError: timed out", naming no cause)
                raise _unanswered(what, key, seconds or 0.0) from exc
            raise GpuGuardError(f"store.{what}({key!r}) failed during gpuguard's cross-rank check: "
                                f"{type(exc).__name__}: {exc}", store_operation=what, key=key) from exc

    def set(self, relative: str, value: bytes) -> None:
        key = self.key(relative)
        self._call("set", relative, lambda: self.raw.set(key, value))

    def get(self, relative: str) -> bytes:
        """The value of a key that exists (a missing one waits, bounded like every call)."""
        key = self.key(relative)
        return bytes(self._call("get", relative, lambda: self.raw.get(key)))

    def add(self, relative: str, amount: int) -> int:
        key = self.key(relative)
        try:
            return int(self._call("add", relative, lambda: self.raw.add(key, amount)))
        except StoreDeadlineError:
            raise
        except GpuGuardError as exc:
            found = self._not_a_counter(relative)
            if found is None:
                raise
            raise GpuGuardError(
                f"the store key {key!r} holds {found[:60]!r}, not a counter (a decimal integer), so "
                f"store.add() on it failed during gpuguard's cross-rank check: another program, or a different "
                f"gpuguard version, wrote it. Use a store (or a prefix) of the job's own for gpuguard"
                f"{'; the store server closed this client connection over it' if _connection_closed(exc) else ''}.",
                store_operation="add", key=key, value=found[:200].decode("utf-8", "replace")) from exc

    def _not_a_counter(self, relative: str) -> Optional[bytes]:
        """After a failed ``add``: the key's value when it is not a decimal integer (c10d's server cannot add to
        it and drops the connection, so it is read through a new client when the store can make one)."""
        key = self.key(relative)
        try:
            reader = self._call("clone", relative, lambda: _second_client(self.raw))
            value = bytes(self._call("get", relative, lambda: reader.get(key), within=1.0))
        except GpuGuardError:
            return None
        try:
            int(value.decode("ascii").strip())
            return None
        except (UnicodeDecodeError, ValueError):
            return value

    def counter(self, relative: str) -> int:
        """The value of a counter without changing it (``add`` of 0, as c10d offers no plain read)."""
        return self.add(relative, 0)

    def compare_set(self, relative: str, expected: bytes, desired: bytes) -> bytes:
        key = self.key(relative)
        return bytes(self._call("compare_set", relative, lambda: self.raw.compare_set(key, expected, desired)))

    def delete(self, relative: str) -> None:
        """Removes a key where the store can (``delete_key``); a store that cannot keeps it."""
        key = self.key(relative)
        delete_key = getattr(self.raw, "delete_key", None)
        if callable(delete_key):
            self._call("delete_key", relative, lambda: delete_key(key))

    def has(self, *relatives: str) -> bool:
        """True when every key exists; never blocks."""
        keys = [self.key(r) for r in relatives]
        return bool(self._call("check", relatives[0], lambda: self.raw.check(keys)))

    def wait_for(self, relative: str, seconds: float) -> bool:
        """True when the key exists within ``seconds`` (and the deadline); False on timeout. Other store failures
        raise."""
        if seconds <= 0:
            return self._last_look(relative)
        key = self.key(relative)
        got = self._call("wait", relative, lambda: self.raw.wait([key], datetime.timedelta(seconds=seconds)),
                         within=seconds, timeout_is_an_answer=True)
        return got is not _TIMED_OUT or self._last_look(relative)

    def wait_get(self, relative: str, seconds: float) -> Optional[bytes]:
        """The key's value once it exists, waiting at most ``seconds`` (and the deadline); None when it does not
        exist by then. One ``get`` where the store's timeout can be set (the wait is the get's own), else a wait
        and a get."""
        if not _settable_timeout(self.raw):
            return self.get(relative) if self.wait_for(relative, seconds) else None
        key = self.key(relative)
        while True:
            started = time.monotonic()
            got = self._call("get", relative, lambda: self.raw.get(key), within=max(seconds, 0.0),
                             timeout_is_an_answer=True)
            if got is not _TIMED_OUT:
                return bytes(got)
            seconds -= time.monotonic() - started
            # another thread sharing this store object may have shortened the timeout under this get
            if seconds <= MIN_OP_TIMEOUT_S or (self.bound() or 0) <= MIN_OP_TIMEOUT_S:
                return self.get(relative) if self._last_look(relative) else None

    def _last_look(self, relative: str) -> bool:
        """Whether the key exists, at the end of a wait for it: False when no time is left of the deadline to
        look. Running out there is the wait's answer (the caller names who never wrote the key), not a failure of
        the store (CI of 054b1f9: rank 0, serving the store, started 39 s after rank 4, whose wait for ``lead``
        then ended in StoreDeadlineError "no time was left ... store.check" instead of naming rank 0). A look the
        store does not answer in the time there is raises StoreDeadlineError, naming the store as not answering when
        a second or more was left (_unanswered)."""
        bound = self.bound()
        if bound is not None and bound <= MIN_OP_TIMEOUT_S:
            return False
        key = self.key(relative)
        found = self._call("check", relative, lambda: self.raw.check([key]), timeout_is_an_answer=True)
        if found is _TIMED_OUT:
            # a check never waits for the key: unanswered for all that was left of the deadline and its grace, the
            # store's server is not answering at all, and the wait before it ran out for that reason, not for a
            # rank that never wrote the key (the scale test of a store stopped past the deadline, whose ranks
            # waiting for rank 0 named rank 0 missing: CI of e2167aa); with under a second left, a live server may
            # just be slow, and the error says that the deadline ran out
            raise _unanswered("check", key, bound or 0.0)
        return bool(found)


#: The calls that never wait for a key to appear: one that times out was not answered at all.
_NEVER_WAITS = frozenset({"set", "add", "compare_set", "check", "delete_key"})
#: Below this many seconds left of the deadline, a call that timed out says that the deadline ran out, not that the
#: store's server is stopped: a live server on a loaded machine can take that long to answer.
_SILENCE_NAMES_THE_SERVER_S = 1.0


def _unanswered(what: str, key: str, seconds: float) -> "StoreDeadlineError":
    """The error of a call that waits for no key and timed out after ``seconds``, the rest of the deadline."""
    if seconds >= _SILENCE_NAMES_THE_SERVER_S:
        return _not_answering(what, key, seconds)
    return StoreDeadlineError(
        f"the deadline of gpuguard's cross-rank check ran out during store.{what}({key!r}), which got no answer in "
        f"the {seconds:.2f} s that were left of it", store_operation=what, key=key)


def _not_answering(what: str, key: str, seconds: float) -> "StoreDeadlineError":
    """The error of a store call that got no answer within ``seconds``."""
    return StoreDeadlineError(
        f"the store did not answer store.{what}({key!r}) within {seconds:.1f} s (what was left of the deadline) "
        f"during gpuguard's cross-rank check: the process serving it is stopped, hung or unreachable (under env:// "
        f"that is rank 0; under torchrun, the agent of the first node)", store_operation=what, key=key)


def _connection_closed(exc: BaseException) -> bool:
    text = str(exc).lower()
    return "connection" in text and ("closed" in text or "reset" in text or "shutdown" in text)


#: What a call that timed out returns when timing out is an answer (wait_for, wait_get).
_TIMED_OUT = object()


# ---- one client per concurrent check ------------------------------------------------------------------------

_leases_lock = threading.Lock()
_leases: dict[int, int] = {}  # id(store) -> checks using that store object now, in this process


@contextlib.contextmanager
def own_client(store: Store) -> Iterator[Store]:
    """The store a check should use: ``store`` itself, or, when another check of this process is using that same
    object right now (threads calling bind() over one shared client), a client of its own (``store.clone()``,
    torch >= 2.8; a new client of a bare TCPStore before that). A c10d client runs one request at a time, so a
    thread blocked in its wait for the verdict would otherwise hold back the others' publishing until the
    deadline. A store that allows neither (a PrefixStore before torch 2.8, a store of the user's without clone)
    is shared as it is, and its calls take turns: there, give each thread a client of its own."""
    with _leases_lock:
        users = _leases.get(id(store), 0)
        _leases[id(store)] = users + 1
    try:
        yield _second_client(store) if users else store
    finally:
        with _leases_lock:
            _leases[id(store)] -= 1
            if not _leases[id(store)]:
                del _leases[id(store)]


_TCP_CONSTRUCTION = threading.RLock()  # a wrapper's clone() may call tcp_client() itself


def tcp_client(host: str, port: int, timeout: float) -> Any:
    """A ``torch.distributed.TCPStore`` client, built one at a time in this process. c10d's binding constructs a
    TCPStore with the GIL released, and pybind11 registers the new Python object inside that call, so two built at
    once from two threads can corrupt pybind11's instance registry (seen on torch 2.6 with pybind11 2.13: the process
    aborts later with "pybind11_object_dealloc(): Tried to deallocate unregistered instance!"). gpuguard builds
    its second clients on helper threads, so it serialises its own constructions here."""
    import torch.distributed as dist

    with _TCP_CONSTRUCTION:
        return dist.TCPStore(host, port, is_master=False, timeout=datetime.timedelta(seconds=timeout),
                             wait_for_workers=False)


def _second_client(store: Store) -> Store:
    clone = getattr(store, "clone", None)
    try:
        if callable(clone):
            with _TCP_CONSTRUCTION:  # TCPStore.clone() and a wrapper's may construct a TCPStore
                return clone()  # type: ignore[no-any-return]
        host, port = getattr(store, "host", None), getattr(store, "port", None)
        if isinstance(host, str) and isinstance(port, int) and "torch" in sys.modules:  # TCPStore, torch < 2.8
            import torch.distributed as dist

            if isinstance(store, dist.TCPStore):
                return tcp_client(host, port, store.timeout.total_seconds())  # type: ignore[no-any-return]
    except Exception:  # noqa: BLE001 - no second client: share the one there is (its calls then take turns)
        pass
    return store


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

        tcp = tcp_client(host, port_number, timeout)
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


def tcp_init_address(init_method: str) -> Optional[tuple[str, int]]:
    """(host, port) of an ``init_method="tcp://host:port"`` (torch's tcp:// rendezvous, where rank 0 serves a
    TCPStore there), else None. A tcp:// URL torch would refuse (no port) is left to torch to refuse."""
    from urllib.parse import urlparse

    if not isinstance(init_method, str) or not init_method.startswith("tcp://"):
        return None
    try:
        url = urlparse(init_method)
        port = url.port
    except ValueError:
        return None
    return (url.hostname, port) if url.hostname and port else None


def env_store_for_init(rank: int, world_size: int, timeout: float,
                       address: Optional[tuple[str, int]] = None) -> Optional[Store]:
    """For ``gpuguard.init_process_group`` under env:// without torchrun (srun, mpirun, plain variables): the
    TCPStore torch's env:// rendezvous would create (rank 0 serves it on MASTER_ADDR:MASTER_PORT), created
    here so that bind() can meet the other ranks through it first; it is then handed to torch as ``store=``,
    so ``timeout`` is the store's own timeout for torch's later use. None where there is nothing to create:
    one process, torchrun's agent store, or no MASTER_ADDR/MASTER_PORT. ``address``: a tcp:// init method's
    host and port (tcp_init_address), where torch's tcp:// rendezvous would serve the same store.
    """
    if world_size <= 1 or (address is None and _uses_agent_store()):
        return None
    if address is not None:
        host, port_number = address
    else:
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
                            f"{host}:{port_number} ("
                            f"{'MASTER_ADDR/MASTER_PORT' if address is None else 'init_method tcp://'}): {exc}",
                            host=host,
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
