"""Launchers nested the way real clusters nest them (the environments copied from the real runs in
tests/cluster): MPI daemons started by SLURM, srun's PMI-2, the run id that keeps one launch together, and a
rank whose launch environment is broken still reporting under its rank."""

from __future__ import annotations

import pytest

from gpuguard import LaunchEnvironmentError
from gpuguard.binding.launchers import detect, rank_hint, run_id

pytestmark = pytest.mark.version_independent  # CI runs this file on the oldest corner only (pyproject's markers)

# rank 1 of `mpirun -np 2 --map-by node` inside `sbatch -N2`: orted was started by srun as task 0 of step 0
OMPI_UNDER_ORTED = {"OMPI_COMM_WORLD_RANK": "1", "OMPI_COMM_WORLD_SIZE": "2", "OMPI_COMM_WORLD_LOCAL_RANK": "0",
                    "OMPI_COMM_WORLD_LOCAL_SIZE": "1", "OMPI_MCA_ess_base_jobid": "2092695553",
                    "SLURM_JOB_ID": "41", "SLURM_PROCID": "0", "SLURM_STEP_ID": "0", "SLURM_STEP_NUM_TASKS": "2",
                    "SLURM_LOCALID": "0", "SLURM_NODEID": "1", "SLURM_STEP_TASKS_PER_NODE": "1(x2)"}


def test_open_mpi_rank_under_orted_in_a_slurm_allocation_is_not_a_contradiction():
    ctx = detect(OMPI_UNDER_ORTED)
    assert (ctx.launcher, ctx.rank, ctx.world_size, ctx.local_rank) == ("openmpi", 1, 2, 0)
    assert ctx.source("rank") == "OMPI_COMM_WORLD_RANK"
    assert "SLURM_PROCID" not in ctx.sources.values()


def test_a_copied_local_rank_under_open_mpi_is_still_caught():
    with pytest.raises(LaunchEnvironmentError) as err:
        detect({**OMPI_UNDER_ORTED, "LOCAL_RANK": "3"})
    assert "OMPI_COMM_WORLD_LOCAL_RANK=0 but LOCAL_RANK=3" in str(err.value)


def test_one_mpirun_has_one_run_id_whether_its_ranks_have_a_slurm_step_or_not():
    under_orted = detect(OMPI_UNDER_ORTED)
    # rank 0: a child of mpirun itself in the batch script (no step), the same mpirun job id
    local = {k: v for k, v in OMPI_UNDER_ORTED.items() if k not in ("SLURM_STEP_ID", "SLURM_PROCID")}
    local.update(OMPI_COMM_WORLD_RANK="0")
    assert run_id(detect(local), local) == run_id(under_orted, OMPI_UNDER_ORTED) == "openmpi-2092695553"
    # the second mpirun of the batch job: orted runs as step 1, Open MPI gives a new job id
    second = dict(OMPI_UNDER_ORTED, SLURM_STEP_ID="1", OMPI_MCA_ess_base_jobid="2092695554")
    assert run_id(detect(second), second) == "openmpi-2092695554"


def test_srun_tasks_keep_job_and_step_as_run_id():
    env = {"SLURM_JOB_ID": "7", "SLURM_STEP_ID": "3", "SLURM_PROCID": "1", "SLURM_STEP_NUM_TASKS": "2",
           "SLURM_LOCALID": "1"}
    assert run_id(detect(env), env) == "slurm-7.3"


def test_srun_pmi2_is_srun_and_an_unknown_pmi_launcher_is_not_called_mpich():
    env = {"SLURM_JOB_ID": "7", "SLURM_STEP_ID": "0", "SLURM_PROCID": "1", "SLURM_STEP_NUM_TASKS": "2",
           "SLURM_LOCALID": "1", "PMI_RANK": "1", "PMI_SIZE": "2", "PMI_FD": "5"}
    assert detect(env).launcher == "slurm"
    with pytest.raises(LaunchEnvironmentError) as err:
        detect({"PMI_RANK": "1", "PMI_SIZE": "4"})
    message = str(err.value)
    assert "MPICH" not in message and "Hydra" not in message
    assert "a PMI process manager (PMI_RANK, PMI_SIZE)" in message
    hydra = detect({"PMI_RANK": "1", "PMI_SIZE": "2", "MPI_LOCALRANKID": "1", "MPI_LOCALNRANKS": "2"})
    assert hydra.launcher == "mpich"


def test_a_broken_launch_environment_still_gives_the_rank_to_report_under():
    env = {"SLURM_JOB_ID": "7", "SLURM_STEP_ID": "0", "SLURM_PROCID": "1", "SLURM_STEP_NUM_TASKS": "3",
           "SLURM_LOCALID": "1", "LOCAL_RANK": "5"}
    with pytest.raises(LaunchEnvironmentError):
        detect(env)
    assert rank_hint(env) == (1, 3, "slurm")
    assert rank_hint({"SLURM_PROCID": "x"}) is None


def test_bind_raises_the_launch_error_itself_when_there_is_no_store_to_report_it(monkeypatch):
    import gpuguard

    for k, v in {"SLURM_JOB_ID": "7", "SLURM_STEP_ID": "0", "SLURM_PROCID": "1", "SLURM_STEP_NUM_TASKS": "3",
                 "SLURM_LOCALID": "1", "LOCAL_RANK": "5"}.items():
        monkeypatch.setenv(k, v)
    for k in ("TORCHELASTIC_USE_AGENT_STORE", "MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE"):
        monkeypatch.delenv(k, raising=False)
    with pytest.raises(LaunchEnvironmentError) as err:
        gpuguard.bind(timeout=5)
    assert "SLURM_LOCALID=1 but LOCAL_RANK=5" in str(err.value)
