"""One rank's identity record, the who-is-where the ranks exchange (``gpuguard::IdentityRecord`` in C++)."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Optional

from .. import _C
from ..errors import GpuGuardError


@dataclass
class RankIdentity:
    """One rank's identity record (the fields of ``gpuguard::IdentityRecord``)."""

    rank: int
    world_size: int
    group: str = "default"
    local_rank: int = -1
    local_world_size: int = -1
    host_hash: int = 0
    hostname: str = ""
    gpu_uuid: str = ""
    pci_bus_id: str = ""
    gpu_index: int = -1
    pid: int = 0
    cuda_visible_devices: Optional[str] = None
    visible_device_count: int = -1
    launcher: str = ""
    multi_rank_gpu_enabled: bool = False
    failure_kind: Optional[str] = None
    failure_text: str = ""
    gpu_fraction: Optional[float] = None
    ray_gpu_ids: str = ""

    def encode(self) -> bytes:
        try:
            return _C.encode_identity(asdict(self))
        except ValueError as exc:
            raise GpuGuardError(f"gpuguard could not describe rank {self.rank} for the cross-rank check: {exc}",
                                rank=self.rank) from exc

    @classmethod
    def decode(cls, data: bytes) -> "RankIdentity":
        return cls(**_C.decode_identity(data))
