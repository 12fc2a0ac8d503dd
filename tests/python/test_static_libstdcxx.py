"""A gpuguard built with a statically linked libstdc++ (scripts/build_toolchains.sh static-libstdc++) is safe in
torch's process: its modules export only PyInit_, and gpuguard, bind(), torch's iostream formatting and a watch()
stall report run in one process without a crash. Also: cmake/check_module_exports.py, which fails a build whose
module exports more, names the symbols and the cause."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from gg_testing.env import scrubbed
from gg_testing.launch import torchrun
from gg_testing.paths import ROOT

sys.path.insert(0, str(ROOT / "cmake"))
import check_module_exports  # noqa: E402

SITE = os.environ.get("GPUGUARD_STATIC_LIBSTDCXX_SITE")
needs_static_build = pytest.mark.skipif(
    not SITE, reason="GPUGUARD_STATIC_LIBSTDCXX_SITE is not set: `scripts/build_toolchains.sh static-libstdc++` "
                     "builds gpuguard with -static-libstdc++ and runs this file against it")
WORKER = Path(__file__).with_name("static_libstdcxx_worker.py")
READELF = shutil.which("readelf")


def modules() -> list[Path]:
    found = sorted(Path(SITE, "gpuguard").glob("_*.so"))
    assert {p.name.split(".")[0] for p in found} == {"_core", "_libtorch"}, found
    return found


@needs_static_build
def test_each_module_links_libstdcxx_statically_and_exports_only_pyinit():
    for module in modules():
        needed = subprocess.run([READELF, "--dynamic", "--wide", str(module)], check=True, capture_output=True,
                                text=True).stdout
        # the build this file is about: no shared libstdc++ of its own, so the one inside must stay private
        assert "libstdc++.so" not in needed, f"{module.name} needs a shared libstdc++: not a static build"
        exported = [name for name, _ in check_module_exports.exported_symbols(READELF, str(module))]
        assert exported == [f"PyInit_{module.name.split('.')[0]}"], exported[:20]


@needs_static_build
@pytest.mark.timeout(300)
def test_bind_torch_iostreams_and_a_stall_report_run_in_one_process(fake_gpus, tmp_path):
    reports = tmp_path / "reports"
    reports.mkdir()
    env = scrubbed(fake_gpus.env("h100x8", GPUGUARD_FAKE_NCCL_DIR=str(tmp_path / "nccl"), PYTHONPATH=SITE,
                                 WATCH_DIR=str(reports), TORCH_NCCL_TRACE_BUFFER_SIZE="2000"))
    job = torchrun(str(WORKER), "3", nproc=2, env=env, workdir=tmp_path / "job", timeout=280)
    output = job.output
    died = [line for line in output.splitlines() if "Signal" in line or "SIGSEGV" in line or "exitcode" in line]
    assert job.returncode == 0, f"the job failed ({job.returncode}): {died}\n{output[-6000:]}"
    for rank in (0, 1):
        assert f"gpuguard: rank {rank}/2 local {rank}/2 node 0 -> cuda:{rank}" in output, output[-6000:]
        assert f"rank {rank}: done, 1 reports" in output, output[-6000:]
    assert "schema: aten::add.Tensor(Tensor self, Tensor other, *, Scalar alpha=1) -> Tensor" in output
    assert "torch error: The size of tensor a (2) must match the size of tensor b (3) at non-singleton dimension 0" \
        in output
    assert "[rank 0] gpuguard: collective stall:" in output, output[-6000:]
    assert "rank 1 never entered ALL_REDUCE #2 on group 'default_pg' (ranks 0, 1)" in output, output[-6000:]
    assert len(list(reports.glob("gpuguard-stall-rank*-pid*.json"))) == 2


@pytest.mark.skipif(not READELF or not shutil.which("g++"), reason="needs g++ and readelf (binutils)")
def test_the_export_check_names_a_static_libstdcxxs_symbols_and_their_cause(tmp_path):
    """What a module built before the version script looked like: a statically linked libstdc++'s locale machinery
    and GNU unique facet ids in its dynamic symbol table."""
    source = tmp_path / "leaky.cc"
    source.write_text('#include <sstream>\n#include <string>\n'
                      'extern "C" __attribute__((visibility("default"))) void* PyInit_leaky() {\n'
                      '  std::ostringstream s; s << 42ul; static std::string kept = s.str(); return &kept; }\n')
    module = tmp_path / "leaky.so"
    subprocess.run(["g++", "-shared", "-fPIC", "-fvisibility=hidden", "-static-libstdc++", "-static-libgcc",
                    str(source), "-o", str(module)], check=True)
    proc = subprocess.run([sys.executable, str(ROOT / "cmake" / "check_module_exports.py"), READELF, str(module),
                           "gpuguard.leaky"], capture_output=True, text=True)
    assert proc.returncode == 1
    assert f"gpuguard: the module just built, {module}, exports " in proc.stderr
    assert " symbol(s) besides PyInit_leaky:" in proc.stderr
    assert "from GNU unique: the dynamic loader merges it across the whole process, even under RTLD_LOCAL, so other " \
           "libraries use this module's copy" in proc.stderr
    assert re.search(r"\n    exports (guard variable for )?std::\S.*::(id|intl) \(unique\)\n", proc.stderr), proc.stderr
    counts = re.search(r"In all: (\d+) GNU unique, (\d+) naming std::locale\.", proc.stderr)
    assert counts and int(counts[1]) > 0 and int(counts[2]) > 0, proc.stderr
    assert "It was removed. Such a module can crash the process it is imported into." in proc.stderr
    assert not module.exists()


@pytest.mark.skipif(not READELF or not shutil.which("g++"), reason="needs g++ and readelf (binutils)")
def test_the_export_check_passes_a_module_linked_with_the_version_script(tmp_path):
    source = tmp_path / "private.cc"
    source.write_text('#include <sstream>\n#include <string>\n'
                      'extern "C" __attribute__((visibility("default"))) void* PyInit_private() {\n'
                      '  std::ostringstream s; s << 42ul; static std::string kept = s.str(); return &kept; }\n')
    script = tmp_path / "private.map"
    script.write_text("{\n  global: PyInit_private;\n  local: *;\n};\n")
    module = tmp_path / "private.so"
    subprocess.run(["g++", "-shared", "-fPIC", "-fvisibility=hidden", "-static-libstdc++", "-static-libgcc",
                    f"-Wl,--version-script={script}", "-Wl,--exclude-libs,ALL", str(source), "-o", str(module)],
                   check=True)
    proc = subprocess.run([sys.executable, str(ROOT / "cmake" / "check_module_exports.py"), READELF, str(module),
                           "gpuguard.private"], capture_output=True, text=True)
    assert (proc.returncode, proc.stderr) == (0, "")
    assert module.exists()
