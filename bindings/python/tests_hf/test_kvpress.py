"""kvpress (transformers 5.2.x venv): its presses run on a PagedCache through kvpress's own pipeline.
Each holds the same number of tokens per layer as on a DynamicCache, gives the same answer on a
needle-in-context prompt made from the shared text, and leaves the freed blocks free; KvcPress
(our policies as a press) runs in the same pipeline on both caches."""

import pytest
import torch
from transformers import DynamicCache, pipeline

import hfmodel
import kvcache.hf as kh

kvpress = pytest.importorskip("kvpress")  # (a skip fails the run: conftest.py)

NEEDLE = " The secret code of the blue door is 4817. "
QUESTION = "\nWhat is the secret code of the blue door? The secret code is"


@pytest.fixture(scope="module")
def setup():
    model, tok = hfmodel.load("sdpa")
    text = hfmodel.shared_text()[:1800]
    cut = text.index(". ", 900) + 1
    context = text[:cut] + NEEDLE + text[cut:]
    pipe = pipeline("kv-press-text-generation", model=model, tokenizer=tok)
    return model, tok, pipe, context


def run(pipe, context, press, cache):
    return pipe(context, question=QUESTION, press=press, cache=cache, max_new_tokens=8)["answer"]


def held_dynamic(cache):
    return [layer.keys.shape[2] for layer in cache.layers]


def held_paged(cache):
    return [cache.pool.layer_tokens(cache._seqs[0], i) for i in range(len(cache.layers))]


PRESSES = {
    "streaming_llm": lambda: kvpress.StreamingLLMPress(compression_ratio=0.5),
    "snapkv": lambda: kvpress.SnapKVPress(compression_ratio=0.5),
    "knorm": lambda: kvpress.KnormPress(compression_ratio=0.5),
    "expected_attention": lambda: kvpress.ExpectedAttentionPress(compression_ratio=0.5),
}


@pytest.mark.parametrize("name", list(PRESSES))
def test_press_on_paged_cache_matches_dynamic_cache(setup, name):
    model, tok, pipe, context = setup
    dyn = DynamicCache()
    a_dyn = run(pipe, context, PRESSES[name](), dyn)
    paged = kh.PagedCache(model.config, "f32")
    a_paged = run(pipe, context, PRESSES[name](), paged)
    n_ctx = len(tok(context)["input_ids"])
    want = held_dynamic(dyn)
    assert want[0] < 0.6 * n_ctx  # the press really compressed
    assert held_paged(paged) == want
    assert a_paged == a_dyn, (a_paged, a_dyn)
    st = paged.stats()
    assert st["tokens_stored"] == sum(want)
    assert st["blocks_used"] == sum(-(-n // 16) for n in want)  # the dropped tokens' blocks are free
    print("%s: %d of %d tokens per layer, answer %r" % (name, want[0], n_ctx, a_paged))


def test_no_press_answer_equals_dynamic(setup):
    model, _, pipe, context = setup
    assert run(pipe, context, None, kh.PagedCache(model.config, "f32")) == run(pipe, context, None, DynamicCache())


@pytest.mark.parametrize("spec", ["snapkv:budget=0.5", "streaming:budget=0.5:sinks=4", "h2o:budget=0.5"])
def test_kvc_press_in_kvpress_pipeline(setup, spec):
    """Our policies as a press: the same tokens kept on a DynamicCache and on a PagedCache (where the
    selection becomes kvc_seq_keep), and the same answer."""
    model, tok, pipe, context = setup
    press = kh.KvcPress(spec)
    dyn = DynamicCache()
    a_dyn = run(pipe, context, press, dyn)
    paged = kh.PagedCache(model.config, "f32")
    a_paged = run(pipe, context, press, paged)
    n_ctx = len(tok(context)["input_ids"])
    want = held_dynamic(dyn)
    assert held_paged(paged) == want
    assert abs(want[0] - 0.5 * n_ctx) <= 16  # budget 0.5 of the context (the chat template adds a few tokens)
    assert a_paged == a_dyn
    # The kept tokens are the same rows on both caches (layer 3's keys).
    assert torch.equal(dyn.layers[3].keys, paged.layers[3].keys)
    print("%s: %d of %d tokens per layer, answer %r" % (spec, want[0], n_ctx, a_paged))


def test_kvc_press_refuses_a_codec_only_strategy():
    with pytest.raises(ValueError, match="no eviction policy"):
        kh.KvcPress("int8:per-token")
