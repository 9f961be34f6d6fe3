"""Every Cache method does the real thing in the pool: sequence length and mask sizes, crop
(speculative-decoding rollback), reorder / batch select (forks), reset (free), batches with
padding (ragged rows), a plain forward loop, stats()."""

import pytest
import torch
from transformers import DynamicCache

import hfmodel
import kvcache.hf as kh


def forward(model, ids, cache, past=0):
    pos = torch.arange(past, past + ids.shape[1]).unsqueeze(0)
    out = model(input_ids=ids, position_ids=pos, use_cache=True, **{hfmodel.cache_kw(): cache})
    return out.logits


@pytest.mark.parametrize("attn", ["sdpa", "kvcache"])
def test_forward_loop_logits_equal_dynamic_cache(sdpa, paged, attn):
    """Prefill + 8 decode steps; logits equal DynamicCache's (f32 storage, sdpa: bit for bit)."""
    model = (sdpa if attn == "sdpa" else paged)[0]
    ref_model, tok = sdpa
    ids = hfmodel.prompts(tok, n=1, tokens=40)[0]["input_ids"]
    dc, pc = DynamicCache(config=ref_model.config), kh.PagedCache(model.config, "f32")
    a, b = forward(ref_model, ids, dc), forward(model, ids, pc)
    for step in range(8):
        if attn == "sdpa":
            assert torch.equal(a, b)
        else:
            assert (a - b).abs().max() < 1e-3
        nxt = a[:, -1:].argmax(-1)
        past = ids.shape[1] + step
        a, b = forward(ref_model, nxt, dc, past), forward(model, nxt, pc, past)
        assert pc.get_seq_length() == dc.get_seq_length() == past + 1
    assert pc.get_mask_sizes(1 if kh._NEW_CACHE_API else torch.arange(1), 0) == (pc.get_seq_length() + 1, 0)
    st = pc.stats()
    layers = model.config.num_hidden_layers
    assert st["tokens_stored"] == layers * pc.get_seq_length()
    for key in ("bytes_in_use", "peak_bytes_in_use", "blocks_used", "blocks_free", "tokens_stored",
                "bits_per_element"):
        assert key in st
    assert st["bits_per_element"] >= 32.0  # f32 storage, whole blocks counted


def test_crop_is_truncation(sdpa):
    model, tok = sdpa
    ids = hfmodel.prompts(tok, n=1, tokens=40)[0]["input_ids"]
    pc = kh.PagedCache(model.config, "f32")
    full = forward(model, ids, pc)
    used = pc.stats()["blocks_used"]
    if kh._NEW_CACHE_API:
        with pytest.raises(ValueError):
            pc.crop(5)
        pc.crop(-24)
    else:
        pc.crop(16)
    assert pc.get_seq_length() == 16
    assert pc.stats()["blocks_used"] < used  # truncated blocks are freed
    # The rolled-back tokens recomputed give the same logits as the first pass.
    again = forward(model, ids[:, 16:], pc, past=16)
    assert torch.equal(again, full[:, 16:])


def test_reorder_and_select_are_forks(sdpa):
    model, tok = sdpa
    ids = hfmodel.prompts(tok, n=1, tokens=40)[0]["input_ids"].repeat(3, 1)
    pc = kh.PagedCache(model.config, "f32")
    forward(model, ids, pc)
    before = pc.stats()
    pc.reorder_cache(torch.tensor([2, 2, 0]))
    after = pc.stats()
    assert after["blocks_used"] == before["blocks_used"] - before["blocks_used"] // 3  # row 1 freed, row 2 shared
    assert after["blocks_shared"] > 0
    pc.batch_select_indices(torch.tensor([0]))
    assert pc.batch_size == 1 and pc.get_seq_length() == 40
    pc.reset()
    st = pc.stats()
    assert st["blocks_used"] == 0 and st["tokens_stored"] == 0 and pc.get_seq_length() == 0


@pytest.mark.parametrize("attn", ["sdpa", "kvcache"])
def test_padded_batch_rows_match_single_runs(sdpa, paged, attn):
    """Batch 3 with left padding (ragged prompts): each row generates what it does alone."""
    model, tok = sdpa if attn == "sdpa" else paged
    tok.padding_side = "left"
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token
    text = hfmodel.shared_text()
    texts = [text[:120], text[300:520], text[900:960]]
    batch = tok(texts, return_tensors="pt", padding=True)
    assert (batch["attention_mask"] == 0).any()
    cache = kh.PagedCache(model.config, "f32")
    out = hfmodel.generate(model, batch, cache, max_new_tokens=16, pad_token_id=tok.pad_token_id)
    width = batch["input_ids"].shape[1]
    for row, t in enumerate(texts):
        single = tok(t, return_tensors="pt")
        ref = hfmodel.generate(sdpa[0], single, DynamicCache(config=sdpa[0].config), max_new_tokens=16)
        got, want = out[row, width:], ref[0, single["input_ids"].shape[1]:]
        first = hfmodel.first_difference(got, want)
        assert first >= 12, "row %d differs at new token %d" % (row, first)
    if attn == "kvcache":  # padding is not stored: each row holds its own tokens
        lens = [cache.pool.layer_tokens(sid, 0) for sid in cache._seqs]
        real = batch["attention_mask"].sum(dim=1).tolist()
        assert lens == [r + 15 for r in real]
