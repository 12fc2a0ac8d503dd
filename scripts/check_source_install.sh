#!/usr/bin/env bash
# Runs the source build's install lines (docs/building-and-testing.md, "From source") as a user would: in a fresh
# venv that holds only torch, as written, then `gpuguard devices` and one tensor check (the compiled one, and no
# fallback warning). CI runs it on its newest corner (.ci/run).
#   PYTHON=...   a venv's interpreter that has torch (default python3). The fresh venv is made from the same base
#                Python (no --system-site-packages) and gets that torch: its files and its dependencies' files,
#                hard-linked from the venv that has them (scripts/venv_with_torch.py). Nothing else: the build's
#                tools must come from the install lines.
#   GPUGUARD_SOURCE_INSTALL_VENV   the folder for the venv (default ~/.cache/gpuguard-ci/source-install), emptied
#                first. pip's build goes to build/source-install in the clone (SKBUILD_BUILD_DIR, emptied first).
#                Both places are fixed, so that ccache (CI's CCACHE_BASEDIR is the clone) serves the next run's
#                compiles, whatever folder the clone is in: the venv's torch headers keep one path, the sources one
#                path relative to the build folder.
# The block is the one marked <!-- doc-test: install: ... --> (tests/python/documented_usage.py finds it).
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
PY=$(command -v "${PYTHON:-python3}") || {
  echo "check_source_install.sh: no interpreter '${PYTHON:-python3}'" >&2
  exit 1
}
WORK=${GPUGUARD_SOURCE_INSTALL_VENV:-$HOME/.cache/gpuguard-ci/source-install}
BUILD_DIR="$PWD/build/source-install"
rm -rf "$BUILD_DIR"
t0=$(date +%s)

lines=$("$PY" tests/python/documented_usage.py --install-lines)
rm -rf "$WORK"
mkdir -p "$WORK"
base=$("$PY" -c 'import sys; print(f"{sys.base_prefix}/bin/python{sys.version_info[0]}.{sys.version_info[1]}")')
"$base" -m venv "$WORK/venv"
VENV_SITE=$("$WORK/venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')

# torch and what it requires, hard-linked from the venv that has them
"$PY" scripts/venv_with_torch.py "$VENV_SITE" | sed 's/^/check_source_install: /'
t1=$(date +%s)

echo "check_source_install: the source install lines, as written, in $WORK/venv:"
printf '%s' "$lines" | sed 's/^/  $ /'
(
  export VIRTUAL_ENV="$WORK/venv" PATH="$WORK/venv/bin:$PATH" SKBUILD_BUILD_DIR="$BUILD_DIR"
  unset PYTHONPATH PYTHON PYTHONHOME
  bash -euo pipefail -c "$lines"
)
t2=$(date +%s)

cd "$WORK"  # away from the clone: what runs is the installed package
env -u PYTHONPATH "$WORK/venv/bin/gpuguard" devices
env -u PYTHONPATH "$WORK/venv/bin/python" "$ROOT/scripts/installed_tensor_checks.py" check_source_install
t3=$(date +%s)
echo "check_source_install: ok in $((t3 - t0)) s (venv and torch $((t1 - t0)) s, install lines $((t2 - t1)) s," \
  "checks $((t3 - t2)) s)"
