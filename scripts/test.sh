#!/usr/bin/env bash
# The full test suite (README's test command; .ci/run runs it):
#   1. setup        Debian packages and the Python venvs of the hf_* / kvpress_* tests (scripts/setup.sh;
#                   the venvs once per machine), the SmolLM2 GGUF (scripts/fetch-models.sh)
#   2. main         RelWithDebInfo build, -DKVC_WERROR=ON, every ctest test; the only
#                   build with the CUDA kernels (when nvcc is found: cuda_* tests skip
#                   without a GPU) and the language bindings (python_, java_, go_, rust_)
#   3. asan         ASan + UBSan build (tools included, bench not), every ctest test but the two
#                   longest SmolLM2 agreement runs and eval_long (they run in main)
#   4. tsan         ThreadSanitizer build, the threaded tests (core_threads*, prefix_threads*, attention_threads*,
#                   the tiers' concurrent tests)
#   5. fuzz         clang libFuzzer build, fuzz_pool_api for KVC_FUZZ_SECONDS (60), then fuzz_codec, fuzz_gguf and fuzz_evict for a third of it each and fuzz_store and fuzz_llama for a sixth each
#   6. bench        bench/run_quick.sh on the main build (JSON), then `kvcache bench --quick`
# Every stage runs even when an earlier one failed (the build stages a later
# one needs excepted); the summary lists each with its time, and the exit
# status is non-zero when any failed.
# Environment: KVC_JOBS (2), KVC_BUILD_PREFIX (build-ci: build-ci-main, ...),
# KVC_FUZZ_SECONDS (60), KVC_STAGES (all: "setup main asan tsan fuzz bench"),
# KVC_CCACHE (1: the C / C++ compiles of the stages' builds go through ccache where it is
# installed, so a later run on the same machine recompiles only what changed; 0: never),
# KVCACHE_SHARED_DIR (the shared models and text; default ../shared beside the checkout).
set -uo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
shared=${KVCACHE_SHARED_DIR:-$root/../shared}
if [ ! -f "$shared/models/stories260K.bin" ]; then
  echo "error: no shared models and text in $shared (models/stories260K.bin): put the project's" \
    "shared folder beside the checkout as ../shared, or set KVCACHE_SHARED_DIR to it" >&2
  exit 1
fi
shared=$(cd "$shared" && pwd)
export KVCACHE_SHARED_DIR=$shared
jobs=${KVC_JOBS:-2}
prefix=${KVC_BUILD_PREFIX:-build-ci}
fuzz_seconds=${KVC_FUZZ_SECONDS:-60}
stages=${KVC_STAGES:-setup main asan tsan fuzz bench}
export CTEST_OUTPUT_ON_FAILURE=1
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}

declare -a summary=()
failed=0
t_all=$(date +%s)

want() { [[ " $stages " == *" $1 "* ]]; }

# run_stage NAME COMMAND...: runs the command, records PASS/FAIL and the time.
run_stage() {
  local name=$1
  shift
  local t0 rc
  t0=$(date +%s)
  echo
  echo "=== [$name] $(date +%H:%M:%S)"
  "$@"
  rc=$?
  local dt=$(( $(date +%s) - t0 ))
  if [ $rc -eq 0 ]; then
    summary+=("$(printf '%-6s PASS %5ds' "$name" "$dt")")
  else
    summary+=("$(printf '%-6s FAIL %5ds (exit %d)' "$name" "$dt" "$rc")")
    failed=1
  fi
  return $rc
}

# ccache: every checkout's paths are rewritten relative to it (CCACHE_BASEDIR) and
# the build folder is left out of the hash, so a fresh clone elsewhere hits the
# objects of an earlier one (their debug info names the first clone's folders).
# Looked up at each configure: the setup stage may have installed it.
launcher=()
find_ccache() {
  # (empty launchers, not none: a build folder configured with ccache before
  # keeps it in its cache otherwise)
  launcher=(-DCMAKE_C_COMPILER_LAUNCHER= -DCMAKE_CXX_COMPILER_LAUNCHER=)
  if [ "${KVC_CCACHE:-1}" != 0 ] && command -v ccache >/dev/null 2>&1; then
    launcher=(-DCMAKE_C_COMPILER_LAUNCHER=ccache -DCMAKE_CXX_COMPILER_LAUNCHER=ccache)
    export CCACHE_BASEDIR=$root CCACHE_NOHASHDIR=true
  fi
}

configure_build() {  # DIR CMAKE_ARGS...
  local dir=$1
  shift
  mkdir -p "$dir"
  find_ccache
  cmake -S . -B "$dir" -G Ninja -DKVC_SHARED_DIR="$shared" "${launcher[@]}" "$@" > "$dir/configure.log" 2>&1 ||
    { cat "$dir/configure.log"; return 1; }
  # Full log in the build folder; on failure show the failing commands and errors.
  if ! cmake --build "$dir" -j "$jobs" > "$dir/build.log" 2>&1; then
    grep -E 'FAILED:|error|undefined reference' "$dir/build.log" | head -n 40
    echo "build failed: $dir/build.log" >&2
    return 1
  fi
  echo "built $dir ($(grep -c 'warning:' "$dir/build.log") warning lines; log: $dir/build.log)"
  return 0
}

# ctest's "100% tests passed" line counts skipped tests (the cuda_* tests
# without a GPU, tests whose service is missing) as passed: name them.
run_ctest() {
  local log rc skipped
  log=$(mktemp)
  ctest "$@" 2>&1 | tee "$log"
  rc=${PIPESTATUS[0]}
  skipped=$(grep '\*\*\*Skipped' "$log" | awk '{print $4}' | tr '\n' ' ')
  if [ -n "$skipped" ]; then
    echo "skipped, not passed ($(echo "$skipped" | wc -w)): $skipped"
  fi
  rm -f "$log"
  return "$rc"
}

stage_main() {
  configure_build "$prefix-main" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DKVC_WERROR=ON || return 1
  run_ctest --test-dir "$prefix-main" -j "$jobs" --output-on-failure
}

# Sanitizer builds keep warnings but not -Werror: instrumentation makes GCC
# report false positives (-Wmaybe-uninitialized in libstdc++'s <regex>, ...).
stage_asan() {
  configure_build "$prefix-asan" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DKVC_SANITIZE=ON -DKVC_WERROR=OFF \
    -DKVC_BUILD_BENCH=OFF -DKVC_CUDA=OFF || return 1
  # The two longest model-agreement runs (SmolLM2 against llama.cpp's numbers,
  # ~4 min under ASan) and eval_long (stories260K at 8x its trained context,
  # ~1.2 min under ASan) stay in the main stage; the same runner and eval code
  # is checked here by the shorter smollm2_* and eval_* tests.
  ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:strict_string_checks=1:detect_stack_use_after_return=1} \
    run_ctest --test-dir "$prefix-asan" -j "$jobs" --output-on-failure \
    -E '^(smollm2_logprobs_match_llamacpp|smollm2_eval_short|eval_long)$'
}

stage_tsan() {
  configure_build "$prefix-tsan" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DKVC_TSAN=ON -DKVC_WERROR=OFF \
    -DKVC_BUILD_TOOLS=OFF -DKVC_BUILD_BENCH=OFF -DKVC_CUDA=OFF || return 1
  # TSan needs a fixed address-space layout on kernels with high mmap entropy.
  local norand=()
  if command -v setarch >/dev/null 2>&1 && setarch "$(uname -m)" -R true 2>/dev/null; then
    norand=(setarch "$(uname -m)" -R)
  fi
  local n
  local tests='^(core_threads|core_state_concurrent|prefix_threads|attention_threads|tier_host_threads|tier_host_random_ops|tier_host_prefetch_poll|tier_host_load_timeout|tier_disk_readers_and_writers_race|tier_redis_readers_race_writer)'
  n=$(ctest --test-dir "$prefix-tsan" -N -R "$tests" | grep -c 'Test *#')
  if [ "$n" -eq 0 ]; then
    echo "no threaded tests registered" >&2
    return 1
  fi
  TSAN_OPTIONS=${TSAN_OPTIONS:-halt_on_error=1:second_deadlock_stack=1} \
    "${norand[@]}" ctest --test-dir "$prefix-tsan" -R "$tests" --output-on-failure
}

stage_fuzz() {
  local dir="$prefix-fuzz"
  mkdir -p "$dir"
  find_ccache
  CC=clang CXX=clang++ cmake -S . -B "$dir" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo "${launcher[@]}" \
    -DKVC_SHARED_DIR="$shared" -DKVC_FUZZ=ON -DKVC_BUILD_TOOLS=OFF -DKVC_BUILD_BENCH=OFF -DKVC_CUDA=OFF > "$dir/configure.log" 2>&1 ||
    { cat "$dir/configure.log"; return 1; }
  cmake --build "$dir" -j "$jobs" --target fuzz_pool_api fuzz_codec fuzz_gguf fuzz_evict fuzz_store fuzz_llama > "$dir/build.log" 2>&1 ||
    { grep -E "FAILED:|error|undefined reference" "$dir/build.log" | head -n 40; return 1; }
  sh tests/fuzz/run_fuzzer.sh "$dir" "$fuzz_seconds" 2>&1 |
    grep -v -E '^#[0-9]+[[:space:]]+(NEW|REDUCE|pulse)'
  return "${PIPESTATUS[0]}"
}

stage_bench() {
  [ -x "$prefix-main/bench/bench_pool" ] || { echo "main build has no bench_pool" >&2; return 1; }
  sh bench/run_quick.sh "$prefix-main" > "$prefix-main/bench-quick.stdout.json"
  # The tool's own suite: every case beside its baseline; fails on a crash or an
  # error status, never on a slow figure.
  "$prefix-main/tools/kvcache" bench --quick
}

if want setup; then
  run_stage setup bash -c 'bash scripts/setup.sh && bash scripts/fetch-models.sh' ||
    { echo "setup failed: stopping" >&2; exit 1; }
fi
want main && run_stage main stage_main
want asan && run_stage asan stage_asan
want tsan && run_stage tsan stage_tsan
want fuzz && run_stage fuzz stage_fuzz
want bench && run_stage bench stage_bench

echo
echo "=== summary ($(( $(date +%s) - t_all ))s in all)"
printf '  %s\n' "${summary[@]}"
if [ $failed -ne 0 ]; then
  echo "FAILED"
  exit 1
fi
echo "all stages passed"
