"""gpuguard doctor: the pasteable report, CUDA_VISIBLE_DEVICES entry by entry, the peer-copy probe catching
dropped writes the capability flag hides, the NCCL probe recommending NCCL_P2P_DISABLE=1 only when it is the
cure, the JSON schema and the exit codes."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import pytest

from gg_testing.env import no_driver_env
from gg_testing.procs import SNIPPET_TIMEOUT_S, run_cli

from gpuguard.system.devices import Device

pytestmark = pytest.mark.version_independent  # CI runs this file on the oldest corner only (pyproject's markers)

UUIDS = ["GPU-5a6b7c00-0000-4000-8000-1f2e3d4c5b60", "GPU-5a6b8d11-0001-4001-8001-1f2e3d4c5b61",
         "GPU-5a6b9e22-0002-4002-8002-1f2e3d4c5b62", "GPU-5a6baf33-0003-4003-8003-1f2e3d4c5b63"]


def two_gpu_topology(fake_gpus, tmp_path: Path, name: str) -> str:
    """The first two GPUs of a ready-made topology: half the child processes of a 4-GPU NCCL probe."""
    topo = fake_gpus.topology(name)
    topo["gpus"] = topo["gpus"][:2]
    if "peer_access" in topo:
        topo["peer_access"] = [row[:2] for row in topo["peer_access"][:2]]
    path = tmp_path / f"{name}_2gpu.json"
    path.write_text(json.dumps(topo))
    return str(path)


def doctor_json(args: list[str], env: dict[str, str], timeout: float = 240) -> tuple[int, dict]:
    proc = run_cli(["doctor", "--json", *args], env, timeout=timeout)
    assert proc.returncode in (0, 1), proc.stdout + proc.stderr
    return proc.returncode, json.loads(proc.stdout)


def codes(doc: dict) -> dict[str, dict]:
    return {f["code"]: f for f in doc["findings"]}


def test_doctor_reads_torch_from_its_files_as_torch_itself_says_without_importing_it():
    proc = run_cli(["doctor", "--json"], no_driver_env(PYTHONPROFILEIMPORTTIME="1"))
    imported = [line.rsplit("|", 1)[-1].strip() for line in proc.stderr.splitlines() if "|" in line]
    assert "gpuguard.doctor_report" in imported and "torch" not in imported
    versions = json.loads(proc.stdout)["versions"]
    import torch
    assert versions["torch"] == torch.__version__
    assert versions["torch CUDA build"] == (torch.version.cuda or "none (CPU-only build of torch)")
    assert "torch_build_mismatch" not in codes(json.loads(proc.stdout))  # this checkout's build, this torch
    assert versions["tensor checks"] == "C++ (gpuguard._libtorch)"


# ---- the report -----------------------------------------------------------------------------------------------

def test_doctor_without_a_driver_says_what_it_could_not_check(tmp_path):
    code, doc = doctor_json(["--p2p", "--nccl"], no_driver_env())
    assert code == 0  # a CPU machine is not an error
    assert doc["schema"] == "gpuguard.doctor/1"
    assert list(doc) == ["schema", "versions", "nccl_libraries", "host", "launcher", "settings", "cuda",
                         "cuda_visible_devices", "devices", "binding", "gpu_processes", "peer_access", "p2p", "nccl",
                         "not_checked", "findings", "exit_code"]
    assert list(doc["versions"])[:5] == ["gpuguard", "gpuguard built for torch", "python", "torch",
                                         "torch CUDA build"]
    assert doc["devices"] == [] and doc["peer_access"] is None and doc["p2p"] is None and doc["exit_code"] == 0
    unchecked = {c["what"]: c["why"] for c in doc["not_checked"]}
    assert "no NVIDIA driver" in unchecked["CUDA driver"] and "/nonexistent/libcuda.so.1" in unchecked["CUDA driver"]
    assert unchecked["peer copies (--p2p)"] == "0 GPU visible: a peer copy needs two"
    assert unchecked["NCCL all-reduce (--nccl)"] == "0 GPU visible: an all-reduce across GPUs needs two"
    f = codes(doc)["no_driver"]
    assert f["severity"] == "warning" and f["message"].startswith("No NVIDIA driver could be loaded")


def test_doctor_text_report_names_bad_visibility_entries_and_exits_1(fake_gpus):
    env = fake_gpus.env(visible="3,99,5", LOCAL_RANK="1", RANK="9", WORLD_SIZE="16", NCCL_DEBUG="WARN")
    proc = run_cli(["doctor"], env, timeout=240)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[0] == "gpuguard doctor: paste this report as it is into an issue"
    assert lines[2].startswith("gpuguard: ") and lines[4].startswith("python: ")
    assert ("launcher: environment variables (RANK, LOCAL_RANK, WORLD_SIZE): rank 9 of 16, local rank 1 (rank from "
            "RANK; world_size from WORLD_SIZE; local_rank from LOCAL_RANK)") in lines
    assert "NCCL_DEBUG=WARN" in lines
    assert "CUDA_VISIBLE_DEVICES: '3,99,5'" in lines
    assert "CUDA_VISIBLE_DEVICES entry 1 '3': index, cuda:0" in lines
    assert any(line.startswith("CUDA_VISIBLE_DEVICES entry 2 '99': rejected (entry 2 ('99') was rejected by the "
                               "driver: this host has no GPU 99") for line in lines)
    assert "CUDA_VISIBLE_DEVICES entry 3 '5': ignored (the driver stopped at entry 2)" in lines
    assert "devices visible: 1" in lines
    gpu3 = fake_gpus.topology("h100x8")["gpus"][3]
    assert f"GPU 0: NVIDIA H100 80GB HBM3, {gpu3['uuid']}, {gpu3['pci_bus_id']}, 79.6 GiB, cc 9.0" in lines
    assert "not checked: peer access: 1 GPU visible: peer access needs two" in lines
    error = next(line for line in lines if line.startswith("error: "))
    assert error.startswith("error: CUDA_VISIBLE_DEVICES='3,99,5': entry 2 ('99') was rejected by the driver")
    assert "so the driver shows only the 1 GPU before it (3)." in error
    assert lines[lines.index(error) + 1].startswith("  fix: List each GPU once, by index or UUID")
    # findings come last, errors first
    first_finding = lines.index(error)
    assert all(not line.startswith(("GPU ", "CUDA_VISIBLE", "not checked")) for line in lines[first_finding:])


def test_doctor_json_names_the_device_bind_would_use_or_the_rank_mapping_error(fake_gpus):
    code, doc = doctor_json([], fake_gpus.env(LOCAL_RANK="9", RANK="9", WORLD_SIZE="16"))
    assert code == 1 and doc["binding"]["device"] is None
    mapping = codes(doc)["rank_mapping"]
    assert mapping["message"].startswith("Rank 9 of 16 (environment variables (RANK, LOCAL_RANK, WORLD_SIZE)) "
                                         "cannot be bound to a GPU: its local rank is 9 (LOCAL_RANK), but this host")
    assert "Likely cause: the global rank is used as the local rank" in mapping["message"]
    assert doc["launcher"]["local_rank"] == 9 and doc["launcher"]["sources"]["local_rank"] == "LOCAL_RANK"
    assert doc["cuda_visible_devices"] == {"raw": None, "set": False, "honoured": [], "problem": None, "ignored": [],
                                           "hides_all_on_purpose": False}


def test_broken_peer_access_dropped_writes_and_nccl_cured_by_disabling_p2p(fake_gpus, tmp_path):
    topology = two_gpu_topology(fake_gpus, tmp_path, "h100x4_broken_p2p")
    code, doc = doctor_json(["--p2p", "--nccl", "--timeout", "3"], fake_gpus.env(topology))
    assert code == 1 and doc["exit_code"] == 1
    found = codes(doc)
    # the capability flag says yes, the bytes say no
    assert doc["peer_access"] == [[None, True], [True, None]]
    assert [(p["src"], p["dst"], p["verified"], p["destination_unchanged"]) for p in doc["p2p"]["pairs"]] == [
        (0, 1, False, True), (1, 0, False, True)]
    dropped = found["peer_writes_dropped"]
    assert dropped["severity"] == "error"
    assert dropped["message"].startswith("Peer copies report success but the data does not arrive on 2 GPU pair(s) "
                                         "(0->1, 1->0): 16777216 of 16777216 bytes differ, the destination "
                                         "untouched: peer writes are being dropped.")
    assert "The driver claims peer access for 2 of these pairs" in dropped["message"]
    assert "iommu=pt" in dropped["fix"]
    # NCCL hangs with P2P and completes without: the cure, recommended with its cost
    runs = doc["nccl"]["runs"]
    assert [(r["p2p_disabled"], r["verdict"]) for r in runs] == [(False, "timed out"), (True, "ok")]
    # as on a GPU, ncclAllReduce returned once enqueued: the hang shows where the host waits for its kernel
    assert runs[0]["problem"] == "2 of 2 ranks did not finish within 3 s (rank 0 was at synchronize)"
    assert "the all-reduce did not finish on the GPU within 3 s" in runs[0]["ranks"][0]["error"]["message"]
    cure = found["nccl_hangs_with_p2p"]
    assert cure["severity"] == "error"
    assert "completes with NCCL_P2P_DISABLE=1: peer-to-peer is broken on this machine" in cure["message"]
    assert cure["fix"].startswith("export NCCL_P2P_DISABLE=1 for jobs on this machine. What it costs:")
    assert "7-10 %" in cure["fix"] and "disable PCIe ACS" in cure["fix"]
    assert all(r["all_reduce_result"] for r in runs[1]["ranks"])


def test_healthy_machine_verifies_copies_and_calls_a_set_p2p_disable_unneeded(fake_gpus, tmp_path):
    topology = two_gpu_topology(fake_gpus, tmp_path, "h100x4")
    code, doc = doctor_json(["--p2p", "--nccl", "--timeout", "20"], fake_gpus.env(topology, NCCL_P2P_DISABLE="1"))
    assert code == 0, doc["findings"]
    assert doc["launcher"]["launcher"] == "single"
    assert (doc["binding"]["device"], doc["binding"]["local_rank"]) == (0, 0)
    found = codes(doc)
    assert found["peer_copies_verified"]["message"] == ("Peer copies verified byte for byte on all 2 ordered GPU "
                                                        "pairs (2 over the direct peer path, 0 staged through host "
                                                        "memory).")
    assert [(r["p2p_disabled"], r["verdict"]) for r in doc["nccl"]["runs"]] == [(False, "ok")]
    assert found["nccl_ok"]["severity"] == "info"
    assert found["p2p_disable_unneeded"]["severity"] == "warning"
    assert found["p2p_disable_unneeded"]["fix"] == "unset NCCL_P2P_DISABLE"
    assert "nccl_hangs_with_p2p" not in found


def test_nccl_hang_that_p2p_does_not_cure_is_not_blamed_on_p2p(fake_gpus, tmp_path):
    topology = two_gpu_topology(fake_gpus, tmp_path, "h100x4_nccl_hang")
    code, doc = doctor_json(["--nccl", "--timeout", "2"], fake_gpus.env(topology))
    assert code == 1
    assert [(r["p2p_disabled"], r["verdict"]) for r in doc["nccl"]["runs"]] == [(False, "timed out"),
                                                                                (True, "timed out")]
    found = codes(doc)
    assert "nccl_hangs_with_p2p" not in found
    assert "disabling P2P is not the cure here, so gpuguard does not recommend it" in found["nccl_hangs"]["message"]
    assert "NCCL_P2P_DISABLE=1" not in found["nccl_hangs"]["fix"]


def test_nccl_failure_is_decoded_by_explain(fake_gpus, tmp_path):
    topology = two_gpu_topology(fake_gpus, tmp_path, "h100x4_nccl_duplicate")
    code, doc = doctor_json(["--nccl", "--timeout", "20"], fake_gpus.env(topology))
    assert code == 1
    assert [r["verdict"] for r in doc["nccl"]["runs"]] == ["failed"]  # a failure is not retried without P2P
    failed = codes(doc)["nccl_failed"]
    assert "gpuguard explain: Two or more ranks of one NCCL communicator are on the same GPU" in failed["message"]
    assert "torch.cuda.set_device(local_rank)" in failed["fix"]


# ---- deadlines ------------------------------------------------------------------------------------------------

def test_a_hung_probe_child_is_killed_at_the_deadline_and_its_progress_kept():
    from gpuguard.probes.run import run_child

    code = ("import json, sys, time\n"
            "print(json.dumps({'event': 'start', 'src': 0, 'dst': 1}), flush=True)\n"
            "time.sleep(600)\n")
    start = time.monotonic()
    run = run_child([sys.executable, "-c", code], {}, timeout=2.0)
    assert time.monotonic() - start < 30
    assert run.timed_out and run.returncode is not None and run.returncode < 0
    assert run.events == [{"event": "start", "src": 0, "dst": 1}]


def test_a_peer_copy_that_hangs_is_named(monkeypatch):
    import gpuguard.probes.run as probes
    from gpuguard.doctor_report import DoctorReport, _p2p

    # a probe child that copies 0 -> 1, then hangs in 1 -> 0, as a broken driver would
    script = ("import json, time\n"
              "for e in [{'event': 'devices', 'count': 2}, {'event': 'start', 'src': 0, 'dst': 1},\n"
              "          {'event': 'result', 'src': 0, 'dst': 1, 'bytes': 8, 'error': None, 'verified': True,\n"
              "           'peer_access_enabled': True}, {'event': 'start', 'src': 1, 'dst': 0}]:\n"
              "    print(json.dumps(e), flush=True)\n"
              "time.sleep(600)\n")
    monkeypatch.setattr(probes, "probe_command", lambda *args: [sys.executable, "-c", script])
    report = DoctorReport()
    report.devices = [Device(i, "NVIDIA H100", UUIDS[i], "0000:18:00.0", 1, (9, 0)) for i in range(2)]
    start = time.monotonic()
    _p2p(report, 2.0)
    assert time.monotonic() - start < 30
    assert report.p2p is not None and report.p2p["hung_pair"] == [1, 0] and report.p2p["timed_out"] is True
    [finding] = report.findings
    assert (finding.severity, finding.code) == ("error", "peer_copy_hang")
    assert finding.message == ("The peer copies did not finish within 2 s while copying GPU 1 -> GPU 0: GPU "
                               "peer-to-peer hangs on this machine.")
    assert report.exit_code == 1


def test_doctor_rejects_a_non_positive_timeout(capsys):
    from gpuguard.cli import main

    assert main(["doctor", "--timeout", "0"]) == 2
    assert capsys.readouterr().err == "gpuguard doctor: --timeout must be a positive number of seconds, not 0\n"


# ---- compute processes per GPU (NVML) ------------------------------------------------------------------------

def test_doctor_lists_each_gpus_processes_and_flags_the_users_older_than_this_login(fake_gpus, tmp_path):
    import os
    import subprocess

    leftover = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)  # yesterday's run"])
    try:
        time.sleep(1.2)  # start times are kept in clock ticks: the leftover starts clearly before the session
        topo = fake_gpus.topology("h100x4")
        topo["gpus"][1]["processes"] = [{"pid": leftover.pid, "used_mib": 20480}, {"pid": 4_100_001, "used_mib": 512}]
        path = tmp_path / "topology.json"
        path.write_text(json.dumps(topo))
        env = fake_gpus.env(str(path))
        # a new session stands for a new login (or job): its leader starts after the leftover
        proc = subprocess.run([sys.executable, "-m", "gpuguard", "doctor", "--json"], env=env, capture_output=True,
                              text=True, timeout=SNIPPET_TIMEOUT_S, start_new_session=True)
        doc = json.loads(proc.stdout)
        rows = {r["device"]: r for r in doc["gpu_processes"]}
        assert rows[0]["processes"] == [] and len(rows) == 4
        pids = {p["pid"]: p for p in rows[1]["processes"]}
        assert pids[leftover.pid]["bytes"] == 20480 << 20 and pids[leftover.pid]["older_than_session"] is True
        assert "yesterday's run" in pids[leftover.pid]["description"]
        assert pids[4_100_001]["older_than_session"] is False
        assert pids[4_100_001]["description"].startswith("not visible from this pid namespace")
        stale = codes(doc)["stale_gpu_process"]
        assert stale["severity"] == "warning"
        assert stale["message"].startswith(f"pid {leftover.pid} (") and "holds 20.0 GiB of GPU 1" in stale["message"]
        assert f"kill {leftover.pid}" in stale["fix"]
        text = subprocess.run([sys.executable, "-m", "gpuguard", "doctor"], env=env, capture_output=True, text=True,
                              timeout=SNIPPET_TIMEOUT_S, start_new_session=True).stdout
        assert f"GPU 1 processes (59.1 GiB of 79.6 GiB free): pid {leftover.pid} 20.0 GiB (" in text
        assert "[older than this login/job]" in text and "GPU 0 processes (79.6 GiB of 79.6 GiB free): none" in text
    finally:
        leftover.kill()
        leftover.wait()
    assert os.getpid() > 0


def test_doctor_without_nvml_says_why_processes_were_not_checked(fake_gpus):
    code, doc = doctor_json([], fake_gpus.env("h100x4", GPUGUARD_LIBNVML="/nonexistent/libnvidia-ml.so.1"))
    assert doc["gpu_processes"] is None
    assert any(u["what"] == "GPU processes" and "libnvidia-ml.so.1" in u["why"] for u in doc["not_checked"])
