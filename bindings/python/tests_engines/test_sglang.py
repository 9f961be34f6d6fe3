"""Contract tests of kvcache.sglang.KvcHiCacheStorage against SGLang's own
classes (the engines venv: sglang installed --no-deps, docs/engines.md).

Real, from the sglang package: HiCacheStorage (the base class),
HiCacheStorageConfig, StorageBackendFactory (the "dynamic" backend loader
SGLang's --hicache-storage-backend dynamic uses), PoolTransfer and its hit
policies, the page hashes (sglang.srt.mem_cache.utils.get_hash_str) and the
host KV pool MHATokenToKVPoolHost, built on the CPU (pin_memory off) in each
layout SGLang lays pages out in. Nothing is stubbed.

The calls follow SGLang's HiCacheController: register_mem_pool_host once;
backups call batch_set_v1 (interface_v1) or batch_set on host pages in
batches; prefetches call batch_exists, then batch_get_v1 or batch_get into
host pages; hybrid models' controllers use the v2 calls.
"""

import os
import tempfile

import pytest
import torch
from sglang.srt.mem_cache.device_pool_info import KVBufferLayout, KVBuffers, MHABufferInfo
from sglang.srt.mem_cache.hicache_storage import (HiCacheStorage, HiCacheStorageConfig, PoolHitPolicy, PoolName,
                                                  PoolTransfer)
from sglang.srt.mem_cache.pool_host.mha import MHATokenToKVPoolHost
from sglang.srt.mem_cache.storage.backend_factory import StorageBackendFactory
from sglang.srt.mem_cache.utils import get_hash_str

import kvcache
from engine_util import free_port, redis_ports
from kvcache.sglang import KvcHiCacheStorage

LAYERS, HEADS, DIM, PAGE = 3, 2, 16, 4
DEVICE_TOKENS = 64


def host_pool(layout, dtype=torch.bfloat16, heads=HEADS):
    """SGLang's host KV pool on the CPU, device buffers [tokens, heads, dim] per layer."""
    k = tuple(torch.zeros(DEVICE_TOKENS, heads, DIM, dtype=dtype) for _ in range(LAYERS))
    v = tuple(torch.zeros(DEVICE_TOKENS, heads, DIM, dtype=dtype) for _ in range(LAYERS))
    ptrs = lambda ts: torch.tensor([t.data_ptr() for t in ts], dtype=torch.uint64)  # noqa: E731
    info = MHABufferInfo(buffers=KVBuffers(k=k, v=v, k_data_ptrs=ptrs(k), v_data_ptrs=ptrs(v),
                                           layout=KVBufferLayout.NHD),
                         page_size=PAGE, head_num=heads, head_dim=DIM, v_head_dim=DIM, dtype=dtype,
                         device=torch.device("cpu"))
    return MHATokenToKVPoolHost(info, 2.0, 0, PAGE, layout, pin_memory=False, device="cpu",
                                device_capacity_tokens=DEVICE_TOKENS, start_layer=0, end_layer=LAYERS)


def storage_config(extra, model="HuggingFaceTB/SmolLM2-135M", tp_rank=0, tp_size=1, mla=False, metrics=False):
    extra = dict({"backend_name": "kvcache", "module_path": "kvcache.sglang",
                  "class_name": "KvcHiCacheStorage", "interface_v1": 1}, **extra)
    return HiCacheStorageConfig(tp_rank=tp_rank, tp_size=tp_size, pp_rank=0, pp_size=1, attn_cp_rank=0,
                                attn_cp_size=1, is_mla_model=mla, enable_storage_metrics=metrics,
                                is_page_first_layout=False, model_name=model, extra_config=extra)


def engine(extra, pool, **kw):
    """What SGLang does at start-up: the dynamic backend, then the host pool registered."""
    backend = StorageBackendFactory.create_backend("dynamic", storage_config(extra, **kw), pool)
    assert isinstance(backend, KvcHiCacheStorage) and isinstance(backend, HiCacheStorage)
    backend.register_mem_pool_host(pool)
    return backend


def page_keys(tokens):
    """SGLang's chained page hashes of a token list."""
    keys, prior = [], None
    for i in range(0, len(tokens) - len(tokens) % PAGE, PAGE):
        prior = get_hash_str(tokens[i:i + PAGE], prior)
        keys.append(prior)
    return keys


def fill_pages(pool, first_page, n_pages, seed):
    """Random K/V in n_pages host pages from first_page; their host indices."""
    g = torch.Generator().manual_seed(seed)
    idx = torch.arange(first_page * PAGE, (first_page + n_pages) * PAGE, dtype=torch.int64)
    for p in range(n_pages):
        page = pool.get_data_page(int(idx[p * PAGE]), flat=True)
        rnd = torch.randn(page.numel(), generator=g).to(pool.dtype)
        pool.set_from_flat_data_page(int(idx[p * PAGE]), rnd)
    return idx


def pages(pool, idx):
    return [pool.get_data_page(int(idx[i]), flat=True).clone() for i in range(0, len(idx), PAGE)]


# --------------------------------------------------------------------- tests

@pytest.mark.parametrize("layout", ["layer_first", "page_first", "page_first_direct"])
def test_zero_copy_round_trip(layout):
    """batch_set_v1 from host pages, batch_exists, batch_get_v1 into other host pages of another
    engine (a new process on the same directory): the pages' bytes, in SGLang's layout."""
    with tempfile.TemporaryDirectory() as d:
        extra = {"kvc_tier": "disk", "kvc_path": d, "kvc_capacity_bytes": 64 << 20}
        a_pool, b_pool = host_pool(layout), host_pool(layout)
        a = engine(extra, a_pool)
        keys = page_keys(list(range(1000, 1000 + 5 * PAGE + 3)))
        assert len(keys) == 5
        src = fill_pages(a_pool, 1, 5, seed=1)
        assert a.batch_set_v1(keys, src) == [True] * 5
        assert a.batch_exists(keys) == 5
        b = engine(extra, b_pool)
        assert b.batch_exists(keys + ["absent"]) == 5
        dst = torch.arange(8 * PAGE, 13 * PAGE, dtype=torch.int64)
        assert b.batch_get_v1(keys, dst) == [True] * 5
        for x, y in zip(pages(a_pool, src), pages(b_pool, dst)):
            assert torch.equal(x.view(torch.int16), y.view(torch.int16))
        # Pages around the destination are untouched.
        assert torch.count_nonzero(pages(b_pool, torch.arange(7 * PAGE, 8 * PAGE))[0].float()) == 0
        # A prefix of the keys stored, then a miss: batch_exists stops there, batch_get_v1 says which.
        assert b.batch_exists(keys[:2] + ["nope"] + keys[2:]) == 2
        assert b.batch_get_v1(keys[:2] + ["nope"], dst[:3 * PAGE]) == [True, True, False]
        a.close()
        b.close()


def test_storage_metrics():
    """With enable_storage_metrics, get_stats() gives SGLang's StorageMetrics of the batches since the
    last call: pages per batch read and written, and a bandwidth for each; without it, None."""
    from sglang.srt.observability.metrics_collector import StorageMetrics
    pool = host_pool("layer_first")
    s = engine({"kvc_tier": "host", "kvc_capacity_bytes": 16 << 20}, pool, metrics=True)
    keys = page_keys(list(range(50, 50 + 3 * PAGE)))
    src = fill_pages(pool, 1, 3, seed=4)
    assert s.batch_set_v1(keys, src) == [True] * 3
    assert s.batch_set_v1(keys, src) == [True] * 3  # stored already: nothing written
    assert s.batch_get_v1(keys[:2] + ["absent"], torch.arange(5 * PAGE, 8 * PAGE)) == [True, True, False]
    m = s.get_stats()
    assert isinstance(m, StorageMetrics)
    assert m.backup_pgs == [3] and m.prefetch_pgs == [2]
    assert len(m.backup_bandwidth) == 1 and m.backup_bandwidth[0] > 0
    assert len(m.prefetch_bandwidth) == 1 and m.prefetch_bandwidth[0] > 0
    m2 = s.get_stats()  # emptied by the call
    assert m2.backup_pgs == [] and m2.prefetch_pgs == []
    s.close()
    plain = engine({"kvc_tier": "host", "kvc_capacity_bytes": 16 << 20}, host_pool("layer_first"))
    assert plain.get_stats() is None
    plain.close()


def test_generic_pair_round_trip():
    """The v0 pair as HiCacheController's generic path calls it: batch_set of get_data_page()
    tensors, batch_get into get_dummy_flat_data_page() buffers, set_from_flat_data_page()."""
    pool = host_pool("layer_first", dtype=torch.float16)
    s = engine({"kvc_tier": "host", "kvc_capacity_bytes": 16 << 20, "interface_v1": 0}, pool)
    keys = page_keys(list(range(7, 7 + 4 * PAGE)))
    src = fill_pages(pool, 2, 4, seed=2)
    data = [pool.get_data_page(int(src[i * PAGE])) for i in range(4)]
    assert s.batch_set(keys, data) is True
    assert s.batch_set(keys, data) is True  # stored already: nothing rewritten
    got = s.batch_get(keys, [pool.get_dummy_flat_data_page() for _ in keys])
    assert all(g is not None for g in got)
    for d, g in zip(data, got):
        assert torch.equal(d, g)
    assert s.exists(keys[0]) and not s.exists("other")
    # Without a target: a new uint8 tensor of the page's bytes.
    raw = s.get(keys[1])
    assert raw.dtype == torch.uint8 and torch.equal(raw, data[1].view(torch.uint8))
    # A target of another size is not a page of this pool: None, the target untouched.
    small = torch.zeros(8, dtype=torch.float16)
    assert s.get(keys[0], small) is None and torch.count_nonzero(small) == 0
    st = s.tier_stats()
    assert st.entries == 4 and st.errors == 0 and st.hits >= 5
    assert s.clear() is True and s.batch_exists(keys) == 0


def test_scopes_never_share():
    """Another model, tensor-parallel rank, layout or dtype on the same directory: misses. MLA
    KV is shared by the tensor-parallel ranks (SGLang's file backend keys it so too)."""
    with tempfile.TemporaryDirectory() as d:
        extra = {"kvc_tier": "disk", "kvc_path": d, "kvc_capacity_bytes": 64 << 20}
        pool = host_pool("page_first")
        a = engine(extra, pool)
        keys = page_keys(list(range(50, 50 + 2 * PAGE)))
        assert a.batch_set_v1(keys, fill_pages(pool, 0, 2, seed=3)) == [True, True]
        assert engine(extra, host_pool("page_first")).batch_exists(keys) == 2
        assert engine(extra, host_pool("page_first"), model="other/model").batch_exists(keys) == 0
        assert engine(extra, host_pool("page_first"), tp_rank=1, tp_size=2).batch_exists(keys) == 0
        assert engine(extra, host_pool("layer_first")).batch_exists(keys) == 0
        assert engine(extra, host_pool("page_first", dtype=torch.float16)).batch_exists(keys) == 0
        assert engine(dict(extra, kvc_scope="tenant-b"), host_pool("page_first")).batch_exists(keys) == 0
        m0 = engine(extra, host_pool("page_first"), tp_rank=0, tp_size=2, mla=True)
        assert m0.batch_set_v1(keys, fill_pages(m0.mem_pool_host, 0, 2, seed=4)) == [True, True]
        m1 = engine(extra, host_pool("page_first"), tp_rank=1, tp_size=2, mla=True)
        assert m1.batch_exists(keys) == 2


@pytest.mark.parametrize("cluster", [False, True], ids=["standalone", "cluster"])
def test_redis_two_engines(cluster):
    """Two engines on one Redis server (or a 3-node Redis Cluster): what one backs up, the other
    prefetches, byte for byte; batch_exists in one round trip per server."""
    ports = redis_ports()
    address = ("127.0.0.1:%d" % ports["cluster"][0]) if cluster else "127.0.0.1:%d" % ports["standalone"][0]
    extra = {"kvc_tier": "redis", "kvc_address": address, "kvc_cluster": cluster,
             "kvc_scope": "test_sglang-%d" % os.getpid()}
    a_pool, b_pool = host_pool("page_first"), host_pool("page_first")
    a, b = engine(extra, a_pool), engine(extra, b_pool)
    keys = page_keys(list(range(300, 300 + 6 * PAGE)))
    src = fill_pages(a_pool, 3, 6, seed=5)
    assert b.batch_exists(keys) == 0
    assert a.batch_set_v1(keys, src) == [True] * 6
    assert b.batch_exists(keys) == 6
    dst = torch.arange(10 * PAGE, 16 * PAGE)
    assert b.batch_get_v1(keys, dst) == [True] * 6
    for x, y in zip(pages(a_pool, src), pages(b_pool, dst)):
        assert torch.equal(x.view(torch.int16), y.view(torch.int16))
    for k in keys:
        assert b._store.remove(k)
    assert a.batch_exists(keys) == 0
    a.close()
    b.close()


def test_tier_down_degrades_to_misses():
    """A Redis address where nothing listens: misses and failed backups, reported as SGLang's
    answers (0, False), never an exception in its I/O threads; the reason in tier_stats()."""
    pool = host_pool("page_first")
    s = engine({"kvc_tier": "redis", "kvc_address": "127.0.0.1:%d" % free_port(), "kvc_timeout_ms": 200}, pool)
    keys = page_keys(list(range(4 * PAGE)))
    idx = fill_pages(pool, 0, 4, seed=6)
    assert s.batch_exists(keys) == 0
    assert s.batch_set_v1(keys, idx) == [False] * 4
    assert s.batch_get_v1(keys, idx) == [False] * 4
    assert s.set(keys[0], pool.get_data_page(0)) is False
    assert s.get(keys[0], pool.get_dummy_flat_data_page()) is None
    st = s.tier_stats()
    assert st.errors >= 1 and st.last_error != ""


def test_bad_configuration_and_input():
    pool = host_pool("page_first")
    with pytest.raises(ValueError, match="kvc_tier"):
        StorageBackendFactory.create_backend("dynamic", storage_config({"kvc_tier": "s3"}), pool)
    with pytest.raises(ValueError, match="kvc_address"):
        StorageBackendFactory.create_backend("dynamic", storage_config({"kvc_tier": "redis"}), pool)
    with pytest.raises(kvcache.KvcError):  # a disk directory that cannot be used
        StorageBackendFactory.create_backend(
            "dynamic", storage_config({"kvc_tier": "disk", "kvc_path": "/proc/version/x"}), pool)
    s = engine({"kvc_tier": "host", "kvc_capacity_bytes": 1 << 20}, pool)
    keys = page_keys(list(range(3 * PAGE)))
    idx = fill_pages(pool, 0, 3, seed=7)
    # Indices that do not cover the pages: nothing read or written, all False.
    assert s.batch_set_v1(keys, idx[:PAGE]) == [False] * 3
    assert s.batch_exists(keys) == 0
    assert s.batch_set_v1(keys, idx) == [True] * 3
    assert s.batch_get_v1(keys, idx[:2 * PAGE]) == [False] * 3
    assert s.batch_set_v1([], idx[:0]) == [] and s.batch_get_v1([], idx[:0]) == []
    # A page larger than the whole store: refused, False, nothing stored.
    tiny = engine({"kvc_tier": "host", "kvc_capacity_bytes": 512}, host_pool("page_first"))
    assert tiny.batch_set_v1(keys[:1], idx[:PAGE]) == [False]
    assert tiny.batch_exists(keys) == 0
    # Values of another type: False, not an exception.
    assert s.set("k", "not a tensor") is False
    assert s.batch_set(keys, None) is False
    # A backend of a host pool with another head count (another page size) reads nothing.
    other = engine({"kvc_tier": "host", "kvc_capacity_bytes": 1 << 20}, host_pool("page_first", heads=4))
    assert other.batch_exists(keys) == 0


def test_hybrid_pools_v2():
    """The v2 calls of hybrid models (KV plus a side pool registered with
    register_mem_host_pool_v2): the KV prefix is cut where a side pool misses a page its hit
    policy needs (ALL_PAGES: every page; TRAILING_PAGES: the last ones)."""
    kv, side = host_pool("layer_first"), host_pool("layer_first", dtype=torch.float16)
    s = engine({"kvc_tier": "host", "kvc_capacity_bytes": 32 << 20}, kv)
    s.register_mem_host_pool_v2(side, PoolName.SWA)
    keys = page_keys(list(range(900, 900 + 4 * PAGE)))
    kv_idx = fill_pages(kv, 0, 4, seed=8)
    side_idx = fill_pages(side, 0, 4, seed=9)
    assert s.batch_set_v1(keys, kv_idx) == [True] * 4
    # The side pool's pages for pages 0, 1 and 3 only.
    put = [PoolTransfer(name=PoolName.SWA, host_indices=torch.cat([side_idx[:2 * PAGE], side_idx[3 * PAGE:]]),
                        keys=[keys[0], keys[1], keys[3]])]
    assert s.batch_set_v2(put) == {PoolName.SWA: [True, True, True]}
    every = s.batch_exists_v2(keys, [PoolTransfer(name=PoolName.SWA, keys=keys,
                                                  hit_policy=PoolHitPolicy.ALL_PAGES)])
    assert every.kv_hit_pages == 2 and every.extra_pool_hit_pages[PoolName.SWA] == 2
    trailing = s.batch_exists_v2(keys, [PoolTransfer(name=PoolName.SWA, keys=keys[-1:],
                                                     hit_policy=PoolHitPolicy.TRAILING_PAGES)])
    assert trailing.kv_hit_pages == 4 and trailing.restorable_prefix_pages == [1, 2, 4]
    # Read the side pages back into other slots of the side pool.
    dst = torch.arange(8 * PAGE, 10 * PAGE)
    got = s.batch_get_v2([PoolTransfer(name=PoolName.SWA, host_indices=dst, keys=keys[:2])])
    assert got == {PoolName.SWA: [True, True]}
    for x, y in zip(pages(side, side_idx[:2 * PAGE]), pages(side, dst)):
        assert torch.equal(x, y)
    miss = s.batch_get_v2([PoolTransfer(name=PoolName.SWA, host_indices=dst[:PAGE], keys=keys[2:3])])
    assert miss == {PoolName.SWA: [False]}
    bad = s.batch_get_v2([PoolTransfer(name=PoolName.MAMBA, host_indices=dst[:PAGE], keys=keys[:1])])
    assert bad == {PoolName.MAMBA: [False]}
