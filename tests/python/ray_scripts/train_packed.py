"""A Ray Train job as users write one, run as `python train_packed.py` (test_ray_train.py, gpu/test_gpu_ray.py).

A TorchTrainer of --workers workers with --gpus-per-worker GPU each, its train function a real DDP step; the
script itself never mentions gpuguard: it is switched on for the job's workers either through the setup hook
(`--switch hook`: ray.init(runtime_env={"worker_process_setup_hook": "gpuguard.ray.setup"})) or through
GPUGUARD=1 in runtime_env["env_vars"] (`--switch env`). Without a GPU, start it with the fake driver's
variables set (GPUGUARD_LIBCUDA, GPUGUARD_FAKE_TOPOLOGY) and --fake-gpus N.
"""

from __future__ import annotations

import argparse
import os

import ray
from ray.train import RunConfig, ScalingConfig
from ray.train.torch import TorchTrainer


def train_func() -> None:
    import torch
    import torch.distributed as dist
    from ray.train.torch import get_device, prepare_model

    model = prepare_model(torch.nn.Linear(4, 2))  # DDP on this worker's device
    loss = model(torch.ones(8, 4, device=get_device())).sum()
    loss.backward()
    dist.barrier()
    print(f"worker {dist.get_rank()} trained a step on {get_device()}", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--gpus-per-worker", type=float, default=0.5)
    parser.add_argument("--switch", choices=("hook", "env"), required=True)
    parser.add_argument("--fake-gpus", type=int, default=None, help="tell a local Ray it has this many GPUs")
    parser.add_argument("--storage", default=None, help="where Ray Train keeps the run (default ~/ray_results)")
    args = parser.parse_args()

    # the fake driver's variables, and the test's own (a JSON report path, the source tree), for every worker
    passed = [k for k in os.environ if k.startswith("GPUGUARD_") or k in ("PYTHONPATH", "RAY_DEDUP_LOGS")]
    runtime_env: dict = {"env_vars": {k: os.environ[k] for k in passed}}
    if args.switch == "hook":
        runtime_env["worker_process_setup_hook"] = "gpuguard.ray.setup"
    else:
        runtime_env["env_vars"]["GPUGUARD"] = "1"
    ray.init(num_gpus=args.fake_gpus, num_cpus=args.workers + 2 if args.fake_gpus else None,
             include_dashboard=False, runtime_env=runtime_env)
    trainer = TorchTrainer(train_func, scaling_config=ScalingConfig(
        num_workers=args.workers, use_gpu=True, resources_per_worker={"GPU": args.gpus_per_worker, "CPU": 1}),
        run_config=RunConfig(storage_path=args.storage))
    trainer.fit()
    print("training finished")


if __name__ == "__main__":
    main()
