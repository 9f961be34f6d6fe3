import numpy as np

import kvcache

# A pool for a model with 2 layers, 8 query heads, 2 KV heads of 64 values,
# keys and values stored as int8 with one scale per token and head.
cfg = kvcache.PoolConfig()
cfg.num_layers, cfg.num_q_heads, cfg.num_kv_heads, cfg.head_dim = 2, 8, 2, 64
cfg.num_blocks = 256
codec = kvcache.Codec()  # int8, per token
with kvcache.Pool(cfg, codec, codec) as pool:
    pool.seq_create(1)
    pool.reserve(1, 40)  # positions 0..39 in every layer
    rng = np.random.default_rng(0)
    keys = []
    for layer in range(cfg.num_layers):
        k = rng.standard_normal((40, 2, 64), dtype=np.float32)
        v = rng.standard_normal((40, 2, 64), dtype=np.float32)
        pool.append(1, layer, 0, k, v)  # no copy: the arrays are read in place
        keys.append(k)
    k_back, v_back = pool.gather(1, 0)  # float32 [40, 2, 64], dequantized
    step = np.abs(keys[0]).max(axis=-1, keepdims=True) / 127  # one int8 step per token and head
    assert np.all(np.abs(k_back - keys[0]) <= step / 2 * 1.0001)

    pool.seq_fork(1, 2)  # copy-on-write: shares every block
    policy_cfg = kvcache.PolicyConfig()
    policy_cfg.kind = kvcache.POLICY_STREAMING  # StreamingLLM: sinks + recent window
    policy_cfg.sink_tokens, policy_cfg.recent_tokens = 4, 12
    with kvcache.Policy(policy_cfg) as policy:
        dropped = pool.evict(2, policy)  # per layer; sequence 1 keeps all 40 tokens
        assert dropped == [24, 24]  # 40 - (4 sinks + 12 recent) in each of the 2 layers
    print("dropped", dropped, "kept positions", pool.positions(2, 0, 0, 16))

    try:
        pool.seq_length(99)
    except kvcache.KvcError as e:
        print(e.status_name, "-", e.message)  # KVC_ERR_SEQ_NOT_FOUND - sequence 99 does not exist
