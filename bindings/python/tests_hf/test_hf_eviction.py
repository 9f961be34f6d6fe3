"""Eviction policies of a strategy evict in the pool during generate(), and the freed blocks are free."""

import os

import pytest
import torch
from transformers import DynamicCache

import hfmodel
import kvcache.hf as kh


def held(cache, layer=0):
    return [cache.pool.layer_tokens(sid, layer) for sid in cache._seqs]


@pytest.mark.parametrize("spec", ["streaming:tokens=64:sinks=4", "window:tokens=64"])
def test_stream_policies_cap_every_layer(sdpa, spec):
    model, tok = sdpa
    inputs = hfmodel.prompts(tok, n=1, tokens=96)[0]
    full = kh.PagedCache(model.config, "f16")
    hfmodel.generate(model, inputs, full, max_new_tokens=24)
    cache = kh.PagedCache(model.config, spec + "+f16")
    out = hfmodel.generate(model, inputs, cache, max_new_tokens=24)
    ref = hfmodel.generate(model, inputs, DynamicCache(config=model.config), max_new_tokens=24)
    n = inputs["input_ids"].shape[1]
    assert int(out[0, n]) == int(ref[0, n])  # the first token comes from the whole prompt
    for layer in range(model.config.num_hidden_layers):
        assert held(cache, layer) == [64]
    s, f = cache.stats(), full.stats()
    layers = model.config.num_hidden_layers
    assert s["tokens_stored"] == 64 * layers
    assert f["tokens_stored"] == (n + 23) * layers
    assert s["blocks_used"] == 4 * layers < f["blocks_used"]  # 64 tokens in 4 blocks of 16 per layer
    assert s["blocks_free"] > f["blocks_free"] - (s["blocks_total"] - f["blocks_total"])
    # Text positions are kept: the pool's positions of layer 0 are the sinks and the newest tokens.
    pos = cache.pool.positions(cache._seqs[0], 0, 0, 64)
    if spec.startswith("streaming"):
        assert list(pos[:4]) == [0, 1, 2, 3] and pos[-1] == n + 22
    else:
        assert list(pos) == list(range(n + 23 - 64, n + 23))


def test_score_policies_need_kvcache_attention(sdpa):
    model, _ = sdpa
    with pytest.raises(ValueError, match="kvcache"):
        kh.PagedCache(model.config, "h2o:tokens=64+f16")


@pytest.mark.parametrize("spec", ["h2o:tokens=64", "tova:tokens=64"])
def test_h2o_tova_with_kvcache_attention(paged, spec):
    model, tok = paged
    inputs = hfmodel.prompts(tok, n=1, tokens=96)[0]
    cache = kh.PagedCache(model.config, spec + "+f16")
    out = hfmodel.generate(model, inputs, cache, max_new_tokens=24)
    assert out.shape[1] == inputs["input_ids"].shape[1] + 24
    for layer in (0, 15, 29):
        assert held(cache, layer) == [64]
    assert cache.stats()["tokens_stored"] == 64 * model.config.num_hidden_layers
    # Heavy hitters: some kept tokens are neither the newest 32 nor the oldest.
    pos = cache.pool.positions(cache._seqs[0], 0, 0, 64)
    assert any(8 <= p < 96 - 40 for p in pos)


@pytest.mark.parametrize("spec", ["snapkv:budget=0.5", "pyramidkv:budget=0.5"])
def test_prefill_compression(paged, spec):
    """SnapKV / PyramidKV compress the prompt once after the prefill (eval's protocol, kvpress's too)."""
    model, tok = paged
    inputs = hfmodel.prompts(tok, n=1, tokens=96)[0]
    cache = kh.PagedCache(model.config, spec + "+f16")
    hfmodel.generate(model, inputs, cache, max_new_tokens=8)
    per_layer = [held(cache, layer)[0] - 7 for layer in range(model.config.num_hidden_layers)]
    if spec.startswith("snapkv"):
        assert per_layer == [48] * len(per_layer)
    else:
        assert per_layer[0] > per_layer[-1] and sum(per_layer) <= 48 * len(per_layer) + len(per_layer)


@pytest.mark.parametrize("spec", ["streaming:tokens=64:sinks=4", "window:tokens=64"])
def test_stream_policy_chunks_with_sdpa(sdpa, paged, spec):
    """Passes of several positions after the prompt, with sdpa attention: the mask is sized for the
    tokens the layer holds after the eviction the pass triggers (the pending one after the prefill,
    and the automatic one that makes room under the cap), causal within the pass. The logits are
    those of kvcache attention, which reads the pool directly."""
    ids = hfmodel.prompts(sdpa[1], n=1, tokens=96)[0]["input_ids"]
    n = ids.shape[1]
    more = torch.tensor([[int(t) for t in (ids[0, 10:34])]])  # 24 more positions, 3 passes of 8
    logits = {}
    for name, (model, _) in (("sdpa", sdpa), ("paged", paged)):
        cache = kh.PagedCache(model.config, spec + "+f32")
        out = []
        with torch.no_grad():
            model(input_ids=ids, past_key_values=cache, use_cache=True)
            for c in range(3):
                pos = torch.arange(n + 8 * c, n + 8 * c + 8).unsqueeze(0)
                r = model(input_ids=more[:, 8 * c:8 * c + 8], past_key_values=cache, use_cache=True,
                          position_ids=pos, cache_position=pos[0])
                out.append(r.logits[0])
                for layer in (0, 29):
                    assert held(cache, layer) == [64], (name, c, layer, held(cache, layer))
        logits[name] = torch.cat(out)
    assert torch.allclose(logits["sdpa"], logits["paged"], atol=2e-4, rtol=1e-4), \
        float((logits["sdpa"] - logits["paged"]).abs().max())


def test_knorm_prefill_with_sdpa(sdpa):
    """knorm reads no attention, so it runs on sdpa: after the prompt, each layer keeps the half
    of it whose keys have the smallest L2 norm, mean over KV heads (here against the keys a
    DynamicCache holds, in float64), and the decoded tokens."""
    model, tok = sdpa
    inputs = hfmodel.prompts(tok, n=1, tokens=96)[0]
    n = inputs["input_ids"].shape[1]
    ref = DynamicCache(config=model.config)
    with torch.no_grad():
        model(**inputs, past_key_values=ref, use_cache=True)
    cache = kh.PagedCache(model.config, "knorm:budget=0.5+f32")
    hfmodel.generate(model, inputs, cache, max_new_tokens=4)
    for layer in (0, 17, 29):
        k = ref.layers[layer].keys[0].double()  # [kv_heads, n, head_dim]
        norm = k.norm(dim=-1).mean(dim=0)
        want = sorted(int(i) for i in torch.argsort(norm, stable=True)[:n // 2])
        pos = list(cache.pool.positions(cache._seqs[0], layer, 0, n // 2 + 3))
        assert pos[:n // 2] == want, layer
        assert pos[n // 2:] == [n, n + 1, n + 2]


def test_expected_attention_matches_a_torch_reference(paged):
    """expected-attention through kvcache attention: after the prompt, layer L keeps the sinks and
    the tokens a float64 torch computation of ExpectedAttention ranks highest, from the model's
    own pre-RoPE queries (q_proj) and the K/V a DynamicCache holds (RoPE NeoX at the config's
    theta, mean rotation over the next 512 positions), and the decoded tokens."""
    model, tok = paged
    cfg = model.config
    inputs = hfmodel.prompts(tok, n=1, tokens=96)[0]
    n = inputs["input_ids"].shape[1]
    hq, hk = cfg.num_attention_heads, cfg.num_key_value_heads
    d = cfg.hidden_size // hq
    theta = float(kh._geometry(cfg)[4])
    layers = (0, 13, 29)
    qpre = {}
    hooks = [model.model.layers[i].self_attn.q_proj.register_forward_hook(
        lambda m, a, out, i=i: qpre.__setitem__(i, out[0].detach().double().view(-1, hq, d))) for i in layers]
    ref = DynamicCache(config=cfg)
    try:
        with torch.no_grad():
            model(**inputs, past_key_values=ref, use_cache=True)
    finally:
        for h in hooks:
            h.remove()
    cache = kh.PagedCache(cfg, "expected-attention:budget=0.5+f32")
    hfmodel.generate(model, inputs, cache, max_new_tokens=3)
    half = d // 2
    freq = theta ** (-2.0 * torch.arange(half, dtype=torch.float64) / d)
    t = torch.arange(n, n + 512, dtype=torch.float64)[:, None] * freq  # [512, half]
    c, s = torch.cos(t).mean(0), torch.sin(t).mean(0)
    R = torch.zeros(d, d, dtype=torch.float64)  # mean of the NeoX rotation matrices
    idx = torch.arange(half)
    R[idx, idx], R[idx + half, idx + half] = c, c
    R[idx, idx + half], R[idx + half, idx] = -s, s
    keep = n // 2
    for layer in layers:
        q = qpre[layer]  # [n, hq, d], pre-RoPE
        k = ref.layers[layer].keys[0].double()[:, 4:]  # [hk, n - 4, d]: the sinks are kept apart
        v = ref.layers[layer].values[0].double()[:, 4:]
        score = torch.zeros(n - 4, dtype=torch.float64)
        for j in range(hq):
            mu = q[:, j].mean(0)
            S = torch.cov(q[:, j].T, correction=0)
            mu, S = R @ mu, R @ S @ R.T
            kk = k[j // (hq // hk)]
            z = kk @ mu / d ** 0.5 + ((kk @ S) * kk).sum(-1) / (2 * d)
            score += torch.softmax(z, 0) / (hq // hk) * v[j // (hq // hk)].norm(dim=-1)
        want = [0, 1, 2, 3] + sorted(int(i) + 4 for i in torch.argsort(score, descending=True, stable=True)[:keep - 4])
        pos = list(cache.pool.positions(cache._seqs[0], layer, 0, keep + 2))
        assert pos[:keep] == want, (layer, sorted(set(pos[:keep]) ^ set(want)))
        assert pos[keep:] == [n, n + 1]


def _kvzip_prefill(model, tok, spec="kvzip:budget=0.5+f32", tokens=96):
    inputs = hfmodel.prompts(tok, n=1, tokens=tokens)[0]
    cache = kh.PagedCache(model.config, spec)
    with torch.no_grad():
        model(input_ids=inputs["input_ids"], past_key_values=cache, use_cache=True)
    return inputs["input_ids"], cache


def test_kvzip_reconstruction_matches_eager_attention(paged):
    """kvzip: reconstruct_context records, per layer, token and KV head, the largest attention any
    reconstruction query of the head's group gives a prefill token: the probabilities of transformers'
    own eager attention over prompt + instruction + context (output_attentions). The next pass evicts
    to the layers' shared total (48 of 96 per layer on average), by one threshold over every layer's
    recorded scores summed over the KV heads, the 4 sinks kept in each layer."""
    model, tok = paged
    eager, _ = hfmodel.load("eager")
    cfg = model.config
    hq, hk, layers = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.num_hidden_layers
    ids, cache = _kvzip_prefill(model, tok)
    n = ids.shape[1]
    cache.reconstruct_context(model, ids, tok)
    rep = tok.encode("\n\nRepeat the previous context exactly.", add_special_tokens=False)
    full = torch.cat([ids, torch.tensor([rep]), ids[:, 1:]], dim=1)
    with torch.no_grad():
        att = eager(input_ids=full, output_attentions=True).attentions
    sid = cache._seqs[0]
    got = [torch.as_tensor(cache.pool.scores(sid, layer)) for layer in range(layers)]
    for layer in (0, 13, 29):
        a = att[layer][0, :, n:, :n].double()  # [hq, rows, n]: the reconstruction's queries
        want = a.amax(dim=1).view(hk, hq // hk, n).amax(dim=1).T  # [n, hk]
        assert got[layer].shape == (n, hk)
        assert torch.allclose(got[layer].double(), want, atol=1e-4), \
            (layer, float((got[layer].double() - want).abs().max()))
    assert all(cache.pool.layer_tokens(sid, layer) == n for layer in range(layers))  # nothing evicted yet
    # The shared threshold over the recorded scores (f32 sums head by head as the library adds them;
    # ties: the newer token).
    sums = []
    for layer in range(layers):
        acc = got[layer][:, 0].clone()
        for h in range(1, hk):
            acc = acc + got[layer][:, h]
        sums.append(acc)
    cand = [(float(sums[layer][t]), t, -layer) for layer in range(layers) for t in range(4, n)]
    cand.sort(reverse=True)
    keep = {layer: set(range(4)) for layer in range(layers)}
    for _, t, neg in cand[:layers * (n // 2) - 4 * layers]:
        keep[-neg].add(t)
    with torch.no_grad():
        model(input_ids=torch.tensor([[ids[0, -1].item()]]), past_key_values=cache, use_cache=True)
    held = 0
    for layer in range(layers):
        m = cache.pool.layer_tokens(sid, layer)
        held += m
        pos = list(cache.pool.positions(sid, layer, 0, m))
        assert pos == sorted(keep[layer]) + [n], (layer, sorted(set(pos[:-1]) ^ keep[layer]))
    assert held == layers * (n // 2 + 1)  # the shared total, and each layer's new token
    assert len({cache.pool.layer_tokens(sid, layer) for layer in range(layers)}) > 1  # not uniform


def test_kvzip_refusals(paged, sdpa):
    """kvzip without its reconstruction: the eviction the next pass runs is refused (the library's
    message) and stays due; reconstruct_context refuses another strategy, a call before the prefill
    or after the next pass, and input_ids that are not the prefill; sdpa models are refused."""
    model, tok = paged
    ids, cache = _kvzip_prefill(model, tok, tokens=40)
    step = torch.tensor([[ids[0, -1].item()]])
    for _ in range(2):
        with pytest.raises(kh.KvcError, match="reconstruction"):
            with torch.no_grad():
                model(input_ids=step, past_key_values=cache, use_cache=True)
        assert cache.pool.layer_tokens(cache._seqs[0], 0) == 40
    with pytest.raises(ValueError, match=r"expected \[1, 40\]"):
        cache.reconstruct_context(model, ids[:, :39], tok)
    with pytest.raises(ValueError, match="tokenizer or repeat_ids"):
        cache.reconstruct_context(model, ids)
    cache.reconstruct_context(model, ids, repeat_ids=[1, 2, 3], chunk=16)  # now it evicts
    with torch.no_grad():
        model(input_ids=step, past_key_values=cache, use_cache=True)
    assert cache.pool.layer_tokens(cache._seqs[0], 0) < 40
    with pytest.raises(ValueError, match="after the prefill"):
        cache.reconstruct_context(model, ids, tok)
    fresh = kh.PagedCache(model.config, "kvzip:budget=0.5+f32")
    with pytest.raises(ValueError, match="after the prefill"):
        fresh.reconstruct_context(model, ids, tok)
    other = kh.PagedCache(model.config, "snapkv:budget=0.5+f32")
    with pytest.raises(ValueError, match="not kvzip"):
        other.reconstruct_context(model, ids, tok)
    with pytest.raises(ValueError, match="kvcache"):
        kh.PagedCache(sdpa[0].config, "kvzip:budget=0.5")


GATES = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "..", "bench", "duo", "gates-smollm2.txt")


def test_duo_attention_streams_the_gated_heads(paged):
    """DuoAttention through PagedCache: the heads with the lowest gates (bench/duo's, derived for
    SmolLM2) keep 4 sinks + the 32 newest tokens in their own blocks, the others every token;
    heads=0 (no streaming head) generates what the plain head-wise cache does."""
    model, tok = paged
    inputs = hfmodel.prompts(tok, n=1, tokens=96)[0]
    n = inputs["input_ids"].shape[1]
    gates = kh.load_head_gates(GATES)
    layers, hk = model.config.num_hidden_layers, model.config.num_key_value_heads
    cache = kh.PagedCache(model.config, "duo-attention:heads=0.5:window=32:sinks=4+f16", head_gates=GATES)
    hfmodel.generate(model, inputs, cache, max_new_tokens=24)
    stream = kh.streaming_heads(gates, 0.5)
    assert stream.count(0.0) == round(0.5 * layers * hk)
    sid, last = cache._seqs[0], n + 22  # the newest position written
    for layer in range(layers):
        for h in range(hk):
            pos = list(cache.pool.head_positions(sid, layer, h))
            if stream[layer * hk + h] == 0.0:
                assert pos[:4] == [0, 1, 2, 3] and pos[4:] == list(range(pos[4], last + 1)), (layer, h)
                assert len(pos) <= 4 + 32, (layer, h, len(pos))
            else:
                assert pos == list(range(last + 1)), (layer, h)
    # The streaming heads' blocks are freed: fewer bytes than every head's full cache.
    # Without head_gates: the gates the package ships for SmolLM2 (the same file), the same kept sets.
    builtin = kh.PagedCache(model.config, "duo-attention:heads=0.5:window=32:sinks=4+f16")
    hfmodel.generate(model, inputs, builtin, max_new_tokens=24)
    for layer in range(layers):
        for h in range(hk):
            assert list(builtin.pool.head_positions(builtin._seqs[0], layer, h)) == \
                list(cache.pool.head_positions(sid, layer, h))
    none = kh.PagedCache(model.config, "duo-attention:heads=0:window=32+f16", head_gates=gates)
    out = hfmodel.generate(model, inputs, none, max_new_tokens=24)
    assert cache.stats()["bytes_in_use"] < 0.75 * none.stats()["bytes_in_use"]
    ref = hfmodel.generate(model, inputs, kh.PagedCache(model.config, "f16"), max_new_tokens=24)
    assert out.tolist() == ref.tolist()


def test_duo_attention_gate_refusals(paged, sdpa):
    model, _ = paged
    layers, hk = model.config.num_hidden_layers, model.config.num_key_value_heads
    import transformers

    other = transformers.LlamaConfig(num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                                     hidden_size=64, intermediate_size=128, vocab_size=100)
    with pytest.raises(ValueError, match="head_gates"):  # no gates built in for this model
        kh.PagedCache(other, "duo-attention:heads=0.5")
    with pytest.raises(ValueError, match="%d head_gates" % (layers * hk - 1)):
        kh.PagedCache(model.config, "duo-attention:heads=0.5", head_gates=[0.5] * (layers * hk - 1))
    with pytest.raises(ValueError, match=r"\[0, 1\]"):
        kh.PagedCache(model.config, "duo-attention:heads=0.5", head_gates=[float("nan")] * (layers * hk))
    with pytest.raises(ValueError, match="stream-head=%d" % (layers * hk)):  # checked at construction
        kh.PagedCache(model.config, "duo-attention:stream-head=%d" % (layers * hk), head_gates=GATES)
    with pytest.raises(ValueError, match="whole number"):
        kh.PagedCache(model.config, "duo-attention:window=4.5", head_gates=GATES)
    with pytest.raises(ValueError, match="does not take them"):
        kh.PagedCache(model.config, "h2o:tokens=64", head_gates=GATES)
    with pytest.raises(ValueError, match="kvcache"):  # head-wise pools need kvcache attention
        kh.PagedCache(sdpa[0].config, "duo-attention:heads=0.5", head_gates=GATES)
