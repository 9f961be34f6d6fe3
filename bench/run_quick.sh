#!/bin/sh
# Quick benchmark run for CI: every benchmark of bench_pool briefly, JSON on
# stdout (and in BUILD_DIR/bench-quick.json), then a summary against the
# targets of issue 2. Timing targets are reported, not enforced (a shared CI
# machine is noisy); a benchmark that fails to run fails the script.
# Usage: bench/run_quick.sh BUILD_DIR [extra Google Benchmark flags]
set -eu
build=$1
shift
bin="$build/bench/bench_pool"
[ -x "$bin" ] || { echo "no $bin (is libbenchmark-dev installed?)" >&2; exit 1; }
out="$build/bench-quick.json"
"$bin" --benchmark_min_time=0.05 --benchmark_repetitions=3 --benchmark_report_aggregates_only=true \
  --benchmark_format=json --benchmark_out="$out" --benchmark_out_format=json "$@" > /dev/null
cat "$out"
codec_bin="$build/bench/bench_codec"
codec_out="$build/bench-codec-quick.json"
if [ -x "$codec_bin" ]; then
  "$codec_bin" --benchmark_min_time=0.05 --benchmark_repetitions=3 --benchmark_report_aggregates_only=true \
    --benchmark_format=json --benchmark_out="$codec_out" --benchmark_out_format=json > /dev/null
  cat "$codec_out"
else
  codec_out=""
fi
attn_bin="$build/bench/bench_attention"
attn_out="$build/bench-attention-quick.json"
if [ -x "$attn_bin" ]; then
  "$attn_bin" --benchmark_min_time=0.05 --benchmark_repetitions=3 --benchmark_report_aggregates_only=true \
    --benchmark_format=json --benchmark_out="$attn_out" --benchmark_out_format=json > /dev/null
  cat "$attn_out"
else
  attn_out=""
fi
prefix_bin="$build/bench/bench_prefix"
prefix_out="$build/bench-prefix-quick.json"
if [ -x "$prefix_bin" ]; then
  "$prefix_bin" --benchmark_min_time=0.05 --benchmark_repetitions=3 --benchmark_report_aggregates_only=true \
    --benchmark_format=json --benchmark_out="$prefix_out" --benchmark_out_format=json > /dev/null
  cat "$prefix_out"
else
  prefix_out=""
fi
python3 - "$out" "${codec_out:-none}" "${attn_out:-none}" "${prefix_out:-none}" <<'PY'
import json, sys
runs = {b["name"]: b for b in json.load(open(sys.argv[1]))["benchmarks"]}
def get(name, field="real_time"):
    b = runs.get(name + "_median") or runs.get(name)
    return None if b is None else b[field]
def line(text, ok):
    print(f"  {text:70s} {'meets target' if ok else 'MISSES target'}", file=sys.stderr)
print("bench summary (medians of 3):", file=sys.stderr)
for size in ("1024", "1048576"):
    one = get(f"BM_ReserveFreeOneBlock/{size}")
    bulk = get(f"BM_ReserveFree256Blocks/{size}")
    if one is not None:
        line(f"reserve+free 1 block, pool of {size} blocks: {one:.1f} ns", one < 50)
    if bulk is not None:
        line(f"reserve+free 256 blocks, pool of {size}: {bulk / 256:.2f} ns per block", bulk / 256 < 10)
for name, per in (("BM_ReserveFreeOneBlock", 1), ("BM_ReserveFree256Blocks", 256)):
    a, b = get(f"{name}/1024"), get(f"{name}/1048576")
    if a and b:
        r = max(a, b) / min(a, b)
        line(f"{name}: 1M-block vs 1k-block pool time ratio {r:.2f} (O(1): within 1.5x)", r <= 1.5)
app, mem = get("BM_AppendF16", "bytes_per_second"), get("BM_MemcpySamePattern", "bytes_per_second")
if app and mem:
    line(f"append f16 16 tokens x 8 heads x 128: {app / 1e9:.2f} GB/s, memcpy {mem / 1e9:.2f} GB/s, "
         f"ratio {app / mem:.2f}", app / mem >= 0.5)
# kvc_append of a decode step's 16 rows into quantized pools (the pool's own
# path: checks, encoding into the blocks), against the same memcpy
for arg, name in (("0", "int8 per token"), ("1", "int4 group 32"), ("2", "int4 g32 full range Hadamard")):
    aq = get(f"BM_AppendQuantized/{arg}", "bytes_per_second")
    if aq and mem:
        line(f"append f16 16 tokens into an {name} pool: {aq / 1e9:.2f} GB/s, ratio {aq / mem:.2f}",
             aq / mem >= (0.7 if arg == "0" else 0.5))
codec_out = sys.argv[2] if len(sys.argv) > 2 and sys.argv[2] != "none" else None
attn_out = sys.argv[3] if len(sys.argv) > 3 and sys.argv[3] != "none" else None
prefix_out = sys.argv[4] if len(sys.argv) > 4 and sys.argv[4] != "none" else None
for layers in ("1", "32"):
    f = get(f"BM_ForkFree/{layers}")
    if f is not None:
        print(f"  fork+free of a 4096-token sequence, {layers} layer(s): {f / 1000:.2f} us", file=sys.stderr)
if codec_out:
    cr = {b["name"]: b for b in json.load(open(codec_out))["benchmarks"]}
    def cget(name):
        b = cr.get(name + "_median") or cr.get(name)
        return None if b is None else b.get("bytes_per_second")
    targets = {"int8_per_token": (1.0, 0.7)}
    names = ["int8_per_token", "int4_group32", "int4_group32_hadamard", "int3_group32", "int2_group32_asym",
             "fp8_e4m3_per_token", "fp8_e5m2_per_token", "int4_group32_full_range_hadamard"]
    for tokens in ("16", "4096"):
        mem = cget(f"BM_CodecMemcpy/{tokens}")
        for i, name in enumerate(names):
            q, d = cget(f"BM_Quantize/{i}/{tokens}"), cget(f"BM_Dequantize/{i}/{tokens}")
            if q and d and mem:
                tq, td = targets.get(name, (0.5, 0.5))
                line(f"{name} {tokens} tokens: quantize {q / mem:.2f}x, dequantize {d / mem:.2f}x memcpy",
                     q / mem >= tq and d / mem >= td)
if attn_out:
    ar = {b["name"]: b for b in json.load(open(attn_out))["benchmarks"]}
    def aget(name, field="real_time"):
        b = ar.get(name + "/real_time_median") or ar.get(name + "_median") or ar.get(name)
        return None if b is None else b.get(field)
    for batch in ("1", "8"):
        dense = aget(f"BM_AttnDense/{batch}")
        mem = aget(f"BM_AttnMemcpy/{batch}", "bytes_per_second")
        for th in ("1", "2"):
            f16 = aget(f"BM_AttnPaged/0/{batch}/{th}")
            bw = aget(f"BM_AttnPaged/0/{batch}/{th}", "bytes_per_second")
            tag = f"batch {batch}, {th} thread(s)"
            if f16 and dense:
                line(f"decode attention f16, {tag}: {f16:.2f} ms, dense loop (1 thread) {dense:.2f} ms, ratio {dense / f16:.2f}",
                     dense / f16 >= 0.8)
            if bw and mem:
                line(f"decode attention f16, {tag}: {bw / mem:.2f}x memcpy bandwidth over its K/V bytes", bw / mem >= 0.4)
            for st, name in (("1", "int8"), ("2", "int4 group 32"), ("3", "int4 per token"),
                             ("4", "fp8 e4m3 per token"), ("5", "KIVI int4 (keys per channel)")):
                t = aget(f"BM_AttnPaged/{st}/{batch}/{th}")
                if t and f16:
                    line(f"decode attention {name}, {tag}: {t:.2f} ms vs f16 {f16:.2f} ms", t <= f16)
                if t and f16 and batch == "1" and th == "1" and st in ("1", "3"):
                    goal = 1.6 if st == "1" else 2.5  # the CPU hot-path goals (kvcache bench's goals)
                    label = "int8 per token" if st == "1" else "int4 per token"
                    line(f"decode attention {label}, 1 sequence, 1 thread: {f16 / t:.2f}x the f16 decode "
                         f"(goal >= {goal}x)", f16 / t >= goal)
    ev, evm = aget("BM_EvictHalf", "bytes_per_second"), aget("BM_EvictMemcpy", "bytes_per_second")
    if ev and evm:
        line(f"evict half of 4096 tokens (f16, 8 x 128): {ev / evm:.2f}x memcpy of the bytes moved", ev / evm >= 0.5)
if prefix_out:
    pr = {b["name"]: b for b in json.load(open(prefix_out))["benchmarks"]}
    def pget(name):
        b = pr.get(name + "_median") or pr.get(name)
        v = None if b is None else b.get("ns_per_token")
        return None if v is None else v * 1e9  # the counter is seconds per token
    for h, name, target in (("0", "SHA-256", 10.0), ("1", "XXH3-128", 2.0)):
        per = {}
        for blocks in ("1", "64", "2048"):
            t, base = pget(f"BM_PrefixLookup/{h}/{blocks}"), pget(f"BM_HashPass/{h}/{blocks}")
            if t is not None:
                per[blocks] = t
                line(f"prefix lookup {name}, {blocks} cached blocks of 16: {t:.2f} ns/token (hash alone {base:.2f})",
                     t < target)
        if "64" in per and "2048" in per:
            line(f"prefix lookup {name}: 2048 vs 64 blocks cost per token {per['2048'] / per['64']:.2f}x (flat: within 1.5x)",
                 per["2048"] / per["64"] <= 1.5)
# The CPU hot-path goals of the Google Benchmark rows (beside kvcache bench's
# goals section): each with its measured ratio and whether this run meets it.
goals = []
def goal(text, value, target, higher=True, unit="x"):
    if value is None:
        return
    ok = value >= target if higher else value < target
    goals.append((text, f"{value:.2f}{unit}", f"goal {'>=' if higher else '<'} {target}{unit}", ok))
if codec_out:
    mem4096, mem16 = cget("BM_CodecMemcpy/4096"), cget("BM_CodecMemcpy/16")
    q, d = cget("BM_Quantize/2/4096"), cget("BM_Dequantize/2/4096")
    if mem4096:
        goal("Hadamard-rotated int4 quantize vs memcpy", q and q / mem4096, 0.5)
        goal("Hadamard-rotated int4 dequantize vs memcpy", d and d / mem4096, 0.5)
    if mem16:
        a8, a4 = cget("BM_Quantize/0/16"), cget("BM_Quantize/1/16")
        goal("one decode step's append, 16 rows, int8 vs memcpy", a8 and a8 / mem16, 0.7)
        goal("one decode step's append, 16 rows, int4 vs memcpy", a4 and a4 / mem16, 0.5)
# the same goals through a pool (kvc_append, K and V, bench_pool)
mem_pool = get("BM_MemcpySamePattern", "bytes_per_second")
for arg, label, target in (("0", "int8", 0.7), ("1", "int4", 0.5)):
    aq = get(f"BM_AppendQuantized/{arg}", "bytes_per_second")
    goal(f"kvc_append of 16 rows into an {label} pool vs memcpy", aq and mem_pool and aq / mem_pool, target)
if attn_out:
    bw, mem = aget("BM_AttnPaged/0/8/2", "bytes_per_second"), aget("BM_AttnMemcpy/8", "bytes_per_second")
    goal("decode f16, batch 8, 2 threads vs memcpy", bw and mem and bw / mem, 0.9)
    f16 = aget("BM_AttnPaged/0/1/1")
    for st, label, target in (("1", "decode int8 per token vs f16, 1 thread", 1.6),
                              ("3", "decode int4 per token vs f16, 1 thread", 2.5)):
        t = aget(f"BM_AttnPaged/{st}/1/1")
        goal(label, t and f16 and f16 / t, target)
        # the same keys against an int8 query (KVC_QUERY_INT8; AVX-512 VNNI where the CPU has it)
        t = aget(f"BM_AttnPagedQ8/{st}/1/1")
        goal(label.replace("per token", "per token, int8 query,"), t and f16 and f16 / t, target)
    # int8 / int4 values summed in integers too (KVC_QUERY_INT8_VALUES)
    for st, label, target in (("1", "decode int8 per token, int8 query and values, vs f16", 1.6),
                              ("3", "decode int4 per token, int8 query and values, vs f16", 2.5)):
        t = aget(f"BM_AttnPagedQ8V/{st}/1/1")
        goal(label, t and f16 and f16 / t, target)
if prefix_out:
    goal("prefix lookup XXH3-128, 2048 cached blocks", pget("BM_PrefixLookup/1/2048"), 1.5, False, " ns/token")
if goals:
    print("goals (CPU hot paths, Google Benchmark rows; ratios of this run, noisy on a shared machine):",
          file=sys.stderr)
    for text, val, tgt, ok in goals:
        print(f"  {text:52s} {val:>14s}   {tgt:18s} {'meets target' if ok else 'below target'}",
              file=sys.stderr)
PY
# The offload tiers (issue 9): host and disk tiers against memcpy and plain
# file I/O of the same bytes, the Redis tier's 64 KiB get against
# redis-benchmark's one-client GET of the same size (bench/redis_baseline.sh).
tier_bin="$build/bench/bench_tier"
if [ -x "$tier_bin" ]; then
  tier_out="$build/bench-tier-quick.json"
  "$tier_bin" --benchmark_min_time=0.05 --benchmark_repetitions=3 --benchmark_report_aggregates_only=true \
    --benchmark_format=json --benchmark_out="$tier_out" --benchmark_out_format=json > /dev/null
  cat "$tier_out"
  rb=""
  if rb_out=$(bash "$(dirname "$0")/redis_baseline.sh" 2000 65536 2>/dev/null); then
    rb=$(printf '%s\n' "$rb_out" | awk '/one client/ {getline; for (i = 1; i <= NF; i++) if ($i ~ /^[0-9.]+$/) { print $i; exit }}')
  fi
  python3 - "$tier_out" "${rb:-none}" <<'PY'
import json, sys
runs = {b["name"]: b for b in json.load(open(sys.argv[1]))["benchmarks"]}
def get(name, field="bytes_per_second"):
    for suffix in ("/real_time_median", "_median", ""):
        b = runs.get(name + suffix)
        if b is not None and field in b:
            return b[field]
    return None
def line(text, ok):
    print(f"  {text:78s} {'meets target' if ok else 'MISSES target'}", file=sys.stderr)
print("bench summary, offload tiers (medians of 3; target >= 0.5x the baseline):", file=sys.stderr)
for size, label in (("65536", "64 KiB"), ("1048576", "1 MiB")):
    for case, base, what in (("BM_HostPut", "BM_Memcpy", "host put vs memcpy"),
                             ("BM_HostGet", "BM_MemcpyFrom", "host get vs memcpy"),
                             ("BM_DiskPut", "BM_FileWrite", "disk put vs plain file write"),
                             ("BM_DiskGet", "BM_FileRead", "disk get vs plain file read")):
        a, b = get(f"{case}/{size}"), get(f"{base}/{size}")
        if a and b:
            line(f"{what}, {label}: {a / 1e9:.2f} vs {b / 1e9:.2f} GB/s = {a / b:.2f}x", a / b >= 0.5)
rt = get("BM_RedisGet/65536", "real_time")
if rt is not None:
    unit = runs.get("BM_RedisGet/65536/real_time_median", {}).get("time_unit", "ns")
    us = rt / 1000.0 if unit == "ns" else rt
    rps = None if sys.argv[2] == "none" else float(sys.argv[2])
    if rps:
        base = 1e6 / rps
        print(f"  Redis get 64 KiB on loopback: {us:.1f} us per get; redis-benchmark GET (1 client): {base:.1f} us "
              f"({us / base:.2f}x its round trip)", file=sys.stderr)
        print(f"  goal: Redis get 64 KiB <= 1.1x redis-benchmark's GET: {us / base:.2f}x   "
              f"{'meets target' if us / base <= 1.1 else 'below target'}", file=sys.stderr)
    else:
        print(f"  Redis get 64 KiB on loopback: {us:.1f} us per get (redis-benchmark not run)", file=sys.stderr)
else:
    print("  Redis get: not measured (no redis-server)", file=sys.stderr)
PY
fi
