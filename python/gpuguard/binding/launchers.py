"""Which launcher started this process, and its rank, world size, local rank and node rank, read strictly.

One small class per launcher behind one interface (``detect(env)``), tried in the fixed order of
``LAUNCHERS``: innermost first. Launchers nest: ``srun torchrun ...`` gives each torchrun worker the SLURM
variables of the torchrun *agent* (``SLURM_LOCALID=0`` for every worker); ``mpirun`` inside an allocation
gives each MPI rank the SLURM variables of the MPI daemon; a Ray cluster started under SLURM gives every actor
the raylet's. So the launchers that spawn the workers themselves (torchrun, the DeepSpeed launcher, horovodrun, Ray) are
tried first, and their word is final: the outer launcher's variables describe their parent.

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
import re
import sys
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, ClassVar, Mapping, Optional, Sequence

from ..errors import LaunchEnvironmentError
from ..group_name import is_group_name

#: Overrides detection: the name of one launcher below (``torchrun``, ``slurm``, ``env``, ...).
FORCE_VARIABLE = "GPUGUARD_LAUNCHER"
#: Names the rank's group (colocated roles such as verl's actor and rollout); default ``"default"``.
GROUP_VARIABLE = "GPUGUARD_GROUP"

FIELDS = ("rank", "world_size", "local_rank", "local_world_size", "node_rank")
_MAX_INT = 10_000_000  # no job has ten million ranks; a larger value is a corrupted variable
_INT_RE = re.compile(r"[0-9]{1,9}")


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


def parse_tasks_per_node(text: str) -> list[int]:
    """SLURM's compressed list: ``"5(x2),3"`` -> ``[5, 5, 3]``. Raises ValueError on anything else."""
    out: list[int] = []
    for part in text.split(","):
        m = re.fullmatch(r"\s*([0-9]{1,6})(?:\(x([0-9]{1,6})\))?\s*", part)
        if not m:
            raise ValueError(part)
        count = int(m.group(2) or 1)
        if len(out) + count > _MAX_INT:
            raise ValueError(part)
        out.extend([int(m.group(1))] * count)
    return out


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


class TorchrunLauncher(_VariableLauncher):
    """torchrun / torch.distributed.run (TorchElastic); also ``python -m torch.distributed.launch``."""

    name = "torchrun"
    description = "torchrun (TorchElastic)"
    agent = True
    markers = ("TORCHELASTIC_RUN_ID",)
    variables = {"rank": "RANK", "world_size": "WORLD_SIZE", "local_rank": "LOCAL_RANK",
                 "local_world_size": "LOCAL_WORLD_SIZE", "node_rank": "GROUP_RANK"}


class DeepSpeedLauncher(_VariableLauncher):
    """The ``deepspeed`` launcher (deepspeed.launcher.launch): it also narrows CUDA_VISIBLE_DEVICES per node."""

    name = "deepspeed"
    description = "DeepSpeed launcher"
    agent = True
    markers = ("CROSS_RANK", "LOCAL_SIZE", "RANK")
    variables = {"rank": "RANK", "world_size": "WORLD_SIZE", "local_rank": "LOCAL_RANK",
                 "local_world_size": "LOCAL_SIZE", "node_rank": "CROSS_RANK"}


class RayActorLauncher(Launcher):
    """A Ray actor or task (a Ray *worker* process; the driver is not one).

    Ray decides the GPU: ``get_accelerator_ids()["GPU"]`` are the ids it assigned, which it also writes into
    CUDA_VISIBLE_DEVICES unless ``RAY_EXPERIMENTAL_NOSET_CUDA_VISIBLE_DEVICES`` is set. Rank, world size and
    local rank come from the actor's environment (``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, set by
    ``ray_placement``, Ray Train or the framework), the group from ``GPUGUARD_GROUP``.
    """

    name = "ray"
    description = "Ray actor"
    agent = True
    variables = {"rank": "RANK", "world_size": "WORLD_SIZE", "local_rank": "LOCAL_RANK",
                 "local_world_size": "LOCAL_WORLD_SIZE", "node_rank": "NODE_RANK"}

    def __init__(self, runtime_context: Any = None) -> None:
        # tests hand in a stand-in for ray.get_runtime_context(); normally it is looked up lazily
        self._runtime_context = runtime_context

    def _context(self) -> Any:
        if self._runtime_context is not None:
            return self._runtime_context
        ray = sys.modules.get("ray")  # a Ray worker has imported ray; never import it (slow) to find out
        if ray is None or not hasattr(ray, "is_initialized") or not ray.is_initialized():
            return None
        ctx = ray.get_runtime_context()
        worker_mode = getattr(getattr(ray, "_private", None), "worker", None)
        worker_mode = getattr(worker_mode, "WORKER_MODE", 1)
        if getattr(getattr(ctx, "worker", None), "mode", None) != worker_mode:
            return None  # the driver script, not an actor or task
        return ctx

    def present(self, env: Mapping[str, str]) -> bool:
        return self._context() is not None

    def detect(self, env: Mapping[str, str]) -> Optional[LaunchContext]:
        ctx = self._context()
        if ctx is None:
            return None
        gpu_ids = [str(i) for i in ctx.get_accelerator_ids().get("GPU", [])]
        try:
            share = ctx.get_assigned_resources().get("GPU")
        except Exception:  # pragma: no cover - older Ray without it; the share is only reported
            share = None
        reading = self.read(env)
        if "rank" not in reading.values and "world_size" in reading.values:
            raise LaunchEnvironmentError(
                f"This Ray actor has WORLD_SIZE={env['WORLD_SIZE']} but no RANK: set RANK in the actor's "
                f"runtime_env env_vars (gpuguard.ray_placement(...).options(rank) does).", variable="RANK")
        if "rank" not in reading.values:
            reading.put("rank", 0, "(RANK not set: one Ray worker)")
            reading.put("world_size", 1, "(WORLD_SIZE not set: one Ray worker)")
        elif "world_size" not in reading.values:
            raise LaunchEnvironmentError(
                f"This Ray actor has RANK={env['RANK']} but no WORLD_SIZE: set WORLD_SIZE in the actor's "
                f"runtime_env env_vars as well.", variable="WORLD_SIZE")
        extra = {
            "ray_gpu_ids": gpu_ids,
            "ray_gpu_share": float(share) if share is not None else None,
            "ray_noset_cuda_visible_devices": env.get("RAY_EXPERIMENTAL_NOSET_CUDA_VISIBLE_DEVICES", "")
            .lower() in ("1", "true"),
        }
        return _context_from(self, [reading], env, extra=extra, require_local_rank=False)


class HorovodLauncher(_VariableLauncher):
    """``horovodrun`` with Gloo (and Horovod's Spark, Ray and elastic drivers), which start every worker with
    HOROVOD_RANK, HOROVOD_SIZE, HOROVOD_LOCAL_RANK, HOROVOD_LOCAL_SIZE, HOROVOD_CROSS_RANK and
    HOROVOD_CROSS_SIZE (horovod/runner/gloo_run.py, ``_alloc_info_to_command_fn`` / ``get_command``).
    ``horovodrun --mpi`` exports none of them: its ranks are Open MPI's (or MPICH's) and are read as such.

    The workers are spawned by horovodrun itself, so any SLURM or MPI variables around them are horovodrun's.
    HOROVOD_CROSS_RANK is not taken as the node rank: it is the index among the workers that have the same
    local rank, which is the host's index only when every host runs the same number of workers.
    """

    name = "horovod"
    description = "horovodrun (Gloo)"
    agent = True
    markers = ("HOROVOD_RANK",)
    variables = {"rank": "HOROVOD_RANK", "world_size": "HOROVOD_SIZE", "local_rank": "HOROVOD_LOCAL_RANK",
                 "local_world_size": "HOROVOD_LOCAL_SIZE"}


class JsrunLauncher(_VariableLauncher):
    """IBM LSF ``jsrun`` (JSM)."""

    name = "jsrun"
    description = "LSF jsrun"
    own_daemons = True
    markers = ("JSM_NAMESPACE_RANK",)
    variables = {"rank": "JSM_NAMESPACE_RANK", "world_size": "JSM_NAMESPACE_SIZE",
                 "local_rank": "JSM_NAMESPACE_LOCAL_RANK", "local_world_size": "JSM_NAMESPACE_LOCAL_SIZE"}


class OpenMpiLauncher(_VariableLauncher):
    """Open MPI ``mpirun``/``mpiexec`` (ORTE or PRRTE). OMPI_COMM_WORLD_NODE_RANK is not a node index."""

    name = "openmpi"
    description = "Open MPI mpirun"
    own_daemons = True
    run_id_variable = "OMPI_MCA_ess_base_jobid"  # the job id every rank of one mpirun shares (ORTE)
    markers = ("OMPI_COMM_WORLD_RANK",)
    variables = {"rank": "OMPI_COMM_WORLD_RANK", "world_size": "OMPI_COMM_WORLD_SIZE",
                 "local_rank": "OMPI_COMM_WORLD_LOCAL_RANK", "local_world_size": "OMPI_COMM_WORLD_LOCAL_SIZE"}


class Mvapich2Launcher(_VariableLauncher):
    """MVAPICH2 ``mpirun_rsh``/``mpiexec``."""

    name = "mvapich2"
    description = "MVAPICH2 mpirun_rsh/mpiexec"
    own_daemons = True
    markers = ("MV2_COMM_WORLD_RANK",)
    variables = {"rank": "MV2_COMM_WORLD_RANK", "world_size": "MV2_COMM_WORLD_SIZE",
                 "local_rank": "MV2_COMM_WORLD_LOCAL_RANK", "local_world_size": "MV2_COMM_WORLD_LOCAL_SIZE"}


class FluxLauncher(_VariableLauncher):
    """A task of a Flux job (``flux run``/``flux submit``). The job shell sets FLUX_TASK_RANK,
    FLUX_TASK_LOCAL_ID (flux-core src/shell/task.c) and FLUX_JOB_SIZE, the number of tasks in the job, with
    FLUX_JOB_NNODES (src/shell/shell.c; doc/man7/flux-environment.rst). No local task count and no node index
    are exported. Its PMI plugin also sets PMI_RANK and PMI_SIZE (src/shell/pmi/pmi.c): those describe the
    same task and are cross-checked; a PMI_SIZE that differs means an mpiexec was started inside this task."""

    name = "flux"
    description = "Flux job shell"
    markers = ("FLUX_TASK_RANK",)
    variables = {"rank": "FLUX_TASK_RANK", "world_size": "FLUX_JOB_SIZE", "local_rank": "FLUX_TASK_LOCAL_ID"}

    def read(self, env: Mapping[str, str]) -> Reading:
        reading = super().read(env)
        pmi_size, size = read_int(env, "PMI_SIZE"), reading.values.get("world_size")
        if pmi_size is not None and size is not None and pmi_size != size and "MPI_LOCALRANKID" in env:
            raise LaunchEnvironmentError(
                f"This process has Flux's FLUX_JOB_SIZE={size} and Hydra's PMI_SIZE={pmi_size} "
                f"(MPI_LOCALRANKID={env['MPI_LOCALRANKID']}): an mpiexec runs inside a Flux task, and the Flux "
                f"variables describe that task, not this rank. Set {FORCE_VARIABLE}=mpich to read mpiexec's, "
                f"or let Flux start the ranks itself (flux run -n {pmi_size} ...).",
                variables={"FLUX_JOB_SIZE": size, "PMI_SIZE": pmi_size})
        return reading


class PalsLauncher(_VariableLauncher):
    """HPE Cray PALS ``mpiexec`` (PBS Pro on HPE Cray EX, e.g. Polaris, Aurora, Derecho), and anything that sets
    the same variables: SLURM's ``--mpi=cray_shasta`` plugin (src/plugins/mpi/cray_shasta/mpi_cray_shasta.c,
    ``mpi_p_slurmstepd_task``: PALS_RANKID, PALS_LOCAL_RANKID, PALS_NODEID, PMI_RANK, PMI_SIZE, PMI_LOCAL_RANK,
    PMI_LOCAL_SIZE, one value each per task) and flux-coral2's cray_pals shell plugin. Cray PMI without PALS
    sets only the PMI_* ones, which are read the same way."""

    name = "pals"
    description = "HPE Cray PALS mpiexec"
    variables = {"rank": "PALS_RANKID", "world_size": "PMI_SIZE", "local_rank": "PALS_LOCAL_RANKID",
                 "local_world_size": "PMI_LOCAL_SIZE", "node_rank": "PALS_NODEID"}

    def present(self, env: Mapping[str, str]) -> bool:
        return "PALS_RANKID" in env or ("PMI_RANK" in env and "PMI_LOCAL_RANK" in env)

    def read(self, env: Mapping[str, str]) -> Reading:
        reading = super().read(env)
        # the PMI_* twins of the PALS variables: a missing PALS one is filled, a different one is a contradiction
        for name, var in (("rank", "PMI_RANK"), ("local_rank", "PMI_LOCAL_RANK")):
            value = read_int(env, var)
            if name not in reading.values:
                reading.put(name, value, var)
            elif value is not None and value != reading.values[name]:
                raise _disagreement(name, (reading.sources[name], reading.values[name]), (var, value), self, self)
        return reading


class MptLauncher(_VariableLauncher):
    """HPE (SGI) MPT ``mpirun``/``mpiexec_mpt``: it exports MPT_LRANK, the rank's index on its host (the variable
    LAMMPS' and SPARTA's GPU packages read for HPE MPI), and no global rank or size. Those must come from
    another launcher's variables (srun's, under SLURM) or from bind(rank=, world_size=, local_rank=)."""

    name = "mpt"
    description = "HPE MPT mpirun"
    markers = ("MPT_LRANK",)
    variables = {"local_rank": "MPT_LRANK"}
    missing_hint = (" HPE MPT exports only MPT_LRANK: take the rank and size from MPI itself, e.g. "
                    "gpuguard.bind(rank=comm.Get_rank(), world_size=comm.Get_size(), "
                    "local_rank=int(os.environ['MPT_LRANK'])) with mpi4py's comm = MPI.COMM_WORLD.")


class MpichLauncher(_VariableLauncher):
    """MPICH's Hydra ``mpiexec`` and Intel MPI's ``mpirun`` (also Hydra): PMI_RANK with Hydra's own
    MPI_LOCALRANKID (src/pm/hydra/proxy/pmip_cb.c). ``srun --mpi=pmi2`` sets PMI_RANK without it (PmiLauncher)."""

    name = "mpich"
    description = "MPICH/Intel MPI (Hydra) mpiexec"
    own_daemons = True
    markers = ("PMI_RANK", "MPI_LOCALRANKID")
    variables = {"rank": "PMI_RANK", "world_size": "PMI_SIZE",
                 "local_rank": "MPI_LOCALRANKID", "local_world_size": "MPI_LOCALNRANKS"}


class PmixLauncher(_VariableLauncher):
    """A PMIx server (``prun``/``prterun``, ``srun --mpi=pmix``). Only the rank is exported; the size and
    local rank are available through the PMIx API alone, so they must come from another variable."""

    name = "pmix"
    description = "PMIx launcher"
    markers = ("PMIX_RANK",)
    variables = {"rank": "PMIX_RANK"}


class SlurmLauncher(_VariableLauncher):
    """A task of a SLURM job *step* (``srun``). The batch script itself (no SLURM_STEP_ID) is one process."""

    name = "slurm"
    description = "SLURM srun"
    variables = {"rank": "SLURM_PROCID", "world_size": "SLURM_STEP_NUM_TASKS", "local_rank": "SLURM_LOCALID",
                 "local_world_size": "SLURM_STEP_TASKS_PER_NODE", "node_rank": "SLURM_NODEID"}

    def present(self, env: Mapping[str, str]) -> bool:
        return "SLURM_PROCID" in env and ("SLURM_STEP_ID" in env or "SLURM_STEPID" in env)

    def read(self, env: Mapping[str, str]) -> Reading:
        reading = Reading(self)
        reading.put("rank", read_int(env, "SLURM_PROCID"), "SLURM_PROCID")
        for var in ("SLURM_STEP_NUM_TASKS", "SLURM_NTASKS", "SLURM_NPROCS"):
            if var in env:
                reading.put("world_size", read_int(env, var), var)
                break
        reading.put("local_rank", read_int(env, "SLURM_LOCALID"), "SLURM_LOCALID")
        node = read_int(env, "SLURM_NODEID")
        reading.put("node_rank", node, "SLURM_NODEID")
        for var in ("SLURM_STEP_TASKS_PER_NODE", "SLURM_TASKS_PER_NODE"):
            if var in env and node is not None:
                try:
                    per_node = parse_tasks_per_node(env[var])
                except ValueError:
                    raise LaunchEnvironmentError(
                        f"{var}={env[var]!r} is not a SLURM task list such as '4(x2),3'.",
                        variable=var, value=env[var]) from None
                if node < len(per_node):
                    reading.put("local_world_size", per_node[node], f"{var}[SLURM_NODEID]")
                break
        return reading


class PmiLauncher(_VariableLauncher):
    """PMI_RANK/PMI_SIZE from a process manager that is not Hydra: ``srun --mpi=pmi2`` (then SLURM, tried
    first, names the launcher and this only cross-checks it), or a PMI launcher gpuguard does not know."""

    name = "pmi"
    description = "a PMI process manager (PMI_RANK, PMI_SIZE)"
    markers = ("PMI_RANK",)
    variables = {"rank": "PMI_RANK", "world_size": "PMI_SIZE"}


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


class LightningLauncher(_VariableLauncher):
    """PyTorch Lightning's own launcher (Trainer/Fabric with ``strategy="ddp"`` started as ``python train.py``):
    it re-runs the script for local ranks 1.. with MASTER_ADDR, MASTER_PORT, NODE_RANK, LOCAL_RANK and
    WORLD_SIZE (= devices x num_nodes) and no RANK (lightning/fabric/strategies/launchers/subprocess_script.py,
    ``_call_children_scripts``); Lightning computes the global rank itself, in the Trainer. Without RANK and
    the number of devices per node the rank cannot be read, so this is an error that says what to pass."""

    name = "lightning"
    description = "Lightning's subprocess launcher"
    markers = ("LOCAL_RANK", "NODE_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")
    variables = {"world_size": "WORLD_SIZE", "local_rank": "LOCAL_RANK", "node_rank": "NODE_RANK"}

    def present(self, env: Mapping[str, str]) -> bool:
        return super().present(env) and "RANK" not in env and "LOCAL_WORLD_SIZE" not in env

    def read(self, env: Mapping[str, str]) -> Reading:
        reading = super().read(env)
        raise LaunchEnvironmentError(
            f"This process has LOCAL_RANK={env['LOCAL_RANK']}, NODE_RANK={env['NODE_RANK']} and "
            f"WORLD_SIZE={env['WORLD_SIZE']} but no RANK: it was started by Lightning's own launcher "
            f"(strategy='ddp' run as `python train.py`), which never exports the global rank, so gpuguard "
            f"cannot know it. Call gpuguard.bind(rank=trainer.global_rank, world_size=trainer.world_size, "
            f"local_rank=trainer.local_rank) once Lightning has set up (e.g. in setup() of your "
            f"LightningModule; fabric.global_rank etc. with Fabric), or start the script with torchrun "
            f"(torchrun --nproc_per_node=<devices> train.py), whose variables Lightning and gpuguard both read.",
            variables={n: reading.values[n] for n in reading.values}, launcher=self.name)


class EnvLauncher(_VariableLauncher):
    """``RANK``/``LOCAL_RANK``/``WORLD_SIZE`` set by something not recognised above (a script, Ray Train's
    workers outside Ray detection, a custom spawner). Also the generic source every process manager is
    cross-checked against."""

    name = "env"
    description = "environment variables (RANK, LOCAL_RANK, WORLD_SIZE)"
    variables = {"rank": "RANK", "world_size": "WORLD_SIZE", "local_rank": "LOCAL_RANK",
                 "local_world_size": "LOCAL_WORLD_SIZE", "node_rank": "NODE_RANK"}

    def present(self, env: Mapping[str, str]) -> bool:
        return any(v in env for v in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE"))

    def read(self, env: Mapping[str, str]) -> Reading:
        reading = super().read(env)
        if reading.values.get("world_size") == 1 and "local_rank" not in reading.values:
            reading.put("local_rank", 0, "(implied: WORLD_SIZE=1)")  # leftover RANK=0 WORLD_SIZE=1 in a shell
        return reading


class SingleProcessLauncher(Launcher):
    """No launcher: one process, rank 0 of 1 -- unless this process is a child of Python's multiprocessing
    (``torch.multiprocessing.spawn`` puts nothing in the environment), which ``extra["spawned_by"]`` records
    for ``check_spawned_child`` to refuse once the GPU count is known."""

    name = "single"
    description = "single process (no launcher)"

    def present(self, env: Mapping[str, str]) -> bool:
        return True

    def detect(self, env: Mapping[str, str]) -> Optional[LaunchContext]:
        context = super().detect(env)
        spawned = spawned_by()
        if context is None or spawned is None:
            return context
        return LaunchContext(**{**context.as_dict(), "extra": {**context.extra, **spawned}})

    def read(self, env: Mapping[str, str]) -> Reading:
        reading = Reading(self)
        why = "(no launcher variables: single process)"
        for name in FIELDS:
            reading.put(name, 1 if name.endswith("world_size") else 0, why)
        return reading


#: The order detection tries, innermost launcher first (see the module docstring for why).
LAUNCHERS: tuple[Launcher, ...] = (
    TorchrunLauncher(),
    DeepSpeedLauncher(),
    HorovodLauncher(),
    RayActorLauncher(),
    JsrunLauncher(),
    OpenMpiLauncher(),
    Mvapich2Launcher(),
    FluxLauncher(),      # before MPICH: Flux's PMI plugin sets PMI_RANK too
    PalsLauncher(),      # before MPICH: PALS and SLURM's cray_shasta set PMI_RANK too
    MptLauncher(),
    MpichLauncher(),
    PmixLauncher(),
    SlurmLauncher(),
    PmiLauncher(),
    KubeflowLauncher(),
    LightningLauncher(),  # before the generic variables: LOCAL_RANK, NODE_RANK, WORLD_SIZE without RANK
    EnvLauncher(),
    SingleProcessLauncher(),
)


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
             env: Mapping[str, str]) -> LaunchEnvironmentError:
    expected = []
    for name in missing:
        candidates = [primary.expected(name)] + [r.launcher.expected(name) for r in readings[1:]]
        names = [c for c in dict.fromkeys(candidates) if c]
        if not names:
            names = [EnvLauncher.variables[name]]
        expected.append(" or ".join(names))
    known = ", ".join(f"{readings[0].sources[n]}={readings[0].values[n]}" for n in readings[0].values)
    return LaunchEnvironmentError(
        f"This process looks started by {primary.description} ({known or 'its marker variables are set'}), "
        f"but {', '.join(expected)} {'is' if len(expected) == 1 else 'are'} not set, so its "
        f"{' and '.join(n.replace('_', ' ') for n in missing)} cannot be known. Launch it with a launcher "
        f"that exports {'it' if len(expected) == 1 else 'them'}, or export "
        f"{', '.join(EnvLauncher.variables[n] for n in missing)} for each process." + primary.missing_hint,
        variables=expected, launcher=primary.name)


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


# ---- processes no launcher describes: multiprocessing children and explicit arguments ----------------------

_TORCH_SPAWN_FILE = os.path.join("torch", "multiprocessing", "spawn.py")


def spawned_by() -> Optional[dict[str, Any]]:
    """Evidence that this process is one of several started by Python's multiprocessing: for a child of
    ``torch.multiprocessing.spawn``, its process index (the ``i`` that torch's ``_wrap(fn, i, args, ...)``
    passes to the user's function, read from that frame); for any other multiprocessing child, its name.
    None in a process multiprocessing did not start."""
    import multiprocessing

    parent = multiprocessing.parent_process()
    if parent is None:
        return None
    frame = sys._getframe(1)
    while frame is not None:
        code = frame.f_code
        if code.co_name == "_wrap" and code.co_filename.endswith(_TORCH_SPAWN_FILE):
            index = frame.f_locals.get("i")
            if isinstance(index, int):
                return {"spawned_by": "torch.multiprocessing.spawn", "spawn_index": index,
                        "spawn_parent_pid": parent.pid}
        frame = frame.f_back  # type: ignore[assignment]
    return {"spawned_by": f"Python multiprocessing ({multiprocessing.current_process().name})",
            "spawn_index": None, "spawn_parent_pid": parent.pid}


def check_spawned_child(context: LaunchContext, visible_devices: int) -> None:
    """Refuses to call a multiprocessing child "rank 0 of 1" where that is evidently wrong: a
    ``torch.multiprocessing.spawn`` process other than the first, or any multiprocessing child that sees
    several GPUs (each of its siblings would take cuda:0 as well)."""
    spawned = context.extra.get("spawned_by")
    if context.launcher != "single" or not spawned:
        return
    index = context.extra.get("spawn_index")
    if not (isinstance(index, int) and index > 0) and visible_devices <= 1:
        return
    who = f"process {index} of {spawned}" if isinstance(index, int) else f"a child of {spawned}"
    seen = f"it sees {visible_devices} GPUs" if visible_devices > 1 else "it is not the first process"
    raise LaunchEnvironmentError(
        f"This process is {who} (parent pid {context.extra.get('spawn_parent_pid')}) and no launcher variables "
        f"give its rank, so gpuguard would have to call it rank 0 of 1 on cuda:0 -- as it would every sibling -- "
        f"while {seen}. {spawned.split(' (')[0]} puts nothing in the environment: pass the rank yourself, e.g. "
        f"gpuguard.bind(rank=i, world_size=nprocs, local_rank=i, store=store) with the index i your function "
        f"receives and a store every process can reach (torch.distributed.TCPStore or FileStore), or "
        f"gpuguard.init_process_group('nccl', rank=i, world_size=nprocs, local_rank=i, "
        f"init_method='tcp://127.0.0.1:29500'). On several nodes rank = node_rank * nprocs + i.",
        launcher=spawned, spawn_index=index, visible_devices=visible_devices)


def explicit_context(rank: Any, world_size: Any, local_rank: Any,
                     env: Optional[Mapping[str, str]] = None) -> LaunchContext:
    """The launch context given as ``bind(rank=, world_size=, local_rank=)``, for processes no launcher
    describes (torch.multiprocessing.spawn, Lightning's launcher, MPI ranks read through mpi4py). All three
    are required; the environment is not consulted except for GPUGUARD_GROUP."""
    env = os.environ if env is None else env
    given = {"rank": rank, "world_size": world_size, "local_rank": local_rank}
    missing = [f"{n}=" for n, v in given.items() if v is None]
    if missing:
        have = ", ".join(f"{n}={v!r}" for n, v in given.items() if v is not None)
        raise ValueError(
            f"bind({have}) also needs {' and '.join(missing)}: with explicit ranks gpuguard reads nothing from "
            f"the environment, and the local rank picks the GPU. Under torch.multiprocessing.spawn use "
            f"rank=i, world_size=nprocs, local_rank=i (on one node).")
    for n, v in given.items():
        if isinstance(v, bool) or not isinstance(v, int) or not 0 <= v < _MAX_INT:
            raise ValueError(f"bind({n}={v!r}): give a non-negative integer")
    sources = {n: f"bind({n}=)" for n in given}
    _check_ranges(given, sources)
    return LaunchContext(launcher="explicit", description="bind(rank=, world_size=, local_rank=)", rank=rank,
                         world_size=world_size, local_rank=local_rank, local_world_size=None, node_rank=None,
                         sources=sources, group=read_group(env))
