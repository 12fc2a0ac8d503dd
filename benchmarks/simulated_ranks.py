"""The identities of simulated ranks for the placement benchmarks: 8 GPUs per host, and hosts that put two ranks
on each of half their GPUs where a run wants a failing check."""

from __future__ import annotations

import zlib

from gpuguard.placement import RankIdentity


def identity(rank: int, world: int, sharing_hosts: frozenset[int]) -> RankIdentity:
    host, local = divmod(rank, 8)
    gpu = local // 2 if host in sharing_hosts else local
    name = f"node-{host:04d}"
    return RankIdentity(rank=rank, world_size=world, local_rank=local, local_world_size=8,
                        host_hash=zlib.crc32(name.encode()), hostname=name,
                        gpu_uuid=f"GPU-{zlib.crc32(name.encode()):08x}-{gpu:04x}-4000-8000-000000000000",
                        pci_bus_id=f"0000:{0x18 + gpu:02x}:00.0", gpu_index=gpu, pid=10000 + rank,
                        visible_device_count=8, launcher="bench")


def few_sharing_hosts(world: int) -> frozenset[int]:
    """Three hosts (first, one in the middle, last) that each put two ranks on half their GPUs."""
    return frozenset({0, world // 16, world // 8 - 1}) if world >= 24 else frozenset({0})
