#!/usr/bin/env bash
# Builds the libFuzzer targets for the identity-record decoder, explain's log reader (seeded with the pasted shapes
# of tests/python/paste_corpus.py) and the watchdog's reading of torch's flight recorder dump (clang,
# AddressSanitizer + UBSan; plain C++ that links no torch, compiled with torch's C++ ABI like every other part) and
# runs each briefly, and tests/fuzz/fuzz_paste.py (explain's reading of pasted text, when the module is built). The
# four parts run side by side (each is one process at a time: a compiler, then a fuzzer); each one's output is
# printed once all have ended, in the order below, and the script fails if any part did.
# CI calls it; FUZZ_SECONDS sets each one's budget, or a count of inputs does.
#   scripts/fuzz.sh            build, seed, fuzz for $FUZZ_SECONDS (default 20) seconds
#   FUZZ_RUNS_IDENTITY / FUZZ_RUNS_LOG_SCAN / FUZZ_RUNS_FLIGHT_RECORDER   that target's budget in inputs instead
#                              (CI: as many as each ran in 20 s on a quiet machine, so that a busy one fuzzes no less)
#   PYTHON=...                 the interpreter whose torch gives the C++ ABI (default python3)
#   FUZZ_PASTE_SEED / FUZZ_PASTE_RUNS   fuzz_paste.py's seed and its number of shapes (default: a new seed, as many
#                              as $FUZZ_SECONDS allow)
set -euo pipefail
cd "$(dirname "$0")/.."
CXX=${FUZZ_CXX:-clang++}
PY=${PYTHON:-python3}
OUT=build/fuzz
mkdir -p "$OUT/corpus"
CORE="csrc/gpuguard/identity.cc csrc/gpuguard/placement.cc csrc/gpuguard/error.cc"
# torch's C++ ABI, like every other compiled part of gpuguard (read from the torch of $PYTHON)
ABI_FLAG=$("$PY" cmake/torch_build_flags.py --abi-flag)
FLAGS="-std=c++20 -g -O1 -Icsrc -Wall -Wextra -Werror -fno-omit-frame-pointer $ABI_FLAG"
echo "fuzz.sh: building with $ABI_FLAG (the torch of $PY)"
# budget RUNS: libFuzzer's budget for a target: RUNS inputs when set, else $FUZZ_SECONDS of time
budget() { if [ -n "$1" ]; then echo "-runs=$1"; else echo "-max_total_time=${FUZZ_SECONDS:-20}"; fi; }
# The identity-record decoder.
identity_part() {
  "$CXX" $FLAGS -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=undefined \
    tests/fuzz/fuzz_identity_decode.cc $CORE -o "$OUT/fuzz_identity_decode"
  "$CXX" $FLAGS tests/fuzz/make_seeds.cc $CORE -o "$OUT/make_seeds"
  "$OUT/make_seeds" "$OUT/corpus"
  # -rss_limit_mb: a decoder that allocates from a hostile length prefix fails here, not in production.
  if ! "$OUT/fuzz_identity_decode" "$OUT/corpus" "$(budget "${FUZZ_RUNS_IDENTITY:-}")" -reload=0 -max_len=20000 \
      -rss_limit_mb=512 -artifact_prefix="$OUT/" -print_final_stats=1 -dict=tests/fuzz/identity.dict \
      >"$OUT/fuzz.log" 2>&1; then
    cat "$OUT/fuzz.log" >&2
    echo "fuzz.sh: the identity decoder failed on the input saved above (crash-*/leak-* in $OUT)" >&2
    return 1
  fi
  grep -E "^Done|stat::number_of_executed_units|stat::peak_rss_mb" "$OUT/fuzz.log"
}

# run_target NAME WHAT PREFIX DICT RUNS: fuzzes $OUT/NAME from the corpus $OUT/<PREFIX>corpus for RUNS inputs (or
# $FUZZ_SECONDS); on a failure prints the log and says that WHAT failed on the input saved as <PREFIX>crash-* or
# <PREFIX>leak-* in $OUT.
run_target() {
  local name=$1 what=$2 prefix=$3 dict=$4 runs=$5
  if ! "$OUT/$name" "$OUT/${prefix}corpus" "$(budget "$runs")" -reload=0 -max_len=65536 \
      -rss_limit_mb=512 -artifact_prefix="$OUT/$prefix" -print_final_stats=1 -dict="$dict" \
      >"$OUT/$name.log" 2>&1; then
    cat "$OUT/$name.log" >&2
    echo "fuzz.sh: $what failed on the input saved above (${prefix}crash-*/${prefix}leak-* in $OUT)" >&2
    return 1
  fi
  grep -E "^Done|stat::number_of_executed_units|stat::peak_rss_mb" "$OUT/$name.log"
}

# explain's log reader (issue 15): arbitrary bytes, long lines, ANSI sequences, NULs, split at random between
# reads; the target checks that every split hands out the same lines and only lines it may.
log_scan_part() {
  "$CXX" $FLAGS -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=undefined \
    tests/fuzz/fuzz_log_scan.cc csrc/gpuguard/log_scan.cc -o "$OUT/fuzz_log_scan"
  mkdir -p "$OUT/log-corpus"
  printf '[rank7]: Duplicate GPU detected : rank 7 and rank 3 both on CUDA device 10000\r\nok\n' \
    >"$OUT/log-corpus/seed1"
  # issue 27: every recogniser's examples pasted every way (quoted, wrapped, numbered, prefixed, escaped) as seeds
  PYTHONPATH=python:tests/python "$PY" tests/fuzz/write_paste_seeds.py "$OUT/log-corpus"
  run_target fuzz_log_scan "the log reader" log- tests/fuzz/log_scan.dict "${FUZZ_RUNS_LOG_SCAN:-}"
}

# explain's reading of pasted text (issue 27): random stacks of what copying a log does to the recognisers'
# examples never give a number the clean text does not. Needs the built module (scripts/test.sh builds it).
paste_part() {
  if PYTHONPATH=python "$PY" -c "import gpuguard._core" 2>/dev/null; then
    # FUZZ_PASTE_SEED and FUZZ_PASTE_RUNS fix the shapes (CI: a seed whose shapes pass, so that a flaw a random seed
    # finds is reported by a developer's run, not by an unrelated change's CI); unset, each run draws new shapes.
    # With a count (CI's), the count alone ends the run, so that a busy machine fuzzes no less (beside the other
    # parts, 20 s gave 2,991 of CI's 15,000 shapes in the CI run of 45d17cd): the time is then a bound for a hang.
    local seconds=${FUZZ_SECONDS:-20}
    [ -n "${FUZZ_PASTE_RUNS:-}" ] && seconds=1200
    if ! PYTHONPATH=python:tests/python "$PY" tests/fuzz/fuzz_paste.py "$seconds" "${FUZZ_PASTE_SEED:-}" \
        "${FUZZ_PASTE_RUNS:-}" >"$OUT/fuzz_paste.log" 2>&1; then
      cat "$OUT/fuzz_paste.log" >&2
      echo "fuzz.sh: explain read a pasted shape wrong (the shape and its seed are above)" >&2
      return 1
    fi
    cat "$OUT/fuzz_paste.log"
  else
    echo "fuzz.sh: gpuguard._core is not built here (scripts/test.sh builds it): fuzz_paste.py did not run" >&2
  fi
}

# The watchdog's reading of torch's flight recorder dump (issue 21): text from another library, read strictly.
flight_recorder_part() {
  "$CXX" $FLAGS -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=undefined \
    tests/fuzz/fuzz_flight_recorder.cc csrc/gpuguard/flight_recorder.cc csrc/gpuguard/json_value.cc \
    csrc/gpuguard/error.cc -o "$OUT/fuzz_flight_recorder"
  mkdir -p "$OUT/fr-corpus"
  printf '%s' '{"entries":[{"collective_seq_id":1,"input_dtypes":["Float"],"input_sizes":[[4]],"process_group":["0","default_pg"],"profiling_name":"gloo:all_reduce","retired":true,"state":"scheduled","thread_id":"1","time_created_ns":1795529047835970399}],"pg_status":{"0":{"last_completed_collective":"1","last_enqueued_collective":"2","last_started_collective":"-1"}},"version":"2.10"}' >"$OUT/fr-corpus/seed1"
  run_target fuzz_flight_recorder "the flight recorder reader" fr- tests/fuzz/flight_recorder.dict \
    "${FUZZ_RUNS_FLIGHT_RECORDER:-}"
}

names=(identity log_scan paste flight_recorder) pids=()
for name in "${names[@]}"; do
  "${name}_part" >"$OUT/part-$name.out" 2>&1 &
  pids+=($!)
done
failed=0
for i in "${!names[@]}"; do
  rc=0
  wait "${pids[$i]}" || rc=$?
  cat "$OUT/part-${names[$i]}.out"
  [ "$rc" = 0 ] || { failed=1; echo "fuzz.sh: the ${names[$i]} part failed (exit $rc; its output is above)" >&2; }
done
exit "$failed"
