"""A torchrun worker for test_watch.py: 4 ranks on gloo under gpuguard.watch(), one stall scenario (argv[1]).

Rank 2 misbehaves before the 5th all-reduce: it sleeps in Python (behind_python), sleeps in a C call that holds
the GIL (behind_gil), stops itself (stopped), dies (killed), calls broadcast instead (desync); `nccl_hang`
runs every rank's 5th all-reduce through the fake NCCL, which hangs it (h100x4_broken_p2p); `killed` has ranks 0, 1, 3 wait for it in an all-reduce through the fake NCCL (gloo would name the dead peer
itself, NCCL does not); `healthy` runs
argv[3] steps and must never report.
"""

import ctypes
import os
import signal
import sys
import time
from datetime import timedelta

import torch
import torch.distributed as dist

import gpuguard

scenario, stall_after = sys.argv[1], float(sys.argv[2])
out = os.environ["WATCH_DIR"]
dist.init_process_group("gloo", timeout=timedelta(seconds=300))
rank = dist.get_rank()
w = gpuguard.watch(stall_after=stall_after, on_stall=os.environ.get("ON_STALL", "report"), report_dir=out, gather=3)
hold = stall_after + 25  # long enough for the report, then the job goes on and ends on its own
t = torch.ones(4)


def mark(name: str) -> None:
    with open(os.path.join(out, name), "w") as f:
        f.write(repr(time.time()))


def nccl_all_reduce() -> None:
    from gpuguard import _core
    if rank == 0:
        uid = _core.nccl_unique_id()
        dist.distributed_c10d._get_default_store().set("test/nccl_id", uid)
    uid = dist.distributed_c10d._get_default_store().get("test/nccl_id")
    with w.collective("all_reduce", sizes="float32[4]"):
        _core.nccl_probe(4, rank, uid, rank, hold, True)  # the fake NCCL hangs the all-reduce until the deadline


if scenario == "healthy":
    for step in range(int(sys.argv[3])):
        dist.all_reduce(t)
        if step % 100 == 0:
            dist.barrier()
    print(f"rank {rank}: healthy done, {w.store_ops} store operations, {w.reports} reports", flush=True)
    w.stop()
    dist.destroy_process_group()
    sys.exit(0)

for i in range(1, 8):
    if i == 5 and scenario == "killed" and rank != 2:  # NCCL, unlike gloo, does not notice a dead peer
        mark(f"stall_start.{rank}")
        nccl_all_reduce()
        continue
    if i == 5 and scenario == "nccl_hang":
        mark(f"stall_start.{rank}")
        nccl_all_reduce()
        continue
    if rank == 2 and i == 5:
        mark("stall_start")
        if scenario == "behind_python":
            time.sleep(hold)  # rank 2 sleeps here
        elif scenario == "behind_gil":
            ctypes.PyDLL("libc.so.6").sleep(int(hold))  # a C call that keeps the GIL
        elif scenario == "stopped":
            os.kill(os.getpid(), signal.SIGSTOP)
        elif scenario == "killed":
            os.kill(os.getpid(), signal.SIGKILL)
        elif scenario == "desync":
            dist.broadcast(t, src=0)  # where the others all-reduce
            continue
    dist.all_reduce(t)  # the all-reduce of the scenarios
print(f"rank {rank}: done", flush=True)
w.stop()
dist.destroy_process_group()
