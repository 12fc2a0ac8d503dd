"""verl 0.9 as verl runs it, under gpuguard: its own RayResourcePool and RayWorkerGroups on a CPU Ray with fake GPUs.

Each job is a driver script run as ``python verl_worker_groups.py MODE`` (tests/python/ray_scripts), its Worker
(verl's ``Worker``, initialising its process group with verl's own ``initialize_global_process_group_ray``, as verl's
TrainingWorker does) in ``__main__``. The backend is the one verl builds on a GPU node, "cpu:gloo,cuda:nccl": this
torch sees no CUDA device, so gpuguard's check runs inside init_process_group, before torch's NCCL init fails; a
healthy group then ends with torch's own error, never gpuguard's. The verdicts come from gpuguard's JSON report lines (GPUGUARD_JSON_REPORT), one per checked rank.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Iterator

import pytest

from gg_testing.env import auto_env, with_source_tree
from gg_testing.paths import ROOT
from gg_testing.procs import last_json, run_logged
from gg_testing.ray_start import RAY_START_TIMED_OUT

pytestmark = [pytest.mark.slow, pytest.mark.ray_cluster]
pytest.importorskip("verl", reason="needs verl: pip install --group verl (pyproject.toml's dependency group)")

JOB_TIMEOUT_S = 300
JOB = ROOT / "tests" / "python" / "ray_scripts" / "verl_worker_groups.py"


@pytest.fixture
def ray_tmpdir() -> Iterator[str]:
    """A Ray temp folder of the test's own (RAY_TMPDIR), short enough for Ray's socket paths. ray.cluster_utils'
    Cluster writes its address to <temp folder>/ray/ray_current_cluster, and a plain ray.init() joins whatever cluster
    that file names: in the shared /tmp/ray, the colocated job's ray.init(num_cpus=...) joined the two-node job's
    cluster beside it and failed ("When connecting to an existing cluster, num_cpus and num_gpus must not be
    provided", CI of 252de1e)."""
    folder = tempfile.mkdtemp(prefix="gg-ray-verl-", dir="/tmp")
    yield folder
    shutil.rmtree(folder, ignore_errors=True)


def run_job(tmp_path: Path, args: list[str], env: dict[str, str]) -> tuple[list, list[dict]]:
    """Runs the driver script (once more when only Ray's own start timed out); its workers' results and gpuguard's
    report lines."""
    lines = tmp_path / "gpuguard-report.lines"
    env = dict(env, GPUGUARD_JSON_REPORT=str(lines), RAY_DISABLE_USAGE_STATS="1")
    for _ in range(2):
        lines.unlink(missing_ok=True)
        proc = run_logged([sys.executable, str(JOB), *args], env, timeout=JOB_TIMEOUT_S, cwd=str(tmp_path))
        if RAY_START_TIMED_OUT not in proc.stdout:
            break
    assert proc.returncode == 0, proc.stdout[-6000:]
    report = [json.loads(line) for line in lines.read_text().splitlines()] if lines.exists() else []
    return last_json(proc.stdout), report


def hook_env(fake_gpus, ray_tmpdir: str, topology: str = "h100x8") -> dict[str, str]:
    env = auto_env(fake_gpus.env(topology, RAY_TMPDIR=ray_tmpdir))
    env.pop("GPUGUARD")  # only the Ray setup hook switches it on
    return env


def test_colocated_worker_groups_are_each_checked_in_their_own_group_and_never_reported(fake_gpus, tmp_path,
                                                                                        ray_tmpdir):
    results, report = run_job(tmp_path, ["colocated"], hook_env(fake_gpus, ray_tmpdir))
    results = [r for group in results for r in group]
    sizes = {"actor": 2, "critic": 2, "ref": 3, "reward": 3}
    assert sorted((r["group"], r["rank"]) for r in results) == sorted(
        (g, r) for g, n in sizes.items() for r in range(n))
    for r in results:  # armed by the hook; verl's Worker wrote LOCAL_RANK=0; gpuguard raised nothing
        assert r["armed"] and r["local_rank"] == "0", r
        assert "gpuguard" not in (r.get("module") or "") and "gpuguard" not in r.get("message", ""), r
    # colocation is real: rank r of the groups of one pool sit on one Ray GPU, the ranks of one group on different ones
    by_group = {g: {r["rank"]: r["cuda_visible_devices"] for r in results if r["group"] == g} for g in sizes}
    assert by_group["actor"] == by_group["critic"] and by_group["ref"] == by_group["reward"], by_group
    assert all(len(set(gpus.values())) == len(gpus) for gpus in by_group.values()), by_group
    # every rank checked, in a gpuguard group named after its worker group (WG_PREFIX), with an ok verdict
    assert sorted((row["group"], row["rank"], row["world_size"]) for row in report) == sorted(
        (g, r, n) for g, n in sizes.items() for r in range(n)), report
    assert {(row["verdict"], row["launcher"], row["device"], row["message"]) for row in report} == \
        {("ok", "ray", "cuda:0", "")}, report
    assert {(row["group"], row["rank"]): row["cuda_visible_devices"] for row in report} == \
        {(r["group"], r["rank"]): r["cuda_visible_devices"] for r in results}


def test_ranks_of_one_worker_group_on_one_gpu_are_stopped_naming_verls_settings(fake_gpus, tmp_path, ray_tmpdir):
    (results,), report = run_job(tmp_path, ["two-ray-nodes", "--gpus-per-node", "2"],
                                 hook_env(fake_gpus, ray_tmpdir, "h100x4"))
    assert sorted(r["rank"] for r in results) == [0, 1, 2, 3]
    cvd = {r["rank"]: r["cuda_visible_devices"] for r in results}
    assert cvd[0] == cvd[2] and cvd[1] == cvd[3] and cvd[0] != cvd[1], cvd  # each Ray node handed out its GPUs
    for r in results:
        assert (r["module"], r["type"]) == ("gpuguard.errors", "DuplicateDeviceError"), r
        message, notes = r["message"], " ".join(r["notes"])
        assert message.startswith("4 ranks of group 'actor_rollout' share 2 GPUs."), message
        assert "Ray gave these actors 1/3 of a GPU each (num_gpus=1/3) and the same GPU (Ray GPU ids " in message
        assert "so 2 ranks of group 'actor_rollout' share it" in message
        assert "verl's RayResourcePool has one; its max_colocate_count lets only other worker groups share a " \
               "rank's GPU, so lowering it does not help there" in message
        assert "If every rank already has a bundle of its own, two Ray nodes on " in message
        assert "verl: max_colocate_count=1" not in message + notes
        assert ("verl worker group 'actor_rollout' (WG_PREFIX) has 4 ranks on a RayResourcePool of process_on_nodes="
                "[2, 2] (trainer.nnodes=2 x trainer.n_gpus_per_node=2: WORLD_SIZE=4, RAY_LOCAL_WORLD_SIZE=2) and "
                "max_colocate_count=3 (each worker asked Ray for num_gpus=1/3).") in notes, notes
        assert "lowering it does not separate these ranks" in notes
        assert "Here ranks 0, 2 (pool nodes 0, 1) on one GPU of " in notes and "ranks 1, 3 (pool nodes 0, 1)" in notes
        assert "Fix: run one Ray node per host with only that host's GPUs" in notes
        assert "set trainer.nnodes x trainer.n_gpus_per_node to the GPUs the cluster really has" in notes
    assert sorted((row["rank"], row["verdict"], row["group"]) for row in report) == \
        [(r, "DuplicateDeviceError", "actor_rollout") for r in range(4)]
    # inside verl's init_process_group, before torch's: the error each worker got is gpuguard's, not NCCL's
    assert {row["checked_at"] for row in report} == \
        {"init_process_group (this torch sees no CUDA device, so torch's NCCL group would fail inside init)"}


def verl_plugin_site(tmp_path: Path) -> Path:
    """gpuguard's dist-info, with the entry points pyproject.toml declares, as an installed gpuguard has it: what
    ``importlib.metadata.entry_points(group="verl.plugins")`` finds. No .pth: only verl's plugin can arm gpuguard."""
    import tomllib  # Python 3.11 and later, as verl's venv; imported here so that 3.10 still collects (and skips) this file

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    site = tmp_path / "site"
    info = site / f"gpuguard-{project['version']}.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: gpuguard\nVersion: {project['version']}\n")
    (info / "entry_points.txt").write_text("".join(
        f"[{group}]\n" + "".join(f"{name} = {value}\n" for name, value in points.items())
        for group, points in project["entry-points"].items()))
    return site


def tiny_model(folder: Path) -> Path:
    """A Llama of one layer and a four-word tokenizer, written as Hugging Face saves them: what verl's config checks
    read from actor_rollout_ref.model.path in the driver (this machine cannot download a model)."""
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({
        "model_type": "llama", "vocab_size": 4, "hidden_size": 8, "intermediate_size": 16, "num_hidden_layers": 1,
        "num_attention_heads": 1, "num_key_value_heads": 1, "head_dim": 8, "max_position_embeddings": 2048,
        "bos_token_id": 1, "eos_token_id": 2}))
    special = [{"id": i, "content": t, "single_word": False, "lstrip": False, "rstrip": False, "normalized": False,
                "special": True} for i, t in enumerate(("<unk>", "<s>", "</s>"))]
    (folder / "tokenizer.json").write_text(json.dumps({
        "version": "1.0", "truncation": None, "padding": None, "added_tokens": special, "normalizer": None,
        "pre_tokenizer": {"type": "Whitespace"}, "post_processor": None, "decoder": None,
        "model": {"type": "WordLevel", "vocab": {"<unk>": 0, "<s>": 1, "</s>": 2, "a": 3}, "unk_token": "<unk>"}}))
    (folder / "tokenizer_config.json").write_text(json.dumps({
        "bos_token": "<s>", "eos_token": "</s>", "pad_token": "</s>", "unk_token": "<unk>"}))
    return folder


def test_gpuguard_run_arms_verls_main_ppo_driver_and_its_task_runner_through_verls_plugin(fake_gpus, tmp_path,
                                                                                         ray_tmpdir):
    env = with_source_tree(fake_gpus.env("h100x4", RAY_DISABLE_USAGE_STATS="1", RAY_TMPDIR=ray_tmpdir))
    env["PYTHONPATH"] = os.pathsep.join([str(verl_plugin_site(tmp_path)), env["PYTHONPATH"]])
    env.pop("GPUGUARD", None)
    model = tiny_model(tmp_path / "model")
    # verl's own trainer, as its GRPO quick-start runs it, on a tiny model and no data: its driver passes verl's config
    # checks and starts Ray and its TaskRunner actor, which stops at `import transfer_queue` (verl[verl-core], not
    # installed here); that far, every process verl started is armed by verl's plugin alone
    argv = [sys.executable, "-m", "gpuguard", "run", "--", sys.executable, "-m", "verl.trainer.main_ppo",
            "algorithm.adv_estimator=grpo", "trainer.n_gpus_per_node=2", "trainer.nnodes=1",
            f"data.train_files={tmp_path}/absent.parquet", f"data.val_files={tmp_path}/absent.parquet",
            f"actor_rollout_ref.model.path={model}", "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=1",
            "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=1",
            "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=1",
            "+ray_kwargs.ray_init.num_cpus=4", "+ray_kwargs.ray_init.include_dashboard=False"]
    proc = run_logged(argv, env, timeout=JOB_TIMEOUT_S, cwd=str(tmp_path))
    out = proc.stdout
    assert proc.returncode != 0 and "No module named 'transfer_queue'" in out, out[-6000:]
    origin = "via verl's plugin entry point gpuguard.ray.verl_plugin (GPUGUARD=1)"
    active = [line for line in out.splitlines() if "gpuguard: active (auto)" in line]
    runner = re.search(r"ray::TaskRunnerV1\.run\(\)\S* \(pid=(\d+),", out)
    assert runner, out[-6000:]
    assert [line for line in active if line.startswith("gpuguard: active (auto)") and "no launcher variables (a "
            "single process, unless init_process_group names a rank)" in line], active  # the driver
    assert [line for line in active if f"pid {runner.group(1)}, rank 0/1 (ray)" in line], active  # the TaskRunner
    assert len(active) == 2 and all(origin in line for line in active), active
