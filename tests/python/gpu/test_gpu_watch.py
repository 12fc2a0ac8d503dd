"""watch() on a real GPU with real NCCL: a collective held back on the GPU, a healthy DDP loop, the per-step cost."""

from __future__ import annotations

import json
import re
import subprocess
import sys

import pytest

pytestmark = [pytest.mark.gpu, pytest.mark.slow]

# One rank of NCCL on the GPU (torchrun, one process). Each mode prints RESULT lines.
_WORKER = r'''
import json, os, sys, time
import torch, torch.distributed as dist
import gpuguard
mode = sys.argv[1]
torch.cuda.set_device(0)
dist.init_process_group("nccl", device_id=torch.device("cuda", 0))
def say(**kw):
    print("RESULT " + json.dumps(kw), flush=True)
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
    script = tmp_path / "watch_gpu_worker.py"
    script.write_text(_WORKER)
    env = dict(env, WATCH_DIR=str(tmp_path))
    proc = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=1",
                           str(script), mode], env=env, capture_output=True, text=True, timeout=timeout)
    output = proc.stdout + proc.stderr
    found = [json.loads(line[len("RESULT "):]) for line in output.splitlines() if line.startswith("RESULT ")]
    assert found, output[-4000:]
    return found[-1], output


def test_a_collective_held_back_on_the_gpu_is_named_not_completed_with_the_item_line(real_env, tmp_path, report):
    """A collective held back behind a long kernel while the CPU waits in .item(): named not completed."""
    result, output = run("held_back", real_env, tmp_path)
    report.record("source", result["source"])
    report.record("report", (result["report"] or "")[:1500])
    assert result["reports"] == 1, output[-4000:]
    stall = json.loads(result["report"])["gpuguard_stall"]
    assert stall["kind"] == "no_progress" and stall["op"] == "ALL_REDUCE", stall
    assert "flight recorder (nccl)" in stall["source"], stall["source"]
    assert re.search(r"watch_gpu_worker\.py:\d+ in <module>", stall["cpu_at"]["0"]), stall["cpu_at"]
    item_line = next(n for n, line in enumerate(_WORKER.splitlines(), 1) if "# the CPU waits here" in line)
    assert stall["cpu_at"]["0"].endswith(f"watch_gpu_worker.py:{item_line} in <module>"), stall["cpu_at"]


def test_a_healthy_ddp_loop_never_reports(real_env, tmp_path, report):
    """3000 DDP steps on NCCL under watch(stall_after=5): no report."""
    result, output = run("healthy", real_env, tmp_path)
    report.record("per_step_ms", result["per_step_ms"])
    report.record("source", result["source"])
    assert result["reports"] == 0, output[-4000:]
    assert "collective stall" not in output


def test_the_per_step_cost_of_watch(real_env, tmp_path, report):
    """watch() on a DDP step on NCCL, as benchmarks/bench_watch_cost.py measures it: steady state, start-up, the
    longest step and GIL gap, the recorder on and off (recorded, not asserted: shared machines are noisy)."""
    from pathlib import Path

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
