"""gpuguard.ray_placement: Ray actors placed one rank per GPU by construction, with verl-style colocated roles.

What ``max_colocate`` means (as verl's ``max_colocate_count``): how many *groups* (roles: actor, rollout,
reference...) may share each GPU. The placement group holds one ``{"GPU": 1, "CPU": ...}`` bundle per rank,
rank r of every group goes to bundle r, and each actor asks for ``num_gpus = 1/max_colocate``. So ranks of
different groups share GPUs (allowed: they never form one NCCL communicator) and two ranks of one group
never do (NCCL refuses that: "Duplicate GPU detected"). Packing ``max_colocate`` ranks of *one* group onto a
GPU is exactly the mistake this module exists to prevent, so it is not offered.

Environment given to each actor: ``RANK``, ``WORLD_SIZE``, ``GPUGUARD_GROUP``, merged into the user's own
``runtime_env["env_vars"]``; a user value that contradicts one of them is an error (an actor that believes
another rank than its bundle is the bug, not a preference). ``LOCAL_RANK`` is not set: Ray narrows
``CUDA_VISIBLE_DEVICES`` to the actor's own GPU, so its device is ``cuda:0`` whatever its place on the node,
and a LOCAL_RANK that code passes to ``set_device`` would be the "invalid device ordinal" of a second node.
``gpuguard.bind()`` returns the right device.
"""

from __future__ import annotations

import numbers
from typing import Any, Optional

from ..errors import RayPlacementError
from ..supported_versions import ray_problem
from ..group_name import is_group_name
from .report import PlacementReport, read_report
from .store import current_job_id, store_actor

STRATEGIES = ("PACK", "SPREAD", "STRICT_PACK", "STRICT_SPREAD")
RANK_VARS = ("RANK", "WORLD_SIZE", "GPUGUARD_GROUP")
# Options that decide where the actor runs: options() sets them; a user value would undo the placement.
_PLACEMENT_OPTIONS = ("scheduling_strategy", "placement_group", "placement_group_bundle_index",
                      "placement_group_capture_child_tasks")


def _ray() -> Any:
    try:
        import ray
    except ImportError as exc:
        raise RayPlacementError("gpuguard.ray_placement needs Ray: pip install 'ray[default]>=2.43'") from exc
    problem = ray_problem(ray.__version__)
    if problem:  # an older Ray lacks what gpuguard's Ray integration relies on (supported_versions.py says what)
        raise RayPlacementError(problem, ray_version=ray.__version__)
    return ray


def _positive_int(name: str, value: Any, why: str) -> int:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 1:
        raise RayPlacementError(f"{name} must be a positive integer, got {value!r} ({type(value).__name__}). "
                                f"{why}", **{name: value})
    return int(value)


def _node_capacities(ray: Any, cpus_per_bundle: float) -> list[tuple[str, int, float, float]]:
    """(node ip, bundles it can hold, GPUs, CPUs) per alive node."""
    out = []
    for node in ray.nodes():
        if not node.get("Alive"):
            continue
        res = node.get("Resources", {})
        gpus, cpus = float(res.get("GPU", 0)), float(res.get("CPU", 0))
        fits = int(gpus + 1e-9)
        if cpus_per_bundle > 0:
            fits = min(fits, int(cpus / cpus_per_bundle + 1e-9))
        out.append((str(node.get("NodeManagerAddress", "?")), fits, gpus, cpus))
    return out


def _check_cluster(ray: Any, num_workers: int, strategy: str, bundle: dict[str, float]) -> None:
    """Refuses a placement group this cluster can never place (Ray would wait for it forever)."""
    nodes = _node_capacities(ray, bundle.get("CPU", 0.0))
    total_gpus = sum(n[2] for n in nodes)
    total_cpus = sum(n[3] for n in nodes)
    per_node = ", ".join(f"{ip}: {g:g} GPU, {c:g} CPU" for ip, _, g, c in nodes) or "no alive nodes"
    cure = ("max_colocate lets several groups (roles) share each GPU; it never puts two ranks of one group on "
            "one GPU, which NCCL refuses (\"Duplicate GPU detected\")")
    details = dict(num_workers=num_workers, strategy=strategy, bundle=bundle, cluster_gpus=total_gpus,
                   cluster_cpus=total_cpus)
    if num_workers > total_gpus:
        raise RayPlacementError(
            f"ray_placement(num_workers={num_workers}) needs {num_workers} GPUs, one per rank, but the Ray "
            f"cluster has {total_gpus:g} (ray.cluster_resources()['GPU']; {per_node}). A placement group that "
            f"cannot be placed waits forever. Use num_workers <= {total_gpus:g}, or add GPUs. ({cure}.)",
            **details)
    capacity = sum(n[1] for n in nodes)
    if strategy == "STRICT_PACK":
        capacity = max((n[1] for n in nodes), default=0)
    elif strategy == "STRICT_SPREAD":
        capacity = sum(1 for n in nodes if n[1] >= 1)
    if num_workers > capacity:
        where = {"STRICT_PACK": "on one node", "STRICT_SPREAD": "on separate nodes"}.get(strategy, "in all")
        raise RayPlacementError(
            f"ray_placement(num_workers={num_workers}, strategy={strategy!r}) needs {num_workers} bundles of "
            f"{bundle} {where}, but this cluster can hold {capacity} ({per_node}). A placement group that "
            f"cannot be placed waits forever. Use {'' if strategy in ('PACK', 'SPREAD') else 'strategy=PACK, '}"
            f"fewer workers, or a smaller num_cpus_per_worker (each bundle holds num_cpus_per_worker x "
            f"max_colocate CPUs).", **details)


def ray_placement(max_colocate: int = 1, *, num_workers: int, strategy: str = "PACK",
                  name: Optional[str] = None, num_cpus_per_worker: float = 1.0,
                  check_resources: bool = True) -> "RayPlacement":
    """A placement group with one GPU bundle per rank; ``.options(rank)`` places an actor on it.

    ``max_colocate``: how many groups (roles) may share each GPU; each actor gets ``num_gpus=1/max_colocate``
    and ``num_cpus=num_cpus_per_worker``, each bundle ``{"GPU": 1, "CPU": num_cpus_per_worker * max_colocate}``.
    ``check_resources=False`` skips the up-front size check, for clusters an autoscaler will grow.
    """
    max_colocate = _positive_int(
        "max_colocate", max_colocate,
        "It is how many groups (roles) may share each GPU; each actor then gets num_gpus=1/max_colocate. "
        "Use 1 (the default) unless roles are colocated.")
    num_workers = _positive_int("num_workers", num_workers, "It is the number of ranks in each group.")
    if strategy not in STRATEGIES:
        raise RayPlacementError(f"strategy must be one of {', '.join(STRATEGIES)}, got {strategy!r}",
                                strategy=strategy)
    if isinstance(num_cpus_per_worker, bool) or not isinstance(num_cpus_per_worker, numbers.Real) \
            or num_cpus_per_worker < 0:
        raise RayPlacementError(f"num_cpus_per_worker must be a number >= 0, got {num_cpus_per_worker!r}",
                                num_cpus_per_worker=num_cpus_per_worker)
    if name is not None and not is_group_name(name):
        raise RayPlacementError(f"name={name!r}: use 1 to 128 letters, digits or '_.:/@+-' (it also names the "
                                f"default group, the actors' GPUGUARD_GROUP), or None", name=name)
    ray = _ray()
    if not ray.is_initialized():
        raise RayPlacementError("gpuguard.ray_placement needs a running Ray: call ray.init() "
                                "(or ray.init(address='auto') to join a cluster) first")
    bundle: dict[str, float] = {"GPU": 1.0}
    if num_cpus_per_worker > 0:
        bundle["CPU"] = float(num_cpus_per_worker) * max_colocate
    if check_resources:
        _check_cluster(ray, num_workers, strategy, bundle)
    pg = ray.util.placement_group([dict(bundle) for _ in range(num_workers)], strategy=strategy,
                                  name=name or "")
    return RayPlacement(pg, num_workers=num_workers, max_colocate=max_colocate, strategy=strategy,
                        name=name, num_cpus_per_worker=float(num_cpus_per_worker), bundle=bundle)


class RayPlacement:
    """A placement group made by ``ray_placement``: actor options per rank, readiness, report, removal."""

    def __init__(self, placement_group: Any, *, num_workers: int, max_colocate: int, strategy: str,
                 name: Optional[str], num_cpus_per_worker: float, bundle: dict[str, float]) -> None:
        self.placement_group = placement_group
        self.num_workers = num_workers
        self.max_colocate = max_colocate
        self.strategy = strategy
        self.name = name
        self.num_cpus_per_worker = num_cpus_per_worker
        self.bundle = dict(bundle)
        # Without a name, the default group is unique to this placement, so two placements of one job
        # never mix their ranks in one rendezvous.
        self.default_group = name or f"gpuguard-{placement_group.id.hex()[:12]}"
        self._job_id = current_job_id()
        self._groups: dict[str, Any] = {}  # group → its rendezvous actor (owned by this driver)
        self._removed = False

    @property
    def num_gpus_per_worker(self) -> float:
        return 1.0 / self.max_colocate

    @property
    def groups(self) -> tuple[str, ...]:
        return tuple(self._groups)

    def __repr__(self) -> str:
        return (f"RayPlacement(num_workers={self.num_workers}, max_colocate={self.max_colocate}, "
                f"strategy={self.strategy!r}, groups={list(self._groups)}, removed={self._removed})")

    def _live(self, what: str) -> None:
        if self._removed:
            raise RayPlacementError(f"RayPlacement.{what}(): this placement was removed (remove() or the end of "
                                    f"its `with` block); make a new one with gpuguard.ray_placement()")

    def options(self, rank: int, *, group: Optional[str] = None, **user_options: Any) -> dict[str, Any]:
        """Keyword arguments for ``ActorClass.options(**...)`` placing rank ``rank`` of ``group``.

        ``group`` names the role (default: the placement's own group); at most ``max_colocate`` groups fit.
        Any other Ray option passes through; ``runtime_env["env_vars"]`` is merged with gpuguard's.
        """
        self._live("options")
        if isinstance(rank, bool) or not isinstance(rank, numbers.Integral) or not 0 <= rank < self.num_workers:
            raise RayPlacementError(f"rank must be an integer in [0, {self.num_workers}) for this placement of "
                                    f"{self.num_workers} workers, got {rank!r}", rank=rank)
        rank = int(rank)
        group = self.default_group if group is None else group
        if not is_group_name(group):
            raise RayPlacementError(f"group={group!r}: use 1 to 128 letters, digits or '_.:/@+-' (it becomes the "
                                    f"actor's GPUGUARD_GROUP), e.g. group='rollout'", group=group)
        if group not in self._groups and len(self._groups) >= self.max_colocate:
            raise RayPlacementError(
                f"placement has max_colocate={self.max_colocate}: each GPU holds {self.max_colocate} actor(s) "
                f"of num_gpus=1/{self.max_colocate}, and group(s) {', '.join(map(repr, self._groups))} already "
                f"use them, so an actor of a further group {group!r} would wait forever for a GPU share. Raise "
                f"max_colocate to {len(self._groups) + 1} or give {group!r} its own placement.",
                group=group, groups=list(self._groups), max_colocate=self.max_colocate)
        env = {"RANK": str(rank), "WORLD_SIZE": str(self.num_workers), "GPUGUARD_GROUP": group}
        opts = self._merge(dict(user_options), env, rank, group)
        if group not in self._groups:
            # The driver owns the group's rendezvous, so it outlives any one rank and ends with remove().
            self._groups[group] = store_actor(group, job_id=self._job_id)
        return opts

    def _merge(self, opts: dict[str, Any], env: dict[str, str], rank: int, group: str) -> dict[str, Any]:
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        for key in _PLACEMENT_OPTIONS:
            if key in opts:
                raise RayPlacementError(
                    f"options(rank={rank}, {key}=...): gpuguard sets {key} itself (rank {rank} goes to bundle "
                    f"{rank} of this placement group); drop yours, or do not use ray_placement for this actor.",
                    rank=rank, option=key)
        want_gpus = self.num_gpus_per_worker
        if "num_gpus" in opts and abs(float(opts["num_gpus"]) - want_gpus) > 1e-9:
            raise RayPlacementError(
                f"options(rank={rank}, num_gpus={opts['num_gpus']!r}): this placement gives each actor "
                f"num_gpus=1/{self.max_colocate} (max_colocate={self.max_colocate}); another share either does "
                f"not fit the bundle (it would wait forever) or leaves room for ranks of one group to share a GPU. "
                f"Drop num_gpus, or change max_colocate.", rank=rank, num_gpus=opts["num_gpus"])
        cpus = opts.get("num_cpus", self.num_cpus_per_worker)
        if float(cpus) > self.num_cpus_per_worker + 1e-9:
            raise RayPlacementError(
                f"options(rank={rank}, num_cpus={cpus!r}): each bundle reserves num_cpus_per_worker="
                f"{self.num_cpus_per_worker:g} CPU per actor, so this actor would wait forever. Pass "
                f"num_cpus_per_worker={cpus!r} to ray_placement() instead.", rank=rank, num_cpus=cpus)
        runtime_env = dict(opts.get("runtime_env") or {})
        env_vars = {str(k): str(v) for k, v in dict(runtime_env.get("env_vars") or {}).items()}
        for key, value in env.items():
            if key in env_vars and env_vars[key] != value:
                raise RayPlacementError(
                    f"options(rank={rank}, group={group!r}): your runtime_env sets {key}={env_vars[key]!r}, but "
                    f"this actor is {key}={value!r} of the placement (rank r runs on bundle r). Two sources of "
                    f"rank that disagree end with ranks on the wrong GPU; drop {key} from your env_vars.",
                    rank=rank, variable=key, yours=env_vars[key], placement=value)
            env_vars[key] = value
        runtime_env["env_vars"] = env_vars
        opts.update(
            num_gpus=want_gpus,
            num_cpus=cpus,
            runtime_env=runtime_env,
            scheduling_strategy=PlacementGroupSchedulingStrategy(
                placement_group=self.placement_group, placement_group_bundle_index=rank),
        )
        return opts

    def ready(self, timeout: float = 120.0) -> "RayPlacement":
        """Waits until Ray has reserved every bundle; a clear error, not a hang, after ``timeout`` seconds."""
        self._live("ready")
        ray = _ray()
        try:
            ray.get(self.placement_group.ready(), timeout=timeout)
        except ray.exceptions.GetTimeoutError:
            try:
                available = {k: v for k, v in ray.available_resources().items() if k in ("GPU", "CPU")}
            except Exception:  # the message is still useful without it
                available = {}
            raise RayPlacementError(
                f"the placement group of {self.num_workers} bundles {self.bundle} (strategy {self.strategy!r}) "
                f"was not placed within {timeout:g} s; free now: {available or 'unknown'}. Other placement "
                f"groups or actors may hold the GPUs (see `ray status`), or an autoscaler is still adding "
                f"nodes.", num_workers=self.num_workers, bundle=self.bundle, available=available) from None
        return self

    def report(self, groups: Optional[list[str]] = None) -> PlacementReport:
        """Rank → node, Ray GPU ids, GPU share and UUID for each group, from what the actors' bind() published."""
        self._live("report")
        names = list(groups) if groups is not None else list(self._groups)
        unknown = [g for g in names if g not in self._groups]
        if unknown:
            raise RayPlacementError(f"report(): no actor of group(s) {unknown} was placed with this placement "
                                    f"(its groups: {list(self._groups)})", groups=unknown)
        return read_report({g: self.num_workers for g in names}, job_id=self._job_id)

    def remove(self) -> None:
        """Frees the GPUs and ends the groups' rendezvous actors. Safe to call twice."""
        if self._removed:
            return
        self._removed = True
        ray = _ray()
        if not ray.is_initialized():  # ray.shutdown() already took everything down
            return
        for handle in self._groups.values():
            try:
                ray.kill(handle)
            except Exception:  # already gone: nothing left to free
                pass
        ray.util.remove_placement_group(self.placement_group)

    def __enter__(self) -> "RayPlacement":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.remove()
