"""Named extra keys through the Python binding (docs/prefix-cache.md): a pool
declares its extra-key names and the prefix calls take the values by name
(keyword arguments or a dict); the binding orders them by the pool's
declaration. Keys match the spec's test vectors and do not depend on the
declaration order; salt=x and adapter=x never share a block; unknown names
are errors; a disk tier serves a block to a pool declaring the names in
another order."""

import numpy as np
import pytest

import kvcache

LAYERS, KV_HEADS, HEAD_DIM, BS = 2, 2, 4, 4
SEED = bytes(range(3, 3 + 32))


def named_pool(names, seed=SEED, blocks=64):
    cfg = kvcache.PoolConfig()
    cfg.num_layers, cfg.num_q_heads, cfg.num_kv_heads, cfg.head_dim = LAYERS, 2, KV_HEADS, HEAD_DIM
    cfg.block_size, cfg.num_blocks = BS, blocks
    cfg.k_dtype = cfg.v_dtype = kvcache.DTYPE_F32
    pool = kvcache.Pool(cfg)
    pc = kvcache.PrefixConfig()
    pc.set_seed(seed)
    pool.enable_prefix_cache(pc, "named-model", extra_key_names=names)
    return pool


def write(pool, seq, prompt, **values):
    n = len(prompt)
    pool.seq_create(seq)
    pool.reserve(seq, n)
    for layer in range(LAYERS):
        k = np.arange(n * KV_HEADS * HEAD_DIM, dtype=np.float32).reshape(n, KV_HEADS, HEAD_DIM) + layer
        pool.append(seq, layer, 0, k, -k)
    return pool.prefix_insert(seq, prompt, **values)


def test_named_keys_spec_vectors():
    # The test-vector pool of docs/prefix-cache.md, names "salt", "adapter".
    cfg = kvcache.PoolConfig()
    cfg.num_layers, cfg.num_q_heads, cfg.num_kv_heads, cfg.head_dim = 1, 2, 2, 4
    cfg.block_size, cfg.num_blocks = 4, 16
    cfg.k_dtype = cfg.v_dtype = kvcache.DTYPE_F32
    with kvcache.Pool(cfg) as pool:
        pc = kvcache.PrefixConfig()
        pc.set_seed(bytes(32))
        pool.enable_prefix_cache(pc, "stories260K", "tok512", ["salt", "adapter"])
        assert pool.extra_key_names() == ("salt", "adapter")
        toks = list(range(10, 18))
        keys = pool.prefix_keys(toks, salt="abc", adapter="lora-7")
        assert [k.hex() for k in keys] == [
            "4b39a455995209a14f0fc08fe5a3dded304a1a2290be2ab53f3c347aff3f6843",
            "7ec33c152d328c65c85f4917878cc9b696ea528441ffde46065b21b4a04e19cb"]
        assert pool.prefix_keys(toks, extras={"adapter": b"abc"})[0].hex() == \
            "a56f4e5afbc3ed88b60f0b1b9a5693035b86800e3f7268c7929332a5cc32effa"
        assert pool.prefix_keys(toks, "abc")[0].hex() == \
            "e64bb76e36ae1605cdf852ca4c55a412c413acd709fc73ad8876d620998fada4"  # salt positionally is the name "salt"
        # No value at all: the positional keys without extra keys.
        assert pool.prefix_keys(toks)[0].hex() == "fb6ca8a8e2808f267ed596bf3760298379fb27898f5afb246bdda2ac6aa2fa0a"


def test_named_keys_order_and_names():
    toks = list(range(40, 52))
    with named_pool(["salt", "adapter"]) as a, named_pool(["adapter", "media", "salt"]) as b, \
            named_pool([]) as legacy:
        ka = a.prefix_keys(toks, salt="tenant-1", adapter="lora-7")
        assert len(ka) == 3 and all(len(k) == 32 for k in ka)
        assert b.prefix_keys(toks, extras={"salt": "tenant-1", "adapter": b"lora-7"}) == ka
        assert b.prefix_keys(toks, salt="tenant-1", adapter="lora-7", media="") == ka
        assert b.prefix_keys(toks, salt="tenant-1", adapter="lora-7", media="img") != ka
        assert a.prefix_keys(toks, salt="x") != a.prefix_keys(toks, adapter="x")
        assert a.prefix_keys(toks, salt="x") == b.prefix_keys(toks, salt="x")
        assert a.prefix_keys(toks) == legacy.prefix_keys(toks)
        assert legacy.prefix_keys(toks, "x") != a.prefix_keys(toks, salt="x")  # positional is another form


def test_named_keys_lookup_attach_insert():
    prompt = np.arange(100, 113, dtype=np.int32)  # 3 whole blocks usable
    with named_pool(["salt", "adapter"]) as pool:
        assert write(pool, 1, prompt, salt="x") == 3
        assert pool.prefix_lookup(prompt, salt="x").hit_tokens == 12
        assert pool.prefix_lookup(prompt, extras={"salt": b"x"}).hit_tokens == 12
        assert pool.prefix_lookup(prompt, adapter="x").hit_tokens == 0
        assert pool.prefix_lookup(prompt, kvcache.PREFIX_PARTIAL, adapter="x").partial_tokens == 0
        assert pool.prefix_lookup(prompt, salt="x", adapter="y").hit_tokens == 0
        assert pool.prefix_lookup(prompt).hit_tokens == 0
        assert pool.prefix_attach(2, prompt, adapter="x").hit_tokens == 0
        r = pool.prefix_attach(3, prompt, 0, "x")
        assert r.hit_tokens == 12 and pool.seq_length(3) == 12
        k3, _ = pool.gather(3, 1)
        k1, _ = pool.gather(1, 1, 0, 12)
        np.testing.assert_array_equal(k3, k1)


def test_named_keys_unknown_names():
    toks = list(range(8))
    with named_pool(["salt", "adapter"]) as pool, named_pool([]) as legacy:
        with pytest.raises(TypeError, match="unexpected keyword argument 'tenant'"):
            pool.prefix_lookup(toks, tenant="x")
        with pytest.raises(KeyError, match="'media' is not declared"):
            pool.prefix_lookup(toks, extras={"media": "h"})
        with pytest.raises(TypeError, match="given twice"):
            pool.prefix_keys(toks, extras={"salt": "a"}, salt="b")
        with pytest.raises(TypeError, match="expected str or bytes"):
            pool.prefix_insert(1, toks, salt=3)
        with pytest.raises(TypeError, match="need a pool that declares them"):
            legacy.prefix_lookup(toks, adapter="x")
        assert pool.prefix_stats().queried_tokens == 0  # nothing reached the library
        with pytest.raises(TypeError):
            named_pool(["salt", 7])


def test_named_keys_bad_declarations():
    cfg = kvcache.PoolConfig()
    cfg.num_layers, cfg.num_q_heads, cfg.num_kv_heads, cfg.head_dim = 1, 1, 1, 4
    cfg.block_size, cfg.num_blocks = 4, 8
    with kvcache.Pool(cfg) as pool:
        for names, msg in ((["salt", "salt"], "declared twice"), (["salt", ""], "is empty"),
                           (["n" * 65], "longer than 64 bytes"), (["n%d" % i for i in range(65)], "at most 64")):
            with pytest.raises(kvcache.KvcError, match=msg) as e:
                pool.enable_prefix_cache(None, "", "", names)
            assert e.value.status == kvcache.ERR_INVALID_ARGUMENT
            assert pool.extra_key_names() == ()
        with pytest.raises(kvcache.KvcError):
            pool.enable_prefix_cache(None, "", "", ["a\0b"])
        pool.enable_prefix_cache(None, "", "", ["n%02d" % i + "x" * 61 for i in range(64)])  # at the limits
        assert len(pool.extra_key_names()) == 64


def test_named_keys_disk_tier(tmp_path):
    prompt = np.arange(200, 217, dtype=np.int32)  # 4 whole blocks
    with named_pool(["salt", "adapter"]) as w:
        w.add_tier(kvcache.TIER_DISK, 1 << 24, str(tmp_path))
        write(w, 1, prompt, salt="tenant-1", adapter="lora-7")
        assert w.prefix_offload(prompt, adapter="lora-7", salt="tenant-1") == 4
        w.flush_tiers()
    with named_pool(["media", "adapter", "salt"]) as r:
        r.add_tier(kvcache.TIER_DISK, 1 << 24, str(tmp_path))
        assert r.prefix_lookup(prompt, salt="lora-7", adapter="tenant-1").tier_tokens == 0
        assert r.prefix_lookup(prompt, salt="tenant-1").tier_tokens == 0
        assert r.prefix_lookup(prompt, salt="tenant-1", adapter="lora-7").tier_tokens == 16
        ticket = r.prefix_prefetch(prompt, extras={"salt": "tenant-1", "adapter": "lora-7"})
        while not (p := r.prefix_poll(ticket)).done:
            pass
        assert p.loaded_tokens == 16
        assert r.prefix_attach(2, prompt, salt="tenant-1", adapter="lora-7").hit_tokens == 16
        k, v = r.gather(2, 1)
        expect = np.arange(16 * KV_HEADS * HEAD_DIM, dtype=np.float32).reshape(16, KV_HEADS, HEAD_DIM) + 1
        np.testing.assert_array_equal(k, expect)
        np.testing.assert_array_equal(v, -expect)
        assert r.prefix_load(prompt, salt="tenant-1", adapter="lora-7") == 0  # already in the pool
