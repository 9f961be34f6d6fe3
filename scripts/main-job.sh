#!/usr/bin/env bash
# The main job: install what is needed, build Release, and run the `kvcache`
# tool's evaluation on the real model with its defaults
# (../shared/models, ../shared/data; KVCACHE_SHARED_DIR points elsewhere).
# Extra arguments go to `kvcache eval`.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
bash scripts/setup.sh
build=${KVC_MAIN_BUILD:-build}
jobs=${KVC_JOBS:-2}
cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release > /dev/null
cmake --build "$build" -j "$jobs" --target kvcache_cli
exec "$build/tools/kvcache" eval "$@"
