#!/usr/bin/env bash
# Proves gpuguard on a real NVIDIA GPU: builds it against the torch found here (no network), runs the tests
# marked `gpu`, and prints a report (driver, GPU, torch and NCCL versions; each check's outcome and facts).
#   scripts/gpu_acceptance.sh            build, run, report (a lent GPU machine; about 10 minutes at most)
#   scripts/gpu_acceptance.sh --dry-run  say what it would check and collect the tests (any machine; CI)
# The report goes to stdout and, as JSON, to $OUT/gpu_report.json (or build/gpu-acceptance/).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
REPORT_DIR=${OUT:-build/gpu-acceptance}
mkdir -p "$REPORT_DIR"
# pytest-timeout may be missing on the GPU machine (it has no network): without it, its ini key is only noise.
PYTEST=("$PY" -m pytest tests/python/gpu -m gpu -p no:cacheprovider -o 'addopts=-ra --strict-markers'
        -W ignore::pytest.PytestConfigWarning)

if [ "${1:-}" = "--dry-run" ]; then
  echo "gpu_acceptance: dry run: the checks a GPU machine would run (each compares gpuguard with the real thing):"
  "$PY" - <<'PYEOF'
import ast, pathlib
for path in sorted(pathlib.Path("tests/python/gpu").glob("test_*.py")):
    tree = ast.parse(path.read_text())
    print(f"  {path.name}: {ast.get_docstring(tree).splitlines()[0]}")
    for node in tree.body:
        if isinstance(node, ast.FunctionDef) and node.name.startswith("test_"):
            doc = ast.get_docstring(node) or ""
            print(f"    - {node.name}: {doc.splitlines()[0] if doc else ''}")
PYEOF
  export PYTHONPATH="$PWD/python${PYTHONPATH:+:$PYTHONPATH}"
  "${PYTEST[@]}" --collect-only -q
  exit 0
fi

start=$(date +%s)
echo "gpu_acceptance: building gpuguard against $("$PY" -c 'import torch; print("torch", torch.__version__)')"
cmake -S . -B build/gpu -G Ninja -DCMAKE_BUILD_TYPE=Release -DGPUGUARD_BUILD_TESTS=OFF -DGPUGUARD_INPLACE=ON \
  -DPython_EXECUTABLE="$(command -v "$PY")" >"$REPORT_DIR/build.log" 2>&1 \
  && cmake --build build/gpu -j "$(nproc)" >>"$REPORT_DIR/build.log" 2>&1 \
  || { tail -50 "$REPORT_DIR/build.log"; echo "gpu_acceptance: the build failed (log above)" >&2; exit 2; }
built=$(date +%s)
echo "gpu_acceptance: built in $((built - start)) s"
nvidia-smi || true
export PYTHONPATH="$PWD/python${PYTHONPATH:+:$PYTHONPATH}"
export GPUGUARD_GPU_REPORT="$REPORT_DIR/gpu_report.json"
set +e
"${PYTEST[@]}" -v 2>&1 | tee "$REPORT_DIR/gpu_tests.log"
rc=${PIPESTATUS[0]}
set -e
echo "gpu_acceptance: build $((built - start)) s, tests $(( $(date +%s) - built )) s, pytest exit $rc"
exit "$rc"
