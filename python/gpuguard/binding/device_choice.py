"""Which visible GPU is this process's: local rank -> visible device, or Ray's assigned id; refuses to guess.

Rules, in order:
- no visible device: the CPU (bind() warns, or refuses with ``require_gpu=True``);
- a Ray worker: the GPU id Ray assigned, found among the visible devices;
- exactly one visible device: it, whatever the local rank. That is per-process visibility (SLURM
  ``--gpus-per-task``, Ray, a launcher that narrows each process) or a one-GPU host; two ranks sharing it is
  for the cross-rank check to report, not for this step to guess around;
- otherwise the local rank indexes the visible devices. Never ``local_rank % device_count``: it silently
  puts two ranks on one GPU. A local rank beyond the visible devices is a RankMappingError that says how
  many GPUs the host shows, where the local rank came from, and the likely cause.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Sequence

from ..system.devices import Device
from ..errors import LaunchEnvironmentError, RankMappingError
from .launchers import LaunchContext
from .visible_devices import VisibleDevices, rejected_entry


@dataclass(frozen=True)
class Resolution:
    """The chosen device (None: the CPU), the local rank reported for it, and how it was chosen."""

    device: Optional[Device]
    local_rank: int
    local_rank_source: str
    chosen_by: str


def start_fewer_per_node(n: int) -> str:
    """The fix for a node that runs more processes than it shows GPUs (``n``), under each launcher."""
    return (f"Start at most {n} per node (torchrun --nproc_per_node={n}, srun --ntasks-per-node={n}, "
            f"mpirun --npernode {n}), or ask for nodes with more GPUs")


def _gpus(n: int) -> str:
    return f"{n} GPU" + ("" if n == 1 else "s")


def check_visibility(visibility: VisibleDevices, devices: Sequence[Device], driver_loaded: bool) -> None:
    """A malformed, repeated or rejected CUDA_VISIBLE_DEVICES entry is an error naming it: the driver
    would silently show fewer GPUs than the value lists."""
    problem = visibility.problem
    if problem is None and visibility.set and driver_loaded:
        problem = rejected_entry(visibility.raw, [d.uuid for d in devices])
    if problem is None:
        return
    if any(d.uuid.startswith("MIG-") for d in devices):  # not a bad entry: CUDA shows one MIG device, by design
        fix = ("Give each process a single MIG device: CUDA_VISIBLE_DEVICES=MIG-<uuid>, a different one per rank "
               "(nvidia-smi -L lists them).")
        raise LaunchEnvironmentError(f"{visibility.describe()}: {problem.reason}. {fix}", fix=fix,
                                     variable="CUDA_VISIBLE_DEVICES", value=visibility.raw, problem=problem.kind,
                                     position=problem.position, entry=problem.entry)
    honoured = ",".join(e.text for e in visibility.entries[:problem.position])
    shown = (f"the driver shows only the {_gpus(problem.position)} before it ({honoured})"
             if problem.position else "the driver shows no GPU at all")
    fix = ("List each GPU once, by index or UUID, separated by single commas (e.g. CUDA_VISIBLE_DEVICES=0,1,2,3); "
           "`gpuguard devices` shows what is there.")
    raise LaunchEnvironmentError(
        f"{visibility.describe()}: {problem.reason}. The driver stops reading CUDA_VISIBLE_DEVICES at the "
        f"first bad entry without a word, so {shown}. {fix}", fix=fix,
        variable="CUDA_VISIBLE_DEVICES", value=visibility.raw, problem=problem.kind,
        position=problem.position, entry=problem.entry)


def resolve_device(context: LaunchContext, devices: Sequence[Device], visibility: VisibleDevices, *,
                   host: str) -> Resolution:
    """This process's device among ``devices`` (the visible ones, in order); see the module docstring."""
    local_rank = context.local_rank
    source = context.local_rank_source
    n = len(devices)
    if n == 0:
        return Resolution(None, local_rank if local_rank is not None else 0, source, "no visible GPU")
    if context.launcher == "ray":
        index, how = _ray_index(context, devices, visibility, host)
        if local_rank is None:
            return Resolution(devices[index], index, "Ray's GPU id", how)
        return Resolution(devices[index], local_rank, source, how)
    assert local_rank is not None  # every launcher but Ray guarantees it
    if n == 1:
        return Resolution(devices[0], local_rank, source,
                          f"the only GPU this process sees ({visibility.describe()})")
    if local_rank < n:
        return Resolution(devices[local_rank], local_rank, source, f"local rank {local_rank} ({source})")
    raise _rank_mapping_error(context, n, visibility, host)


_REQUEST_A_GPU = ("Request a GPU for the actor: @ray.remote(num_gpus=1) or ActorClass.options(num_gpus=1) "
                  "(gpuguard.ray_placement does this).")
_LEAVE_IT_TO_RAY = ("Leave CUDA_VISIBLE_DEVICES to Ray inside actors, or unset "
                    "RAY_EXPERIMENTAL_NOSET_CUDA_VISIBLE_DEVICES.")


def _ray_index(context: LaunchContext, devices: Sequence[Device], visibility: VisibleDevices,
               host: str) -> tuple[int, str]:
    ids = list(context.extra.get("ray_gpu_ids") or [])
    noset = bool(context.extra.get("ray_noset_cuda_visible_devices"))
    if not ids:
        raise RankMappingError(
            f"Rank {context.rank} is a Ray worker that Ray gave no GPU (num_gpus=0), yet this process on "
            f"{host} sees {_gpus(len(devices))} ({visibility.describe()}), so any choice would be a guess that "
            f"collides with the actors that own them. {_REQUEST_A_GPU}", fix=_REQUEST_A_GPU,
            rank=context.rank, host=host, ray_gpu_ids=ids, visible_device_count=len(devices))
    gpu_id = ids[0]
    if visibility.set:
        texts = [e.text for e in visibility.entries]
        if gpu_id in texts:
            index = texts.index(gpu_id)
            return index, f"Ray GPU id {gpu_id} = entry {index} of {visibility.describe()}"
    elif gpu_id.isdigit() and int(gpu_id) < len(devices):
        return int(gpu_id), f"Ray GPU id {gpu_id} (CUDA_VISIBLE_DEVICES unset, all GPUs visible)"
    how = ("RAY_EXPERIMENTAL_NOSET_CUDA_VISIBLE_DEVICES is set, so Ray left CUDA_VISIBLE_DEVICES alone and "
           "its ids refer to the GPUs the raylet saw" if noset else
           "Ray writes its ids into CUDA_VISIBLE_DEVICES, so something changed the variable after Ray set it")
    raise RankMappingError(
        f"Rank {context.rank} is a Ray worker assigned GPU id {gpu_id} (Ray ids: {', '.join(ids)}), but "
        f"{visibility.describe()} on {host} has no such entry ({_gpus(len(devices))} visible). {how}. "
        f"{_LEAVE_IT_TO_RAY}", fix=_LEAVE_IT_TO_RAY,
        rank=context.rank, host=host, ray_gpu_ids=ids, cuda_visible_devices=visibility.raw,
        visible_device_count=len(devices))


def _rank_mapping_error(context: LaunchContext, n: int, visibility: VisibleDevices,
                        host: str) -> RankMappingError:
    local_rank = context.local_rank
    assert local_rank is not None
    source = context.local_rank_source
    lws = context.local_world_size
    lws_text = f"{lws} processes ({context.source('local_world_size')})" if lws is not None else None
    causes: list[str] = []
    if local_rank == context.rank and (context.world_size > (lws or n) or (context.node_rank or 0) > 0):
        causes.append(
            f"the global rank is used as the local rank: {source}={local_rank} equals the rank across all "
            f"{context.world_size} processes, but on a multi-node job the local rank counts from 0 on each "
            f"node. Take the local rank from the launcher (LOCAL_RANK, SLURM_LOCALID, "
            f"OMPI_COMM_WORLD_LOCAL_RANK) and call torch.cuda.set_device(local_rank), or let gpuguard.bind() "
            f"do it")
    if lws is not None and lws > n:
        causes.append(
            f"more processes per node than GPUs: this node runs {lws_text} but shows {_gpus(n)}. "
            f"{start_fewer_per_node(n)}")
    if visibility.set:
        causes.append(
            f"visibility narrowed per process: {visibility.describe()} leaves this process {_gpus(n)}, while "
            f"local ranks count every process on the node. Either give every process the same full list and "
            f"let the local rank pick, or give each process exactly one GPU (bind() then uses it whatever the "
            f"local rank)")
    if not causes:
        causes.append(
            f"more processes on this node than GPUs: local rank {local_rank} needs at least "
            f"{local_rank + 1} GPUs. Start at most {n} processes per node, or check that {source} is set "
            f"per process")
    likely = causes[0]
    others = "".join(f" Otherwise: {c}." for c in causes[1:])
    where = f"on node {context.node_rank} " if context.node_rank is not None else ""
    return RankMappingError(
        f"Rank {context.rank} of {context.world_size} ({context.description}) cannot be bound to a GPU: its "
        f"local rank is {local_rank} ({source}), but this host {where}({host}) shows {_gpus(n)} to this "
        f"process (cuda:0..cuda:{n - 1}; {visibility.describe()}). Likely cause: {likely}.{others}",
        rank=context.rank, local_rank=local_rank, local_rank_source=source, world_size=context.world_size,
        local_world_size=lws, visible_device_count=n, host=host, cuda_visible_devices=visibility.raw,
        causes=causes)
