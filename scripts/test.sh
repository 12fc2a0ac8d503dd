#!/usr/bin/env bash
# Runs every test: builds the C++ core, the fakes and the in-place extension (build/dev), runs the
# GoogleTest suite with ctest, then the pytest suite against this source tree.
#   scripts/test.sh              everything
#   scripts/test.sh --sanitize   the C++ tests only, built with AddressSanitizer + UBSan (build/asan)
#   extra arguments after -- go to pytest, e.g. scripts/test.sh -- -k devices
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
JOBS=${JOBS:-$(nproc)}

if [ "${1:-}" = "--sanitize" ]; then
  cmake -S . -B build/asan -G Ninja -DCMAKE_BUILD_TYPE=Debug -DGPUGUARD_BUILD_TESTS=ON \
    -DGPUGUARD_SANITIZE=ON -DGPUGUARD_BUILD_PYTHON=OFF -DPython_EXECUTABLE="$(command -v "$PY")" >/dev/null
  cmake --build build/asan -j "$JOBS"
  ASAN_OPTIONS=detect_leaks=0 UBSAN_OPTIONS=print_stacktrace=1 \
    ctest --test-dir build/asan --output-on-failure -j "$JOBS"
  exit 0
fi
[ "${1:-}" = "--" ] && shift

cmake -S . -B build/dev -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DGPUGUARD_BUILD_TESTS=ON \
  -DGPUGUARD_INPLACE=ON -DPython_EXECUTABLE="$(command -v "$PY")" >/dev/null
cmake --build build/dev -j "$JOBS"
ctest --test-dir build/dev --output-on-failure -j "$JOBS"

export GPUGUARD_FAKES_DIR="$PWD/build/dev/tests/fakes"
export PYTHONPATH="$PWD/python${PYTHONPATH:+:$PYTHONPATH}"
set +e
"$PY" -m pytest "$@"
rc=$?
set -e
if [ $rc -eq 5 ]; then
  echo "test.sh: pytest collected no tests: that is a failure, not a pass" >&2
fi
exit $rc
