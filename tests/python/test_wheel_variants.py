"""A binary wheel's _libtorch variants (scripts/build_wheels.sh): the installed torch's minor picks its variant, and a
torch newer than every variant, another C++ ABI or a variant that cannot load gives the Python checks after one
warning, never a crash.

The wheel is unpacked into a temporary site-packages and driven by subprocesses of this interpreter and its torch:
- with the wheel: GPUGUARD_TEST_WHEEL names one built for this Python (CI: its --quick wheel, in the oldest and newest
  corners, after scripts/check_wheel_install.sh; the full build's wheels hold a variant for every torch minor, and
  this file, run beside torch 2.6, 2.11 and 2.15, shows each picks its own); skipped, saying so, without one;
- without one: the loader's choice from a package of this checkout's Python sources and a variant folder whose
  module is not a library.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from gg_testing.paths import ROOT
from gpuguard._libtorch_loader import SUFFIX, build_record_name

pytestmark = pytest.mark.follows_torch

WHEEL = os.environ.get("GPUGUARD_TEST_WHEEL")
IN_PYTHON = ("Until then, assert_same_device, same_device, guard and find_device_mismatch run in Python: the same "
             "checks and reports, but slower (about a millisecond a call on a model of a thousand tensors).")
WHEEL_FIX = ("install a gpuguard wheel built for this torch (scripts/build_wheels.sh builds one variant per torch "
             "minor), or build gpuguard from source against it (docs/building-and-testing.md): in a clone, pip "
             "install --no-build-isolation --force-reinstall --no-deps .")

# what the tensor checks answer, which module ran them, and every warning, as JSON on the last line
PROBE = """
import json, warnings
import torch
import gpuguard
from gpuguard.tensors.implementation import tensor_checks
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    model = torch.nn.Linear(4, 2)
    passed = str(gpuguard.assert_same_device(model, torch.ones(3, 4)))
    try:
        gpuguard.assert_same_device(model, torch.ones(3, 4, device="meta"))
        mismatch = None
    except gpuguard.DeviceMismatchError as err:
        mismatch = str(err).splitlines()[0]
    gpuguard.assert_same_device(model, torch.ones(3, 4))  # a second call warns no more
module = tensor_checks()
print(json.dumps({"passed": passed, "mismatch": mismatch, "module": module.__name__,
                  "file": getattr(module, "__file__", None), "torch": torch.__version__,
                  "built_for": gpuguard.TORCH_VERSION_BUILT_FOR,
                  "warnings": [str(w.message) for w in caught if w.category.__name__ == "GpuGuardWarning"]}))
"""


def _minor(version: str) -> tuple[int, int]:
    major, minor = re.match(r"(\d+)\.(\d+)", version).groups()
    return int(major), int(minor)


def _torch_version() -> str:
    import torch

    return str(torch.__version__)


def _run(site: Path, code: str, *args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, PYTHONPATH=str(site))
    return subprocess.run([sys.executable, "-c", code, *args], env=env, cwd=cwd, capture_output=True, text=True,
                          timeout=240)


def _probe(site: Path, cwd: Path) -> dict:
    proc = _run(site, PROBE, cwd=cwd)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _doctor(site: Path, cwd: Path) -> dict:
    proc = _run(site, "import sys; from gpuguard.cli import main; sys.exit(main(['doctor', '--json']))", cwd=cwd)
    assert proc.stdout.strip(), proc.stderr
    return json.loads(proc.stdout)


@pytest.fixture
def unpacked(tmp_path) -> Path:
    """The wheel of GPUGUARD_TEST_WHEEL, unpacked as pip would install its files: a site-packages folder."""
    if not WHEEL:
        pytest.skip("needs GPUGUARD_TEST_WHEEL: a wheel for this Python from scripts/build_wheels.sh (CI gives the "
                    "oldest and newest corners' --quick wheels)")
    tag = f"cp{sys.version_info[0]}{sys.version_info[1]}"
    # manylinux_2_28 or older: a wheel whose modules need less (_core alone, or beside torch 2.6's variant: glibc
    # 2.17) carries the older tags too, manylinux2014 first
    assert re.search(rf"-{tag}-{tag}-(manylinux2014|manylinux_2_\d+)_x86_64", Path(WHEEL).name), \
        f"{WHEEL} is not a manylinux wheel for {tag}"
    site = tmp_path / "site"
    with zipfile.ZipFile(WHEEL) as wheel:
        wheel.extractall(site)
    for built in site.glob("gpuguard/**/*.so"):
        built.chmod(0o755)
    return site


def _variants(site: Path) -> dict[str, str]:
    """Each variant folder of an unpacked wheel and the torch its record names."""
    found = {}
    for record in sorted((site / "gpuguard" / "_torch").glob(f"torch*_*/{build_record_name()}.py")):
        found[record.parent.name] = re.search(r'TORCH_VERSION = "([^"]+)"', record.read_text()).group(1)
    return found


def test_the_installed_torch_picks_its_own_variant_and_the_checks_run_in_cpp(unpacked, tmp_path):
    installed = _torch_version()
    major, minor = _minor(installed)
    variants = _variants(unpacked)
    if f"torch{major}_{minor}" not in variants:
        pytest.skip(f"the wheel has no variant for torch {installed} (scripts/build_wheels.sh left it out, naming "
                    f"why); it has {sorted(variants)}")
    facts = _probe(unpacked, tmp_path)
    assert facts["module"] == "gpuguard._libtorch" and facts["warnings"] == [], facts
    assert Path(facts["file"]) == (unpacked / "gpuguard" / "_torch" / f"torch{major}_{minor}" / f"_libtorch{SUFFIX}")
    assert facts["built_for"] == variants[f"torch{major}_{minor}"]
    assert facts["passed"] == "cpu" and facts["mismatch"].startswith("gpuguard: tensors that must share one device")
    doctor = _doctor(unpacked, tmp_path)
    assert doctor["versions"]["tensor checks"] == (f"C++ (gpuguard._libtorch, the wheel's variant for PyTorch "
                                                   f"{variants[f'torch{major}_{minor}']})")
    print(f"torch {installed}: variant {Path(facts['file']).parent.name} of {sorted(variants)}")


def _has_own_variant(site: Path) -> None:
    major, minor = _minor(_torch_version())
    if not (site / "gpuguard" / "_torch" / f"torch{major}_{minor}").is_dir():
        pytest.skip(f"the wheel has no variant for torch {_torch_version()} to relabel or alter")


def _relabel_as_older(site: Path) -> str:
    """Leaves the wheel one variant, this torch's, relabelled as built for the minor before: the installed torch is
    then newer than every variant the wheel has. Returns the relabelled version (2.14 under torch 2.15)."""
    installed = _torch_version()
    major, minor = _minor(installed)
    root = site / "gpuguard" / "_torch"
    ours = root / f"torch{major}_{minor}"
    for folder in root.glob("torch*_*"):  # the variants (beside them, the wheel's CONTENTS.txt)
        if folder != ours:
            shutil.rmtree(folder)
    older = f"{major}.{minor - 1}.0"
    record = ours / f"{build_record_name()}.py"
    record.write_text(re.sub(r'TORCH_VERSION = "[^"]+"', f'TORCH_VERSION = "{older}"', record.read_text()))
    ours.rename(root / f"torch{major}_{minor - 1}")
    return older


def test_a_torch_newer_than_every_variant_gets_the_python_checks_after_one_warning(unpacked, tmp_path):
    _has_own_variant(unpacked)
    older = _relabel_as_older(unpacked)
    installed = _torch_version()
    facts = _probe(unpacked, tmp_path)
    assert facts["module"] == "gpuguard.tensors._python_checks", facts
    assert facts["passed"] == "cpu" and facts["mismatch"].startswith("gpuguard: tensors that must share one device")
    assert facts["built_for"] is None
    assert facts["warnings"] == [
        f"gpuguard: this gpuguard wheel carries compiled tensor checks (gpuguard._libtorch) for PyTorch "
        f"{older.rsplit('.', 1)[0]}, none for PyTorch {installed}, which is installed. To have them: {WHEEL_FIX}\n"
        f"{IN_PYTHON}"], facts
    doctor = _doctor(unpacked, tmp_path)
    # doctor reads torch's version from its files (torch/version.py: 2.15.0+cu132), never importing it
    assert doctor["versions"]["tensor checks"] == f"Python (this wheel has no gpuguard._libtorch for PyTorch {installed})"
    finding = {f["code"]: f for f in doctor["findings"]}["no_variant_for_torch"]
    assert finding["severity"] == "warning" and finding["fix"].startswith("Install a gpuguard wheel built for this")


def test_a_variant_of_another_cxx_abi_is_not_loaded(unpacked, tmp_path):
    _has_own_variant(unpacked)
    installed = _torch_version()
    major, minor = _minor(installed)
    record = unpacked / "gpuguard" / "_torch" / f"torch{major}_{minor}" / f"{build_record_name()}.py"
    text = record.read_text()
    abi = int(re.search(r"TORCH_CXX11_ABI = (\d)", text).group(1))
    record.write_text(text.replace(f"TORCH_CXX11_ABI = {abi}", f"TORCH_CXX11_ABI = {1 - abi}"))
    facts = _probe(unpacked, tmp_path)
    assert facts["module"] == "gpuguard.tensors._python_checks", facts
    assert len(facts["warnings"]) == 1 and f"(_GLIBCXX_USE_CXX11_ABI={1 - abi}), but the torch installed here " \
        f"({installed}) uses _GLIBCXX_USE_CXX11_ABI={abi}, so they cannot load" in facts["warnings"][0], facts


def _source_package(site: Path) -> Path:
    """This checkout's Python sources alone, as a wheel without compiled modules would install them."""
    shutil.copytree(ROOT / "python" / "gpuguard", site / "gpuguard", ignore=shutil.ignore_patterns(
        "__pycache__", "*.so", "_build_info_*.py"))
    return site / "gpuguard"


def test_a_variant_that_cannot_load_gives_the_python_checks_and_names_why(tmp_path):
    installed = _torch_version()
    major, minor = _minor(installed)
    variant = _source_package(tmp_path / "site") / "_torch" / f"torch{major}_{minor}"
    variant.mkdir(parents=True)
    (variant / f"_libtorch{SUFFIX}").write_bytes(b"not a library")
    import torch

    abi = int(bool(torch._C._GLIBCXX_USE_CXX11_ABI))
    (variant / f"{build_record_name()}.py").write_text(f'TORCH_VERSION = "{installed}"\nTORCH_CXX11_ABI = {abi}\n')
    facts = _probe(tmp_path / "site", tmp_path)
    assert facts["module"] == "gpuguard.tensors._python_checks", facts
    assert facts["passed"] == "cpu" and facts["mismatch"] is not None
    [warning] = facts["warnings"]
    assert warning.startswith(f"gpuguard: this gpuguard wheel's compiled tensor checks for PyTorch {installed} "
                              f"failed to load under PyTorch {installed} ("), warning
    assert warning.endswith(f"To have them: {WHEEL_FIX}\n{IN_PYTHON}"), warning


CHOICE = """
import json, sys
from gpuguard._libtorch_loader import choice
print(json.dumps([[c.build and c.build.torch_version, c.code] for c in map(choice, sys.argv[1:])]))
"""


def test_variants_are_chosen_by_minor_and_a_source_build_by_exact_version(tmp_path):
    """A wheel's variant serves every patch release of its minor; none serves another minor. A source build's
    record still refuses another patch release."""
    package = _source_package(tmp_path / "wheel")
    for version in ("2.6.0+cu124", "2.15.0"):
        folder = package / "_torch" / f"torch2_{version.split('.')[1]}"
        folder.mkdir(parents=True)
        (folder / f"_libtorch{SUFFIX}").write_bytes(b"")
        (folder / f"{build_record_name()}.py").write_text(f'TORCH_VERSION = "{version}"\nTORCH_CXX11_ABI = 1\n')
    proc = _run(tmp_path / "wheel", CHOICE, "2.6.3", "2.15.1+cu132", "2.16.0", "2.5.1", cwd=tmp_path)
    assert json.loads(proc.stdout) == [["2.6.0+cu124", None], ["2.15.0", None], [None, "no_variant_for_torch"],
                                       [None, "no_variant_for_torch"]], proc.stderr
    source = _source_package(tmp_path / "source")
    (source / f"{build_record_name()}.py").write_text('TORCH_VERSION = "2.15.0"\nTORCH_CXX11_ABI = 1\n')
    proc = _run(tmp_path / "source", CHOICE, "2.15.0+cu132", "2.15.1", cwd=tmp_path)
    assert json.loads(proc.stdout) == [["2.15.0", None], [None, "torch_build_mismatch"]], proc.stderr
