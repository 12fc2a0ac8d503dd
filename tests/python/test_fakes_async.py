"""The fakes run collectives as a GPU does: ncclAllReduce returns once enqueued on the stream, the sum happens
later, and the host sees it at a sync or an event query -- or never, when NCCL hangs. Two ranks, each a process
driving the fakes as vLLM's PyNccl does (tests/python/fake_pynccl.py), meet through a torch TCPStore."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from gg_testing.procs import SNIPPET_TIMEOUT_S

pytestmark = pytest.mark.version_independent  # CI runs this file on the oldest corner only (pyproject's markers)

HERE = Path(__file__).resolve().parent

# One rank. Rank 0 enqueues first; rank 1 enqueues only once rank 0 said its all_reduce returned, so a fake that
# blocked in ncclAllReduce until the peers joined would never get there (the parent's timeout would fail it).
RANK = textwrap.dedent("""
    import json, sys, threading, time
    sys.path.insert(0, sys.argv[1])
    from datetime import timedelta
    import torch.distributed as dist
    from fake_pynccl import FakePyNccl

    port, rank, scenario = int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
    store = dist.TCPStore("127.0.0.1", port, is_master=False, timeout=timedelta(seconds=60))
    comm = FakePyNccl(rank, 2, store)
    out = {"rank": rank}

    def synchronize_in_thread():
        done = threading.Event()
        def run():
            comm.synchronize()
            done.set()
        threading.Thread(target=run, daemon=True).start()
        return done

    if scenario == "ok":
        if rank == 1:
            store.wait(["rank0/enqueued"])
        start = time.monotonic()
        comm.all_reduce([1.0, 2.0, 3.0] if rank == 0 else [10.0, 20.0, 30.0])
        out["all_reduce_s"] = time.monotonic() - start
        event = comm.record_event()
        if rank == 0:
            out["pending_before_peer"] = not comm.query() and not comm.event_done(event)
            synced = synchronize_in_thread()
            out["sync_waits_for_peer"] = not synced.wait(0.5)
            store.set("rank0/enqueued", "1")
            out["synced"] = synced.wait(30)
        else:
            comm.synchronize()
            out["synced"] = True
        out["event_done_after_sync"] = comm.event_done(event) and comm.query()
        out["result"] = comm.result()
    else:  # "hang": the all-reduce never completes
        start = time.monotonic()
        comm.all_reduce([1.0, 2.0])
        out["all_reduce_s"] = time.monotonic() - start
        event = comm.record_event()
        time.sleep(0.5)  # a fixed time is the subject: a hung all-reduce is still not done after it
        out["ready_after_0.5s"] = comm.query() or comm.event_done(event)
        out["async_error"] = comm.async_error()
        synced = synchronize_in_thread()
        out["sync_returned_within_1s"] = synced.wait(1.0)
        comm.abort()  # as NCCL's abort makes the kernel exit, the blocked sync returns
        out["sync_returned_after_abort"] = synced.wait(10)
    print(json.dumps(out), flush=True)
""")


def run_two_ranks(fake_gpus, tmp_path, topology: str, scenario: str) -> dict[int, dict]:
    import torch.distributed as dist

    store = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
    env = fake_gpus.env(topology, GPUGUARD_FAKE_NCCL_DIR=str(tmp_path / "nccl"))
    procs = [subprocess.Popen([sys.executable, "-c", RANK, str(HERE), str(store.port), str(rank), scenario],
                              env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for rank in range(2)]
    results = {}
    try:
        for rank, proc in enumerate(procs):
            stdout, stderr = proc.communicate(timeout=SNIPPET_TIMEOUT_S)
            assert proc.returncode == 0, f"rank {rank} failed:\n{stdout}\n{stderr}"
            results[rank] = json.loads(stdout.strip().splitlines()[-1])
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    return results


def test_all_reduce_returns_before_the_peer_joined_and_the_sum_arrives_at_the_sync(fake_gpus, tmp_path):
    ranks = run_two_ranks(fake_gpus, tmp_path, "h100x4", "ok")
    zero = ranks[0]
    assert zero["all_reduce_s"] < 5
    assert zero["pending_before_peer"] is True  # enqueued, not run: rank 1 has contributed nothing yet
    assert zero["sync_waits_for_peer"] is True
    for doc in ranks.values():
        assert doc["synced"] is True
        assert doc["event_done_after_sync"] is True
        assert doc["result"] == [11.0, 22.0, 33.0]


@pytest.mark.parametrize("topology", ["h100x4_nccl_hang_all_reduce", "h100x4_broken_p2p"])
def test_a_hung_all_reduce_returns_at_once_and_never_completes(fake_gpus, tmp_path, topology):
    for doc in run_two_ranks(fake_gpus, tmp_path, topology, "hang").values():
        assert doc["all_reduce_s"] < 5
        assert doc["ready_after_0.5s"] is False
        assert doc["async_error"] == 0  # the communicator is fine: ncclCommGetAsyncError is not a progress report
        assert doc["sync_returned_within_1s"] is False
        assert doc["sync_returned_after_abort"] is True
