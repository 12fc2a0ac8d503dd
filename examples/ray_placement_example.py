"""Ray actors placed one rank per GPU by gpuguard.ray_placement, and proven so by gpuguard.bind() in each actor.

On a GPU node (or a Ray cluster: pass --address auto):

    python examples/ray_placement_example.py --workers 8 --max-colocate 2

Without a GPU, against gpuguard's fake driver (build it first: bash scripts/test.sh, or see tests/fakes):

    GPUGUARD_LIBCUDA=$PWD/build/dev/tests/fakes/libgpuguard_fake_cuda.so \\
    GPUGUARD_FAKE_TOPOLOGY=$PWD/tests/fakes/topologies/h100x4.json PYTHONPATH=$PWD/python \\
    python examples/ray_placement_example.py --fake-gpus 4 --workers 4 --max-colocate 2 --cpus-per-worker 0.1

--fractional also shows the mistake gpuguard exists for: actors given num_gpus=1/3 without a placement, so
Ray packs three ranks of one group on each GPU; every actor's bind() then stops with the same report.
"""

from __future__ import annotations

import argparse
import os
from typing import Any

import ray

import gpuguard


@ray.remote
class Worker:
    """Stands for a training or rollout worker: binds to its GPU first thing, as real workers should."""

    def bind(self) -> dict[str, Any]:
        try:
            binding = gpuguard.bind(timeout=120)
        except gpuguard.GpuGuardError as exc:
            return {"rank": os.environ.get("RANK"), "error": f"{type(exc).__name__}: {exc}"}
        # torch.distributed.init_process_group(backend="nccl", ...) would follow here, on binding.device.
        return {"rank": binding.rank, "binding": str(binding)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, default=4, help="ranks per group (one GPU each)")
    parser.add_argument("--max-colocate", type=int, default=1,
                        help="groups (roles) sharing each GPU: 2 = an 'actor' and a 'rollout' rank per GPU")
    parser.add_argument("--cpus-per-worker", type=float, default=1.0,
                        help="CPUs each actor reserves (a laptop-sized fake run wants less than 1)")
    parser.add_argument("--address", default=None, help="Ray cluster to join (default: start a local one)")
    parser.add_argument("--fake-gpus", type=int, default=None,
                        help="tell a local Ray it has this many GPUs (with gpuguard's fake driver)")
    parser.add_argument("--fractional", action="store_true",
                        help="also show what num_gpus=1/3 without a placement does")
    args = parser.parse_args()

    # Workers need the fake driver's variables too (on a real GPU node there are none to pass).
    passed = ("GPUGUARD_LIBCUDA", "GPUGUARD_LIBNCCL", "GPUGUARD_FAKE_TOPOLOGY", "PYTHONPATH")
    env_vars = {k: os.environ[k] for k in passed if k in os.environ}
    ray.init(address=args.address, num_gpus=args.fake_gpus, include_dashboard=False,
             runtime_env={"env_vars": env_vars} if env_vars else None)

    roles = ["actor", "rollout", "reference", "critic"][:args.max_colocate]
    with gpuguard.ray_placement(args.max_colocate, num_workers=args.workers, name="example",
                                num_cpus_per_worker=args.cpus_per_worker) as placement:
        placement.ready(timeout=300)
        workers = [Worker.options(**placement.options(rank, group=role)).remote()
                   for role in roles for rank in range(args.workers)]
        for result in ray.get([w.bind.remote() for w in workers], timeout=600):
            print(result.get("binding") or result["error"])
        print()
        report = placement.report()
        print(report)  # the table; report.as_dict() is the same as data
        for w in workers:
            ray.kill(w)

    if args.fractional:
        n = 6
        print(f"\n{n} ranks of one group given num_gpus=1/3 each, no placement:")
        packed = [Worker.options(num_gpus=1 / 3, num_cpus=0, runtime_env={"env_vars": {
            "RANK": str(r), "WORLD_SIZE": str(n), "GPUGUARD_GROUP": "packed"}}).remote() for r in range(n)]
        results = ray.get([w.bind.remote() for w in packed], timeout=600)
        print(results[0].get("error") or "no error: Ray gave each rank its own GPU")


if __name__ == "__main__":
    main()
