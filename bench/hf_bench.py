#!/usr/bin/env python3
"""SmolLM2-135M through Hugging Face transformers, CPU: generate() speed and bytes held of
kvcache.hf.PagedCache against transformers' own caches, measured in alternating rounds of one run.

    <hf venv>/bin/python bench/hf_bench.py [--prompt 1024] [--new 128] [--batch 1,4] [--rounds 2]
        [--threads 2] [--json FILE]

Run with the package importable (pip install ./bindings/python, or PYTHONPATH=<build>/bindings/swig/
python/pkg) in the venv scripts/setup-python.sh makes (~/.cache/kvcache/venv/hf: transformers, gguf,
accelerate, optimum-quanto, hqq). Rows:

  dynamic+sdpa        DynamicCache, sdpa attention (the baseline: every ratio is against it)
  paged-f16+kvcache   PagedCache f16, attn_implementation="kvcache" (our kernels over the pool)
  paged-f16+sdpa      PagedCache f16 returning dense K/V to sdpa
  quanto-int4-r128    QuantizedCache(backend="quanto", nbits=4, residual_length=128)
  hqq-int4-r128       QuantizedCache(backend="hqq", nbits=4, residual_length=128)
  paged-<int4 ...>    our int4 strategies with kvcache attention

A warm-up runs every row once on a short prompt (quanto compiles its kernels on first use); then
each round runs every row once, in order, so machine drift hits all rows alike; the table gives each
row's median. tok/s = batch x new tokens / generate() wall time (prefill included); "held" = bytes
the cache holds at the end (PagedCache: kvc_stats.bytes_in_use; transformers' caches: the bytes of
their tensors); "same" = leading generated tokens equal to dynamic+sdpa's (row 0 of the batch)."""

import argparse
import json
import os
import statistics
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "bindings", "python", "tests_hf"))

import torch  # noqa: E402

import hfmodel  # noqa: E402
import kvcache.hf as kh  # noqa: E402
from transformers import DynamicCache, QuantizedCache  # noqa: E402

OUR_INT4 = ["kivi4:group=32:residual=128",
            "k-int4:kchannel=128:asym:pre-rope+v-int4:per-token:full-range:hadamard"]


def rows(config_sdpa, config_paged):
    out = [("dynamic+sdpa", "sdpa", lambda: DynamicCache(config=config_sdpa)),
           ("paged-f16+kvcache", "kvcache", lambda: kh.PagedCache(config_paged, "f16")),
           ("paged-f16+sdpa", "sdpa", lambda: kh.PagedCache(config_sdpa, "f16")),
           ("quanto-int4-r128", "sdpa",
            lambda: QuantizedCache(backend="quanto", config=config_sdpa, nbits=4, residual_length=128)),
           ("hqq-int4-r128", "sdpa",
            lambda: QuantizedCache(backend="hqq", config=config_sdpa, nbits=4, residual_length=128))]
    for spec in OUR_INT4:
        out.append(("paged-" + spec, "kvcache", lambda spec=spec: kh.PagedCache(config_paged, spec)))
    return out


def held_bytes(cache):
    if isinstance(cache, kh.PagedCache):
        return cache.stats()["bytes_in_use"]
    return hfmodel.tensor_bytes(cache.layers)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--prompt", type=int, default=1024)
    ap.add_argument("--new", type=int, default=128)
    ap.add_argument("--batch", default="1,4")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--only", default="", help="comma-separated row names (default: all)")
    ap.add_argument("--json", default="")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    sdpa_model, tok = hfmodel.load("sdpa")
    paged_model, _ = hfmodel.load(kh.ATTN_IMPLEMENTATION)
    models = {"sdpa": sdpa_model, "kvcache": paged_model}
    text = hfmodel.shared_text()
    table = rows(sdpa_model.config, paged_model.config)
    if args.only:
        keep = set(args.only.split(","))
        table = [r for r in table if r[0] in keep or r[0] == "dynamic+sdpa"]
    results = []
    for batch in [int(b) for b in args.batch.split(",")]:
        step = len(text) // (batch + 1)
        ids = [tok(text[i * step:i * step + 8 * args.prompt], return_tensors="pt")["input_ids"][:, :args.prompt]
               for i in range(batch)]
        inputs = {"input_ids": torch.cat(ids, 0)}
        inputs["attention_mask"] = torch.ones_like(inputs["input_ids"])
        times = {name: [] for name, _, _ in table}
        info = {}
        warm = {k: v[:, :64] for k, v in inputs.items()}
        for name, attn, make in table:  # first use: quanto builds its kernels, torch warms up
            with torch.no_grad():
                hfmodel.generate(models[attn], warm, make(), max_new_tokens=4, min_new_tokens=4)
        for rnd in range(args.rounds):
            for name, attn, make in table:
                cache = make()
                t0 = time.perf_counter()
                with torch.no_grad():
                    out = hfmodel.generate(models[attn], inputs, cache, max_new_tokens=args.new,
                                           min_new_tokens=args.new)
                dt = time.perf_counter() - t0
                times[name].append(dt)
                gen = out[0, args.prompt:]
                if name == "dynamic+sdpa" and "ref" not in info:
                    info["ref"] = gen
                info[name] = (held_bytes(cache), hfmodel.first_difference(gen, info["ref"]))
                print("batch %d round %d %-80s %7.2f s" % (batch, rnd, name, dt), file=sys.stderr, flush=True)
                del cache
        base = statistics.median(times["dynamic+sdpa"])
        base_bytes = info["dynamic+sdpa"][0]
        for name, _, _ in table:
            t = statistics.median(times[name])
            held, same = info[name]
            results.append({"batch": batch, "row": name, "seconds": t, "tok_per_s": batch * args.new / t,
                            "speed_vs_dynamic": base / t, "held_bytes": held, "held_vs_dynamic": held / base_bytes,
                            "same_tokens": same, "rounds": args.rounds})
    print("SmolLM2-135M, transformers %s, torch %s, %d threads, prompt %d + %d new tokens, %d rounds (medians)"
          % (__import__("transformers").__version__, torch.__version__, args.threads, args.prompt, args.new,
             args.rounds))
    print("%-5s %-78s %8s %8s %10s %8s %6s" % ("batch", "row", "tok/s", "speed", "held MiB", "held", "same"))
    for r in results:
        print("%-5d %-78s %8.2f %7.2fx %10.2f %7.3fx %6d" % (r["batch"], r["row"], r["tok_per_s"],
                                                              r["speed_vs_dynamic"], r["held_bytes"] / 2**20,
                                                              r["held_vs_dynamic"], r["same_tokens"]))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
