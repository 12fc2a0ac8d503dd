#!/usr/bin/env bash
# Prints the path of a venv for one CI corner, making it first when it is missing or incomplete:
#   .ci/venv.sh PYTHON_MINOR PIN...        e.g. .ci/venv.sh 3.10 torch==2.6.0 'ray[default,train]==2.43.0' ...
# The Python is pyenv's newest installed patch release of PYTHON_MINOR. The venv lives outside the clone, under
# $GPUGUARD_CI_CACHE (default ~/.cache/gpuguard-ci), named by the exact Python and pins, so a later run on the
# same machine reuses it and a fresh machine builds it (pip's own cache spares a second download).
set -euo pipefail
minor=$1
shift
root=$(pyenv root 2>/dev/null || echo "$HOME/.pyenv")
python=$(ls -d "$root"/versions/"$minor".*/bin/python 2>/dev/null | sort -V | tail -1 || true)
if [ -z "$python" ]; then
  # pyenv install downloads Python's sources from python.org, which this workplace's machines cannot reach (package
  # registries only): failing here, clearly, is faster and more honest than a download that cannot succeed.
  echo "ci: the corner needs Python $minor, and pyenv has none (pyenv versions: $(pyenv versions --bare 2>/dev/null | tr '\n' ' '))." >&2
  echo "ci: install it where python.org is reachable (pyenv install $minor), or point GPUGUARD_CI_CACHE at a machine that has it." >&2
  exit 1
fi
version=$("$python" -c 'import platform; print(platform.python_version())')
key="py$version-$(printf '%s\n' "$@" | sha256sum | cut -c1-12)"
cache=${GPUGUARD_CI_CACHE:-$HOME/.cache/gpuguard-ci}
venv="$cache/venvs/$key"
if [ ! -f "$venv/.complete" ] || ! "$venv/bin/python" -c 'import torch' >/dev/null 2>&1; then
  echo "ci: making the venv $venv (Python $version: $*)" >&2
  rm -rf "$venv"
  mkdir -p "$cache/venvs"
  "$python" -m venv "$venv"
  "$venv/bin/python" -m pip install -q --disable-pip-version-check --upgrade pip >&2
  "$venv/bin/python" -m pip install -q --disable-pip-version-check "$@" >&2
  printf '%s\n' "$@" >"$venv/.complete"
fi
echo "$venv"
