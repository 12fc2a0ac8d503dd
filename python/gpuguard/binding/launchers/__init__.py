"""Which launcher started this process, and its rank, world size, local rank and node rank, read strictly.

One module per launcher family, each a Launcher subclass; ``registry.LAUNCHERS`` lists them in the order
``detection.detect`` tries them (innermost first; registry.py says why). ``base`` holds what they share
(LaunchContext, Launcher, the strict reading of a variable), ``no_launcher`` the processes no launcher
describes (``explicit_context``, ``spawned_by``, ``check_spawned_child``).
"""

from .base import FIELDS, FORCE_VARIABLE, GROUP_VARIABLE, LaunchContext, Launcher, Reading, read_group, read_int
from .deepspeed import DeepSpeedLauncher
from .detection import detect, rank_hint, run_id
from .flux import FluxLauncher
from .horovod import HorovodLauncher
from .jsrun import JsrunLauncher
from .kubeflow import KubeflowLauncher
from .lightning import LightningLauncher
from .mpich import MpichLauncher
from .mpt import MptLauncher
from .mvapich2 import Mvapich2Launcher
from .no_launcher import check_spawned_child, explicit_context, spawned_by
from .open_mpi import OpenMpiLauncher
from .pals import PalsLauncher
from .plain_variables import EnvLauncher
from .pmi import PmiLauncher
from .pmix import PmixLauncher
from .ray import RayActorLauncher
from .registry import LAUNCHERS
from .single_process import SingleProcessLauncher
from .slurm import SlurmLauncher, parse_tasks_per_node
from .torchrun import TorchrunLauncher

__all__ = [
    "FIELDS", "FORCE_VARIABLE", "GROUP_VARIABLE", "LAUNCHERS",
    "LaunchContext", "Launcher", "Reading",
    "DeepSpeedLauncher", "EnvLauncher", "FluxLauncher", "HorovodLauncher", "JsrunLauncher", "KubeflowLauncher",
    "LightningLauncher", "MpichLauncher", "MptLauncher", "Mvapich2Launcher", "OpenMpiLauncher", "PalsLauncher",
    "PmiLauncher", "PmixLauncher", "RayActorLauncher", "SingleProcessLauncher", "SlurmLauncher", "TorchrunLauncher",
    "check_spawned_child", "detect", "explicit_context", "parse_tasks_per_node", "rank_hint", "read_group",
    "read_int", "run_id", "spawned_by",
]
