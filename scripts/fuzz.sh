#!/usr/bin/env bash
# Builds the libFuzzer targets for the identity-record decoder and explain's log reader (clang, AddressSanitizer +
# UBSan; no torch needed: identity/placement/log_scan are plain C++) and runs each briefly. CI calls it;
# FUZZ_SECONDS sets each one's budget.
#   scripts/fuzz.sh            build, seed, fuzz for $FUZZ_SECONDS (default 20) seconds
set -euo pipefail
cd "$(dirname "$0")/.."
CXX=${FUZZ_CXX:-clang++}
OUT=build/fuzz
mkdir -p "$OUT/corpus"
CORE="csrc/gpuguard/identity.cc csrc/gpuguard/placement.cc csrc/gpuguard/error.cc"
FLAGS="-std=c++20 -g -O1 -Icsrc -Wall -Wextra -Werror -fno-omit-frame-pointer"
"$CXX" $FLAGS -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=undefined \
  tests/fuzz/fuzz_identity_decode.cc $CORE -o "$OUT/fuzz_identity_decode"
"$CXX" $FLAGS tests/fuzz/make_seeds.cc $CORE -o "$OUT/make_seeds"
"$OUT/make_seeds" "$OUT/corpus"
# -rss_limit_mb: a decoder that allocates from a hostile length prefix fails here, not in production.
if ! "$OUT/fuzz_identity_decode" "$OUT/corpus" -max_total_time="${FUZZ_SECONDS:-20}" -max_len=20000 \
    -rss_limit_mb=512 -artifact_prefix="$OUT/" -print_final_stats=1 -dict=tests/fuzz/identity.dict >"$OUT/fuzz.log" 2>&1; then
  cat "$OUT/fuzz.log" >&2
  echo "fuzz.sh: the identity decoder failed on the input saved above (crash-*/leak-* in $OUT)" >&2
  exit 1
fi
grep -E "^Done|stat::number_of_executed_units|stat::peak_rss_mb" "$OUT/fuzz.log"

# explain's log reader (issue 15): arbitrary bytes, long lines, ANSI sequences, NULs, split at random between
# reads; the target checks that every split hands out the same lines and only lines it may.
"$CXX" $FLAGS -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=undefined \
  tests/fuzz/fuzz_log_scan.cc csrc/gpuguard/log_scan.cc -o "$OUT/fuzz_log_scan"
mkdir -p "$OUT/log_corpus"
printf '[rank7]: Duplicate GPU detected : rank 7 and rank 3 both on CUDA device 10000\r\nok\n' >"$OUT/log_corpus/seed1"
if ! "$OUT/fuzz_log_scan" "$OUT/log_corpus" -max_total_time="${FUZZ_SECONDS:-20}" -max_len=65536 \
    -rss_limit_mb=512 -artifact_prefix="$OUT/log-" -print_final_stats=1 -dict=tests/fuzz/log_scan.dict \
    >"$OUT/fuzz_log_scan.log" 2>&1; then
  cat "$OUT/fuzz_log_scan.log" >&2
  echo "fuzz.sh: the log reader failed on the input saved above (log-crash-*/log-leak-* in $OUT)" >&2
  exit 1
fi
grep -E "^Done|stat::number_of_executed_units|stat::peak_rss_mb" "$OUT/fuzz_log_scan.log"
