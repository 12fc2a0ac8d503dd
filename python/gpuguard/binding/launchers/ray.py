"""A Ray actor or task: Ray's runtime context decides the GPU, the actor's environment the ranks."""

from __future__ import annotations

import dataclasses
import hashlib
import re
import sys
from typing import Any, Mapping, Optional

from ...errors import LaunchEnvironmentError
from ...group_name import is_group_name
from .base import LaunchContext, Launcher, _context_from

#: verl's RayWorkerGroup gives each of its actors WG_BACKEND=ray and WG_PREFIX, its worker group's name, unique per
#: group (verl/single_controller/ray/base.py, _create_worker, 0.9.1). Worker groups colocated on one resource pool
#: (actor and rollout, reference, critic) are separate process groups, each with ranks 0..N-1.
VERL_BACKEND_VARIABLE = "WG_BACKEND"
VERL_GROUP_VARIABLE = "WG_PREFIX"


def verl_group(env: Mapping[str, str]) -> Optional[str]:
    """The gpuguard group of a verl worker: its WG_PREFIX, made a usable group name when it is not one (characters
    outside '_.:/@+-' become '_', with a hash of the original so that two prefixes never meet in one group)."""
    if env.get(VERL_BACKEND_VARIABLE) != "ray" or not env.get(VERL_GROUP_VARIABLE):
        return None
    prefix = env[VERL_GROUP_VARIABLE]
    if is_group_name(prefix):
        return prefix
    digest = hashlib.sha256(prefix.encode("utf-8", "surrogateescape")).hexdigest()[:12]
    kept = re.sub(r"[^A-Za-z0-9_.:/@+-]", "_", prefix)[:115]
    return f"{kept}-{digest}"


class RayActorLauncher(Launcher):
    """A Ray actor or task (a Ray *worker* process; the driver is not one).

    Ray decides the GPU: ``get_accelerator_ids()["GPU"]`` are the ids it assigned, which it also writes into
    CUDA_VISIBLE_DEVICES unless ``RAY_EXPERIMENTAL_NOSET_CUDA_VISIBLE_DEVICES`` is set. Rank, world size and
    local rank come from the actor's environment (``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, set by
    ``ray_placement``, Ray Train or the framework), the group from ``GPUGUARD_GROUP``, else, in a verl worker
    (``WG_BACKEND=ray``), from its worker group's ``WG_PREFIX``.
    """

    name = "ray"
    description = "Ray actor"
    agent = True
    variables = {"rank": "RANK", "world_size": "WORLD_SIZE", "local_rank": "LOCAL_RANK",
                 "local_world_size": "LOCAL_WORLD_SIZE", "node_rank": "NODE_RANK"}

    def __init__(self, runtime_context: Any = None) -> None:
        # tests hand in a stand-in for ray.get_runtime_context(); normally it is looked up lazily
        self._runtime_context = runtime_context

    def _context(self) -> Any:
        if self._runtime_context is not None:
            return self._runtime_context
        ray = sys.modules.get("ray")  # a Ray worker has imported ray; never import it (slow) to find out
        if ray is None or not hasattr(ray, "is_initialized") or not ray.is_initialized():
            return None
        ctx = ray.get_runtime_context()
        worker_mode = getattr(getattr(ray, "_private", None), "worker", None)
        worker_mode = getattr(worker_mode, "WORKER_MODE", 1)
        if getattr(getattr(ctx, "worker", None), "mode", None) != worker_mode:
            return None  # the driver script, not an actor or task
        return ctx

    def present(self, env: Mapping[str, str]) -> bool:
        return self._context() is not None

    def detect(self, env: Mapping[str, str]) -> Optional[LaunchContext]:
        ctx = self._context()
        if ctx is None:
            return None
        gpu_ids = [str(i) for i in ctx.get_accelerator_ids().get("GPU", [])]
        try:
            share = ctx.get_assigned_resources().get("GPU")
        except Exception:  # pragma: no cover - older Ray without it; the share is only reported
            share = None
        reading = self.read(env)
        if "rank" not in reading.values and "world_size" in reading.values:
            raise LaunchEnvironmentError(
                f"This Ray actor has WORLD_SIZE={env['WORLD_SIZE']} but no RANK: set RANK in the actor's "
                f"runtime_env env_vars (gpuguard.ray_placement(...).options(rank) does).", variable="RANK")
        if "rank" not in reading.values:
            reading.put("rank", 0, "(RANK not set: one Ray worker)")
            reading.put("world_size", 1, "(WORLD_SIZE not set: one Ray worker)")
        elif "world_size" not in reading.values:
            raise LaunchEnvironmentError(
                f"This Ray actor has RANK={env['RANK']} but no WORLD_SIZE: set WORLD_SIZE in the actor's "
                f"runtime_env env_vars as well.", variable="WORLD_SIZE")
        extra = {
            "ray_gpu_ids": gpu_ids,
            "ray_gpu_share": float(share) if share is not None else None,
            "ray_noset_cuda_visible_devices": env.get("RAY_EXPERIMENTAL_NOSET_CUDA_VISIBLE_DEVICES", "")
            .lower() in ("1", "true"),
        }
        context = _context_from(self, [reading], env, extra=extra, require_local_rank=False)
        group = verl_group(env) if context.group is None else None
        if group is None:
            return context
        return dataclasses.replace(context, group=group, extra=dict(extra, group_from=VERL_GROUP_VARIABLE))
