#!/usr/bin/env bash
# Builds gpuguard with toolchains other than scripts/test.sh's (g++ with a shared libstdc++), warnings as errors:
#   scripts/build_toolchains.sh clang-libc++       clang with libc++: the C++ core, the fakes, the C++ tests (ctest)
#                                                  and gpuguard._core. What links LibTorch (tensor_devices,
#                                                  gpuguard._libtorch, their tests) is left out: torch's wheels are
#                                                  built against libstdc++, and libc++ objects cannot link to them.
#   scripts/build_toolchains.sh static-libstdc++ [pytest args]
#                                                  g++ linking libstdc++ and libgcc statically into both modules (as
#                                                  the image of the lent GPU machine's CXX does, and gcc-toolset),
#                                                  then tests/python/test_static_libstdcxx.py against that build:
#                                                  gpuguard and torch in one process, formatting through iostreams.
# clang-libc++ force-includes every standard header (cmake/every_std_header.h) into each source: an unqualified call
# that a std:: overload can take over through argument-dependent lookup (GCC 13's std::quoted) then fails here.
# static-libstdc++ compiles as scripts/test.sh does, so that in CI ccache serves every object and only linking costs.
# Each builds in build/toolchain-<name>[-<py tag>] (PYTHON=... picks the interpreter and its torch, as in test.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
MODE=${1:-}
shift || true
PY=$(command -v "${PYTHON:-python3}") || { echo "build_toolchains.sh: no interpreter '${PYTHON:-python3}'" >&2; exit 1; }
JOBS=${JOBS:-$(nproc)}
TAG=$("$PY" -c 'import sys; print(f"py{sys.version_info[0]}.{sys.version_info[1]}")')
EVERY_HEADER="-include $PWD/cmake/every_std_header.h"
BUILD="build/toolchain-$MODE-$TAG"
t0=$(date +%s)

case "$MODE" in
  clang-libc++)
    for tool in clang clang++; do
      command -v "$tool" >/dev/null || { echo "build_toolchains.sh: $tool is not installed" >&2; exit 1; }
    done
    echo 'int main() {}' | clang++ -x c++ -stdlib=libc++ - -o /dev/null 2>/dev/null || {
      echo "build_toolchains.sh: clang++ -stdlib=libc++ cannot link; install libc++-dev libc++abi-dev" >&2; exit 1; }
    # GPUGUARD_CXX11_ABI is left empty: the macro belongs to libstdc++ and means nothing to libc++.
    cmake -S . -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_C_COMPILER=clang \
      -DCMAKE_CXX_COMPILER=clang++ "-DCMAKE_CXX_FLAGS=-stdlib=libc++ $EVERY_HEADER" \
      "-DCMAKE_EXE_LINKER_FLAGS=-stdlib=libc++" "-DCMAKE_SHARED_LINKER_FLAGS=-stdlib=libc++" \
      "-DCMAKE_MODULE_LINKER_FLAGS=-stdlib=libc++" -DGPUGUARD_BUILD_LIBTORCH=OFF -DGPUGUARD_BUILD_TESTS=ON \
      -DPython_EXECUTABLE="$PY" >/dev/null
    cmake --build "$BUILD" -j "$JOBS"
    ctest --test-dir "$BUILD" --output-on-failure -j "$JOBS"
    echo "build_toolchains.sh: clang $(clang++ -dumpversion) with libc++: built and ctest passed in" \
         "$(( $(date +%s) - t0 )) s (without the LibTorch parts)"
    ;;
  static-libstdc++)
    LINK="-static-libstdc++ -static-libgcc"
    # Compiled as scripts/test.sh compiles (ccache serves its objects), linked otherwise.
    cmake -S . -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo "-DCMAKE_MODULE_LINKER_FLAGS=$LINK" \
      -DGPUGUARD_BUILD_TESTS=ON \
      -DGPUGUARD_BUILD_CPP_TESTS=OFF -DPython_EXECUTABLE="$PY" >/dev/null
    cmake --build "$BUILD" -j "$JOBS"
    # A package of this build beside the sources' pure-Python part, for pytest and the test's workers; python/gpuguard
    # itself keeps scripts/test.sh's modules.
    # Copied without what was built in place or compiled: never listing __pycache__, where a test of another lane
    # may be writing a .pyc beside (a temporary file, renamed over the .pyc, that a copy of the folder can list
    # and then no longer find).
    site="$BUILD/site"
    rm -rf "$site" && mkdir -p "$site"
    "$PY" -c 'import shutil, sys; shutil.copytree("python/gpuguard", sys.argv[1], ignore=shutil.ignore_patterns(
        "__pycache__", "*.so", "_build_info_*.py"))' "$site/gpuguard"
    cp "$BUILD"/csrc/python/_core*.so "$BUILD"/csrc/python/_libtorch*.so "$BUILD"/csrc/python/_build_info_*.py \
       "$site/gpuguard/"
    echo "build_toolchains.sh: g++ $(g++ -dumpversion) with $LINK: built in $(( $(date +%s) - t0 )) s"
    GPUGUARD_STATIC_LIBSTDCXX_SITE="$PWD/$site" GPUGUARD_FAKES_DIR="$PWD/$BUILD/tests/fakes" \
      RES_OPTIONS="${RES_OPTIONS:-timeout:1 attempts:1}" PYTHONPATH="$PWD/$site" \
      "$PY" -m pytest tests/python/test_static_libstdcxx.py "$@"
    echo "build_toolchains.sh: static-libstdc++ done in $(( $(date +%s) - t0 )) s"
    ;;
  *)
    echo "usage: scripts/build_toolchains.sh clang-libc++ | static-libstdc++ [pytest args]" >&2
    exit 2
    ;;
esac
