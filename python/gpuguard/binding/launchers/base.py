"""What every launcher shares: LaunchContext, the Launcher interface, strict variable reading, context assembly."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, ClassVar, Mapping, Optional, Sequence

from ...errors import LaunchEnvironmentError, LaunchVariablesIncompleteError
from ...group_name import is_group_name

#: Overrides detection: the name of one launcher in ``LAUNCHERS`` (``torchrun``, ``slurm``, ``env``, ...).
FORCE_VARIABLE = "GPUGUARD_LAUNCHER"
#: Names the rank's group (colocated roles such as verl's actor and rollout); default ``"default"``.
GROUP_VARIABLE = "GPUGUARD_GROUP"

FIELDS = ("rank", "world_size", "local_rank", "local_world_size", "node_rank")
_MAX_INT = 10_000_000  # no job has ten million ranks; a larger value is a corrupted variable
_INT_RE = re.compile(r"[0-9]{1,9}")
#: The plain variables any script may set (EnvLauncher reads them), named in the error about a field no
#: launcher variable gave.
PLAIN_VARIABLES: Mapping[str, str] = {"rank": "RANK", "world_size": "WORLD_SIZE", "local_rank": "LOCAL_RANK",
                                      "local_world_size": "LOCAL_WORLD_SIZE", "node_rank": "NODE_RANK"}


@dataclass(frozen=True)
class LaunchContext:
    """What the launcher says about this process. ``sources`` maps each field to the variable that gave it."""

    launcher: str                      # short name: "torchrun", "slurm", "openmpi", ..., "single"
    description: str                   # "SLURM srun", "torchrun (TorchElastic)"
    rank: int
    world_size: int
    local_rank: Optional[int]          # None only for a Ray actor without LOCAL_RANK: Ray's GPU ids decide
    local_world_size: Optional[int]    # None when the launcher does not export it
    node_rank: Optional[int]           # None when the launcher does not export it (Open MPI, MPICH, ...)
    sources: Mapping[str, str] = field(default_factory=dict)
    group: Optional[str] = None        # from GPUGUARD_GROUP
    extra: Mapping[str, Any] = field(default_factory=dict)  # launcher specifics (Ray GPU ids, ...)

    def __post_init__(self) -> None:
        object.__setattr__(self, "sources", MappingProxyType(dict(self.sources)))
        object.__setattr__(self, "extra", MappingProxyType(dict(self.extra)))

    def source(self, name: str) -> str:
        """The variable (or the reason) behind one field, e.g. ``source("local_rank") == "SLURM_LOCALID"``."""
        return self.sources.get(name, "(not given by the launcher)")

    @property
    def local_rank_source(self) -> str:
        return self.source("local_rank")

    def as_dict(self) -> dict[str, Any]:
        return {
            "launcher": self.launcher,
            "description": self.description,
            "rank": self.rank,
            "world_size": self.world_size,
            "local_rank": self.local_rank,
            "local_world_size": self.local_world_size,
            "node_rank": self.node_rank,
            "sources": dict(self.sources),
            "group": self.group,
            "extra": dict(self.extra),
        }


# ---- strict reading of one variable --------------------------------------------------------------------------

def read_int(env: Mapping[str, str], name: str) -> Optional[int]:
    """The variable as a non-negative integer; None when unset. Anything else is an error naming it."""
    raw = env.get(name)
    if raw is None:
        return None
    text = raw.strip()
    if not _INT_RE.fullmatch(text) or int(text) >= _MAX_INT:
        raise LaunchEnvironmentError(
            f"{name}={raw!r} is not a non-negative integer. The launcher (or a script before it) set it "
            f"wrongly; it must be a plain number such as {name}=0.",
            variable=name, value=raw)
    return int(text)


def read_group(env: Mapping[str, str]) -> Optional[str]:
    raw = env.get(GROUP_VARIABLE)
    if raw is None:
        return None
    if not is_group_name(raw):
        raise LaunchEnvironmentError(
            f"{GROUP_VARIABLE}={raw!r} is not a usable group name: use 1 to 128 letters, digits or "
            f"'_.:/@+-', e.g. {GROUP_VARIABLE}=rollout.", variable=GROUP_VARIABLE, value=raw)
    return raw


@dataclass
class Reading:
    """The fields one source gives, each with the variable it came from. Built by ``Launcher.read``."""

    launcher: "Launcher"
    values: dict[str, int] = field(default_factory=dict)
    sources: dict[str, str] = field(default_factory=dict)

    def put(self, name: str, value: Optional[int], source: str) -> None:
        if value is not None:
            self.values[name] = value
            self.sources[name] = source


# ---- the interface -------------------------------------------------------------------------------------------

class Launcher:
    """One launcher. ``detect(env)`` returns its LaunchContext, or None when it did not start this process."""

    name: ClassVar[str]
    description: ClassVar[str]
    #: spawns the workers itself; outer launchers' variables then describe it, so they are not consulted
    agent: ClassVar[bool] = False
    #: field -> environment variable, for launchers that are a set of variables
    variables: ClassVar[Mapping[str, str]] = {}
    #: its ranks are children of its own daemons (mpirun/orted, Hydra's proxies, jsrun): inside a SLURM
    #: allocation the SLURM_* task variables they inherit describe the daemon's step, not the rank, even when
    #: the sizes happen to match, so SLURM is never read as a second source for them
    own_daemons: ClassVar[bool] = False
    #: environment variable naming this launch (one value for all its ranks), for the store namespace
    run_id_variable: ClassVar[Optional[str]] = None
    #: appended to the error when a field is missing: how to supply it for this launcher
    missing_hint: ClassVar[str] = ""

    def present(self, env: Mapping[str, str]) -> bool:
        raise NotImplementedError

    def read(self, env: Mapping[str, str]) -> Reading:
        """Every field this launcher's variables give (malformed values raise, missing ones are absent)."""
        reading = Reading(self)
        for name, var in self.variables.items():
            reading.put(name, read_int(env, var), var)
        return reading

    def expected(self, name: str) -> Optional[str]:
        """The variable this launcher would give ``name`` from, for messages about a missing value."""
        return self.variables.get(name)

    def detect(self, env: Mapping[str, str]) -> Optional[LaunchContext]:
        if not self.present(env):
            return None
        return _context_from(self, [self.read(env)], env)


class _VariableLauncher(Launcher):
    """A launcher recognised by its marker variables being set."""

    markers: ClassVar[Sequence[str]] = ()

    def present(self, env: Mapping[str, str]) -> bool:
        return all(m in env for m in self.markers)


# ---- one LaunchContext from the readings of one or more launchers -------------------------------------------

def _context_from(primary: Launcher, readings: Sequence[Reading], env: Mapping[str, str], *,
                  extra: Optional[Mapping[str, Any]] = None, require_local_rank: bool = True) -> LaunchContext:
    values: dict[str, int] = {}
    sources: dict[str, str] = {}
    for reading in readings:
        for name, value in reading.values.items():
            source = reading.sources[name]
            if name not in values:
                values[name], sources[name] = value, source
            elif values[name] != value and source != sources[name]:
                raise _disagreement(name, (sources[name], values[name]), (source, value),
                                    readings[0].launcher, reading.launcher)
    required = ["rank", "world_size"] + (["local_rank"] if require_local_rank else [])
    missing = [n for n in required if n not in values]
    if missing:
        raise _missing(primary, missing, readings, env)
    _check_ranges(values, sources)
    return LaunchContext(
        launcher=primary.name, description=primary.description,
        rank=values["rank"], world_size=values["world_size"], local_rank=values.get("local_rank"),
        local_world_size=values.get("local_world_size"), node_rank=values.get("node_rank"),
        sources=sources, group=read_group(env), extra=extra or {})


def _disagreement(name: str, first: tuple[str, int], second: tuple[str, int], a: Launcher,
                  b: Launcher) -> LaunchEnvironmentError:
    what = name.replace("_", " ")
    who = a.description if a is b else f"{a.description} and {b.description}"
    return LaunchEnvironmentError(
        f"The launch environment contradicts itself about this process's {what}: {first[0]}={first[1]} "
        f"but {second[0]}={second[1]} ({who}). One of them was set for another process, typically exported "
        f"once in a job script (LOCAL_RANK=$SLURM_LOCALID evaluated before srun) or passed to every rank "
        f"(mpirun -x LOCAL_RANK). Remove the copied variable so the launcher's own value is used; if the "
        f"second launcher really runs inside the first, set {FORCE_VARIABLE}=<name> to choose one.",
        field=name, variables={first[0]: first[1], second[0]: second[1]})


def _missing(primary: Launcher, missing: Sequence[str], readings: Sequence[Reading],
             env: Mapping[str, str]) -> LaunchVariablesIncompleteError:
    expected = []
    for name in missing:
        candidates = [primary.expected(name)] + [r.launcher.expected(name) for r in readings[1:]]
        names = [c for c in dict.fromkeys(candidates) if c]
        if not names:
            names = [PLAIN_VARIABLES[name]]
        expected.append(" or ".join(names))
    known = ", ".join(f"{readings[0].sources[n]}={readings[0].values[n]}" for n in readings[0].values)
    return LaunchVariablesIncompleteError(
        f"This process looks started by {primary.description} ({known or 'its marker variables are set'}), "
        f"but {', '.join(expected)} {'is' if len(expected) == 1 else 'are'} not set, so its "
        f"{' and '.join(n.replace('_', ' ') for n in missing)} cannot be known. Launch it with a launcher "
        f"that exports {'it' if len(expected) == 1 else 'them'}, or export "
        f"{', '.join(PLAIN_VARIABLES[n] for n in missing)} for each process." + primary.missing_hint,
        variables=expected, launcher=primary.name)


def _check_ranges(values: Mapping[str, int], sources: Mapping[str, str]) -> None:
    pairs = (("rank", "world_size"), ("local_rank", "local_world_size"))
    for low, high in pairs:
        if low in values and high in values and values[low] >= values[high]:
            raise LaunchEnvironmentError(
                f"{sources[low]}={values[low]} is not below {sources[high]}={values[high]}: a "
                f"{low.replace('_', ' ')} counts from 0 to {high.replace('_', ' ')} - 1. The variables were "
                f"set for a different job size.", variables={sources[low]: values[low],
                                                            sources[high]: values[high]})
    for name in ("world_size", "local_world_size"):
        if values.get(name) == 0:
            raise LaunchEnvironmentError(f"{sources[name]}=0: a job has at least one process.",
                                         variable=sources[name])
