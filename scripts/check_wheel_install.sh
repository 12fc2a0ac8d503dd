#!/usr/bin/env bash
# Installs a binary wheel from wheelhouse/ (scripts/build_wheels.sh) where nothing can compile, and proves that its
# tensor checks run in C++ there: a fresh venv holding only torch, PIP_ONLY_BINARY=:all:, CC and CXX false, and a
# PATH with no compiler, cmake or ninja on it. Then `gpuguard doctor` must say "tensor checks: C++", one tensor
# check passes and one mismatch is reported without the Python fallback's warning, and `gpuguard devices` runs.
# CI runs it after `scripts/build_wheels.sh --quick` in its oldest and newest corners (.ci/run).
#   PYTHON=...   a venv's interpreter that has torch (default python3); the fresh venv is made from the same base
#                Python and gets that torch hard-linked (scripts/venv_with_torch.py), no download
#   scripts/check_wheel_install.sh [WHEEL]   the wheel (default: wheelhouse/'s one for this Python)
#   GPUGUARD_WHEEL_VENV   the folder for the venv (default ~/.cache/gpuguard-wheels/install-check-<python tag>),
#                emptied first
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
PY=$(command -v "${PYTHON:-python3}") || { echo "check_wheel_install.sh: no interpreter '${PYTHON:-python3}'" >&2; exit 1; }
TAG=$("$PY" -c 'import sys; print(f"cp{sys.version_info[0]}{sys.version_info[1]}")')
WHEEL=${1:-$(ls wheelhouse/gpuguard-*-"$TAG"-"$TAG"-*.whl 2>/dev/null | head -1 || true)}
[ -n "$WHEEL" ] && [ -f "$WHEEL" ] || {
  echo "check_wheel_install.sh: no $TAG wheel in wheelhouse/: build it first (scripts/build_wheels.sh --quick)" >&2
  exit 1
}
WHEEL=$(realpath "$WHEEL")
WORK=${GPUGUARD_WHEEL_VENV:-$HOME/.cache/gpuguard-wheels/install-check-$TAG}
t0=$(date +%s)
rm -rf "$WORK" && mkdir -p "$WORK/no-compiler"
base=$("$PY" -c 'import sys; print(f"{sys.base_prefix}/bin/python{sys.version_info[0]}.{sys.version_info[1]}")')
"$base" -m venv "$WORK/venv"
site=$("$WORK/venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
"$PY" scripts/venv_with_torch.py "$site" | sed 's/^/check_wheel_install: /'
# the only programs on PATH besides the venv's: a shell and env
for tool in sh bash env; do ln -s "$(command -v "$tool")" "$WORK/no-compiler/$tool"; done

# nothing but the venv, the shell and env, HOME in the work folder (no pip config, no cache of a build), no network
# index: a wheel that needed a build (an sdist, a missing tag) fails here
in_no_compiler_env() {
  env -i HOME="$WORK" PATH="$WORK/venv/bin:$WORK/no-compiler" VIRTUAL_ENV="$WORK/venv" CC=false CXX=false \
    PIP_ONLY_BINARY=:all: PIP_NO_INDEX=1 PIP_DISABLE_PIP_VERSION_CHECK=1 LANG=C.UTF-8 "$@"
}
in_no_compiler_env bash -c 'for tool in cc c++ gcc g++ clang clang++ cmake ninja make zig ld; do
  if command -v "$tool" >/dev/null; then echo "check_wheel_install: $tool is reachable: $(command -v "$tool")" >&2; exit 1; fi
done'
echo "check_wheel_install: installing $(basename "$WHEEL") where nothing can compile"
in_no_compiler_env pip install -q "$WHEEL"
t1=$(date +%s)

cd "$WORK"  # away from the clone: what runs is the installed package
in_no_compiler_env gpuguard devices
in_no_compiler_env gpuguard doctor --json >"$WORK/doctor.json" || true  # exit 1 for findings such as "no GPU"
in_no_compiler_env python - "$WORK/doctor.json" "$ROOT/scripts" <<'EOF'
import json, sys, warnings

import torch
import gpuguard

from gpuguard._libtorch_loader import wheel_variants

checks = json.load(open(sys.argv[1]))["versions"]["tensor checks"]
minor = tuple(int(part) for part in torch.__version__.split(".")[:2])
if minor not in wheel_variants():
    print(f"check_wheel_install: gpuguard doctor: tensor checks: {checks}")
    # build_wheels.sh left this torch's variant out (over manylinux_2_28, it said why): the wheel must still install
    # and run, the checks in Python after one warning; never a silent pass
    if not checks.startswith("Python (this wheel has no gpuguard._libtorch"):
        raise SystemExit(f"check_wheel_install: the wheel has no variant for torch {torch.__version__}, yet doctor "
                         f"says: {checks}")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        print("check_wheel_install: assert_same_device ->", gpuguard.assert_same_device(torch.nn.Linear(4, 2),
                                                                                         torch.ones(3, 4)))
    said = [str(w.message) for w in caught if issubclass(w.category, gpuguard.GpuGuardWarning)]
    if len(said) != 1:
        raise SystemExit(f"check_wheel_install: expected the Python fallback's one warning, got {said}")
    print(f"check_wheel_install: NO C++ CHECKS for torch {torch.__version__}: this wheel has no variant for it "
          f"(scripts/build_wheels.sh left it out); the Python checks ran after one warning")
else:  # with the variant for this torch: the compiled checks, as a source build's are checked
    sys.path.insert(0, sys.argv[2])
    from installed_tensor_checks import main
    main("check_wheel_install", sys.argv[1])
EOF
t2=$(date +%s)
echo "check_wheel_install: ok in $((t2 - t0)) s (venv, torch and the wheel $((t1 - t0)) s, checks $((t2 - t1)) s)"
