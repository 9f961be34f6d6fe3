"""Bad input is a clear Python exception, never a crash, never a half-applied change."""

import types

import pytest
import torch

import hfmodel
import kvcache
import kvcache.hf as kh


@pytest.fixture(scope="module")
def sdpa():
    return hfmodel.load("sdpa")


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
