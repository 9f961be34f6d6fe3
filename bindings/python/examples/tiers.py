import tempfile

import numpy as np

import kvcache

cfg = kvcache.PoolConfig()
cfg.num_layers, cfg.num_q_heads, cfg.num_kv_heads, cfg.head_dim = 2, 4, 2, 8
cfg.num_blocks = 16
prompt = np.arange(100, 149, dtype=np.int32)  # 3 whole blocks of 16 (+ the last token)
with kvcache.Pool(cfg) as pool, tempfile.TemporaryDirectory() as tier_dir:
    pool.enable_prefix_cache(None, "my-model")
    pool.add_tier(kvcache.TIER_HOST, 64 << 20)                  # tier 0: host memory
    pool.add_tier(kvcache.TIER_DISK, 1 << 30, path=tier_dir)     # tier 1: a directory
    pool.seq_create(1)
    pool.reserve(1, len(prompt))
    for layer in range(cfg.num_layers):
        kv = np.ones((len(prompt), 2, 8), np.float32)
        pool.append(1, layer, 0, kv, kv)
    pool.prefix_insert(1, prompt)
    print("queued", pool.prefix_offload(prompt))  # written to both tiers in the background
    pool.flush_tiers()
    pool.seq_free(1)
    pool.seq_create(2)
    pool.reserve(2, 128)  # 8 blocks of each layer: all 16, the cached ones reclaimed
    pool.flush_tiers()    # (their demotions: skipped, the tiers hold them already)
    r = pool.prefix_lookup(prompt, kvcache.PREFIX_PIN)
    print("pool", r.hit_tokens, "tiers", r.tier_tokens)
    pool.seq_free(2)
    ticket = pool.prefix_prefetch(prompt)          # or pool.prefix_load(prompt): waits
    while not (p := pool.prefix_poll(ticket)).done:
        pass                                        # ERR_TIMEOUT raises KvcError
    pool.prefix_unpin(r.pin)
    print("loaded", p.loaded_tokens, "attached", pool.prefix_attach(3, prompt).hit_tokens)
    s = pool.tier_stats(0)
    print("host tier: demotions", s.demotions, "hits", s.hits, "last error", repr(s.last_error))
