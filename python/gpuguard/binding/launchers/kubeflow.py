"""A Kubeflow PyTorchJob pod: RANK, WORLD_SIZE, MASTER_ADDR/PORT in Kubernetes, one process per pod."""

from __future__ import annotations

from typing import Mapping

from .base import Reading, _VariableLauncher


class KubeflowLauncher(_VariableLauncher):
    """A Kubeflow PyTorchJob pod: the operator sets RANK (the pod's index), WORLD_SIZE (the number of pods),
    MASTER_ADDR and MASTER_PORT, and no LOCAL_RANK: one process per pod. (With ``nprocPerNode`` the pod runs
    torchrun, which is recognised first.)"""

    name = "kubeflow"
    description = "Kubeflow PyTorchJob"
    markers = ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")
    variables = {"rank": "RANK", "world_size": "WORLD_SIZE"}

    def present(self, env: Mapping[str, str]) -> bool:
        in_kubernetes = "KUBERNETES_SERVICE_HOST" in env or "KUBERNETES_PORT" in env
        return (in_kubernetes and super().present(env)
                and not any(v in env for v in ("LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK")))

    def read(self, env: Mapping[str, str]) -> Reading:
        reading = super().read(env)
        implied = "(implied: a PyTorchJob pod runs one process)"
        reading.put("local_rank", 0, implied)
        reading.put("local_world_size", 1, implied)
        reading.put("node_rank", reading.values.get("rank"), "RANK")
        return reading
