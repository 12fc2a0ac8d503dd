"""One rank of a real-launcher test: binds through gpuguard and prints one ``GGRESULT {json}`` line.

    rank_program.py init   gpuguard.init_process_group("gloo") (the env:// store, rank 0 serving it), up to
                           torch's own init, replaced by one more meeting through that store
    rank_program.py bind   gpuguard.bind() (the torchrun agent store)
GG_TIMEOUT bounds the call (default 120 s: the ranks of one job start far apart here, where importing torch beside
CI's other lane took 49 s on one node and 10 s on the other, and the deadline is not what these tests are about;
those that are set their own, and a passing call never waits it out). With GG_RESULTS (a folder) the line goes to
a file there instead. With GG_MARKS (a folder) the rank makes a file named by its rank there once it is about to
call gpuguard (its imports done); with GG_AFTER_MARKS (ranks, "1,3") too, it first waits up to 120 s for those
ranks' files, so that a test's ranks call gpuguard in the order it needs while all of them import at once. The line
gives the seconds since the program started (``seconds``), those of the gpuguard call alone (``call_seconds``) and
when it ended (``ended``, seconds since the epoch).
"""

import json
import os
import socket
import sys
import time

started = time.monotonic()
import gpuguard  # noqa: E402

RANK_VARIABLES = ("RANK", "SLURM_PROCID", "OMPI_COMM_WORLD_RANK", "PMI_RANK", "PMIX_RANK")


def raw_rank():
    for v in RANK_VARIABLES:
        if os.environ.get(v, "").isdigit():
            return int(os.environ[v])
    return None


def about_to_call():
    """Marks in GG_MARKS, if given, that this rank is about to call gpuguard, once the ranks of GG_AFTER_MARKS have
    (bounded); returns when that call starts."""
    marks = os.environ.get("GG_MARKS")
    if marks:
        after = [r for r in os.environ.get("GG_AFTER_MARKS", "").split(",") if r]
        until = time.monotonic() + 120
        while time.monotonic() < until and not all(os.path.exists(os.path.join(marks, r)) for r in after):
            time.sleep(0.05)
        with open(os.path.join(marks, str(raw_rank())), "w"):
            pass
    return time.monotonic()


call_started = None
mode = sys.argv[1] if len(sys.argv) > 1 else "init"
timeout = float(os.environ.get("GG_TIMEOUT", "120"))
out = {"host": socket.gethostname(), "pid": os.getpid()}
try:
    if mode == "init":
        import datetime

        import torch.distributed as dist

        def torch_init(backend, *, store, rank, world_size, **kwargs):
            # torch's own gloo mesh is not under test (on this loaded 2-core machine it sometimes fails to
            # connect after gpuguard is done): meet once more through the store gpuguard created and handed
            # over, as torch's rendezvous would, so that rank 0 (serving it) does not exit before the others
            if store.add("rank_program/done", 1) == world_size:
                store.set("rank_program/all_done", b"1")
            store.wait(["rank_program/all_done"], datetime.timedelta(seconds=timeout))
            left = store.add("rank_program/left", 1)
            while rank == 0 and left < world_size and time.monotonic() - started < 3 * timeout:
                time.sleep(0.05)  # the store's owner leaves last: the others' last call is answered
                left = store.add("rank_program/left", 0)

        dist.init_process_group = torch_init
        call_started = about_to_call()
        b = gpuguard.init_process_group("gloo", bind_timeout=timeout)
    else:
        call_started = about_to_call()
        b = gpuguard.bind(timeout=timeout)
    out.update(ok=True, rank=b.rank, world_size=b.world_size, local_rank=b.local_rank,
               local_world_size=b.local_world_size, node_rank=b.node_rank, launcher=b.launcher,
               device=str(b.device), uuid=b.uuid)
except gpuguard.GpuGuardError as exc:
    out.update(ok=False, rank=raw_rank(), error=type(exc).__name__, message=str(exc))
ended = time.monotonic()
out["seconds"] = round(ended - started, 2)
out["call_seconds"] = None if call_started is None else round(ended - call_started, 2)
out["ended"] = time.time()
if len(out.get("message", "")) > 3000:
    out["message"] = out["message"][:3000] + " [cut]"
line = "GGRESULT " + json.dumps(out) + "\n"
if os.environ.get("GG_RESULTS"):  # a file per rank: no launcher's output forwarding can lose or mix it
    with open(os.path.join(os.environ["GG_RESULTS"], f"{out['host']}-{out['pid']}.json"), "w") as f:
        f.write(line)
else:  # one write below PIPE_BUF: ranks that share a pipe (torchrun's workers) cannot interleave inside it
    os.write(1, line.encode())
