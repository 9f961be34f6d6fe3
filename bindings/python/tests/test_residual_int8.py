"""residual_dtype = DTYPE_INT8 through the Python layer: parse_strategy's
residual-int8 flag, a pool's window rows equal to Codec.quantize /
dequantize of the int8 per-token f16-scale codec, NaN refused (docs/codecs.md,
"Int8 residual rows")."""
import numpy as np
import pytest

import kvcache

L, HK, D, N, R = 2, 2, 32, 13, 5


def int8_rows(x):
    """[t, HK, D] as int8 residual rows store them (a scale per token and KV head)."""
    c = kvcache.Codec()
    c.dtype, c.granularity, c.scale_dtype = kvcache.DTYPE_INT8, kvcache.SCALE_PER_TOKEN, kvcache.DTYPE_F16
    flat = x.reshape(-1, D)
    codes, scales, zeros = c.quantize(flat)
    return c.dequantize(codes, scales, zeros, flat.shape[0], D).reshape(x.shape)


def test_parse_flag():
    st = kvcache.parse_strategy("k-int2:per-token:residual=8:block=8:residual-int8+v-int2:group=64")
    assert st.residual_dtype == kvcache.DTYPE_INT8 and st.residual_window == 8 and st.block_size == 8
    assert kvcache.parse_strategy("int4:per-token:residual=4").residual_dtype == kvcache.DTYPE_F16
    with pytest.raises(kvcache.KvcError, match="residual-int8 stores the residual's rows as int8"):
        kvcache.parse_strategy("int4:per-token:residual-int8")


def test_window_rows_are_int8_rows():
    cfg = kvcache.PoolConfig()
    cfg.num_layers, cfg.num_q_heads, cfg.num_kv_heads, cfg.head_dim = L, 2 * HK, HK, D
    cfg.block_size, cfg.num_blocks = 4, 64
    cfg.residual_window, cfg.residual_dtype = R, kvcache.DTYPE_INT8
    codec = kvcache.Codec()
    codec.dtype, codec.granularity = kvcache.DTYPE_INT4, kvcache.SCALE_PER_TOKEN
    rng = np.random.default_rng(3)
    k = rng.standard_normal((N, HK, D)).astype(np.float32)
    v = rng.standard_normal((N, HK, D)).astype(np.float32)
    with kvcache.Pool(cfg, codec, codec) as pool:
        pool.seq_create(1)
        for t in range(N):
            pool.reserve(1, 1)
            for layer in range(L):
                pool.append(1, layer, t, k[t:t + 1], v[t:t + 1])
        for layer in range(L):
            kg, vg = pool.gather(1, layer)
            assert np.array_equal(kg[N - R:], int8_rows(k[N - R:]))
            assert np.array_equal(vg[N - R:], int8_rows(v[N - R:]))
            assert not np.array_equal(kg[N - R:], k[N - R:])
        bad = k[:1].copy()
        bad[0, 0, 0] = np.nan
        pool.reserve(1, 1)
        with pytest.raises(kvcache.KvcError) as e:
            pool.append(1, 0, N, bad, v[:1])
        assert e.value.status == kvcache.ERR_NON_FINITE
