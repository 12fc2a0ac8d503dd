"""Launchers gpuguard did not know before (Flux, HPE Cray PALS, HPE MPT, Horovod, Lightning's own launcher):
each from the environment its own source sets, with the nestings seen on real systems. Before these classes,
every case here was silently rank 0 of 1 or an error naming the wrong launcher. No driver; the node-rank test
alone runs the real mpiexec.hydra and Open MPI mpiexec."""

from __future__ import annotations

import pytest

from gg_testing.paths import ROOT
from gpuguard import LaunchEnvironmentError
from gpuguard.binding.launchers import LAUNCHERS, detect

pytestmark = pytest.mark.version_independent  # CI runs this file on the oldest corner only (pyproject's markers)

# flux run -N2 -n8 (4 per node): task 6, third on the second node; its PMI plugin adds PMI_RANK/PMI_SIZE/PMI_FD
FLUX_TASK6 = {
    "FLUX_JOB_ID": "f2Vsn4F3Xkq", "FLUX_URI": "local:///run/flux/local", "FLUX_KVS_NAMESPACE": "job-1234",
    "FLUX_JOB_SIZE": "8", "FLUX_JOB_NNODES": "2", "FLUX_TASK_RANK": "6", "FLUX_TASK_LOCAL_ID": "2",
    "FLUX_JOB_TMPDIR": "/tmp/flux-1234", "PMI_RANK": "6", "PMI_SIZE": "8", "PMI_FD": "11",
}

# PBS + PALS mpiexec -n 8 --ppn 4 on an HPE Cray EX node: rank 5 is local rank 1 on node 1
PALS_RANK5 = {
    "PBS_JOBID": "123.polaris-pbs-01", "PALS_APID": "0b3c-11ee", "PALS_RANKID": "5", "PALS_LOCAL_RANKID": "1",
    "PALS_NODEID": "1", "PALS_DEPTH": "8", "PALS_SPOOL_DIR": "/var/run/palsd/0b3c",
    "PMI_RANK": "5", "PMI_SIZE": "8", "PMI_LOCAL_RANK": "1", "PMI_LOCAL_SIZE": "4", "PMI_UNIVERSE_SIZE": "8",
    "PMI_JOBID": "123", "PMI_SHARED_SECRET": "1234567890", "PMI_CONTROL_PORT": "11001",
}

# horovodrun -np 8 -H a:4,b:4 (Gloo): worker 6 is local 2 of 4 on host b
HOROVOD_RANK6 = {
    "HOROVOD_HOSTNAME": "b", "HOROVOD_RANK": "6", "HOROVOD_SIZE": "8", "HOROVOD_LOCAL_RANK": "2",
    "HOROVOD_LOCAL_SIZE": "4", "HOROVOD_CROSS_RANK": "1", "HOROVOD_CROSS_SIZE": "2",
    "HOROVOD_GLOO_RENDEZVOUS_ADDR": "10.0.0.1", "HOROVOD_GLOO_RENDEZVOUS_PORT": "40123",
    "HOROVOD_CONTROLLER": "gloo", "HOROVOD_CPU_OPERATIONS": "gloo", "PYTHONUNBUFFERED": "1",
}

# Lightning Trainer(devices=4, num_nodes=2, strategy="ddp") run as `python train.py`: local rank 3 on node 1
LIGHTNING_CHILD = {"MASTER_ADDR": "node0", "MASTER_PORT": "41234", "NODE_RANK": "1", "LOCAL_RANK": "3",
                   "WORLD_SIZE": "8"}


def fields(ctx):
    return (ctx.launcher, ctx.rank, ctx.world_size, ctx.local_rank, ctx.local_world_size, ctx.node_rank)


def test_order_places_the_new_launchers_by_nesting():
    names = [l.name for l in LAUNCHERS]
    # Horovod spawns its workers (an agent, before Ray and the process managers); Flux and PALS set PMI_RANK
    # too, so they come before MPICH; Lightning's variables are a subset of the generic ones
    assert names.index("horovod") < names.index("ray") < names.index("jsrun")
    assert names.index("flux") < names.index("mpich") and names.index("pals") < names.index("mpich")
    assert names.index("mpt") < names.index("mpich") and names.index("lightning") < names.index("env")


def test_flux_task():
    # before: Flux's PMI_RANK made it "MPICH/Intel MPI (Hydra) mpiexec" with MPI_LOCALRANKID missing: an error
    ctx = detect(FLUX_TASK6)
    assert fields(ctx) == ("flux", 6, 8, 2, None, None)
    assert dict(ctx.sources) == {"rank": "FLUX_TASK_RANK", "world_size": "FLUX_JOB_SIZE",
                                 "local_rank": "FLUX_TASK_LOCAL_ID"}


def test_flux_without_its_pmi_plugin():
    env = {k: v for k, v in FLUX_TASK6.items() if not k.startswith("PMI_")}
    # before: no variable gpuguard knew, so rank 0 of 1 on cuda:0 for all eight tasks
    assert fields(detect(env)) == ("flux", 6, 8, 2, None, None)


def test_flux_task_rank_and_pmi_rank_disagreeing_is_named():
    with pytest.raises(LaunchEnvironmentError, match="FLUX_TASK_RANK=6 but PMI_RANK=2"):
        detect({**FLUX_TASK6, "PMI_RANK": "2"})


def test_hydra_mpiexec_inside_a_flux_task_is_named():
    # flux run -n1 mpiexec.hydra -n 4 python train.py: the Flux variables are the one task's
    env = {**FLUX_TASK6, "FLUX_JOB_SIZE": "1", "FLUX_TASK_RANK": "0", "FLUX_TASK_LOCAL_ID": "0",
           "PMI_RANK": "3", "PMI_SIZE": "4", "MPI_LOCALRANKID": "3", "MPI_LOCALNRANKS": "4"}
    with pytest.raises(LaunchEnvironmentError) as err:
        detect(env)
    assert str(err.value).startswith(
        "This process has Flux's FLUX_JOB_SIZE=1 and Hydra's PMI_SIZE=4 (MPI_LOCALRANKID=3): an mpiexec runs "
        "inside a Flux task")
    assert "Set GPUGUARD_LAUNCHER=mpich to read mpiexec's" in str(err.value)
    assert fields(detect({**env, "GPUGUARD_LAUNCHER": "mpich"})) == ("mpich", 3, 4, 3, 4, None)


def test_pals_mpiexec():
    # before: PMI_RANK made it MPICH, which found no MPI_LOCALRANKID and raised "MPI_LOCALRANKID is not set"
    ctx = detect(PALS_RANK5)
    assert fields(ctx) == ("pals", 5, 8, 1, 4, 1)
    assert ctx.source("node_rank") == "PALS_NODEID" and ctx.source("local_world_size") == "PMI_LOCAL_SIZE"


def test_cray_pmi_without_pals_variables():
    env = {k: v for k, v in PALS_RANK5.items() if not k.startswith("PALS_")}
    ctx = detect(env)
    assert fields(ctx) == ("pals", 5, 8, 1, 4, None)
    assert ctx.local_rank_source == "PMI_LOCAL_RANK"


def test_pals_and_pmi_local_rank_disagreeing_is_named():
    with pytest.raises(LaunchEnvironmentError, match="local rank: PALS_LOCAL_RANKID=1 but PMI_LOCAL_RANK=0"):
        detect({**PALS_RANK5, "PMI_LOCAL_RANK": "0"})


def test_srun_cray_shasta_plugin_agrees_with_slurm():
    # srun -N2 --ntasks-per-node=4 --mpi=cray_shasta: the plugin sets the PALS/PMI values from the same task ids
    slurm = {"SLURM_JOB_ID": "77", "SLURM_STEP_ID": "0", "SLURM_PROCID": "5", "SLURM_LOCALID": "1",
             "SLURM_NODEID": "1", "SLURM_STEP_NUM_TASKS": "8", "SLURM_STEP_TASKS_PER_NODE": "4(x2)"}
    assert fields(detect({**slurm, **PALS_RANK5})) == ("pals", 5, 8, 1, 4, 1)
    with pytest.raises(LaunchEnvironmentError, match="PALS_LOCAL_RANKID=1 but SLURM_LOCALID=3"):
        detect({**slurm, **PALS_RANK5, "SLURM_LOCALID": "3"})


def test_hpe_mpt_alone_says_what_to_pass():
    # before: no variable gpuguard knew: every rank silently rank 0 of 1 on cuda:0
    with pytest.raises(LaunchEnvironmentError) as err:
        detect({"MPT_LRANK": "3", "MPI_DSM_VERBOSE": "1"})
    message = str(err.value)
    assert message.startswith("This process looks started by HPE MPT mpirun (MPT_LRANK=3), but RANK, WORLD_SIZE are "
                              "not set, so its rank and world size cannot be known")
    assert "gpuguard.bind(rank=comm.Get_rank(), world_size=comm.Get_size(), " \
           "local_rank=int(os.environ['MPT_LRANK']))" in message


def test_hpe_mpt_under_srun_takes_rank_and_size_from_slurm():
    slurm = {"SLURM_JOB_ID": "77", "SLURM_STEP_ID": "0", "SLURM_PROCID": "6", "SLURM_LOCALID": "2",
             "SLURM_NODEID": "1", "SLURM_STEP_NUM_TASKS": "8", "SLURM_STEP_TASKS_PER_NODE": "4(x2)"}
    ctx = detect({**slurm, "MPT_LRANK": "2"})
    assert fields(ctx) == ("mpt", 6, 8, 2, 4, 1)
    assert ctx.source("rank") == "SLURM_PROCID" and ctx.local_rank_source == "MPT_LRANK"


def test_horovod_gloo_worker():
    # before: no variable gpuguard knew: all eight workers rank 0 of 1 on cuda:0, silently
    ctx = detect(HOROVOD_RANK6)
    assert fields(ctx) == ("horovod", 6, 8, 2, 4, None)
    assert ctx.local_rank_source == "HOROVOD_LOCAL_RANK"


def test_horovodrun_inside_srun_ignores_the_slurm_variables_of_horovodrun():
    agent = {"SLURM_JOB_ID": "77", "SLURM_STEP_ID": "0", "SLURM_PROCID": "1", "SLURM_LOCALID": "0",
             "SLURM_NODEID": "1", "SLURM_STEP_NUM_TASKS": "2", "SLURM_STEP_TASKS_PER_NODE": "1(x2)"}
    assert fields(detect({**agent, **HOROVOD_RANK6})) == ("horovod", 6, 8, 2, 4, None)


def test_horovod_malformed_or_incomplete_is_named():
    with pytest.raises(LaunchEnvironmentError, match="HOROVOD_LOCAL_RANK='two' is not a non-negative integer"):
        detect({**HOROVOD_RANK6, "HOROVOD_LOCAL_RANK": "two"})
    partial = {k: v for k, v in HOROVOD_RANK6.items() if k != "HOROVOD_LOCAL_RANK"}
    with pytest.raises(LaunchEnvironmentError, match="started by horovodrun \\(Gloo\\) .* but HOROVOD_LOCAL_RANK "
                                                     "is not set"):
        detect(partial)


def test_lightning_launcher_says_it_is_lightning_and_how_to_fix():
    # before: "started by environment variables ... export RANK for each process", which Lightning never does
    with pytest.raises(LaunchEnvironmentError) as err:
        detect(LIGHTNING_CHILD)
    message = str(err.value)
    assert message.startswith("This process has LOCAL_RANK=3, NODE_RANK=1 and WORLD_SIZE=8 but no RANK: it was "
                              "started by Lightning's own launcher")
    assert "gpuguard.bind(rank=trainer.global_rank, world_size=trainer.world_size, " \
           "local_rank=trainer.local_rank)" in message
    assert "torchrun --nproc_per_node=<devices> train.py" in message


def test_lightning_under_torchrun_or_with_rank_is_not_lightnings_launcher():
    torchrun = {**LIGHTNING_CHILD, "TORCHELASTIC_RUN_ID": "x", "RANK": "7", "LOCAL_WORLD_SIZE": "4",
                "GROUP_RANK": "1"}
    assert fields(detect(torchrun)) == ("torchrun", 7, 8, 3, 4, 1)
    assert fields(detect({**LIGHTNING_CHILD, "RANK": "7"})) == ("env", 7, 8, 3, None, 1)


def test_forcing_a_new_launcher_by_name():
    assert fields(detect({**FLUX_TASK6, "SLURM_PROCID": "0", "SLURM_STEP_ID": "0", "SLURM_STEP_NUM_TASKS": "8",
                          "SLURM_LOCALID": "0", "GPUGUARD_LAUNCHER": "flux"})) == ("flux", 6, 8, 2, None, None)
    with pytest.raises(LaunchEnvironmentError, match="not started by HPE Cray PALS mpiexec."):
        detect({"GPUGUARD_LAUNCHER": "pals"})


DETECT = ("import json; from gpuguard.binding.launchers import detect; c = detect(); "
          "print(json.dumps([c.launcher, c.rank, c.world_size, c.local_rank, c.local_world_size, c.node_rank]))")


@pytest.mark.parametrize("launcher", ["mpiexec.hydra", "mpiexec.openmpi"])
def test_real_mpi_launchers_export_no_node_rank(launcher):
    # read from the launchers themselves: Hydra sets PMI_RANK/PMI_SIZE/MPI_LOCALRANKID/MPI_LOCALNRANKS and no node
    # index; Open MPI's OMPI_COMM_WORLD_NODE_RANK is "the relative rank of this process on this node looking
    # across all jobs" (docs.open-mpi.org, tuning-apps/environment-var), not a node number
    import json
    import os
    import re
    import shutil
    import subprocess
    import sys

    if shutil.which(launcher) is None:
        pytest.skip(f"{launcher} is not installed (Debian packages mpich, openmpi-bin)")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "OMPI_", "PMI", "PMIX_"))}
    env.update(OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
               PYTHONPATH=os.pathsep.join([str(ROOT / "python"), *sys.path]))
    args = [launcher, "-n", "2"] + (["--oversubscribe"] if launcher.endswith("openmpi") else [])
    proc = subprocess.run(args + [sys.executable, "-c", DETECT], env=env, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr
    # each rank prints one JSON row; Open MPI's output forwarding may join two ranks' rows without the newline
    # between them ('[...][...]' seen in CI), so rows are read as bracketed spans, not lines
    rows = sorted(json.loads(row) for row in re.findall(r"\[[^\[\]]*\]", proc.stdout))
    name = "mpich" if launcher.endswith("hydra") else "openmpi"
    assert rows == [[name, 0, 2, 0, 2, None], [name, 1, 2, 1, 2, None]]
