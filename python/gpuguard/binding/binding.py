"""Binding: what bind() returns, where this process runs, its ranks, its device and how it was chosen."""

from __future__ import annotations

from dataclasses import dataclass, field
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, Mapping, Optional

if TYPE_CHECKING:
    import torch


@dataclass(frozen=True)
class Binding:
    """Where this process runs: its ranks, its device and how that device was chosen."""

    launcher: str
    rank: int
    local_rank: int
    world_size: int
    local_world_size: Optional[int]
    node_rank: Optional[int]
    device_index: Optional[int]          # None on the CPU
    uuid: Optional[str]
    pci_bus_id: Optional[str]
    device_name: Optional[str]
    host: str
    cuda_visible_devices: Optional[str]  # the raw environment value; None when unset
    visible_device_count: int
    local_rank_source: str               # the variable that gave the local rank, e.g. "SLURM_LOCALID"
    group: str
    chosen_by: str                       # how the device was chosen, for logs
    extra: Mapping[str, Any] = field(default_factory=dict)  # launcher specifics: Ray GPU ids and share, ...

    def __post_init__(self) -> None:
        object.__setattr__(self, "extra", MappingProxyType(dict(self.extra)))

    @property
    def device(self) -> torch.device:
        """``torch.device("cuda", device_index)``, or the CPU's. Imports torch; nothing else in Binding does, so that
        ``gpuguard check`` binds without it."""
        import torch

        return torch.device("cpu") if self.device_index is None else torch.device("cuda", self.device_index)

    @property
    def device_text(self) -> str:
        """What ``str(self.device)`` says, without torch: "cuda:N" or "cpu"."""
        return "cpu" if self.device_index is None else f"cuda:{self.device_index}"

    @property
    def is_gpu(self) -> bool:
        return self.device_index is not None

    def __str__(self) -> str:
        lws = "?" if self.local_world_size is None else str(self.local_world_size)
        node = "" if self.node_rank is None else f" node {self.node_rank}"
        group = "" if self.group == "default" else f" group {self.group}"
        if self.is_gpu:
            where = f"{self.device_text} ({self.uuid}, {self.pci_bus_id})"
        else:
            where = f"cpu ({self.chosen_by})"
        visible = ("unset" if self.cuda_visible_devices is None else repr(self.cuda_visible_devices))
        # "(no launcher variables: ...)" and the like explain themselves; a variable name needs "from"
        source = "" if self.local_rank_source.startswith("(") else f", local rank from {self.local_rank_source}"
        return (f"gpuguard: rank {self.rank}/{self.world_size} local {self.local_rank}/{lws}{node}{group} "
                f"-> {where} on {self.host} [{self.launcher}{source}, CUDA_VISIBLE_DEVICES={visible}]")

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready: for logs, reports and tests."""
        return {
            "launcher": self.launcher, "rank": self.rank, "local_rank": self.local_rank,
            "world_size": self.world_size, "local_world_size": self.local_world_size,
            "node_rank": self.node_rank, "device": self.device_text, "device_index": self.device_index,
            "uuid": self.uuid, "pci_bus_id": self.pci_bus_id, "device_name": self.device_name,
            "host": self.host, "cuda_visible_devices": self.cuda_visible_devices,
            "visible_device_count": self.visible_device_count, "local_rank_source": self.local_rank_source,
            "group": self.group, "chosen_by": self.chosen_by, "extra": dict(self.extra),
        }
