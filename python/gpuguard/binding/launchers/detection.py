"""detect(): the launcher that started this process, read with the others that describe it; run_id, rank_hint.

Process managers that start this very process (jsrun, Open MPI, MVAPICH2, Flux, HPE Cray PALS, HPE MPT,
MPICH/Hydra and Intel MPI, PMIx, SLURM ``srun``, Kubeflow, Lightning's launcher, plain ``RANK``/``LOCAL_RANK``
variables) are read together: the first one present
names the launcher, the others that describe the same set of processes (the same world size) fill the fields
it lacks (PMIx exports only its rank) and must agree with it. ``LOCAL_RANK=0`` exported once in a batch script
while ``srun`` gives ``SLURM_LOCALID=2`` is exactly the mistake that puts every rank on GPU 0, so disagreement
is an error naming both variables, never a guess. The same world size is no proof, though: an MPI launcher
whose ranks are children of its own daemons (``own_daemons``: mpirun's orted, Hydra's proxies, jsrun) inherits
the SLURM task variables of the step that started the daemon, so SLURM is never read as a second source for
them. ``GPUGUARD_LAUNCHER=<name>`` forces one launcher and turns the cross-checks off, for nestings this
reasoning does not know. A process no launcher describes (a ``torch.multiprocessing.spawn`` child) is given its
ranks as ``bind(rank=, world_size=, local_rank=)`` (``explicit_context``); one that passes none is refused
where "rank 0 of 1" is evidently wrong (``check_spawned_child``).
"""

from __future__ import annotations

import os
from typing import Mapping, Optional, Sequence

from ...errors import LaunchEnvironmentError
from .base import FORCE_VARIABLE, LaunchContext, Launcher, _context_from, read_int
from .registry import LAUNCHERS
from .single_process import SingleProcessLauncher
from .slurm import SlurmLauncher
from .torchrun import TorchrunLauncher


# ---- detection -----------------------------------------------------------------------------------------------

def detect(env: Optional[Mapping[str, str]] = None,
           launchers: Sequence[Launcher] = LAUNCHERS) -> LaunchContext:
    """The launch context of this process (or of ``env``). Raises LaunchEnvironmentError when the variables
    are malformed, incomplete, or contradict each other."""
    env = os.environ if env is None else env
    forced = env.get(FORCE_VARIABLE)
    if forced is not None:
        return _forced(forced, env, launchers)
    for launcher in launchers:
        if launcher.agent or isinstance(launcher, SingleProcessLauncher):  # nothing to merge with
            context = launcher.detect(env)
            if context is not None:
                return context
            continue
        if launcher.present(env):
            return _merged(launcher, [l for l in launchers if not l.agent and l is not launcher], env)
    return SingleProcessLauncher().detect(env)  # type: ignore[return-value]


def _forced(name: str, env: Mapping[str, str], launchers: Sequence[Launcher]) -> LaunchContext:
    by_name = {l.name: l for l in launchers}
    launcher = by_name.get(name.strip().lower())
    if launcher is None:
        raise LaunchEnvironmentError(
            f"{FORCE_VARIABLE}={name!r} names no launcher gpuguard knows; use one of "
            f"{', '.join(sorted(by_name))}.", variable=FORCE_VARIABLE, value=name)
    context = launcher.detect(env)
    if context is None:
        markers = getattr(launcher, "markers", ())
        raise LaunchEnvironmentError(
            f"{FORCE_VARIABLE}={name} but this process was not started by {launcher.description}"
            + (f": {', '.join(m for m in markers if m not in env)} not set." if markers else "."),
            variable=FORCE_VARIABLE, value=name)
    return context


def _merged(primary: Launcher, others: Sequence[Launcher], env: Mapping[str, str]) -> LaunchContext:
    """The primary launcher's fields, completed and cross-checked by every other source that describes the
    same processes. A source whose world size differs describes an outer layer and is left out."""
    readings = [primary.read(env)]
    world = readings[0].values.get("world_size")
    for other in others:
        if isinstance(other, SingleProcessLauncher) or not other.present(env):
            continue
        if primary.own_daemons and isinstance(other, SlurmLauncher):
            continue  # SLURM started mpirun's daemon (orted, hydra_pmi_proxy), not this rank
        reading = other.read(env)
        other_world = reading.values.get("world_size")
        if world is not None and other_world is not None and other_world != world:
            continue  # e.g. the SLURM step that started mpirun's daemons: one task per node
        world = world if world is not None else other_world
        readings.append(reading)
    return _context_from(primary, readings, env)


def run_id(context: LaunchContext, env: Optional[Mapping[str, str]] = None) -> str:
    """What names this launch, the same on every rank of it ("" when the launcher gives nothing): torchrun's
    run id, the SLURM job and step of an srun task, an MPI launcher's job id. Never the SLURM step of an MPI
    daemon: mpirun's own children have none, orted's have orted's, and one launch must not be split."""
    env = os.environ if env is None else env
    if env.get("TORCHELASTIC_RUN_ID"):
        return env["TORCHELASTIC_RUN_ID"]
    if context.launcher == "slurm" and env.get("SLURM_JOB_ID"):
        step = env.get("SLURM_STEP_ID", env.get("SLURM_STEPID", "0"))
        return f"slurm-{env['SLURM_JOB_ID']}.{step}"
    by_name = {l.name: l for l in LAUNCHERS}
    variable = getattr(by_name.get(context.launcher), "run_id_variable", None)
    return f"{context.launcher}-{env[variable]}" if variable and env.get(variable) else ""


def rank_hint(env: Mapping[str, str]) -> Optional[tuple[int, int, str]]:
    """(rank, world size, launcher) from the first launcher whose rank and size both read cleanly, for a
    process whose detect() failed: it still reports its failure to the other ranks under that rank."""
    for launcher in LAUNCHERS:
        if launcher.agent and not isinstance(launcher, TorchrunLauncher):
            continue
        names = {n: launcher.variables.get(n) for n in ("rank", "world_size")}
        if isinstance(launcher, SlurmLauncher):
            names["world_size"] = next((v for v in ("SLURM_STEP_NUM_TASKS", "SLURM_NTASKS") if v in env), None)
        if not names["rank"] or not names["world_size"] or not launcher.present(env):
            continue
        try:
            rank, world = read_int(env, names["rank"]), read_int(env, names["world_size"])
        except LaunchEnvironmentError:
            continue
        if rank is not None and world is not None and rank < world:
            return rank, world, launcher.name
    return None
