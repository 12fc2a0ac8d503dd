#!/usr/bin/env bash
# Proves gpuguard on a real NVIDIA GPU: builds it against the torch found here (no network), runs the tests marked
# `gpu`, and prints a report: versions, what each check recorded, then a table of each check, its outcome and its
# figure (the number it measured, where it has one).
#   scripts/gpu_acceptance.sh            build, run, report (a lent GPU machine: under 8 minutes on 16 cores)
#   scripts/gpu_acceptance.sh --dry-run  list the checks and collect both runs' selections (any machine, with or
#                                        without Ray or a GPU; CI)
#   scripts/gpu_acceptance.sh --wheel WHEEL   no build: the binary wheel for this Python (scripts/build_wheels.sh,
#                                        e.g. the cp312 one for the lent machine's image), unpacked beside the report
#                                        and tested in place of python/'s modules; the checks must run its _libtorch
# The report goes to stdout and, as JSON, to $OUT/gpu_report.json (or build/gpu-acceptance/), with the tests' log.
# Two pytest runs: the checks that can share the GPU, side by side (pytest-xdist, where installed: GPU_WORKERS, 4
# by default), then those marked gpu_alone (timings, the GPU's memory and its processes), one at a time.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
REPORT_DIR=${OUT:-build/gpu-acceptance}
mkdir -p "$REPORT_DIR"
# pytest-timeout may be missing on the GPU machine (it has no network): without it, its ini key is only noise.
PYTEST=("$PY" -m pytest tests/python/gpu -p no:cacheprovider -o 'addopts=-ra --strict-markers'
        -W ignore::pytest.PytestConfigWarning)
SHARED="gpu and not gpu_alone"
ALONE="gpu and gpu_alone"
export PYTHONPATH="$PWD/python${PYTHONPATH:+:$PYTHONPATH}"

if [ "${1:-}" = "--dry-run" ]; then
  echo "gpu_acceptance: dry run: the checks a GPU machine would run (each compares gpuguard with the real thing):"
  "$PY" - <<'PYEOF'
import ast, pathlib
for path in sorted(pathlib.Path("tests/python/gpu").glob("test_gpu_*.py")):
    tree = ast.parse(path.read_text())
    print(f"  {path.name}: {ast.get_docstring(tree).splitlines()[0]}")
    marks = [n for n in tree.body if isinstance(n, ast.Assign) and "pytestmark" in ast.unparse(n.targets)]
    module_alone = any("gpu_alone" in ast.unparse(n.value) for n in marks)
    for node in tree.body:
        if isinstance(node, ast.FunctionDef) and node.name.startswith("test_"):
            doc = ast.get_docstring(node) or ""
            alone = module_alone or any("gpu_alone" in ast.unparse(d) for d in node.decorator_list)
            print(f"    - {node.name}{' (alone)' if alone else ''}: {doc.splitlines()[0] if doc else ''}")

# A name that the module never defines (a missing import) fails only when the test runs, so only on a GPU (the
# lent machine's first run of test_the_per_step_cost_of_watch: "name 'subprocess' is not defined"): find them here.
import builtins, symtable
undefined = []
for path in sorted(pathlib.Path("tests/python/gpu").glob("*.py")):
    top = symtable.symtable(path.read_text(), str(path), "exec")
    known = {s.get_name() for s in top.get_symbols() if s.is_assigned() or s.is_imported()} | set(dir(builtins))
    known |= {"__file__", "__name__", "__doc__", "__spec__", "__loader__", "__builtins__", "__annotations__"}
    tables = list(top.get_children())
    while tables:
        table = tables.pop()
        tables.extend(table.get_children())
        for s in table.get_symbols():
            if s.is_global() and s.is_referenced() and s.get_name() not in known:
                undefined.append(f"{path}: '{s.get_name()}' in {table.get_name()} (line {table.get_lineno()})")
if undefined:
    print("gpu_acceptance: names the GPU suite uses but never defines or imports (they would fail on the GPU):")
    print("\n".join(f"  {u}" for u in sorted(undefined)))
    raise SystemExit(1)
print("gpu_acceptance: every name the GPU suite's functions use is defined or imported")
PYEOF
  # what each of the two runs would select must collect without an error, and select something
  for selection in "$SHARED" "$ALONE"; do
    echo "gpu_acceptance: -m '$selection':"
    "${PYTEST[@]}" -m "$selection" --collect-only -q
  done
  exit 0
fi

start=$(date +%s)
if [ "${1:-}" = "--wheel" ]; then
  [ -f "${2:-}" ] || { echo "gpu_acceptance: --wheel needs the path of a wheel (scripts/build_wheels.sh)" >&2; exit 2; }
  site=$(realpath -m "$REPORT_DIR/wheel-site")
  rm -rf "$site"
  "$PY" -c 'import sys, zipfile; zipfile.ZipFile(sys.argv[1]).extractall(sys.argv[2])' "$2" "$site"
  chmod +x "$site"/gpuguard/*.so "$site"/gpuguard/_torch/*/*.so 2>/dev/null || true
  export PYTHONPATH="$site${PYTHONPATH#"$PWD/python"}"  # in place of python/
  # the wheel's own choice of its compiled tensor checks, said before any check runs: a fallback fails here
  "$PY" -c 'import warnings, gpuguard, torch; warnings.simplefilter("error", gpuguard.GpuGuardWarning)
from gpuguard.tensors.implementation import tensor_checks
m = tensor_checks(); assert m.__name__ == "gpuguard._libtorch", m
print("gpu_acceptance: the wheel runs", m.__file__, "under torch", torch.__version__)' \
    || { echo "gpu_acceptance: the wheel $2 cannot run its compiled tensor checks here (above)" >&2; exit 2; }
else
echo "gpu_acceptance: building gpuguard against $("$PY" -c 'import torch; print("torch", torch.__version__)')"
cmake -S . -B build/gpu -G Ninja -DCMAKE_BUILD_TYPE=Release -DGPUGUARD_BUILD_TESTS=OFF -DGPUGUARD_INPLACE=ON \
  -DPython_EXECUTABLE="$(command -v "$PY")" >"$REPORT_DIR/build.log" 2>&1 \
  && cmake --build build/gpu -j "$(nproc)" >>"$REPORT_DIR/build.log" 2>&1 \
  || { tail -50 "$REPORT_DIR/build.log"; echo "gpu_acceptance: the build failed (log above)" >&2; exit 2; }
fi
built=$(date +%s)
echo "gpu_acceptance: built (or unpacked) in $((built - start)) s"
nvidia-smi || true
WORKERS=()
if "$PY" -c "import xdist" 2>/dev/null; then WORKERS=(-n "${GPU_WORKERS:-4}"); fi
set +e
GPUGUARD_GPU_REPORT="$REPORT_DIR/part-shared.json" "${PYTEST[@]}" -m "$SHARED" "${WORKERS[@]}" -v 2>&1 \
  | tee "$REPORT_DIR/gpu_tests.log"
rc_shared=${PIPESTATUS[0]}
shared_done=$(date +%s)
GPUGUARD_GPU_REPORT="$REPORT_DIR/part-alone.json" "${PYTEST[@]}" -m "$ALONE" -v 2>&1 \
  | tee -a "$REPORT_DIR/gpu_tests.log"
rc_alone=${PIPESTATUS[0]}
set -e
done_at=$(date +%s)
echo
echo "gpu_acceptance: the report (also $REPORT_DIR/gpu_report.json):"
"$PY" tests/python/gpu/acceptance_report.py "$REPORT_DIR/gpu_report.json" "$REPORT_DIR/part-shared.json" \
  "$REPORT_DIR/part-alone.json" --note "build $((built - start)) s; checks side by side $((shared_done - built)) s \
(${WORKERS[*]:-one at a time}, pytest exit $rc_shared); checks alone $((done_at - shared_done)) s (pytest exit \
$rc_alone); in all $((done_at - start)) s"
# pytest's exit 5 (nothing selected) is a failure too: a selection lost its checks
[ "$rc_shared" = 0 ] && [ "$rc_alone" = 0 ]
