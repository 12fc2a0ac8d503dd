#!/usr/bin/env bash
# Runs every test: builds the C++ core, the fakes and the in-place extension, runs the GoogleTest suite with
# ctest, then the pytest suite against this source tree.
#   scripts/test.sh              everything
#   scripts/test.sh --sanitize   the C++ tests only, built with AddressSanitizer + UBSan
#   extra arguments after -- go to pytest, e.g. scripts/test.sh -- -k devices
#   PYTHON=/path/to/python ...   another interpreter (and its torch): a build folder of its own
#   GPUGUARD_CPP_TESTS=0 ...     the fakes and the modules alone, no C++ tests (CI's corners that run pytest only)
#   scripts/test.sh --build-only the build alone (no ctest, no pytest)
#   GPUGUARD_TEST_NO_BUILD=1 ... pytest against the build already there, touching no build file (CI's wall-clock
#                                tests, which run while another step of the same corner may configure its build)
# The build folder is build/dev (build/asan) for the default python3, and build/dev-<tag> (build/asan-<tag>) for
# another PYTHON, the tag naming its Python and torch (py3.10-torch2.6.0). The modules land in python/gpuguard/
# named per Python (with their build record), so builds for several Pythons live side by side; a build for the
# same Python with another torch replaces them.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
JOBS=${JOBS:-$(nproc)}
PY=$(command -v "$PY") || { echo "test.sh: no interpreter '${PYTHON:-python3}'" >&2; exit 1; }

# The tag, and the build record's name for this Python, without importing torch (slow) or anything compiled.
read -r TAG RECORD SUFFIX TORCH < <(PYTHONPATH=python "$PY" - <<'EOF'
import importlib.machinery, importlib.metadata, sys
from gpuguard._libtorch_loader import build_record_name
try:
    torch = importlib.metadata.version("torch")
except importlib.metadata.PackageNotFoundError:
    torch = "none"
print(f"py{sys.version_info[0]}.{sys.version_info[1]}-torch{torch.split('+')[0]}", build_record_name(),
      importlib.machinery.EXTENSION_SUFFIXES[0], torch)
EOF
)
if [ -n "${PYTHON:-}" ]; then SUFFIX_DIR="-$TAG"; else SUFFIX_DIR=""; fi

if [ "${1:-}" = "--sanitize" ]; then
  cmake -S . -B "build/asan$SUFFIX_DIR" -G Ninja -DCMAKE_BUILD_TYPE=Debug -DGPUGUARD_BUILD_TESTS=ON \
    -DGPUGUARD_SANITIZE=ON -DGPUGUARD_BUILD_PYTHON=OFF -DPython_EXECUTABLE="$PY" >/dev/null
  cmake --build "build/asan$SUFFIX_DIR" -j "$JOBS"
  ASAN_OPTIONS=detect_leaks=0 UBSAN_OPTIONS=print_stacktrace=1 \
    ctest --test-dir "build/asan$SUFFIX_DIR" --output-on-failure -j "$JOBS"
  exit 0
fi
BUILD_ONLY=0
[ "${1:-}" = "--build-only" ] && { BUILD_ONLY=1; shift; }
[ "${1:-}" = "--" ] && shift
BUILD="build/dev$SUFFIX_DIR"

# The in-place modules of this Python were built for another torch (another build folder, same Python): remove
# them, so that this folder's build links its own instead of taking theirs for up to date.
record="python/gpuguard/$RECORD.py"
built_for=$(sed -n 's/^TORCH_VERSION = "\([^"+]*\).*/\1/p' "$record" 2>/dev/null || true)
if [ -n "$built_for" ] && [ "$built_for" != "${TORCH%%+*}" ] && [ "${GPUGUARD_TEST_NO_BUILD:-0}" = 0 ]; then
  echo "test.sh: python/gpuguard/ holds modules built for torch $built_for; rebuilding them for torch $TORCH"
  rm -f "python/gpuguard/_core$SUFFIX" "python/gpuguard/_libtorch$SUFFIX"
fi

CPP_TESTS=${GPUGUARD_CPP_TESTS:-1}
if [ "${GPUGUARD_TEST_NO_BUILD:-0}" != 0 ]; then
  [ -d "$BUILD/tests/fakes" ] || { echo "test.sh: GPUGUARD_TEST_NO_BUILD is set but $BUILD holds no build" >&2; exit 1; }
else
cmake -S . -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DGPUGUARD_BUILD_TESTS=ON \
  -DGPUGUARD_BUILD_CPP_TESTS="$([ "$CPP_TESTS" = 0 ] && echo OFF || echo ON)" -DGPUGUARD_INPLACE=ON \
  -DPython_EXECUTABLE="$PY" >/dev/null
cmake --build "$BUILD" -j "$JOBS"
# gpuguard's bytecode, written once: the tests start about a thousand processes that import gpuguard from
# python/, and where PYTHONDONTWRITEBYTECODE is set (this machine's shells set it) each compiled it again (65 ms
# of a rank's start)
"$PY" -m compileall -q python/gpuguard >/dev/null
[ "$BUILD_ONLY" = 1 ] && exit 0
if [ "$CPP_TESTS" != 0 ]; then
  ctest --test-dir "$BUILD" --output-on-failure -j "$JOBS"
fi
fi

export GPUGUARD_FAKES_DIR="$PWD/$BUILD/tests/fakes"
# torch's TCPStore client looks up the name of the address it connected to, only to log it; for 127.0.0.1 (as
# ::ffff:127.0.0.1, which /etc/hosts does not list) that asks DNS, and where the resolver drops a query glibc waits
# its default 5 s: on these machines 8 of 200 clients took 5 s each (40 s in all). One try of 1 s: 200 in 0.02 s.
export RES_OPTIONS="${RES_OPTIONS:-timeout:1 attempts:1}"
export PYTHONPATH="$PWD/python${PYTHONPATH:+:$PYTHONPATH}"
# Bytecode written once, not compiled again by every process: pytest's rewritten test modules (collecting the suite
# took 12.4 CPU-s with nothing cached, 9.1 with its cache: three runs each, here alone; CI collects it in about 20
# processes) and the modules of tests/ that rank scripts import. Unset for the tests where this machine's shells
# set it.
unset PYTHONDONTWRITEBYTECODE
echo "test.sh: $TAG in $BUILD; to re-run a test quickly: RES_OPTIONS='$RES_OPTIONS' GPUGUARD_FAKES_DIR=$GPUGUARD_FAKES_DIR PYTHONPATH=$PWD/python $PY -m pytest ..."
set +e
"$PY" -m pytest "$@"
rc=$?
set -e
if [ $rc -eq 5 ]; then
  echo "test.sh: pytest collected no tests: that is a failure, not a pass" >&2
fi
exit $rc
