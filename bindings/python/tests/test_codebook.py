"""Codebooks (Pool.set_codebook, kvc_pool_set_codebook; kvcache.codebook_gaussian, kvc_codebook_gaussian)
through the Python binding: a pool reads back the codebook rule computed here (each group's code is the level
nearest to x / e for its signed extreme e, its scale keeps the group's norm), numbers of any dtype converted,
refusals as KvcError / TypeError / OverflowError, removal gives the uniform codes again."""
import re

import numpy as np
import pytest

import kvcache

L, HK, D, N = 2, 2, 16, 24


_SAME = object()


def pool(codec=None, v_codec=_SAME):
    """L layers, HK KV heads of D; keys and values with `codec` (int3 per token, f32 scales) unless v_codec
    is given (None: float values)."""
    cfg = kvcache.PoolConfig()
    cfg.num_layers, cfg.num_q_heads, cfg.num_kv_heads, cfg.head_dim = L, 2 * HK, HK, D
    cfg.block_size, cfg.num_blocks = 8, 64
    cfg.k_dtype = cfg.v_dtype = kvcache.DTYPE_F32
    codec = codec or int_codec()
    return kvcache.Pool(cfg, codec, codec if v_codec is _SAME else v_codec)


def int_codec(dtype=kvcache.DTYPE_INT3, asymmetric=False):
    c = kvcache.Codec()
    c.dtype = dtype
    c.granularity = kvcache.SCALE_PER_TOKEN
    c.scale_dtype = kvcache.DTYPE_F32
    c.asymmetric = 1 if asymmetric else 0
    return c


def levels_of(bits):
    """[L][2^bits] ascending in [-1, 1], denser near 0, different per layer (float64: converted)."""
    t = np.linspace(-1.0, 1.0, 1 << bits)
    return np.stack([t * np.abs(t) * (0.9 if layer else 1.0) for layer in range(L)])


def data(seed):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((L, N, HK, D)).astype(np.float32)
    x[..., ::7] *= 4.0
    return x


def fill(p, k, v, seq=1):
    p.seq_create(seq)
    p.reserve(seq, N)
    for layer in range(L):
        p.append(seq, layer, 0, k[layer], v[layer])


def expect(x, lv):
    """The codebook rule for groups of D values (the last axis): decoded values, float32 as the library."""
    g = x.reshape(-1, D).astype(np.float32)
    lv = np.asarray(lv, np.float32)
    e = g[np.arange(len(g)), np.abs(g).argmax(axis=1)]  # the first of equal magnitudes
    inv = np.where(e != 0, np.float32(1) / np.where(e != 0, e, np.float32(1)), np.float32(0)).astype(np.float32)
    y = (g * inv[:, None]).astype(np.float32)
    mid = ((lv[:-1] + lv[1:]) * np.float32(0.5)).astype(np.float32)
    code = (y[:, :, None] > mid[None, None, :]).sum(axis=2)
    xx = (g.astype(np.float64) ** 2).sum(axis=1)
    cc = (lv[code].astype(np.float64) ** 2).sum(axis=1)
    sc = np.where(cc > 0, np.sqrt(xx / np.where(cc > 0, cc, 1.0)), 0.0).astype(np.float32)
    sc = np.where(e < 0, -sc, sc)
    return (lv[code] * sc[:, None]).astype(np.float32).reshape(x.shape)


def test_gaussian_levels():
    for bits in (2, 3, 4):
        lv = kvcache.codebook_gaussian(bits, 64)
        assert isinstance(lv, list) and len(lv) == 1 << bits
        assert all(isinstance(x, float) and -1.0 <= x <= 1.0 for x in lv)
        assert all(b > a for a, b in zip(lv, lv[1:])), lv
        assert lv[0] < 0.0 < lv[-1]
        assert kvcache.codebook_gaussian(bits, 88) == lv  # nearer 64 than 128 by the logarithm
        assert kvcache.codebook_gaussian(bits, 96) != lv  # nearer 128
        assert kvcache.codebook_gaussian(bits, 1) == kvcache.codebook_gaussian(bits, 8)
        assert kvcache.codebook_gaussian(bits, 2**64 - 1) == kvcache.codebook_gaussian(bits, 1024)
        assert kvcache.codebook_gaussian(bits, np.uint64(64)) == lv  # numpy integers
    for bits, group in ((1, 64), (5, 64), (3, 0), (200, 64)):
        with pytest.raises(kvcache.KvcError) as e:
            kvcache.codebook_gaussian(bits, group)
        assert e.value.status == kvcache.ERR_INVALID_ARGUMENT
    with pytest.raises(OverflowError):
        kvcache.codebook_gaussian(-1, 64)


def test_round_trip_keeps_group_norms():
    """Keys with levels of our own (a numpy float64 array), values with the Gaussian levels (a list of lists):
    gather gives the rule's values, each group's L2 norm kept (f32 scales); a pool without codebooks differs."""
    k, v = data(1), data(2)
    lk = levels_of(3)
    lv = [kvcache.codebook_gaussian(3, D) for _ in range(L)]
    lv[1] = [x * 0.95 for x in lv[1]]  # a different table for layer 1
    p, plain, by_bytes = pool(), pool(), pool()
    with p, plain, by_bytes:
        p.set_codebook(0, lk)
        p.set_codebook(1, lv)
        by_bytes.set_codebook(0, np.asarray(lk, np.float32).tobytes())  # bytes of native float32
        by_bytes.set_codebook(1, np.asarray(lv, np.float32).reshape(-1))
        for q in (p, plain, by_bytes):
            fill(q, k, v)
        for layer in range(L):
            gk, gv = p.gather(1, layer)
            gk, gv = gk.reshape(k[layer].shape), gv.reshape(v[layer].shape)
            np.testing.assert_allclose(gk, expect(k[layer], lk[layer]), rtol=1e-5, atol=1e-6)
            np.testing.assert_allclose(gv, expect(v[layer], lv[layer]), rtol=1e-5, atol=1e-6)
            for got, want in ((gk, k[layer]), (gv, v[layer])):
                ng = np.linalg.norm(got.reshape(-1, D).astype(np.float64), axis=1)
                nw = np.linalg.norm(want.reshape(-1, D).astype(np.float64), axis=1)
                np.testing.assert_allclose(ng, nw, rtol=1e-5)
            bk, bv = by_bytes.gather(1, layer)
            np.testing.assert_array_equal(bk.reshape(gk.shape), gk)
            np.testing.assert_array_equal(bv.reshape(gv.shape), gv)
            uk, _ = plain.gather(1, layer)
            assert not np.array_equal(uk.reshape(gk.shape), gk)


def test_gaussian_levels_beat_uniform_codes():
    """On Gaussian values, the built-in levels lose less than the uniform int3 codes (as the C test)."""
    rng = np.random.default_rng(5)
    v = rng.standard_normal((L, N, HK, D)).astype(np.float32)
    p, u = pool(), pool()
    with p, u:
        p.set_codebook(1, [kvcache.codebook_gaussian(3, D)] * L)
        fill(p, v, v)
        fill(u, v, v)
        ec = eu = 0.0
        for layer in range(L):
            ec += float(((p.gather(1, layer, k=False)[1].reshape(v[layer].shape) - v[layer]) ** 2).sum())
            eu += float(((u.gather(1, layer, k=False)[1].reshape(v[layer].shape) - v[layer]) ** 2).sum())
        assert ec < 0.9 * eu, (ec, eu)


def test_refusals():
    lk = levels_of(3)
    with pool() as p:
        for bad in (np.linspace(-1, 1, L * 8 - 1), levels_of(2), levels_of(4)):
            with pytest.raises(kvcache.KvcError) as e:
                p.set_codebook(0, bad)  # a count other than num_layers x 2^3
            assert e.value.status == kvcache.ERR_INVALID_ARGUMENT
        with pytest.raises(kvcache.KvcError, match="part 2") as e:
            p.set_codebook(2, lk)
        assert e.value.status == kvcache.ERR_INVALID_ARGUMENT
        with pytest.raises(OverflowError):
            p.set_codebook(-1, lk)
        bad = lk.copy()
        bad[1, 5] = bad[1, 4]  # not strictly ascending in layer 1
        with pytest.raises(kvcache.KvcError, match="layer 1, level 5"):
            p.set_codebook(0, bad)
        bad = lk.copy()
        bad[0, 7] = 1.5
        with pytest.raises(kvcache.KvcError, match="not in"):
            p.set_codebook(1, bad)
        with pytest.raises(kvcache.KvcError):
            p.set_codebook(0, b"\0\0\0")  # not whole float32 values
        with pytest.raises(TypeError):
            p.set_codebook(0, ["a"] * (L * 8))
        p.set_codebook(0, lk)
        p.seq_create(1)
        with pytest.raises(kvcache.KvcError, match="sequences") as e:
            p.set_codebook(0, None)
        assert e.value.status == kvcache.ERR_INVALID_ARGUMENT
        with pytest.raises(kvcache.KvcError, match="sequences"):
            p.set_codebook(1, lk)
    # Codecs that do not take a codebook: asymmetric int3, int8; float values (no v_codec).
    for codec, v_codec, part, levels in ((int_codec(asymmetric=True), _SAME, 0, lk),
                                         (int_codec(kvcache.DTYPE_INT8), _SAME, 1, np.tile(np.linspace(-1, 1, 256), L)),
                                         (int_codec(), None, 1, lk)):
        with pool(codec, v_codec) as q:
            with pytest.raises(kvcache.KvcError) as e:
                q.set_codebook(part, levels)
            assert e.value.status == kvcache.ERR_INVALID_ARGUMENT
    with pool() as closed:
        closed.close()
        with pytest.raises(kvcache.KvcError) as e:
            closed.set_codebook(0, lk)
        assert e.value.status == kvcache.ERR_NULL_POINTER


def test_removal():
    """None or an empty sequence removes a codebook: the uniform codes again, as a pool that never had one."""
    k, v = data(3), data(4)
    lk = levels_of(3)
    with pool() as never:
        fill(never, k, v)
        want = [never.gather(1, layer) for layer in range(L)]
        for removal in (None, [], np.zeros(0, np.float32), b""):
            with pool() as r:
                r.set_codebook(0, lk)
                r.set_codebook(1, lk)
                r.set_codebook(0, removal)
                r.set_codebook(1, removal)
                fill(r, k, v)
                for layer in range(L):
                    gk, gv = r.gather(1, layer)
                    np.testing.assert_array_equal(gk, want[layer][0])
                    np.testing.assert_array_equal(gv, want[layer][1])


def codebook_file(tmp_path, text):
    p = tmp_path / "codebook.txt"
    p.write_text(text)
    return p


FITTED = """# a codebook file as `kvcache calibrate --codebook` writes it
kvcache-codebook 1
part v bits 2 group 16 layers 2
levels 0 -0.8 -0.2 0.25 0.9
levels 1 -0.7 -0.1 0.2 0.95
"""


def test_load_codebooks(tmp_path):
    """load_codebooks reads the file's parts; their levels are what Pool.set_codebook takes and the pool then
    decodes with (the codebook rule above)."""
    parts = kvcache.load_codebooks(codebook_file(tmp_path, FITTED))
    assert len(parts) == 1
    p = parts[0]
    assert (p["part"], p["bits"], p["group"], p["layers"]) == (1, 2, 16, 2)
    assert p["levels"].dtype == np.float32 and p["levels"].shape == (2, 4)
    np.testing.assert_array_equal(p["levels"][1], np.float32([-0.7, -0.1, 0.2, 0.95]))
    k, v = data(5), data(6)
    with pool(int_codec(kvcache.DTYPE_INT2)) as pl:
        pl.set_codebook(1, p["levels"])
        fill(pl, k, v)
        for layer in range(L):
            got_v = pl.gather(1, layer)[1].reshape(v[layer].shape)
            np.testing.assert_allclose(got_v, expect(v[layer], p["levels"][layer]), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("text,why", [
    ("", "empty"),
    ("kvcache-codebook 2\n", "header"),
    ("kvcache-codebook 1\npart x bits 2 group 8 layers 1\n", "expected 'part"),
    ("kvcache-codebook 1\npart k bits 5 group 8 layers 1\n", "bits must be 2, 3 or 4"),
    ("kvcache-codebook 1\npart k bits 2 group -8 layers 1\n", "whole numbers"),
    ("kvcache-codebook 1\npart k bits 2 group 8 layers \u00b2\n", "whole numbers"),
    ("kvcache-codebook 1\npart k bits 2 group 8 layers 1\nlevels 0 -1 0.1 0.10000000001 1\n", "as float32"),
    ("kvcache-codebook 1\npart k bits 2 group 8 layers 1\nlevels 0 -1 0.5 0.2 1\n", "ascend strictly"),
    ("kvcache-codebook 1\npart k bits 2 group 8 layers 1\nlevels 0 -1 0 0.5 1.5\n", "in [-1, 1]"),
    ("kvcache-codebook 1\npart k bits 2 group 8 layers 2\nlevels 0 -1 0 0.5 1\n", "fewer levels lines"),
    ("kvcache-codebook 1\npart k bits 2 group 8 layers 1\nlevels 1 -1 0 0.5 1\n", "expected 'levels 0'"),
    ("kvcache-codebook 1\npart k bits 2 group 8 layers 1\nlevels 0 -1 0 x 1\n", "not a number"),
    ("kvcache-codebook 1\nlevels 0 -1 0 0.5 1\n", "before any 'part'"),
])
def test_load_codebooks_refuses(tmp_path, text, why):
    with pytest.raises(ValueError, match=re.escape(why)):
        kvcache.load_codebooks(codebook_file(tmp_path, text))


def test_codebook_fit_strategy(tmp_path):
    """A ``codebook=fit`` part takes its levels from the codebook file's entry of the same part, bits, group
    and layers (kvcache.hf's PagedCache(codebooks=)); without a file, with no matching entry, or with a file
    for a strategy without such parts: ValueError. The ``codebook`` part beside it keeps the Gaussian levels."""
    from kvcache._hf_setup import _codebooks_of
    st = kvcache.parse_strategy("k-int3:per-token:hadamard:codebook+v-int2:group=16:hadamard:codebook=fit")
    assert (st.k_codebook, st.k_codebook_fit, st.v_codebook, st.v_codebook_fit) == (True, False, True, True)
    f = codebook_file(tmp_path, FITTED)
    got = dict(_codebooks_of(st, 2, 16, f))
    assert got[0] == list(kvcache.codebook_gaussian(3, 16)) * 2
    np.testing.assert_array_equal(np.float32(got[1]), kvcache.load_codebooks(f)[0]["levels"].reshape(-1))
    with pytest.raises(ValueError, match="codebook=fit parts: codebooks="):
        _codebooks_of(st, 2, 16)
    with pytest.raises(ValueError, match="no value part of 2 bits, group 16 and 3 layers"):
        _codebooks_of(st, 3, 16, f)
    entry = kvcache.load_codebooks(f)[0]
    with pytest.raises(ValueError, match="more than one value part"):
        _codebooks_of(st, 2, 16, [entry, entry])
    for bad in (entry["levels"][:, ::-1], entry["levels"][:1], np.full((2, 4), np.nan), None):
        with pytest.raises(ValueError, match="levels"):
            _codebooks_of(st, 2, 16, [dict(entry, levels=bad)])
    with pytest.raises(ValueError, match="codebook file or load_codebooks"):
        _codebooks_of(st, 2, 16, 5)
    assert len(_codebooks_of(st, 2, 16, iter([entry]))) == 2  # any iterable, read once
    keys = kvcache.parse_strategy("k-int3:group=8:hadamard:codebook=fit+v-f16")
    with pytest.raises(ValueError, match="groups of a whole head"):
        _codebooks_of(keys, 2, 16, f)
    plain = kvcache.parse_strategy("k-f16+v-int2:group=16:hadamard:codebook")
    with pytest.raises(ValueError, match="codebooks are for codebook=fit strategies"):
        _codebooks_of(plain, 2, 16, f)
