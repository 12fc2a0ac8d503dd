"""IBM LSF jsrun (JSM): JSM_NAMESPACE_* variables; its ranks are children of its own daemons."""

from __future__ import annotations

from .base import _VariableLauncher


class JsrunLauncher(_VariableLauncher):
    """IBM LSF ``jsrun`` (JSM)."""

    name = "jsrun"
    description = "LSF jsrun"
    own_daemons = True
    markers = ("JSM_NAMESPACE_RANK",)
    variables = {"rank": "JSM_NAMESPACE_RANK", "world_size": "JSM_NAMESPACE_SIZE",
                 "local_rank": "JSM_NAMESPACE_LOCAL_RANK", "local_world_size": "JSM_NAMESPACE_LOCAL_SIZE"}
