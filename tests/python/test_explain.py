"""gpuguard.explain / `gpuguard explain`: failure texts written from the formats in NCCL, PyTorch and Ray
source (each cited beside its sample), decoded into kinds, ranks, devices, causes and fixes; logs of any size
or content read in bounded memory."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys

import pytest

from gg_testing.paths import ROOT
from gg_testing.procs import run_cli, run_json

from gpuguard.logs import (
    MAX_LINE_CHARS,
    LogExplainer,
    explain,
    format_diagnoses,
    nccl_device_to_pci_bus_id,
)

pytestmark = pytest.mark.version_independent  # CI runs this file on the oldest corner only (pyproject's markers)


def nccl_bus_id_to_int64(bus_id: str) -> int:
    """Reference copy of NCCL's busIdToInt64 (src/misc/utils.cc): skip ':' and '.', read the hex digits."""
    digits = ""
    for c in bus_id:
        if c in ".:":
            continue
        if c in "0123456789abcdefABCDEF":
            digits += c
        else:
            break
    return int(digits, 16)


def one(found, kind):
    matching = [d for d in found if d.kind == kind]
    assert len(matching) == 1, [d.kind for d in found]
    return matching[0]


# ---- PCI bus ids ------------------------------------------------------------------------------------------

def test_nccl_device_number_decodes_to_the_pci_bus_id_as_in_the_issue():
    assert nccl_device_to_pci_bus_id("10000") == "0000:10:00.0"
    assert nccl_device_to_pci_bus_id("50") == "0000:00:05.0"


@pytest.mark.parametrize("bus_id", ["0000:18:00.0", "0000:2a:00.0", "0000:db:1f.7", "0001:c1:00.1", "0000:00:05.0"])
def test_decoding_inverts_nccls_bus_id_to_int64(bus_id):
    printed = format(nccl_bus_id_to_int64(bus_id), "x")  # NCCL prints the int64 with %lx
    assert nccl_device_to_pci_bus_id(printed) == bus_id


@pytest.mark.parametrize("junk", ["", "xyz", "12345678901234567", "-5", "1 0"])
def test_decoding_refuses_what_nccl_cannot_have_printed(junk):
    assert nccl_device_to_pci_bus_id(junk) is None


# ---- NCCL duplicate GPU -----------------------------------------------------------------------------------

# torch/csrc/distributed/c10d/NCCLUtils.hpp, C10D_NCCL_CHECK: "NCCL error in: " file ":" line ", " +
# ncclGetErrorWithVersion (ncclGetErrorString + ", NCCL version " + version) + "\n" + getNcclErrorDetailStr
# ("ncclInvalidUsage: This usually reflects invalid usage of NCCL library." + "\nLast error:\n" +
# ncclGetLastError); the last error is NCCL's WARN text (src/init.cc). torch's excepthook prefixes "[rankN]: ".
TORCH_DUPLICATE = """\
[rank1]: Traceback (most recent call last):
[rank1]:   File "/work/train.py", line 12, in <module>
[rank1]:     dist.barrier()
[rank1]: torch.distributed.DistBackendError: NCCL error in: /pytorch/torch/csrc/distributed/c10d/NCCLUtils.cpp:77, invalid usage (run with NCCL_DEBUG=WARN for details), NCCL version 2.21.5
[rank1]: ncclInvalidUsage: This usually reflects invalid usage of NCCL library.
[rank1]: Last error:
[rank1]: Duplicate GPU detected : rank 1 and rank 0 both on CUDA device 10000
[rank3]: Last error:
[rank3]: Duplicate GPU detected : rank 3 and rank 2 both on CUDA device 50
[rank0]: Duplicate GPU detected : rank 0 and rank 1 both on CUDA device 10000
"""


def test_duplicate_gpu_names_every_rank_per_device_and_decodes_the_bus_ids():
    d = one(explain(TORCH_DUPLICATE, match_local=False), "duplicate_gpu")
    assert d.ranks == (0, 1, 2, 3)
    assert d.summary == ("Two or more ranks of one NCCL communicator are on the same GPU: ranks 0, 1 share "
                         "0000:10:00.0; ranks 2, 3 share 0000:00:05.0.")
    assert d.devices == ("0000:10:00.0 (NCCL's 'CUDA device 10000')", "0000:00:05.0 (NCCL's 'CUDA device 50')")
    assert "torch.cuda.set_device(local_rank)" in d.fix and "gpuguard.init_process_group()" in d.fix
    assert "NCCL_MULTI_RANK_GPU_ENABLE" not in d.fix  # that advice belongs to the 2.30 message only
    assert d.occurrences == 3
    assert [e.line for e in d.evidence] == [7, 9, 10]
    assert d.evidence[0].text == "Duplicate GPU detected : rank 1 and rank 0 both on CUDA device 10000"


def test_duplicate_gpu_cause_reads_the_pattern_of_ranks():
    # every rank on one GPU: the missing set_device case
    all_on_one = "\n".join(f"Duplicate GPU detected : rank {r} and rank 0 both on CUDA device 18000"
                           for r in (1, 2, 3))
    d = one(explain(all_on_one, match_local=False), "duplicate_gpu")
    assert d.ranks == (0, 1, 2, 3)
    assert "Every rank named is on the same GPU" in d.cause and "set_device was not called" in d.cause
    # ranks k and k+2 share: two processes per GPU, device = rank % 2
    wrapped = ("Duplicate GPU detected : rank 2 and rank 0 both on CUDA device 18000\n"
               "Duplicate GPU detected : rank 3 and rank 1 both on CUDA device 2a000\n")
    d = one(explain(wrapped, match_local=False), "duplicate_gpu")
    assert "differ by 2" in d.cause and "nproc_per_node larger than the GPU count" in d.cause


# NCCL >= 2.30, src/init.cc: WARN("Multiple Ranks are using the same GPU/Partition. Set
# NCCL_MULTI_RANK_GPU_ENABLE=1 to enable this configuration."); the WARN line prefix is src/debug.cc's
# "host:pid:tid [cudaDev] file:line (func) NCCL WARN ".
NCCL_230 = """\
[rank2]:node7:4242:4242 [0] init.cc:1141 (initTransportsRank) NCCL WARN Multiple Ranks are using the same GPU/Partition. Set NCCL_MULTI_RANK_GPU_ENABLE=1 to enable this configuration.
[rank3]:node7:4243:4243 [0] init.cc:1141 (initTransportsRank) NCCL WARN Multiple Ranks are using the same GPU/Partition. Set NCCL_MULTI_RANK_GPU_ENABLE=1 to enable this configuration.
"""


def test_nccl_230_duplicate_message_is_recognised_and_says_what_nccl_does_not():
    d = one(explain(NCCL_230, match_local=False), "duplicate_gpu")
    assert d.ranks == (2, 3)
    assert "(reported by ranks 2, 3)" in d.summary
    assert "NCCL 2.30 and later do not say which ranks or which GPU" in d.summary
    assert d.devices == ("cuda:0 in the process of rank 2, host node7, pid 4242",
                         "cuda:0 in the process of rank 3, host node7, pid 4243")
    assert "NCCL_MULTI_RANK_GPU_ENABLE=1 only if sharing is intended" in d.fix


def test_duplicate_gpu_is_matched_to_the_local_gpu_index_and_uuid(fake_gpus):
    gpus = fake_gpus.topology("h100x8")["gpus"]
    number = format(nccl_bus_id_to_int64(gpus[6]["pci_bus_id"]), "x")
    here = socket.gethostname().split(".")[0]
    text = (f"Duplicate GPU detected : rank 4 and rank 5 both on CUDA device {number}\n"
            f"{here}:11:11 [6] init.cc:871 NCCL WARN Duplicate GPU detected : rank 6 and rank 7 both on CUDA "
            f"device {number}\n"
            f"othernode:12:12 [0] init.cc:871 NCCL WARN Duplicate GPU detected : rank 9 and rank 8 both on CUDA "
            f"device {number}\n")
    got = run_json(f"""
        import json, gpuguard
        d = gpuguard.explain({text!r})[0]
        print(json.dumps(d.as_dict()))
    """, fake_gpus.env(visible="6,7"))
    bus, uuid = gpus[6]["pci_bus_id"], gpus[6]["uuid"]
    assert got["devices"] == [
        f"{bus} (NCCL's 'CUDA device {number}') = GPU 0 here ({uuid}), if the job ran on this host",
        f"{bus} (NCCL's 'CUDA device {number}') = GPU 0 on this host ({uuid})",
        f"{bus} (NCCL's 'CUDA device {number}') on host othernode (not this host, {here}: not matched to a local "
        "GPU)",
    ]
    assert f"ranks 8, 9 share {bus} on host othernode" in got["summary"]


# ---- invalid device ordinal -------------------------------------------------------------------------------

# CUDA's error string for cudaErrorInvalidDevice as torch raises it (c10/cuda/CUDAException.h), with the hint
# from c10/cuda/CUDAMiscFunctions.cpp and the suffix of get_cuda_check_suffix(); torch >= 2.8 raises
# torch.AcceleratorError.
INVALID_ORDINAL = """\
[rank9]: Traceback (most recent call last):
[rank9]:   File "/work/train.py", line 8, in main
[rank9]:     torch.cuda.set_device(rank)
[rank8]:     torch.cuda.set_device(rank)
[rank9]: torch.AcceleratorError: CUDA error: invalid device ordinal
[rank9]: GPU device may be out of range, do you have enough GPUs?
[rank9]: CUDA kernel errors might be asynchronously reported at some other API call, so the stacktrace below might be incorrect.
[rank9]: For debugging consider passing CUDA_LAUNCH_BLOCKING=1
[rank8]: torch.AcceleratorError: CUDA error: invalid device ordinal
"""


def test_invalid_device_ordinal_explains_rank_versus_local_rank():
    d = one(explain(INVALID_ORDINAL), "invalid_device_ordinal")
    assert d.ranks == (8, 9)
    assert d.summary.startswith("CUDA rejected a device index on ranks 8, 9:")
    assert "GLOBAL rank where the LOCAL rank belongs" in d.cause
    assert "The lowest failing rank is 8" in d.cause and "has 8 GPU(s)" in d.cause
    assert "torch.cuda.set_device(int(os.environ['LOCAL_RANK']))" in d.fix and "gpuguard.bind()" in d.fix
    # the traceback line that chose the device is shown with the error, for the same rank
    assert (3, "torch.cuda.set_device(rank)") in [(e.line, e.text) for e in d.evidence]
    assert (5, "torch.AcceleratorError: CUDA error: invalid device ordinal") in [(e.line, e.text) for e in d.evidence]


def test_ray_worker_prefixes_with_colour_codes_identify_the_process():
    # Ray's driver echoes worker output as "(Actor pid=N, ip=A) line", coloured (ray/_private/worker.py)
    text = ("\x1b[36m(RayTrainWorker pid=2231, ip=10.0.0.7)\x1b[0m     torch.cuda.set_device(device)\n"
            "\x1b[36m(RayTrainWorker pid=2231, ip=10.0.0.7)\x1b[0m RuntimeError: CUDA error: invalid device ordinal\n")
    d = one(explain(text), "invalid_device_ordinal")
    assert d.ranks == ()
    assert "in host 10.0.0.7, pid 2231" in d.summary
    assert [e.text for e in d.evidence] == ["torch.cuda.set_device(device)",
                                            "RuntimeError: CUDA error: invalid device ordinal"]


def test_torchrun_role_prefix_gives_the_local_rank():
    # torchrun tees worker output as "[{role}{local_rank}]:" (torch/distributed/elastic/multiprocessing/tail_log.py)
    d = one(explain("[default3]:RuntimeError: CUDA error: invalid device ordinal\n"), "invalid_device_ordinal")
    assert "on local rank 3" in d.summary


# ---- device mismatch ----------------------------------------------------------------------------------------

# aten/src/ATen/core/op_registration/adaption.cpp (common_device_check_failure) up to torch 2.5, and
# TensorIterator's first sentence alone; since torch 2.6 adaption.cpp's "but got ... is on ..." form.
MISMATCH_OLD = ("RuntimeError: Expected all tensors to be on the same device, but found at least two devices, "
                "cuda:3 and cuda:1! (when checking argument for argument mat1 in method wrapper_CUDA_addmm)")
MISMATCH_ITER = "RuntimeError: Expected all tensors to be on the same device, but found at least two devices, cuda:0 and cpu!"
MISMATCH_NEW = ("RuntimeError: Expected all tensors to be on the same device, but got mat2 is on cuda:0, different "
                "from other tensors on cuda:2 (when checking argument in method wrapper_CUDA_mm)")


def test_device_mismatch_all_variants_name_devices_argument_and_point_at_gpuguard():
    found = explain("\n".join(["[rank2]: " + MISMATCH_OLD, MISMATCH_ITER, "[rank5]: " + MISMATCH_NEW]))
    d = one(found, "device_mismatch")
    assert d.ranks == (2, 5)
    assert d.devices == ("cuda:3", "cuda:1", "cuda:0", "cpu", "cuda:2")
    assert ("cuda:3 and cuda:1 (argument mat1 of wrapper_CUDA_addmm); cuda:0 and cpu; "
            "cuda:0 and cuda:2 (argument mat2 of wrapper_CUDA_mm)") in d.summary
    assert "gpuguard.assert_same_device(model, *inputs)" in d.fix and "gpuguard.guard(model, deep=True)" in d.fix
    assert "One side is the CPU" in d.cause
    assert d.occurrences == 3


# ---- NCCL watchdog --------------------------------------------------------------------------------------------

def watchdog(prefix: str, seq: int, op: str, ran: int) -> str:
    # torch/csrc/distributed/c10d/ProcessGroupNCCL.cpp: logPrefix() + "Watchdog caught collective operation
    # timeout: " + operator<<(WorkNCCL) + " ran for " + ms + " milliseconds before timing out."
    return (f"{prefix}[E1121 05:00:00.123456 ProcessGroupNCCL.cpp:683] [PG ID 0 PG GUID 0(default_pg) Rank "
            f"{prefix[5:-3]}] Watchdog caught collective operation timeout: WorkNCCL(SeqNum={seq}, OpType={op}, "
            f"NumelIn=1, NumelOut=1, Timeout(ms)=600000) ran for {ran} milliseconds before timing out.")


def test_watchdog_timeout_on_the_first_collective_points_at_p2p():
    text = "\n".join([watchdog("[rank0]:", 1, "ALLREDUCE", 600017), watchdog("[rank1]:", 1, "ALLREDUCE", 600020),
                      # same file, watchdog loop: "Timeout at NCCL work: ..., last completed NCCL work: -1."
                      "[rank1]:[E1121 05:00:00 ProcessGroupNCCL.cpp:1537] [PG 0 Rank 1] Timeout at NCCL work: 1, "
                      "last enqueued NCCL work: 1, last completed NCCL work: -1."])
    found = explain(text)
    assert [d.kind for d in found] == ["nccl_first_collective_hang"]
    d = found[0]
    assert d.ranks == (0, 1)
    assert d.summary.startswith("NCCL's first collective never completed (ALLREDUCE #1 on ranks 0, 1) within the "
                                "600 s timeout")
    assert "NCCL_P2P_DISABLE=1" in d.fix and "gpuguard doctor --p2p --nccl" in d.fix
    assert "ACS" in d.cause


def test_watchdog_timeout_later_in_the_run_is_a_desync_not_p2p():
    # releases before 2.2 printed "[Rank N] " and "TensorShape=[...]" instead of NumelIn/NumelOut
    old = ("[Rank 3] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=5120, OpType=BROADCAST, "
           "TensorShape=[1024], Timeout(ms)=1800000) ran for 1800321 milliseconds before timing out.")
    found = explain("\n".join([watchdog("[rank2]:", 5121, "ALLREDUCE", 600001), old]))
    d = one(found, "nccl_timeout")
    assert d.ranks == (2, 3)
    assert "BROADCAST #5120 on rank 3; ALLREDUCE #5121 on rank 2" in d.summary
    assert "NCCL_P2P_DISABLE" not in d.fix
    assert "TORCH_NCCL_DUMP_ON_TIMEOUT=1" in d.fix


# ---- Ray ------------------------------------------------------------------------------------------------------

def test_ray_raylet_gpu_count():
    # python/ray/_private/resource_and_label_spec.py, _resolve_accelerator_resources
    num_accelerators, name, env, ids = 4, "GPU", "CUDA_VISIBLE_DEVICES", ["2", "3"]
    text = (f"ValueError: Attempting to start raylet with {num_accelerators} {name}, but {env} contains {ids}.")
    d = one(explain(text), "ray_gpu_count")
    assert d.summary == ("Ray refused to start: asked for 4 GPU, but CUDA_VISIBLE_DEVICES lets this process see 2 "
                         "(2, 3).")
    assert "Ask for at most 2 GPU(s)" in d.fix
    assert d.devices == ("CUDA_VISIBLE_DEVICES entry '2'", "CUDA_VISIBLE_DEVICES entry '3'")


@pytest.mark.slow
@pytest.mark.ray_cluster
def test_the_message_real_ray_prints_is_recognised(tmp_path):
    env = dict(os.environ, CUDA_VISIBLE_DEVICES="2,3", RAY_USAGE_STATS_ENABLED="0")
    code = "import ray\ntry:\n    ray.init(num_gpus=4, include_dashboard=False)\nexcept Exception as e:\n    print(e)\n"
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert "Attempting to start raylet" in proc.stdout, proc.stdout + proc.stderr
    d = one(explain(proc.stdout + proc.stderr), "ray_gpu_count")
    assert "asked for 4 GPU" in d.summary and "see 2 (2, 3)" in d.summary


# ---- unknown text ---------------------------------------------------------------------------------------------

def test_unknown_text_is_said_to_be_unknown_never_guessed():
    text = "RuntimeError: CUDA out of memory. Tried to allocate 2.00 GiB\nSegmentation fault (core dumped)\n"
    assert explain(text) == []
    assert format_diagnoses([], 2).startswith("gpuguard recognised no failure it knows in this text (2 line(s) "
                                              "read).")


def test_near_misses_are_not_recognised():
    # the keywords alone, without the message shapes around them, are not diagnoses
    assert explain("grep 'Duplicate GPU detected' log.txt\nWatchdog caught collective operation timeout: soon?\n"
                   "Attempting to start raylet with many GPUs\n") == []


# ---- hostile input --------------------------------------------------------------------------------------------

def test_binary_garbage_with_a_message_inside_is_handled():
    garbage = bytes(range(256)) * 64 + b"\xff\xfe\x00\x00"
    data = garbage + b"\nDuplicate GPU detected : rank 1 and rank 0 both on CUDA device 10000\n" + garbage
    d = one(explain(data, match_local=False), "duplicate_gpu")
    assert d.ranks == (0, 1)


def test_an_overlong_line_is_cut_and_the_next_lines_still_read():
    text = "x" * (MAX_LINE_CHARS * 5) + "\nRuntimeError: CUDA error: invalid device ordinal\n"
    explainer = LogExplainer(match_local=False)
    import io

    explainer.feed_stream(io.BytesIO(text.encode()))
    assert explainer.lines == 2
    assert [d.kind for d in explainer.diagnoses()] == ["invalid_device_ordinal"]


def test_caps_hold_however_many_ranks_and_lines_repeat():
    lines = "\n".join(f"Duplicate GPU detected : rank {r} and rank {r + 1} both on CUDA device 10000"
                      for r in range(0, 20000, 2))
    d = one(explain(lines, match_local=False), "duplicate_gpu")
    assert len(d.ranks) == 4096 and len(d.evidence) == 6 and d.occurrences == 10000


BOUNDED = r"""
import json, os, resource, sys, time
from gpuguard.logs import explain_file
path = sys.argv[1]
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
start = time.perf_counter()
found = explain_file(path, match_local=False)
seconds = time.perf_counter() - start
after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
print(json.dumps({"kinds": [d.kind for d in found], "ranks": [list(d.ranks) for d in found],
                  "growth_kib": after - before, "seconds": seconds, "size": os.path.getsize(path)}))
"""


def test_a_100_mb_log_and_a_100_mb_line_are_read_in_bounded_memory(tmp_path):
    path = tmp_path / "huge.log"
    noise = "".join(f"[rank{r % 64}]:[I1121 05:00:00 train.py:{r}] step {r} loss 0.{r:04d} lr 3e-4 tokens/s 812345\n"
                    for r in range(2000)).encode()
    with open(path, "wb") as f:
        f.write(b"[rank7]: Duplicate GPU detected : rank 7 and rank 3 both on CUDA device 10000\n")
        while f.tell() < 50 * 2**20:
            f.write(noise)
        f.write(b"[rank12]: torch.AcceleratorError: CUDA error: invalid device ordinal\n")
        f.write(b"\x00\xff" * (25 * 2**20))  # a 50 MB line of binary garbage, no newline
        f.write(b"\n[rank1]: " + MISMATCH_OLD.encode() + b"\n")
    proc = subprocess.run([sys.executable, "-c", BOUNDED, str(path)], capture_output=True, text=True, timeout=300,
                          env=dict(os.environ, PYTHONPATH=str(ROOT / "python")))
    assert proc.returncode == 0, proc.stderr
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    assert got["size"] >= 100 * 2**20
    assert got["kinds"] == ["duplicate_gpu", "invalid_device_ordinal", "device_mismatch"]
    assert got["ranks"] == [[3, 7], [12], [1]]
    # peak RSS may grow by the reader's buffers and the caps, never with the size of the log
    assert got["growth_kib"] < 16 * 1024, got


# ---- command line ---------------------------------------------------------------------------------------------

def test_cli_explain_a_file_with_local_matching(fake_gpus, tmp_path):
    log = tmp_path / "job.log"
    log.write_text(TORCH_DUPLICATE + INVALID_ORDINAL)
    proc = run_cli(["explain", str(log)], fake_gpus.env())
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("1. [duplicate_gpu] Two or more ranks of one NCCL communicator are on the same GPU")
    assert "(no GPU visible here has this bus id: the log is from another host, or it is hidden here)" in proc.stdout
    assert "2. [invalid_device_ordinal]" in proc.stdout
    assert "   fix:      " in proc.stdout and "   evidence: line 7: Duplicate GPU detected" in proc.stdout


def run_main(monkeypatch, capsys, args, stdin=""):
    """The CLI in this process (no CUDA is touched with --no-local): saves a torch import per case."""
    import io

    from gpuguard.cli import main

    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(stdin.encode())))
    code = main(args)
    out = capsys.readouterr()
    return code, out.out, out.err


def test_cli_explain_json_stdin_and_exit_codes(monkeypatch, capsys, tmp_path):
    code, out, _ = run_main(monkeypatch, capsys, ["explain", "-", "--json", "--no-local"], stdin=NCCL_230)
    assert code == 0
    doc = json.loads(out)
    assert doc["recognised"] is True and doc["lines_read"] == 2
    assert set(doc["diagnoses"][0]) == {"kind", "summary", "ranks", "devices", "cause", "fix", "evidence",
                                        "occurrences", "unreadable"}
    assert doc["diagnoses"][0]["unreadable"] == []
    assert doc["diagnoses"][0]["evidence"][0] == {"line": 1, "text": NCCL_230.splitlines()[0][len("[rank2]:"):]}

    code, out, _ = run_main(monkeypatch, capsys, ["explain", "--json", "--no-local"], stdin="all good here\n")
    assert code == 1
    assert json.loads(out) == {"recognised": False, "lines_read": 1, "diagnoses": []}

    code, out, _ = run_main(monkeypatch, capsys, ["explain", "--no-local"], stdin="all good here\n")
    assert code == 1 and out.startswith("gpuguard recognised no failure it knows")

    missing = tmp_path / "missing.log"
    code, out, err = run_main(monkeypatch, capsys, ["explain", "--no-local", str(missing)])
    assert code == 2 and out == ""
    assert err == f"gpuguard explain: cannot read {missing}: No such file or directory\n"
