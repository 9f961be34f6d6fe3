#!/usr/bin/env python3
"""Derive DuoAttention head gates for a model (docs/eviction.md, "DuoAttention").

DuoAttention (Xiao et al., arXiv 2410.10819) learns one gate per KV head by
distillation on synthetic retrieval data; a head with a low gate is a
streaming head (attention sinks + a recent window), the others keep every
token. This script scores the heads on real text instead: for each KV head in
turn, `kvcache eval` runs the model with that head alone restricted to sinks +
window (the strategy `duo-attention:stream-head=I`, a head-wise pool) and
measures the mean KL divergence from the dense f32 cache over every scored
position. A head's gate is its KL over the largest head's KL: heads that lose
nothing when they stream get gates near 0 and stream first.

Usage (from the repository root, after the build):
    python3 bench/duo/derive_gates.py --model smollm2 --max-tokens 1022 \\
        --out bench/duo/gates-smollm2.txt
The output has one line per layer, num_kv_heads gates each, after a header
that records how it was made; `kvcache eval --head-gates FILE` reads it, and
the files of bench/duo are compiled into `kvcache` as the built-in gates.
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile
import time


def run_eval(tool, args, rows, gates_file):
    cmd = [tool, "eval", "--model", args.model, "--max-tokens", str(args.max_tokens), "--json",
           "--no-progress", "--head-gates", gates_file, "--strategies", ",".join(rows)]
    if args.ctx:
        cmd += ["--ctx", str(args.ctx)]
    if args.threads:
        cmd += ["--threads", str(args.threads)]
    out = subprocess.run(cmd, check=True, stdout=subprocess.PIPE, text=True).stdout
    return json.loads(out), cmd


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="smollm2", help="kvcache eval --model (default smollm2)")
    ap.add_argument("--kvcache", default="build/tools/kvcache", help="the kvcache tool")
    ap.add_argument("--max-tokens", type=int, default=1022, help="tokens scored (default 1022)")
    ap.add_argument("--ctx", type=int, default=0, help="window length (default: the model's)")
    ap.add_argument("--window", type=int, default=64, help="a streaming head's recent window")
    ap.add_argument("--sinks", type=int, default=4, help="a streaming head's attention sinks")
    ap.add_argument("--threads", type=int, default=0, help="eval worker threads")
    ap.add_argument("--out", required=True, help="the gates file to write")
    args = ap.parse_args()
    if args.window < 1 or args.sinks < 0 or args.max_tokens < 1:
        sys.exit("derive_gates: --window >= 1, --sinks >= 0 and --max-tokens >= 1")
    tool = os.path.abspath(args.kvcache)
    if not os.access(tool, os.X_OK):
        sys.exit("derive_gates: %s is not an executable kvcache tool (--kvcache)" % tool)
    t0 = time.time()
    with tempfile.TemporaryDirectory() as tmp:
        probe_gates = os.path.join(tmp, "probe.txt")
        with open(probe_gates, "w") as f:
            f.write("\n")
        # The geometry first (one dense row, few tokens).
        probe = subprocess.run([tool, "eval", "--model", args.model, "--max-tokens", "16", "--json",
                                "--no-progress", "--strategies", "f32"], check=True,
                               stdout=subprocess.PIPE, text=True).stdout
        geo = json.loads(probe)["geometry"]
        layers, kv_heads = int(geo["num_layers"]), int(geo["num_kv_heads"])
        n = layers * kv_heads
        ones = os.path.join(tmp, "ones.txt")
        with open(ones, "w") as f:
            f.write(" ".join(["1"] * n) + "\n")
        rows = ["duo-attention:stream-head=%d:window=%d:sinks=%d" % (i, args.window, args.sinks)
                for i in range(n)]
        report, cmd = run_eval(tool, args, rows, ones)
    kl = {}
    for r in report["results"]:
        for i, spec in enumerate(rows):
            if r["strategy"].startswith(spec + "+"):
                kl[i] = float(r["kl_mean"])
    if len(kl) != n:
        sys.exit("derive_gates: %d of %d heads measured" % (len(kl), n))
    top = max(kl.values())
    gates = [kl[i] / top if top > 0 else 1.0 for i in range(n)]
    seconds = time.time() - t0
    with open(args.out, "w") as f:
        f.write("# DuoAttention gates for %s (%d layers x %d KV heads), by bench/duo/derive_gates.py:\n"
                % (report["model"], layers, kv_heads))
        f.write("# each head's mean KL from the dense f32 cache when it alone keeps %d sinks + the newest %d\n"
                % (args.sinks, args.window))
        f.write("# tokens (kvcache eval, %d tokens in windows of %d), over the largest head's KL.\n"
                % (report["tokens_scored"], report["ctx"]))
        f.write("# Largest KL %.4e (layer %d head %d); %.0f s on %s thread(s).\n"
                % (top, max(kl, key=kl.get) // kv_heads, max(kl, key=kl.get) % kv_heads, seconds,
                   report.get("threads", "?")))
        for l in range(layers):
            f.write(" ".join("%.6f" % gates[l * kv_heads + h] for h in range(kv_heads)) + "\n")
    print("derive_gates: wrote %s (%d gates, %.0f s)" % (args.out, n, seconds))


if __name__ == "__main__":
    main()
