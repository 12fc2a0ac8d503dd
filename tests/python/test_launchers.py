"""Launcher detection: each launcher's environment as it documents it, the nestings seen in practice, and an
error naming the variable for every missing, malformed or contradictory value. Pure: no driver, no subprocess."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from gg_testing.env import SLURM_2x5_RANK7, TORCHRUN
from gpuguard import LaunchEnvironmentError
from gpuguard.binding.launchers import LAUNCHERS, RayActorLauncher, detect, parse_tasks_per_node
from gpuguard.group_name import is_group_name

pytestmark = pytest.mark.version_independent  # CI runs this file on the oldest corner only (pyproject's markers)

OPENMPI = {  # mpirun -np 8 --npernode 4: rank 6
    "OMPI_COMM_WORLD_RANK": "6", "OMPI_COMM_WORLD_SIZE": "8", "OMPI_COMM_WORLD_LOCAL_RANK": "2",
    "OMPI_COMM_WORLD_LOCAL_SIZE": "4", "OMPI_COMM_WORLD_NODE_RANK": "2", "OMPI_UNIVERSE_SIZE": "8",
    "PMIX_RANK": "6", "PMIX_NAMESPACE": "prterun-node0-1234@1",
}


def fields(ctx):
    return (ctx.launcher, ctx.rank, ctx.world_size, ctx.local_rank, ctx.local_world_size, ctx.node_rank)


def test_order_is_innermost_first_and_documented():
    assert [l.name for l in LAUNCHERS] == [
        "torchrun", "deepspeed", "horovod", "ray", "jsrun", "openmpi", "mvapich2", "flux", "pals", "mpt", "mpich",
        "pmix", "slurm", "pmi", "kubeflow", "lightning", "env", "single"]


def test_single_process_without_launcher_variables():
    ctx = detect({"PATH": "/usr/bin", "HOME": "/root"})
    assert fields(ctx) == ("single", 0, 1, 0, 1, 0)
    assert ctx.local_rank_source == "(no launcher variables: single process)"


def test_torchrun():
    ctx = detect(TORCHRUN)
    assert fields(ctx) == ("torchrun", 5, 8, 1, 4, 1)
    assert dict(ctx.sources) == {"rank": "RANK", "world_size": "WORLD_SIZE", "local_rank": "LOCAL_RANK",
                                 "local_world_size": "LOCAL_WORLD_SIZE", "node_rank": "GROUP_RANK"}


def test_torchrun_inside_srun_ignores_the_agents_slurm_variables():
    # srun -N2 --ntasks-per-node=1 torchrun --nproc_per_node=4: every worker inherits its agent's SLURM_LOCALID=0
    agent = {"SLURM_STEP_ID": "0", "SLURM_PROCID": "1", "SLURM_LOCALID": "0", "SLURM_NODEID": "1",
             "SLURM_STEP_NUM_TASKS": "2", "SLURM_STEP_TASKS_PER_NODE": "1(x2)"}
    assert fields(detect({**agent, **TORCHRUN})) == ("torchrun", 5, 8, 1, 4, 1)


def test_slurm_two_nodes_five_gpus_rank_7_is_local_rank_2_on_node_1():
    ctx = detect(SLURM_2x5_RANK7)
    assert fields(ctx) == ("slurm", 7, 10, 2, 5, 1)
    assert ctx.local_rank_source == "SLURM_LOCALID"
    assert ctx.source("world_size") == "SLURM_STEP_NUM_TASKS"
    assert ctx.source("local_world_size") == "SLURM_STEP_TASKS_PER_NODE[SLURM_NODEID]"


def test_slurm_uneven_tasks_per_node():
    env = {**SLURM_2x5_RANK7, "SLURM_STEP_TASKS_PER_NODE": "6,4", "SLURM_PROCID": "8", "SLURM_LOCALID": "2"}
    assert fields(detect(env))[4] == 4
    assert parse_tasks_per_node("2(x3),1") == [2, 2, 2, 1]


def test_slurm_batch_script_without_srun_is_one_process():
    # the batch step has SLURM_PROCID=0 and the allocation's SLURM_NTASKS, but no job step: no srun
    batch = {k: v for k, v in SLURM_2x5_RANK7.items() if not k.startswith("SLURM_STEP")}
    batch.update(SLURM_PROCID="0", SLURM_LOCALID="0", SLURM_NODEID="0")
    assert fields(detect(batch)) == ("single", 0, 1, 0, 1, 0)


def test_slurm_with_local_rank_exported_once_in_the_batch_script_is_named():
    with pytest.raises(LaunchEnvironmentError) as err:
        detect({**SLURM_2x5_RANK7, "LOCAL_RANK": "0"})
    msg = str(err.value)
    assert "this process's local rank: SLURM_LOCALID=2 but LOCAL_RANK=0" in msg
    assert "LOCAL_RANK=$SLURM_LOCALID evaluated before srun" in msg
    assert err.value.variables == {"SLURM_LOCALID": 2, "LOCAL_RANK": 0}


def test_slurm_and_matching_generic_variables_agree():
    env = {**SLURM_2x5_RANK7, "RANK": "7", "LOCAL_RANK": "2", "WORLD_SIZE": "10"}
    assert fields(detect(env)) == ("slurm", 7, 10, 2, 5, 1)


def test_slurm_malformed_task_list_is_named():
    with pytest.raises(LaunchEnvironmentError, match=r"SLURM_STEP_TASKS_PER_NODE='5\(x\)' is not a SLURM task"):
        detect({**SLURM_2x5_RANK7, "SLURM_STEP_TASKS_PER_NODE": "5(x)"})


def test_open_mpi():
    ctx = detect(OPENMPI)
    assert fields(ctx) == ("openmpi", 6, 8, 2, 4, None)  # OMPI_COMM_WORLD_NODE_RANK is not a node index
    assert ctx.local_rank_source == "OMPI_COMM_WORLD_LOCAL_RANK"


def test_open_mpi_and_local_rank_disagreeing_names_both_variables_and_values():
    with pytest.raises(LaunchEnvironmentError) as err:
        detect({**OPENMPI, "LOCAL_RANK": "0"})
    assert "OMPI_COMM_WORLD_LOCAL_RANK=2 but LOCAL_RANK=0 (Open MPI mpirun and environment variables" in str(err.value)
    assert "mpirun -x LOCAL_RANK" in str(err.value)


def test_open_mpi_and_pmix_rank_disagreeing():
    with pytest.raises(LaunchEnvironmentError, match="OMPI_COMM_WORLD_RANK=6 but PMIX_RANK=3"):
        detect({**OPENMPI, "PMIX_RANK": "3"})


def test_mpirun_inside_a_slurm_allocation_ignores_the_daemon_step():
    # Open MPI launches one daemon per node with srun; the ranks inherit that step's SLURM variables
    daemon = {"SLURM_STEP_ID": "0", "SLURM_PROCID": "1", "SLURM_LOCALID": "0", "SLURM_NODEID": "1",
              "SLURM_STEP_NUM_TASKS": "2", "SLURM_STEP_TASKS_PER_NODE": "1(x2)"}
    assert fields(detect({**daemon, **OPENMPI})) == ("openmpi", 6, 8, 2, 4, None)


@pytest.mark.parametrize("extra", [{}, {"I_MPI_ROOT": "/opt/intel/mpi", "I_MPI_HYDRA_TOPOLIB": "hwloc"}],
                         ids=["mpich", "intel-mpi"])
def test_mpich_hydra_and_intel_mpi(extra):
    env = {"PMI_RANK": "3", "PMI_SIZE": "4", "MPI_LOCALRANKID": "1", "MPI_LOCALNRANKS": "2",
           "PMI_FD": "5", **extra}
    ctx = detect(env)
    assert fields(ctx) == ("mpich", 3, 4, 1, 2, None)
    assert ctx.local_rank_source == "MPI_LOCALRANKID"


def test_srun_pmi2_gives_pmi_rank_and_slurm_the_local_rank():
    env = {**SLURM_2x5_RANK7, "PMI_RANK": "7", "PMI_SIZE": "10", "PMI_FD": "4"}
    ctx = detect(env)
    assert fields(ctx) == ("slurm", 7, 10, 2, 5, 1)
    assert ctx.local_rank_source == "SLURM_LOCALID"


def test_mvapich2():
    env = {"MV2_COMM_WORLD_RANK": "9", "MV2_COMM_WORLD_SIZE": "16", "MV2_COMM_WORLD_LOCAL_RANK": "1",
           "MV2_COMM_WORLD_LOCAL_SIZE": "8"}
    assert fields(detect(env)) == ("mvapich2", 9, 16, 1, 8, None)


def test_pmix_direct_launch_by_srun_completes_from_slurm():
    env = {**SLURM_2x5_RANK7, "PMIX_RANK": "7", "PMIX_NAMESPACE": "slurm.pmix.1234.0"}
    ctx = detect(env)
    assert fields(ctx) == ("pmix", 7, 10, 2, 5, 1)
    assert ctx.source("rank") == "PMIX_RANK"
    assert ctx.local_rank_source == "SLURM_LOCALID"


def test_pmix_alone_names_what_is_missing():
    with pytest.raises(LaunchEnvironmentError) as err:
        detect({"PMIX_RANK": "3", "PMIX_NAMESPACE": "prterun-x@1"})
    msg = str(err.value)
    assert "started by PMIx launcher (PMIX_RANK=3)" in msg
    assert "WORLD_SIZE, LOCAL_RANK are not set" in msg
    assert "export WORLD_SIZE, LOCAL_RANK for each process" in msg


def test_lsf_jsrun_with_spectrum_mpi_variables_agreeing():
    env = {"JSM_NAMESPACE_RANK": "10", "JSM_NAMESPACE_SIZE": "12", "JSM_NAMESPACE_LOCAL_RANK": "4",
           "JSM_NAMESPACE_LOCAL_SIZE": "6", "LSB_JOBID": "77", "OMPI_COMM_WORLD_RANK": "10",
           "OMPI_COMM_WORLD_SIZE": "12", "OMPI_COMM_WORLD_LOCAL_RANK": "4", "OMPI_COMM_WORLD_LOCAL_SIZE": "6"}
    ctx = detect(env)
    assert fields(ctx) == ("jsrun", 10, 12, 4, 6, None)
    assert ctx.local_rank_source == "JSM_NAMESPACE_LOCAL_RANK"


def test_deepspeed_launcher():
    # deepspeed --num_nodes 2 --num_gpus 4: launch.py sets these (and CUDA_VISIBLE_DEVICES) per worker
    env = {"RANK": "6", "LOCAL_RANK": "2", "WORLD_SIZE": "8", "LOCAL_SIZE": "4", "CROSS_RANK": "1",
           "CROSS_SIZE": "2", "MASTER_ADDR": "node0", "MASTER_PORT": "29500", "CUDA_VISIBLE_DEVICES": "0,1,2,3"}
    ctx = detect(env)
    assert fields(ctx) == ("deepspeed", 6, 8, 2, 4, 1)
    assert ctx.source("local_world_size") == "LOCAL_SIZE"


def test_kubeflow_pytorchjob_one_process_per_pod():
    env = {"KUBERNETES_SERVICE_HOST": "10.0.0.1", "KUBERNETES_PORT": "tcp://10.0.0.1:443",
           "MASTER_ADDR": "job-master-0", "MASTER_PORT": "23456", "WORLD_SIZE": "3", "RANK": "2",
           "PYTHONUNBUFFERED": "0"}
    ctx = detect(env)
    assert fields(ctx) == ("kubeflow", 2, 3, 0, 1, 2)
    assert ctx.local_rank_source == "(implied: a PyTorchJob pod runs one process)"


def test_kubeflow_pod_running_torchrun_is_torchrun():
    env = {"KUBERNETES_SERVICE_HOST": "10.0.0.1", "PET_NPROC_PER_NODE": "4", "PET_NNODES": "2", **TORCHRUN}
    assert fields(detect(env))[0] == "torchrun"


def test_plain_environment_variables():
    ctx = detect({"RANK": "3", "LOCAL_RANK": "1", "WORLD_SIZE": "4", "LOCAL_WORLD_SIZE": "2"})
    assert fields(ctx) == ("env", 3, 4, 1, 2, None)


def test_plain_environment_of_one_process_needs_no_local_rank():
    ctx = detect({"RANK": "0", "WORLD_SIZE": "1", "MASTER_ADDR": "localhost"})
    assert fields(ctx) == ("env", 0, 1, 0, None, None)
    assert ctx.local_rank_source == "(implied: WORLD_SIZE=1)"


def test_plain_environment_without_local_rank_names_it():
    with pytest.raises(LaunchEnvironmentError) as err:
        detect({"RANK": "3", "WORLD_SIZE": "4"})
    assert "LOCAL_RANK is not set, so its local rank cannot be known" in str(err.value)


@pytest.mark.parametrize("value", ["two", "-1", "1.0", "", "3x", "99999999999"])
def test_non_integer_value_is_named_with_the_variable(value):
    with pytest.raises(LaunchEnvironmentError) as err:
        detect({**TORCHRUN, "LOCAL_RANK": value})
    assert str(err.value).startswith(f"LOCAL_RANK={value!r} is not a non-negative integer.")
    assert err.value.variable == "LOCAL_RANK"


def test_missing_torchrun_variable_is_named():
    env = dict(TORCHRUN)
    del env["LOCAL_RANK"]
    with pytest.raises(LaunchEnvironmentError, match="but LOCAL_RANK is not set"):
        detect(env)


def test_rank_beyond_world_size_is_named():
    with pytest.raises(LaunchEnvironmentError) as err:
        detect({**TORCHRUN, "RANK": "8"})
    assert str(err.value).startswith("RANK=8 is not below WORLD_SIZE=8")
    with pytest.raises(LaunchEnvironmentError, match="SLURM_LOCALID=5 is not below"):
        detect({**SLURM_2x5_RANK7, "SLURM_LOCALID": "5"})


def test_forced_launcher_overrides_detection_and_cross_checks():
    env = {**SLURM_2x5_RANK7, "RANK": "3", "LOCAL_RANK": "3", "WORLD_SIZE": "4", "GPUGUARD_LAUNCHER": "env"}
    assert fields(detect(env)) == ("env", 3, 4, 3, None, None)


def test_forced_launcher_unknown_or_absent():
    with pytest.raises(LaunchEnvironmentError, match="GPUGUARD_LAUNCHER='lsf' names no launcher gpuguard knows; "
                                                     "use one of deepspeed, env, flux, horovod, jsrun"):
        detect({"GPUGUARD_LAUNCHER": "lsf"})
    with pytest.raises(LaunchEnvironmentError, match="not started by Open MPI mpirun: OMPI_COMM_WORLD_RANK not set"):
        detect({"GPUGUARD_LAUNCHER": "openmpi"})


def test_group_from_the_environment_and_a_bad_one_named():
    assert detect({**TORCHRUN, "GPUGUARD_GROUP": "rollout"}).group == "rollout"
    with pytest.raises(LaunchEnvironmentError, match="GPUGUARD_GROUP='a b' is not a usable group name"):
        detect({**TORCHRUN, "GPUGUARD_GROUP": "a b"})


class FakeRayContext:
    """Stands in for ray.get_runtime_context() inside an actor (the real one is exercised in test_bind)."""

    def __init__(self, gpu_ids, share):
        self.worker = SimpleNamespace(mode=1)
        self._ids, self._share = gpu_ids, share

    def get_accelerator_ids(self):
        return {"GPU": self._ids, "TPU": []}

    def get_assigned_resources(self):
        return {"GPU": self._share} if self._share else {}


def test_ray_actor_takes_rank_and_group_from_its_environment_and_gpu_from_ray():
    launcher = RayActorLauncher(FakeRayContext(["3"], 0.5))
    env = {"RANK": "2", "WORLD_SIZE": "4", "GPUGUARD_GROUP": "rollout", "CUDA_VISIBLE_DEVICES": "3"}
    ctx = detect(env, launchers=[launcher])
    assert fields(ctx) == ("ray", 2, 4, None, None, None)
    assert ctx.group == "rollout"
    assert dict(ctx.extra) == {"ray_gpu_ids": ["3"], "ray_gpu_share": 0.5,
                               "ray_noset_cuda_visible_devices": False}


def test_ray_actor_is_innermost_even_under_slurm():
    launcher = RayActorLauncher(FakeRayContext(["1"], 1.0))
    launchers = [l if l.name != "ray" else launcher for l in LAUNCHERS]
    ctx = detect({**SLURM_2x5_RANK7, "RAY_EXPERIMENTAL_NOSET_CUDA_VISIBLE_DEVICES": "1"}, launchers=launchers)
    assert fields(ctx)[:3] == ("ray", 0, 1)
    assert ctx.extra["ray_noset_cuda_visible_devices"] is True


def test_ray_actor_with_world_size_but_no_rank_is_named():
    with pytest.raises(LaunchEnvironmentError, match="WORLD_SIZE=4 but no RANK"):
        detect({"WORLD_SIZE": "4"}, launchers=[RayActorLauncher(FakeRayContext(["0"], 1.0))])


def test_ray_driver_script_is_not_an_actor():
    # ray is importable here but not initialised in this process: detection must not import or start it
    import sys
    had_ray = "ray" in sys.modules
    assert fields(detect({}))[0] == "single"
    assert ("ray" in sys.modules) == had_ray


# verl 0.9.1's RayWorkerGroup._create_worker gives each actor these (verl/single_controller/ray/base.py), and its
# Worker.__init__ writes LOCAL_RANK=0 and LOCAL_WORLD_SIZE=1 back (verl/single_controller/base/worker.py)
VERL_WORKER = {"WORLD_SIZE": "4", "RANK": "1", "WG_PREFIX": "critic", "WG_BACKEND": "ray", "RAY_LOCAL_WORLD_SIZE": "4",
               "MASTER_ADDR": "10.0.0.7", "MASTER_PORT": "41234", "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "1"}


def test_a_verl_worker_is_checked_in_its_worker_groups_group_unless_gpuguard_group_names_one():
    launcher = RayActorLauncher(FakeRayContext(["1"], 1 / 3))
    ctx = detect(VERL_WORKER, launchers=[launcher])
    assert (fields(ctx)[:3], ctx.group, ctx.extra["group_from"]) == (("ray", 1, 4), "critic", "WG_PREFIX")
    assert detect({**VERL_WORKER, "GPUGUARD_GROUP": "mine"}, launchers=[launcher]).group == "mine"
    # WG_PREFIX without verl's WG_BACKEND=ray is someone else's variable: the group stays unnamed ("default")
    assert detect({**VERL_WORKER, "WG_BACKEND": "nccl"}, launchers=[launcher]).group is None
    # a prefix that is not a group name is made one, and two such prefixes never become the same name
    odd = [detect({**VERL_WORKER, "WG_PREFIX": p}, launchers=[launcher]).group for p in ("a b", "a_b", "a/b c", "é" * 200)]
    assert odd[1] == "a_b" and odd[0].startswith("a_b-") and len(set(odd)) == 4
    assert all(is_group_name(g) for g in odd) and len(odd[3]) <= 128
