"""Contract tests of kvcache.lmcache.KvcStorageBackend against LMCache's own
classes (the engines venv: lmcache installed --no-deps, docs/engines.md).

Real, from the lmcache package: LMCacheEngineConfig (storage_plugins and
extra_config, as its YAML gives them), LMCacheMetadata, CacheEngineKey, the
StorageManager that loads storage plugins and drives them (batched_put,
contains, batched_contains, get, remove), its LocalCPUBackend and memory
allocator, the StoragePluginInterface base class and the remote metadata
header. Nothing is stubbed; LMCache runs on the CPU.
"""

import os
import tempfile
import time

import pytest
import torch
from lmcache.utils import CacheEngineKey
from lmcache.v1.config import LMCacheEngineConfig
from lmcache.v1.event_manager import EventManager
from lmcache.v1.metadata import LMCacheMetadata
from lmcache.v1.storage_backend.abstract_backend import StoragePluginInterface
from lmcache.v1.storage_backend.storage_manager import StorageManager

from kvcache.lmcache import KvcStorageBackend
from engine_util import free_port, redis_ports

CHUNK = 16
SHAPE = (4, 2, CHUNK, 2, 32)  # layers, K/V, tokens, KV heads, head size


def engine(options, model="smollm2", local_cpu=False):
    """An LMCache engine's storage: its StorageManager with our plugin configured by name."""
    extra = {"storage_plugin.kvcache.module_path": "kvcache.lmcache",
             "storage_plugin.kvcache.class_name": "KvcStorageBackend"}
    extra.update({"kvcache." + k: v for k, v in options.items()})
    cfg = LMCacheEngineConfig.from_defaults(chunk_size=CHUNK, local_cpu=local_cpu, max_local_cpu_size=0.05,
                                            storage_plugins=["kvcache"], extra_config=extra)
    meta = LMCacheMetadata(model_name=model, world_size=1, local_world_size=1, worker_id=0, local_worker_id=0,
                           kv_dtype=torch.bfloat16, kv_shape=SHAPE, chunk_size=CHUNK)
    sm = StorageManager(cfg, meta, EventManager())
    sm.test_meta = meta
    return sm


def plugin(sm):
    p = sm.storage_backends.get("kvcache")
    assert isinstance(p, KvcStorageBackend) and isinstance(p, StoragePluginInterface)
    return p


def keys_of(n, model="smollm2", first=1000):
    return [CacheEngineKey(model_name=model, world_size=1, worker_id=0, chunk_hash=first + i, dtype=torch.bfloat16)
            for i in range(n)]


def put_chunks(sm, keys, seed, tokens=None):
    """Chunks of random K/V stored through the StorageManager; clones of what was stored."""
    g = torch.Generator().manual_seed(seed)
    objs, want = [], []
    for _ in keys:
        o = sm.allocate(sm.test_meta.get_shapes(tokens), sm.test_meta.get_dtypes())
        o.tensor.copy_(torch.randn(o.tensor.shape, generator=g).to(o.tensor.dtype))
        want.append(o.tensor.clone())
        objs.append(o)
    sm.batched_put(keys, objs)
    wait_puts(sm, keys)
    return want


def wait_puts(sm, keys, timeout=10.0):
    p = plugin(sm)
    t0 = time.time()
    while any(p.exists_in_put_tasks(k) for k in keys):
        assert time.time() - t0 < timeout, "puts still in flight"
        time.sleep(0.01)


def same(a, b):
    return a is not None and a.shape == b.shape and torch.equal(a.view(torch.int16), b.view(torch.int16))


# --------------------------------------------------------------------- tests

@pytest.mark.parametrize("tier", ["host", "disk"])
def test_storage_manager_round_trip(tier):
    """LMCache's StorageManager loads the plugin from its configuration and drives it: batched_put,
    contains, batched_contains, get (byte-identical chunks, full and partial), remove."""
    with tempfile.TemporaryDirectory() as d:
        opts = {"tier": tier, "capacity_bytes": 1 << 24, "path": d}
        sm = engine(opts)
        try:
            assert list(sm.storage_backends) == ["LocalCPUBackend", "kvcache"]
            keys = keys_of(4)
            want = put_chunks(sm, keys, seed=1)
            assert sm.contains(keys[0]) == "kvcache"
            assert sm.batched_contains(keys)[0] == 4
            assert sm.batched_contains(keys[:2] + keys_of(1, first=5000) + keys[2:])[0] == 2
            for k, w in zip(keys, want):
                got = sm.get(k)
                assert same(got.tensor, w)
                got.ref_count_down()
            # A partial chunk (5 tokens): its shapes come back from the header.
            part = keys_of(1, first=2000)
            pw = put_chunks(sm, part, seed=2, tokens=5)
            got = sm.get(part[0])
            assert got.tensor.shape[2] == 5 and same(got.tensor, pw[0])
            got.ref_count_down()
            assert sm.remove(keys[3]) >= 1  # (LMCache's CPU backend may hold a copy since the get)
            assert not plugin(sm).contains(keys[3]) and sm.get(keys[3]) is None
            assert plugin(sm).batched_contains(keys) == 3
            st = plugin(sm).tier_stats()
            assert st.errors == 0 and st.entries == 4
        finally:
            sm.close()


def test_two_engines_share_disk():
    """What one engine stores, a second (another process on the same directory) loads; another
    model's keys miss."""
    with tempfile.TemporaryDirectory() as d:
        opts = {"tier": "disk", "capacity_bytes": 1 << 24, "path": d}
        a = engine(opts)
        keys = keys_of(3)
        want = put_chunks(a, keys, seed=3)
        a.close()
        b = engine(opts)
        try:
            assert b.batched_contains(keys)[0] == 3
            got = b.get(keys[2])
            assert same(got.tensor, want[2])
            got.ref_count_down()
            assert b.batched_contains(keys_of(3, model="other"))[0] == 0
        finally:
            b.close()


@pytest.mark.parametrize("cluster", [False, True], ids=["standalone", "cluster"])
def test_redis_two_engines(cluster):
    ports = redis_ports()
    address = "127.0.0.1:%d" % (ports["cluster"][0] if cluster else ports["standalone"][0])
    opts = {"tier": "redis", "address": address, "cluster": cluster, "scope": "test_lmcache-%d" % os.getpid()}
    a, b = engine(opts), engine(opts)
    try:
        keys = keys_of(5, first=7000)
        assert b.batched_contains(keys)[0] == 0
        want = put_chunks(a, keys, seed=4)
        assert b.batched_contains(keys)[0] == 5
        for k, w in zip(keys, want):
            got = b.get(k)
            assert same(got.tensor, w)
            got.ref_count_down()
        for k in keys:
            assert b.remove(k) >= 1
        assert plugin(a).batched_contains(keys) == 0
    finally:
        a.close()
        b.close()


def test_pins_hold_against_eviction():
    """contains(pin=True) pins a chunk in a host store: LRU replacement evicts the others."""
    one = 4 * 2 * CHUNK * 2 * 32 * 2  # a chunk's bytes
    sm = engine({"tier": "host", "capacity_bytes": 3 * one + 600})
    try:
        p = plugin(sm)
        keys = keys_of(2)
        put_chunks(sm, keys, seed=5)
        assert p.contains(keys[0], pin=True)
        more = keys_of(2, first=3000)
        put_chunks(sm, more, seed=6)  # room for 3: keys[1], the oldest unpinned, goes
        assert p.contains(keys[0]) and not p.contains(keys[1])
        assert p.tier_stats().pinned == 1
        assert p.unpin(keys[0]) and not p.unpin(keys[0])
    finally:
        sm.close()


def test_tier_down_degrades_to_misses():
    """A Redis address where nothing listens: puts fail quietly, lookups miss, gets give None."""
    sm = engine({"tier": "redis", "address": "127.0.0.1:%d" % free_port(), "timeout_ms": 200})
    try:
        keys = keys_of(2)
        put_chunks(sm, keys, seed=7)
        assert sm.batched_contains(keys)[0] == 0 and sm.contains(keys[0]) is None
        assert sm.get(keys[0]) is None
        st = plugin(sm).tier_stats()
        assert st.errors >= 1 and st.last_error != ""
    finally:
        sm.close()


def test_bad_configuration_and_values():
    # LMCache logs a plugin that cannot be created and runs without it.
    sm = engine({"tier": "s3"})
    assert "kvcache" not in sm.storage_backends
    sm.close()
    with pytest.raises(ValueError, match="address"):
        KvcStorageBackend(config=LMCacheEngineConfig.from_defaults(extra_config={"kvcache.tier": "redis"}))
    sm = engine({"tier": "host", "capacity_bytes": 1 << 22})
    try:
        p = plugin(sm)
        keys = keys_of(2)
        # A value under a chunk's key that is not a chunk (no header, a short one): None.
        p._store.put(p._key(keys[0]), b"not a chunk")
        p._store.put(p._key(keys[1]), bytes(p._meta_bytes + 3))
        assert p.get_blocking(keys[0]) is None and p.get_blocking(keys[1]) is None
        # Mismatched lists: no task.
        assert p.batched_submit_put_task(keys, []) is None
    finally:
        sm.close()
