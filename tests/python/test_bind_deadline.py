"""bind(timeout=T, verify_nccl=True) returns or raises within T plus a few seconds in every path: one deadline
for the whole call, not one per wait. Each test makes an earlier step use up part of T, so that a per-step
timeout would overrun it."""

from __future__ import annotations

import datetime
import json
import subprocess
import sys
import textwrap
import threading
import time
import zlib

import pytest
import torch.distributed as dist

from gg_testing.paths import TOPOLOGIES
from gpuguard.deadline import Deadline
from gpuguard.placement import RankIdentity, exchange, run_namespace
from gpuguard.placement.exchange import TIMEOUT_GRACE_S

pytestmark = pytest.mark.wall_clock

T = 16.0  # the timeout each rank gives bind()
LATE = 9.0  # how late the other rank comes: more than the slack below, less than T minus start-up skew
SLACK = 2.0  # "a few seconds" for a rank that waits for nobody after its deadline
SLACK_WITH_GRACE = TIMEOUT_GRACE_S + 1.5  # a rank may wait the grace past its deadline for a peer's verdict

RANK = r"""
import json, sys, time, datetime
import torch.distributed as dist
import gpuguard
port, timeout = int(sys.argv[1]), float(sys.argv[2])
store = dist.TCPStore("127.0.0.1", port, is_master=False, timeout=datetime.timedelta(seconds=60))
started = time.monotonic()
try:
    gpuguard.bind(store=store, timeout=timeout, verify_nccl=True)
    outcome = {"error": None}
except gpuguard.GpuGuardError as e:
    outcome = {"error": type(e).__name__, "message": str(e)}
outcome["elapsed"] = time.monotonic() - started
print(json.dumps(outcome))
"""


@pytest.fixture
def master():
    store = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False,
                          timeout=datetime.timedelta(seconds=60))
    yield store


def start_rank(fake_gpus, master, rank: int, world: int, topology: str, group: str) -> subprocess.Popen[str]:
    env = fake_gpus.env(topology, RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank),
                        LOCAL_WORLD_SIZE=str(world), GPUGUARD_GROUP=group)
    for var in ("TORCHELASTIC_RUN_ID", "SLURM_JOB_ID", "TORCHELASTIC_USE_AGENT_STORE"):
        env.pop(var, None)
    return subprocess.Popen([sys.executable, "-c", textwrap.dedent(RANK), str(master.port), str(T)], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def outcome_of(proc: subprocess.Popen[str]) -> dict:
    out, err = proc.communicate(timeout=T + 90)
    assert proc.returncode == 0, err[-3000:]
    return json.loads(out.strip().splitlines()[-1])


def test_the_exchange_timeout_ends_the_call_at_the_deadline(fake_gpus, master):
    got = outcome_of(start_rank(fake_gpus, master, 0, 2, "h100x4", "deadline-exchange"))
    assert got["error"] == "RendezvousTimeoutError"
    assert "rank 1 of group 'deadline-exchange' did not reach gpuguard's placement check within 16 s" in got["message"]
    assert T - 0.5 <= got["elapsed"] <= T + SLACK


def test_waiting_for_the_nccl_unique_id_gets_only_what_the_exchange_left(fake_gpus, master, monkeypatch):
    """Rank 0 (played here) arrives late and never publishes an NCCL unique id: rank 1's wait for it may last
    only what is left of its deadline (a wait of its own of T would end about LATE seconds past it)."""
    group = "deadline-nccl-id"
    for var in ("TORCHELASTIC_RUN_ID", "TORCHELASTIC_RESTART_COUNT", "SLURM_JOB_ID"):
        monkeypatch.delenv(var, raising=False)
    namespace = run_namespace(group)  # this process's first check of the group: the same as rank 1's
    gpu0 = fake_gpus.topology("h100x4")["gpus"][0]
    rank0 = RankIdentity(rank=0, world_size=2, group=group, local_rank=0, host_hash=zlib.crc32(b"elsewhere"),
                         hostname="elsewhere", gpu_uuid=gpu0["uuid"], pci_bus_id=gpu0["pci_bus_id"], gpu_index=0,
                         pid=1, visible_device_count=4, launcher="test")
    proc = start_rank(fake_gpus, master, 1, 2, "h100x4", group)

    def late_rank0() -> None:
        time.sleep(LATE)  # a fixed lateness is the subject: what rank 1 has left of its deadline after it
        exchange(dist.TCPStore("127.0.0.1", master.port, is_master=False), rank0, namespace=namespace,
                 deadline=Deadline(T))

    thread = threading.Thread(target=late_rank0, daemon=True)
    thread.start()
    got = outcome_of(proc)
    thread.join(timeout=T)
    assert got["error"] == "RendezvousTimeoutError"
    assert got["message"] == "rank 0 did not publish an NCCL unique id within 16 s"
    assert got["elapsed"] <= T + SLACK


def test_a_hung_nccl_probe_is_aborted_at_the_deadline_of_the_whole_call(fake_gpus, master):
    """NCCL never finishes forming the communicator (the fake's 'hang'); rank 1 starts LATE, so rank 0 spends
    that in the exchange and the probe may have only the rest of its deadline."""
    topology = str(TOPOLOGIES / "h100x4_nccl_hang.json")
    first = start_rank(fake_gpus, master, 0, 2, topology, "deadline-probe")
    time.sleep(LATE)  # a fixed lateness is the subject: rank 0 spends it in the exchange
    second = start_rank(fake_gpus, master, 1, 2, topology, "deadline-probe")
    got = [outcome_of(first), outcome_of(second)]
    for outcome in got:
        assert outcome["error"] == "RendezvousTimeoutError"
        assert outcome["elapsed"] <= T + SLACK_WITH_GRACE
    # the last rank's probe ends last, and it writes the group's verdict; the first rank's deadline may pass
    # before that, and it then says so rather than waiting past its own deadline
    whole = "NCCL did not form a communicator for group 'deadline-probe' within 16 s on 2 of 2 ranks"
    assert whole in got[1]["message"]
    assert (whole in got[0]["message"]
            or got[0]["message"] == "only 1 of 2 ranks finished the NCCL probe of group 'deadline-probe' within 16 s")
