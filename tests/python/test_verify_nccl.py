"""`gpuguard check --verify-nccl` under a real torchrun (4 ranks, fake driver and NCCL): the check runs one small
all-reduce on the communicator it forms, and on a hang tries again with NCCL_P2P_DISABLE=1 and says whether that
cures it (the 8xH20 report: a first-collective P2P hang that a communicator-only check passes)."""

from __future__ import annotations

import pytest

from gg_testing import launch
from gg_testing.env import scrubbed

pytestmark = pytest.mark.version_independent  # CI runs this file on the oldest corner only (pyproject's markers)


def torchrun_verify(fake_gpus, tmp_path, topology: str, **extra: str) -> launch.Finished:
    """`gpuguard check --verify-nccl --json` on 4 ranks, each rank's stdout in its own file (launch.rank_json)."""
    env = scrubbed(fake_gpus.env(topology, GPUGUARD_FAKE_NCCL_DIR=str(tmp_path / "nccl"), **extra))
    return launch.torchrun("-m", "gpuguard", "check", "--verify-nccl", "--json", "--timeout", "30", nproc=4,
                           env=env, workdir=tmp_path, logs=True)


@pytest.mark.slow
def test_a_first_all_reduce_that_hangs_unless_p2p_is_disabled_fails_the_check_with_the_cure(fake_gpus, tmp_path):
    proc = torchrun_verify(fake_gpus, tmp_path, "h100x4_broken_p2p")
    assert proc.returncode == 1, proc.tail(3000)
    ranks = launch.rank_json(proc)
    assert sorted(ranks) == [0, 1, 2, 3], proc.tail(3000)
    for rank, doc in ranks.items():
        assert doc["ok"] is False
        message = doc["message"]
        assert message.startswith("NCCL hangs with GPU peer-to-peer enabled and works without it: the first "
                                  "all-reduce on the NCCL communicator of group 'default' (4 ranks)"), message
        assert "completed with NCCL_P2P_DISABLE=1, so peer-to-peer between this job's GPUs is broken" in message
        # ncclAllReduce returns once enqueued, as on a GPU: the hang is seen where the host waits for the kernel
        assert "timed out at synchronize" in message and "the all-reduce did not finish on the GPU" in message
        assert "Fix: export NCCL_P2P_DISABLE=1 for this job" in message
    assert len({doc["message"] for doc in ranks.values()}) == 1


@pytest.mark.slow
def test_the_cure_followed_passes_the_check(fake_gpus, tmp_path):
    proc = torchrun_verify(fake_gpus, tmp_path, "h100x4_broken_p2p", NCCL_P2P_DISABLE="1")
    assert proc.returncode == 0, proc.tail(3000)
    assert all(doc["ok"] for doc in launch.rank_json(proc).values())


@pytest.mark.slow
def test_an_all_reduce_hang_that_disabling_p2p_does_not_cure_is_not_blamed_on_p2p(fake_gpus, tmp_path):
    proc = torchrun_verify(fake_gpus, tmp_path, "h100x4_nccl_hang_all_reduce")
    assert proc.returncode == 1
    ranks = launch.rank_json(proc)
    assert sorted(ranks) == [0, 1, 2, 3], proc.tail(3000)
    for doc in ranks.values():
        message = doc["message"]
        assert message.startswith("NCCL formed a communicator for group 'default' but its first all-reduce did not "
                                  "complete within "), message
        assert "Tried again with NCCL_P2P_DISABLE=1: " in message
        assert "so disabling P2P is not the cure here" in message
        assert "Fix: export NCCL_P2P_DISABLE=1" not in message


@pytest.mark.slow
def test_a_communicator_that_never_forms_is_reported_as_such(fake_gpus, tmp_path):
    proc = torchrun_verify(fake_gpus, tmp_path, "h100x4_nccl_hang")
    assert proc.returncode == 1
    for doc in launch.rank_json(proc).values():
        assert doc["message"].startswith("NCCL did not form a communicator for group 'default' within 30 s on 4 "
                                          "of 4 ranks"), doc["message"]
        assert "NCCL_P2P_DISABLE=1" not in doc["message"]
