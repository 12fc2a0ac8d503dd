"""Which NCCL gpuguard loads (gpuguard.system.nccl_library): torch's, not the loader's first libnccl.so.2, and doctor
naming both when they differ.

Two copies of the fake NCCL stand in for two NCCLs: NCCL 2.28.9 in a fake nvidia-nccl-cu13 wheel beside a fake
torch whose libtorch_cuda.so needs it through torch's DT_RPATH (tests/fakes: fake_libtorch_cuda.cc), and NCCL
2.28.3 on LD_LIBRARY_PATH, where a system NCCL is found first (on the lent GPU machine, /lib/x86_64-linux-gnu).
Both carry NCCL's soname, libnccl.so.2, as the real ones do.
"""

from __future__ import annotations

import importlib.metadata
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from gg_testing.env import FakeGpus
from gg_testing.procs import run_cli, run_python

SYSTEM_VERSION, WHEEL_VERSION = 22803, 22809
RPATH_RULE = "libtorch_cuda.so's DT_RPATH entry $ORIGIN/../../nvidia/nccl/lib"


class TwoNccls:
    """A fake site-packages (torch + the NCCL wheel) and a folder standing in for the system's libraries."""

    def __init__(self, root: Path, fakes: Path, *, torch: bool = True, cuda: str | None = "13.0") -> None:
        self.site = root / "site-packages"
        self.system = root / "system-lib"
        self.wheel_library = self.site / "nvidia" / "nccl" / "lib" / "libnccl.so.2"
        self.system_library = self.system / "libnccl.so.2"
        self.torch_cuda = self.site / "torch" / "lib" / "libtorch_cuda.so"
        for library, version in ((self.wheel_library, WHEEL_VERSION), (self.system_library, SYSTEM_VERSION)):
            library.parent.mkdir(parents=True)
            shutil.copy(fakes / "nccl-soname" / "libnccl.so.2", library)
            # the fake answers ncclGetVersion from the file beside it (tests/fakes/README.md)
            Path(str(library) + ".version").write_text(str(version))
        # a regular package, as the wheels make it: a namespace portion would lose to the real one of this venv
        (self.site / "nvidia" / "__init__.py").write_text("")
        dist_info = self.site / "nvidia_nccl_cu13-2.28.9.dist-info"
        dist_info.mkdir()
        (dist_info / "METADATA").write_text("Metadata-Version: 2.1\nName: nvidia-nccl-cu13\nVersion: 2.28.9\n")
        (dist_info / "RECORD").write_text("nvidia/nccl/lib/libnccl.so.2,,\n")
        if torch:
            self.torch_cuda.parent.mkdir(parents=True)
            shutil.copy(fakes / "fake-torch-lib" / "libtorch_cuda.so", self.torch_cuda)
            # importing it would be the bug: gpuguard reads torch's files
            (self.site / "torch" / "__init__.py").write_text(
                "raise ImportError('test_nccl_library: gpuguard imported the fake torch')\n")
            (self.site / "torch" / "version.py").write_text(
                f"__version__ = '2.15.0+cu130'\ncuda = {cuda!r}\n")

    def env(self, fake_gpus: FakeGpus, **extra: str) -> dict[str, str]:
        env = fake_gpus.env("h100x1", LD_LIBRARY_PATH=str(self.system), **extra)
        if "GPUGUARD_LIBNCCL" not in extra:
            env.pop("GPUGUARD_LIBNCCL", None)
        env["PYTHONPATH"] = os.pathsep.join([str(self.site), env["PYTHONPATH"]])
        return env


@pytest.fixture
def two_nccls(tmp_path: Path, fakes_dir: Path) -> TwoNccls:
    return TwoNccls(tmp_path, fakes_dir)


# What a process holds once gpuguard loaded NCCL and then "torch" (the fake libtorch_cuda.so) loaded: the NCCL each
# answered from, and every libnccl.so.2 mapped.
LOAD_GPUGUARD_THEN_TORCH = """
    import ctypes, json
    from gpuguard.system.nccl_library import nccl_status
    st = nccl_status()
    torch_cuda = ctypes.CDLL({torch_cuda!r})
    with open("/proc/self/maps") as f:
        mapped = sorted({{line.split()[-1] for line in f if line.rstrip().endswith("libnccl.so.2")}})
    print(json.dumps({{"gpuguard": st.as_dict(), "torch": torch_cuda.gpuguardFakeTorchNcclVersion(),
                      "mapped": mapped}}))
"""


def test_gpuguard_loads_the_nccl_wheel_beside_torch_not_the_loaders_first(fake_gpus, two_nccls):
    proc = run_python(LOAD_GPUGUARD_THEN_TORCH.format(torch_cuda=str(two_nccls.torch_cuda)), two_nccls.env(fake_gpus))
    out = json.loads(proc.stdout)
    assert out["gpuguard"]["library"] == str(two_nccls.wheel_library)
    assert out["gpuguard"]["found_by"] == f"torch's NCCL ({RPATH_RULE})"
    assert out["gpuguard"]["version_string"] == "2.28.9" and out["gpuguard"]["reason"] == ""
    # torch, loaded after gpuguard, uses the same copy: one NCCL in the process
    assert out["torch"] == WHEEL_VERSION
    assert out["mapped"] == [str(two_nccls.wheel_library)]


def test_a_copy_gpuguard_loads_first_is_the_one_torch_then_binds_to(fake_gpus, two_nccls):
    """Why the choice matters beyond gpuguard's own probes (doctor's warning says so): the dynamic loader hands
    torch's DT_NEEDED libnccl.so.2 the copy already loaded, whatever torch's DT_RPATH names."""
    env = two_nccls.env(fake_gpus, GPUGUARD_LIBNCCL=str(two_nccls.system_library))
    out = json.loads(run_python(LOAD_GPUGUARD_THEN_TORCH.format(torch_cuda=str(two_nccls.torch_cuda)), env).stdout)
    assert out["gpuguard"]["found_by"] == "$GPUGUARD_LIBNCCL"
    assert out["gpuguard"]["version_string"] == "2.28.3"
    assert out["torch"] == SYSTEM_VERSION
    assert out["mapped"] == [str(two_nccls.system_library)]


def test_a_copy_already_in_the_process_comes_before_torchs_files(fake_gpus, two_nccls):
    code = f"""
        import ctypes, json
        ctypes.CDLL({str(two_nccls.system_library)!r})  # another library's NCCL, loaded before gpuguard's first call
        from gpuguard.system.nccl_library import nccl_status
        print(json.dumps(nccl_status().as_dict()))
    """
    st = json.loads(run_python(code, two_nccls.env(fake_gpus)).stdout)
    assert st["found_by"] == "already loaded in this process" and st["already_in_process"] is True
    assert st["library"] == str(two_nccls.system_library) and st["version_string"] == "2.28.3"


def test_a_torch_nccl_that_does_not_load_is_passed_over_saying_why(fake_gpus, two_nccls):
    two_nccls.wheel_library.write_bytes(b"not a shared object")
    code = "import json; from gpuguard.system.nccl_library import nccl_status; print(json.dumps(nccl_status().as_dict()))"
    st = json.loads(run_python(code, two_nccls.env(fake_gpus)).stdout)
    assert st["library"] == str(two_nccls.system_library) and st["version_string"] == "2.28.3"
    assert st["found_by"].startswith(f"the dynamic loader's search for libnccl.so.2 (torch's NCCL ({RPATH_RULE}) "
                                     f"did not load: {two_nccls.wheel_library}: ")


def test_without_a_cuda_torch_the_installed_nccl_wheel_comes_before_the_loaders_search(fake_gpus, tmp_path,
                                                                                         fakes_dir):
    cpu_torch = TwoNccls(tmp_path, fakes_dir, cuda=None)
    code = "import json; from gpuguard.system.nccl_library import nccl_status; print(json.dumps(nccl_status().as_dict()))"
    st = json.loads(run_python(code, cpu_torch.env(fake_gpus)).stdout)
    assert st["library"] == str(cpu_torch.wheel_library) and st["version_string"] == "2.28.9"
    assert st["found_by"] == "the nvidia-nccl-cu13 wheel (torch is a CPU-only build)"


def test_a_torch_whose_rpath_holds_no_nccl_takes_it_from_ld_library_path_and_so_does_gpuguard(fake_gpus, two_nccls):
    shutil.rmtree(two_nccls.site / "nvidia")
    code = "import json; from gpuguard.system.nccl_library import nccl_status; print(json.dumps(nccl_status().as_dict()))"
    st = json.loads(run_python(code, two_nccls.env(fake_gpus)).stdout)
    assert st["library"] == str(two_nccls.system_library)
    assert st["found_by"] == (f"torch's NCCL (LD_LIBRARY_PATH entry {two_nccls.system}, searched for "
                              "libtorch_cuda.so's libnccl.so.2)")


def test_without_torch_or_a_wheel_gpuguard_takes_the_loaders_first_libnccl(fake_gpus, tmp_path, fakes_dir):
    no_torch = TwoNccls(tmp_path, fakes_dir, torch=False)
    shutil.rmtree(no_torch.site / "nvidia")
    code = "import json; from gpuguard.system.nccl_library import nccl_status; print(json.dumps(nccl_status().as_dict()))"
    # -S: no site-packages, so neither this venv's torch nor its NCCL wheel
    proc = subprocess.run([sys.executable, "-S", "-c", code], env=no_torch.env(fake_gpus), capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    st = json.loads(proc.stdout)
    assert st["library"] == str(no_torch.system_library)
    assert st["found_by"] == "the dynamic loader's search for libnccl.so.2"


# ---- gpuguard doctor ------------------------------------------------------------------------------------------

def test_doctor_names_both_nccls_and_flags_that_they_differ(fake_gpus, two_nccls):
    env = two_nccls.env(fake_gpus, GPUGUARD_LIBNCCL=str(two_nccls.system_library))
    proc = run_cli(["doctor"], env)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    lines = proc.stdout.splitlines()
    assert f"NCCL (gpuguard's): 2.28.3 ({two_nccls.system_library}, $GPUGUARD_LIBNCCL)" in lines
    assert (f"NCCL (torch's): 2.28.9 ({two_nccls.wheel_library}, its nvidia-nccl-cu13 wheel, {RPATH_RULE})"
            in lines)
    assert (f"warning: gpuguard's NCCL is not torch's: gpuguard loaded NCCL 2.28.3 from {two_nccls.system_library} "
            f"($GPUGUARD_LIBNCCL), but torch loads NCCL 2.28.9 from {two_nccls.wheel_library}. The job's collectives "
            "run on torch's, so gpuguard's NCCL checks (verify_nccl, doctor --nccl, the unique-id exchange) test a "
            "library the job does not use. And where gpuguard loads its copy first in a process (bind() before "
            "import torch), torch binds to that copy instead of its own: the dynamic loader reuses a loaded "
            "libnccl.so.2.") in lines
    assert f"  fix: Unset GPUGUARD_LIBNCCL, or set it to torch's: export GPUGUARD_LIBNCCL={two_nccls.wheel_library}" \
        in lines

    doc = json.loads(run_cli(["doctor", "--json"], env).stdout)
    libraries = doc["nccl_libraries"]
    assert libraries["same"] is False
    assert libraries["gpuguard"]["library"] == str(two_nccls.system_library)
    assert libraries["gpuguard"]["version"] == SYSTEM_VERSION
    assert libraries["torch"] == {"library": str(two_nccls.wheel_library), "version": "2.28.9",
                                  "wheel": "nvidia-nccl-cu13", "how": RPATH_RULE, "static": False}
    assert doc["versions"]["NCCL (torch's)"] in proc.stdout and doc["versions"]["NCCL (gpuguard's)"] in proc.stdout
    finding = {f["code"]: f for f in doc["findings"]}["nccl_not_torchs"]
    assert finding["severity"] == "warning" and f"warning: {finding['message']}" in lines


def test_doctor_shows_one_nccl_when_gpuguard_loads_torchs(fake_gpus, two_nccls):
    doc = json.loads(run_cli(["doctor", "--json"], two_nccls.env(fake_gpus)).stdout)
    wheel = str(two_nccls.wheel_library)
    assert doc["versions"]["NCCL (gpuguard's)"] == f"2.28.9 ({wheel}, torch's NCCL ({RPATH_RULE}))"
    assert doc["versions"]["NCCL (torch's)"] == f"2.28.9 ({wheel}, its nvidia-nccl-cu13 wheel, {RPATH_RULE})"
    assert doc["nccl_libraries"]["same"] is True
    assert "nccl_not_torchs" not in {f["code"] for f in doc["findings"]}


def test_doctor_says_how_to_mend_a_torch_nccl_that_does_not_load(fake_gpus, two_nccls):
    two_nccls.wheel_library.write_bytes(b"not a shared object")
    doc = json.loads(run_cli(["doctor", "--json"], two_nccls.env(fake_gpus)).stdout)
    finding = {f["code"]: f for f in doc["findings"]}["nccl_not_torchs"]
    assert finding["message"].startswith(f"gpuguard's NCCL is not torch's: gpuguard loaded NCCL 2.28.3 from "
                                         f"{two_nccls.system_library} (the dynamic loader's search for libnccl.so.2 "
                                         f"(torch's NCCL ({RPATH_RULE}) did not load: {two_nccls.wheel_library}: ")
    assert finding["fix"] == (f"Check that {two_nccls.wheel_library} loads (its error is quoted above); reinstall "
                              "torch's NCCL wheel (nvidia-nccl-cu13) if it does not.")


# ---- the torch installed here -----------------------------------------------------------------------------------

@pytest.mark.follows_torch  # where each torch release's wheel puts its NCCL, and how libtorch_cuda.so finds it
def test_torchs_nccl_read_from_its_files_is_the_one_torch_loads():
    """Against the real torch of this interpreter: the file and version read from libtorch_cuda.so and the wheel's
    metadata are what torch itself loads and reports."""
    from gpuguard.system.installed_torch import installed_torch
    from gpuguard.system.nccl_library import torch_nccl, wheel_version_of

    installed = installed_torch()
    if installed is None or installed.cuda is None:
        pytest.skip("torch is not installed here, or is a CPU-only build: it has no NCCL to find")
    found = torch_nccl(installed)
    assert found is not None and found.library is not None, found
    assert found.library == os.path.join(os.path.dirname(installed.location), "nvidia", "nccl", "lib", "libnccl.so.2")
    assert found.how == RPATH_RULE
    wheel = wheel_version_of(found.library)
    assert wheel is not None and wheel[1] == importlib.metadata.version(wheel[0])
    import torch
    import torch.cuda.nccl
    assert ".".join(map(str, torch.cuda.nccl.version())) == wheel[1].split(".post")[0]
    with open("/proc/self/maps") as f:
        mapped = {line.split()[-1] for line in f if "libnccl.so" in line}
    assert {os.path.realpath(p) for p in mapped} == {os.path.realpath(found.library)}, sys.modules["torch"].__file__
