"""MIG on the fake driver: a rank bound to CUDA_VISIBLE_DEVICES=MIG-<uuid> has that instance's identity; ranks
on different instances of one GPU pass with a warning naming what NCCL does with them, ranks on one instance
fail, NCCL_MULTI_RANK_GPU_ENABLE=1 or not. Real processes (torch.multiprocessing.spawn), a real FileStore."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from gg_testing.procs import run_json

pytestmark = pytest.mark.version_independent  # CI runs this file on the oldest corner only (pyproject's markers)

MIG = ["MIG-1f2e3d4c-0001-5001-9001-aa0000000001", "MIG-1f2e3d4c-0002-5002-9002-aa0000000002",
       "MIG-1f2e3d4c-0003-5003-9003-aa0000000003"]

JOB = """
import json, logging, os, sys, warnings
import torch.distributed as dist
import torch.multiprocessing as mp

OUT = sys.argv[1]

def rank(i, visible, multi_rank):
    os.environ["CUDA_VISIBLE_DEVICES"] = visible[i]  # before CUDA starts in this process, as a launcher would
    if multi_rank:
        os.environ["NCCL_MULTI_RANK_GPU_ENABLE"] = "1"
    import gpuguard
    records = []
    handler = logging.Handler()
    handler.emit = lambda record: records.append(record.getMessage())
    logging.getLogger("gpuguard").addHandler(handler)
    try:
        store = dist.FileStore(os.path.join(OUT, "store"), len(visible))
        b = gpuguard.bind(rank=i, world_size=len(visible), local_rank=0, store=store, timeout=120)
        result = {"binding": {"uuid": b.uuid, "pci_bus_id": b.pci_bus_id, "device": str(b.device),
                              "name": b.device_name}, "log": records}
    except Exception as exc:
        result = {"error": type(exc).__name__, "message": str(exc)}
    with open(os.path.join(OUT, f"rank{i}.json"), "w") as f:
        json.dump(result, f)

if __name__ == "__main__":
    visible, multi_rank = json.loads(sys.argv[2]), sys.argv[3] == "1"
    mp.spawn(rank, args=(visible, multi_rank), nprocs=len(visible), join=True)
"""


def job(tmp_path: Path, env: dict[str, str], visible: list[str], multi_rank: bool = False) -> list[dict]:
    script = tmp_path / "mig_job.py"
    script.write_text(textwrap.dedent(JOB))
    proc = subprocess.run([sys.executable, str(script), str(tmp_path), json.dumps(visible), "1" if multi_rank else "0"],
                          env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    return [json.loads((tmp_path / f"rank{i}.json").read_text()) for i in range(len(visible))]


def test_the_driver_shows_one_mig_device_with_the_instances_identity(fake_gpus):
    got = run_json("""
        import json, gpuguard
        print(json.dumps([[d.name, d.uuid, d.pci_bus_id, d.total_memory // 2**20] for d in gpuguard.devices()]))
    """, fake_gpus.env("h100x2_mig", visible=f"{MIG[2]},{MIG[0]}"))
    # one MIG device per process (the first listed), named MIG-<uuid>, on its GPU's PCI bus id
    assert got == [["NVIDIA H100 80GB HBM3 MIG 1g.10gb", MIG[2], "0000:18:00.0", 9856]]
    unset = run_json("""
        import json, gpuguard
        print(json.dumps([d.uuid for d in gpuguard.devices()]))
    """, fake_gpus.env("h100x2_mig"))
    assert unset == [MIG[0]]  # no non-MIG GPU once a MIG device is enumerated


def test_ranks_on_different_instances_of_one_gpu_pass_with_a_warning(fake_gpus, tmp_path):
    got = job(tmp_path, fake_gpus.env("h100x2_mig"), MIG)
    assert [r["binding"]["uuid"] for r in got] == MIG  # each rank has its instance's identity
    assert {r["binding"]["pci_bus_id"] for r in got} == {"0000:18:00.0"}
    assert got[1]["binding"]["name"] == "NVIDIA H100 80GB HBM3 MIG 2g.20gb"
    warning = [m for m in got[0]["log"] if "MIG instances" in m]
    assert warning, got[0]["log"]
    assert "3 ranks of group 'default' are on different MIG instances of 1 GPU: each has a device of its own, so " \
           "gpuguard lets the job continue. NCCL will not: it sees one GPU" in warning[0]
    assert "\"Multiple Ranks are using the same GPU/Partition\" unless NCCL_MULTI_RANK_GPU_ENABLE=1" in warning[0]
    assert "Fix: with NCCL 2.30 or later set NCCL_MULTI_RANK_GPU_ENABLE=1 on every rank" in warning[0]


def test_ranks_on_one_instance_fail_even_with_multi_rank_gpu_mode(fake_gpus, tmp_path):
    for multi_rank in (False, True):
        out = tmp_path / str(multi_rank)
        out.mkdir()
        got = job(out, fake_gpus.env("h100x2_mig"), [MIG[1], MIG[1]], multi_rank=multi_rank)
        for r in got:
            assert r["error"] == "DuplicateDeviceError", r
            assert "2 ranks of group 'default' share 1 device (a GPU or one MIG instance)." in r["message"]
            assert f"MIG instance {MIG[1]} of the GPU at PCI 0000:18:00.0 is shared by ranks 0 and 1:" in r["message"]
            if multi_rank:
                assert "NCCL_MULTI_RANK_GPU_ENABLE=1 is set on every rank involved: it turns off the check of " \
                       "NCCL 2.30 and later" in r["message"]
            else:
                assert "NCCL_MULTI_RANK_GPU_ENABLE=1 would silence that, not fix it" in r["message"]


def test_two_mig_devices_for_one_process_are_named_with_the_rule(fake_gpus):
    got = run_json(f"""
        import json, gpuguard
        try:
            gpuguard.bind()
            print(json.dumps("bound"))
        except gpuguard.LaunchEnvironmentError as exc:
            print(json.dumps(str(exc)))
    """, fake_gpus.env("h100x2_mig", visible=f"{MIG[1]},{MIG[0]}"))
    # before: "was rejected by the driver: no such MIG device on this host", which is false: it exists
    assert got == (f"CUDA_VISIBLE_DEVICES='{MIG[1]},{MIG[0]}': entry 2 ('{MIG[0]}') is not shown: CUDA enumerates a "
                   f"single MIG device per process (here {MIG[1]}) and no other GPU beside it, whatever "
                   f"CUDA_VISIBLE_DEVICES lists; the driver shows 1 device and ignores everything from it on. Give "
                   f"each process a single MIG device: CUDA_VISIBLE_DEVICES=MIG-<uuid>, a different one per rank "
                   f"(nvidia-smi -L lists them).")
