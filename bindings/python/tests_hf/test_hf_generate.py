"""generate() through transformers' own forward pass with a PagedCache, against DynamicCache:
greedy (sdpa and the kvcache attention backend), int8 storage, beam search, sampling, memory."""

import pytest
import torch
from transformers import DynamicCache

import hfmodel
import kvcache.hf as kh

NEW = 40


@pytest.fixture(scope="module")
def refs(sdpa):
    """(inputs, DynamicCache + sdpa greedy output) for two prompts of 96 tokens of the shared text."""
    model, tok = sdpa
    return [(inputs, hfmodel.generate(model, inputs, DynamicCache(config=model.config), max_new_tokens=NEW))
            for inputs in hfmodel.prompts(tok, n=2, tokens=96)]


def _new_tokens(out, inputs):
    return out[0, inputs["input_ids"].shape[1]:]


def test_greedy_f32_identical_to_dynamic_cache(sdpa, refs):
    model, _ = sdpa
    for inputs, ref in refs:
        cache = kh.PagedCache(model.config, "f32")
        out = hfmodel.generate(model, inputs, cache, max_new_tokens=NEW)
        assert torch.equal(out, ref), hfmodel.first_difference(_new_tokens(out, inputs), _new_tokens(ref, inputs))
        assert cache.get_seq_length() == out.shape[1] - 1  # the last token is sampled, not cached


def test_kvcache_attention_f32_matches_sdpa(paged, refs):
    model, _ = paged
    firsts = []
    for inputs, ref in refs:
        out = hfmodel.generate(model, inputs, kh.PagedCache(model.config, "f32"), max_new_tokens=NEW)
        first = hfmodel.first_difference(_new_tokens(out, inputs), _new_tokens(ref, inputs))
        firsts.append(first)
        assert first >= 24, "kvcache attention differs from sdpa at new token %d" % first
    print("kvcache attention vs sdpa: first difference at new token", firsts, "of", NEW)


def test_int8_per_token_first_tokens_and_bytes(sdpa, refs):
    attn = "sdpa"
    model, _ = sdpa
    inputs, ref = refs[0]
    c8 = kh.PagedCache(model.config, "int8:per-token")
    out = hfmodel.generate(model, inputs, c8, max_new_tokens=NEW)
    first = hfmodel.first_difference(_new_tokens(out, inputs), _new_tokens(ref, inputs))
    print("int8:per-token (%s) vs DynamicCache: first difference at new token %d of %d" % (attn, first, NEW))
    assert first >= 12, "int8:per-token differs at new token %d" % first
    if attn == "sdpa":
        c16 = kh.PagedCache(model.config, "f16")
        hfmodel.generate(model, inputs, c16, max_new_tokens=NEW)
        s8, s16 = c8.stats(), c16.stats()
        assert s8["tokens_stored"] == s16["tokens_stored"] > 0
        assert s8["bytes_in_use"] < 0.6 * s16["bytes_in_use"], (s8["bytes_in_use"], s16["bytes_in_use"])
        print("bytes in use: int8:per-token %d, f16 %d (%.3fx)" % (s8["bytes_in_use"], s16["bytes_in_use"],
                                                                    s8["bytes_in_use"] / s16["bytes_in_use"]))
        assert 8.0 < s8["bits_per_element"] < 16.0 <= s16["bits_per_element"]


def test_beam_search_identical_to_dynamic_cache(sdpa):
    model, tok = sdpa
    inputs = hfmodel.prompts(tok, n=1, tokens=64)[0]
    kw = dict(max_new_tokens=12, num_beams=4, early_stopping=True)
    ref = hfmodel.generate(model, inputs, DynamicCache(config=model.config), **kw)
    cache = kh.PagedCache(model.config, "f32")
    out = hfmodel.generate(model, inputs, cache, **kw)
    assert torch.equal(out, ref)
    assert cache.stats()["blocks_shared"] > 0  # the beams share their prompt blocks (forks)


def test_sampling_identical_to_dynamic_cache(sdpa):
    model, tok = sdpa
    inputs = hfmodel.prompts(tok, n=1, tokens=64)[0]
    kw = dict(max_new_tokens=24, do_sample=True, top_k=50, temperature=0.9)
    torch.manual_seed(7)
    ref = hfmodel.generate(model, inputs, DynamicCache(config=model.config), **kw)
    torch.manual_seed(7)
    out = hfmodel.generate(model, inputs, kh.PagedCache(model.config, "f32"), **kw)
    assert torch.equal(out, ref)
