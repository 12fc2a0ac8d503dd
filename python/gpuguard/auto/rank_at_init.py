"""A rank's launch context at ``init_process_group``: its launcher's, completed by the call's own arguments.

Some launchers never export the global rank: Lightning's own launcher (LOCAL_RANK, NODE_RANK, WORLD_SIZE, no
RANK), Lightning's ``ddp_spawn`` (LOCAL_RANK alone) and ``torch.multiprocessing.spawn`` (nothing). Their
frameworks compute it and pass it to ``init_process_group(rank=, world_size=)``, and torch forms the group with
exactly those, so the zero-code check reads them there: ``detect()``'s answer when the variables are complete
(with the call's rank and world size, which win), else a context built from the call and whatever the
environment does say (LOCAL_RANK, NODE_RANK, LOCAL_WORLD_SIZE). Variables that contradict each other are still
an error, and so is an exported WORLD_SIZE the call contradicts where the variables lack the rank: only a
missing field is completed. The launcher is named after the framework whose
code made the call (``lightning``, ``accelerate``, ...), found on the call stack, or the way the process was
started (``spawn``: a multiprocessing child), so the report never says "single" for rank 0 of 2; that framework
is kept in every context's ``extra["framework"]``, for advice in its own words (framework_advice).
"""

from __future__ import annotations

import dataclasses
import multiprocessing
import os
import sys
from typing import Any, Mapping, Optional

from ..binding.launchers import LaunchContext, detect
from ..binding.launchers.base import PLAIN_VARIABLES, _check_ranges, read_group, read_int
from ..binding.launchers.lightning import LightningLauncher
from ..errors import LaunchEnvironmentError, LaunchVariablesIncompleteError

#: Top-level packages whose code calls init_process_group for the user, by the name the report gives them.
FRAMEWORKS: Mapping[str, str] = {
    "lightning": "lightning", "pytorch_lightning": "lightning", "lightning_fabric": "lightning",
    "accelerate": "accelerate", "transformers": "transformers", "deepspeed": "deepspeed", "verl": "verl",
}
#: Packages the search for the calling framework looks through: gpuguard's own wrapper and torch's decorators.
_PASS_THROUGH = ("gpuguard", "torch", "functools", "contextlib")
_FROM_INIT = {"rank": "init_process_group(rank=)", "world_size": "init_process_group(world_size=)"}


def init_int(kwargs: Mapping[str, Any], name: str, least: int) -> Optional[int]:
    """``init_process_group``'s ``rank=``/``world_size=`` when given as a usable int (torch's default is -1)."""
    value = kwargs.get(name)
    if isinstance(value, int) and not isinstance(value, bool) and value >= least:
        return value
    return None


def calling_framework() -> Optional[str]:
    """The framework whose code called init_process_group (the first frame outside gpuguard and torch), if any."""
    frame = sys._getframe(1)
    while frame is not None:
        top = str(frame.f_globals.get("__name__", "")).split(".")[0]
        if top not in _PASS_THROUGH:
            return FRAMEWORKS.get(top)
        frame = frame.f_back  # type: ignore[assignment]
    return None


def started_as(env: Mapping[str, str], framework: Optional[str]) -> tuple[str, str]:
    """(launcher name, description) of a process whose rank only init_process_group names."""
    if LightningLauncher().present(env):
        return "lightning", "Lightning's subprocess launcher (rank from init_process_group(rank=))"
    if framework is not None:
        return framework, f"{framework}'s init_process_group(rank=, world_size=) call"
    if multiprocessing.parent_process() is not None:
        return "spawn", "a multiprocessing child given its rank by init_process_group(rank=, world_size=)"
    return "init_process_group", "init_process_group(rank=, world_size=)"


def context_at_init(kwargs: Mapping[str, Any], env: Optional[Mapping[str, str]] = None) -> LaunchContext:
    """The context the check of the group about to be formed uses. Raises LaunchEnvironmentError when the
    variables are malformed or contradictory, or incomplete and the call does not name the rank either."""
    env = os.environ if env is None else env
    framework = calling_framework()
    try:
        context = with_init_ranks(detect(env), kwargs)
    except LaunchVariablesIncompleteError as missing:
        context = from_init_call(kwargs, env, missing, framework)
    else:
        if context.launcher == "single" and context.world_size > 1:  # no launcher, but the call names a rank
            context = from_init_call(kwargs, env, None, framework)
    if framework is None:
        return context
    return dataclasses.replace(context, extra={**context.extra, "framework": framework})


def with_init_ranks(context: LaunchContext, kwargs: Mapping[str, Any]) -> LaunchContext:
    """The launch context with init_process_group's own ``rank=`` and ``world_size=``: torch forms the group with
    those, whatever the environment says. Ray Train V1 (Ray 2.43's default) passes them only as arguments, so the
    environment alone would make every worker "rank 0 of 1" and skip the check."""
    rank, world_size = init_int(kwargs, "rank", 0), init_int(kwargs, "world_size", 1)
    changes: dict[str, Any] = {}
    sources = dict(context.sources)
    if rank is not None and rank != context.rank:
        changes["rank"], sources["rank"] = rank, _FROM_INIT["rank"]
    if world_size is not None and world_size != context.world_size:
        changes["world_size"], sources["world_size"] = world_size, _FROM_INIT["world_size"]
    if not changes:
        return context
    return dataclasses.replace(context, sources=sources, **changes)


def from_init_call(kwargs: Mapping[str, Any], env: Mapping[str, str],
                   missing: Optional[LaunchVariablesIncompleteError], framework: Optional[str]) -> LaunchContext:
    """The context init_process_group's rank= and world_size= give, with what the environment adds; ``missing``:
    the launcher's word on what it lacks, raised when the call does not name the rank either."""
    rank, world_size = init_int(kwargs, "rank", 0), init_int(kwargs, "world_size", 1)
    if rank is None or world_size is None:
        assert missing is not None  # a single process's context is replaced only when the call names both
        raise missing  # nothing names the rank: the launcher's own message says what to pass
    values = {"rank": rank, "world_size": world_size}
    sources = dict(_FROM_INIT)
    for name in ("local_rank", "local_world_size", "node_rank"):
        value = read_int(env, PLAIN_VARIABLES[name])
        if value is not None:
            values[name], sources[name] = value, PLAIN_VARIABLES[name]
    exported_world = read_int(env, "WORLD_SIZE")
    if exported_world is not None and exported_world != world_size:
        raise LaunchEnvironmentError(
            f"init_process_group(world_size={world_size}) but WORLD_SIZE={exported_world}: the job's ranks were "
            f"started for another world size than the group is formed with. The launcher's WORLD_SIZE and the "
            f"framework's devices x num_nodes must agree (a number of devices or nodes set differently in the "
            f"script and on the command line).", variables={"WORLD_SIZE": exported_world, "world_size": world_size})
    _check_ranges(values, sources)  # the launchers' own: a rank below its world size, no world of 0
    name, description = started_as(env, framework)
    return LaunchContext(launcher=name, description=description, rank=rank, world_size=world_size,
                         local_rank=values.get("local_rank"), local_world_size=values.get("local_world_size"),
                         node_rank=values.get("node_rank"), sources=sources, group=read_group(env))
