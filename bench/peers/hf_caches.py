#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""transformers' KV caches and kvpress's presses measured on the same work as `kvcache eval --model smollm2`.

SmolLM2-135M-Instruct (the GGUF scripts/fetch-models.sh fetches, loaded by transformers in f32;
bindings/python/tests_hf/hfmodel.py) scores the shared TinyStories text with each peer cache, on the
windows and positions `kvcache eval --model smollm2` scores: windows of CTX positions whose first is
the text token before the first one scored, advancing by CTX - 1 tokens, MAX_TOKENS tokens scored.
The ids come from transformers' tokenizer; for the shared texts they are checked against llama.cpp's
(their count and SHA-256 in tests/fixtures/smollm2), which our runner reproduces.
Each window runs from an empty cache. Reference: transformers' DynamicCache (f32), under the same
protocol as the row; KL(reference || row) over the full vocabulary, top-1 agreement, perplexity.

Protocols (as `kvcache eval`'s, docs/eval.md "Eviction protocols"):
  stream            every position goes through the cache in forward passes of CHUNK positions
                    (1: token by token, how QuantizedCache runs in generate(); `kvcache eval
                    --model smollm2` runs chunks of 64 by default: give it --chunk 1 to compare
                    the same protocol, as stream policies evict once per pass; eval notes it)
  prefill-compress  the first P = PREFILL x window positions in one forward pass, compressed once
                    at its end (kvpress's protocol; our snapkv / pyramidkv), the rest decoded in
                    passes of CHUNK positions

Rows (--rows, comma-separated; default: every peer this venv can run, see --list):
  quanto-int2, quanto-int4         QuantizedCache(backend="quanto", nbits=N): optimum-quanto,
                                   its defaults axis 0, q_group_size 64, residual_length 128
  hqq-int2/3/4/8                   QuantizedCache(backend="hqq", nbits=N), same defaults
  NAME-r32                         the same with residual_length=32 (our kivi rows' residual)
  fp8                              QuantizedCache(backend="fp8"): float8_e4m3fn, one f32 scale per
                                   layer tensor frozen at the first update (transformers >= 5.3)
  NAME@prefill                     a QuantizedCache row under the prefill-compress protocol (no
                                   press): the first update is the half-window prefill, as in
                                   generate() (fp8's scale is calibrated on it, not on one token)
  kvpress-PRESS@R                  kvpress's PRESS (its class name without "Press": SnapKV,
                                   StreamingLLM, TOVA, Knorm, ExpectedAttention, ObservedAttention,
                                   PyramidKV, KVzip, ...) at compression_ratio R (R = 0.5 keeps
                                   50 % of the prefill), on a DynamicCache, prefill-compress
  kvpress-AdaKV-PRESS@R            AdaKVPress(PRESS(R)): head-wise budgets (kvpress masks the
                                   evicted keys; the cache keeps every token)
  kvpress-Decoding-PRESS@R         DecodingPress(PRESS): kvpress's decoding-time variant, under the
                                   stream protocol: every 16 decoded tokens the cache is cut back to
                                   (1 - R) x CTX tokens (our stream policies cap it at the same)
  ours:SPEC                        `kvcache eval` strategy SPEC through kvcache.hf.PagedCache (our
                                   codecs and policies, model code byte for byte the peers'),
                                   protocol by the policy (none / stream: stream; snapkv,
                                   pyramidkv: prefill-compress)
  ours-press:SPEC                  our policy SPEC (one policy part) as a kvpress press
                                   (kvcache.hf.KvcPress) on a PagedCache f32, prefill-compress

Bits per element are counted as `kvcache eval` counts them: the bytes the cache holds at the end
of each full window (every tensor it keeps: codes, scales, zero points, residual tokens in the
model's f32, masked-but-held keys) over the K and V elements of the tokens it holds; each row
carries its formula (`bits_formula`). memory_vs_f16 = the dense f16 cache's bytes at the end of a
window / the row's bytes then; peak_memory_vs_f16 the same for the peaks.

  python3 bench/peers/hf_caches.py [--rows LIST] [--ctx 512] [--max-tokens 4096] [--chunk 1]
      [--prefill 0.5] [--threads N] [--json OUT [--resume]]
  python3 bench/peers/hf_caches.py --merge A.json B.json ... --json OUT
  python3 bench/peers/hf_caches.py --list

A run with --json writes a checkpoint, JSON.partial, after every window but the last (the report
so far, "complete": false, and the sums --resume reads); --stop-after N ends a run after N windows
and --resume continues it with the same arguments, so a table of hours runs in parts.

QuantizedCache's backends live in scripts/setup-python.sh's `hf` venv (newest transformers), kvpress
in its `kvpress` venv (it pins transformers < 5.3): run the script once in each and --merge the two
reports. `kvcache eval --model smollm2 --peer OUT` prints our rows and these side by side; it
refuses a report of another model, window length or token ids.
"""
import argparse
import contextlib
import hashlib
import json
import math
import os
import struct
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
MAX_THREADS = 256


def check_out(path, prog):
    """Before hours of measuring: the report's folder made, and the file writable."""
    d = os.path.dirname(os.path.abspath(path))
    try:
        os.makedirs(d, exist_ok=True)
    except OSError as e:
        sys.exit("%s: cannot make the folder of --json %s: %s" % (prog, path, e.strerror or e))
    if os.path.isdir(path) or not os.access(path if os.path.exists(path) else d, os.W_OK):
        sys.exit("%s: cannot write --json %s (%s)" % (
            prog, path, "a directory" if os.path.isdir(path) else "no write permission"))


def write_json(path, obj):
    """obj to path through a temporary file and a rename: a kill mid-write leaves the old file."""
    tmp = "%s.tmp%d" % (path, os.getpid())
    with open(tmp, "w") as f:
        json.dump(obj, f, indent=2, allow_nan=False)
    os.replace(tmp, path)
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(ROOT, "bindings", "python", "tests_hf"))

QUANT = {"quanto": (2, 4), "hqq": (2, 3, 4, 8)}
DECODING_INTERVAL = 16
KVPRESS_DECODING_DEFAULT = ["Knorm", "ExpectedAttention", "TOVA"]
KVPRESS_DEFAULT = ["StreamingLLM", "SnapKV", "TOVA", "Knorm", "ExpectedAttention", "ObservedAttention",
                   "PyramidKV", "KVzip", "AdaKV-ExpectedAttention", "AdaKV-SnapKV"]
OURS_DEFAULT_STREAM = ["f16", "int8:per-token", "kivi4:group=16:residual=32", "kivi2:group=16:residual=32",
                       "k-int4:kchannel=128:asym:pre-rope+v-int4:per-token:full-range:hadamard",
                       "k-int3:kchannel=128:asym:pre-rope+v-int2:group=32:full-range"]
OURS_DEFAULT_PREFILL = ["snapkv:budget={b}+f32", "pyramidkv:budget={b}+f32", "expected-attention:budget={b}+f32",
                        "knorm:budget={b}+f32", "kvzip:budget={b}+f32"]
OURS_DEFAULT_STREAM_POLICIES = ["h2o:budget={b}+f32", "tova:budget={b}+f32", "streaming:budget={b}+f32",
                                "expected-attention:budget={b}:stream+f32"]
OURS_PRESS_DEFAULT = ["h2o:budget={b}", "tova:budget={b}", "streaming:budget={b}", "expected-attention:budget={b}"]


def default_rows(have_quant, have_fp8, have_kvpress):
    rows = []
    if have_quant:
        for backend, bits in QUANT.items():
            rows += ["%s-int%d" % (backend, b) for b in bits]
        rows += ["quanto-int4-r32", "quanto-int2-r32", "hqq-int4-r32", "hqq-int2-r32"]
    if have_fp8:
        rows += ["fp8", "fp8@prefill"]
    if have_kvpress:
        for r in (0.5, 0.7):
            rows += ["kvpress-%s@%g" % (p, r) for p in KVPRESS_DEFAULT]
            rows += ["kvpress-Decoding-%s@%g" % (p, r) for p in KVPRESS_DECODING_DEFAULT]
    if have_kvpress and not have_quant:
        return rows  # kvpress's venv: our rows come from the other run (--merge)
    rows += ["ours:" + s for s in OURS_DEFAULT_STREAM]
    for r in (0.5, 0.7):
        b = "%g" % (1 - r)
        rows += ["ours:" + s.format(b=b) for s in OURS_DEFAULT_PREFILL + OURS_DEFAULT_STREAM_POLICIES]
        rows += ["ours-press:" + s.format(b=b) for s in OURS_PRESS_DEFAULT]
    return rows


# ------------------------------------------------------------------------------------------ inputs
def default_model():
    import hfmodel

    return os.path.join(hfmodel.model_cache(), hfmodel.GGUF)


def text_token_ids(text_path, tok):
    """The text's token ids by the model's tokenizer (no BOS, no special tokens). For the shared
    TinyStories text they are checked against llama.cpp's (the count and SHA-256 of all of them in
    tests/fixtures/smollm2, the ids our runner reproduces)."""
    try:
        with open(text_path, encoding="utf-8") as f:
            text = f.read()
    except (OSError, UnicodeDecodeError) as e:
        sys.exit("hf_caches: cannot read --text %s: %s" % (text_path, getattr(e, "strerror", None) or e))
    ids = tok(text, add_special_tokens=False)["input_ids"]
    if len(ids) < 2:
        sys.exit("hf_caches: --text %s holds %d tokens: at least 2 are needed" % (text_path, len(ids)))
    fixture = os.path.join(ROOT, "tests", "fixtures", "smollm2", "tokens-" +
                           os.path.splitext(os.path.basename(text_path))[0] + ".txt")
    if os.path.exists(fixture):
        count = sha = None
        with open(fixture) as f:
            for line in f:
                if line.startswith("count"):
                    count = int(line.split()[1])
                elif line.startswith("sha256"):
                    sha = line.split()[1]
        if count != len(ids) or sha != token_ids_sha256(ids):
            sys.exit("hf_caches: transformers' tokenizer gives %d ids (sha256 %s) for %s, llama.cpp %s (%s): "
                     "not the ids kvcache eval scores" % (len(ids), token_ids_sha256(ids), text_path, count, sha))
    return ids


def token_ids_sha256(ids):
    """SHA-256 of the ids as little-endian uint32, hex (what `kvcache eval` writes as token_ids_sha256)."""
    return hashlib.sha256(struct.pack("<%dI" % len(ids), *ids)).hexdigest()


def windows_of(n_tokens, ctx, max_tokens):
    """[(first, scored)]: window positions 0..scored (position 0 the text token first - 1)."""
    n_scored = min(max_tokens, n_tokens - 1) if max_tokens > 0 else n_tokens - 1
    out, first = [], 1
    while first < 1 + n_scored:
        out.append((first, min(ctx - 1, 1 + n_scored - first)))
        first += ctx - 1
    return out, n_scored


# ------------------------------------------------------------------------------------------ rows held
class Row:
    """One row: how to make its cache (and press), its protocol, and what it held."""

    def __init__(self, name, protocol, side, settings, formula, make):
        self.name, self.protocol, self.side, self.settings, self.formula = name, protocol, side, settings, formula
        self.make = make  # () -> (cache, press or None)
        self.nll = self.kl = self.seconds = 0.0
        self.top1 = self.n = self.positions = 0
        self.bytes_end = self.tokens_end = self.positions_end = 0.0
        self.peak = 0
        self.attended_end = 0.0

    def held(self, cache, n_layers):
        """(bytes held, tokens held over all layers, tokens attended over all layers)."""
        import kvcache.hf as kh

        if isinstance(cache, kh.PagedCache):
            st = cache.stats()
            if "bytes_in_use" not in st:  # no pool yet (before the first forward pass)
                return 0, 0, 0
            self.peak = max(self.peak, int(st["peak_bytes_in_use"]))  # the pool's high-water mark
            sid = cache._seqs[0]
            if cache._st.headwise:  # (token, KV head) pairs over KV heads: each head holds its own tokens
                hk = cache._hk
                toks = sum(cache.pool.head_tokens(sid, i, h) for i in range(n_layers) for h in range(hk)) / hk
            else:
                toks = sum(cache.pool.layer_tokens(sid, i) for i in range(n_layers))
            return int(st["bytes_in_use"]), toks, toks
        toks = sum(int(layer.get_seq_length()) for layer in cache.layers)
        attended = toks
        masked = getattr(self, "masked", None)
        if masked is not None:
            attended = toks - masked()
        import hfmodel

        return hfmodel.tensor_bytes(list(cache.layers)), toks, attended


# ------------------------------------------------------------------------------------------ rows
def make_rows(names, model, prefill_fraction):
    import torch  # noqa: F401

    rows = []
    for name in names:
        protocol = "stream"
        base = name
        if (name.startswith(("quanto-", "hqq-", "fp8"))) and name.endswith("@prefill"):
            protocol, base = "prefill-compress", name[:-len("@prefill")]
        if base.startswith("quanto-") or base.startswith("hqq-"):
            backend, rest = base.split("-", 1)
            parts = rest.split("-")
            if not parts[0].startswith("int") or len(parts) > 2 or (len(parts) == 2 and parts[1] != "r32"):
                sys.exit("hf_caches: bad row '%s' (e.g. quanto-int4, hqq-int3-r32)" % name)
            nbits = int(parts[0][3:]) if parts[0][3:].isdigit() else -1
            if nbits not in QUANT[backend]:
                sys.exit("hf_caches: %s has no int%d (it has %s)" % (backend, nbits, QUANT[backend]))
            residual = 32 if len(parts) == 2 else 128
            from transformers import QuantizedCache

            kw = dict(nbits=nbits, residual_length=residual)
            formula = ("%d-bit codes + a scale and a zero point (f32) per group of 64 values along the "
                       "flattened tensor (axis 0), + the residual tokens (up to %d) in f32" % (nbits, residual))
            if backend == "hqq":
                formula += "; HQQ packs 3-bit codes 10 per int32 (3.2 bits)"
            rows.append(Row(name, protocol, "transformers QuantizedCache (%s)" % backend,
                            'QuantizedCache(backend="%s", nbits=%d, residual_length=%d)' % (backend, nbits, residual),
                            formula, lambda m, ctx, b=backend, kw=kw: (QuantizedCache(backend=b, config=m.config, **kw), None)))
        elif base == "fp8":
            from transformers import QuantizedCache

            rows.append(Row(name, protocol, "transformers QuantizedCache (fp8)", 'QuantizedCache(backend="fp8")',
                            "8-bit e4m3 codes + one f32 scale per layer tensor (K, V), frozen at the first update",
                            lambda m, ctx: (QuantizedCache(backend="fp8", config=m.config), None)))
        elif name.startswith("kvpress-"):
            rows.append(kvpress_row(name, model))
        elif name.startswith("ours:") or name.startswith("ours-press:"):
            rows.append(ours_row(name, prefill_fraction))
        else:
            sys.exit("hf_caches: unknown row '%s' (--list shows the names)" % name)
    return rows


def kvpress_row(name, model):
    try:
        import kvpress
    except ImportError:
        sys.exit("hf_caches: row '%s' needs kvpress (scripts/setup-python.sh's kvpress venv)" % name)
    from transformers import DynamicCache

    spec, _, ratio = name[len("kvpress-"):].partition("@")
    try:
        ratio = float(ratio)
    except ValueError:
        sys.exit("hf_caches: row '%s' needs @RATIO (e.g. kvpress-SnapKV@0.5)" % name)
    if not 0 < ratio < 1:
        sys.exit("hf_caches: row '%s': the compression ratio must be in (0, 1)" % name)
    parts = spec.split("-")
    wrapper = parts[0] if parts[0] in ("AdaKV", "Decoding") and len(parts) == 2 else None
    inner = parts[-1]
    cls = getattr(kvpress, inner + "Press", None)
    if cls is None or len(parts) > 2 or (len(parts) == 2 and wrapper is None):
        sys.exit("hf_caches: unknown kvpress press in '%s' (kvpress %s has: %s)" % (
            name, getattr(kvpress, "__version__", "?"),
            ", ".join(sorted(n[:-5] for n in dir(kvpress) if n.endswith("Press")))))
    kept = 1 - ratio
    if wrapper == "AdaKV":
        label = "AdaKVPress(%sPress(compression_ratio=%g))" % (inner, ratio)

        def make(m, ctx):
            return DynamicCache(), kvpress.AdaKVPress(cls(compression_ratio=ratio))
        formula = "f32 K/V of every prefill token (AdaKV masks evicted keys inside the dense tensors)"
        protocol = "prefill-compress"
    elif wrapper == "Decoding":
        label = "DecodingPress(%sPress(), compression_interval=%d, target_size=round(%g x ctx))" % (
            inner, DECODING_INTERVAL, kept)

        def make(m, ctx):
            return DynamicCache(), kvpress.DecodingPress(base_press=cls(), compression_interval=DECODING_INTERVAL,
                                                         target_size=max(1, round(kept * ctx)))
        formula = "f32 K/V of the tokens kept (DynamicCache)"
        protocol = "stream"
    else:
        label = "%sPress(compression_ratio=%g)" % (inner, ratio)

        def make(m, ctx):
            return DynamicCache(), cls(compression_ratio=ratio)
        formula = "f32 K/V of the tokens kept (DynamicCache)"
        protocol = "prefill-compress"
    row = Row(name, protocol, "kvpress %s" % getattr(kvpress, "__version__", ""), label, formula, make)
    row.kept_target = kept
    row.eager = inner == "ObservedAttention"  # it reads the attention weights
    row.masks = True  # head-wise presses (AdaKV, KVzip) mask keys inside the dense cache
    return row


def ours_row(name, prefill_fraction):
    import kvcache
    import kvcache.hf as kh
    from kvcache.hf_press import KvcPress

    press = name.startswith("ours-press:")
    spec = name.split(":", 1)[1]
    try:
        st = kvcache.parse_strategy(spec)
    except kvcache.KvcError as e:
        sys.exit("hf_caches: row '%s': %s" % (name, e.message))
    proto = {kh._PROTO_NONE: "stream", kh._PROTO_STREAM: "stream"}.get(st.protocol, "prefill-compress")
    stream_policy = st.protocol == kh._PROTO_STREAM  # its budget is a share of the window (eval's ctx)
    if press:
        def make(m, ctx):
            return kh.PagedCache(m.config, "f32"), KvcPress(spec)
        return Row(name, "prefill-compress", "kvcache.hf KvcPress on PagedCache", "KvcPress(%r)" % spec,
                   "f32 K/V of the tokens kept, whole blocks of 16 (bytes in use)", make)

    gates = None
    if st.policy_kind == kvcache.POLICY_DUO_ATTENTION:  # the gates derived for SmolLM2 (bench/duo)
        gates = os.path.join(HERE, "..", "duo", "gates-smollm2.txt")
        stream_policy = False  # no layer cap: streaming heads keep sinks + window

    def make(m, ctx):
        return kh.PagedCache(m.config, spec, context=ctx if stream_policy else None, head_gates=gates), None
    row = Row(name, proto, "kvcache.hf PagedCache", "PagedCache(config, %r)" % spec,
              "the pool's bytes in use (codes, scales, zero points, residual / staged tokens, sinks), "
              "as kvcache eval counts them", make)
    # Policies read attention through our kernels (h2o, tova, snapkv, pyramidkv need their scores);
    # every policy row runs on them, so that all policy rows share one attention implementation.
    row.paged_attention = st.protocol != kh._PROTO_NONE
    row.reconstruct = bool(st.reconstruct)  # kvzip: PagedCache.reconstruct_context after the prefill
    return row


# ------------------------------------------------------------------------------------------ runs
def forward(model, ids, pos0, cache, cache_kw):
    import torch

    n = ids.shape[1]
    start = int(cache.get_seq_length())
    with torch.no_grad():
        out = model(input_ids=ids, position_ids=torch.arange(pos0, pos0 + n).unsqueeze(0),
                    cache_position=torch.arange(start, start + n), use_cache=True, **{cache_kw: cache})
    return out.logits[0]


def attention_layers(model):
    base = model.model.language_model if hasattr(model.model, "language_model") else model.model
    return [layer.self_attn for layer in base.layers]


# A prefill-compress window whose prefill is shorter than this is not compressed (its press and
# after_prefill are skipped): the last, short window of a run (8 positions of 4,096 tokens at ctx
# 512) has fewer prefill tokens than StreamingLLM's 4 sinks, which kvpress's StreamingLLMPress
# asserts against and our cap refuses. The same windows for every row, ours and the peers'.
MIN_PRESS_PREFILL = 16


def run_window(model, feed, cache, press, protocol, chunk, prefill, cache_kw, on_step, after_prefill=None):
    """Logits [positions, vocab] (float32) of one window under the protocol; seconds of forward passes
    (and of after_prefill(), run after a prefill-compress prefill: KVzip's reconstruction pass).
    on_step() runs after every forward pass and, in the prefill, after every attention layer (before
    a press compresses that layer: its hook is registered after ours), so the peak sees the
    uncompressed prefill."""
    import torch

    n_pos = feed.shape[1]
    logits, pos, seconds = [], 0, 0.0
    if protocol == "prefill-compress" and prefill < MIN_PRESS_PREFILL:
        press = None  # (our PagedCache rows evict by their own policy: KVzip's still reconstructs first)
    if protocol == "prefill-compress":
        hooks = [a.register_forward_hook(lambda *args, **kw: on_step(), with_kwargs=True)
                 for a in attention_layers(model)]
        try:
            t0 = time.perf_counter()
            with (press(model) if press is not None else contextlib.nullcontext()):
                logits.append(forward(model, feed[:, :prefill], 0, cache, cache_kw))
            seconds += time.perf_counter() - t0
        finally:
            for h in hooks:
                h.remove()
        on_step()
        if after_prefill is not None:
            t0 = time.perf_counter()
            after_prefill()
            seconds += time.perf_counter() - t0
        pos = prefill
    elif press is not None:  # a decoding-time press: active for every pass
        ctx = press(model)
        ctx.__enter__()
    while pos < n_pos:
        n = min(chunk, n_pos - pos)
        t0 = time.perf_counter()
        logits.append(forward(model, feed[:, pos:pos + n], pos, cache, cache_kw))
        seconds += time.perf_counter() - t0
        on_step()
        pos += n
    if protocol == "stream" and press is not None:
        ctx.__exit__(None, None, None)
    return torch.cat(logits).double(), seconds


def log_softmax(x):
    import torch

    return torch.log_softmax(x, dim=-1)


def masked_count(model):
    """Tokens kvpress masks inside the dense cache (its masked_key_indices: AdaKV, KVzip), summed over
    layers: held in memory, never attended. masked_key_indices holds one (batch, KV head, position)
    triple per masked key of one head, so a layer's count is divided by its KV heads: a head-wise
    mask that hides 179 positions in each of 3 heads counts 179 tokens, as a press that drops 179
    tokens from every head would."""
    n = 0.0
    heads = model.config.num_key_value_heads
    for layer in model.model.layers:
        idx = getattr(layer.self_attn, "masked_key_indices", None)
        if idx is not None:
            n += int(idx[0].numel()) / heads
    return n


def load_checkpoint(path):
    try:
        with open(path) as f:
            ck = json.load(f)
    except (OSError, ValueError) as e:
        sys.exit("hf_caches: checkpoint %s is damaged (%s): remove it and start again" % (
            path, getattr(e, "strerror", None) or e))
    if not isinstance(ck, dict):
        sys.exit("hf_caches: checkpoint %s is damaged (not a JSON object): remove it and start again" % path)
    return ck


def measure(args):
    import torch
    import transformers

    import hfmodel
    import kvcache
    import kvcache.hf as kh

    torch.set_num_threads(args.threads)
    models = {"sdpa": hfmodel.load("sdpa")[0]}
    tok = hfmodel.load("sdpa")[1]
    all_ids = text_token_ids(args.text, tok)
    windows, n_scored = windows_of(len(all_ids), args.ctx, args.max_tokens)
    used_ids = all_ids[:1 + n_scored]
    have = {}
    try:
        import optimum.quanto  # noqa: F401
        import hqq  # noqa: F401
        have["quant"] = True
    except ImportError:
        have["quant"] = False
    have["fp8"] = hasattr(transformers.cache_utils, "Fp8QuantizedLayer")
    try:
        import kvpress  # noqa: F401
        have["kvpress"] = True
    except ImportError:
        have["kvpress"] = False
    names = args.rows.split(",") if args.rows else default_rows(have["quant"], have["fp8"], have["kvpress"])
    if args.resume and not args.rows and args.json and os.path.exists(args.json + ".partial"):
        ck = load_checkpoint(args.json + ".partial")  # the rows of the run being resumed (defaults change)
        rows_of_ck = ((ck.get("state") or {}).get("work") or {}).get("rows")
        if isinstance(rows_of_ck, list) and rows_of_ck and all(isinstance(x, str) for x in rows_of_ck):
            names = rows_of_ck
    dup = sorted({n for n in names if names.count(n) > 1})
    if dup:
        sys.exit("hf_caches: --rows names %s more than once" % ", ".join(dup))
    model = models["sdpa"]
    config = model.config
    n_layers, hk = config.num_hidden_layers, config.num_key_value_heads
    hd = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    rows = make_rows(names, model, args.prefill)
    for r in rows:
        if getattr(r, "eager", False) and "eager" not in models:
            models["eager"] = hfmodel.load("eager")[0]
        if getattr(r, "paged_attention", False) and "kvcache" not in models:
            models["kvcache"] = hfmodel.load(kh.ATTN_IMPLEMENTATION)[0]
    # Every row's cache and press built once before any window runs, so a bad row stops the run here
    # with one line; a press whose observation window is not shorter than a window's prefill cannot
    # compress it (kvpress asserts mid-run): refused here too (prefills under MIN_PRESS_PREFILL run
    # uncompressed for every row).
    prefills = sorted({max(1, int(args.prefill * (sc + 1))) for _, sc in windows})
    if any(r.protocol == "prefill-compress" for r in rows) and prefills[-1] < MIN_PRESS_PREFILL:
        sys.exit("hf_caches: --ctx %d with --prefill %g prefills at most %d positions, fewer than the %d a "
                 "window needs to be compressed: the prefill-compress rows would equal their reference; "
                 "raise --ctx" % (args.ctx, args.prefill, prefills[-1], MIN_PRESS_PREFILL))
    for r in rows:
        try:
            m = models["eager"] if getattr(r, "eager", False) else \
                models["kvcache"] if getattr(r, "paged_attention", False) else model
            press = r.make(m, args.ctx)[1]
        except Exception as e:  # noqa: BLE001 (the press's or cache's own message)
            sys.exit("hf_caches: row '%s': %s: %s" % (r.name, type(e).__name__, e))
        if r.protocol != "prefill-compress" or press is None:
            continue
        inner = getattr(press, "press", press)  # AdaKV wraps the press it makes head-wise
        win = getattr(inner, "window_size", None)
        bad = [pf for pf in prefills if isinstance(win, int) and MIN_PRESS_PREFILL <= pf <= win]
        if bad:
            sys.exit("hf_caches: row '%s': its observation window of %d positions needs a longer prefill, and "
                     "--ctx %d / --max-tokens %d / --prefill %g give a window prefilling %d: change --ctx or "
                     "--max-tokens" % (r.name, win, args.ctx, args.max_tokens, args.prefill, bad[0]))
    protocols = sorted({r.protocol for r in rows})
    refs = {p: Row("dynamic-f32 (%s)" % p, p, "transformers DynamicCache", "DynamicCache()",
                   "f32 K/V of every token", lambda m, ctx: (transformers.DynamicCache(), None)) for p in protocols}
    cache_kw = hfmodel.cache_kw()
    f16_bytes_per_position = 2 * n_layers * hk * hd * 2
    def summarize(windows):
        """The report over `windows` (those done so far)."""
        n_scored = sum(sc for _, sc in windows)
        used_ids = all_ids[:1 + n_scored]
        results = []
        longest = max(s + 1 for _, s in windows)
        for proto in protocols:
            ref = refs[proto]
            ppl_ref = math.exp(ref.nll / ref.n)
            for r in [ref] + [x for x in rows if x.protocol == proto]:
                ppl = math.exp(min(r.nll / r.n, 700.0)) if math.isfinite(r.nll) else float("nan")
                per_token = r.bytes_end / (r.tokens_end / n_layers) if r.tokens_end else 0.0
                res = {
                    "strategy": r.name,
                    "side": r.side,
                    "settings": r.settings,
                    "protocol": proto,
                    "reference": r is ref,
                    "bits_formula": r.formula,
                    "bits_per_element": per_token * 8 / (2 * n_layers * hk * hd),
                    "kv_bytes_per_token": per_token,
                    "bytes_held": r.bytes_end / max(1, sum(1 for _, s in windows if s == args.ctx - 1) or 1),
                    "peak_kv_bytes": r.peak,
                    "kept_fraction": r.tokens_end / r.positions_end if r.positions_end else 1.0,
                    "attended_fraction": r.attended_end / r.positions_end if r.positions_end else 1.0,
                    "memory_vs_f16": (f16_bytes_per_position * r.positions_end / n_layers / r.bytes_end
                                      if r.bytes_end else 0.0),
                    "peak_memory_vs_f16": f16_bytes_per_position * longest / r.peak if r.peak else 0.0,
                    "ppl": ppl,
                    "ppl_delta_pct": (ppl - ppl_ref) / ppl_ref * 100.0,
                    "kl_mean": r.kl / r.n,
                    "top1_agreement": r.top1 / r.n,
                    "ms_per_token": r.seconds * 1000.0 / r.positions,
                }
                bad = [k for k in ("ppl", "ppl_delta_pct", "kl_mean") if not math.isfinite(res[k])]
                if bad:  # e.g. fp8's frozen scale overflowing: no number to compare
                    res["note"] = "non-finite %s (NaN or inf logits)" % ", ".join(bad)
                    for k in bad:
                        res[k] = None
                results.append(res)
        versions = {"torch": torch.__version__, "transformers": transformers.__version__,
                    "kvcache": getattr(kvcache, "__version__", "?")}
        for mod in ("kvpress", "optimum.quanto", "hqq"):
            try:
                versions[mod] = __import__(mod, fromlist=["_"]).__version__
            except (ImportError, AttributeError):
                pass
        return {
            "peer": "transformers caches and kvpress presses",
            "model": hfmodel.GGUF,
            "text": os.path.basename(args.text),
            "token_ids_count": len(used_ids),
            "token_ids_sha256": token_ids_sha256(used_ids),
            "ctx": args.ctx,
            "windows": len(windows),
            "tokens_scored": n_scored,
            "chunk": args.chunk,
            "prefill_fraction": args.prefill,
            "min_press_prefill": MIN_PRESS_PREFILL,
            "threads": args.threads,
            "reference": "transformers DynamicCache f32 under the row's protocol",
            "versions": versions,
            "command": "python3 bench/peers/hf_caches.py " + " ".join(sys.argv[1:]),
            "wall_seconds": time.time() - t_start,
            "results": results,
        }

    acc_keys = ("nll", "kl", "seconds", "top1", "n", "positions", "bytes_end", "tokens_end", "positions_end",
                "peak", "attended_end")
    work = {"text": os.path.basename(args.text), "ctx": args.ctx, "max_tokens": args.max_tokens,
            "chunk": args.chunk, "prefill": args.prefill, "rows": names,
            "token_ids_sha256": token_ids_sha256(used_ids)}

    def state(done, elapsed):
        """What --resume needs: the windows done and every row's sums (non-finite ones as strings)."""
        def enc(x):
            return x if isinstance(x, int) or math.isfinite(x) else repr(float(x))
        return {"work": work, "windows_done": done, "elapsed": elapsed,
                "rows": [[r.name, r.protocol, {k: enc(getattr(r, k)) for k in acc_keys}]
                         for r in list(refs.values()) + rows]}

    start, elapsed0 = 0, 0.0
    if args.resume:
        if not args.json or not os.path.exists(args.json + ".partial"):
            sys.exit("hf_caches: --resume needs the checkpoint %s.partial of an earlier run" % args.json)
        st = load_checkpoint(args.json + ".partial").get("state")
        if not isinstance(st, dict) or st.get("work") != work:
            sys.exit("hf_caches: %s.partial is not a checkpoint of this work (text, ctx, max tokens, chunk, prefill, "
                     "rows, token ids): give the same arguments, or drop --resume" % args.json)
        by = {(r.name, r.protocol): r for r in list(refs.values()) + rows}
        try:
            done = st["windows_done"]
            if not isinstance(done, int) or not 1 <= done < len(windows):
                raise ValueError("windows_done %r: not 1..%d" % (done, len(windows) - 1))
            got = {}
            for name, proto, sums in st["rows"]:
                if (name, proto) not in by or (name, proto) in got:
                    raise ValueError("row %r (%s) is not one of this run's, or repeats" % (name, proto))
                vals = {}
                for k in acc_keys:
                    v = sums[k]
                    v = float(v) if isinstance(v, str) else v
                    if isinstance(v, bool) or not isinstance(v, (int, float)) or (k not in ("nll", "kl") and
                                                                                  not v >= 0):
                        raise ValueError("row %r: %s %r" % (name, k, sums[k]))
                    vals[k] = v
                got[(name, proto)] = vals
            if set(got) != set(by):
                raise ValueError("its rows are not this run's")
            elapsed = float(st["elapsed"])
        except (KeyError, TypeError, ValueError) as e:
            sys.exit("hf_caches: checkpoint %s.partial is damaged (%s): remove it and start again" % (args.json, e))
        for key, vals in got.items():
            for k, v in vals.items():
                setattr(by[key], k, v)
        start, elapsed0 = done, elapsed
        print("hf_caches: resuming after window %d/%d" % (start, len(windows)), file=sys.stderr, flush=True)

    t_start = time.time() - elapsed0
    for wi, (first, scored) in enumerate(windows):
        if wi < start:
            continue
        n_pos = scored + 1  # as eval: the last position is fed, its prediction belongs to the next window
        feed = torch.tensor([all_ids[first - 1:first - 1 + n_pos]])
        targets = torch.tensor(all_ids[first:first + scored])
        prefill = max(1, int(args.prefill * n_pos))
        full = scored == args.ctx - 1
        for proto in protocols:
            ref_logp = None
            for r in [refs[proto]] + [x for x in rows if x.protocol == proto]:
                m = models["eager"] if getattr(r, "eager", False) else \
                    models["kvcache"] if getattr(r, "paged_attention", False) else model
                cache, press = r.make(m, args.ctx)
                if getattr(r, "masks", False):
                    r.masked = lambda m=m: masked_count(m)

                def on_step(r=r, cache=cache):
                    b, _, _ = r.held(cache, n_layers)
                    r.peak = max(r.peak, b)
                recon = None
                if getattr(r, "reconstruct", False):
                    def recon(m=m, cache=cache, ids=feed[:, :prefill]):
                        cache.reconstruct_context(m, ids, tok)
                logits, secs = run_window(m, feed, cache, press, proto, args.chunk, prefill, cache_kw, on_step,
                                          recon)
                lp = log_softmax(logits[:scored])
                r.nll -= float(lp[torch.arange(scored), targets].sum())
                if ref_logp is None:
                    ref_logp = lp
                    ref_p = lp.exp()
                    ref_top = lp.argmax(dim=-1)
                r.kl += float((ref_p * (ref_logp - lp)).sum())
                r.top1 += int((lp.argmax(dim=-1) == ref_top).sum())
                r.n += scored
                r.seconds += secs
                r.positions += n_pos
                if full or len(windows) == 1:
                    b, toks, attended = r.held(cache, n_layers)
                    r.bytes_end += b
                    r.tokens_end += toks
                    r.attended_end += attended
                    r.positions_end += n_pos * n_layers
                del cache, press
        print("hf_caches: window %d/%d done (%.0f s)" % (wi + 1, len(windows), time.time() - t_start),
              file=sys.stderr, flush=True)
        if args.json and wi + 1 < len(windows):  # a checkpoint: the windows done so far
            part = summarize(windows[:wi + 1])
            part["complete"] = False
            part["state"] = state(wi + 1, time.time() - t_start)
            write_json(args.json + ".partial", part)
            if args.stop_after and wi + 1 - start >= args.stop_after:
                print("hf_caches: stopped after %d windows; continue with the same arguments and --resume"
                      % (wi + 1 - start), file=sys.stderr, flush=True)
                return None

    return summarize(windows)  # main() removes the checkpoint once the report is written


def read_report(path, prog, key):
    """The JSON report of bench/peers/PROG.py at path (an object with a results list and `key`), or exit
    with one line naming what is wrong."""
    try:
        with open(path) as f:
            r = json.load(f)
    except (OSError, ValueError) as e:
        sys.exit("%s: cannot read report %s: %s" % (prog, path, getattr(e, "strerror", None) or e))
    if not isinstance(r, dict) or not isinstance(r.get("results"), list) or key not in r:
        sys.exit("%s: %s is not a %s.py report" % (prog, path, prog))
    return r


def default_text():
    """The shared TinyStories text (imports torch through hfmodel: for measuring runs only)."""
    import hfmodel

    return os.path.join(hfmodel.shared_dir(), "data", "tinystories-valid-sample.txt")


def merge(paths):
    reports = []
    for p in paths:
        r = read_report(p, "hf_caches", "tokens_scored")
        if r.get("complete") is False:
            sys.exit("hf_caches: %s is a checkpoint of an unfinished run (complete: false): finish it with --resume"
                     % p)
        reports.append(r)
    base = dict(reports[0])
    for k in ("model", "token_ids_sha256", "token_ids_count", "ctx", "chunk", "prefill_fraction"):
        for p, r in zip(paths, reports):
            if r.get(k) != base.get(k):
                sys.exit("hf_caches: %s has %s %r, %s has %r: not the same work" % (p, k, r.get(k), paths[0],
                                                                                    base.get(k)))
    seen, results = set(), []
    for r in reports:
        for row in r["results"]:
            key = (row["strategy"], row.get("protocol", "stream"), row.get("side", r.get("peer")))
            if key not in seen:
                seen.add(key)
                results.append(row)
    base["results"] = results
    base["versions"] = {p: r.get("versions") for p, r in zip(paths, reports)}
    base["command"] = [r.get("command") for r in reports]
    base["wall_seconds"] = sum(r.get("wall_seconds", 0) for r in reports)
    return base


def print_table(rep):
    print("%s on %s: %d tokens in %d windows of ctx %d, chunk %d; reference: %s" % (
        rep["peer"], rep["model"], rep["tokens_scored"], rep["windows"], rep["ctx"], rep.get("chunk", 1),
        rep.get("reference", "?")))
    w = max(len(r["strategy"]) for r in rep["results"])
    print("%-*s  %-16s %9s %7s %9s %10s %10s %10s %7s %9s" % (w, "row", "protocol", "bits/elem", "kept", "mem/f16",
                                                             "ppl", "ppl Δ%", "KL mean", "top-1", "ms/token"))
    def num(v, fmt):
        return ("%" + fmt) % v if v is not None else "%*s" % (int(fmt.lstrip("+").split(".")[0]), "-")

    for r in rep["results"]:
        print("%-*s  %-16s %9.2f %6.1f%% %8.2fx %s %s %s %7.4f %9.2f" % (
            w, r["strategy"], r.get("protocol", "stream"), r["bits_per_element"], 100 * r.get("kept_fraction", 1.0),
            r.get("memory_vs_f16", 16.0 / r["bits_per_element"]),
            num(r["ppl"], "10.5f"), num(r["ppl_delta_pct"], "+10.4f"), num(r["kl_mean"], "10.3e"),
            r.get("top1_agreement", float("nan")), r.get("ms_per_token", float("nan"))))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--text", help="the text to score (default: the shared tinystories-valid-sample.txt)")
    ap.add_argument("--ctx", type=int, default=512)
    ap.add_argument("--max-tokens", type=int, default=4096)
    ap.add_argument("--chunk", type=int, default=1, help="positions per forward pass outside the prefill")
    ap.add_argument("--prefill", type=float, default=0.5, help="prefill-compress: the share of a window prefilled")
    ap.add_argument("--rows", help="comma-separated rows (default: every one this venv can run)")
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--json", help="write the report as JSON to this file")
    ap.add_argument("--merge", nargs="+", metavar="REPORT", help="merge reports of the same work into --json")
    ap.add_argument("--list", action="store_true", help="print every row name and exit")
    ap.add_argument("--stop-after", type=int, metavar="N",
                    help="stop after N windows of this run, leaving the checkpoint JSON.partial for --resume")
    ap.add_argument("--resume", action="store_true",
                    help="continue the run whose checkpoint is JSON.partial (same arguments) after its last window")
    a = ap.parse_args()
    if a.list:
        print("\n".join(default_rows(True, True, False) + default_rows(False, False, True)))
        return
    if a.json:
        check_out(a.json, "hf_caches")
    if a.merge:
        rep = merge(a.merge)
    else:
        if (not 2 <= a.ctx <= 65536 or a.max_tokens < 0 or a.chunk < 1 or not 0 < a.prefill < 1
                or not 1 <= a.threads <= MAX_THREADS):
            sys.exit("hf_caches: need 2 <= --ctx <= 65536, --max-tokens >= 0 (0: the whole text), --chunk >= 1, "
                     "0 < --prefill < 1, 1 <= --threads <= %d" % MAX_THREADS)
        if a.rows is not None and not a.rows.strip():
            sys.exit("hf_caches: --rows is empty (leave it out for the default rows; --list names them)")
        if a.json and not a.resume and os.path.exists(a.json + ".partial"):
            sys.exit("hf_caches: %s.partial holds an unfinished run: continue it with --resume (and its "
                     "arguments), or remove it" % a.json)
        if (a.stop_after is not None and a.stop_after < 1) or ((a.stop_after or a.resume) and not a.json):
            sys.exit("hf_caches: --stop-after N needs N >= 1; --stop-after and --resume need --json")
        a.text = a.text or default_text()
        try:
            rep = measure(a)
        except KeyboardInterrupt:
            sys.exit("hf_caches: interrupted%s" % (
                "; the windows done are in %s.partial: continue with the same arguments and --resume" % a.json
                if a.json and os.path.exists(a.json + ".partial") else ""))
        if rep is None:
            return
    print_table(rep)
    if a.json:
        write_json(a.json, rep)
        if not a.merge and os.path.exists(a.json + ".partial"):
            os.remove(a.json + ".partial")


if __name__ == "__main__":
    main()
