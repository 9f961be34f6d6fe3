"""Offload tiers through the Python binding (docs/tiers.md): a host and a disk
tier below a pool with the prefix cache; a prompt's blocks offloaded, reclaimed
from the pool, found by lookup, loaded back (synchronously and by prefetch +
poll) and compared byte for byte; pins; per-tier counters; a load that times
out; bad input."""

import os
import stat
import time

import numpy as np
import pytest

import kvcache

LAYERS, KV_HEADS, HEAD_DIM, BS = 2, 2, 8, 16
SEED = bytes(range(7, 7 + 32))


def tier_pool(blocks=16):
    cfg = kvcache.PoolConfig()
    cfg.num_layers, cfg.num_q_heads, cfg.num_kv_heads, cfg.head_dim = LAYERS, 4, KV_HEADS, HEAD_DIM
    cfg.block_size = BS
    cfg.num_blocks = blocks
    cfg.k_dtype = cfg.v_dtype = kvcache.DTYPE_F32  # stored as given: loads compare exactly
    pool = kvcache.Pool(cfg)
    pc = kvcache.PrefixConfig()
    pc.set_seed(SEED)  # the same keys in every pool of this test
    pool.enable_prefix_cache(pc, "tier-model")
    return pool


def write_prompt(pool, seq, prompt, rng):
    """Creates seq holding random K/V for prompt, registers it; returns [(k, v)] per layer."""
    n = len(prompt)
    pool.seq_create(seq)
    pool.reserve(seq, n)
    kv = []
    for layer in range(LAYERS):
        k = rng.standard_normal((n, KV_HEADS, HEAD_DIM), dtype=np.float32)
        v = rng.standard_normal((n, KV_HEADS, HEAD_DIM), dtype=np.float32)
        assert pool.append(seq, layer, 0, k, v) == n
        kv.append((k, v))
    assert pool.prefix_insert(seq, prompt) == n // BS
    return kv


def squeeze(pool, first):
    """Fills every free and reclaimable block with other sequences (ids from
    first), so the pool reclaims its cached prefix blocks; returns the next id."""
    sid = first
    garbage = np.full((BS, KV_HEADS, HEAD_DIM), -1.0, np.float32)
    while True:
        st = pool.stats()
        if st.blocks_free + st.blocks_cached < LAYERS:
            return sid
        pool.seq_create(sid)
        pool.reserve(sid, BS)
        for layer in range(LAYERS):
            pool.append(sid, layer, 0, garbage, garbage)
        sid += 1


def free_range(pool, first, end):
    for sid in range(first, end):
        pool.seq_free(sid)


def assert_holds(pool, seq, kv, n):
    """The first n tokens of seq are exactly the K/V written."""
    assert pool.seq_length(seq) == n
    for layer, (k, v) in enumerate(kv):
        gk, gv = pool.gather(seq, layer, 0, n)
        assert np.array_equal(gk, k[:n]) and np.array_equal(gv, v[:n])


def test_constants():
    assert (kvcache.TIER_HOST, kvcache.TIER_DISK, kvcache.TIER_REDIS) == (0, 1, 2)
    assert (kvcache.TIER_FSYNC, kvcache.TIER_REDIS_CLUSTER, kvcache.PREFIX_PIN) == (1, 2, 2)
    assert (kvcache.ERR_PENDING, kvcache.ERR_TIMEOUT) == (21, 22)
    assert kvcache.status_name(kvcache.ERR_TIMEOUT) == "KVC_ERR_TIMEOUT"
    cfg = kvcache.TierConfig(kvcache.TIER_DISK)  # kvc_tier_config_init's defaults
    assert (cfg.kind, cfg.flags, cfg.capacity_bytes, cfg.timeout_ms, cfg.ttl_seconds) == (kvcache.TIER_DISK, 0, 0, 1000, 0)


def test_offload_reclaim_lookup_load_prefetch_pin(tmp_path):
    rng = np.random.default_rng(1234)
    prompt = np.array([(i * 7919 + 11) % 32000 for i in range(3 * BS + 1)], np.int32)  # 3 whole blocks usable
    with tier_pool() as pool:
        assert pool.add_tier(kvcache.TIER_HOST, 1 << 20) == 0
        assert pool.add_tier(kvcache.TIER_DISK, 1 << 24, path=str(tmp_path)) == 1
        pool.set_offload(64, 10000)
        kv = write_prompt(pool, 1, prompt, rng)

        # Offloaded while still in the pool: write-through to both tiers.
        assert pool.prefix_offload(prompt) == 3
        pool.flush_tiers()
        for i, kind in ((0, kvcache.TIER_HOST), (1, kvcache.TIER_DISK)):
            s = pool.tier_stats(i)
            assert (s.kind, s.demotions, s.entries, s.hits, s.promotions, s.drops, s.errors) == (kind, 3, 3, 0, 0, 0, 0)
            assert s.last_error == "" and isinstance(s.last_error, str)
        assert len([f for f in os.listdir(tmp_path) if not f.startswith(".")]) == 3

        # The pool's copy reclaimed: its demotions are skipped (the tiers hold the 3 keys).
        pool.seq_free(1)
        end = squeeze(pool, 100)
        pool.flush_tiers()
        assert pool.prefix_stats().registered_blocks == 0
        assert pool.tier_stats(0).entries == 3 and pool.tier_stats(1).entries == 3
        free_range(pool, 100, end)

        r = pool.prefix_lookup(prompt)
        assert (r.hit_tokens, r.tier_tokens, r.pin) == (0, 48, 0)
        assert pool.prefix_load(prompt) == 48
        r = pool.prefix_lookup(prompt)
        assert (r.hit_tokens, r.tier_tokens) == (48, 0)
        assert pool.prefix_attach(2, prompt).hit_tokens == 48
        assert_holds(pool, 2, kv, 48)
        s0, s1 = pool.tier_stats(0), pool.tier_stats(1)
        assert (s0.hits, s0.promotions, s0.misses) == (3, 3, 0)  # the first tier holding a block serves it
        assert (s1.hits, s1.promotions) == (0, 0)

        # Again, asynchronously: prefetch, poll until done.
        pool.seq_free(2)
        end = squeeze(pool, 200)
        pool.flush_tiers()
        free_range(pool, 200, end)
        assert pool.prefix_lookup(prompt).tier_tokens == 48
        ticket = pool.prefix_prefetch(prompt)
        assert ticket != 0
        deadline = time.monotonic() + 10
        while True:
            p = pool.prefix_poll(ticket)
            if p.done:
                break
            assert p.loaded_tokens == 0  # pending: not an error
            assert time.monotonic() < deadline, "prefetch still pending after 10 s"
            time.sleep(0.001)
        assert p.loaded_tokens == 48
        with pytest.raises(kvcache.KvcError) as e:
            pool.prefix_poll(ticket)  # reported once
        assert e.value.status == kvcache.ERR_INVALID_ARGUMENT
        assert pool.prefix_attach(3, prompt).hit_tokens == 48
        assert_holds(pool, 3, kv, 48)
        assert (pool.tier_stats(0).hits, pool.tier_stats(0).promotions) == (6, 6)

        # Pins: the tier blocks a lookup promised stay until unpinned, once.
        pool.seq_free(3)
        end = squeeze(pool, 300)
        pool.flush_tiers()
        r = pool.prefix_lookup(prompt, kvcache.PREFIX_PIN)
        assert r.tier_tokens == 48 and r.pin != 0
        assert pool.tier_stats(0).pinned == 3
        pool.prefix_unpin(r.pin)
        assert pool.tier_stats(0).pinned == 0
        for pin in (r.pin, 0):
            with pytest.raises(kvcache.KvcError) as e:
                pool.prefix_unpin(pin)
            assert e.value.status == kvcache.ERR_INVALID_ARGUMENT
        free_range(pool, 300, end)

    # A new pool with the same seed and model finds the blocks on disk.
    with tier_pool() as pool:
        assert pool.add_tier(kvcache.TIER_DISK, 1 << 24, str(tmp_path)) == 0
        assert pool.prefix_lookup(prompt).tier_tokens == 48
        assert pool.prefix_load(prompt) == 48
        assert pool.prefix_attach(1, prompt).hit_tokens == 48
        assert_holds(pool, 1, kv, 48)
        s = pool.tier_stats(0)
        assert (s.hits, s.promotions, s.demotions, s.entries) == (3, 3, 0, 3)


def test_prefetch_timeout_raises(tmp_path):
    """A disk record that never answers (a FIFO nobody writes): the prefetch
    times out (ERR_TIMEOUT raised by poll); released, the record is refused
    and last_error says why."""
    rng = np.random.default_rng(5)
    prompt = np.arange(1000, 1000 + 2 * BS + 1, dtype=np.int32)
    with tier_pool() as pool:
        pool.add_tier(kvcache.TIER_DISK, 1 << 24, str(tmp_path))
        write_prompt(pool, 1, prompt, rng)
        assert pool.prefix_offload(prompt) == 2
        pool.flush_tiers()
    names = sorted(f for f in os.listdir(tmp_path) if not f.startswith("."))
    assert len(names) == 2
    with tier_pool() as pool:
        pool.add_tier(kvcache.TIER_DISK, 1 << 24, str(tmp_path))
        pool.set_offload(16, 200)
        for n in names:  # replaced after the pool indexed them
            os.unlink(tmp_path / n)
            os.mkfifo(tmp_path / n)
        assert pool.prefix_lookup(prompt).tier_tokens == 2 * BS
        ticket = pool.prefix_prefetch(prompt)
        released = 0
        try:
            time.sleep(0.5)
            with pytest.raises(kvcache.KvcError) as e:
                pool.prefix_poll(ticket)
            assert e.value.status == kvcache.ERR_TIMEOUT
            assert e.value.status_name == "KVC_ERR_TIMEOUT"
        finally:
            # The loader is blocked opening one FIFO: open it for writing and close (EOF).
            deadline = time.monotonic() + 10
            while released == 0 and time.monotonic() < deadline:
                for n in names:
                    p = tmp_path / n
                    if os.path.exists(p) and stat.S_ISFIFO(os.stat(p).st_mode):
                        try:
                            os.close(os.open(p, os.O_WRONLY | os.O_NONBLOCK))
                            released += 1
                        except OSError:
                            pass  # no reader on this one
                time.sleep(0.01)
        assert released == 1
        deadline = time.monotonic() + 10
        while pool.tier_stats(0).errors == 0 and time.monotonic() < deadline:
            time.sleep(0.01)
        s = pool.tier_stats(0)
        assert (s.errors, s.hits, s.promotions) == (1, 0, 0)
        assert "cannot be read" in s.last_error and isinstance(s.last_error, str)
        assert pool.stats().blocks_used == 0  # the reserved blocks went back


def test_bad_input(tmp_path):
    with tier_pool() as pool:
        with pytest.raises(kvcache.KvcError) as e:
            pool.add_tier(kvcache.TIER_HOST, 0)  # capacity 0
        assert e.value.status == kvcache.ERR_INVALID_ARGUMENT
        with pytest.raises(kvcache.KvcError) as e:
            pool.add_tier(7, 1 << 20)  # unknown kind
        assert e.value.status == kvcache.ERR_INVALID_ARGUMENT
        with pytest.raises(kvcache.KvcError) as e:
            pool.add_tier(kvcache.TIER_DISK, 1 << 20)  # no path
        assert e.value.status == kvcache.ERR_INVALID_ARGUMENT
        with pytest.raises(kvcache.KvcError) as e:
            pool.add_tier(kvcache.TIER_DISK, 1 << 20, "a\0b")
        assert e.value.status == kvcache.ERR_INVALID_ARGUMENT and "path" in e.value.message
        with pytest.raises(kvcache.KvcError) as e:
            pool.add_tier(kvcache.TIER_REDIS, 0, address="localhost")  # no port
        assert e.value.status in (kvcache.ERR_INVALID_ARGUMENT, kvcache.ERR_UNSUPPORTED)
        with pytest.raises(kvcache.KvcError) as e:
            pool.set_offload(4, 100)  # no tier yet
        assert e.value.status == kvcache.ERR_INVALID_ARGUMENT
        with pytest.raises(kvcache.KvcError) as e:
            pool.tier_stats(0)  # none was added
        assert e.value.status == kvcache.ERR_OUT_OF_RANGE
        with pytest.raises(kvcache.KvcError) as e:
            pool.prefix_load([1, 2, 3, 4, 5])  # no tier
        assert e.value.status == kvcache.ERR_INVALID_ARGUMENT
        assert pool.add_tier(kvcache.TIER_HOST, 1 << 20, flags=0) == 0
        for q, t in ((0, 100), (4, 0)):
            with pytest.raises(kvcache.KvcError) as e:
                pool.set_offload(q, t)
            assert e.value.status == kvcache.ERR_INVALID_ARGUMENT
        with pytest.raises(kvcache.KvcError) as e:
            pool.prefix_poll(12345)
        assert e.value.status == kvcache.ERR_INVALID_ARGUMENT
        ticket = pool.prefix_prefetch([1, 2, 3, 4, 5])  # nothing to load: done at once
        p = pool.prefix_poll(ticket)
        assert (p.done, p.loaded_tokens) == (True, 0)
        with pytest.raises(OverflowError):
            pool.add_tier(kvcache.TIER_HOST, -1)
        with pytest.raises(kvcache.KvcError) as e:
            pool.tier_stats(1)
        assert e.value.status == kvcache.ERR_OUT_OF_RANGE
    with pytest.raises(kvcache.KvcError) as e:
        pool.flush_tiers()  # closed
    assert e.value.status == kvcache.ERR_NULL_POINTER
    with pytest.raises(kvcache.KvcError) as e:
        kvcache.TierConfig(9)
    assert e.value.status == kvcache.ERR_INVALID_ARGUMENT
