"""A torchrun worker for test_watch.py: its ranks on gloo under gpuguard.watch(), stall scenarios (argv[1]: one, or
several separated by commas, one after another: the chained job).

Each scenario is a stage of 5 all-reduces, and rank 2 misbehaves before the 5th (collective 5, then 10, 15...): it
sleeps in Python (behind_python), sleeps in a C call that holds the GIL (behind_gil), stops itself (stopped), dies
(killed), calls broadcast instead (desync). A sleeping rank holds until the test releases it (SIGUSR1), a stopped one
until the test continues it (SIGCONT), and the job goes on to the next stage. `async_wait`: every all-reduce of the
stage is `work = dist.all_reduce(t, async_op=True); work.wait()`, the shape of every NCCL collective (it returns once
enqueued); rank 2 sleeps in Python before the 5th. `nccl_hang` runs every rank's 5th all-reduce through the fake
NCCL as a PyNccl user calls it (FakePyNccl), in a w.collective(stream=...) block: it returns at once and never
completes (h100x4_nccl_hang_all_reduce), and the CPU waits in synchronize(); `killed` has ranks 0, 1, 3 wait the
same way for the dead rank 2 (gloo would name the dead peer itself, NCCL does not). Two more all-reduces end the job.
`ddp`: a DistributedDataParallel loop, whose gradient all-reduce DDP's C++ reducer issues; rank 2 sleeps before
step 4's backward. `healthy_ddp` runs argv[3] DDP steps and must never report. The two chain as the others do
(`healthy_ddp,ddp`: one model, the stall after the healthy steps), each printing "rank R: <stage> done, N reports" at
its end. `healthy` runs argv[3] all-reduces (then idles argv[4] seconds, if given), must never report, and prints its
counts; as the first of several (`healthy,stopped`), the stall stages follow it.
"""

import contextlib
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
if os.environ.get("GPUGUARD_WATCH") == "1":  # the zero-code path (`gpuguard run`, GPUGUARD_WATCH=1) started it
    import gpuguard.auto
    w = gpuguard.auto._watch
    assert w is not None, "GPUGUARD_WATCH=1 started no watchdog"
else:
    w = gpuguard.watch(stall_after=stall_after, on_stall=os.environ.get("ON_STALL", "report"), report_dir=out,
                       gather=stall_after)  # a loaded machine's ranks may take seconds to answer
signal.signal(signal.SIGUSR1, signal.SIG_IGN)  # a release that comes after its hold ended changes nothing
hold = stall_after + 60  # far longer than the reports take, even on a loaded machine: the test ends it
#                          (until_released) once it has every rank's report, so a long hold costs nothing
t = torch.ones(4)


class Released(Exception):
    """The test's SIGUSR1: it has every rank's report, so rank 2's hold ends and the job goes on and ends."""


def _released(signum, frame):
    raise Released


def holding(kind: str) -> None:
    """Tells the test which process to release and how (hold.pid: rank 2's pid, then "sleep" or "stop"), for the
    stall now starting: a release of one kind never ends a hold of the other (a continue sent with the release of
    a sleep reached rank 2 once it had gone on and stopped itself for the next stage, on CI's loaded machine)."""
    with open(os.path.join(out, "hold.pid"), "w") as f:
        f.write(f"{os.getpid()} {kind}")


@contextlib.contextmanager
def until_released():
    """Rank 2's hold, its sleep in the with block: the test ends it (SIGUSR1 to the pid in hold.pid) once every
    rank has reported, instead of waiting out `hold`; a release after the hold is ignored."""
    signal.signal(signal.SIGUSR1, _released)
    holding("sleep")
    try:
        yield
    except Released:
        pass
    finally:
        signal.signal(signal.SIGUSR1, signal.SIG_IGN)


def mark(name: str) -> None:
    with open(os.path.join(out, name), "w") as f:
        f.write(repr(time.time()))


def pynccl():
    from fake_pynccl import FakePyNccl  # tests/python: what a PyNccl user does, over the fake driver and NCCL
    return FakePyNccl(rank, dist.get_world_size(), dist.distributed_c10d._get_default_store())


def nccl_all_reduce(comm) -> None:
    with w.collective("all_reduce", sizes="float32[4]", stream=comm.stream):
        comm.all_reduce([1.0] * 4)  # the fake NCCL's all-reduce: enqueued, returns at once
    comm.synchronize()  # the CPU waits here, as in torch.cuda.synchronize()


stages = scenario.split(",")
if stages[0] in ("ddp", "healthy_ddp"):
    from torch.nn.parallel import DistributedDataParallel
    model = DistributedDataParallel(torch.nn.Linear(8, 8))
    x = torch.ones(2, 8)
    for ddp_stage in stages:
        steps = int(sys.argv[3]) if ddp_stage == "healthy_ddp" else 6
        for step in range(1, steps + 1):
            loss = model(x).sum()
            if ddp_stage == "ddp" and rank == 2 and step == 4:
                mark("stall_start")
                with until_released():
                    time.sleep(hold)  # rank 2 sleeps before its backward
            loss.backward()  # DDP's reducer all-reduces the gradients in here
        print(f"rank {rank}: {ddp_stage} done, {w.reports} reports", flush=True)
    w.stop()
    dist.destroy_process_group()
    sys.exit(0)

if stages[0] == "healthy":
    for step in range(int(sys.argv[3])):
        dist.all_reduce(t)
        if step % 100 == 0:
            dist.barrier()
    if len(sys.argv) > 4:  # then idle that many seconds, no collective pending: the watchdogs tick on
        time.sleep(float(sys.argv[4]))
    print(f"rank {rank}: healthy done, {w.store_ops} store operations, {w.reports} reports, {w.relayed_ticks} relayed, "
          f"{w.unrelayed_ticks} unrelayed ticks", flush=True)
    stages = stages[1:]
    if not stages:
        w.stop()
        dist.destroy_process_group()
        sys.exit(0)

STAGE = 5  # all-reduces a stage: its last is the stall (test_watch expects collectives 5, 10, 15...)
comm = pynccl() if {"killed", "nccl_hang"} & set(stages) else None
for i in range(1, STAGE * len(stages) + 3):
    stage = stages[min((i - 1) // STAGE, len(stages) - 1)]
    stall = i % STAGE == 0 and i <= STAGE * len(stages)  # the stage's last all-reduce
    if stall and stage == "killed" and rank != 2:  # NCCL, unlike gloo, does not notice a dead peer
        mark(f"stall_start.{rank}")
        nccl_all_reduce(comm)
        continue
    if stall and stage == "nccl_hang":
        mark(f"stall_start.{rank}")
        nccl_all_reduce(comm)
        continue
    if stall and rank == 2:
        mark("stall_start")
        if stage == "behind_python":
            with until_released():
                time.sleep(hold)  # rank 2 sleeps here
        elif stage == "behind_gil":
            with until_released():  # the signal ends sleep(3) early; the handler raises once it returns
                ctypes.PyDLL("libc.so.6").sleep(int(hold))  # a C call that keeps the GIL
        elif stage == "async_wait":
            with until_released():
                time.sleep(hold)  # rank 2 sleeps (async scenario)
        elif stage == "stopped":
            holding("stop")
            os.kill(os.getpid(), signal.SIGSTOP)  # until the test's SIGCONT
        elif stage == "killed":
            os.kill(os.getpid(), signal.SIGKILL)
        elif stage == "desync":
            dist.broadcast(t, src=0, async_op=True).wait()  # where the others all-reduce
            continue
    if stage == "async_wait":
        work = dist.all_reduce(t, async_op=True)  # the async_wait all-reduce: returns at once, like NCCL's
        work.wait()  # the others' CPU waits here
    elif stage in ("desync", "stopped"):  # asynchronous, as every NCCL collective is
        dist.all_reduce(t, async_op=True).wait()  # the async all-reduce of the scenarios
    else:
        dist.all_reduce(t)  # the all-reduce of the scenarios
print(f"rank {rank}: done", flush=True)
w.stop()
dist.destroy_process_group()
