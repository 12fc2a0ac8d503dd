#!/usr/bin/env bash
# Checks the full build's wheels (scripts/build_wheels.sh, in wheelhouse/) beside the torches users have: for each
# interpreter given (a venv that holds a torch, and pytest), its Python's wheel is installed where nothing can
# compile (scripts/check_wheel_install.sh), then tests/python/test_wheel_variants.py drives that wheel's loader under
# that torch: its own variant picked and run in C++, and the Python fallback, with its one warning, for a torch newer
# than every variant. Ends with a table: Python, torch, the tensor checks doctor names, and each check's outcome.
#   scripts/check_wheels_beside_torches.sh PYTHON [PYTHON ...]
# e.g. the CI venvs that hold torch 2.6 (Python 3.10), 2.11 (3.12) and 2.15 (3.11).
set -uo pipefail
cd "$(dirname "$0")/.."
[ $# -gt 0 ] || { echo "usage: scripts/check_wheels_beside_torches.sh PYTHON [PYTHON ...]" >&2; exit 2; }
rows=() failed=0
for py in "$@"; do
  if ! read -r tag torch < <("$py" -c 'import sys, torch
print(f"cp{sys.version_info[0]}{sys.version_info[1]}", torch.__version__)'); then
    rows+=("$py | no torch | - | FAILED"); failed=1; continue
  fi
  wheel=$(ls wheelhouse/gpuguard-*-"$tag"-"$tag"-*.whl 2>/dev/null | head -1)
  if [ -z "$wheel" ]; then
    rows+=("$tag | torch $torch | no $tag wheel in wheelhouse/ | FAILED"); failed=1; continue
  fi
  log="build/wheels/beside-$tag-torch$torch.log"
  mkdir -p build/wheels
  echo "check_wheels_beside_torches: $(basename "$wheel") beside torch $torch ($py); log: $log"
  install=ok variants=ok
  PYTHON="$py" bash scripts/check_wheel_install.sh "$wheel" >"$log" 2>&1 || install=FAILED
  picked=$(sed -n 's/^check_wheel_install: gpuguard doctor: tensor checks: //p' "$log" | head -1)
  if ! "$py" -c 'import pytest' 2>/dev/null; then
    variants=FAILED summary="no pytest in that venv: pip install --group test"
  else
    GPUGUARD_TEST_WHEEL="$PWD/$wheel" PYTHONPATH="$PWD/python:$PWD/tests" "$py" -m pytest -p no:cacheprovider -q \
      tests/python/test_wheel_variants.py >>"$log" 2>&1 || variants=FAILED
    summary=$(grep -E "^[0-9]+ (passed|failed)|^=+ .*(passed|failed)" "$log" | tail -1 | tr -d '=')
  fi
  [ "$install" = ok ] && [ "$variants" = ok ] || failed=1
  rows+=("$tag | torch $torch | ${picked:-?} | install $install; test_wheel_variants $variants (${summary# })")
done
echo "check_wheels_beside_torches:"
printf '  %s\n' "${rows[@]}"
exit "$failed"
