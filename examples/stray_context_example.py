"""A DDP job in which one rank loads its checkpoint before torch.cuda.set_device, so its tensors (and a CUDA context
that stays until the process exits) land on cuda:0, the GPU rank 0 trains on. gpuguard.bind() finds that context
(cuDevicePrimaryCtxGetState: it creates none) and stops every rank, naming the rank, both GPUs and what the context
costs (NVML's figure for that process).

On a GPU node:

    torchrun --nproc_per_node=2 examples/stray_context_example.py
    torchrun --nproc_per_node=2 examples/stray_context_example.py --fixed

Without a GPU, against gpuguard's fake driver and fake NVML (build them first: bash scripts/test.sh):

    GPUGUARD_LIBCUDA=$PWD/build/dev/tests/fakes/libgpuguard_fake_cuda.so \\
    GPUGUARD_LIBNVML=$PWD/build/dev/tests/fakes/libgpuguard_fake_nvml.so \\
    GPUGUARD_FAKE_GPU_STATE_DIR=$(mktemp -d) GPUGUARD_FAKE_TOPOLOGY=$PWD/tests/fakes/topologies/h100x4.json \\
    PYTHONPATH=$PWD/python python -m torch.distributed.run --standalone --nproc_per_node=2 \\
    examples/stray_context_example.py

--fixed binds first and loads after, as the fix says: every rank then runs on its own GPU.
"""

from __future__ import annotations

import argparse
import ctypes
import os

import torch

import gpuguard


def load_checkpoint_before_set_device() -> None:
    """What torch.load(path) does with tensors saved from cuda:0 when no map_location is given, here on one rank:
    they come back on cuda:0, the current device until set_device, and a CUDA context comes with them."""
    if torch.cuda.is_available():
        torch.zeros(1, device="cuda")  # cuda:0: set_device has not been called yet
    else:  # gpuguard's fake driver stands in for the GPU: make that context the way the CUDA runtime does
        driver = ctypes.CDLL(os.environ["GPUGUARD_LIBCUDA"])
        context = ctypes.c_void_p()
        assert driver.cuInit(0) == 0 and driver.cuDevicePrimaryCtxRetain(ctypes.byref(context), 0) == 0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--fixed", action="store_true", help="bind first, load the checkpoint after")
    args = parser.parse_args()
    rank = int(os.environ["RANK"])
    if rank == 1 and not args.fixed:
        load_checkpoint_before_set_device()
    try:
        binding = gpuguard.bind(timeout=60)
    except gpuguard.GpuGuardError as exc:
        print(f"rank {rank}: {type(exc).__name__}: {exc}", flush=True)
        return
    # the fix: load checkpoints after bind(), with map_location="cpu" or the rank's own device
    print(f"rank {rank}: cuda:{binding.device_index} ({binding.uuid}), no context on any other GPU", flush=True)


if __name__ == "__main__":
    main()
