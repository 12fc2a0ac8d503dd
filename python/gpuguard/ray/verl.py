"""verl on Ray: what a verl worker's environment says about its RayResourcePool, told to ranks of one worker group on one GPU.

verl 0.9's ``RayResourcePool(process_on_nodes, use_gpu, max_colocate_count)`` makes one placement group per node with
one ``{"CPU": max_colocate_count, "GPU": 1}`` bundle per process, and ``RayWorkerGroup`` puts rank r of every worker
group in bundle r with ``num_gpus=1/max_colocate_count`` (verl/single_controller/ray/base.py). So the ranks of one
worker group are on GPUs of their own by construction, and max_colocate_count only lets *other* worker groups
(actor and rollout, reference, critic) share them: the old cure "max_colocate_count=1" (rllm-org/rllm#10, verl
before per-rank bundles) does not separate them. Each worker's environment carries WG_PREFIX, WORLD_SIZE, RANK and
RAY_LOCAL_WORLD_SIZE (the pool's processes per node: process_on_nodes[0], trainer.n_gpus_per_node); its Ray share is
1/max_colocate_count.
"""

from __future__ import annotations

from typing import Any, Mapping, Optional, Sequence


def _int(env: Mapping[str, str], name: str) -> Optional[int]:
    text = env.get(name, "").strip()
    return int(text) if text.isdigit() and len(text) < 10 else None


def _pool(env: Mapping[str, str], share: Optional[float]) -> Optional[tuple[str, int, int, Optional[int]]]:
    """(WG_PREFIX, WORLD_SIZE, processes per node, max_colocate_count or None) of a verl worker, else None."""
    if env.get("WG_BACKEND") != "ray" or not env.get("WG_PREFIX"):
        return None
    world, per_node = _int(env, "WORLD_SIZE"), _int(env, "RAY_LOCAL_WORLD_SIZE")
    if not world or not per_node:
        return None
    colocate = None
    if isinstance(share, float) and 0 < share <= 1:
        # Ray keeps resources to four decimals: 1/3 comes back as 0.3333
        colocate = round(1 / share) if abs(share * round(1 / share) - 1) < 1e-3 else None
    return env["WG_PREFIX"], world, per_node, colocate


def duplicate_note(env: Mapping[str, str], share: Optional[float], shared: Sequence[Mapping[str, Any]]) -> Optional[str]:
    """What a DuplicateDeviceError means in a verl worker group, naming verl's settings; None outside verl.

    ``env``: the worker's environment; ``share``: its Ray GPU share; ``shared``: the error's ``shared`` details (one
    dict per GPU: its ``ranks`` and ``hosts``)."""
    pool = _pool(env, share)
    if pool is None:
        return None
    prefix, world, per_node, colocate = pool
    nodes = -(-world // per_node)
    layout = (f"verl worker group '{prefix}' (WG_PREFIX) has {world} ranks on a RayResourcePool of process_on_nodes="
              f"[{', '.join([str(per_node)] * nodes)}] (trainer.nnodes={nodes} x trainer.n_gpus_per_node={per_node}: "
              f"WORLD_SIZE={world}, RAY_LOCAL_WORLD_SIZE={per_node})"
              + (f" and max_colocate_count={colocate} (each worker asked Ray for num_gpus=1/{colocate})"
                 if colocate else "") + ". ")
    design = ("verl puts rank r of every worker group in bundle r of the pool, a GPU of its own, so max_colocate_count "
              "only lets other worker groups share it: lowering it does not separate these ranks. ")
    across = []
    for device in shared:
        ranks = sorted(int(r) for r in device.get("ranks") or [])
        if len({r // per_node for r in ranks}) > 1:
            hosts = ", ".join(dict.fromkeys(str(h) for h in device.get("hosts") or [])) or "one host"
            across.append(f"ranks {', '.join(map(str, ranks))} (pool nodes "
                          f"{', '.join(str(r // per_node) for r in ranks)}) on one GPU of {hosts}")
    if not across:
        return layout + design
    return (layout + design + f"Here {'; '.join(across[:4])}{' ...' if len(across) > 4 else ''}: ranks verl placed on "
            f"different nodes of the pool met on one GPU, so two Ray nodes on one host offer the same GPUs. Fix: run "
            f"one Ray node per host with only that host's GPUs (in Kubernetes, nvidia.com/gpu limits per Ray pod; "
            f"elsewhere `ray start` once per host), and set trainer.nnodes x trainer.n_gpus_per_node to the GPUs the "
            f"cluster really has (`ray status`).")
