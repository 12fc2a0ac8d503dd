"""The cross-rank placement check: the store exchange (threads, each with its own TCPStore client), its
verdicts and messages, the 1,024-rank simulation, and bind() end to end under a real torchrun."""

from __future__ import annotations

import datetime
import json
import logging
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
import zlib
from pathlib import Path
from typing import Any, Callable, Optional

import pytest
import torch.distributed as dist

from gg_testing import launch
from gg_testing.env import scrubbed
from gg_testing.launch import write
from gg_testing.paths import TOPOLOGIES
from gg_testing.ports import free_port
from gg_testing.procs import wait_until

from gpuguard import DuplicateDeviceError, GpuGuardError, RankMappingError, RendezvousTimeoutError
from gpuguard.deadline import Deadline
from gpuguard.logs import explain
from gpuguard.placement import RankIdentity, Verdict, exchange, find_store, raise_for, run_namespace
from gpuguard.placement.exchange import TIMEOUT_GRACE_S
from gpuguard.placement import stores
from gpuguard.placement.stores import ABANDON_AFTER_S, CheckedStore, StoreDeadlineError, _Caller, tcp_client


@pytest.fixture
def master():
    store = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False,
                          timeout=datetime.timedelta(seconds=60))
    yield store


def client(master, timeout: float = 60) -> dist.TCPStore:
    """A client of its own, built as gpuguard builds its second clients: one at a time (see stores.tcp_client).
    Build them before starting threads. (A construction that takes 5 s is torch's client asking DNS for its
    peer's name: scripts/test.sh sets RES_OPTIONS against that.)"""
    return tcp_client("127.0.0.1", master.port, timeout)


class CountingStore:
    """A Store wrapper that counts the operations that reach the store server, to prove the per-rank cost does
    not grow with the job (the store's timeout, a local setting, passes through uncounted)."""

    OPERATIONS = {"set", "get", "add", "check", "wait", "compare_set", "delete_key", "multi_get"}

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.ops = 0

    def __getattr__(self, name: str) -> Any:
        attribute = getattr(self.inner, name)
        if name not in self.OPERATIONS:
            return attribute

        def counted(*args: Any) -> Any:
            self.ops += 1
            return attribute(*args)
        return counted

    @property
    def timeout(self) -> datetime.timedelta:
        return self.inner.timeout


def gpu_uuid(host: str, gpu: int) -> str:
    """A UUID per (host, GPU), so that GPUs of different hosts never collide by accident."""
    return f"GPU-{zlib.crc32(host.encode()):08x}-{gpu:04x}-4000-8000-1f2e3d4c5b60"


def ident(rank: int, world: int, gpu: int, *, host: str = "node-a", group: str = "default", gpus_on_host: int = 8,
          **fields: Any) -> RankIdentity:
    return RankIdentity(rank=rank, world_size=world, group=group, local_rank=rank % gpus_on_host,
                        host_hash=zlib.crc32(host.encode()) * 7919, hostname=host, gpu_uuid=gpu_uuid(host, gpu),
                        pci_bus_id=f"0000:{0x18 + gpu % 8:02x}:00.0", gpu_index=gpu % gpus_on_host,
                        pid=fields.pop("pid", 4000 + rank), visible_device_count=gpus_on_host, launcher="test",
                        **fields)


def run_ranks(master, identities: list[RankIdentity], *, namespace: str = "t", timeout: float = 60,
              delays: Optional[dict[int, float]] = None, wrap: Callable[[Any], Any] = lambda store: store,
              ) -> tuple[list[Verdict], list[int]]:
    """Runs exchange() for every identity on its own thread with its own TCPStore client (all connected first,
    here, one after another: see client()); returns the verdicts and op counts.
    ``delays``: seconds a rank (by index) waits after the barrier; ``wrap``: around each rank's store."""
    n = len(identities)
    stores = [CountingStore(wrap(client(master))) for _ in range(n)]
    verdicts: list[Optional[Verdict]] = [None] * n
    errors: list[BaseException] = []
    start = threading.Barrier(n)

    def rank(i: int) -> None:
        try:
            start.wait(timeout=120)
            time.sleep((delays or {}).get(i, 0.0))  # the test's fixed lateness of rank i is its subject
            verdicts[i] = exchange(stores[i], identities[i], namespace=namespace, deadline=Deadline(timeout))
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)
            start.abort()

    threads = [threading.Thread(target=rank, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout + 150)
    assert not errors, errors[:3]
    assert all(v is not None for v in verdicts)
    return verdicts, [s.ops for s in stores]  # type: ignore[misc]


# ---- records ---------------------------------------------------------------------------------------------------

def test_identity_round_trips_and_peers_bytes_are_checked():
    me = ident(3, 8, 3, cuda_visible_devices="3", gpu_fraction=0.5, ray_gpu_ids="3")
    assert RankIdentity.decode(me.encode()) == me
    with pytest.raises(ValueError, match="not a gpuguard identity record"):
        RankIdentity.decode(b'{"rank": 0}')
    with pytest.raises(ValueError, match="rank 9 is outside 0..7"):
        RankIdentity.decode(RankIdentity(rank=1, world_size=8).encode().replace(b"\x01\x00\x00\x00", b"\x09\x00\x00\x00", 1))
    with pytest.raises(GpuGuardError, match="could not describe rank 0 .* gpu_uuid must start with GPU- or MIG-"):
        RankIdentity(rank=0, world_size=1, gpu_uuid="nonsense", gpu_index=0).encode()


# ---- verdicts --------------------------------------------------------------------------------------------------

def test_distinct_gpus_pass_on_every_rank(master):
    verdicts, ops = run_ranks(master, [ident(r, 4, r) for r in range(4)])
    assert [v.kind for v in verdicts] == ["ok"] * 4
    # rank 0 leads (opens the epoch, composes); of the others, 8 operations each (the pid key included), 10
    # for the one that counts N
    followers = sorted(ops[1:])
    assert followers[0] == 8 and followers[-1] <= 10, ops
    assert ops[0] <= 15, ops


def test_two_ranks_on_one_gpu_every_rank_raises_the_same_report(master):
    identities = [ident(r, 4, [0, 0, 1, 2][r], gpus_on_host=1, host=f"node-{[0, 0, 1, 2][r]}") for r in range(4)]
    verdicts, _ = run_ranks(master, identities)
    assert {v.kind for v in verdicts} == {"duplicate"}
    assert len({v.message for v in verdicts}) == 1
    message = verdicts[0].message
    assert message.startswith("2 ranks of group 'default' share 1 GPU.")
    assert f"GPU {gpu_uuid('node-0', 0)} (PCI 0000:18:00.0) is shared by ranks 0 and 1:" in message
    assert "2 processes on a host with 1 GPU (node-0 runs 2 ranks" in message
    raised = []
    for me, v in zip(identities, verdicts):
        with pytest.raises(DuplicateDeviceError) as info:
            raise_for(v, me)
        raised.append(info.value)
    assert {str(e) for e in raised} == {message}
    assert raised[3].details["shared"][0]["ranks"] == [0, 1]  # structured, on a rank not involved too
    assert raised[3].details["causes"] == ["more_ranks_than_gpus"]


def test_a_failed_rank_stops_the_others_at_once_naming_it(master):
    failed = ident(2, 4, 2, failure_kind="RankMappingError",
                   failure_text="Rank 2 has local rank 2 but this host shows 2 GPUs")
    identities = [ident(0, 4, 0), ident(1, 4, 1), failed]  # rank 3 never comes: the failure must not wait for it
    verdicts, _ = run_ranks(master, identities, timeout=120)
    assert {v.kind for v in verdicts} == {"failure"}
    message = verdicts[0].message
    assert message.startswith("rank 2 (host node-a, pid 4002) could not bind a GPU, so every rank of group "
                              "'default' stops here instead of waiting for it:")
    assert "RankMappingError: Rank 2 has local rank 2 but this host shows 2 GPUs" in message
    with pytest.raises(RankMappingError, match="rank 2 .* could not bind a GPU") as info:
        raise_for(verdicts[0], identities[0])
    assert info.value.details["peer_failure"] is True and info.value.details["failed_rank"] == 2
    own = RankMappingError("own message")
    with pytest.raises(RankMappingError, match="own message"):  # the failed rank raises its own error
        raise_for(verdicts[2], failed, own)


def test_a_rank_that_never_arrives_is_named_in_the_timeout(master):
    verdicts, _ = run_ranks(master, [ident(r, 4, r) for r in (0, 1, 3)], timeout=1.0)
    assert {v.kind for v in verdicts} == {"timeout"}
    assert len({v.message for v in verdicts}) == 1
    assert verdicts[0].message.startswith(
        "rank 2 of group 'default' did not reach gpuguard's placement check within 1 s (3 of 4 arrived).")
    assert ("A rank that never arrived exited, crashed or hangs before gpuguard.bind() (its own log says why), was "
            "never started (check the launcher's process count), or started more than 1 s after the others") \
        in verdicts[0].message
    with pytest.raises(RendezvousTimeoutError) as info:
        raise_for(verdicts[0], ident(0, 4, 0))
    assert info.value.details["missing_ranks"] == [2]


def test_a_whole_node_that_never_arrives_is_named_as_a_node(master):
    nodes = {r: ident(r, 16, r % 8, host="node-b" if r >= 8 else "node-a", local_world_size=8) for r in range(16)}
    verdicts, _ = run_ranks(master, [nodes[r] for r in range(8)], timeout=1.0)
    message = verdicts[0].message
    assert message.startswith(
        "ranks 8, 9, 10, 11, 12, 13, 14, 15 of group 'default' did not reach gpuguard's placement check within 1 s "
        "(8 of 16 arrived). Ranks 8-15 are all the ranks of one node if the launcher placed 8 consecutive ranks per "
        "node (torchrun does, and so does srun's default block distribution): that node is then down or "
        "unreachable, or the launcher never started the job there (its log for that node says which)."), message
    assert verdicts[0].details["missing_nodes"] == [[8, 15]]
    # a node's ranks, some of which arrived, are ranks, not a node
    verdicts, _ = run_ranks(master, [nodes[r] for r in range(12)], namespace="t2", timeout=1.0)
    assert "missing_nodes" not in verdicts[0].details and "one node" not in verdicts[0].message


def test_a_late_rank_is_told_it_came_late_not_that_it_never_arrived(master):
    verdicts, _ = run_ranks(master, [ident(r, 4, r) for r in (0, 1, 3)], timeout=1.0)
    assert verdicts[0].details["never_arrived"] == [2]
    late = ident(2, 4, 2)  # starts after the others gave up, with a timeout of its own
    verdict = exchange(client(master), late, namespace="t", deadline=Deadline(1.0))
    with pytest.raises(RendezvousTimeoutError) as info:
        raise_for(verdict, late)
    message = str(info.value)
    assert message.startswith("this rank (2) of group 'default' reached gpuguard's placement check after the other "
                              "ranks had stopped waiting for it (their 1 s timeout passed first), so the check "
                              "ended without it: it started late, or was slowed down before bind()."), message
    assert "The other ranks' report:\n  rank 2 of group 'default' did not reach" in message


# ---- a store that outlives a run: every run has an epoch of its own ---------------------------------------------

EARLIER = "0123456789abcdef"  # the epoch an earlier run left


def leave_earlier_run(master, base: str, *, ranks: list[RankIdentity], arrived: int,
                      verdict: Optional[Verdict] = None) -> None:
    """What an earlier run that used the same base left in the store: ``lead`` naming its epoch, the records of
    the ranks that came, its arrival count (here and where gpuguard before epochs counted, under the base itself)
    and its verdict."""
    c = client(master)
    c.set(f"{base}/lead", EARLIER.encode())
    for key in (f"{base}/arrived", f"{base}/epoch/{EARLIER}/arrived"):
        c.add(key, arrived)
    for me in ranks:
        c.set(f"{base}/rec/{me.rank}", me.encode())
        c.set(f"{base}/epoch/{EARLIER}/rec/{me.rank}", me.encode())
    if verdict is not None:
        c.set(f"{base}/verdict", verdict.encode())
        c.set(f"{base}/epoch/{EARLIER}/verdict", verdict.encode())


def two_on_gpu0(world: int = 4) -> list[RankIdentity]:
    """Ranks 0 and 1 share GPU 0 (one process per GPU otherwise): a duplicate every rank must be told of."""
    return [ident(r, world, max(r - 1, 0), pid=5000 + r) for r in range(world)]


def assert_every_rank_sees_the_duplicate(verdicts: list[Verdict]) -> None:
    assert [v.kind for v in verdicts] == ["duplicate"] * len(verdicts), [(v.kind, v.message[:200]) for v in verdicts]
    assert "is shared by ranks 0 and 1:" in verdicts[0].message


def test_a_second_run_on_the_same_store_never_takes_the_first_runs_verdict(master):
    """No run id (plain RANK/WORLD_SIZE, bind(rank=, ...) under torch.multiprocessing.spawn): the namespace
    repeats from run to run. Run 1 passes on 4 GPUs; run 2 puts ranks 0 and 1 on GPU 0 and must not pass."""
    first, _ = run_ranks(master, [ident(r, 4, r) for r in range(4)], namespace="reused")
    assert [v.kind for v in first] == ["ok"] * 4
    second, _ = run_ranks(master, two_on_gpu0(), namespace="reused")
    assert_every_rank_sees_the_duplicate(second)


class CannotDelete:
    """A store without delete_key (the Store protocol does not require it): an earlier run's ``lead`` stays."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner

    def __getattr__(self, name: str) -> Any:
        if name == "delete_key":
            raise AttributeError(name)
        return getattr(self.inner, name)

    @property
    def timeout(self) -> datetime.timedelta:
        return self.inner.timeout


def test_ranks_that_find_an_earlier_runs_epoch_are_sent_to_this_ones(master):
    """The earlier run's ``lead`` is still there when this run's ranks come, before their rank 0 (late by 1 s):
    they land in the earlier epoch, find their slot taken or the count past N, and follow ``next``."""
    first, _ = run_ranks(master, [ident(r, 4, r) for r in range(4)], namespace="kept", wrap=CannotDelete)
    assert [v.kind for v in first] == ["ok"] * 4
    second, _ = run_ranks(master, two_on_gpu0(), namespace="kept", wrap=CannotDelete, delays={0: 1.0})
    assert_every_rank_sees_the_duplicate(second)


@pytest.mark.parametrize("earlier", ["complete", "smaller", "crashed", "counter_only"])
def test_what_an_earlier_run_left_never_passes_a_duplicate(master, earlier):
    """Keys seeded as an earlier run leaves them (or a pre-filled arrival counter), found by this run's ranks
    before their rank 0 opens this run's epoch: complete (all 4 arrived, "ok"), smaller (a run of 2 ranks,
    "ok"), crashed (2 of 4 arrived, then a timeout verdict), counter_only (an arrival counter of 2, nothing
    else). Every rank must still see the duplicate."""
    base = f"seeded-{earlier}"
    ok4, ok2 = Verdict("ok", details={"world_size": 4}), Verdict("ok", details={"world_size": 2})
    timed_out = Verdict("timeout", "rank 2, 3 never came", {"never_arrived": [2, 3], "missing_ranks": [2, 3]})
    if earlier == "complete":
        leave_earlier_run(master, base, ranks=[ident(r, 4, r, pid=900 + r) for r in range(4)], arrived=4,
                          verdict=ok4)
    elif earlier == "smaller":
        leave_earlier_run(master, base, ranks=[ident(r, 2, r, pid=900 + r) for r in range(2)], arrived=2,
                          verdict=ok2)
    elif earlier == "crashed":
        leave_earlier_run(master, base, ranks=[ident(r, 4, r, pid=900 + r) for r in range(2)], arrived=2,
                          verdict=timed_out)
    else:
        leave_earlier_run(master, base, ranks=[], arrived=2)
    verdicts, _ = run_ranks(master, two_on_gpu0(), namespace=base, timeout=30, delays={0: 1.0})
    assert_every_rank_sees_the_duplicate(verdicts)


def test_a_counter_another_program_wrote_is_named_not_taken_for_a_crash(master):
    """A foreign writer puts text where the arrival counter goes: c10d's server drops the connection of a
    client that adds to it, which c10d reports as "Did the remote server shutdown or crash?"."""

    class ForgesTheCounter(ForeignWriter):
        def compare_set(self, key: str, expected: bytes, desired: bytes) -> bytes:
            if "/rec/" in key:  # right as this rank arrives, in whatever namespace it arrives in
                self.inner.set(key.rsplit("/rec/", 1)[0] + "/arrived", b"garbage")
            return self.inner.compare_set(key, expected, desired)

    with pytest.raises(GpuGuardError) as info:
        exchange(ForgesTheCounter(client(master), {}), ident(0, 1, 0), namespace="forged", deadline=Deadline(10))
    message = str(info.value)
    assert re.match(r"the store key 'forged/epoch/[0-9a-f]{16}/arrived' holds b'garbage', not a counter \(a "
                    r"decimal integer\), so store.add\(\) on it failed during gpuguard's cross-rank check: another "
                    r"program, or a different gpuguard version, wrote it\.", message), message
    assert "remote server shutdown or crash" not in message


def test_threads_sharing_one_store_client_meet_at_once(master):
    """Four threads of one process call exchange() over one TCPStore client: a thread blocked in its wait for
    the verdict must not hold back the others' publishing until the deadline."""
    shared = client(master)
    verdicts: dict[int, Verdict] = {}
    namespace = run_namespace("threads", rank=0)

    def rank(r: int) -> None:
        verdicts[r] = exchange(shared, ident(r, 4, r), namespace=namespace, deadline=Deadline(30))

    started = time.monotonic()
    threads = [threading.Thread(target=rank, args=(r,)) for r in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert [verdicts[r].kind for r in range(4)] == ["ok"] * 4
    assert time.monotonic() - started < 10, "the threads waited for one another until the deadline"


class TcpStoreWrapper:
    """A test's wrapper of a TCPStore client (``inner``): everything it does not override goes to ``inner``, and
    clone() connects anew to the same server, as TCPStore.clone() does on torch >= 2.8 (the wrapper hides that its
    store is a TCPStore, which gpuguard would otherwise reconnect to itself on an older torch)."""

    inner: Any

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    @property
    def timeout(self) -> datetime.timedelta:
        return self.inner.timeout

    def clone(self) -> dist.TCPStore:
        return tcp_client(self.inner.host, self.inner.port, self.inner.timeout.total_seconds())


class SlowAfter(TcpStoreWrapper):
    """A rank's store that stalls ``seconds`` right after an ``add`` on a key ending in ``suffix``."""

    def __init__(self, inner: Any, suffix: str, seconds: float) -> None:
        self.inner, self.suffix, self.seconds = inner, suffix, seconds

    def add(self, key: str, amount: int) -> int:
        value = self.inner.add(key, amount)
        if key.endswith(self.suffix):
            time.sleep(self.seconds)  # the stall is the subject: a store call held this long
        return value


class SignalsClaim(TcpStoreWrapper):
    """A rank's store that sets ``claimed`` once this rank's claim of a GPU (compare_set of its ``owner``) returned."""

    def __init__(self, inner: Any, claimed: threading.Event) -> None:
        self.inner, self.claimed = inner, claimed

    def compare_set(self, key: str, expected: Any, desired: Any) -> Any:
        value = self.inner.compare_set(key, expected, desired)
        if key.endswith("/owner"):
            self.claimed.set()
        return value


@pytest.mark.wall_clock  # the call must end by the deadline + its grace: timed at normal priority in CI
def test_a_store_with_a_longer_timeout_never_holds_a_rank_past_the_deadline(master):
    """The issue's case: stores made with a 24 s timeout, a 3 s deadline, an arrival counter someone pre-filled
    where gpuguard used to count, and the second rank on GPU 0 stalled between listing its GPU as shared and
    writing the entry: the rank that then composed blocked 24 s in store.get(.../shared/0)."""
    leave_earlier_run(master, "held", ranks=[], arrived=1)
    long_timeout = datetime.timedelta(seconds=24)
    stores = {r: client(master, long_timeout.total_seconds()) for r in (0, 1)}
    stores[1] = SlowAfter(stores[1], "/shared/n", 6.0)
    claimed = threading.Event()
    stores[0] = SignalsClaim(stores[0], claimed)
    outcome: dict[int, tuple[Verdict, float]] = {}

    def rank(r: int) -> None:
        started = time.monotonic()
        if r == 1:  # rank 0 takes GPU 0 first; rank 1 then finds it taken and lists it as shared
            assert claimed.wait(10), "rank 0 never claimed GPU 0"
        verdict = exchange(stores[r], ident(r, 2, 0, gpus_on_host=1), namespace="held", deadline=Deadline(3))
        outcome[r] = (verdict, time.monotonic() - started)

    threads = [threading.Thread(target=rank, args=(r,)) for r in (0, 1)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    for r in (0, 1):
        verdict, elapsed = outcome[r]
        assert elapsed <= 3 + TIMEOUT_GRACE_S + 0.5, (r, elapsed)
        assert verdict.kind == "timeout" and verdict.details["silent_ranks"] == [1], (r, verdict)
    assert stores[0].timeout == long_timeout  # the user's timeout is put back


STORE_SERVER = """
import sys, time, datetime, torch.distributed as dist
server = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
print(server.port, flush=True)
time.sleep(300)
"""


@pytest.mark.wall_clock  # the call must end by the deadline + its grace: timed at normal priority in CI
def test_a_store_whose_server_stops_answering_ends_the_call_by_the_deadline():
    """The process serving the store is stopped (SIGSTOP: rank 0 under env://, in a debugger, swapped out):
    c10d's client then blocks in a call even past its own timeout; the exchange leaves that call behind."""
    server = subprocess.Popen([sys.executable, "-c", STORE_SERVER], stdout=subprocess.PIPE, text=True)
    try:
        port = int(server.stdout.readline())
        store = dist.TCPStore("127.0.0.1", port, is_master=False, timeout=datetime.timedelta(seconds=60))
        os.kill(server.pid, signal.SIGSTOP)
        wait_until(lambda: Path(f"/proc/{server.pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "T", 10)
        started = time.monotonic()
        with pytest.raises(RendezvousTimeoutError) as info:
            exchange(store, ident(1, 2, 1), namespace="stopped", deadline=Deadline(2))
        assert time.monotonic() - started <= 2 + TIMEOUT_GRACE_S + ABANDON_AFTER_S + 0.5
        assert re.match(r"the store did not answer store\.get\('stopped/lead'\) within [0-9.]+ s \(what was left "
                        r"of the deadline\) during gpuguard's cross-rank check: the process serving it is stopped, "
                        r"hung or unreachable", str(info.value)), str(info.value)
    finally:
        server.kill()
        server.wait()
        server.stdout.close()


class SilentStore:
    """A store client whose server stopped answering, where the client keeps to its own timeout (the scale test's
    wire client, Ray's store): every call waits out the timeout, then raises that it timed out."""

    def __init__(self) -> None:
        self.timeout = datetime.timedelta(seconds=60)

    def set_timeout(self, timeout: datetime.timedelta) -> None:
        self.timeout = timeout

    def _silent(self, *args: Any) -> Any:
        time.sleep(self.timeout.total_seconds())
        raise RuntimeError("timed out waiting for the store server's answer")

    get = set = add = compare_set = check = wait = _silent


@pytest.mark.wall_clock  # the call must end by the deadline + its grace + ABANDON_AFTER_S: timed in CI's timed lane
def test_a_silent_store_whose_client_times_out_is_named_not_a_missing_rank_0():
    """Rank 1 waits for rank 0's ``lead`` on a store that answers nothing. Its wait times out at the deadline, which
    alone cannot tell a stopped server from a rank 0 that never came; the look after it, in the grace, asks the
    server a question it answers at once, and gets no answer either. Before, rank 1 named rank 0 missing (the scale
    test's stopped store, CI of e2167aa)."""
    started = time.monotonic()
    with pytest.raises(RendezvousTimeoutError) as info:
        exchange(SilentStore(), ident(1, 2, 1), namespace="silent", deadline=Deadline(1))
    assert time.monotonic() - started <= 1 + TIMEOUT_GRACE_S + ABANDON_AFTER_S + 0.5
    assert re.match(r"the store did not answer store\.check\('silent/lead'\) within [0-9.]+ s \(what was left of the "
                    r"deadline\) during gpuguard's cross-rank check: the process serving it is stopped, hung or "
                    r"unreachable", str(info.value)), str(info.value)


@pytest.mark.wall_clock  # each call waits out its bound: timed in CI's timed lane, where it ends within it
@pytest.mark.parametrize("what, args", [("compare_set", ("rec/3", b"", b"x")), ("set", ("rec/3", b"x")),
                                        ("add", ("rec/3", 1))], ids=["compare_set", "set", "add"])
def test_a_call_that_waits_for_no_key_and_times_out_names_the_silent_store(what, args):
    """A rank writing its record (compare_set, set, add) to a store that answers nothing, through a client that keeps
    to its timeout: the failure names the store as not answering. Before, it read "TimeoutError: timed out" and
    named no cause (CI of 199ddea: the scale test's store stopped past the deadline)."""
    store = CheckedStore(SilentStore(), "silent", Deadline(1.5))
    with pytest.raises(StoreDeadlineError) as info:
        getattr(store, what)(*args)
    assert re.match(rf"the store did not answer store\.{what}\('silent/rec/3'\) within 1\.[0-5] s \(what was left of "
                    r"the deadline\) during gpuguard's cross-rank check: the process serving it is stopped, hung or "
                    r"unreachable \(under env:// that is rank 0; under torchrun, the agent of the first node\)$",
                    str(info.value)), str(info.value)
    assert info.value.store_operation == what and info.value.key == "silent/rec/3"


@pytest.mark.wall_clock
def test_a_call_left_less_than_a_second_that_times_out_says_the_deadline_ran_out():
    """With under a second left of the deadline, a live server on a loaded machine may just be slow: the error says
    that the deadline ran out during the call, and blames no process."""
    store = CheckedStore(SilentStore(), "silent", Deadline(0.4))
    with pytest.raises(StoreDeadlineError) as info:
        store.compare_set("rec/3", b"", b"x")
    assert re.match(r"the deadline of gpuguard's cross-rank check ran out during store\.compare_set\('silent/rec/3'\), "
                    r"which got no answer in the 0\.[0-4]\d s that were left of it$", str(info.value)), str(info.value)


@pytest.mark.wall_clock
def test_a_last_look_left_less_than_a_second_that_times_out_says_the_deadline_ran_out():
    """The look for the key at the end of a wait (store.check) is such a call: with under a second left, its timing
    out blames no process either. Before, it said that the process serving the store was stopped or hung."""
    store = CheckedStore(SilentStore(), "silent", Deadline(0.6))
    with pytest.raises(StoreDeadlineError) as info:
        store.wait_for("lead", 0.2)
    assert re.match(r"the deadline of gpuguard's cross-rank check ran out during store\.check\('silent/lead'\), "
                    r"which got no answer in the 0\.[0-4]\d s that were left of it$", str(info.value)), str(info.value)


def test_a_store_call_that_failed_only_after_its_bound_did_not_answer_in_time(monkeypatch):
    """A loaded machine's caller may wake only after its bound to find the call done: a failure that came that late
    is the server's silence, not the store's answer (a timeout read as 'the key is not there')."""

    class WakesLate(threading.Event):
        def wait(self, timeout: Optional[float] = None) -> bool:
            return super().wait()  # wakes when the call is done, whatever the bound

    monkeypatch.setattr(stores.threading, "Event", WakesLate)

    def times_out_late() -> None:
        time.sleep(0.3)
        raise RuntimeError("timed out")

    with pytest.raises(stores._NoAnswer):
        stores._call_within(times_out_late, 0.1)
    assert stores._call_within(lambda: 7, 0.1) == 7  # an answer is an answer, however late it is read


def test_a_store_call_helper_made_long_before_its_first_call_still_serves_it(monkeypatch):
    """A rank's store calls run on a helper thread that ends after IDLE_S without work. 1,024 ranks' threads in one
    process share the GIL: one may get it back only seconds after it made its helper (the CI run of 6e355b4 on
    torch 2.6: rank threads of the thousand-rank test failed with the helper gone before their first call)."""
    monkeypatch.setattr(_Caller, "IDLE_S", 0.05)
    caller = _Caller()
    time.sleep(0.3)  # six times the idle time between making the helper and handing it its first call
    job = caller.submit(lambda: 42)
    assert job is not None
    outcome, done = job
    assert done.wait(10) and outcome == [(True, 42)]
    wait_until(lambda: not caller.alive, 10)  # idle once its work is done, it ends, and takes no more
    assert caller.submit(lambda: 1) is None


def test_every_store_call_keeps_to_the_deadline_whatever_the_stores_own_timeout(master):
    """A store made with a 24 s timeout, bind(timeout=3)-style deadline: rank 0 never comes, so the follower's
    read of ``lead`` must give up at the deadline; and the timeout the user gave the store is put back."""
    slow_store = client(master, 24)
    started = time.monotonic()
    verdict = exchange(slow_store, ident(1, 2, 1), namespace="deadline", deadline=Deadline(3))
    assert time.monotonic() - started < 3 + 1.0
    assert verdict.kind == "timeout"
    assert verdict.message.startswith("rank 0 of group 'default' did not reach gpuguard's placement check within 3 s")
    # the cause no log shows, and its fix: rank 0 may only be late (CI of 054b1f9: 39 s, importing torch)
    assert ("or started more than 3 s after this rank (importing torch on a loaded node can take that long: then "
            "give the check a longer deadline: bind(timeout=), init_process_group(bind_timeout=)") in verdict.message
    assert slow_store.timeout == datetime.timedelta(seconds=24)


def test_a_wait_that_outlasts_the_deadline_is_answered_not_raised(master):
    """The end of a wait for a key nobody wrote, with no time left of the deadline for its last look: no key
    (the caller then names the rank that never came), not StoreDeadlineError. CI of 054b1f9: rank 4 waited for
    ``lead`` while rank 0, serving the store, was still importing torch, and ended in "no time was left of the
    deadline for store.check(...)"."""
    store = CheckedStore(client(master), "last-look", Deadline(1.0))
    started = time.monotonic()
    assert store.wait_get("lead", 5.0) is None
    assert not store.wait_for("lead", 5.0)
    assert not store.wait_for("lead", 0.0)  # a wait of no length is its last look alone
    assert time.monotonic() - started < 1.0 + 2 * ABANDON_AFTER_S
    master.set("last-look/lead", b"epoch")  # a key that is there is still found, while time is left
    assert CheckedStore(client(master), "last-look", Deadline(5.0)).wait_get("lead", 5.0) == b"epoch"


def test_colocated_groups_pass_and_keep_to_their_own_keys(master):
    identities = [ident(r, 2, r, group=g) for g in ("actor", "critic") for r in range(2)]
    results: dict[str, list[Verdict]] = {}
    for g in ("actor", "critic"):
        mine = [i for i in identities if i.group == g]
        results[g], _ = run_ranks(master, mine, namespace=run_namespace(g))
    assert [v.kind for g in results for v in results[g]] == ["ok"] * 4


def test_multi_rank_gpu_mode_does_not_silence_a_true_duplicate(master):
    # NCCL_MULTI_RANK_GPU_ENABLE=1 switches NCCL's own check off: gpuguard is then the only thing that stops it
    identities = [ident(r, 2, 0, gpus_on_host=1, multi_rank_gpu_enabled=True) for r in range(2)]
    verdicts, _ = run_ranks(master, identities)
    assert {v.kind for v in verdicts} == {"duplicate"}
    with pytest.raises(DuplicateDeviceError) as err:
        raise_for(verdicts[0], identities[0])
    assert "NCCL_MULTI_RANK_GPU_ENABLE=1 is set on every rank involved: it turns off the check of NCCL 2.30 " \
        "and later" in str(err.value)
    assert "NCCL 2.29 and earlier, which have no such switch, stop them with \"Duplicate GPU detected\"" \
        in str(err.value)
    assert "gpuguard stops every rank all the same" in str(err.value)


class ForeignWriter(TcpStoreWrapper):
    """Another program writing into the epoch a check just opened, the moment its leader publishes it (the epoch
    is drawn at random, so nothing can be written there before): ``writes`` maps a key under the epoch to bytes."""

    def __init__(self, inner: Any, writes: dict[str, bytes]) -> None:
        self.inner = inner
        self.writes = writes

    def set(self, key: str, value: bytes) -> None:
        if key.endswith("/lead"):
            epoch = f"{key[:-len('lead')]}epoch/{value.decode()}"
            for relative, data in self.writes.items():
                self.inner.set(f"{epoch}/{relative}", data)
        self.inner.set(key, value)


def test_hostile_store_contents_give_a_clear_error_not_a_crash(master):
    uuid = gpu_uuid("node-a", 0)
    store = ForeignWriter(client(master), {f"dev/{uuid}/owner": b"\x00garbage"})  # the first slot of GPU 0
    verdict = exchange(store, ident(0, 1, 0), namespace="bad", deadline=Deadline(10))
    assert verdict.kind == "error"
    assert re.search(rf"the identity record at store key 'bad/epoch/[0-9a-f]{{16}}/dev/{uuid}/owner' is malformed",
                     verdict.message), verdict.message
    assert "bad magic" in verdict.message
    with pytest.raises(GpuGuardError, match=r"the placement verdict at store key 'bad2/epoch/[0-9a-f]{16}/verdict' "
                                            r"is malformed"):
        exchange(ForeignWriter(client(master), {"verdict": b"not json"}), ident(0, 1, 0), namespace="bad2",
                 deadline=Deadline(10))
    client(master).set("bad3/lead", b"garbage")
    with pytest.raises(GpuGuardError, match=r"the store key 'bad3/lead' holds b'garbage', not a gpuguard epoch"):
        exchange(client(master), ident(1, 2, 1), namespace="bad3", deadline=Deadline(10))


def test_namespaces_separate_calls_restarts_and_groups(monkeypatch):
    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "job-7")
    monkeypatch.setenv("TORCHELASTIC_RESTART_COUNT", "0")
    first, second = run_namespace("ns-test"), run_namespace("ns-test")
    assert first.startswith("gpuguard/v2/ns-test/job-7/0/") and first != second
    # calls are counted per rank: threads of one process binding ranks 0..3 all make their first check
    assert {run_namespace("ns-threads", rank=r) for r in range(4)} == {"gpuguard/v2/ns-threads/job-7/0/0"}
    monkeypatch.setenv("TORCHELASTIC_RESTART_COUNT", "1")
    assert "/job-7/1/" in run_namespace("ns-test")
    assert run_namespace("a/b").startswith("gpuguard/v2/a%2Fb/")  # a group cannot reach into another


def test_finding_the_store(monkeypatch):
    assert find_store(None, group="g", world_size=1, deadline=Deadline(1)) is None
    with pytest.raises(TypeError, match="store= must implement gpuguard.placement.stores.Store .* lacks"):
        find_store(object(), group="g", world_size=2, deadline=Deadline(1))
    for var in ("TORCHELASTIC_USE_AGENT_STORE", "MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.delenv(var, raising=False)
    with pytest.raises(GpuGuardError, match="found 4 ranks but no place where they can meet .* pass store="):
        find_store(None, group="g", world_size=4, deadline=Deadline(1))
    monkeypatch.setenv("TORCHELASTIC_USE_AGENT_STORE", "True")
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.setenv("MASTER_PORT", "http")
    with pytest.raises(GpuGuardError, match="MASTER_PORT='http' is not a port number"):
        find_store(None, group="g", world_size=4, deadline=Deadline(1))


def test_a_thousand_ranks_in_one_process_cost_constant_store_operations(master):
    """1,024 simulated ranks (128 hosts x 8 GPUs), each its own thread and TCPStore client. Three hosts start
    2 ranks per GPU on half their GPUs; every rank must get the same report naming all three hosts."""
    world = 1024
    identities = []
    for r in range(world):
        host, local = divmod(r, 8)
        gpu = local // 2 if host in (5, 77, 126) else local
        identities.append(ident(r, world, gpu, host=f"node-{host:03d}"))
    verdicts, ops = run_ranks(master, identities, namespace="sim", timeout=120)
    assert {v.kind for v in verdicts} == {"duplicate"}
    assert len({v.message for v in verdicts}) == 1
    message = verdicts[0].message
    assert message.startswith("24 ranks of group 'default' share 12 GPUs.")
    for host in ("node-005", "node-077", "node-126"):
        assert f"host {host}" in message
    assert "is shared by ranks 40 and 41:" in message
    # Per-rank cost: 8 operations on a GPU of its own, at most 18 for a rank that shares (13, plus counting
    # itself as having read a verdict that stops the job, plus 2 for the one that counts N and 2 for the last to
    # read it); only the leader, which writes the verdict, reads more, and that is bounded by the report's size,
    # not by the job's.
    assert max(ops[1:]) <= 18
    assert sorted(ops[1:])[0] == 9  # 8, plus counting itself as having read the duplicate verdict
    assert ops[0] <= 16 + 16 * 16 * 2 + 4


# ---- bind() under a real torchrun ------------------------------------------------------------------------------

TORCHRUN_WORKER = r"""
import os, sys
import gpuguard
from gg_testing.rank import write_result

mode = sys.argv[1]
rank = int(os.environ["RANK"])
result = {}

def attempt(name, **kwargs):
    try:
        result[name] = {"ok": str(gpuguard.bind(**kwargs))}
    except gpuguard.GpuGuardError as e:
        result[name] = {"error": type(e).__name__, "message": str(e), "details": {
            k: v for k, v in e.details.items() if isinstance(v, (int, str, list, bool, float))}}

if mode == "exit_early" and rank == 1:
    sys.exit(0)  # this rank never reaches bind(); torchrun keeps the others running
if mode == "sequence":
    import torch.distributed as dist
    attempt("before_init", timeout=60)                                # torchrun's agent store
    dist.init_process_group("gloo")
    attempt("after_init", group="after_init", timeout=60)             # the default process group's store
    attempt("nccl_ok", group="nccl_ok", verify_nccl=True, timeout=30)
    os.environ["GPUGUARD_FAKE_TOPOLOGY"] = os.environ["DUPLICATE_TOPOLOGY"]
    attempt("nccl_duplicate", group="nccl_duplicate", verify_nccl=True, timeout=30)
    os.environ["GPUGUARD_FAKE_TOPOLOGY"] = os.environ["HANG_TOPOLOGY"]
    attempt("nccl_hang", group="nccl_hang", verify_nccl=True, timeout=2)
    dist.destroy_process_group()
else:
    attempt("bind", timeout=float(os.environ.get("BIND_TIMEOUT", "60")))
write_result(result)
"""


def torchrun_job(fake_gpus, tmp_path, topology: str, nproc: int, mode: str, **env: str) -> launch.Finished:
    script = write(tmp_path, "worker.py", TORCHRUN_WORKER)
    full_env = scrubbed(fake_gpus.env(topology, GPUGUARD_FAKE_NCCL_DIR=str(tmp_path / "nccl"), **env))
    job = launch.torchrun(str(script), mode, nproc=nproc, env=full_env, workdir=tmp_path)
    assert job.returncode == 0, job.stderr[-4000:]
    return job


def torchrun(fake_gpus, tmp_path, topology: str, nproc: int, mode: str, **env: str) -> list[dict[str, Any]]:
    job = torchrun_job(fake_gpus, tmp_path, topology, nproc, mode, **env)
    return [job.ranks[r] for r in sorted(job.ranks)]


@pytest.mark.slow
def test_torchrun_two_processes_on_a_one_gpu_host_every_rank_raises(fake_gpus, tmp_path):
    ranks = torchrun(fake_gpus, tmp_path, "h100x1", 2, "bind")
    assert len(ranks) == 2
    errors = [r["bind"] for r in ranks]
    assert {e["error"] for e in errors} == {"DuplicateDeviceError"}
    assert errors[0]["message"] == errors[1]["message"]
    message = errors[0]["message"]
    uuid = fake_gpus.topology("h100x1")["gpus"][0]["uuid"]
    assert f"GPU {uuid} (PCI 0000:18:00.0) is shared by ranks 0 and 1:" in message
    assert "2 processes on a host with 1 GPU" in message
    assert "torchrun --nproc_per_node=1" in message
    assert "launcher torchrun" in message


@pytest.mark.slow
def test_torchrun_four_ranks_pass_before_and_after_init_and_verify_nccl(fake_gpus, tmp_path):
    job = torchrun_job(fake_gpus, tmp_path, "h100x4", 4, "sequence", NCCL_DEBUG="WARN",
                       DUPLICATE_TOPOLOGY=str(TOPOLOGIES / "h100x4_nccl_duplicate.json"),
                       HANG_TOPOLOGY=str(TOPOLOGIES / "h100x4_nccl_hang.json"))
    ranks = [job.ranks[r] for r in sorted(job.ranks)]
    assert len(ranks) == 4
    for r in ranks:
        assert "ok" in r["before_init"], r["before_init"]
        assert "ok" in r["after_init"], r["after_init"]
        assert "ok" in r["nccl_ok"], r["nccl_ok"]
    duplicate = [r["nccl_duplicate"] for r in ranks]
    assert {d["error"] for d in duplicate} == {"DuplicateDeviceError"}
    assert len({d["message"] for d in duplicate}) == 1
    assert "Duplicate GPU detected : rank 0 and rank 1 both on CUDA device 18000" in duplicate[0]["message"]
    assert "2 of 4 ranks failed" in duplicate[0]["message"]
    # NCCL_DEBUG=WARN: NCCL's own WARN line (the fake prints it as NCCL 2.28 did on the lent H200), which explain
    # reads as the pair on this host's GPU, once
    host = socket.gethostname().split(".")[0]
    warns = [line for line in job.output.splitlines() if " NCCL WARN Duplicate GPU detected : rank " in line]
    assert len(warns) == 2 and all(re.match(rf"^\[\d{{4}}-\d\d-\d\d \d\d:\d\d:\d\d\] {re.escape(host)}:\d+:\d+ \[\d\] "
                                            r"init\.cc:904 NCCL WARN ", w) for w in warns), job.tail()
    summary = explain("\n".join(warns), match_local=False)[0].summary
    assert summary.endswith(f": ranks 0, 1 share 0000:18:00.0 on host {host}."), summary
    hang = [r["nccl_hang"] for r in ranks]
    assert {h["error"] for h in hang} == {"RendezvousTimeoutError"}
    assert "NCCL did not form a communicator for group 'nccl_hang' within 2 s on 4 of 4 ranks; gpuguard " \
           "aborted it (ncclCommAbort)" in hang[0]["message"]
    assert hang[0]["details"]["aborted"] is True


@pytest.mark.slow
def test_torchrun_rank_that_exits_early_is_named_by_the_others(fake_gpus, tmp_path):
    ranks = torchrun(fake_gpus, tmp_path, "h100x4", 2, "exit_early", BIND_TIMEOUT="3")
    assert len(ranks) == 1  # rank 1 left before bind()
    error = ranks[0]["bind"]
    assert error["error"] == "RendezvousTimeoutError"
    assert error["message"].startswith("rank 1 of group 'default' did not reach gpuguard's placement check "
                                       "within 3 s (1 of 2 arrived).")


@pytest.mark.slow
def test_colocated_groups_in_separate_processes_pass(fake_gpus, master, tmp_path):
    """verl-style colocation: an actor group and a critic group of 2 ranks each share two GPUs."""
    jobs = []
    for group in ("actor", "critic"):
        for rank in range(2):
            env = fake_gpus.env("h100x4", visible=str(rank), RANK=str(rank), WORLD_SIZE="2", LOCAL_RANK="0",
                                GPUGUARD_GROUP=group)
            code = (f"import datetime, torch.distributed as dist, gpuguard\n"
                    f"s = dist.TCPStore('127.0.0.1', {master.port}, is_master=False)\n"
                    f"print(gpuguard.bind(store=s, timeout=60))\n")
            jobs.append(launch.Job([sys.executable, "-c", code], env, tmp_path, name=f"{group}{rank}"))
    outputs = [(done.stdout, done.stderr, done.returncode) for done in launch.wait_jobs(jobs, 180)]
    for out, err, returncode in outputs:
        assert returncode == 0, err[-3000:]
    assert sum("group actor" in out for out, _, _ in outputs) == 2
    assert sum("group critic" in out for out, _, _ in outputs) == 2


PLAIN_WORKER = r"""
import torch, torch.distributed as dist, gpuguard
from gg_testing.rank import write_result
try:
    b = gpuguard.init_process_group("gloo", bind_timeout=60)
    t = torch.tensor([b.device_index]); dist.all_reduce(t)
    write_result({"ok": int(t.item())})
except gpuguard.GpuGuardError as e:
    write_result({"error": type(e).__name__, "message": str(e)})
"""


@pytest.mark.slow
def test_init_process_group_without_torchrun_meets_through_the_env_store_it_creates(fake_gpus, tmp_path):
    """srun/mpirun/plain variables have no store before init_process_group: gpuguard creates the TCPStore
    env:// would (rank 0 serves MASTER_PORT), checks placement through it, then hands it to torch."""
    results = {}
    for topology in ("h100x1", "h100x4"):
        port = str(free_port())
        jobs = [launch.Job([sys.executable, "-c", PLAIN_WORKER],  # as srun or mpirun starts them: plain variables
                           dict(scrubbed(fake_gpus.env(topology)), RANK=str(r), LOCAL_RANK=str(r), WORLD_SIZE="2",
                                MASTER_ADDR="127.0.0.1", MASTER_PORT=port), tmp_path / topology, name=f"rank{r}")
                for r in range(2)]
        done = launch.wait_jobs(jobs, 180)
        ranks = jobs[0].ranks()
        results[topology] = [ranks.get(r, {"stderr": done[r].stderr[-2000:]}) for r in range(2)]
    one_gpu = results["h100x1"]
    assert {r.get("error") for r in one_gpu} == {"DuplicateDeviceError"}, one_gpu
    assert "2 processes on a host with 1 GPU" in one_gpu[0]["message"]
    assert one_gpu[0]["message"] == one_gpu[1]["message"]
    assert results["h100x4"] == [{"ok": 1}, {"ok": 1}], results["h100x4"]
