#!/bin/sh
# The GPU run: GPU tests, then the GPU benchmarks, results in OUT_DIR.
# On the GPU machine (nvcc, CMake, ninja, python3 with PyTorch; no Debian
# -dev packages, no ../shared). Uses the build that tests/gpu/ship.sh staged
# (sm_90); if that will not run there, builds the GPU-only configuration
# from source (needs OpenSSL and xxHash headers).
# Usage: tests/gpu/run.sh OUT_DIR [SHIP_DIR] [--quick]
# Finishes within 10 minutes on one H200 (each step has its own time limit).
set -u
out=${1:?usage: run.sh OUT_DIR [SHIP_DIR] [--quick]}
root=$(cd "$(dirname "$0")/../.." && pwd)
ship=${2:-$root/.gpu-ship}
quick=
for a in "$@"; do [ "$a" = --quick ] && quick=--quick; done
mkdir -p "$out"
log=$out/run.log
say() { echo "$*" | tee -a "$log"; }
( nvidia-smi || true ) >"$out/nvidia-smi.txt" 2>&1
export LD_LIBRARY_PATH="$ship/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
bin=$ship/bin
"$bin/test_cuda" errors >/dev/null 2>&1
rc=$?
if [ $rc -ne 0 ] && [ $rc -ne 1 ] && [ $rc -ne 77 ]; then
  say "shipped build does not run here (exit $rc): building from source"
  cmake -S "$root" -B /tmp/kvc-gpu-build -G Ninja -DKVC_GPU_ONLY=ON -DCMAKE_BUILD_TYPE=Release \
    -DCMAKE_CUDA_ARCHITECTURES=90 >>"$log" 2>&1 && ninja -C /tmp/kvc-gpu-build >>"$log" 2>&1 || say "build failed"
  bin=/tmp/kvc-gpu-build/tests/gpu
  export LD_LIBRARY_PATH=/tmp/kvc-gpu-build/src
fi
status=0
step() {  # step NAME SECONDS COMMAND...
  name=$1 secs=$2
  shift 2
  t0=$(date +%s)
  timeout "$secs" "$@" >"$out/$name.txt" 2>&1
  rc=$?
  say "$name: exit $rc in $(( $(date +%s) - t0 )) s"
  tail -3 "$out/$name.txt" | sed 's/^/    /' | tee -a "$log"
  [ $rc -eq 0 ] || status=1
}
for mode in errors codecs attention evict stream; do
  step "cuda_$mode" 120 "$bin/test_cuda" "$mode"
done
step sdpa_baseline 150 python3 "$root/tests/gpu/sdpa_baseline.py" "$out" $quick
step bench_cuda 200 "$bin/bench_cuda" "$out" $quick
if command -v compute-sanitizer >/dev/null 2>&1; then
  step memcheck_codecs 150 compute-sanitizer --tool memcheck --error-exitcode 9 "$bin/test_cuda" codecs
fi
say "done (status $status)"
exit $status
