#!/usr/bin/env bash
# Sets up a fresh machine for gpuguard: build tools (Debian packages), torch, Ray (with its Jobs API and Ray
# Train, which the tests drive) and the build's and tests' tools (PyPI: pyproject.toml's dependency groups), then
# builds and installs gpuguard against the installed torch. Safe to run again.
#   PYTHON=...            the interpreter (a venv's) to install into (default python3)
#   GPUGUARD_TORCH / GPUGUARD_RAY   what to ask pip for (default the supported floors: torch>=2.6,
#                         ray[default,train]>=2.43; an installed version in the range is kept)
#   GPUGUARD_BUILD_TYPE   CMake build type of the installed modules (default RelWithDebInfo, as scripts/test.sh)
#   GPUGUARD_CPP_TESTS=0  leave the C++ tests out of the shared build folder (the fakes are built either way)
#   GPUGUARD_SETUP_GROUPS the optional dependency groups of pyproject.toml to install besides build and test
#                         (default: scale-simulation frameworks; the tests that need one skip without it)
#   scripts/setup.sh --system-only    the Debian packages alone (CI, before it makes its venvs)
set -euo pipefail
cd "$(dirname "$0")/.."

need_apt=()
command -v cmake >/dev/null || need_apt+=(cmake)
command -v ninja >/dev/null || need_apt+=(ninja-build)
command -v g++ >/dev/null || need_apt+=(g++)
[ -f /usr/include/gtest/gtest.h ] || need_apt+=(libgtest-dev)
command -v clang++ >/dev/null || need_apt+=(clang)
# clang's libc++ (scripts/build_toolchains.sh clang-libc++: the second standard library CI builds with)
dpkg -s libc++-dev libc++abi-dev >/dev/null 2>&1 || need_apt+=(libc++-dev libc++abi-dev)
command -v ccache >/dev/null || need_apt+=(ccache)
# the real-cluster tests (tests/cluster): SLURM, munge, Open MPI, MPICH, and ip for the namespaces' links
command -v slurmd >/dev/null || need_apt+=(slurm-wlm)
command -v munged >/dev/null || need_apt+=(munge)
command -v ompi_info >/dev/null || need_apt+=(openmpi-bin libopenmpi-dev)
command -v mpiexec.hydra >/dev/null || need_apt+=(mpich)
command -v ip >/dev/null || need_apt+=(iproute2)
if [ ${#need_apt[@]} -gt 0 ]; then
  if [ "$(id -u)" = 0 ]; then
    echo "setup: installing Debian packages: ${need_apt[*]}"
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need_apt[@]}" >/dev/null
  else
    echo "setup: please install these Debian packages first: ${need_apt[*]}" >&2
    exit 1
  fi
fi
[ "${1:-}" = "--system-only" ] && exit 0

PY=${PYTHON:-python3}
# The build's and the tests' tools come from pyproject.toml's dependency groups, the one list CI installs too;
# `pip install --group` needs pip 25.1 or newer.
"$PY" -m pip install -q --disable-pip-version-check "pip>=25.1"
groups=()
for group in build test ${GPUGUARD_SETUP_GROUPS-scale-simulation frameworks}; do groups+=(--group "$group"); done
"$PY" -m pip install -q --disable-pip-version-check \
  "${GPUGUARD_TORCH:-torch>=2.6}" "${GPUGUARD_RAY:-ray[default,train]>=2.43}" numpy "${groups[@]}"
# --no-build-isolation: gpuguard._libtorch must be compiled against the torch installed above (its ABI and version).
# The build folder is the one scripts/test.sh builds in (build/dev for the default python3, build/dev-<tag> for
# another PYTHON), configured as test.sh configures it (the fakes, the C++ tests unless GPUGUARD_CPP_TESTS=0, the
# modules also written in place): test.sh after setup.sh then compiles nothing a second time.
tag=$("$PY" -c 'import sys, importlib.metadata as m; v = m.version("torch").split("+")[0]; print("py%d.%d-torch%s" % (sys.version_info[0], sys.version_info[1], v))')
if [ -n "${PYTHON:-}" ]; then build="build/dev-$tag"; else build="build/dev"; fi
cpp_tests=$([ "${GPUGUARD_CPP_TESTS:-1}" = 0 ] && echo OFF || echo ON)
"$PY" -m pip install -q --disable-pip-version-check --no-build-isolation -Cbuild-dir="$build" \
  -Ccmake.build-type="${GPUGUARD_BUILD_TYPE:-RelWithDebInfo}" -Ccmake.define.GPUGUARD_BUILD_TESTS=ON \
  -Ccmake.define.GPUGUARD_BUILD_CPP_TESTS="$cpp_tests" -Ccmake.define.GPUGUARD_INPLACE=ON .
echo "setup: gpuguard $("$PY" -c 'import gpuguard; print(gpuguard.__version__)') installed against torch $("$PY" -c 'import torch; print(torch.__version__)') ($tag)"
