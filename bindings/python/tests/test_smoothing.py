"""Per-channel key smoothing (Pool.set_key_smoothing, kvc_pool_set_key_smoothing) through the Python
binding: keys read back as the standalone quantizer's codes of (k - offset) / scale, decoded and
un-smoothed; numbers of any dtype converted; refusals as KvcError / TypeError / ValueError."""
import numpy as np
import pytest

import kvcache

L, HK, D = 2, 2, 8


def pool_and_codec():
    cfg, codec = config_and_codec()
    return kvcache.Pool(cfg, codec, None), codec


def config_and_codec():
    cfg = kvcache.PoolConfig()
    cfg.num_layers, cfg.num_q_heads, cfg.num_kv_heads, cfg.head_dim = L, 2 * HK, HK, D
    cfg.block_size, cfg.num_blocks = 8, 64
    cfg.k_dtype = cfg.v_dtype = kvcache.DTYPE_F32
    codec = kvcache.Codec()
    codec.dtype = kvcache.DTYPE_INT4
    codec.granularity = kvcache.SCALE_PER_TOKEN
    return cfg, codec


def keys(n=20, seed=1):
    rng = np.random.default_rng(seed)
    mag = np.where(np.arange(HK * D) % 5 == 0, 30.0, 0.2)
    mean = np.where(np.arange(HK * D) % 3 == 0, 12.0, -1.0)
    return (mean + mag * rng.uniform(-1, 1, (n, HK * D))).astype(np.float32), mag, mean


def test_smoothed_keys_match_the_quantizer():
    k, mag, mean = keys()
    scale = np.tile(mag, (L, 1))  # float64: converted
    offset = np.tile(mean, (L, 1)).tolist()  # a list of lists: converted
    pool, codec = pool_and_codec()
    with pool:
        pool.set_key_smoothing(scale, offset)
        pool.seq_create(1)
        pool.reserve(1, len(k))
        for layer in range(L):
            pool.append(1, layer, 0, k.reshape(-1, HK, D), k.reshape(-1, HK, D))
        got, _ = pool.gather(1, 1, v=False)
        y = ((k - mean.astype(np.float32)) / mag.astype(np.float32)).astype(np.float32)
        codes, scales, zeros = codec.quantize(y.reshape(-1, D))
        dec = codec.dequantize(codes, scales, zeros, y.shape[0] * HK, D).reshape(k.shape)
        want = dec * mag.astype(np.float32) + mean.astype(np.float32)
        np.testing.assert_allclose(got.reshape(k.shape), want, rtol=1e-5, atol=1e-5)
        small = np.arange(HK * D) % 5 != 0
        assert np.abs(got.reshape(k.shape) - k)[:, small].max() < 0.05


def test_refusals():
    k, mag, mean = keys()
    pool, _ = pool_and_codec()
    with pool:
        with pytest.raises(kvcache.KvcError) as e:
            pool.set_key_smoothing(np.ones(L * HK * D - 1))
        assert e.value.status == kvcache.ERR_INVALID_ARGUMENT
        bad = np.ones(L * HK * D)
        bad[17] = 0.0
        with pytest.raises(kvcache.KvcError, match="layer 1, channel 1"):
            pool.set_key_smoothing(bad)
        with pytest.raises(kvcache.KvcError):
            pool.set_key_smoothing(np.ones(L * HK * D), np.zeros(3))
        with pytest.raises(TypeError):
            pool.set_key_smoothing(["a"] * (L * HK * D))
        with pytest.raises(ValueError):
            pool.set_key_smoothing(None, np.zeros(L * HK * D))
        pool.set_key_smoothing(np.ones(L * HK * D))
        pool.seq_create(1)
        with pytest.raises(kvcache.KvcError, match="sequences"):
            pool.set_key_smoothing(None)


def test_key_stats_files(tmp_path):
    """load_key_stats reads what `kvcache calibrate` writes (the shipped SmolLM2 file), key_smoothing makes
    eval's arrays and reorders RoPE pairs; malformed files raise ValueError naming the line."""
    st = kvcache.builtin_key_stats(30, 9, 3, 576)
    assert (st["layers"], st["kv_heads"], st["head_dim"], st["rope"]) == (30, 3, 64, "interleaved")
    assert st["rms"].shape == (30, 192) and (st["rms"] > 0).all()
    assert kvcache.builtin_key_stats(30, 9, 3, 577) is None
    scale, offset = kvcache.key_smoothing(st, 1.0)
    top = st["rms"].max(axis=1, keepdims=True)
    np.testing.assert_allclose(scale.reshape(30, 192), np.maximum(st["rms"], 1e-3 * top), rtol=1e-6)
    np.testing.assert_array_equal(offset.reshape(30, 192), st["mean"])
    half, _ = kvcache.key_smoothing(st, 0.5)
    np.testing.assert_allclose(half, np.sqrt(scale), rtol=1e-5)
    neox, neox_off = kvcache.key_smoothing(st, 1.0, rope="neox")
    a, b = scale.reshape(30, 3, 64), neox.reshape(30, 3, 64)
    np.testing.assert_array_equal(b[:, :, :32], a[:, :, 0::2])  # pair i: (2i, 2i+1) -> (i, i + 32)
    np.testing.assert_array_equal(b[:, :, 32:], a[:, :, 1::2])
    # qsmooth=B: the scale divided by the queries' rms ^ B (the shipped file has them)
    assert st["qrms"].shape == (30, 192) and (st["qrms"] > 0).all()
    qs, qoff = kvcache.key_smoothing(st, 0.5, beta=0.5)
    qtop = st["qrms"].max(axis=1, keepdims=True)
    want = np.sqrt(np.maximum(st["rms"].astype(np.float64), 1e-3 * top)) / np.sqrt(
        np.maximum(st["qrms"].astype(np.float64), 1e-3 * qtop))
    np.testing.assert_allclose(qs.reshape(30, 192), want, rtol=1e-6)
    np.testing.assert_array_equal(qoff, offset)
    qn, _ = kvcache.key_smoothing(st, 0.5, rope="neox", beta=0.5)
    np.testing.assert_array_equal(qn.reshape(30, 3, 64)[:, :, :32], qs.reshape(30, 3, 64)[:, :, 0::2])
    with pytest.raises(ValueError, match="beta"):
        kvcache.key_smoothing(st, 0.5, beta=1.5)
    head = "kvcache-key-stats 1\nlayers 1 kv_heads 1 head_dim 2\n"
    cases = {
        "nothing": "",
        "layers L kv_heads H head_dim D": "kvcache-key-stats 1\nmean 0 1 2\n",
        "no rms line": head + "mean 0 1 2\nabsmax 0 1 1\n",
        "given twice": head + "mean 0 1 2\nmean 0 1 2\n",
        "finite": head + "mean 0 1 2\nrms 0 -1 1\nabsmax 0 1 1\n",
        "expected a layer": head + "mean 0 1\n",
        "unknown line": head + "median 0 1 2\n",
        "qrms: values must be finite": head + "mean 0 1 2\nrms 0 1 1\nabsmax 0 1 1\nqrms 0 -1 1\n",
    }
    for want, text in cases.items():
        f = tmp_path / "s.txt"
        f.write_text(text)
        with pytest.raises(ValueError, match=want if want != "nothing" else "header"):
            kvcache.load_key_stats(str(f))
    with pytest.raises(ValueError):
        kvcache.key_smoothing(st, 2.0)
    # a file without qrms loads with qrms None, and beta > 0 then raises
    f = tmp_path / "s.txt"
    f.write_text(head + "mean 0 1 2\nrms 0 1 1\nabsmax 0 1 1\n")
    plain = kvcache.load_key_stats(str(f))
    assert plain["qrms"] is None
    assert kvcache.key_smoothing(plain, 1.0)[0].tolist() == [1.0, 1.0]
    with pytest.raises(ValueError, match="qrms"):
        kvcache.key_smoothing(plain, 1.0, beta=0.5)
    f.write_text(head + "mean 0 1 2\nrms 0 1 4\nabsmax 0 1 1\nqrms 0 1 16\n")
    np.testing.assert_allclose(kvcache.key_smoothing(kvcache.load_key_stats(str(f)), 1.0, beta=0.5)[0],
                               [1.0, 1.0])


def test_codec_outliers():
    """Codec.outliers (dense-and-sparse codes): a spike per head no longer stretches the other values'
    step in a pool; the standalone quantizer refuses such a codec (pools only)."""
    rng = np.random.default_rng(3)
    k = rng.uniform(-1, 1, (16, HK, D)).astype(np.float32)
    k[:, :, 3] = 40.0
    errs = []
    for n_out in (0, 1):
        cfg, codec = config_and_codec()
        codec.outliers = n_out
        with kvcache.Pool(cfg, codec, None) as p:
            p.seq_create(1)
            p.reserve(1, len(k))
            for layer in range(L):
                p.append(1, layer, 0, k, k)
            got, _ = p.gather(1, 0, v=False)
            rest = np.abs(got.reshape(k.shape) - k)
            rest[:, :, 3] = 0
            errs.append(rest.max())
            assert abs(got.reshape(k.shape)[0, 0, 3] - 40.0) <= 40.0 / 127 / 2 + 1e-4
    assert errs[1] * 5 < errs[0], errs  # steps of 1 / 7 instead of 40 / 7
    codec = kvcache.Codec()
    codec.dtype, codec.granularity, codec.outliers = kvcache.DTYPE_INT4, kvcache.SCALE_PER_TOKEN, 1
    with pytest.raises(kvcache.KvcError) as e:
        codec.quantize(np.zeros((2, 8), np.float32))
    assert e.value.status == kvcache.ERR_UNSUPPORTED
