"""watch() on a real GPU with real NCCL: a collective held back on the GPU, a healthy DDP loop, the per-step cost."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from .gpu_support import torchrun, worker

# gpu_alone: each measures a time (or holds the GPU for 20 s) that another test on the GPU would disturb
pytestmark = [pytest.mark.gpu, pytest.mark.slow, pytest.mark.gpu_alone]

# One rank of NCCL on the GPU (torchrun, one process). Each mode reports its result (gpu_support.REPORT_RESULT).
_WORKER = r'''
import json, os, sys, time
import torch, torch.distributed as dist
import gpuguard
mode = sys.argv[1]
torch.cuda.set_device(0)
dist.init_process_group("nccl", device_id=torch.device("cuda", 0))
say = report_result
if mode == "held_back":
    w = gpuguard.watch(stall_after=3, report_dir=os.environ["WATCH_DIR"], gather=3)
    t = torch.ones(4, device="cuda")
    dist.all_reduce(t)
    torch.cuda.synchronize()
    torch.cuda._sleep(int(20 * 1.5e9))  # about 20 s of GPU time queued ahead of the next collective
    dist.all_reduce(t)  # returns at once: NCCL's kernel waits behind the sleep on the GPU
    returned = time.monotonic()
    value = t[0].item()  # the CPU waits here
    say(returned_at=returned, item_done_at=time.monotonic(), value=value, reports=w.reports,
        source=(w.source.note or w.source.calls_note) if w.source else "", report=w.last_report())
    w.stop()
elif mode in ("healthy", "cost"):
    model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(1024, 1024).cuda(), device_ids=[0])
    x = torch.ones(64, 1024, device="cuda")
    def steps(n):
        torch.cuda.synchronize()
        start = time.perf_counter()
        for _ in range(n):
            model(x).sum().backward()
        torch.cuda.synchronize()
        return (time.perf_counter() - start) / n
    steps(50)
    if mode == "healthy":
        w = gpuguard.watch(stall_after=5)
        per_step = steps(3000)
        say(reports=w.reports, per_step_ms=per_step * 1e3, source=w.source.note if w.source else "")
        w.stop()
    else:
        plain, watched = [], []
        for _ in range(5):
            plain.append(steps(300))
            w = gpuguard.watch(stall_after=600)
            watched.append(steps(300))
            w.stop()
        say(plain_ms=min(plain) * 1e3, watched_ms=min(watched) * 1e3)
dist.destroy_process_group()
'''


def run(mode: str, env: dict, tmp_path, timeout: float = 240) -> tuple[dict, str]:
    script = worker(tmp_path, "watch_gpu_worker.py", _WORKER)
    job = torchrun(script, 1, dict(env, WATCH_DIR=str(tmp_path)), timeout, mode)
    assert 0 in job.results, f"exit {job.returncode}, no result:\n{job.output[-4000:]}"
    return job.results[0], job.output


def worker_line(marker: str) -> int:
    """The line of the written worker script (REPORT_RESULT, then _WORKER) holding ``marker``."""
    from .gpu_support import REPORT_RESULT
    return next(n for n, line in enumerate((REPORT_RESULT + _WORKER).splitlines(), 1) if marker in line)


def test_a_collective_held_back_on_the_gpu_is_named_not_completed_with_the_item_line(real_env, tmp_path, report):
    """A collective held back behind a long kernel while the CPU waits in .item(): the report names the
    all-reduce, says no rank completed it, and points at the .item() line, in its JSON and in what it prints."""
    result, output = run("held_back", real_env, tmp_path)
    report.record("source", result["source"])
    report.record("report", (result["report"] or "")[:1500])
    assert result["reports"] == 1, output[-4000:]
    report.figure(result["item_done_at"] - result["returned_at"], "s", "the CPU waited in .item()")
    stall = json.loads(result["report"])["gpuguard_stall"]
    assert stall["kind"] == "no_progress" and stall["op"] == "ALL_REDUCE", stall
    assert "flight recorder (nccl)" in stall["source"], stall["source"]
    item_at = stall["cpu_at"]["0"]
    assert item_at.endswith(f"watch_gpu_worker.py:{worker_line('# the CPU waits here')} in <module>"), item_at
    # what the user reads: the same words on stderr, after the rank's prefix
    printed = [line for line in output.splitlines() if line.startswith("[rank 0] gpuguard: collective stall: ")]
    assert len(printed) == 1, output[-4000:]
    named = re.compile(r"every rank entered ALL_REDUCE #\d+ on group '[^']+' \(ranks 0\) and it has not completed on "
                       r"any of them in [0-9.]+ s: the collective itself is stuck, not a rank\. Its group has one rank, "
                       r"so no network or peer GPU is involved")
    assert named.search(printed[0]) and named.search(stall["message"]), printed[0]
    # the message's next line (printed as it is, no prefix): where it was issued, where the CPU waits
    assert re.search(r"\n  rank 0 issued it at \S*watch_gpu_worker\.py:\d+; their CPU waits now: rank 0 at "
                     + re.escape(item_at) + r"\.\n", output), output[-4000:]


def test_a_healthy_ddp_loop_never_reports(real_env, tmp_path, report):
    """3000 DDP steps on NCCL under watch(stall_after=5): no report."""
    result, output = run("healthy", real_env, tmp_path)
    report.record("per_step_ms", result["per_step_ms"])
    report.record("source", result["source"])
    report.figure(result["per_step_ms"], "ms/step", "under watch()")
    assert result["reports"] == 0, output[-4000:]
    assert "collective stall" not in output


def test_the_per_step_cost_of_watch(real_env, tmp_path, report):
    """watch() on a DDP step on NCCL, as benchmarks/bench_watch_cost.py measures it: steady state, start-up, the
    longest step and GIL gap, the recorder on and off (recorded, not asserted: shared machines are noisy)."""
    out = tmp_path / "watch_cost.json"
    bench = Path(__file__).resolve().parents[3] / "benchmarks" / "bench_watch_cost.py"
    proc = subprocess.run([sys.executable, str(bench), "--backend", "nccl", "--device", "cuda", "--ranks", "1",
                           "--width", "1024", "--batch", "64", "--first", "20", "--steady", "20", "--json", str(out)],
                          env=real_env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0 and out.exists(), (proc.stdout + proc.stderr)[-4000:]
    figures = json.loads(out.read_text())
    first, still = figures["start_up"], figures["steady"]
    report.record("summary", proc.stdout[-3000:])
    report.record("steady_watched_over_plain", still["watched"]["median_step_s"] / still["plain"]["median_step_s"])
    report.record("steady_recorder_on_over_off",
                  still["plain"]["median_step_s"] / still["recorder-off"]["median_step_s"])
    report.record("steady_median_step_ms", {k: still[k]["median_step_s"] * 1e3 for k in ("watched", "plain",
                                                                                        "recorder-off")})
    report.record("watch_call_ms", first["watched"]["watch_call_s"] * 1e3)
    report.record("first_tick_s", first["watched"]["first_tick_s"])
    report.record("longest_step_ms", {k: first[k]["longest_step_s"] * 1e3 for k in ("watched", "plain")})
    report.record("longest_gil_gap_ms", {k: first[k]["longest_gap_s"] * 1e3 for k in ("watched", "plain")})
    report.record("source", first["watched"]["source"])
    assert first["watched"]["reports"] == 0 and still["watched"]["reports"] == 0, proc.stdout[-4000:]
