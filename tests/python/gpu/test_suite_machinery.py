"""The test suite's own machinery, on the CPU (no GPU needed, so not marked `gpu`): results that ranks printing at
the same time cannot corrupt, the helper that finds NCCL's own lines and not the messages quoting them, and
pyproject.toml's warning filters (torch's warnings reported, gpuguard's failing the test). Each stands in for a
failure the GPU suite met on the lent machine (shared/notes/gpu-image.md)."""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from .acceptance_report import merge, table
from gg_testing.paths import ROOT
from gg_testing.procs import CPU_BOUND_TEST_TIMEOUT_S, CPU_BOUND_TIMEOUT_S
from .gpu_support import nccl_lines, read_results, torchrun, worker

# ---- each rank's result in a file of its own ---------------------------------------------------------------

# Both ranks print long lines without newlines to the same stdout at the same moment (what glued two RESULT lines
# together on the lent machine), then report a result larger than a pipe's atomic write.
_CHATTY = r'''
import os, sys, threading, time
rank = int(os.environ["RANK"])
payload = "x" * 100_000
def chatter():
    for _ in range(200):
        sys.stdout.write(f"RESULT {{\"rank\": {rank}, ")
        sys.stdout.flush()
threads = [threading.Thread(target=chatter) for _ in range(2)]
for t in threads: t.start()
report_result(step=1, payload=payload)
for t in threads: t.join()
report_result(step=2, payload=payload, pid=os.getpid())
'''


@pytest.mark.slow
def test_two_ranks_printing_at_once_still_report_whole_results(tmp_path):
    job = torchrun(worker(tmp_path, "chatty.py", _CHATTY), 2, dict(os.environ), 120)
    assert job.returncode == 0, job.output[-3000:]
    assert sorted(job.results) == [0, 1], job.output[-3000:]
    for rank, got in job.results.items():
        assert (got["rank"], got["step"], len(got["payload"])) == (rank, 2, 100_000)  # the last one, whole
    assert job.results[0]["pid"] != job.results[1]["pid"]
    # and the printed lines are what the old helper parsed: glued, not one JSON document a line
    glued = [line for line in job.output.splitlines() if line.startswith("RESULT ")]
    with pytest.raises(json.JSONDecodeError):
        json.loads(glued[0][len("RESULT "):])


def test_a_result_written_halfway_is_not_read(tmp_path):
    (tmp_path / "rank0.json").write_text('{"rank": 0, "ok": true}')
    (tmp_path / "rank1.json.4242.tmp").write_text('{"rank": 1, "o')  # a rank killed while writing
    assert read_results(tmp_path) == {0: {"rank": 0, "ok": True}}


# ---- NCCL's own lines --------------------------------------------------------------------------------------

# What NCCL 2.x prints (src/debug.cc: "[timestamp] host:pid:tid [cudaDev] file:line (func) NCCL WARN ..."), under
# the prefixes launchers add; then texts that quote NCCL's words without being NCCL: gpuguard's own messages, torch's
# exception text with NCCL's last error, explain's report quoting the line.
NCCL_SAID = [
    "h200-0:4242:4242 [0] init.cc:1027 NCCL WARN Duplicate GPU detected : rank 1 and rank 0 both on CUDA device 1d000",
    "[2026-11-27 09:00:01] h200-0:4243:4301 [0] init.cc:1141 (initTransportsRank) NCCL WARN Duplicate GPU detected : "
    "rank 0 and rank 1 both on CUDA device 1d000",
    "[default1]:h200-0:4243:4243 [0] NCCL INFO Bootstrap: Using eth0:10.0.0.1<0>",
    "(RayTrainWorker pid=812) gpu-n1:812:901 [0] NCCL INFO ncclCommInitRankConfig comm 0x5581 rank 0 nranks 2",
]
QUOTES_NCCL = [
    "[rank0]: gpuguard.errors.DuplicateDeviceError: GPU GPU-9e2c (PCI 0000:1d:00.0) is shared by ranks 0 and 1: 2 "
    "processes on a host with 1 GPU; NCCL would refuse it (\"Duplicate GPU detected\", two ranks of one NCCL group "
    "cannot share a GPU)",
    "[rank1]: torch.distributed.DistBackendError: NCCL error in: /pytorch/torch/csrc/distributed/c10d/NCCLUtils.cpp:"
    "77, invalid usage (run with NCCL_DEBUG=WARN for details), NCCL version 2.28.9",
    "[rank1]: ncclInvalidUsage: This usually reflects invalid usage of NCCL library.",
    "[rank1]: Duplicate GPU detected : rank 1 and rank 0 both on CUDA device 1d000",
    "    evidence: h200-0:4242:4242 [0] init.cc:1027 NCCL WARN Duplicate GPU detected : rank 1 and rank 0 both on",
    "gpuguard: NCCL refused to form a communicator for group 'default': two ranks share a GPU",
]


@pytest.mark.version_independent
def test_nccl_lines_are_nccls_own_and_never_a_message_quoting_them():
    log = "\n".join(QUOTES_NCCL[:3] + NCCL_SAID[:2] + QUOTES_NCCL[3:] + NCCL_SAID[2:])
    assert nccl_lines(log) == NCCL_SAID
    assert nccl_lines(log, "WARN") == NCCL_SAID[:2]
    assert nccl_lines("\n".join(QUOTES_NCCL)) == []


@pytest.mark.version_independent
def test_the_nccl_line_helper_knows_the_examples_explain_is_tested_on():
    # the duplicate-GPU recogniser's examples are NCCL's WARN lines as users pasted them
    from gpuguard.logs.recognisers.duplicate_gpu import DuplicateGpu
    warn_lines = [line for example in DuplicateGpu.examples for line in example.text.splitlines()
                  if " NCCL WARN " in line]
    assert warn_lines and nccl_lines("\n".join(warn_lines), "WARN") == warn_lines


# ---- warnings: torch's are reported, gpuguard's fail the test ----------------------------------------------

# Run by a pytest of its own under this repository's pyproject.toml, as CI's pytest reads it.
_WARNING_TESTS = r'''
import warnings
import pytest


def warn_from(module, category, message):
    """A warning raised by code of ``module`` itself (stacklevel 1): the filters attribute it to that module."""
    code = compile("import warnings\nwarnings.warn(MESSAGE, CATEGORY)", module.replace(".", "/") + ".py", "exec")
    exec(code, {"__name__": module, "MESSAGE": message, "CATEGORY": category})


def test_torch_deprecation_from_its_own_module():  # torch 2.11, importing inductor (the lent machine)
    warn_from("torch.utils.mkldnn", DeprecationWarning, "`torch.jit.script_method` is deprecated. Please switch to "
              "`torch.compile` or `torch.export`.")


def test_torch_user_warning_from_its_own_module():  # inductor on an H200, after the one above
    warn_from("torch._inductor.compile_fx", UserWarning, "TensorFloat32 tensor cores for float32 matrix "
              "multiplication available but not enabled. Consider setting `torch.set_float32_matmul_precision('high')`")


def test_a_module_whose_name_only_starts_like_gpuguards():
    warn_from("gpuguardian.x", UserWarning, "not ours")


def test_importing_inductor_for_real():
    # what torch.compile loads first; torch 2.11 warns 14 times on the way (torch.utils.mkldnn's script_method)
    import torch._inductor.compile_fx  # noqa: F401


def test_gpuguards_own_warning_attributed_to_the_caller():
    import gpuguard
    gpuguard.bind()  # no driver: "runs on the CPU", a GpuGuardWarning at stacklevel 4, i.e. this line


def test_a_gpuguard_warning_the_test_raises_itself():
    import gpuguard
    warnings.warn("gpuguard.something: direct", gpuguard.GpuGuardWarning, stacklevel=1)


def test_a_warning_attributed_to_a_gpuguard_module():
    warn_from("gpuguard.binding.steps", DeprecationWarning, "torch.cuda.foo is deprecated")


def test_an_exception_that_ends_a_gpuguard_thread():
    import threading
    def fail():
        raise RuntimeError("boom in gpuguard's thread")
    t = threading.Thread(target=fail, name="gpuguard-context-monitor")
    t.start()
    t.join()


def test_an_exception_that_ends_someone_elses_thread():
    import threading
    def fail():
        raise RuntimeError("boom in torch's thread")
    t = threading.Thread(target=fail, name="compile-worker")
    t.start()
    t.join()
'''

_PASS = ["test_torch_deprecation_from_its_own_module", "test_torch_user_warning_from_its_own_module",
         "test_a_module_whose_name_only_starts_like_gpuguards", "test_importing_inductor_for_real",
         "test_an_exception_that_ends_someone_elses_thread"]
_FAIL = ["test_gpuguards_own_warning_attributed_to_the_caller", "test_a_gpuguard_warning_the_test_raises_itself",
         "test_a_warning_attributed_to_a_gpuguard_module", "test_an_exception_that_ends_a_gpuguard_thread"]


@pytest.mark.follows_torch  # which warnings torch's own modules raise changes with each release
@pytest.mark.slow
@pytest.mark.timeout(CPU_BOUND_TEST_TIMEOUT_S)  # the inner pytest's bound and the outer's own work
def test_warnings_of_torchs_modules_are_reported_and_gpuguards_fail_the_test(tmp_path):
    (tmp_path / "test_warnings_here.py").write_text(_WARNING_TESTS)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONWARNINGS"}  # -W would replace the filters' defaults
    env.update(PYTHONPATH=os.pathsep.join([str(ROOT / "python"), env.get("PYTHONPATH", "")]),
               GPUGUARD_LIBCUDA="/nonexistent/libcuda.so.1", GPUGUARD_LIBNVML="/nonexistent/libnvidia-ml.so.1",
               GPUGUARD_LAUNCHER="single",  # bind() as one process, whatever launcher runs this suite
               # no pool of compile workers: importing Inductor starts one (a process importing torch, about
               # 6 CPU-s), which nothing here compiles with
               TORCHINDUCTOR_COMPILE_THREADS="1")
    junit = tmp_path / "junit.xml"
    # Inductor compiles in the inner pytest, CPU-bound: in the CI run of 8cd8552, beside the Ray tests on the shared
    # cores, this took 214 s of the 240 s it then had. The bound is for a hang, not a measure.
    proc = subprocess.run([sys.executable, "-m", "pytest", "-c", str(ROOT / "pyproject.toml"), "--rootdir",
                           str(tmp_path), "-p", "no:cacheprovider", "-p", "no:xdist", f"--junitxml={junit}", "-q",
                           str(tmp_path / "test_warnings_here.py")], env=env, cwd=str(tmp_path),
                          capture_output=True, text=True, timeout=CPU_BOUND_TIMEOUT_S)
    output = proc.stdout + proc.stderr
    outcomes = {}
    for case in ET.parse(junit).getroot().iter("testcase"):
        failed = case.find("failure") is not None or case.find("error") is not None
        outcomes[case.get("name")] = "failed" if failed else "passed"
    assert outcomes == {**{n: "passed" for n in _PASS}, **{n: "failed" for n in _FAIL}}, output[-6000:]
    # the failures are the warnings themselves, and the reported ones are in the summary
    assert "GpuGuardWarning: gpuguard.bind(): rank 0 runs on the CPU" in output, output[-6000:]
    assert "DeprecationWarning: torch.cuda.foo is deprecated" in output
    assert "`torch.jit.script_method` is deprecated" in output and "TensorFloat32 tensor cores" in output
    import torch
    if torch.__version__.startswith("2.11."):  # the lent machine's torch: the warning for real, from torch's module
        assert "torch/jit/_script.py" in output and "test_importing_inductor_for_real" in output, output[-6000:]


def test_every_warning_gpuguard_raises_is_a_gpuguard_warning():
    """pyproject's error filter names GpuGuardWarning: a warnings.warn in python/gpuguard with another category and
    a stacklevel above 1 would be attributed to its caller and slip through as a mere report."""
    from gpuguard import errors
    ours = {name for name, value in vars(errors).items()
            if isinstance(value, type) and issubclass(value, errors.GpuGuardWarning)}
    calls = []
    for path in sorted((ROOT / "python" / "gpuguard").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if not isinstance(node, ast.Call):
                continue
            func = node.func
            name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
            if name not in ("warn", "warn_explicit") or (isinstance(func, ast.Attribute) and
                                                          getattr(func.value, "id", "") != "warnings"):
                continue
            category = node.args[1] if len(node.args) > 1 else next(
                (k.value for k in node.keywords if k.arg == "category"), None)
            named = ("UserWarning" if category is None else category.id if isinstance(category, ast.Name)
                     else category.attr if isinstance(category, ast.Attribute) else ast.unparse(category))
            calls.append((f"{path.relative_to(ROOT)}:{node.lineno}", named))
    assert calls, "no warnings.warn found: the scan is broken"
    assert [c for c in calls if c[1] not in ours] == [], f"use GpuGuardWarning (or a subclass): {calls}"
    # the compiled modules raise no Python warning (one would be attributed to the Python line calling them)
    for path in sorted((ROOT / "csrc").rglob("*.cc")):
        text = path.read_text()
        assert "PyErr_Warn" not in text and "warnings.warn" not in text and "py::warning" not in text, path


# ---- the report --------------------------------------------------------------------------------------------

def test_the_report_merges_runs_and_prints_one_row_a_check():
    first = {"versions": {"torch": "2.11.0"}, "checks": {
        "test_gpu_nccl.py::test_a": {"outcome": "passed", "facts": {}, "figure": "1.1 s (bind() to the error)"},
        "test_gpu_watch.py::test_b": {"outcome": "failed: assert 1 == 0", "facts": {}, "figure": None}}}
    second = {"versions": {"torch": "2.11.0"}, "checks": {
        "test_gpu_compiled.py::test_c[default]": {"outcome": "skipped: no GPU", "facts": {}, "figure": None}}}
    lines = table(merge([first, second]), ("build: 50 s",))
    assert lines[0] == "torch: 2.11.0"
    assert lines[1].split() == ["check", "outcome", "figure"]
    assert lines[2].split(None, 2) == ["test_gpu_nccl.py::test_a", "passed", "1.1 s (bind() to the error)"]
    assert lines[3].split() == ["test_gpu_watch.py::test_b", "failed", "-"]
    assert lines[4].split() == ["test_gpu_compiled.py::test_c[default]", "skipped", "-"]
    assert lines[5:] == ["1 failed, 1 passed, 1 skipped", "build: 50 s"]


# What three checks do on a machine whose nvidia-smi lists a GPU (a stand-in one, on PATH): record, fail, skip.
_FAKE_CHECKS = '''
import pytest

pytestmark = pytest.mark.gpu


def test_records_facts_and_a_figure(report):
    report.record("text", "NCCL said this")
    report.record("numbers", {"plain_ms": 0.5})
    report.figure(1.2346, "s", "the job")


def test_fails(report):
    report.record("before failing", 1)
    assert 1 == 2, "the check's own words"


@pytest.mark.gpu_alone
def test_alone_and_skipped():
    pytest.skip("no Ray here")
'''


@pytest.mark.slow
def test_facts_figures_and_outcomes_reach_the_report_from_xdist_workers(tmp_path):
    pytest.importorskip("xdist", reason="pytest-xdist runs the GPU suite's side-by-side checks; not installed here")
    package = tmp_path / "gpu"
    package.mkdir()
    here = Path(__file__).parent
    for name in ("__init__.py", "conftest.py", "acceptance_report.py", "gpu_support.py"):
        (package / name).write_text((here / name).read_text())
    (package / "test_gpu_fake.py").write_text(_FAKE_CHECKS)
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    smi = bin_dir / "nvidia-smi"
    smi.write_text("#!/bin/sh\necho '0, GPU-11111111-2222-3333-4444-555555555555, 00000000:19:00.0, NVIDIA H200, "
                   "143771, 580.159.04'\n")
    smi.chmod(0o755)
    out = tmp_path / "report.json"
    env = dict(os.environ, PATH=f"{bin_dir}{os.pathsep}{os.environ['PATH']}", GPUGUARD_GPU_REPORT=str(out),
               PYTHONPATH=os.pathsep.join([str(ROOT / "python"), os.environ.get("PYTHONPATH", "")]))
    proc = subprocess.run([sys.executable, "-m", "pytest", "-c", str(ROOT / "pyproject.toml"), "--rootdir",
                           str(tmp_path), "-p", "no:cacheprovider", "-n", "2", "-q", str(package)], env=env,
                          cwd=str(tmp_path), capture_output=True, text=True, timeout=240)
    assert proc.returncode == 1, proc.stdout + proc.stderr  # one check failed
    doc = json.loads(out.read_text())
    assert doc["versions"]["gpu"] == ["0: NVIDIA H200 GPU-11111111-2222-3333-4444-555555555555 00000000:19:00.0 "
                                      "143771 MiB"]
    assert doc["checks"] == {
        "test_gpu_fake.py::test_records_facts_and_a_figure": {
            "outcome": "passed", "facts": {"text": "NCCL said this", "numbers": {"plain_ms": 0.5}},
            "figure": "1.235 s (the job)"},
        "test_gpu_fake.py::test_fails": {
            "outcome": "failed: AssertionError: the check's own words", "facts": {"before failing": 1}, "figure": None},
        "test_gpu_fake.py::test_alone_and_skipped": {"outcome": "skipped: no Ray here", "facts": {}, "figure": None},
    }, doc["checks"]
    # the table closes pytest's output
    tail = proc.stdout[proc.stdout.index("gpuguard GPU acceptance report"):]
    assert "test_gpu_fake.py::test_records_facts_and_a_figure  passed   1.235 s (the job)" in tail, tail
    assert "1 failed, 1 passed, 1 skipped" in tail, tail
