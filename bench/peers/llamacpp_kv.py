#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""llama.cpp's KV cache types measured on the same work as `kvcache eval`.

Runs llama.cpp (through llama-cpp-python, installed into a virtual environment
by this script when missing: it builds llama.cpp, which takes a long time on a
small machine) on a GGUF model with K and V cache types f16, q8_0, q4_0, q4_1
and q5_0 (flash attention on, as llama.cpp requires for quantized V), over the
same token windows and scored positions as `kvcache eval` does for a model
without BOS: windows of CTX positions, each starting with the token before its
first scored one, windows advancing by CTX - 1 tokens, the first MAX_TOKENS
tokens after the text's first scored. Reports per type: perplexity, its change
against f16, mean KL divergence from the f16 distribution over the full
vocabulary, top-1 agreement with f16, and KV bytes per token
(2 x layers x KV heads x head_dim x bits / 8; q8_0 = 8.5 bits, q4_0 = 4.5,
q4_1 = 5, q5_0 = 5.5: a 32-value block plus its f16 scale / min).

Since llama.cpp PR 21038 (March 2026, in llama-cpp-python 0.3.36), a quantized
K or V cache turns on llama.cpp's attention rotation: Q, K and V are multiplied
by a normalized Hadamard matrix of the head size before K/V are stored, and the
attention output is rotated back. A type named `T-norot` (e.g. `q4_0-norot`)
measures the same cache type with that rotation off (LLAMA_ATTN_ROT_DISABLE=1
while its context is created), i.e. the plain q4_0 rounding of K and V; the
plain name is llama.cpp's default (rotated where llama.cpp rotates).

  python3 bench/peers/llamacpp_kv.py [--model PATH] [--text PATH] [--ctx 512]
      [--max-tokens 4096] [--types f16,q8_0,q4_0,q4_1,q5_0,q4_0-norot] [--json OUT]
      [--venv DIR]

`kvcache eval --model smollm2 --peer FILE` prints our strategies and these rows in
one table (FILE is this script's --json output).
"""
import argparse
import hashlib
import json
import math
import os
import struct
import subprocess
import sys
import time

GGML_TYPES = {"f32": 0, "f16": 1, "q4_0": 2, "q4_1": 3, "q5_0": 6, "q5_1": 7, "q8_0": 8}
BITS = {"f32": 32.0, "f16": 16.0, "q8_0": 8.5, "q4_0": 4.5, "q4_1": 5.0, "q5_0": 5.5, "q5_1": 6.0}
LLAMA_CPP_PYTHON = "llama-cpp-python==0.3.36"
NOROT = "-norot"


def base_type(t):
    """The ggml type of a --types entry: 'q4_0-norot' -> 'q4_0'."""
    return t[:-len(NOROT)] if t.endswith(NOROT) else t


def ensure_llama_cpp(venv):
    try:
        import llama_cpp  # noqa: F401
        return
    except ImportError:
        pass
    py = os.path.join(venv, "bin", "python")
    if os.path.abspath(sys.executable) == os.path.abspath(py):
        sys.exit("llamacpp_kv: llama_cpp is missing inside the virtual environment " + venv)
    if not os.path.exists(py):
        print(f"llamacpp_kv: creating {venv} and installing {LLAMA_CPP_PYTHON} (builds llama.cpp)", file=sys.stderr)
        subprocess.check_call([sys.executable, "-m", "venv", venv])
        subprocess.check_call([py, "-m", "pip", "install", "-q", LLAMA_CPP_PYTHON, "numpy"])
    os.execv(py, [py] + sys.argv)


def default_model():
    cache = os.environ.get("KVCACHE_MODEL_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache"), "kvcache")
    return os.path.join(cache, "SmolLM2-135M-Instruct.Q4_1.gguf")


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    root = os.path.dirname(os.path.dirname(here))
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=default_model())
    ap.add_argument("--text", default=os.path.join(os.environ.get("KVCACHE_SHARED_DIR") or
                                                   os.path.join(root, "..", "shared"),
                                                   "data", "tinystories-valid-sample.txt"))
    ap.add_argument("--ctx", type=int, default=512)
    ap.add_argument("--max-tokens", type=int, default=4096)
    ap.add_argument("--types", default="f16,q8_0,q4_0,q4_1,q5_0,q8_0-norot,q4_0-norot")
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--json", help="write the results as JSON to this file")
    ap.add_argument("--venv", default=os.path.join(root, ".venv-peers"))
    a = ap.parse_args()
    types = a.types.split(",")
    for t in types:
        if base_type(t) not in GGML_TYPES or (t.endswith(NOROT) and base_type(t) in ("f16", "f32")):
            sys.exit(f"llamacpp_kv: unknown KV type '{t}' (known: {', '.join(GGML_TYPES)}; "
                     f"quantized ones also as TYPE{NOROT})")
    if "f16" not in types:
        types.insert(0, "f16")
    if a.ctx < 2 or a.max_tokens < 1:
        sys.exit("llamacpp_kv: --ctx must be >= 2 and --max-tokens >= 1")
    if not os.path.exists(a.model):
        sys.exit(f"llamacpp_kv: no model at {a.model} (scripts/fetch-models.sh fetches SmolLM2)")
    ensure_llama_cpp(a.venv)
    import numpy as np
    import llama_cpp

    with open(a.text, "rb") as f:
        text = f.read()
    models = {}
    for t in types:
        # llama.cpp reads LLAMA_ATTN_ROT_DISABLE when a context's KV cache is made.
        if t.endswith(NOROT):
            os.environ["LLAMA_ATTN_ROT_DISABLE"] = "1"
        else:
            os.environ.pop("LLAMA_ATTN_ROT_DISABLE", None)
        g = GGML_TYPES[base_type(t)]
        models[t] = llama_cpp.Llama(model_path=a.model, n_ctx=a.ctx, n_batch=a.ctx, n_ubatch=a.ctx, logits_all=True,
                                    flash_attn=True, type_k=g, type_v=g,
                                    n_threads=a.threads, seed=0, verbose=False)
    os.environ.pop("LLAMA_ATTN_ROT_DISABLE", None)
    ref = models["f16"]
    tokens = ref.tokenize(text, add_bos=False, special=False)
    n_scored = min(a.max_tokens, len(tokens) - 1)
    windows = []
    first = 1
    while first < 1 + n_scored:
        scored = min(a.ctx - 1, 1 + n_scored - first)
        windows.append((first, scored))
        first += a.ctx - 1
    sums = {t: {"nll": 0.0, "kl": 0.0, "top1": 0, "n": 0, "seconds": 0.0} for t in types}
    for first, scored in windows:
        ids = tokens[first - 1:first + scored]  # lead token + the scored ones; the last is target only
        feed = ids[:scored]
        logp = {}
        for t in types:
            m = models[t]
            m.reset()
            t0 = time.perf_counter()
            m.eval(feed)
            sums[t]["seconds"] += time.perf_counter() - t0
            x = np.array(m.scores[:scored], dtype=np.float64)
            x -= x.max(axis=1, keepdims=True)
            x -= np.log(np.exp(x).sum(axis=1, keepdims=True))
            logp[t] = x
        targets = np.array(ids[1:scored + 1])
        p_ref = np.exp(logp["f16"])
        top_ref = logp["f16"].argmax(axis=1)
        for t in types:
            s = sums[t]
            s["nll"] -= float(logp[t][np.arange(scored), targets].sum())
            s["kl"] += float((p_ref * (logp["f16"] - logp[t])).sum())
            s["top1"] += int((logp[t].argmax(axis=1) == top_ref).sum())
            s["n"] += scored
    meta = ref.metadata
    layers = int(meta.get("llama.block_count", 0))
    kv_heads = int(meta.get("llama.attention.head_count_kv", meta.get("llama.attention.head_count", 0)))
    head_dim = int(meta.get("llama.embedding_length", 0)) // max(1, int(meta.get("llama.attention.head_count", 1)))
    results = []
    ppl_ref = math.exp(sums["f16"]["nll"] / sums["f16"]["n"])
    for t in types:
        s = sums[t]
        ppl = math.exp(s["nll"] / s["n"])
        results.append({
            "strategy": f"llama.cpp {t}",
            "kv_type": t,
            "attn_rotation": base_type(t) not in ("f16", "f32") and not t.endswith(NOROT),
            "bits_per_element": BITS[base_type(t)],
            "kv_bytes_per_token": int(round(2 * layers * kv_heads * head_dim * BITS[base_type(t)] / 8)),
            "ppl": ppl,
            "ppl_delta_pct": (ppl - ppl_ref) / ppl_ref * 100.0,
            "kl_mean": s["kl"] / s["n"],
            "top1_agreement": s["top1"] / s["n"],
            "ms_per_token": s["seconds"] * 1000.0 / s["n"],
        })
    report = {
        "peer": "llama.cpp",
        "llama_cpp_python": llama_cpp.__version__,
        "model": os.path.basename(a.model),
        "text": a.text,
        "ctx": a.ctx,
        "windows": len(windows),
        "tokens_scored": n_scored,
        # The text token ids the windows read, as `kvcache eval` hashes them (it refuses other ids).
        "token_ids_count": 1 + n_scored,
        "token_ids_sha256": hashlib.sha256(struct.pack("<%dI" % (1 + n_scored), *tokens[:1 + n_scored])).hexdigest(),
        "reference": "llama.cpp f16",
        "flash_attn": True,
        "results": results,
    }
    print(f"llama.cpp (llama-cpp-python {llama_cpp.__version__}) on {report['model']}: {n_scored} tokens in "
          f"{len(windows)} windows of ctx {a.ctx}; reference: llama.cpp f16 K/V")
    print(f"{'KV type':12s} {'bits/elem':>9s} {'KV B/token':>10s} {'ppl':>10s} {'ppl Δ%':>10s} {'KL mean':>10s} {'top-1':>7s}")
    for r in results:
        print(f"{r['kv_type']:12s} {r['bits_per_element']:9.2f} {r['kv_bytes_per_token']:10d} {r['ppl']:10.5f} "
              f"{r['ppl_delta_pct']:+10.4f} {r['kl_mean']:10.3e} {r['top1_agreement']:7.4f}")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(report, f, indent=2)


if __name__ == "__main__":
    main()
