#!/usr/bin/env python3
"""PyTorch baseline for tests/gpu/bench_cuda.cpp: dense f16 decode attention.

Usage: sdpa_baseline.py OUT_DIR [--quick]

Times torch.nn.functional.scaled_dot_product_attention over a dense f16 cache
K, V [batch, 8, tokens, 128] with one query token per sequence,
q [batch, 32, 1, 128] (grouped queries: enable_gqa=True; on a PyTorch without
it, K and V are expanded to 32 heads with repeat_interleave beforehand, outside
the timing, and the script says so). Also times a plain device-to-device
copy (dst.copy_(src)) of a 4 GiB buffer as the bandwidth reference.

Sizes match bench_cuda: batch 64 x 8192 tokens (--quick: batch 8 x 2048,
a 2 GiB copy, 3 repetitions). Each figure is the median of 20 timed runs
(torch.cuda.Event) after 3 warm-up runs.

Writes OUT_DIR/sdpa.json:
  sdpa_us  median time of one attention call, in microseconds
  bytes    bytes of the GQA cache (K and V, [batch, 8, tokens, 128] f16): the
           same KV bytes as bench_cuda's f16 decode, so gbps compare directly
  bytes_read  bytes the timed call reads from K and V (4x bytes with "repeat")
  gbps     bytes / time, in GB/s (1e9)
  method   "enable_gqa" or "repeat"
plus the shape, the copy reference and the versions. bench_cuda reads it.

Exit status: 0 done, 77 PyTorch or a CUDA device missing (skipped).
"""

import json
import os
import statistics
import sys

NUM_Q_HEADS = 32
NUM_KV_HEADS = 8
HEAD_DIM = 128
WARMUP = 3


def parse_args(argv):
    out_dir, quick = None, False
    for arg in argv[1:]:
        if arg == "--quick":
            quick = True
        elif not arg.startswith("-") and out_dir is None:
            out_dir = arg
        else:
            out_dir = None
            break
    if out_dir is None:
        sys.stderr.write("usage: sdpa_baseline.py OUT_DIR [--quick]\n")
        sys.exit(2)
    return out_dir, quick


def time_us(torch, fn, reps):
    """Median time of fn() in microseconds (CUDA events on the current stream)."""
    for _ in range(WARMUP):
        fn()
    torch.cuda.synchronize()
    start = torch.cuda.Event(enable_timing=True)
    stop = torch.cuda.Event(enable_timing=True)
    times = []
    for _ in range(reps):
        start.record()
        fn()
        stop.record()
        stop.synchronize()
        times.append(start.elapsed_time(stop) * 1e3)  # ms -> us
    return statistics.median(times)


def main():
    out_dir, quick = parse_args(sys.argv)
    try:
        import torch
        import torch.nn.functional as F
    except ImportError:
        print("no PyTorch: skipped")
        return 77
    if not torch.cuda.is_available() or torch.cuda.device_count() == 0:
        print("no CUDA device: skipped")
        return 77
    os.makedirs(out_dir, exist_ok=True)

    batch, tokens = (8, 2048) if quick else (64, 8192)
    copy_bytes = (2 if quick else 4) << 30
    reps = 3 if quick else 20
    dev = torch.device("cuda")
    name = torch.cuda.get_device_name(dev)
    print(f"sdpa_baseline: torch {torch.__version__} on {name}" + (", --quick" if quick else ""))

    # Copy reference: read + write of copy_bytes each.
    src = torch.empty(copy_bytes, dtype=torch.uint8, device=dev).fill_(0x3C)
    dst = torch.empty_like(src)
    copy_us = time_us(torch, lambda: dst.copy_(src), reps)
    copy_gbps = 2 * copy_bytes / (copy_us * 1e-6) / 1e9
    del src, dst
    torch.cuda.empty_cache()
    print(f"copy D2D {copy_bytes / 2**30:.2f} GiB: {copy_us:.1f} us, {copy_gbps:.1f} GB/s (read + write)")

    # Dense cache and one query token per sequence, ~N(0, 1).
    gen = torch.Generator(device=dev).manual_seed(0)
    k = torch.randn(batch, NUM_KV_HEADS, tokens, HEAD_DIM, dtype=torch.float16, device=dev, generator=gen)
    v = torch.randn(batch, NUM_KV_HEADS, tokens, HEAD_DIM, dtype=torch.float16, device=dev, generator=gen)
    q = torch.randn(batch, NUM_Q_HEADS, 1, HEAD_DIM, dtype=torch.float16, device=dev, generator=gen)
    kv_bytes = k.numel() * k.element_size() + v.numel() * v.element_size()

    method = "enable_gqa"
    try:
        F.scaled_dot_product_attention(q, k, v, enable_gqa=True)
        torch.cuda.synchronize()
        call = lambda: F.scaled_dot_product_attention(q, k, v, enable_gqa=True)  # noqa: E731
        bytes_read = kv_bytes
    except TypeError:
        # PyTorch before 2.5 has no enable_gqa: expand K/V to the query heads once.
        method = "repeat"
        group = NUM_Q_HEADS // NUM_KV_HEADS
        print(f"enable_gqa unsupported by this PyTorch: K/V repeated {group}x to {NUM_Q_HEADS} heads "
              "(outside the timing)")
        k_rep = k.repeat_interleave(group, dim=1)
        v_rep = v.repeat_interleave(group, dim=1)
        del k, v
        call = lambda: F.scaled_dot_product_attention(q, k_rep, v_rep)  # noqa: E731
        bytes_read = kv_bytes * group

    sdpa_us = time_us(torch, call, reps)
    gbps = kv_bytes / (sdpa_us * 1e-6) / 1e9
    print(f"sdpa ({method}) batch {batch} x {tokens} tokens, {NUM_Q_HEADS}/{NUM_KV_HEADS} heads, "
          f"head_dim {HEAD_DIM}: {sdpa_us:.1f} us, {gbps:.1f} GB/s of the GQA cache "
          f"({gbps / copy_gbps:.3f} of copy)")

    result = {
        "sdpa_us": sdpa_us,
        "bytes": kv_bytes,
        "bytes_read": bytes_read,
        "gbps": gbps,
        "method": method,
        "batch": batch,
        "tokens": tokens,
        "num_q_heads": NUM_Q_HEADS,
        "num_kv_heads": NUM_KV_HEADS,
        "head_dim": HEAD_DIM,
        "copy_bytes": copy_bytes,
        "copy_us": copy_us,
        "copy_gbps": copy_gbps,
        "fraction_of_copy": gbps / copy_gbps,
        "repetitions": reps,
        "warmup": WARMUP,
        "device": name,
        "torch_version": torch.__version__,
        "cuda_version": torch.version.cuda,
        "quick": quick,
    }
    path = os.path.join(out_dir, "sdpa.json")
    with open(path, "w") as f:
        json.dump(result, f, indent=2)
        f.write("\n")
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
