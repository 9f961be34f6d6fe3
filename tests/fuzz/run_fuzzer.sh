#!/bin/sh
# Runs the libFuzzer target for a while (default 60 s), starting from the
# committed corpus; new inputs go to a scratch corpus in the build folder,
# crashes to <build>/fuzz-artifacts/. Exit status non-zero on any finding.
# Then, when built, fuzz_codec (the standalone quantizer), fuzz_gguf (the
# model runner's GGUF reader) and fuzz_evict, each for a third of SECONDS from
# tests/fuzz/corpus-<name>, and fuzz_store (the stores) and fuzz_llama (llama.cpp
# sequence state blobs) for a sixth each.
# Usage: tests/fuzz/run_fuzzer.sh BUILD_DIR [SECONDS]
set -eu
build=$1
secs=${2:-60}
here=$(cd "$(dirname "$0")" && pwd)
bin="$build/tests/fuzz/fuzz_pool_api"
[ -x "$bin" ] || { echo "no $bin: configure with -DKVC_FUZZ=ON and clang" >&2; exit 1; }
mkdir -p "$build/fuzz-artifacts"
# run BINARY SECONDS MAX_LEN NAME SEEDS: new inputs go to $build/fuzz-corpus[-NAME],
# crashes to $build/fuzz-artifacts/[NAME-].
run() {
  suffix=${4:+-$4}
  mkdir -p "$build/fuzz-corpus$suffix"
  ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1} \
  UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1} \
    "$1" -max_total_time="$2" -max_len="$3" -timeout=10 -rss_limit_mb=2048 -print_final_stats=1 \
    -artifact_prefix="$build/fuzz-artifacts/${4:+$4-}" "$build/fuzz-corpus$suffix" "$5"
}
run "$bin" "$secs" 4096 "" "$here/corpus"
for name in codec gguf evict store llama; do
  [ -x "$build/tests/fuzz/fuzz_$name" ] || continue
  len=4096
  [ "$name" = gguf ] && len=8192
  t=$((secs / 3 + 1))
  [ "$name" = store ] && t=$((secs / 6 + 1))  # every input makes (and removes) a directory
  [ "$name" = llama ] && t=$((secs / 6 + 1)) && len=16384
  run "$build/tests/fuzz/fuzz_$name" "$t" "$len" "$name" "$here/corpus-$name"
done
