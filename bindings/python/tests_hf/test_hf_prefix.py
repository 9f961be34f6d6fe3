"""Prefix reuse across requests: the second request computes only its uncached tail, whose logits
equal a full-prompt run's with the same chunking, bit for bit (f32 / f16 storage); with a disk tier
the prefix comes back in a new pool."""

import pytest
import torch

import hfmodel
import kvcache.hf as kh


def forward(model, ids, cache, past=0):
    pos = torch.arange(past, past + ids.shape[1]).unsqueeze(0)
    return model(input_ids=ids, position_ids=pos, use_cache=True, **{hfmodel.cache_kw(): cache}).logits


def two_prompts(tok):
    a = hfmodel.prompts(tok, n=1, tokens=96)[0]["input_ids"]
    other = hfmodel.prompts(tok, n=2, tokens=40)[1]["input_ids"]
    b = torch.cat([a[:, :80], other[:, :30]], dim=1)  # shares a's first 80 tokens (5 blocks of 16)
    return a, b


@pytest.mark.parametrize("attn, spec", [("sdpa", "f32"), ("sdpa", "f16"), ("kvcache", "f16")])
def test_tail_logits_bit_identical(sdpa, paged, attn, spec):
    model, tok = sdpa if attn == "sdpa" else paged
    a, b = two_prompts(tok)
    cache = kh.PagedCache(model.config, spec, prefix_cache=True)
    forward(model, a, cache)
    assert cache.register_prefix(a) == 6
    cache.reset()
    hit = cache.attach_prefix(b)
    assert hit == 80 and cache.get_seq_length() == 80
    tail = forward(model, b[:, hit:], cache, past=hit)
    ref_cache = kh.PagedCache(model.config, spec)
    forward(model, b[:, :hit], ref_cache)
    ref_tail = forward(model, b[:, hit:], ref_cache, past=hit)
    assert torch.equal(tail, ref_tail)
    st = cache.pool.prefix_stats()
    assert st.hit_tokens >= 80


def test_generate_computes_only_the_tail(sdpa):
    model, tok = sdpa
    a, b = two_prompts(tok)
    cache = kh.PagedCache(model.config, "f32", prefix_cache=True)
    hfmodel.generate(model, {"input_ids": a, "attention_mask": torch.ones_like(a)}, cache, max_new_tokens=4)
    cache.register_prefix(a)
    cache.reset()
    seen = []
    hook = model.model.embed_tokens.register_forward_hook(lambda m, i, o: seen.append(i[0].shape[1]))
    try:
        hit = cache.attach_prefix(b)
        out = hfmodel.generate(model, {"input_ids": b, "attention_mask": torch.ones_like(b)}, cache,
                               max_new_tokens=8)
    finally:
        hook.remove()
    assert seen[0] == b.shape[1] - hit == 30  # the first forward pass computed only the uncached tail
    full = hfmodel.generate(model, {"input_ids": b, "attention_mask": torch.ones_like(b)},
                            kh.PagedCache(model.config, "f32"), max_new_tokens=8)
    assert hfmodel.first_difference(out[0], full[0]) >= b.shape[1] + 6


def test_disk_tier_serves_a_new_pool(sdpa, tmp_path):
    model, tok = sdpa
    a, b = two_prompts(tok)
    tiers = [{"kind": "disk", "capacity_bytes": 1 << 28, "path": str(tmp_path)}]
    first = kh.PagedCache(model.config, "f16", prefix_cache=True, tiers=tiers)
    forward(model, a, first)
    first.register_prefix(a)
    del first
    second = kh.PagedCache(model.config, "f16", prefix_cache=True, tiers=tiers)  # a new pool: empty
    hit = second.attach_prefix(b)
    assert hit == 80
    loaded = second.pool.tier_stats(0)
    assert loaded.hits >= 5  # the five blocks came from the disk tier
    tail = forward(model, b[:, hit:], second, past=hit)
    ref = kh.PagedCache(model.config, "f16")
    forward(model, b[:, :hit], ref)
    assert torch.equal(tail, forward(model, b[:, hit:], ref, past=hit))
