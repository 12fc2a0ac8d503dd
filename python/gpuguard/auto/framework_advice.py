"""The fix for a mistake gpuguard stopped, in the words of the framework that made it: its own setting, named.

A framework that starts or places the ranks has a setting of its own behind each placement mistake: accelerate's
``--num_processes`` (it puts local process i on GPU i % device_count, so extra processes double up silently),
DeepSpeed's ``--num_gpus`` (never checked against the GPUs there are), Lightning's accelerator (only a GPU
accelerator names each rank's device), and a LOCAL_RANK left in the shell, which Lightning reads as "a launcher
started every rank" and so starts none of the others. The framework is the one whose code called
init_process_group (rank_at_init.calling_framework, kept in the context's ``extra["framework"]``) or whose
launcher started the rank (``accelerate launch`` marks its workers with ACCELERATE_MIXED_PRECISION).
"""

from __future__ import annotations

import multiprocessing
import os
from typing import Any, Mapping, Optional

from ..binding.device_choice import start_fewer_per_node
from ..errors import LaunchEnvironmentError

#: A variable `accelerate launch` sets in every worker it starts, with or without DeepSpeed
#: (accelerate/utils/launch.py: prepare_simple_launcher_cmd_env, prepare_multi_gpu_env, prepare_deepspeed_cmd_env).
ACCELERATE_LAUNCH_MARK = "ACCELERATE_MIXED_PRECISION"


def framework_of(context: Any, env: Optional[Mapping[str, str]] = None) -> Optional[str]:
    """The framework behind this rank: accelerate where `accelerate launch` started it (its settings placed the
    rank, whichever library then called init_process_group: DeepSpeed under --use_deepspeed), else the caller of
    init_process_group, else its launcher's."""
    env = os.environ if env is None else env
    extra = getattr(context, "extra", {}) or {}
    if ACCELERATE_LAUNCH_MARK in env:
        return "accelerate"
    if extra.get("framework"):
        return str(extra["framework"])
    launcher = getattr(context, "launcher", None)
    return launcher if launcher in ("deepspeed", "lightning") else None


def fewer_per_node(n: int, framework: Optional[str]) -> str:
    """The fix for a node running more processes than its ``n`` GPUs, with the framework's own setting."""
    gpus = f"{n} GPU" + ("" if n == 1 else "s")
    if framework == "accelerate":
        return (f"Start at most {n} per node: accelerate launch --num_processes {n} (num_processes in the accelerate "
                f"config), or gpu_ids naming as many GPUs as processes. accelerate never checks --num_processes "
                f"against the {gpus} a node shows (without DeepSpeed it puts local process i on GPU i % {n}, so "
                f"the extra processes share GPUs silently)")
    if framework == "deepspeed":
        return (f"Start at most {n} per node: deepspeed --num_gpus {n} (or --include localhost:<{n} GPU ids>). "
                f"DeepSpeed's launcher starts --num_gpus processes per node whatever GPUs the node shows")
    return start_fewer_per_node(n)


def device_never_named(framework: Optional[str]) -> str:
    """The fix for ranks whose device nothing named (each then uses cuda:0)."""
    if framework == "lightning":
        return ("Lightning names each rank's GPU only with a GPU accelerator (Trainer(accelerator='gpu', devices=N) "
                "calls set_device and passes device_id=); with accelerator='cpu' the NCCL backend runs every rank "
                "on cuda:0: use process_group_backend='gloo' for a run on the CPU.")
    return ("Call torch.cuda.set_device(int(os.environ['LOCAL_RANK'])) before init_process_group, or pass device_id= "
            "to it.")


def check_lightning_spawning(context: Any, env: Optional[Mapping[str, str]] = None) -> None:
    """A LOCAL_RANK left in the environment of a Lightning job started as ``python train.py``: Lightning reads
    it as "a launcher started every rank" and starts none of the others, so rank 0 would wait for them at
    init_process_group until torch's timeout (30 minutes). Lightning's own launcher exports NODE_RANK and
    WORLD_SIZE with LOCAL_RANK, ddp_spawn's ranks are multiprocessing children, any other launcher is read
    whole: a LOCAL_RANK with none of these is the stray one."""
    env = os.environ if env is None else env
    if (framework_of(context, env) != "lightning" or "LOCAL_RANK" not in env or context.world_size <= 1
            or getattr(context, "launcher", None) != "lightning" or "NODE_RANK" in env or "WORLD_SIZE" in env
            or multiprocessing.parent_process() is not None):
        return
    others = context.world_size - 1
    raise LaunchEnvironmentError(
        f"LOCAL_RANK={env['LOCAL_RANK']} is set in this process's environment, but no launcher started it: "
        f"Lightning takes a set LOCAL_RANK to mean that a launcher (torchrun, SLURM) started every rank, so it did "
        f"not start the other {others} process{'es' if others != 1 else ''} of this {context.world_size}-rank job "
        f"itself, and rank {context.rank} would wait for {'them' if others != 1 else 'it'} in init_process_group "
        f"until torch's timeout. Fix: unset LOCAL_RANK (it was exported in the shell or the job script) and run "
        f"`python train.py` again, or start every rank with a launcher: torchrun "
        f"--nproc_per_node={context.world_size} train.py.",
        variable="LOCAL_RANK", value=env["LOCAL_RANK"], framework="lightning")
