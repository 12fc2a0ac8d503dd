"""The supported range and what differs inside it: README.md, docs/versions.md and pyproject.toml state
supported_versions.py's range, and docs/versions.md CI's corners;
a version below it gets a clear message (Python at import, torch at build, Ray at gpuguard's first Ray call); notes
print alike on every Python; a module that links but cannot load fails the build that made it."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import sysconfig
import traceback
import types
from pathlib import Path

import pytest

from gg_testing.paths import ROOT
from gg_testing.procs import SNIPPET_TIMEOUT_S
from gpuguard import errors, supported_versions as sv
from gpuguard.errors import DuplicateDeviceError, add_note, format_exception


def text(version: tuple[int, int]) -> str:
    return f"{version[0]}.{version[1]}"


# ---- the range, stated where users read it ------------------------------------------------------------------

def test_readme_and_pyproject_state_the_range_of_supported_versions_py():
    versions = (ROOT / "docs" / "versions.md").read_text()
    for name, (oldest, newest) in (("Python", sv.PYTHON), ("PyTorch", sv.TORCH), ("Ray (optional)", sv.RAY)):
        assert re.search(rf"^\| {re.escape(name)} \| {text(oldest)} \| {text(newest)} \|", versions, re.M), name
    assert f"On Python 3.13, Ray publishes wheels from {text(sv.RAY_FOR_PYTHON_3_13)}." in versions
    readme = (ROOT / "README.md").read_text()
    assert f"{sv.stated('Python')}, {sv.stated('PyTorch')}, {sv.stated('Ray')} (optional)" in readme
    pyproject = (ROOT / "pyproject.toml").read_text()
    assert f'requires-python = ">={text(sv.PYTHON[0])}"' in pyproject
    assert f'dependencies = ["torch>={text(sv.TORCH[0])}"]' in pyproject
    assert f'ray = ["ray[default]>={text(sv.RAY[0])}"]' in pyproject
    for minor in range(sv.PYTHON[0][1], sv.PYTHON[1][1] + 1):
        assert f'"Programming Language :: Python :: 3.{minor}"' in pyproject
    assert f"Python {text(sv.PYTHON[0])} to {text(sv.PYTHON[1])}, PyTorch {text(sv.TORCH[0])} to " \
           f"{text(sv.TORCH[1])}, Ray {text(sv.RAY[0])} to {text(sv.RAY[1])}" in pyproject


def test_ci_corners_are_the_ends_of_the_range():
    run = (ROOT / ".ci" / "run").read_text()
    assert f".ci/venv.sh {text(sv.PYTHON[0])} torch=={text(sv.TORCH[0])}.0 'ray[default,train]=={text(sv.RAY[0])}.0'" \
        in run
    assert f"torch=={text(sv.TORCH[1])}.0 'ray[default,train]=={text(sv.RAY[1])}.0'" in run


def test_docs_state_cis_corners_as_ci_runs_them():
    """docs/versions.md's table of corners against the venvs .ci/run makes: one row per corner, the same pins."""
    run = (ROOT / ".ci" / "run").read_text()
    made = {name: (python, torch, ray or "none") for name, python, torch, ray in re.findall(
        r"make_venv (oldest|middle|newest) \\?\s*bash \.ci/venv\.sh (3\.\d+) torch==([\d.]+)"
        r"(?: 'ray\[default,train\]==([\d.]+)')?", run)}
    assert set(made) == {"oldest", "middle", "newest"}, made
    versions = (ROOT / "docs" / "versions.md").read_text()
    stated = {name: (python, torch, ray) for name, python, torch, ray in re.findall(
        r"^\| (oldest|middle|newest) \| (3\.\d+) \| ([\d.]+)[^|]* \| ([\d.]+|none) \|$", versions, re.M)}
    assert stated == made
    newest_in_ci = max(tuple(int(part) for part in python.split(".")) for python, _, _ in made.values())
    assert newest_in_ci == sv.PYTHON_NEWEST_IN_CI  # python_problem() names it as tested
    if sv.PYTHON[1] > newest_in_ci:  # a supported Python that no corner runs is said to be untested
        assert f"Python {text(sv.PYTHON[1])} is in no corner" in versions


def test_releases_compare_by_major_and_minor():
    assert sv.release("2.6.0+cu124") == (2, 6) and sv.release("2.43.0rc1") == (2, 43) and sv.release("3") == (3, 0)
    assert sv.torch_problem("2.6.0+cu124") is None and sv.torch_problem("2.15.1") is None
    assert sv.torch_problem("2.5.1") == (
        "gpuguard supports PyTorch 2.6 to 2.15; this Python has torch 2.5.1. Upgrade it (pip install 'torch>=2.6'), "
        "then build gpuguard again against it.")
    assert sv.newer("PyTorch", "2.16.0") == (
        "PyTorch 2.16.0 is newer than gpuguard has been tested with (PyTorch 2.6 to 2.15); it should work, and "
        "gpuguard doctor reports what it can check.")
    assert sv.newer("PyTorch", "2.15.0") is None and sv.ray_problem("2.43.0") is None


# ---- below the range: clear messages --------------------------------------------------------------------------

def test_python_39_is_refused_at_import_naming_the_range():
    python39 = sorted(Path(os.path.expanduser("~/.pyenv/versions")).glob("3.9.*/bin/python"))
    if not python39:
        pytest.skip("no Python 3.9 under pyenv to try the import with")
    proc = subprocess.run([str(python39[-1]), "-c", "import gpuguard"], capture_output=True, text=True, timeout=60,
                          env={**os.environ, "PYTHONPATH": str(ROOT / "python")})
    assert proc.returncode == 1
    assert proc.stderr.strip().splitlines()[-1] == (
        "ImportError: gpuguard needs Python 3.10 or newer: it supports Python 3.10 to 3.13 (CI tests 3.10 to 3.12); "
        "this is Python 3.9. Use a newer interpreter (for example a venv made with python3.12).")


def test_the_build_refuses_a_torch_below_the_range(tmp_path):
    """cmake/torch_build_flags.py (CMake's source of torch's facts) against a torch 2.4.1 stand-in."""
    fake = tmp_path / "torch"
    (fake / "utils").mkdir(parents=True)
    (fake / "__init__.py").write_text("__version__ = '2.4.1+cu121'\nclass _C:\n    _GLIBCXX_USE_CXX11_ABI = False\n")
    (fake / "utils" / "__init__.py").write_text("")
    (fake / "utils" / "cpp_extension.py").write_text("def include_paths(): return []\ndef library_paths(): return []\n")
    proc = subprocess.run([sys.executable, str(ROOT / "cmake" / "torch_build_flags.py"), "--cmake"],
                          capture_output=True, text=True, timeout=60, env={**os.environ, "PYTHONPATH": str(tmp_path)})
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr.strip() == ("gpuguard supports PyTorch 2.6 to 2.15; this Python has torch 2.4.1+cu121. Upgrade "
                                   "it (pip install 'torch>=2.6'), then build gpuguard again against it.")


def test_the_build_reads_abi_and_pybind11_flags_from_the_torch_it_builds_against():
    import torch

    proc = subprocess.run([sys.executable, str(ROOT / "cmake" / "torch_build_flags.py"), "--cmake"],
                          capture_output=True, text=True, timeout=SNIPPET_TIMEOUT_S)
    assert proc.returncode == 0, proc.stderr
    facts = dict(line.split("=", 1) for line in proc.stdout.splitlines())
    assert facts["TORCH_CXX11_ABI"] == str(int(torch._C._GLIBCXX_USE_CXX11_ABI))
    assert facts["TORCH_VERSION"] == torch.__version__
    expected = [f'PYBIND11_{n}="{getattr(torch._C, f"_PYBIND11_{n}")}"' for n in ("COMPILER_TYPE", "STDLIB", "BUILD_ABI")
                if getattr(torch._C, f"_PYBIND11_{n}", None) is not None]
    assert facts["TORCH_PYBIND11_DEFINITIONS"] == "|".join(expected)


def test_an_older_ray_is_named_at_gpuguards_first_ray_call(monkeypatch):
    from gpuguard.errors import RayPlacementError, RayRendezvousError
    from gpuguard.ray import placement, store

    monkeypatch.setitem(sys.modules, "ray", types.SimpleNamespace(__version__="2.40.0"))
    expected = ("gpuguard's Ray integration supports Ray 2.43 to 2.60; this Python has Ray 2.40.0. Upgrade it: pip "
                "install 'ray[default]>=2.43'.")
    with pytest.raises(RayPlacementError) as placed:
        placement._ray()
    with pytest.raises(RayRendezvousError) as met:
        store._ray()
    assert str(placed.value) == str(met.value) == expected and placed.value.ray_version == "2.40.0"


def test_ray_train_v1_is_recognised_from_its_frames():
    """Ray 2.43's default Ray Train (V1) forms the group from ray.train.torch.config, before any train context."""
    from gpuguard.ray.store import in_ray_train_worker

    assert not in_ray_train_worker()
    namespace = {"__name__": "ray.train.torch.config", "check": in_ray_train_worker}
    exec("def _setup_torch_process_group():\n    return check()\n", namespace)
    assert namespace["_setup_torch_process_group"]() is True


# ---- notes, alike on every Python -------------------------------------------------------------------------------

def _chained() -> BaseException:
    try:
        try:
            raise KeyError("inner")
        except KeyError as inner:
            add_note(inner, "note on the cause")
            raise ValueError("outer") from inner
    except ValueError as outer:
        add_note(outer, "first note")
        add_note(outer, "second note")
        return outer


def test_add_note_keeps_notes_where_python_does():
    exc = _chained()
    assert exc.__notes__ == ["first note", "second note"] and exc.__cause__.__notes__ == ["note on the cause"]
    with pytest.raises(TypeError, match="a note must be a str, not int"):
        add_note(exc, 3)  # type: ignore[arg-type]


@pytest.mark.skipif(not errors.NOTES_PRINTED_BY_PYTHON, reason="compares with Python 3.11+'s own printing")
def test_the_310_formatting_prints_what_311_prints(monkeypatch):
    """errors.format_exception's own path (taken on 3.10) against Python's printing of notes, chains included."""
    exc = _chained()
    python = traceback.format_exception(type(exc), exc, exc.__traceback__)
    monkeypatch.setattr(errors, "NOTES_PRINTED_BY_PYTHON", False)
    ours = format_exception(type(exc), exc, exc.__traceback__)
    assert "".join(ours) == "".join(python)
    assert "first note\nsecond note\n" in "".join(ours) and "note on the cause\n" in "".join(ours)


def test_notes_are_printed_once_under_the_message_on_this_python():
    err = DuplicateDeviceError("2 ranks of group 'default' share 1 GPU.\nFix: start at most 1 process",
                               fix="Fix: start at most 1 process")
    add_note(err, "gpuguard (auto, at init_process_group): rank 1 is on cuda:0")
    printed = "".join(format_exception(type(err), err, None))
    assert printed.endswith("gpuguard.errors.DuplicateDeviceError: 2 ranks of group 'default' share 1 GPU.\n"
                            "Fix: start at most 1 process\n"
                            "gpuguard (auto, at init_process_group): rank 1 is on cuda:0\n")
    assert printed.count("rank 1 is on cuda:0") == 1
    assert err.without_fix() == "2 ranks of group 'default' share 1 GPU."


# ---- a build that cannot load does not complete ------------------------------------------------------------

UNLOADABLE = """
#include <Python.h>
namespace other_abi { int missing(); }  // defined nowhere: as a symbol of another C++ ABI would be
static struct PyModuleDef def = {PyModuleDef_HEAD_INIT, "_libtorch", nullptr, -1, nullptr};
PyMODINIT_FUNC PyInit__libtorch() { other_abi::missing(); return PyModule_Create(&def); }
"""


def test_a_module_that_links_but_cannot_load_fails_the_build_and_is_removed(tmp_path):
    source = tmp_path / "unloadable.cc"
    source.write_text(UNLOADABLE)
    module = tmp_path / f"_libtorch{sysconfig.get_config_var('EXT_SUFFIX')}"
    subprocess.run(["g++", "-shared", "-fPIC", f"-I{sysconfig.get_paths()['include']}", str(source), "-o", str(module)],
                   check=True, timeout=120)
    proc = subprocess.run([sys.executable, str(ROOT / "cmake" / "check_module_loads.py"), str(module),
                           "gpuguard._libtorch"], capture_output=True, text=True, timeout=SNIPPET_TIMEOUT_S)
    assert proc.returncode == 1 and not module.exists()
    assert proc.stderr.startswith(f"gpuguard: the module just built, {module}, cannot be loaded by {sys.executable}: "
                                  f"ImportError: ")
    assert "undefined symbol: _ZN9other_abi7missingEv" in proc.stderr
    assert "It was removed. A part of the build was compiled for another C++ ABI or another torch" in proc.stderr
