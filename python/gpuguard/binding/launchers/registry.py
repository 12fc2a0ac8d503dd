"""Every launcher detection knows, one line each, in the order detection tries them: innermost first.

One small class per launcher behind one interface (``detect(env)``), tried in the fixed order of
``LAUNCHERS``: innermost first. Launchers nest: ``srun torchrun ...`` gives each torchrun worker the SLURM
variables of the torchrun *agent* (``SLURM_LOCALID=0`` for every worker); ``mpirun`` inside an allocation
gives each MPI rank the SLURM variables of the MPI daemon; a Ray cluster started under SLURM gives every actor
the raylet's. So the launchers that spawn the workers themselves (torchrun, the DeepSpeed launcher, horovodrun, Ray) are
tried first, and their word is final: the outer launcher's variables describe their parent.
"""

from __future__ import annotations

from .base import Launcher
from .deepspeed import DeepSpeedLauncher
from .flux import FluxLauncher
from .horovod import HorovodLauncher
from .jsrun import JsrunLauncher
from .kubeflow import KubeflowLauncher
from .lightning import LightningLauncher
from .mpich import MpichLauncher
from .mpt import MptLauncher
from .mvapich2 import Mvapich2Launcher
from .open_mpi import OpenMpiLauncher
from .pals import PalsLauncher
from .plain_variables import EnvLauncher
from .pmi import PmiLauncher
from .pmix import PmixLauncher
from .ray import RayActorLauncher
from .single_process import SingleProcessLauncher
from .slurm import SlurmLauncher
from .torchrun import TorchrunLauncher

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
