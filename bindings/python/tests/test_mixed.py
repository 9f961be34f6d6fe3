"""Per-layer codecs (kvc_pool_config.layer_k_codecs / layer_v_codecs) through the Python binding:
parse_strategy's BASE@LAYERS=CODECS lists, kvcache.pool_with_layer_codecs, each layer reading back as a
pool of its codecs alone, refusals as KvcError."""
import numpy as np
import pytest

import kvcache

L, HK, D, N = 3, 2, 32, 21


def config(layers=L):
    cfg = kvcache.PoolConfig()
    cfg.num_layers, cfg.num_q_heads, cfg.num_kv_heads, cfg.head_dim = layers, 2 * HK, HK, D
    cfg.block_size, cfg.num_blocks = 8, 64
    cfg.k_dtype = cfg.v_dtype = kvcache.DTYPE_F32
    return cfg


def data(seed):
    rng = np.random.default_rng(seed)
    return rng.standard_normal((L, N, HK, D)).astype(np.float32)


def fill(p, k, v, layers):
    p.seq_create(1)
    p.reserve(1, N)
    for i, layer in enumerate(layers):
        p.append(1, i, 0, k[layer], v[layer])


def test_parse_lists_the_layers():
    st = kvcache.parse_strategy("k-int4:per-token+v-int4:per-token@0.2=k-int8:per-token+v-int2:group=32")
    assert st.spec == "k-int4:per-token+v-int4:per-token@0.2=k-int8:per-token+v-int2:group=32"
    assert list(st.layer_ids) == [0, 2]
    assert [st.layer_k_codec(i).dtype for i in range(2)] == [kvcache.DTYPE_INT8] * 2
    assert [st.layer_v_codec(i).dtype for i in range(2)] == [kvcache.DTYPE_INT2] * 2
    assert st.layer_v_codec(0).granularity == kvcache.SCALE_PER_GROUP and st.layer_v_codec(0).group_size == 32
    with pytest.raises(kvcache.KvcError, match="lists 2 layers"):
        st.layer_k_codec(2)
    assert len(kvcache.parse_strategy("int8").layer_ids) == 0
    # read from a temporary strategy: copies that outlive it (a reference into it read freed memory)
    assert list(kvcache.parse_strategy("int8@0-3=int4:per-token").layer_ids) == [0, 1, 2, 3]
    c = kvcache.parse_strategy("int4:per-token").k_codec
    kvcache.parse_strategy("f16")  # reuses the freed strategy's memory, were c a reference into it
    assert c.dtype == kvcache.DTYPE_INT4
    with pytest.raises(AttributeError):
        st.layer_ids = [0, 1, 2]  # read-only: it stays as long as the strategy's codec tables
    with pytest.raises(kvcache.KvcError, match="listed twice"):
        kvcache.parse_strategy("int8@0-1.1=int4:per-token")


def test_layers_read_back_as_their_own_pools():
    st = kvcache.parse_strategy("k-int4:per-token+v-int4:per-token@1=k-int8:per-token+v-int2:group=32")
    k, v = data(1), data(2)
    mixed = kvcache.pool_with_layer_codecs(config(), st)
    fill(mixed, k, v, range(L))
    errors = []
    for layer in range(L):
        kc, vc = (st.layer_k_codec(0), st.layer_v_codec(0)) if layer == 1 else (st.k_codec, st.v_codec)
        one = kvcache.Pool(config(1), kc, vc)
        fill(one, k, v, [layer])
        mk, mv = mixed.gather(1, layer)
        ok, ov = one.gather(1, 0)
        np.testing.assert_array_equal(np.asarray(mk), np.asarray(ok))
        np.testing.assert_array_equal(np.asarray(mv), np.asarray(ov))
        errors.append(float(np.abs(np.asarray(mv) - v[layer]).mean()))
    assert errors[1] > 2 * errors[0]  # int2 values in layer 1 only
    # each layer pays its own blocks: int8 K + int2 V in layer 1
    sizes = []
    for kc, vc in ((st.k_codec, st.v_codec), (st.layer_k_codec(0), st.layer_v_codec(0))):
        sizes.append(kvcache.Pool(config(1), kc, vc).stats().bytes_per_token)
    assert mixed.stats().bytes_per_token == 2 * sizes[0] + sizes[1]


def test_refusals():
    st = kvcache.parse_strategy("int8@1=f16")  # a plain layer beside int8 ones
    with pytest.raises(kvcache.KvcError, match="quantizes a part or none"):
        kvcache.pool_with_layer_codecs(config(), st)
    st = kvcache.parse_strategy("int8@5=int4:per-token")
    with pytest.raises(kvcache.KvcError, match="layer 5: the pool has 3 layers"):
        kvcache.pool_with_layer_codecs(config(), st)
    # without parts: an ordinary pool of the strategy's codecs
    p = kvcache.pool_with_layer_codecs(config(), kvcache.parse_strategy("int8"))
    assert p.stats().bytes_per_token == kvcache.Pool(config(), kvcache.parse_strategy("int8").k_codec,
                                                     kvcache.parse_strategy("int8").v_codec).stats().bytes_per_token


def codec(dtype, gran=kvcache.SCALE_PER_TOKEN, group=0):
    c = kvcache.Codec()
    c.dtype, c.granularity = dtype, gran
    if group:
        c.group_size = group
    return c


def test_with_layer_codecs_tables():
    # Pool.with_layer_codecs: codec tables without a strategy string (the same call Go and Java make)
    k, v = data(3), data(4)
    i8, i4 = codec(kvcache.DTYPE_INT8), codec(kvcache.DTYPE_INT4)
    mixed = kvcache.Pool.with_layer_codecs(config(), i8, i8, [i8, i4, i8], [])
    assert mixed.thisown  # the proxy owns the pool: collected, it is destroyed
    fill(mixed, k, v, range(L))
    for layer in range(L):
        one = kvcache.Pool(config(1), i4 if layer == 1 else i8, i8)
        fill(one, k, v, [layer])
        mk, mv = mixed.gather(1, layer)
        ok, ov = one.gather(1, 0)
        np.testing.assert_array_equal(np.asarray(mk), np.asarray(ok))
        np.testing.assert_array_equal(np.asarray(mv), np.asarray(ov))
    # plain pools: f32 and f16 layers (a float dtype with SCALE_NONE: plain storage)
    f16, f32 = codec(kvcache.DTYPE_F16, kvcache.SCALE_NONE), codec(kvcache.DTYPE_F32, kvcache.SCALE_NONE)
    plain = kvcache.Pool.with_layer_codecs(config(), None, None, [f32, f16, f32], [f16, f16, f16])
    fill(plain, k, v, range(L))
    mk, mv = plain.gather(1, 0)
    np.testing.assert_array_equal(np.asarray(mk), k[0])
    np.testing.assert_array_equal(np.asarray(mv), v[0].astype(np.float16).astype(np.float32))
    mk, _ = plain.gather(1, 1)
    np.testing.assert_array_equal(np.asarray(mk), k[1].astype(np.float16).astype(np.float32))
    row = HK * D
    assert plain.stats().bytes_per_token == L * row * 2 + (2 * 4 + 2) * row
    mixed.close()
    plain.close()
    with pytest.raises(kvcache.KvcError, match="2 codecs for 3 layers"):
        kvcache.Pool.with_layer_codecs(config(), i8, i8, [i8, i4], [])
    with pytest.raises(kvcache.KvcError, match="quantizes a part or none"):
        kvcache.Pool.with_layer_codecs(config(), None, None, [f32, i8, f32], [])
    with pytest.raises(kvcache.KvcError) as e:
        kvcache.Pool.with_layer_codecs(None, i8, i8, [], [])
    assert e.value.status == kvcache.ERR_NULL_POINTER
    huge = config()
    huge.num_layers = 2**32 - 1  # refused before any table is built (no 32 GiB allocation)
    with pytest.raises(kvcache.KvcError, match="must be 1..4096") as e:
        kvcache.pool_with_layer_codecs(huge, kvcache.parse_strategy("int8@0=int4:per-token"))
    assert e.value.status == kvcache.ERR_INVALID_ARGUMENT


def test_codebook_with_int8_layers():
    # a codebook row with int8 keys in layer 1: that layer takes no levels (its uniform codes), and the pool
    # PagedCache would build accepts the levels _codebooks_of gives
    from kvcache._hf_setup import _codebooks_of
    st = kvcache.parse_strategy("k-int4:per-token:codebook+v-int4:per-token:codebook"
                                "@1=k-int8:per-token+v-int4:per-token:codebook")
    books = dict(_codebooks_of(st, L, D))
    g4 = list(kvcache.codebook_gaussian(4, D))
    assert list(books[0]) == g4 + g4  # layers 0 and 2: 16 levels each, layer 1 none
    assert list(books[1]) == g4 * L
    p = kvcache.pool_with_layer_codecs(config(), st)
    p.set_codebook(0, books[0])
    p.set_codebook(1, books[1])
    k, v = data(5), data(6)
    fill(p, k, v, range(L))
    one = kvcache.Pool(config(1), st.layer_k_codec(0), st.layer_v_codec(0))
    one.set_codebook(1, g4)
    fill(one, k, v, [1])
    mk, mv = p.gather(1, 1)
    ok, ov = one.gather(1, 0)
    np.testing.assert_array_equal(np.asarray(mk), np.asarray(ok))  # int8 keys, no levels
    np.testing.assert_array_equal(np.asarray(mv), np.asarray(ov))
    with pytest.raises(kvcache.KvcError, match="int8 and fp8 layers: 0"):
        p2 = kvcache.pool_with_layer_codecs(config(), st)
        p2.set_codebook(0, g4 * L)
