#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Needle retrieval on SmolLM2-135M through transformers: what perplexity hides.

A needle (a short fact with a 4-digit number: " The secret code of the blue door is 4817.") is
placed at several depths of a context made of the shared TinyStories text; after the context comes
the question ("What is the secret code of the blue door?" and the answer's start); the model
answers greedily (8 new tokens). A trial passes when the first number of the answer is the
needle's. Every row sees the same contexts: they are generated from fixed seeds (the place in the
text, the object, the number), never downloaded.

Protocol, every row: the context is prefilled in one forward pass (a press compresses it there, as
kvpress's pipeline does: question-agnostic), then the question is fed in one pass and the answer
decoded token by token. Rows are bench/peers/hf_caches.py's (`--list` there): QuantizedCache
backends, kvpress presses, our strategies through kvcache.hf.PagedCache (stream policies cap the
cache at budget x the context length) and our policies as presses.

  python3 bench/peers/needle.py [--rows LIST] [--lengths 1024,2048,4096]
      [--depths 0.1,0.3,0.5,0.7,0.9] [--seeds 2] [--threads N] [--json OUT]
  python3 bench/peers/needle.py --merge A.json B.json --json OUT

Report: per row the pass rate over lengths x depths x seeds, per length, per depth, and the mean
share of context tokens kept. The dense DynamicCache f32 row always runs first: measure it alone
(`--rows dynamic`) to choose lengths and depths where it passes nearly always.
"""
import argparse
import json
import os
import random
import re
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import hf_caches  # noqa: E402  (puts tests_hf on the path too)

OBJECTS = ["blue door", "red box", "green boat", "old clock", "small garden", "yellow kite", "silver key",
           "wooden chest"]
NEW_TOKENS = 8


def contexts(ids_text, tok, lengths, depths, seeds):
    """[(length, depth, seed, number, ids, answer_start)]: the same list for every row."""
    nl = tok("\n", add_special_tokens=False)["input_ids"]
    out = []
    for length in lengths:
        for seed in range(seeds):
            rng = random.Random(1000003 * length + seed)
            obj = rng.choice(OBJECTS)
            number = rng.randrange(1000, 10000)
            needle = tok(" The secret code of the %s is %d." % (obj, number), add_special_tokens=False)["input_ids"]
            question = nl + tok("Question: What is the secret code of the %s?\nAnswer: The secret code of the %s is"
                                % (obj, obj), add_special_tokens=False)["input_ids"]
            n_text = length - len(needle) - len(question)
            start = rng.randrange(0, len(ids_text) - n_text - 1)
            hay = ids_text[start:start + n_text]
            ends = [i + 1 for i, t in enumerate(hay) if tok.decode([t]).rstrip().endswith(".")]
            for depth in depths:
                # the needle after the sentence end nearest to the depth
                at = int(depth * n_text)
                if ends:
                    at = min(ends, key=lambda e: abs(e - at))
                ctx = hay[:at] + needle + hay[at:]
                out.append((length, depth, seed, number, ctx, question))
    return out


def answer(model, ctx_ids, question, cache, press, cache_kw, decoding_press=False, after_context=None):
    import torch

    def fwd(ids, pos0):
        start = int(cache.get_seq_length())
        n = len(ids)
        with torch.no_grad():
            return model(input_ids=torch.tensor([ids]), position_ids=torch.arange(pos0, pos0 + n).unsqueeze(0),
                         cache_position=torch.arange(start, start + n), use_cache=True,
                         **{cache_kw: cache}).logits[0, -1]

    import contextlib

    # A prefill press compresses the context only (kvpress's pipeline); a decoding-time press
    # (DecodingPress) acts on every pass after the context.
    whole = press(model) if press is not None and decoding_press else contextlib.nullcontext()
    with whole:
        with (press(model) if press is not None and not decoding_press else contextlib.nullcontext()):
            fwd(ctx_ids, 0)
        if after_context is not None:  # KVzip: the reconstruction pass, before the question
            after_context()
        pos = len(ctx_ids)
        logits = fwd(question, pos)
        pos += len(question)
        out = []
        for _ in range(NEW_TOKENS):
            t = int(logits.argmax())
            out.append(t)
            logits = fwd([t], pos)
            pos += 1
    return out


def measure(a):
    import torch
    import transformers

    import hfmodel
    import kvcache.hf as kh

    if not 1 <= a.threads <= hf_caches.MAX_THREADS:
        sys.exit("needle: --threads must be 1..%d" % hf_caches.MAX_THREADS)
    torch.set_num_threads(a.threads)
    model, tok = hfmodel.load("sdpa")
    models = {"sdpa": model}
    ids_text = hf_caches.text_token_ids(a.text, tok)
    try:
        lengths = [int(x) for x in a.lengths.split(",")]
        depths = [float(x) for x in a.depths.split(",")]
    except ValueError:
        sys.exit("needle: --lengths takes integers and --depths numbers, comma-separated")
    if a.seeds < 1 or a.threads < 1 or not all(0 <= d <= 1 for d in depths):
        sys.exit("needle: need --seeds >= 1, --threads >= 1 and depths in [0, 1]")
    if len(set(lengths)) != len(lengths) or len(set(depths)) != len(depths):
        sys.exit("needle: --lengths and --depths each name a value at most once")
    bad = [n for n in lengths if not 128 <= n <= min(65536, len(ids_text) // 2)]
    if bad:
        sys.exit("needle: context lengths must be 128..%d tokens (half the text), not %s"
                 % (min(65536, len(ids_text) // 2), bad))
    trials = contexts(ids_text, tok, lengths, depths, a.seeds)
    names = [n for n in (a.rows.split(",") if a.rows else hf_caches.default_rows(*have_all())) if n != "dynamic"]
    dup = sorted({n for n in names if names.count(n) > 1})
    if dup:
        sys.exit("needle: --rows names %s more than once" % ", ".join(dup))
    rows = hf_caches.make_rows(names, model, 0.5)
    ref = hf_caches.Row("dynamic-f32", "needle", "transformers DynamicCache", "DynamicCache()",
                        "f32 K/V of every token", lambda m, ctx: (transformers.DynamicCache(), None))
    for r in rows:
        if getattr(r, "eager", False) and "eager" not in models:
            models["eager"] = hfmodel.load("eager")[0]
        if getattr(r, "paged_attention", False) and "kvcache" not in models:
            models["kvcache"] = hfmodel.load(kh.ATTN_IMPLEMENTATION)[0]
    cache_kw = hfmodel.cache_kw()
    n_layers = model.config.num_hidden_layers
    results = []
    t0 = time.time()

    def report(res):
        return _report(a, lengths, depths, t0, res)

    for r in [ref] + rows:
        m = models["eager"] if getattr(r, "eager", False) else \
            models["kvcache"] if getattr(r, "paged_attention", False) else model
        per = []
        for (length, depth, seed, number, ctx_ids, question) in trials:
            cache, press = r.make(m, len(ctx_ids))
            if getattr(r, "masks", False):
                r.masked = lambda m=m: hf_caches.masked_count(m)
            recon = None
            if getattr(r, "reconstruct", False):
                def recon(m=m, cache=cache, ids=ctx_ids):
                    cache.reconstruct_context(m, [ids], tok)
            out = answer(m, ctx_ids, question, cache, press, cache_kw, decoding_press=r.protocol == "stream",
                         after_context=recon)
            text = tok.decode(out)
            got = re.search(r"\d[\d,]*", text)
            ok = got is not None and int(got.group().replace(",", "")) == number
            _, toks, attended = r.held(cache, n_layers)
            full = len(ctx_ids) + len(question) + NEW_TOKENS
            per.append({"length": length, "depth": depth, "seed": seed, "number": number, "answer": text,
                        "pass": ok, "kept_fraction": toks / (n_layers * full),
                        "attended_fraction": attended / (n_layers * full)})
            del cache, press
        res = {"strategy": r.name, "side": r.side, "settings": r.settings,
               "pass_rate": sum(p["pass"] for p in per) / len(per),
               "kept_fraction": sum(p["kept_fraction"] for p in per) / len(per),
               "attended_fraction": sum(p["attended_fraction"] for p in per) / len(per),
               "by_length": {str(L): sum(p["pass"] for p in per if p["length"] == L) /
                             max(1, sum(1 for p in per if p["length"] == L)) for L in lengths},
               "by_depth": {"%g" % d: sum(p["pass"] for p in per if p["depth"] == d) /
                            max(1, sum(1 for p in per if p["depth"] == d)) for d in depths},
               "trials": per}
        results.append(res)
        print("needle: %-40s pass %5.1f%%  (%.0f s)" % (r.name, 100 * res["pass_rate"], time.time() - t0),
              file=sys.stderr, flush=True)
        if a.json:  # a checkpoint after every row: a long run that fails keeps what it measured
            hf_caches.write_json(a.json + ".partial", report(results))
    return report(results)  # main() removes the checkpoint once the report is written


def _report(a, lengths, depths, t0, results):
    import torch
    import transformers

    import hfmodel

    return {"peer": "needle retrieval", "model": hfmodel.GGUF, "text": os.path.basename(a.text),
            "lengths": lengths, "depths": depths, "seeds": a.seeds, "new_tokens": NEW_TOKENS,
            "versions": {"torch": torch.__version__, "transformers": transformers.__version__},
            "command": "python3 bench/peers/needle.py " + " ".join(sys.argv[1:]),
            "wall_seconds": time.time() - t0, "results": results}


def have_all():
    have = []
    for mods in (("optimum.quanto", "hqq"), ()):
        try:
            for m in mods:
                __import__(m)
            have.append(bool(mods))
        except ImportError:
            have.append(False)
    import transformers

    have[1] = hasattr(transformers.cache_utils, "Fp8QuantizedLayer")
    try:
        import kvpress  # noqa: F401
        have.append(True)
    except ImportError:
        have.append(False)
    return have


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--text", help="the text the contexts are made of (default: the shared tinystories text)")
    ap.add_argument("--rows", help="comma-separated rows of bench/peers/hf_caches.py (dynamic: the reference only)")
    ap.add_argument("--lengths", default="1024,2048,4096")
    ap.add_argument("--depths", default="0.1,0.3,0.5,0.7,0.9")
    ap.add_argument("--seeds", type=int, default=2)
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--json")
    ap.add_argument("--merge", nargs="+", metavar="REPORT")
    a = ap.parse_args()
    if a.json:
        hf_caches.check_out(a.json, "needle")
    if a.rows is not None and not a.rows.strip():
        sys.exit("needle: --rows is empty (leave it out for the default rows)")
    if a.merge:
        reps = [hf_caches.read_report(p, "needle", "lengths") for p in a.merge]
        rep = dict(reps[0])
        seen, rows = set(), []
        for r in reps:
            if (r["model"], r["lengths"], r["depths"], r["seeds"]) != (rep["model"], rep["lengths"], rep["depths"],
                                                                       rep["seeds"]):
                sys.exit("needle: %s has other contexts than %s" % (a.merge[reps.index(r)], a.merge[0]))
            for row in r["results"]:
                if row["strategy"] not in seen:
                    seen.add(row["strategy"])
                    rows.append(row)
        rep["results"], rep["command"] = rows, [r["command"] for r in reps]
    else:
        a.text = a.text or hf_caches.default_text()
        try:
            rep = measure(a)
        except KeyboardInterrupt:
            sys.exit("needle: interrupted%s" % (
                "; the rows done are in %s.partial" % a.json if a.json and os.path.exists(a.json + ".partial")
                else ""))
    w = max(len(r["strategy"]) for r in rep["results"])
    print("%-*s  %6s  %6s  %s  %s" % (w, "row", "pass", "kept", "  ".join("%6s" % L for L in rep["lengths"]),
                                      "  ".join("d=%-4g" % d for d in rep["depths"])))
    for r in rep["results"]:
        print("%-*s  %5.1f%%  %5.1f%%  %s  %s" % (
            w, r["strategy"], 100 * r["pass_rate"], 100 * r["kept_fraction"],
            "  ".join("%5.0f%%" % (100 * r["by_length"][str(L)]) for L in rep["lengths"]),
            "  ".join("%5.0f%%" % (100 * r["by_depth"]["%g" % d]) for d in rep["depths"])))
    if a.json:
        hf_caches.write_json(a.json, rep)
        if not a.merge and os.path.exists(a.json + ".partial"):
            os.remove(a.json + ".partial")


if __name__ == "__main__":
    main()
