"""Head-wise pools (KVC_POOL_HEADWISE) and AdaKV head budgets through the Python binding:
per-head kept sets that free blocks, attention over each head's own tokens against numpy,
AdaKV policies, the strategy parser's headwise / adakv spellings, refusals."""
import numpy as np
import pytest

import kvcache

L, HQ, HK, D, BS = 2, 4, 2, 16, 4


def config(headwise=True, blocks=256):
    cfg = kvcache.PoolConfig()
    cfg.num_layers, cfg.num_q_heads, cfg.num_kv_heads, cfg.head_dim = L, HQ, HK, D
    cfg.block_size = BS
    cfg.num_blocks = blocks
    cfg.k_dtype = cfg.v_dtype = kvcache.DTYPE_F32
    if headwise:
        cfg.flags = cfg.flags | kvcache.POOL_HEADWISE
    return cfg


def filled(pool, n, seed=0):
    rng = np.random.default_rng(seed)
    k = rng.standard_normal((n, HK, D)).astype(np.float32)
    v = rng.standard_normal((n, HK, D)).astype(np.float32)
    pool.seq_create(1)
    pool.reserve(1, n)
    for layer in range(L):
        pool.append(1, layer, 0, k, v)
    return k, v


def attention_ref(q, k, v, kept):
    """q [HQ, D]; KV head h attends to its kept positions only (float64 softmax)."""
    out = np.zeros((HQ, D))
    for j in range(HQ):
        h = j // (HQ // HK)
        kk, vv = k[kept[h], h].astype(np.float64), v[kept[h], h].astype(np.float64)
        z = kk @ q[j].astype(np.float64) / np.sqrt(D)
        p = np.exp(z - z.max())
        out[j] = (p / p.sum()) @ vv
    return out


def test_keep_head_frees_blocks_and_attention_matches():
    with kvcache.Pool(config()) as pool:
        k, v = filled(pool, 32)
        used = pool.stats().bytes_in_use
        kept0, kept1 = [0, 5, 9, 31], list(range(0, 32, 2))
        assert pool.keep_head(1, 0, 0, kept0) == 28
        assert pool.keep_head(1, 0, 1, kept1) == 16
        assert pool.head_tokens(1, 0, 0) == 4 and pool.head_tokens(1, 0, 1) == 16
        assert list(pool.head_positions(1, 0, 0)) == kept0
        assert len(pool.head_block_table(1, 0, 0)) == 1 and len(pool.head_block_table(1, 0, 1)) == 4
        stride = pool.stats().bytes_per_block
        assert used - pool.stats().bytes_in_use == (8 - 1 + 8 - 4) * stride  # each head's own blocks
        q = np.random.default_rng(1).standard_normal((HQ, D)).astype(np.float32)
        out = pool.attention_decode(0, [1], q.reshape(1, HQ, D))
        np.testing.assert_allclose(np.asarray(out).reshape(HQ, D), attention_ref(q, k, v, [kept0, kept1]),
                                   atol=1e-5)
        with pytest.raises(kvcache.KvcError) as e:  # the heads differ: a layer read is refused
            pool.scores(1, 0)
        assert e.value.status == kvcache.ERR_UNSUPPORTED


def test_adakv_policy_moves_budget_between_heads():
    with kvcache.Pool(config()) as pool:
        filled(pool, 40)
        n = 40
        scores = np.zeros((n, HK), np.float32)
        scores[:, 0] = np.linspace(1, 2, n)  # head 0 scores high everywhere
        scores[:, 1] = np.linspace(0.01, 0.02, n)
        for layer in range(L):
            pool.observe_scores(1, layer, scores)
        pc = kvcache.PolicyConfig()
        pc.kind = kvcache.POLICY_TOVA
        pc.budget_tokens = 10
        pc.head_budget = kvcache.HEAD_BUDGET_ADAKV
        pc.head_floor = 0.2
        pool.evict(1, kvcache.Policy(pc))
        for layer in range(L):
            # head 1 keeps its floor (2 of 10), head 0 the rest of the shared 20
            assert pool.head_tokens(1, layer, 0) == 18 and pool.head_tokens(1, layer, 1) == 2
            assert list(pool.head_positions(1, layer, 1)) == [38, 39]


def test_adakv_refused_in_token_wise_pool():
    with kvcache.Pool(config(headwise=False)) as pool:
        filled(pool, 8)
        pc = kvcache.PolicyConfig()
        pc.kind = kvcache.POLICY_TOVA
        pc.budget_tokens = 4
        pc.head_budget = kvcache.HEAD_BUDGET_ADAKV
        with pytest.raises(kvcache.KvcError) as e:
            pool.seq_set_policy(1, kvcache.Policy(pc))
        assert e.value.status == kvcache.ERR_UNSUPPORTED
        with pytest.raises(kvcache.KvcError) as e:
            pool.keep_head(1, 0, 0, [0, 1])
        assert e.value.status == kvcache.ERR_UNSUPPORTED
        assert pool.layer_tokens(1, 0) == 8


def test_strategy_spellings():
    st = kvcache.parse_strategy("adakv:floor=0.3+kvzip:budget=0.3")
    assert st.headwise and st.head_budget == kvcache.HEAD_BUDGET_ADAKV and st.head_floor == 0.3
    assert st.spec == "adakv:floor=0.3+kvzip:budget=0.3+f16"
    st = kvcache.parse_strategy("snapkv:budget=0.5:headwise")
    assert st.headwise and st.head_budget == kvcache.HEAD_BUDGET_UNIFORM
    for bad in ("adakv", "adakv+streaming:budget=0.3", "adakv:floor=2+h2o", "adakv+adakv+h2o",
                "duo-attention:window=4.5", "duo-attention:stream-head=1.5", "streaming:tokens=64:sinks=2.5",
                "snapkv:window=16.5", "int4:group=31.5"):  # counts are whole numbers
        with pytest.raises(kvcache.KvcError):
            kvcache.parse_strategy(bad)


def duo_config(sinks=2, window=6):
    pc = kvcache.PolicyConfig()
    pc.kind = kvcache.POLICY_DUO_ATTENTION
    pc.sink_tokens = sinks
    pc.recent_tokens = window
    return pc


def test_duo_attention_gates_stream_the_gated_heads():
    # gates [layer][head]: layer 0 head 1 and layer 1 head 0 stream (below the 0.5 threshold)
    gates = np.array([[0.9, 0.1], [0.2, 1.0]], np.float32)
    with kvcache.Pool(config()) as pool:
        k, v = filled(pool, 24)
        pool.evict(1, kvcache.Policy.with_head_gates(duo_config(), gates.tobytes()))
        stream = list(range(2)) + list(range(18, 24))  # 2 sinks + the 6 newest
        for layer in range(L):
            for h in range(HK):
                want = stream if gates[layer, h] < 0.5 else list(range(24))
                assert list(pool.head_positions(1, layer, h)) == want, (layer, h)
        q = np.random.default_rng(3).standard_normal((HQ, D)).astype(np.float32)
        out = pool.attention_decode(0, [1], q.reshape(1, HQ, D))
        np.testing.assert_allclose(np.asarray(out).reshape(HQ, D),
                                   attention_ref(q, k, v, [list(range(24)), stream]), atol=1e-5)


def test_duo_attention_gates_are_numbers_not_raw_bytes():
    # an int32 / float64 / float16 array or a list is converted (1 -> 1.0: no head streams), never
    # read as raw float32 bytes
    for gates in (np.array([1, 1, 1, 1], np.int32), np.ones(4), np.ones(4, np.float16), [1, 1, 1, 1],
                  np.ones((2, 2), ">f4")):
        with kvcache.Pool(config()) as pool:
            filled(pool, 24)
            pool.evict(1, kvcache.Policy.with_head_gates(duo_config(), gates))
            assert [pool.head_tokens(1, layer, h) for layer in range(L) for h in range(HK)] == [24] * 4


def test_duo_attention_gate_errors():
    pc = duo_config()
    for bad, status in ((b"", kvcache.ERR_INVALID_ARGUMENT), (b"\0\0\0", kvcache.ERR_INVALID_ARGUMENT),
                        (np.array([0.5, float("nan")], np.float32).tobytes(), kvcache.ERR_INVALID_ARGUMENT),
                        (np.array([1.5], np.float32).tobytes(), kvcache.ERR_INVALID_ARGUMENT)):
        with pytest.raises(kvcache.KvcError) as e:
            kvcache.Policy.with_head_gates(pc, bad)
        assert e.value.status == status, bad
    with pytest.raises(TypeError):  # not numbers
        kvcache.Policy.with_head_gates(pc, np.array(["a", "b"]))
    with pytest.raises(kvcache.KvcError) as e:  # DuoAttention without gates
        kvcache.Policy(pc)
    assert e.value.status == kvcache.ERR_INVALID_ARGUMENT
    with kvcache.Pool(config()) as pool:
        filled(pool, 12)
        wrong = kvcache.Policy.with_head_gates(pc, np.zeros(3, np.float32).tobytes())  # 3 gates, 2 x 2 heads
        with pytest.raises(kvcache.KvcError) as e:
            pool.evict(1, wrong)
        assert e.value.status == kvcache.ERR_INVALID_ARGUMENT
        assert all(pool.head_tokens(1, layer, h) == 12 for layer in range(L) for h in range(HK))


def test_builtin_gates_are_the_repository_files():
    import os

    repo = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "..", "bench", "duo")
    for geometry, name, n in (((30, 9, 3, 576), "gates-smollm2.txt", 90), ((5, 8, 4, 64), "gates-stories260k.txt", 20)):
        gates = kvcache.builtin_head_gates(*geometry)  # shipped in the package (kvcache/duo)
        assert len(gates) == n and all(0.0 <= g <= 1.0 for g in gates)
        assert gates == kvcache.load_head_gates(os.path.join(repo, name))
    assert kvcache.builtin_head_gates(30, 9, 3, 577) is None


def test_gate_files(tmp_path):
    f = tmp_path / "gates.txt"
    f.write_text("# layer 0\n0.25 1  # two heads\n0 0.5\n")
    assert kvcache.load_head_gates(str(f)) == [0.25, 1.0, 0.0, 0.5]
    f.write_text("0.25 x\n")
    with pytest.raises(ValueError, match="gates.txt:1: 'x' is not a number"):
        kvcache.load_head_gates(str(f))
    f.write_text("0.25 1.5\n")
    with pytest.raises(ValueError, match="not in"):
        kvcache.load_head_gates(str(f))
    for text in ("0.2_5\n", "0x1p-1\n", "0.5\u00a00.5\n", "nan\n", "# only a comment\n"):
        f.write_text(text, encoding="utf-8")
        with pytest.raises(ValueError):
            kvcache.load_head_gates(str(f))
    for bad in (str(tmp_path / "missing.txt"), str(tmp_path), ""):  # a missing file, a folder, no name
        with pytest.raises(ValueError, match="head gates file"):
            kvcache.load_head_gates(bad)


def test_streaming_heads(tmp_path):
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    import kvcache.hf as kh

    assert kh.load_head_gates is kvcache.load_head_gates
    assert kh.streaming_heads([0.3, 0.1, 0.3, 0.9], 0.5) == [0.0, 0.0, 1.0, 1.0]  # ties: the lower index
    assert kh.streaming_heads([0.3, 0.1, 0.3, 0.9], 0.0) == [1.0] * 4
    assert kh.streaming_heads([0.3, 0.1], 0.5, only=0) == [0.0, 1.0]
    with pytest.raises(ValueError):
        kh.streaming_heads([0.3, 0.1], 0.5, only=2)
    for share, only in ((-0.5, -1), (1.5, -1), (float("nan"), -1), (0.5, -2), (0.5, True), (0.5, 1.0)):
        with pytest.raises(ValueError):
            kh.streaming_heads([0.1, 0.2], share, only)
    with pytest.raises(ValueError):
        kh.streaming_heads([0.5, float("nan")], 0.5)
    assert kh.streaming_heads([0.3000000001, 0.3], 0.5) == [0.0, 1.0]  # equal as float32: the lower index
