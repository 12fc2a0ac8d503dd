"""bind(rank=, world_size=, local_rank=) for processes no launcher describes, under a real
torch.multiprocessing.spawn with real stores (FileStore, and the TCPStore made from init_method), on the fake
driver; and a spawned child that passes nothing is refused instead of becoming rank 0 of 1 on cuda:0."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from gg_testing.ports import free_port
from gg_testing.procs import run_json, run_python
import gpuguard
from gpuguard import GpuGuardError

SPAWN = """
import json, os, sys, traceback
import torch.distributed as dist
import torch.multiprocessing as mp
import gpuguard

OUT = sys.argv[1]

def attempt(i, nprocs, how):
    try:
        if how == "explicit":
            store = dist.FileStore(os.path.join(OUT, "store"), nprocs)
            b = gpuguard.bind(rank=i, world_size=nprocs, local_rank=i, store=store, timeout=120)
        elif how == "same_local_rank":
            store = dist.FileStore(os.path.join(OUT, "store"), nprocs)
            b = gpuguard.bind(rank=i, world_size=nprocs, local_rank=0, store=store, timeout=120)
        elif how == "init_method":
            b = gpuguard.init_process_group("gloo", rank=i, world_size=nprocs, local_rank=i,
                                            init_method=os.environ["TEST_INIT_METHOD"], bind_timeout=120)
            import torch
            t = torch.tensor([i + 1.0])
            dist.all_reduce(t)
            dist.destroy_process_group()
            b = {"device": str(b.device), "uuid": b.uuid, "sum": t.item(), "launcher": b.launcher}
        else:
            b = gpuguard.bind(timeout=120)
        if not isinstance(b, dict):
            b = {"device": str(b.device), "uuid": b.uuid, "rank": b.rank, "launcher": b.launcher,
                 "chosen_by": b.chosen_by}
        result = {"binding": b}
    except Exception as exc:
        result = {"error": type(exc).__name__, "message": str(exc)}
    with open(os.path.join(OUT, f"rank{i}.json"), "w") as f:
        json.dump(result, f)

if __name__ == "__main__":
    nprocs, how = int(sys.argv[2]), sys.argv[3]
    mp.spawn(attempt, args=(nprocs, how), nprocs=nprocs, join=True)
"""


def spawn(tmp_path: Path, env: dict[str, str], nprocs: int, how: str) -> list[dict]:
    script = tmp_path / "spawn_job.py"
    script.write_text(textwrap.dedent(SPAWN))
    proc = subprocess.run([sys.executable, str(script), str(tmp_path), str(nprocs), how], env=env,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    return [json.loads((tmp_path / f"rank{i}.json").read_text()) for i in range(nprocs)]


def test_spawned_processes_with_explicit_ranks_bind_distinct_gpus(fake_gpus, tmp_path):
    uuids = [g["uuid"] for g in fake_gpus.topology("h100x4")["gpus"]]
    got = spawn(tmp_path, fake_gpus.env("h100x4"), 2, "explicit")
    assert [r["binding"]["device"] for r in got] == ["cuda:0", "cuda:1"]
    assert [r["binding"]["uuid"] for r in got] == uuids[:2]
    assert {r["binding"]["launcher"] for r in got} == {"explicit"}
    assert got[1]["binding"]["chosen_by"] == "local rank 1 (bind(local_rank=))"


def test_spawned_processes_given_one_local_rank_are_caught_through_the_store(fake_gpus, tmp_path):
    uuid = fake_gpus.topology("h100x4")["gpus"][0]["uuid"]
    got = spawn(tmp_path, fake_gpus.env("h100x4"), 2, "same_local_rank")
    for r in got:
        assert r["error"] == "DuplicateDeviceError", r
        assert r["message"].startswith("2 ranks of group 'default' share 1 GPU.")
        assert f"GPU {uuid} (PCI 0000:18:00.0) is shared by ranks 0 and 1:" in r["message"]
        assert "launcher explicit" in r["message"]


def test_init_process_group_with_init_method_makes_the_store_once(fake_gpus, tmp_path):
    env = fake_gpus.env("h100x4", TEST_INIT_METHOD=f"tcp://127.0.0.1:{free_port()}")
    got = spawn(tmp_path, env, 2, "init_method")
    assert [r["binding"]["device"] for r in got] == ["cuda:0", "cuda:1"], got
    assert [r["binding"]["sum"] for r in got] == [3.0, 3.0]  # torch's group formed on the same store


def test_spawned_processes_passing_nothing_are_refused_on_a_multi_gpu_host(fake_gpus, tmp_path):
    # before: both children were "rank 0 of 1" on cuda:0, silently
    got = spawn(tmp_path, fake_gpus.env("h100x4"), 2, "nothing")
    for i, r in enumerate(got):
        assert r["error"] == "LaunchEnvironmentError", r
        assert r["message"].startswith(f"This process is process {i} of torch.multiprocessing.spawn (parent pid ")
        assert "so gpuguard would have to call it rank 0 of 1 on cuda:0 -- as it would every sibling -- while " \
               "it sees 4 GPUs." in r["message"]
        assert "gpuguard.bind(rank=i, world_size=nprocs, local_rank=i, store=store)" in r["message"]


def test_on_a_one_gpu_host_only_the_later_spawned_processes_are_refused(fake_gpus, tmp_path):
    got = spawn(tmp_path, fake_gpus.env("h100x1"), 2, "nothing")
    assert got[0]["binding"]["device"] == "cuda:0" and got[0]["binding"]["launcher"] == "single"
    assert got[1]["error"] == "LaunchEnvironmentError"
    assert "while it is not the first process." in got[1]["message"]


def test_explicit_ranks_must_come_together_and_be_sane():
    with pytest.raises(ValueError) as err:
        gpuguard.bind(rank=1)
    assert str(err.value).startswith("bind(rank=1) also needs world_size= and local_rank=: with explicit ranks")
    with pytest.raises(ValueError, match=r"bind\(world_size=-2\): give a non-negative integer"):
        gpuguard.bind(rank=0, world_size=-2, local_rank=0)
    with pytest.raises(GpuGuardError, match=r"bind\(rank=\)=2 is not below bind\(world_size=\)=2"):
        gpuguard.bind(rank=2, world_size=2, local_rank=0)


def test_explicit_ranks_without_a_store_say_where_to_meet(fake_gpus):
    proc = run_python("""
        import gpuguard
        try:
            gpuguard.bind(rank=1, world_size=2, local_rank=1, timeout=10)
        except gpuguard.GpuGuardError as exc:
            print(exc)
    """, fake_gpus.env("h100x4"))
    assert "gpuguard.bind() found 2 ranks but no place where they can meet" in proc.stdout
    assert "or pass store=" in proc.stdout


REUSED_STORE = """
import datetime, json, os, sys
import torch.distributed as dist
import torch.multiprocessing as mp
import gpuguard

OUT, PORT, RUN = sys.argv[1], int(sys.argv[2]), sys.argv[3]

def attempt(i, nprocs):
    store = dist.TCPStore("127.0.0.1", PORT, is_master=False, timeout=datetime.timedelta(seconds=60))
    local_rank = i if RUN == "first" else 0  # the second run puts every rank on cuda:0
    try:
        b = gpuguard.bind(rank=i, world_size=nprocs, local_rank=local_rank, store=store, timeout=60)
        result = {"device": str(b.device)}
    except gpuguard.GpuGuardError as exc:
        result = {"error": type(exc).__name__, "message": str(exc)}
    with open(os.path.join(OUT, f"{RUN}{i}.json"), "w") as f:
        json.dump(result, f)

if __name__ == "__main__":
    mp.spawn(attempt, args=(2,), nprocs=2, join=True)
"""


def test_a_store_kept_between_runs_never_hands_the_second_run_the_first_runs_verdict(fake_gpus, tmp_path):
    """A notebook's (or a long-lived server's) TCPStore, two torch.multiprocessing.spawn runs with explicit ranks
    and no launcher run id, so the same keys: run 1 passes on 2 GPUs, run 2 puts both ranks on cuda:0. Before,
    run 2 read run 1's "ok" and passed."""
    import torch.distributed as dist

    server = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
    script = tmp_path / "runs.py"
    script.write_text(textwrap.dedent(REUSED_STORE))
    for run in ("first", "second"):
        proc = subprocess.run([sys.executable, str(script), str(tmp_path), str(server.port), run],
                              env=fake_gpus.env("h100x4"), capture_output=True, text=True, timeout=300)
        assert proc.returncode == 0, proc.stderr[-3000:]
    first = [json.loads((tmp_path / f"first{i}.json").read_text()) for i in range(2)]
    second = [json.loads((tmp_path / f"second{i}.json").read_text()) for i in range(2)]
    assert [r.get("device") for r in first] == ["cuda:0", "cuda:1"], first
    for r in second:
        assert r.get("error") == "DuplicateDeviceError", r
        assert r["message"].startswith("2 ranks of group 'default' share 1 GPU."), r["message"]


SHARED_CLIENT_THREADS = """
import datetime, json, threading, time
import torch.distributed as dist
import gpuguard

server = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
shared = dist.TCPStore("127.0.0.1", server.port, is_master=False, timeout=datetime.timedelta(seconds=60))
out = {}

def rank(r):
    started = time.monotonic()
    try:
        out[r] = {"device": str(gpuguard.bind(rank=r, world_size=4, local_rank=r, store=shared, timeout=20).device)}
    except gpuguard.GpuGuardError as exc:
        out[r] = {"error": type(exc).__name__, "message": str(exc)[:500]}
    out[r]["elapsed"] = time.monotonic() - started

threads = [threading.Thread(target=rank, args=(r,)) for r in range(4)]
for t in threads:
    t.start()
for t in threads:
    t.join()
out["timeout"] = shared.timeout.total_seconds()
print(json.dumps(out))
"""


def test_four_threads_binding_over_one_store_client_meet_at_once(fake_gpus):
    """Four threads of one process call bind() with ranks 0-3 over one shared TCPStore client. Before, they
    stalled until the timeout: one thread's wait for the verdict held the client, and each thread counted its
    call as another check of the group."""
    got = run_json(SHARED_CLIENT_THREADS, fake_gpus.env("h100x4"))
    assert [got[str(r)].get("device") for r in range(4)] == ["cuda:0", "cuda:1", "cuda:2", "cuda:3"], got
    # at once: the stall this guards against lasted the store's 60 s timeout; 30 s leaves room for a starved lane
    assert max(got[str(r)]["elapsed"] for r in range(4)) < 30, got
    assert got["timeout"] == 60  # the store's own timeout is the user's again
