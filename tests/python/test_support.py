"""The test-support package (tests/gg_testing) on what broke before it: results of ranks that write at once,
ranks left running when their torchrun agent was killed, folders left in /tmp, and ports two test processes
chose alike; and each test's CPU seconds, which CI's table ranks tests by."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from gg_testing import launch
from gg_testing.env import scrubbed
from gg_testing.ports import ephemeral_range, free_port, worker_slice
from gg_testing.procs import JOB_MARK, SNIPPET_TIMEOUT_S, alive, marked, run_json, wait_until

# Two ranks each rewrite their result 200 times, 256 KiB apiece (far above PIPE_BUF, so a shared pipe would
# split them), while printing the same to the stdout they share: what the test reads must still be whole.
CONCURRENT_WRITER = r"""
import os, sys
from gg_testing.rank import write_result
rank = int(os.environ["RANK"])
for i in range(200):
    write_result({"rank": rank, "round": i, "pad": str(rank) * 262144})
    sys.stdout.write(f"rank {rank} round {i} " + str(rank) * 8192 + "\n")
"""


def test_results_of_ranks_writing_at_once_are_each_read_whole(tmp_path):
    env = scrubbed(dict(os.environ))
    jobs = [launch.Job([sys.executable, "-c", CONCURRENT_WRITER], dict(env, RANK=str(r)), tmp_path,
                       name=f"rank{r}", results=tmp_path / "results") for r in range(2)]
    reads = 0
    while any(job.poll() is None for job in jobs):  # read while they write: never a half-written document
        for rank, doc in launch.read_results(tmp_path / "results").items():
            assert doc["rank"] == rank and doc["pad"] == str(rank) * 262144
            reads += 1
    done = launch.wait_jobs(jobs, 120)
    assert [d.returncode for d in done] == [0, 0], [d.tail() for d in done]
    ranks = jobs[0].ranks()
    assert sorted(ranks) == [0, 1]
    assert all(ranks[r]["round"] == 199 and ranks[r]["pad"] == str(r) * 262144 for r in (0, 1))
    assert not list((tmp_path / "results").glob("*.partial")), "a partial result was left behind"
    assert reads > 0  # the reader did run while the ranks wrote


RANK_THAT_HANGS = r"""
import os, signal
from gg_testing.rank import write_result
write_result({"pid": os.getpid(), "session": os.getsid(0)})
signal.pause()  # a hung rank: only a signal ends it
"""


@pytest.mark.slow
def test_killing_a_torchrun_job_ends_its_ranks_even_those_its_agent_left_behind(tmp_path):
    script = launch.write(tmp_path, "hang.py", RANK_THAT_HANGS)
    job = launch.Job(launch.torchrun_argv(str(script), nproc=2), scrubbed(dict(os.environ)), tmp_path)
    wait_until(lambda: len(job.ranks()) == 2 or job.poll() is not None, 120, what="both ranks' results")
    ranks = job.ranks()
    assert sorted(ranks) == [0, 1], job.stderr()[-3000:]
    pids = [ranks[r]["pid"] for r in (0, 1)]
    assert all(alive(pid) for pid in pids)
    # first what a test did before: kill the agent's process group, no more; the ranks it started in sessions
    # of their own outlive it where torch does so
    os.killpg(job.pid, signal.SIGKILL)
    job.proc.wait()
    job.kill()
    assert not [pid for pid in pids if alive(pid)], "a rank outlived its killed agent and the job's end"


def test_a_job_past_its_timeout_is_ended_whole_and_says_so(tmp_path):
    code = ("import signal, subprocess, sys\n"
            "subprocess.Popen([sys.executable, '-c', 'import signal; signal.pause()'], start_new_session=True)\n"
            "print('started', flush=True)\n"
            "signal.pause()\n")
    job = launch.Job([sys.executable, "-c", code], scrubbed(dict(os.environ)), tmp_path)
    wait_until(lambda: "started" in job.stdout(), 60, what="the job's start")
    children = marked(JOB_MARK, job.mark)
    assert len(children) == 2  # the job and the child it started in a session of its own
    done = job.wait(timeout=0.5)  # the timeout is the subject: the job never ends by itself
    assert done.returncode == -9
    assert "[gg_testing: killed after 0.5 s]" in done.stderr
    assert not [pid for pid in children if alive(pid)]


def tmp_entries() -> set[str]:
    # gg-ray-*: a Ray cluster of another test (another xdist worker) keeps its folder in /tmp while it runs, by
    # design (socket paths under 108 bytes), and removes it at its end; that is not this test's to count
    return {name for name in os.listdir("/tmp") if re.match(r"(gg|gpuguard)[-_]", name)
            and not name.startswith("gg-ray-")}


@pytest.mark.slow
def test_fake_gpu_jobs_leave_nothing_in_tmp(fake_gpus, tmp_path):
    before = tmp_entries()
    # the fake driver, NVML and NCCL under torchrun, each rank's output in its own file
    done = launch.torchrun("-m", "gpuguard", "check", "--verify-nccl", "--json", "--timeout", "30", nproc=2,
                           env=scrubbed(fake_gpus.env("h100x4")), workdir=tmp_path, logs=True)
    ranks = launch.rank_json(done)
    assert sorted(ranks) == [0, 1] and all(ranks[r]["ok"] for r in (0, 1)), done.tail()
    got = run_json("import json, gpuguard; print(json.dumps(len(gpuguard.devices())))", fake_gpus.env("h100x4"))
    assert got == 4
    assert tmp_entries() - before == set()


def test_free_ports_lie_below_the_ephemeral_range_and_apart_per_xdist_worker():
    low, _ = ephemeral_range()
    ports = {free_port() for _ in range(50)}
    assert len(ports) == 50 and all(p < low for p in ports)
    probe = "import json; from gg_testing.ports import worker_slice; print(json.dumps(worker_slice()))"
    slices = []
    for worker in ("gw0", "gw1", "gw2"):
        env = dict(os.environ, PYTEST_XDIST_WORKER=worker, PYTEST_XDIST_WORKER_COUNT="3",
                   PYTHONPATH=str(Path(launch.__file__).parents[1]))
        slices.append(json.loads(subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True,
                                                text=True, check=True).stdout))
    assert slices[0][1] <= slices[1][0] and slices[1][1] <= slices[2][0], slices
    assert slices[2][1] <= low
    assert worker_slice()[0] <= min(ports) and max(ports) < worker_slice()[1]
    # two pytest runs at once (CI's wall-clock lane beside its main one): disjoint shares, each split per worker
    shared = []
    for share in ("0/2", "1/2"):
        env = dict(os.environ, PYTEST_XDIST_WORKER="gw1", PYTEST_XDIST_WORKER_COUNT="2", GG_TEST_PORT_SHARE=share,
                   PYTHONPATH=str(Path(launch.__file__).parents[1]))
        shared.append(json.loads(subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True,
                                                text=True, check=True).stdout))
    assert shared[0][1] <= shared[1][0] and shared[1][1] <= low and shared[0][0] >= 20000, shared


CPU_TESTS = """
import subprocess, sys, time

SPIN = "import time\\nend = time.process_time() + 0.6\\nwhile time.process_time() < end: pass"

def test_spins_in_a_child():
    subprocess.run([sys.executable, "-c", SPIN], check=True)

def test_sleeps():
    time.sleep(0.6)
"""


def test_each_tests_cpu_seconds_reach_the_junit_file_with_its_waited_for_children(tmp_path):
    (tmp_path / "conftest.py").write_text("from gg_testing.cpu_time import *  # noqa: F401,F403\n")
    (tmp_path / "test_cpu.py").write_text(CPU_TESTS)
    junit = tmp_path / "junit.xml"
    env = dict(scrubbed(dict(os.environ)), PYTHONPATH=str(Path(launch.__file__).parents[1]))
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-o", "addopts=",
                           str(tmp_path / "test_cpu.py"), f"--junitxml={junit}"], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=SNIPPET_TIMEOUT_S)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    recorded = re.findall(r'<testcase [^>]*name="(\w+)"[^>]*>\s*<properties>\s*'
                          r'<property name="cpu_s" value="([0-9.]+)"', junit.read_text())
    cpu = {name: float(seconds) for name, seconds in recorded}
    assert set(cpu) == {"test_spins_in_a_child", "test_sleeps"}, junit.read_text()
    assert cpu["test_spins_in_a_child"] >= 0.6 and cpu["test_sleeps"] < 0.3, cpu


# A parallel step's files, three of four quick tests and one costly of one, each test logging its worker and file.
SCHEDULED_TEST = """
import os, pytest
@pytest.mark.parametrize("i", range({n}))
def test_runs(i):
    with open(os.environ["ORDER_LOG"], "a") as log:
        log.write(os.environ["PYTEST_XDIST_WORKER"] + " {name}\\n")
"""
SCHEDULED = "import gg_testing.schedule\ngg_testing.schedule.COSTLIEST = ('test_costly.py',)\n" \
            "pytest_plugins = ('gg_testing.schedule',)\n"


def first_files(tmp_path: Path, conftest: str) -> set[str]:
    """The file each of two xdist workers ran first (--dist loadfile), under the conftest given."""
    folder = tmp_path / str(len(list(tmp_path.iterdir())))
    folder.mkdir()
    (folder / "conftest.py").write_text(conftest)
    for name, n in (("test_many1", 4), ("test_many2", 4), ("test_many3", 4), ("test_costly", 1)):
        (folder / f"{name}.py").write_text(SCHEDULED_TEST.format(n=n, name=name))
    log = folder / "order.log"
    env = dict(scrubbed(dict(os.environ)), PYTHONPATH=str(Path(launch.__file__).parents[1]), ORDER_LOG=str(log))
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-o", "addopts=",
                           "-n", "2", "--dist", "loadfile", str(folder)], cwd=folder, env=env,
                          capture_output=True, text=True, timeout=SNIPPET_TIMEOUT_S)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    lines = [line.split() for line in log.read_text().splitlines()]
    assert len(lines) == 13, lines
    return {next(name for w, name in lines if w == worker) for worker in {w for w, _ in lines}}


def test_a_parallel_step_hands_out_its_costliest_files_first(tmp_path):
    pytest.importorskip("xdist", reason="pytest-xdist runs CI's parallel steps: scripts/setup.sh installs it "
                                        "(pyproject.toml's dependency group 'test')")
    # xdist alone hands out the files with the most tests first, so the costly one last; the schedule, first
    assert "test_costly" not in first_files(tmp_path, "")
    assert "test_costly" in first_files(tmp_path, SCHEDULED)


def test_the_schedules_costliest_files_exist():
    from gg_testing.schedule import COSTLIEST  # a renamed file would lose its turn, silently
    root = Path(launch.__file__).parents[2]
    assert [path for path in COSTLIEST if not (root / path).is_file()] == []


#: What a test file writes to start a Ray cluster: ray.init(), the tests' `ray start --head`, a driver script.
STARTS_RAY = re.compile(r"ray\.init\(|RayHead\(|ray_scripts|ray start|ray job submit")


def test_every_test_file_that_starts_a_ray_cluster_marks_its_tests_ray_cluster():
    # CI runs the marked tests at normal priority, one cluster starting at a time (pyproject's markers): one left
    # unmarked would start its cluster at nice 10 beside other clusters and busy ranks, where Ray's own deadlines ran
    # out before
    tests = Path(__file__).parents[1]
    files = sorted(p for p in tests.rglob("test_*.py") if STARTS_RAY.search(p.read_text()))
    assert len(files) >= 6, files  # the scan finds the Ray tests there are
    unmarked = [str(p.relative_to(tests)) for p in files if "pytest.mark.ray_cluster" not in p.read_text()]
    assert not unmarked, f"these start a Ray cluster but mark no test ray_cluster: {unmarked}"


# A second process holding the start lock (gg_testing.ray_start) until its stdin closes.
LOCK_HOLDER = r"""
import sys
from pathlib import Path
from gg_testing import ray_start
ray_start.LOCK_PATH = Path(sys.argv[1])
with ray_start.starting_alone():
    print("held", flush=True)
    sys.stdin.read()
"""


def lock_taken(path: Path) -> bool:
    """Whether some holder has the lock at ``path`` (tried through an open file of its own: flock sees it as
    another holder)."""
    from gg_testing.ray_start import try_lock

    fd = os.open(path, os.O_CREAT | os.O_RDWR)
    try:
        return not try_lock(fd)
    finally:
        os.close(fd)


def test_a_ray_cluster_starts_only_once_no_other_process_is_starting_one(tmp_path, monkeypatch):
    from gg_testing import ray_start

    monkeypatch.setattr(ray_start, "LOCK_PATH", tmp_path / "start.lock")
    holder = subprocess.Popen([sys.executable, "-c", LOCK_HOLDER, str(ray_start.LOCK_PATH)], text=True,
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=dict(os.environ, PYTHONPATH=str(
                                  Path(__file__).parents[1])))
    try:
        assert holder.stdout.readline() == "held\n"
        with pytest.raises(TimeoutError, match=r"another test's Ray cluster was still starting after 1 s "
                                               r"\(lock .*start\.lock\); its test's output says why"):
            with ray_start.starting_alone(wait_s=1):
                pass
    finally:
        holder.stdin.close()
        holder.wait(timeout=30)
    with ray_start.starting_alone(wait_s=5):
        assert lock_taken(ray_start.LOCK_PATH)
        with ray_start.starting_alone(wait_s=1):  # re-entrant within the process: RayHead.start inside a test
            pass
        assert lock_taken(ray_start.LOCK_PATH)
    assert not lock_taken(ray_start.LOCK_PATH)


def test_a_test_holds_other_ray_starts_back_until_a_new_driver_joins_or_it_ends(tmp_path, monkeypatch):
    from gg_testing import ray_start

    monkeypatch.setattr(ray_start, "LOCK_PATH", tmp_path / "start.lock")
    logs = tmp_path / "session_1" / "logs"
    logs.mkdir(parents=True)
    (logs / "python-core-driver-01_100.log").write_text("")  # a driver of before: it does not count
    long_ago = time.time() - 600
    os.utime(logs, (long_ago, long_ago))  # a session left by an earlier run: the watcher looks in it only once changed
    monkeypatch.setattr(ray_start, "DRIVER_LOGS", (str(tmp_path / "session_*/logs/python-core-driver-*"),))
    with ray_start.until_a_driver_joins(hold_s=60):
        (logs / "worker-01_300.log").write_text("")  # the folder changes, by another file than a driver's
        # still held 1.5 s on (the watcher looks every 0.25 s): the old driver's log did not release it
        assert not wait_until(lambda: not lock_taken(ray_start.LOCK_PATH), 1.5, what=None)
        (logs / "python-core-driver-01_200.log").write_text("")
        wait_until(lambda: not lock_taken(ray_start.LOCK_PATH), 10, what="the release once a new driver joined")
    assert not lock_taken(ray_start.LOCK_PATH)
    with ray_start.until_a_driver_joins(hold_s=60):  # no driver: held until the test ends
        assert lock_taken(ray_start.LOCK_PATH)
    assert not lock_taken(ray_start.LOCK_PATH)
    with ray_start.until_a_driver_joins(hold_s=0.5):  # nor past its bound
        wait_until(lambda: not lock_taken(ray_start.LOCK_PATH), 10, what="the release at hold_s")


# ---- what the tests need is what scripts/setup.sh installs -----------------------------------------------------

ROOT = Path(launch.__file__).parents[2]
#: What scripts/setup.sh installs by name, outside pyproject.toml's dependency groups.
SETUP_INSTALLS = ("torch", "ray", "numpy")
#: The standard library's modules newer than the oldest supported Python (3.10), which a test imports where it has them.
STDLIB_SINCE_3_11 = ("tomllib",)
#: Modules a test asks for by name: pytest.importorskip("x"), importlib.util.find_spec("x").
ASKED_FOR_BY_NAME = ("importorskip", "find_spec")


def imported_by(path: Path) -> set[str]:
    """The top-level names of the modules a file imports, or asks for by name."""
    import ast

    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module.split(".")[0])
        elif (isinstance(node, ast.Call) and getattr(node.func, "attr", getattr(node.func, "id", None))
              in ASKED_FOR_BY_NAME and node.args and isinstance(node.args[0], ast.Constant)
              and isinstance(node.args[0].value, str)):
            names.add(node.args[0].value.split(".")[0])
    return names


def dependency_groups() -> dict[str, list[str]]:
    text = (ROOT / "pyproject.toml").read_text()
    try:
        import tomllib
    except ModuleNotFoundError:  # Python 3.10: the table's own lines, `name = ["requirement", ...]`. Not pip's copy
        # of tomli: importing pip makes setuptools' distutils shim stand down for the rest of the process, and a later
        # `import setuptools` (torch._dynamo's) then fails its own check that distutils is its copy
        table = re.search(r"^\[dependency-groups\]\n(.*?)(?=^\[)", text, re.M | re.S)
        assert table, "pyproject.toml has no [dependency-groups] table"
        return {name: re.findall(r'"([^"]+)"', items)
                for name, items in re.findall(r"^([\w-]+) = \[(.*)\]$", table.group(1), re.M)}
    return tomllib.loads(text)["dependency-groups"]


def normalised(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def test_every_module_the_tests_use_comes_from_setup_or_a_dependency_group():
    # CI's corners get their test tools the way a newcomer does (scripts/setup.sh), so a tool no list names would
    # fail both; this names the file that needs it, and the plugins pytest loads by option, which no file imports
    import importlib.metadata

    groups = dependency_groups()
    listed = {normalised(re.split(r"[<>=!~\[; ]", req, maxsplit=1)[0])
              for reqs in groups.values() for req in reqs if isinstance(req, str)} | set(SETUP_INSTALLS)
    # the repository's own top-level modules and packages (gpuguard's own modules are not top-level: its
    # gpuguard.frameworks.lightning is no `lightning`)
    python = ROOT / "python"
    own = {p.stem for p in ROOT.rglob("*.py") if python / "gpuguard" not in p.parents} \
        | {p.name for p in ROOT.rglob("*") if (p / "__init__.py").is_file() and python / "gpuguard" not in p.parents}
    by_module = importlib.metadata.packages_distributions()
    needed = {"xdist": "tests use -n (CI's parallel steps)", "pytest_timeout": "pyproject sets timeout"}
    for path in sorted((ROOT / "tests").rglob("*.py")) + sorted((ROOT / "benchmarks").rglob("*.py")):
        for name in imported_by(path) - own - set(sys.stdlib_module_names) - set(STDLIB_SINCE_3_11):
            needed.setdefault(name, str(path.relative_to(ROOT)))
    unlisted = {}
    for name, where in sorted(needed.items()):
        distributions = {normalised(d) for d in by_module.get(name, [name])}
        if not distributions & listed:
            unlisted[name] = (where, sorted(distributions))
    assert unlisted == {}, (f"modules the tests need that scripts/setup.sh does not install (module: the file "
                            f"that needs it, its distributions); add each to a dependency group of "
                            f"pyproject.toml: {unlisted}")
    assert {"build", "test"} <= set(groups)
