"""A Ray job as submitted with `ray job submit -- python job.py` (test_ray_jobs.py); it never names gpuguard.

Two ranks of one NCCL group as Ray actors, each asking for --gpus-per-rank GPU, each calling
torch.distributed.init_process_group("nccl") itself: gpuguard reaches them only through the job's runtime_env
(the setup hook, or GPUGUARD=1 in env_vars).
"""

from __future__ import annotations

import argparse
import os

import ray


@ray.remote
class Rank:
    def init(self, port: int) -> str:
        import torch.distributed as dist

        dist.init_process_group("nccl", init_method=f"tcp://127.0.0.1:{port}", rank=int(os.environ["RANK"]),
                                world_size=int(os.environ["WORLD_SIZE"]))
        return f"rank {dist.get_rank()} joined"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gpus-per-rank", type=float, default=0.5)
    parser.add_argument("--group", default="job")
    parser.add_argument("--port", type=int, required=True)
    args = parser.parse_args()
    ray.init()
    ranks = [Rank.options(num_gpus=args.gpus_per_rank, num_cpus=0, runtime_env={"env_vars": {
        "RANK": str(r), "WORLD_SIZE": "2", "GPUGUARD_GROUP": args.group}}).remote() for r in range(2)]
    print(ray.get([r.init.remote(args.port) for r in ranks]))


if __name__ == "__main__":
    main()
