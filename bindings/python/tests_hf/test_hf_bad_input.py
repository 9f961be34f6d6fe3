"""Bad input is a clear Python exception, never a crash, never a half-applied change."""

import types

import pytest
import torch

import hfmodel
import kvcache
import kvcache.hf as kh


def test_config_it_cannot_hold():
    cfg = types.SimpleNamespace(num_hidden_layers=2, num_attention_heads=4, hidden_size=64)
    with pytest.raises(ValueError, match="num_key_value_heads"):
        kh.PagedCache(cfg)
    cfg = types.SimpleNamespace(num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=3, hidden_size=64)
    with pytest.raises(ValueError, match="multiple"):
        kh.PagedCache(cfg)
    cfg = types.SimpleNamespace(num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                                layer_types=["full_attention", "sliding_attention"])
    with pytest.raises(ValueError, match="sliding"):
        kh.PagedCache(cfg)


@pytest.mark.parametrize("spec, words", [("int9:per-token", "unknown codec or policy 'int9'"),
                                         ("f16:", "empty parameter"),
                                         ("f16+bf16", "more than one codec"),
                                         ("f16:group=32", "takes no parameter 'group'")])
def test_malformed_strategy(sdpa, spec, words):
    with pytest.raises(ValueError, match=words.replace("(", r"\(").replace(")", r"\)")):
        kh.PagedCache(sdpa[0].config, spec)


def test_bad_options(sdpa):
    cfg = sdpa[0].config
    for kw in ({"num_blocks": 0}, {"num_blocks": 4, "pool_bytes": 1 << 20}, {"block_size": -1},
               {"tiers": [{"kind": "host"}]}):
        with pytest.raises(ValueError):
            kh.PagedCache(cfg, "f16", **kw)


def test_pool_too_small_says_how_many_blocks(sdpa):
    model, tok = sdpa
    inputs = hfmodel.prompts(tok, n=1, tokens=96)[0]
    cache = kh.PagedCache(model.config, "f16", num_blocks=60)  # 2 blocks per layer; 96 tokens need 6
    with pytest.raises(kvcache.KvcError, match="blocks") as e:
        model(**inputs, use_cache=True, **{hfmodel.cache_kw(): cache})
    assert e.value.status in (kvcache.ERR_EXCEEDS_CAPACITY, kvcache.ERR_POOL_EXHAUSTED)
    assert cache.get_seq_length() == 0 and cache.stats()["tokens_stored"] == 0  # nothing half-applied
    small = {k: v[:, :16] for k, v in inputs.items()}  # a prompt that fits still runs afterwards
    model(**small, use_cache=True, **{hfmodel.cache_kw(): cache})
    assert cache.get_seq_length() == 16


def test_tensors_of_wrong_dtype_shape_device(sdpa):
    model, _ = sdpa
    cfg = model.config
    cache = kh.PagedCache(cfg, "f16", num_blocks=200)
    hk, d = cfg.num_key_value_heads, cfg.head_dim
    good = torch.randn(1, hk, 4, d)
    cache.update(good, good, 0)
    before = cache.stats()["tokens_stored"]
    with pytest.raises(TypeError, match="float64"):
        cache.update(good.double(), good.double(), 1)
    with pytest.raises(ValueError, match="shape"):
        cache.update(torch.randn(1, hk + 1, 4, d), torch.randn(1, hk + 1, 4, d), 1)
    with pytest.raises(ValueError, match="meta"):
        cache.update(good.to("meta"), good.to("meta"), 1)
    assert cache.stats()["tokens_stored"] == before
    # The binding refuses tensors it cannot read in place, naming the problem.
    pool = cache.pool
    sid = cache._seqs[0]
    with pytest.raises(ValueError, match="C-contiguous"):
        pool.append(sid, 1, 0, good[0].transpose(0, 1), good[0].transpose(0, 1))
    with pytest.raises(TypeError, match="int64"):
        pool.append(sid, 1, 0, torch.zeros(4, hk, d, dtype=torch.int64), torch.zeros(4, hk, d, dtype=torch.int64))
    with pytest.raises(ValueError, match="shape"):
        pool.attention_decode(0, [sid], torch.randn(2, cfg.num_attention_heads, d))
    assert cache.stats()["tokens_stored"] == before


# Review findings (adversarial helper, 2026-12-02), on a tiny random Llama.
def tiny(attn="sdpa"):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    cfg = LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                      num_key_value_heads=2, vocab_size=100, head_dim=16, attn_implementation=attn)
    return LlamaForCausalLM(cfg).eval()


def test_review_crop_zero_and_indices():
    m = tiny()
    ids = torch.randint(1, 100, (2, 20))
    c = kh.PagedCache(m.config, "f32")
    m(input_ids=ids, use_cache=True, **{hfmodel.cache_kw(): c})
    c.crop(0)
    assert c.get_seq_length() == (20 if kh._NEW_CACHE_API else 0)
    if kh._NEW_CACHE_API:
        for bad in (torch.tensor([0, 5]), torch.tensor([-1, 0])):
            with pytest.raises(ValueError, match="outside"):
                c.reorder_cache(bad)
        for bad in (torch.tensor([1.7, 0.0]), torch.tensor([True, False])):
            with pytest.raises(TypeError, match="integers"):
                c.reorder_cache(bad)
        with pytest.raises(ValueError):
            c.batch_repeat_interleave(0)
        with pytest.raises(TypeError):
            c.crop(-1.5)
        assert c.get_seq_length() == 20 and c.batch_size == 2


def test_review_cache_for_another_attention():
    mk, ms = tiny("kvcache"), tiny("sdpa")
    c = kh.PagedCache(mk.config, "f32")
    with pytest.raises(RuntimeError, match="another attention"):
        ms(input_ids=torch.randint(1, 100, (1, 8)), use_cache=True, **{hfmodel.cache_kw(): c})


def test_review_failed_pass_leaves_nothing():
    mk = tiny("kvcache")
    c = kh.PagedCache(mk.config, "f32")
    ids = torch.randint(1, 100, (1, 8))
    mk(input_ids=ids, use_cache=True, **{hfmodel.cache_kw(): c})
    attn1 = mk.model.layers[1].self_attn
    hook = attn1.q_proj.register_forward_hook(lambda mod, i, o: o * float("nan"))
    try:
        with pytest.raises(kvcache.KvcError, match="NON_FINITE|non-finite|NaN"):
            mk(input_ids=ids[:, :1], position_ids=torch.tensor([[8]]), use_cache=True, **{hfmodel.cache_kw(): c})
    finally:
        hook.remove()
    assert c.get_seq_length() == 8 and [c.pool.layer_tokens(c._seqs[0], i) for i in (0, 1)] == [8, 8]
    mk(input_ids=ids[:, :1], position_ids=torch.tensor([[8]]), use_cache=True, **{hfmodel.cache_kw(): c})
    assert c.get_seq_length() == 9


def test_review_options_checked_before_rows():
    ms = tiny()
    with pytest.raises(ValueError, match="threads"):
        kh.PagedCache(ms.config, "f32", threads=1000)
    c = kh.PagedCache(ms.config, "streaming:budget=0.1+f32")
    ids = torch.randint(1, 100, (1, 20))
    with pytest.raises(ValueError, match="sinks"):
        ms(input_ids=ids, use_cache=True, **{hfmodel.cache_kw(): c})
    assert c.batch_size == -1  # no row was made
    with pytest.raises(ValueError, match="codec"):
        kh.KvcPress("snapkv:budget=0.5+int4:group=16")


def test_review_in_place_edit_is_not_a_selection():
    ms = tiny()
    c = kh.PagedCache(ms.config, "f32")
    ms(input_ids=torch.randint(1, 100, (1, 20)), use_cache=True, **{hfmodel.cache_kw(): c})
    k, v = c.layers[0].keys, c.layers[0].values
    k[..., :8] = 0  # ThinK-style edit of what was read
    with pytest.raises(NotImplementedError, match="subset"):
        c.layers[0].keys = k
        c.layers[0].values = v
    assert c.pool.layer_tokens(c._seqs[0], 0) == 20
    assert not torch.equal(c.layers[0].keys[..., :8], torch.zeros_like(k[..., :8]))
