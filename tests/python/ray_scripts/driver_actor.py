"""A Ray driver script as Ray users write one, run as `python driver_actor.py` (test_ray_driver_script.py).

Its actor and task live in ``__main__``, so Ray pickles them by value, module globals (``gpuguard``) included:
the shape that failed with "cannot pickle '_Package' object". They use gpuguard.bind(), guard(),
assert_same_device(), gpuguard.devices() and the error classes; a ray_placement object goes to each actor as
an argument and its report comes back; gpuguard errors raised in actors reach the driver's except clauses.
Without a GPU, run it with the fake driver's variables set (GPUGUARD_LIBCUDA, GPUGUARD_FAKE_TOPOLOGY).
"""

from __future__ import annotations

import os

import ray
import torch

import gpuguard


@ray.remote
class Rank:
    """One rank of a training job: binds to its GPU, then checks its model and inputs every step."""

    def __init__(self, placement: gpuguard.RayPlacement | None = None) -> None:
        self.placement = placement

    def train_step(self) -> gpuguard.Binding:
        binding = gpuguard.bind(timeout=120)
        model = torch.nn.Linear(4, 2)
        handle = gpuguard.guard(model)
        gpuguard.assert_same_device(model, torch.ones(3, 4))
        model(torch.ones(3, 4))
        handle.remove()
        return binding

    def placement_report(self) -> gpuguard.PlacementReport:
        assert self.placement is not None
        return self.placement.report()

    def inputs_elsewhere(self) -> None:
        gpuguard.assert_same_device(torch.nn.Linear(4, 2), torch.ones(3, 4, device="meta"))


@ray.remote(num_gpus=1, num_cpus=0)
def gpus_this_task_sees() -> list[str]:
    return [device.uuid for device in gpuguard.devices()]


def main() -> None:
    passed = ("GPUGUARD_LIBCUDA", "GPUGUARD_LIBNCCL", "GPUGUARD_FAKE_TOPOLOGY", "PYTHONPATH")
    env_vars = {k: os.environ[k] for k in passed if k in os.environ}
    ray.init(num_gpus=4, num_cpus=2, include_dashboard=False, runtime_env={"env_vars": env_vars})

    with gpuguard.ray_placement(num_workers=2, name="trainers", num_cpus_per_worker=0.5) as placement:
        placement.ready(timeout=300)
        ranks = [Rank.options(**placement.options(r)).remote(placement) for r in range(2)]
        for binding in ray.get([r.train_step.remote() for r in ranks], timeout=600):
            print(binding)
        print(ray.get(ranks[0].placement_report.remote(), timeout=300))
        try:
            ray.get(ranks[1].inputs_elsewhere.remote(), timeout=300)
        except gpuguard.DeviceMismatchError as err:
            print(f"driver caught DeviceMismatchError: devices {err.details['devices']}; {err.fix}")

    print(f"a task sees {ray.get(gpus_this_task_sees.remote(), timeout=300)}")

    # two ranks of one group, half a GPU each: Ray packs them onto one GPU
    packed = [Rank.options(num_gpus=0.5, num_cpus=0, runtime_env={"env_vars": {
        "RANK": str(r), "WORLD_SIZE": "2", "GPUGUARD_GROUP": "packed"}}).remote() for r in range(2)]
    for ref in [p.train_step.remote() for p in packed]:
        try:
            ray.get(ref, timeout=600)
            print("no error: each rank got its own GPU")
        except gpuguard.DuplicateDeviceError as err:
            shared = {gpu["gpu_uuid"]: gpu["ranks"] for gpu in err.details["shared"]}
            print(f"driver caught DuplicateDeviceError of rank {err.details['rank']}: shared {shared}, "
                  f"causes {err.details['causes']}")
            print(err)
    ray.shutdown()


if __name__ == "__main__":
    main()
