"""`gpuguard explain` on torch's CUDA out-of-memory message (torch >= 2.1), from texts users posted, each cited:
the GPU, its capacity and free memory, every process with its memory, which is this process, and the pattern."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

from gg_testing.paths import ROOT
from gg_testing.procs import run_cli
from gpuguard.logs import LogExplainer, explain, kinds_in
from gpuguard.logs.recognisers.cuda_oom import parse_message

pytestmark = pytest.mark.version_independent  # CI runs this file on the oldest corner only (pyproject's markers)

# awslabs/keys_values#92 (torch 2.9 era wording: torch.OutOfMemoryError, PYTORCH_ALLOC_CONF), rank 0 of a 4-rank
# job on A100 40GB: three other ranks (and a fourth process) hold 414 MiB each on its GPU.
STRAY_RANK_PREFIXED = (
    "[rank0]: torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 572.00 MiB. GPU 0 has a total capacity of "
    "39.49 GiB of which 321.31 MiB is free. Process 3721648 has 414.00 MiB memory in use. Including non-PyTorch "
    "memory, this process has 37.46 GiB memory in use. Process 1374765 has 414.00 MiB memory in use. Process 1374763 "
    "has 414.00 MiB memory in use. Process 1374764 has 414.00 MiB memory in use. Of the allocated memory 36.04 GiB is "
    "allocated by PyTorch, and 321.37 MiB is reserved by PyTorch but unallocated. If reserved but unallocated memory "
    "is large try setting PYTORCH_ALLOC_CONF=expandable_segments:True to avoid fragmentation.  See documentation for "
    "Memory Management  (https://pytorch.org/docs/stable/notes/cuda.html#environment-variables)")
# netease-youdao/QAnything#303 (torch 2.1: "capacty", max_split_size_mb): one other process of 662 MiB.
STRAY_TORCH_2_1 = (
    "torch.cuda.OutOfMemoryError: CUDA out of memory. Tried to allocate 132.00 MiB. GPU 0 has a total capacty of "
    "23.64 GiB of which 67.06 MiB is free. Process 250345 has 662.00 MiB memory in use. Including non-PyTorch memory, "
    "this process has 22.90 GiB memory in use. Of the allocated memory 18.70 GiB is allocated by PyTorch, and 353.02 "
    "MiB is reserved by PyTorch but unallocated. If reserved but unallocated memory is large try setting "
    "max_split_size_mb to avoid fragmentation.  See documentation for Memory Management and PYTORCH_CUDA_ALLOC_CONF")
# rwth-i6/returnn#1649 (torch 2.2+ wording): the crashed previous run, pid 118636, still holds 71.62 GiB.
LEFTOVER = (
    "OutOfMemoryError: CUDA out of memory. Tried to allocate 290.00 MiB. GPU 0 has a total capacity of 93.00 GiB of "
    "which 134.94 MiB is free. Process 118636 has 71.62 GiB memory in use. Including non-PyTorch memory, this process "
    "has 21.24 GiB memory in use. Of the allocated memory 19.85 GiB is allocated by PyTorch, and 731.17 MiB is "
    "reserved by PyTorch but unallocated. If reserved but unallocated memory is large try setting "
    "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True to avoid fragmentation.  See documentation for Memory "
    "Management  (https://pytorch.org/docs/stable/notes/cuda.html#environment-variables)")
# qingze-bai/VSmTrans#3 (torch 2.2+ wording): nobody but this process.
GENUINE = (
    "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 226.00 MiB. GPU 0 has a total capacity of 15.70 "
    "GiB of which 210.38 MiB is free. Including non-PyTorch memory, this process has 15.48 GiB memory in use. Of the "
    "allocated memory 14.81 GiB is allocated by PyTorch, and 336.73 MiB is reserved by PyTorch but unallocated. If "
    "reserved but unallocated memory is large try setting PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True to avoid "
    "fragmentation.  See documentation for Memory Management")
# Synthintel0/MyGirlGPT#11 (torch 2.1 wording): nobody but this process.
GENUINE_TORCH_2_1 = (
    "torch.cuda.OutOfMemoryError: CUDA out of memory. Tried to allocate 32.00 MiB. GPU 0 has a total capacty of 4.00 "
    "GiB of which 41.56 MiB is free. Including non-PyTorch memory, this process has 3.44 GiB memory in use. Of the "
    "allocated memory 2.58 GiB is allocated by PyTorch, and 1.90 MiB is reserved by PyTorch but unallocated. If "
    "reserved but unallocated memory is large try setting max_split_size_mb to avoid fragmentation.  See "
    "documentation for Memory Management and PYTORCH_CUDA_ALLOC_CONF.")
# vllm-project/vllm#2140 (torch 2.1.2): no entry marked "this process"; pid 2417585 holds what PyTorch allocated here,
# so it is this process under the host's pid (a container).
HOST_PID = (
    "torch.cuda.OutOfMemoryError: CUDA out of memory. Tried to allocate 518.00 MiB. GPU 0 has a total capacty of "
    "21.67 GiB of which 4.06 MiB is free. Process 2417585 has 21.65 GiB memory in use. Of the allocated memory 21.32 "
    "GiB is allocated by PyTorch, and 1018.00 KiB is reserved by PyTorch but unallocated. If reserved but unallocated "
    "memory is large try setting max_split_size_mb to avoid fragmentation.  See documentation for Memory Management "
    "and PYTORCH_CUDA_ALLOC_CONF")
# chatchat-space/Langchain-Chatchat#3992 (torch 2.1): 128 GiB asked of a 23.65 GiB GPU.
LARGER_THAN_THE_GPU = (
    "CUDA out of memory. Tried to allocate 128.00 GiB. GPU 0 has a total capacty of 23.65 GiB of which 7.95 GiB is "
    "free. Process 1957120 has 7.10 GiB memory in use. Including non-PyTorch memory, this process has 8.58 GiB memory "
    "in use. Of the allocated memory 8.13 GiB is allocated by PyTorch, and 8.94 MiB is reserved by PyTorch but "
    "unallocated. If reserved but unallocated memory is large try setting max_split_size_mb to avoid fragmentation.  "
    "See documentation for Memory Management and PYTORCH_CUDA_ALLOC_CONF")


def only(text: str):
    found = explain(text, match_local=False)
    assert len(found) == 1, [d.kind for d in found]
    return found[0]


def test_stray_contexts_of_the_other_ranks_newest_wording_rank_prefixed():
    d = only(STRAY_RANK_PREFIXED)
    assert d.kind == "oom_stray_contexts" and d.ranks == (0,) and d.devices == ("cuda:0",)
    assert "CUDA ran out of memory on rank 0 on GPU 0. It has 39.49 GiB, 321.31 MiB was free, 572.00 MiB was asked" \
        in d.summary
    assert ("Processes using it: pid 3721648 414.00 MiB; this process 37.46 GiB; pid 1374765 414.00 MiB; pid 1374763 "
            "414.00 MiB; pid 1374764 414.00 MiB.") in d.summary
    assert d.cause.startswith("4 other processes on this GPU hold about a CUDA context's worth each (pid 3721648: "
                              "414.00 MiB, pid 1374765: 414.00 MiB")
    assert "used this GPU before calling torch.cuda.set_device" in d.cause
    assert "Together they hold 1.62 GiB; without them 1.93 GiB would be free, enough for the 572.00 MiB" in d.cause
    assert "torch.cuda.set_device(int(os.environ['LOCAL_RANK'])) first" in d.fix and "map_location='cpu'" in d.fix


def test_stray_context_torch_2_1_wording():
    d = only(STRAY_TORCH_2_1)
    assert d.kind == "oom_stray_contexts"
    assert "pid 250345 662.00 MiB; this process 22.90 GiB" in d.summary
    assert d.cause.startswith("1 other process on this GPU hold")  # one stray context, of another process
    assert "without them 729.06 MiB would be free, enough for the 132.00 MiB asked for" in d.cause


def test_a_leftover_run_holding_most_of_the_gpu():
    d = only(LEFTOVER)
    assert d.kind == "oom_other_process"
    assert d.cause.startswith("pid 118636 holds 71.62 GiB (77% of the GPU): a process this one did not start")
    assert "ps -o pid,user,lstart,args -p 118636" in d.fix and "require_exclusive=True" in d.fix
    assert "this process 21.24 GiB" in d.summary


@pytest.mark.parametrize("text", [GENUINE, GENUINE_TORCH_2_1], ids=["torch>=2.2", "torch2.1"])
def test_nobody_else_on_the_gpu_is_a_genuine_out_of_memory_error(text):
    d = only(text)
    assert d.kind == "oom_genuine"
    assert "no other process holds memory on it. No placement cause is to blame." in d.cause
    assert "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True" in d.fix and "smaller batch" in d.fix
    assert "set_device" not in d.fix and "require_exclusive" not in d.fix


def test_this_process_listed_under_its_host_pid_is_not_another_job():
    d = only(HOST_PID)
    assert d.kind == "oom_genuine"
    assert "pid 2417585 (this process, under its host pid) 21.65 GiB" in d.summary
    assert "pid 2417585 holds what PyTorch allocated here" in d.cause


def test_an_allocation_larger_than_the_gpu_is_genuine_whoever_else_is_there():
    d = only(LARGER_THAN_THE_GPU)
    assert d.kind == "oom_genuine"
    assert d.cause.startswith("The allocation alone (128.00 GiB) is larger than the whole GPU (23.65 GiB)")


def test_the_three_patterns_in_one_log_come_out_in_report_order_each_once():
    log = "\n".join([GENUINE, LEFTOVER, STRAY_RANK_PREFIXED, STRAY_RANK_PREFIXED.replace("[rank0]: ", "[rank0]:")])
    assert kinds_in(log) == ["oom_stray_contexts", "oom_other_process", "oom_genuine"]


def wrapped(text: str, width: int, prefix: str = "") -> str:
    """``text`` as a terminal of ``width`` columns shows it (every character kept), each piece under ``prefix``."""
    return "\n".join(prefix + text[i:i + width] for i in range(0, len(text), width))


@pytest.mark.parametrize("width", [80, 97, 120, 200])
def test_a_message_a_terminal_wrapped_is_read_whole(width):
    d = only(wrapped(STRAY_RANK_PREFIXED[len("[rank0]: "):], width))
    assert d.kind == "oom_stray_contexts"
    assert "pid 1374764 414.00 MiB" in d.summary and "this process 37.46 GiB" in d.summary


def test_a_message_broken_into_prefixed_lines_is_read_whole():
    body = STRAY_RANK_PREFIXED[len("[rank0]: "):]
    pieces = textwrap.wrap(body, 100)  # broken at spaces, each piece under the rank's prefix
    d = only("\n".join(f"[rank0]: {p}" for p in pieces))
    assert d.kind == "oom_stray_contexts" and d.ranks == (0,)
    assert "pid 1374764 414.00 MiB" in d.summary


def test_a_message_cut_before_its_end_is_not_guessed_at():
    cut = STRAY_RANK_PREFIXED[: STRAY_RANK_PREFIXED.index("Of the allocated")]
    assert explain(cut, match_local=False) == []


def test_parse_keeps_nvml_order_and_marks_this_process():
    m = parse_message(STRAY_RANK_PREFIXED)
    assert m is not None and m.gpu == 0
    assert [p.pid for p in m.processes] == [3721648, None, 1374765, 1374763, 1374764]
    assert m.this_process is not None and m.this_process.memory == int(37.46 * (1 << 30))


def test_on_this_host_explain_says_what_it_sees_of_the_pids(tmp_path):
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)  # leftover-run"])
    try:
        text = LEFTOVER.replace("118636", str(sleeper.pid))
        log = tmp_path / "oom.log"
        log.write_text(text + "\n")
        env = dict(os.environ, PYTHONPATH=str(ROOT / "python"), GPUGUARD_LIBCUDA="/nonexistent/libcuda.so.1")
        proc = run_cli(["explain", "--this-host", str(log)], env)
        assert f"pid {sleeper.pid} is running here now: " in proc.stdout, proc.stdout + proc.stderr
        assert "leftover-run" in proc.stdout
    finally:
        sleeper.kill()
        sleeper.wait()


def test_explainer_streams_it_like_any_log():
    explainer = LogExplainer(match_local=False)
    explainer.feed(("x" * 50 + "\n") * 10 + GENUINE + "\n")
    assert [d.kind for d in explainer.diagnoses()] == ["oom_genuine"]
