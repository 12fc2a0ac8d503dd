"""verl's own worker groups as a verl script builds them, run as `python verl_worker_groups.py MODE` (test_verl.py, gpu/).

Its Worker is verl's ``Worker``, initialising its process group with verl's ``initialize_global_process_group_ray``
as verl's TrainingWorker does, with the backend verl builds on a GPU node ("cpu:gloo,cuda:nccl"), then (on a GPU) one
all-reduce, as training's first collective. gpuguard is switched on for the workers by the Ray setup hook only; the
script never mentions gpuguard otherwise. Prints one JSON line: each worker group's results, rank by rank.

  colocated      Ray with 5 GPUs; a pool of 2 GPUs shared by worker groups 'actor' and 'critic' (max_colocate_count=2)
                 and one of 3 GPUs shared by 'ref' and 'reward' (max_colocate_count=3); all four initialise at once
  two-ray-nodes  two Ray nodes on this host, each offering --gpus-per-node GPUs (as `ray start` run twice on one
                 machine does); one worker group 'actor_rollout' on a pool of process_on_nodes=[N, N],
                 max_colocate_count=3
"""

import argparse
import json
import os
import sys

import ray
from verl.single_controller.base import Worker
from verl.single_controller.base.decorator import Dispatch, register
from verl.single_controller.ray import RayClassWithInitArgs, RayResourcePool, RayWorkerGroup
from verl.utils.distributed import initialize_global_process_group_ray

HOOK = {"worker_process_setup_hook": "gpuguard.ray.setup"}


@ray.remote
class TrainingWorker(Worker):
    @register(dispatch_mode=Dispatch.ONE_TO_ALL, blocking=False)
    def init_process_group(self):
        import torch

        try:
            initialize_global_process_group_ray(backend="cpu:gloo,cuda:nccl")  # verl's backend on a GPU node
            if torch.cuda.is_available():
                torch.distributed.all_reduce(torch.ones(1, device="cuda"))
            out = {"type": None}
        except Exception as exc:
            out = {"type": type(exc).__name__, "module": type(exc).__module__, "message": str(exc),
                   "notes": list(getattr(exc, "__notes__", []))}
        out.update(rank=int(os.environ["RANK"]), group=os.environ["WG_PREFIX"],
                   cuda_visible_devices=os.environ.get("CUDA_VISIBLE_DEVICES"), local_rank=os.environ["LOCAL_RANK"],
                   armed="gpuguard.auto" in sys.modules and sys.modules["gpuguard.auto"].is_enabled())
        return out


def worker_group(pool, name):
    return RayWorkerGroup(resource_pool=pool, ray_cls_with_init=RayClassWithInitArgs(cls=TrainingWorker),
                          name_prefix=name)


def init_at_once(groups):
    """Every group's init_process_group called before any result is awaited: the groups initialise together."""
    refs = [group.init_process_group() for group in groups]
    return [ray.get(r, timeout=240) for r in refs]


def colocated():
    ray.init(num_cpus=16, num_gpus=5, include_dashboard=False, log_to_driver=False, runtime_env=HOOK)
    pair = RayResourcePool(process_on_nodes=[2], use_gpu=True, max_colocate_count=2, name_prefix="pair_pool")
    trio = RayResourcePool(process_on_nodes=[3], use_gpu=True, max_colocate_count=3, name_prefix="trio_pool")
    groups = [worker_group(pair, "actor"), worker_group(pair, "critic"), worker_group(trio, "ref"),
              worker_group(trio, "reward")]
    print(json.dumps(init_at_once(groups)), flush=True)
    ray.shutdown()


def two_ray_nodes(gpus_per_node):
    from ray.cluster_utils import Cluster

    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 8, "num_gpus": gpus_per_node,
                                                            "include_dashboard": False})
    cluster.add_node(num_cpus=8, num_gpus=gpus_per_node)
    ray.init(address=cluster.address, log_to_driver=False, runtime_env=HOOK)
    pool = RayResourcePool(process_on_nodes=[gpus_per_node, gpus_per_node], use_gpu=True, max_colocate_count=3,
                           name_prefix="global_pool")
    print(json.dumps(init_at_once([worker_group(pool, "actor_rollout")])), flush=True)
    ray.shutdown()
    cluster.shutdown()


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("mode", choices=("colocated", "two-ray-nodes"))
    parser.add_argument("--gpus-per-node", type=int, default=2)
    args = parser.parse_args()
    colocated() if args.mode == "colocated" else two_ray_nodes(args.gpus_per_node)
