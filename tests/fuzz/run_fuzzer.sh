#!/bin/sh
# Runs the libFuzzer target for a while (default 60 s), starting from the
# committed corpus; new inputs go to a scratch corpus in the build folder,
# crashes to <build>/fuzz-artifacts/. Exit status non-zero on any finding.
# Then, when built, fuzz_codec (the standalone quantizer) and fuzz_gguf (the
# model runner's GGUF reader), each for a third of SECONDS from
# tests/fuzz/corpus-codec and tests/fuzz/corpus-gguf.
# Usage: tests/fuzz/run_fuzzer.sh BUILD_DIR [SECONDS]
set -eu
build=$1
secs=${2:-60}
here=$(cd "$(dirname "$0")" && pwd)
bin="$build/tests/fuzz/fuzz_pool_api"
[ -x "$bin" ] || { echo "no $bin: configure with -DKVC_FUZZ=ON and clang" >&2; exit 1; }
work="$build/fuzz-corpus"
mkdir -p "$work" "$build/fuzz-artifacts"
ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1} \
UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1} \
  "$bin" -max_total_time="$secs" -max_len=4096 -timeout=10 -rss_limit_mb=2048 \
  -print_final_stats=1 -artifact_prefix="$build/fuzz-artifacts/" "$work" "$here/corpus"
codec="$build/tests/fuzz/fuzz_codec"
if [ -x "$codec" ]; then
  mkdir -p "$build/fuzz-corpus-codec"
  ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1} \
  UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1} \
    "$codec" -max_total_time=$((secs / 3 + 1)) -max_len=4096 -timeout=10 -rss_limit_mb=2048 \
    -print_final_stats=1 -artifact_prefix="$build/fuzz-artifacts/codec-" "$build/fuzz-corpus-codec" "$here/corpus-codec"
fi
gguf="$build/tests/fuzz/fuzz_gguf"
if [ -x "$gguf" ]; then
  mkdir -p "$build/fuzz-corpus-gguf"
  ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1} \
  UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1} \
    "$gguf" -max_total_time=$((secs / 3 + 1)) -max_len=8192 -timeout=10 -rss_limit_mb=2048 \
    -print_final_stats=1 -artifact_prefix="$build/fuzz-artifacts/gguf-" "$build/fuzz-corpus-gguf" "$here/corpus-gguf"
fi
