"""SmolLM2-135M-Instruct (Q4_1 GGUF, the file scripts/fetch-models.sh fetches) through transformers.

The GGUF is decoded by transformers once per machine and transformers
version (``from_pretrained(gguf_file=...)``, ~45 s on 2 cores); the decoded
weights, config and tokenizer are kept next to the GGUF
(``hf-<transformers version>/``) and later loads take a few seconds. The
weights are the same tensors either way (f32, de-quantized by transformers)."""

import hashlib
import os
import subprocess

import torch
import transformers

GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.normpath(os.path.join(HERE, "..", "..", ".."))


def model_cache():
    d = os.environ.get("KVCACHE_MODEL_CACHE")
    if not d:
        base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
        d = os.path.join(base, "kvcache")
    return d


def gguf_path():
    """The GGUF, fetched with scripts/fetch-models.sh when missing."""
    path = os.path.join(model_cache(), GGUF)
    if not os.path.exists(path):
        subprocess.run(["bash", os.path.join(ROOT, "scripts", "fetch-models.sh")], check=True)
    return path


def shared_dir():
    return os.environ.get("KVCACHE_SHARED_DIR") or os.path.join(ROOT, "..", "shared")


def shared_text(name="tinystories-valid-sample.txt"):
    with open(os.path.join(shared_dir(), "data", name), encoding="utf-8") as f:
        return f.read()


_LOADED = {}


def load(attn_implementation="sdpa"):
    """(model, tokenizer), the model in eval mode with the given attention."""
    key = attn_implementation
    if key in _LOADED:
        return _LOADED[key]
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    gguf = gguf_path()
    conv = os.path.join(model_cache(), "hf-%s" % transformers.__version__)
    weights = os.path.join(conv, "weights.pt")
    if not os.path.exists(weights):
        os.makedirs(conv, exist_ok=True)
        tok = AutoTokenizer.from_pretrained(os.path.dirname(gguf), gguf_file=GGUF)
        m = AutoModelForCausalLM.from_pretrained(os.path.dirname(gguf), gguf_file=GGUF)
        tok.save_pretrained(conv)
        m.config.save_pretrained(conv)
        tmp = weights + ".tmp%d" % os.getpid()
        torch.save(m.state_dict(), tmp)
        os.replace(tmp, weights)
    tok = AutoTokenizer.from_pretrained(conv)
    config = AutoConfig.from_pretrained(conv)
    config._attn_implementation = attn_implementation
    model = AutoModelForCausalLM.from_config(config, attn_implementation=attn_implementation)
    model.load_state_dict(torch.load(weights, weights_only=True))
    model.tie_weights()
    model.eval()
    _LOADED[key] = (model, tok)
    return model, tok


def cache_kw():
    """generate()'s cache keyword: `cache` from transformers 5.3, `past_key_values` before."""
    import kvcache.hf

    return "cache" if kvcache.hf._NEW_CACHE_API else "past_key_values"


def generate(model, inputs, cache, **kw):
    """model.generate(**inputs, <cache keyword>=cache, do_sample=False unless given, ...)."""
    kw.setdefault("do_sample", False)
    kw.setdefault("pad_token_id", 0)
    return model.generate(**inputs, **{cache_kw(): cache}, **kw)


def prompts(tok, n=3, tokens=96):
    """n prompts of about `tokens` tokens from the shared text (different places)."""
    text = shared_text()
    out = []
    step = len(text) // (n + 1)
    for i in range(n):
        chunk = text[i * step:i * step + 4 * tokens]
        ids = tok(chunk, return_tensors="pt")["input_ids"][:, :tokens]
        out.append({"input_ids": ids, "attention_mask": ids.new_ones(ids.shape)})
    return out


def first_difference(a, b):
    """Index of the first differing token of two 1-D tensors (len when equal)."""
    n = min(len(a), len(b))
    for i in range(n):
        if int(a[i]) != int(b[i]):
            return i
    return n


def tensor_bytes(obj, seen=None, depth=0):
    """Bytes of every tensor reachable from obj's attributes, lists and dicts, each storage once: what a
    transformers cache holds (quanto's tensor subclasses by their parts, HQQ's meta dicts, fp8's
    (codes, scale) tuples, residual tensors). bench/hf_bench.py and bench/peers/hf_caches.py count
    bytes held with it."""
    seen = set() if seen is None else seen
    if depth > 6 or obj is None:
        return 0
    if isinstance(obj, torch.Tensor):
        if hasattr(obj, "__tensor_flatten__"):  # a tensor subclass (quanto's packed tensors): its parts
            names, _ = obj.__tensor_flatten__()
            return sum(tensor_bytes(getattr(obj, n), seen, depth + 1) for n in names)
        key = (obj.untyped_storage().data_ptr(), obj.untyped_storage().nbytes()) if obj.numel() else None
        if key is None or key in seen:
            return 0
        seen.add(key)
        return obj.untyped_storage().nbytes()
    total = 0
    if isinstance(obj, dict):
        items = obj.values()
    elif isinstance(obj, (list, tuple)):
        items = obj
    elif hasattr(obj, "__dict__"):
        items = vars(obj).values()
    else:
        return 0
    for v in items:
        total += tensor_bytes(v, seen, depth + 1)
    return total
