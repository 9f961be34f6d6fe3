"""The C API's promises through the Python binding (issue 26): reads of
reserved, unwritten slots return zeros, never another sequence's bytes;
"never fits" is not "not now"."""
import numpy as np
import pytest

import kvcache


def config(blocks=8):
    cfg = kvcache.PoolConfig()
    cfg.num_layers, cfg.num_q_heads, cfg.num_kv_heads, cfg.head_dim = 2, 4, 2, 8
    cfg.block_size = 4
    cfg.num_blocks = blocks
    cfg.k_dtype = cfg.v_dtype = kvcache.DTYPE_F32
    return cfg


def test_unwritten_read_returns_zeros():
    with kvcache.Pool(config()) as pool:
        # Sequence 9 fills every block with non-zero rows and is freed.
        pool.seq_create(9)
        pool.reserve(9, 16)
        rows = np.full((16, 2, 8), 7.5, dtype=np.float32)
        for layer in range(2):
            pool.append(9, layer, 0, rows, rows)
        pool.seq_free(9)
        # Sequence 1 gets those blocks: what it did not write reads as zeros.
        pool.seq_create(1)
        pool.reserve(1, 6)
        mine = np.full((1, 2, 8), 2.0, dtype=np.float32)
        pool.append(1, 0, 3, mine, mine)
        k, v = pool.gather(1, 0)
        assert k.shape == (6, 2, 8)
        expect = np.zeros((6, 2, 8), dtype=np.float32)
        expect[3] = 2.0
        np.testing.assert_array_equal(k, expect)
        np.testing.assert_array_equal(v, expect)
        k1, v1 = pool.gather(1, 1)
        assert not k1.any() and not v1.any()


def test_exceeds_capacity_is_not_exhausted():
    with kvcache.Pool(config()) as pool:
        pool.seq_create(1)
        with pytest.raises(kvcache.KvcError) as e:
            pool.reserve(1, 17)  # 5 blocks per layer, the pool has 8
        assert e.value.status == kvcache.ERR_EXCEEDS_CAPACITY
        assert "has 8 in all" in e.value.message
        assert pool.seq_length(1) == 0
