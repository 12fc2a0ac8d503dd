"""Documented usage runs: every example in examples/ as its docstring says, and every Python and shell block of
README.md and docs/*.md, against the fake driver where a GPU would be needed (documented_usage.py says how blocks are
marked); the README's command line and wheel install, and the source install lines, are held to cli.py and
pyproject.toml.

A block the tests cannot run must say so, and why, in its marker; an unmarked block is run as written, and one
that fails fails here. The examples run exactly the fake-driver commands their docstrings give.
"""

from __future__ import annotations

import ast
import os
import re
import shlex
from pathlib import Path
from typing import Iterator

import pytest

from gg_testing import framework_jobs
from gg_testing.env import scrubbed
from gg_testing.ports import free_port
from gg_testing.paths import ROOT
from gg_testing.procs import run_logged
from gg_testing.ray_head import RayHead
from gg_testing.ray_start import ray_start_timed_out, until_a_driver_joins
from documented_usage import (DOCUMENTS, PYTHON, README, Block, Setup, command_shim, documented_blocks, file_blocks,
                              gpu_setup_for, install_lines, write_program)

EXAMPLES = sorted((ROOT / "examples").glob("*.py"))
#: The page that documents the source build, its install lines included.
SOURCE_BUILD_PAGE = ROOT / "docs" / "building-and-testing.md"
FAKE_DRIVER_IN_DOCSTRINGS = "$PWD/build/dev/tests/fakes"

# ---- examples/ ---------------------------------------------------------------------------------------------

#: What each example's run must print: run as its docstring's command, or with extra arguments the docstring describes.
#: The Ray example runs once, with --fractional: that run is its plain run (the same placement, binds and report),
#: then one part more; a plain run beside it cost CI a Ray cluster and 8 actors importing torch (about 50 CPU-s)
#: and would check nothing this one does not.
EXAMPLE_RUNS: dict[tuple[str, tuple[str, ...]], tuple[str, ...]] = {
    ("ray_placement_example.py", ("--fractional",)): (
        "Ray gave the actors of group 'actor' 1/2 GPU each",
        "Ray gave the actors of group 'rollout' 1/2 GPU each",
        "6 ranks of one group given num_gpus=1/3 each, no placement:",
        "DuplicateDeviceError: 6 ranks of group 'packed' share 2 GPUs.",
        "Likely cause: Ray gave these actors 1/3 of a GPU each (num_gpus=1/3)",
        "Fix: give every rank of a group a whole GPU: gpuguard.ray_placement(max_colocate=1)"),
    ("stray_context_example.py", ()): (
        "rank 1: StrayContextError: rank 1 (host ",
        "is bound to cuda:1 (GPU-5a6b8d11-0001-4001-8001-1f2e3d4c5b61) but already has a CUDA context on cuda:0",
        "local rank 0's GPU): it holds 414 MiB there (NVML, pid ",
        "rank 0: StrayContextError: rank 1 (host ",
        "Fix: call torch.cuda.set_device(int(os.environ['LOCAL_RANK'])) (or gpuguard.bind()) first"),
    ("stray_context_example.py", ("--fixed",)): (
        "rank 0: cuda:0 (GPU-5a6b7c00-0000-4000-8000-1f2e3d4c5b60), no context on any other GPU",
        "rank 1: cuda:1 (GPU-5a6b8d11-0001-4001-8001-1f2e3d4c5b61), no context on any other GPU"),
}


def docstring_commands(path: Path) -> list[str]:
    """The shell commands an example's docstring gives: indented lines, joined where they end with a backslash."""
    doc = ast.get_docstring(ast.parse(path.read_text())) or ""
    commands, current = [], ""
    for line in doc.splitlines():
        if not line.startswith("    ") and not current:
            continue
        current += line.strip()
        if current.endswith("\\"):
            current = current[:-1] + " "
            continue
        if current:
            commands.append(current)
        current = ""
    return commands


def test_every_example_says_how_to_run_it_without_a_gpu_and_what_it_prints():
    for path in EXAMPLES:
        fake = [c for c in docstring_commands(path) if "GPUGUARD_LIBCUDA=" in c and f"examples/{path.name}" in c]
        assert len(fake) == 1, f"{path.name}: its docstring must give one command that runs it on the fake driver"
        runs = [args for (name, args) in EXAMPLE_RUNS if name == path.name]
        assert runs, f"{path.name}: say in EXAMPLE_RUNS what its run prints"
        doc = ast.get_docstring(ast.parse(path.read_text())) or ""
        for args in runs:
            for arg in args:
                assert arg in doc, f"{path.name}: EXAMPLE_RUNS runs it with {arg}, which its docstring never names"


def example_env() -> dict[str, str]:
    env = scrubbed(dict(os.environ))
    for key in ("GPUGUARD_LIBCUDA", "GPUGUARD_LIBNCCL", "GPUGUARD_LIBNVML", "GPUGUARD_FAKE_TOPOLOGY",
                "GPUGUARD_FAKE_GPU_STATE_DIR", "CUDA_VISIBLE_DEVICES",
                "RAY_ADDRESS", "PYTHONPATH"):
        env.pop(key, None)
    env["RAY_DISABLE_USAGE_STATS"] = "1"
    return env


def example_run(name: str, args: tuple[str, ...]):
    """One example run as a test case: the Ray example's, which starts a local Ray, marked so."""
    marks = [pytest.mark.ray_cluster] if name.startswith("ray_") else []
    return pytest.param(name, args, marks=marks, id=" ".join((name,) + args))


@pytest.mark.slow
@pytest.mark.parametrize("name,args", [example_run(*key) for key in EXAMPLE_RUNS])
def test_example_runs_as_its_docstring_says(name, args, fakes_dir):
    path = ROOT / "examples" / name
    command = next(c for c in docstring_commands(path) if "GPUGUARD_LIBCUDA=" in c)
    if Path(fakes_dir) != ROOT / "build" / "dev" / "tests" / "fakes":  # built elsewhere (another interpreter's folder)
        command = command.replace(FAKE_DRIVER_IN_DOCSTRINGS, str(fakes_dir))
    command = " ".join([command, *map(shlex.quote, args)])
    proc = run_logged(["bash", "-c", command], example_env(), timeout=500, cwd=str(ROOT))
    if ray_start_timed_out(proc.returncode, proc.stdout):  # Ray's own start, before any gpuguard code
        with until_a_driver_joins():
            proc = run_logged(["bash", "-c", command], example_env(), timeout=500, cwd=str(ROOT))
    assert proc.returncode == 0, f"$ {command}\n{proc.stdout[-6000:]}"
    for text in EXAMPLE_RUNS[(name, args)]:
        assert text in proc.stdout, f"$ {command}\nmissing {text!r} in:\n{proc.stdout[-6000:]}"
    assert "cannot pickle" not in proc.stdout


# ---- README.md and docs/ -----------------------------------------------------------------------------------

JOB_LOG = """\
[rank1]: torch.distributed.DistBackendError: NCCL error in: /pytorch/torch/csrc/distributed/c10d/NCCLUtils.cpp:77, invalid usage (run with NCCL_DEBUG=WARN for details), NCCL version 2.21.5
[rank1]: ncclInvalidUsage: This usually reflects invalid usage of NCCL library.
[rank1]: Last error:
[rank1]: Duplicate GPU detected : rank 1 and rank 0 both on CUDA device 10000
"""

#: The setups blocks name in their markers.
SETUPS: dict[str, Setup] = {
    # docs/ray.md's zero-code line: joins a local Ray with the fake GPUs; then a task imports torch
    "ray-hook": Setup(
        ray_cluster=True,
        before="import ray\n",
        after="""
            @ray.remote
            def worker_has_gpuguard_on():
                import torch, gpuguard.auto
                return gpuguard.auto.is_enabled()

            print("gpuguard active in a Ray worker:", ray.get(worker_has_gpuguard_on.remote(), timeout=300))
            ray.shutdown()
            """,
        expect=("gpuguard active in a Ray worker: True",)),  # its "active" line reaches the driver late, if at all
    # the README's Ray example: its ray.init() joins a local Ray that has 8 (fake) GPUs
    "ray-cluster": Setup(
        ray_cluster=True,
        expect=("Ray gave the actors of group 'actor' 1/2 GPU each",
                "Ray gave the actors of group 'rollout' 1/2 GPU each")),
    # docs/diagnostics.md: `gpuguard explain job.log` with NCCL's own duplicate-GPU text in job.log; doctor on 4
    # fake GPUs
    "job-log": Setup(
        topology="h100x4", files={"job.log": JOB_LOG},
        expect=("[duplicate_gpu] Two or more ranks of one NCCL communicator are on the same GPU: ranks 0, 1",
                "nccl all-reduce over 4 GPUs, P2P enabled: ok")),
    # docs/launchers.md: worker(i, nprocs) started as its comment says, by torch.multiprocessing.spawn, two ranks on
    # 4 fake GPUs
    "spawn": Setup(
        topology="h100x4",
        before="""
            import logging, os
            import torch, torch.distributed, gpuguard
            logging.basicConfig(level=logging.INFO, format="%(message)s")
            """,
        after="""
            if __name__ == "__main__":
                if os.path.exists("/tmp/job.store"):
                    os.remove("/tmp/job.store")
                torch.multiprocessing.spawn(worker, args=(2,), nprocs=2)
            """,
        expect=("gpuguard: rank 0/2 local 0/? -> cuda:0 (GPU-5a6b7c00-",
                "gpuguard: rank 1/2 local 1/? -> cuda:1 (GPU-5a6b8d11-")),
    # docs/frameworks.md: a Trainer with strategy="ddp" on 2 CPU processes, run as `gpuguard run -- python train.py`
    "lightning-job": Setup(
        topology="h100x4", files={"train.py": framework_jobs.LIGHTNING_TRAINER},
        expect=("fit done on rank 0", "is rank 1/2 (lightning: Lightning's subprocess launcher",
                "gpuguard: Lightning rank 1/2: guard() on DistributedDataParallel + watch() of the collectives")),
    # docs/frameworks.md: the callback given by hand to a Trainer of one CPU process
    "lightning-model": Setup(
        before=framework_jobs.LIGHTNING_MODULE + "model = Regression()\n",
        expect=("gpuguard: Lightning rank 0/1: guard() on Regression",)),
    "fabric-model": Setup(
        before="import torch\nfrom torch import nn\n\nmodel = nn.Linear(4, 1)\n"
               "optimizer = torch.optim.SGD(model.parameters(), lr=0.1)\n",
        expect=("gpuguard: Fabric rank 0/1: guard() on _FabricModule",)),
    "hf-trainer": Setup(
        before=framework_jobs.HF_PIECES,
        expect=("gpuguard: Trainer rank 0/1: guard() on BertForSequenceClassification",)),
    # one process as DeepSpeed's launcher would start it (its variables set in the program: the test's environment
    # is scrubbed of launcher variables), on DeepSpeed's CPU accelerator
    "deepspeed-model": Setup(
        before=f'import os\nos.environ.update(RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", MASTER_ADDR="127.0.0.1", '
               f'MASTER_PORT="{free_port()}")\n' + framework_jobs.DEEPSPEED_PIECES,
        env={"DS_ACCELERATOR": "cpu"},
        expect=("gpuguard: DeepSpeed rank 0/1: guard() on Linear",)),
}

BLOCKS = [b for b in documented_blocks() if b.runnable_language]


def test_every_documented_block_runs_or_its_marker_says_why_not():
    assert any(b.path == README for b in BLOCKS), \
        "README.md has no Python or shell block: the parser no longer finds them"
    for block in documented_blocks():
        assert not block.problem, block.problem
        assert "<!-- doc-test" not in block.code, f"{block.id}: a marker inside the block belongs above its fence"
        if not block.runnable_language:
            assert block.kind == "run", f"{block.id}: a marker on a block that is not Python or shell"
    for block in BLOCKS:
        if block.kind == "setup":
            assert block.setup in SETUPS, f"{block.id}: no setup {block.setup!r} in test_documented_usage.SETUPS"
        if block.kind in ("skip", "gpu", "install"):
            assert len(block.why.split()) >= 4, f"{block.id}: say why it cannot run here, in a sentence"
        if block.kind == "gpu":
            gpu_setup_for(block)  # what tests/python/gpu/test_gpu_readme.py runs it with
    used = {b.setup for b in BLOCKS if b.kind == "setup"}
    assert used == set(SETUPS), f"setups no block uses: {sorted(set(SETUPS) - used)}"
    assert [b.path for b in BLOCKS if b.kind == "install"] == [SOURCE_BUILD_PAGE], \
        "one install block: the source build's, in docs/building-and-testing.md"


def test_the_readme_links_every_page_of_docs():
    readme = README.read_text()
    for path in DOCUMENTS[1:]:
        assert f"](docs/{path.name})" in readme, f"README.md does not link docs/{path.name}"


def _anchor(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def test_links_between_the_documents_reach_a_file_and_heading():
    for path in DOCUMENTS:
        for target, anchor in re.findall(r"\]\((?!https?:)([^)#\s]*)(?:#([^)\s]+))?\)", path.read_text()):
            linked = (path.parent / target).resolve() if target else path
            assert linked.exists(), f"{path.relative_to(ROOT)}: a link to {target}, which does not exist"
            if anchor:
                headings = re.findall(r"^#+ (.*)$", linked.read_text(), re.M)
                assert anchor in {_anchor(h) for h in headings}, \
                    f"{path.relative_to(ROOT)}: a link to {target}#{anchor}, a heading {linked.name} does not have"


def test_the_readme_installs_a_wheel_with_one_pip_install_on_its_first_screen():
    """The README's first command is one `pip install` of a wheel named as scripts/build_wheels.sh names it, at
    pyproject.toml's version: scripts/check_wheel_install.sh installs such a wheel where nothing can compile."""
    first = next(b for b in file_blocks(README) if b.runnable_language)
    assert first.line <= 40, f"README.md:{first.line}: the install belongs on the first screen"
    commands = [line.split("#")[0].strip() for line in first.code.splitlines() if line.split("#")[0].strip()]
    version = re.search(r'^version = "([^"]+)"$', (ROOT / "pyproject.toml").read_text(), re.M).group(1)
    wheel = rf"gpuguard-{re.escape(version)}-cp3\d+-cp3\d+-(manylinux\w*_x86_64\.)*manylinux\w*_x86_64\.whl"
    assert len(commands) == 1 and re.fullmatch(rf"pip install {wheel}", commands[0]), \
        f"README.md:{first.line}: the install is one `pip install gpuguard-{version}-cpXY-...-manylinux_..whl`, " \
        f"not {commands}"


def test_the_source_install_lines_install_what_the_build_needs_first():
    """The source build's install block (docs/building-and-testing.md), which scripts/check_source_install.sh runs in
    a fresh venv, installs each of pyproject.toml's [build-system] requirements before building without isolation."""
    lines = install_lines()
    build = re.search(r"^pip install --no-build-isolation \.(\s|$)", lines, re.M)
    assert build, f"the install lines never build this clone against the installed torch:\n{lines}"
    pyproject = (ROOT / "pyproject.toml").read_text()
    requires = re.search(r"^\[build-system\]\n(?:#.*\n)*requires = \[(.*)\]$", pyproject, re.M)
    assert requires, "pyproject.toml's [build-system] requires line moved: read it again here"
    for requirement in re.findall(r'"([^"]+)"', requires.group(1)):
        assert f'"{requirement}"' in lines[:build.start()], f"the install lines never install {requirement} first"


def test_the_readme_names_every_command_and_flag():
    """One line per command in the README's command line, with every option cli.py defines."""
    from gpuguard.cli import build_parser

    parser = build_parser()
    commands = next(a for a in parser._actions if a.dest == "command").choices
    rows = {m.group(1): m.group(2) for m in re.finditer(r"^\| `gpuguard (\w+)(.*?)` \|", README.read_text(), re.M)}
    assert set(rows) == set(commands), f"README's command line: {sorted(rows)}; cli.py: {sorted(commands)}"
    for name, sub in commands.items():
        for action in sub._actions:
            for flag in action.option_strings:
                if flag not in ("-h", "--help"):
                    assert re.search(rf"\[{re.escape(flag)}\b", rows[name]), f"README omits gpuguard {name} {flag}"


@pytest.fixture(scope="module")
def ray_cluster(fake_gpus) -> Iterator[RayHead]:
    """One local Ray (`ray start --head`) with 8 fake GPUs for the Ray blocks; always stopped."""
    head = RayHead(scrubbed(fake_gpus.env("h100x8")), num_gpus=8, num_cpus=16)
    head.start()
    try:
        yield head
    finally:
        head.stop()


def block_case(block: Block):
    """One block as a test case: a block whose setup joins the local Ray marked so."""
    ray = block.kind == "setup" and SETUPS[block.setup].ray_cluster
    return pytest.param(block, marks=[pytest.mark.ray_cluster] if ray else [], id=block.id)


@pytest.mark.slow
@pytest.mark.parametrize("block", [block_case(b) for b in BLOCKS])
def test_documented_block(block: Block, fake_gpus, tmp_path, request):
    if block.kind in ("skip", "install"):
        pytest.skip(f"marked not run: {block.why}")
    if block.kind == "gpu":
        pytest.skip(f"needs a GPU (tests/python/gpu/test_gpu_readme.py runs it): {block.why}")
    setup = SETUPS[block.setup] if block.kind == "setup" else Setup()
    command = write_program(block, setup, tmp_path)
    env = scrubbed(fake_gpus.env(setup.topology, RAY_DISABLE_USAGE_STATS="1", **setup.env))
    if setup.ray_cluster:
        env = request.getfixturevalue("ray_cluster").env(**{k: v for k, v in env.items() if k.startswith("GPUGUARD")})
    env["PATH"] = f"{command_shim(tmp_path)}{os.pathsep}{env.get('PATH', '')}"
    proc = run_logged(command, env, timeout=500, cwd=str(tmp_path))
    shown = f"{block.id}:\n{block.code}\n--- output:\n{proc.stdout[-6000:]}"
    assert proc.returncode == 0, shown
    for text in setup.expect:
        assert text in proc.stdout, f"missing {text!r}\n{shown}"
    if block.language in PYTHON:
        assert not re.search(r"^Traceback ", proc.stdout, re.M), shown
