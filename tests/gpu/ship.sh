#!/bin/sh
# Builds the GPU-only configuration here (library, tests/gpu, bench_cuda; sm_90
# machine code) and stages what tests/gpu/run.sh needs on the GPU machine in
# one folder: bin/ (test_cuda, bench_cuda), lib/ (libkvcache.so.N and the
# runtime libraries it links that the GPU machine's image may lack).
# Usage: tests/gpu/ship.sh [SHIP_DIR] (default .gpu-ship, ignored by git).
set -eu
root=$(cd "$(dirname "$0")/../.." && pwd)
ship=${1:-$root/.gpu-ship}
build=$root/build-gpu
cmake -S "$root" -B "$build" -G Ninja -DKVC_GPU_ONLY=ON -DCMAKE_BUILD_TYPE=Release \
  -DCMAKE_CUDA_ARCHITECTURES=90 -DKVC_WERROR=ON >/dev/null
ninja -C "$build" >/dev/null
rm -rf "$ship"
mkdir -p "$ship/bin" "$ship/lib"
cp "$build/tests/gpu/test_cuda" "$build/tests/gpu/bench_cuda" "$ship/bin/"
cp -L "$build/src/libkvcache.so.0" "$ship/lib/"
# OpenSSL's libcrypto, xxHash and hiredis (the Redis tier): present on
# Debian, maybe not on the GPU image.
for dep in libcrypto.so libxxhash.so libhiredis.so; do
  ldd "$build/src/libkvcache.so.0" | awk -v d="$dep" 'index($1, d) == 1 { print $3 }' |
    while read -r p; do cp -L "$p" "$ship/lib/"; done
done
du -sh "$ship"
