"""A torchrun worker for test_static_libstdcxx.py: gpuguard and torch in one process, in the order that crashed a
gpuguard whose modules linked libstdc++ statically (shared/notes/gpu-image.md): gpuguard first, then the README's
bind(), then torch formatting through its iostreams, then a watch() stall report on gloo (rank 1 holds back its second
all-reduce until both ranks have reported)."""

import gpuguard  # before torch: what its modules export is what the process's torch then binds to

import os
import sys
import time
from datetime import timedelta
from pathlib import Path

binding = gpuguard.bind()  # the README's torchrun example (docs/launchers.md); imports torch's submodules
print(binding, flush=True)

import torch  # noqa: E402 - after gpuguard on purpose
import torch.distributed as dist  # noqa: E402

# torch's own C++ formatting through std::ostream: c10's operator<< of a FunctionSchema, and an error message
print("schema:", torch.ops.aten.add.Tensor._schema, flush=True)
try:
    torch.ones(2) + torch.ones(3)
except RuntimeError as e:
    print("torch error:", str(e).splitlines()[0], flush=True)

out = Path(os.environ["WATCH_DIR"])
dist.init_process_group("gloo", timeout=timedelta(seconds=120))
rank = dist.get_rank()
w = gpuguard.watch(stall_after=float(sys.argv[1]), report_dir=str(out))
t = torch.ones(4)
dist.all_reduce(t)
if rank == 1:  # behind: the watchdogs of both ranks compose their report while rank 0 waits in all-reduce #2
    deadline = time.monotonic() + 90
    while len(list(out.glob("gpuguard-stall-rank*-pid*.json"))) < 2 and time.monotonic() < deadline:
        time.sleep(0.2)
dist.all_reduce(t)
print(f"rank {rank}: done, {w.reports} reports", flush=True)
w.stop()
dist.destroy_process_group()
