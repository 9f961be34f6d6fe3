"""Tests of the Python binding (ctest: python_tests). K/V come from the shared
stories260K model run by a numpy forward pass (model.py); the quantizer is
checked against the C library called directly through ctypes."""

import ctypes
import gc
import os

import numpy as np
import pytest

import kvcache
from model import Model, golden_window0, log_softmax, shared_dir

N_TOKENS = 48


@pytest.fixture(scope="module")
def model():
    path = os.path.join(shared_dir(), "models", "stories260K.bin")
    if not os.path.exists(path):
        pytest.skip("shared model not found (set KVCACHE_SHARED_DIR)")
    return Model(path)


@pytest.fixture(scope="module")
def captured(model):
    """K/V of the first N_TOKENS golden tokens, per layer [n, kv_heads, head_dim],
    from the numpy forward pass with a numpy cache; plus its log-probs."""
    toks, _ = golden_window0(N_TOKENS)
    ks = [[] for _ in range(model.n_layers)]
    vs = [[] for _ in range(model.n_layers)]

    def kv(layer, pos, k, v):
        ks[layer].append(k)
        vs[layer].append(v)
        return np.stack(ks[layer]), np.stack(vs[layer])

    lps = []
    for pos in range(N_TOKENS):
        logits = model.step(toks[pos], pos, kv)
        lps.append(log_softmax(logits)[toks[pos + 1]])
    return [np.stack(x) for x in ks], [np.stack(x) for x in vs], np.array(lps)


def model_config(model, blocks=64, block_size=16):
    cfg = kvcache.PoolConfig()
    cfg.num_layers = model.n_layers
    cfg.num_q_heads = model.n_heads
    cfg.num_kv_heads = model.n_kv_heads
    cfg.head_dim = model.head_dim
    cfg.block_size = block_size
    cfg.num_blocks = blocks
    return cfg


def small_config(blocks=64):
    cfg = kvcache.PoolConfig()
    cfg.num_layers, cfg.num_q_heads, cfg.num_kv_heads, cfg.head_dim = 2, 4, 2, 64
    cfg.num_blocks = blocks
    return cfg


def fill(pool, seq, ks, vs):
    n = ks[0].shape[0]
    pool.seq_create(seq)
    pool.reserve(seq, n)
    for layer, (k, v) in enumerate(zip(ks, vs)):
        assert pool.append(seq, layer, 0, k, v) == n


# ---------------------------------------------------------------- model K/V

def test_numpy_forward_matches_golden(captured):
    """The reference itself: the numpy model reproduces run.c's log-probs."""
    _, lps = golden_window0(N_TOKENS)
    assert np.max(np.abs(captured[2] - np.array(lps))) < 2e-4


def test_model_kv_roundtrip_f32_and_f16(model, captured):
    ks, vs, _ = captured
    cfg = model_config(model)
    cfg.k_dtype = cfg.v_dtype = kvcache.DTYPE_F32
    with kvcache.Pool(cfg) as pool:
        fill(pool, 1, ks, vs)
        for layer in range(model.n_layers):
            k, v = pool.gather(1, layer)
            assert k.shape == (N_TOKENS, model.n_kv_heads, model.head_dim)
            np.testing.assert_array_equal(k, ks[layer])
            np.testing.assert_array_equal(v, vs[layer])
    with kvcache.Pool(model_config(model)) as pool:  # f16 storage (default)
        fill(pool, 1, ks, vs)
        for layer in range(model.n_layers):
            k, v = pool.gather(1, layer)
            np.testing.assert_array_equal(k, ks[layer].astype(np.float16).astype(np.float32))
            np.testing.assert_array_equal(v, vs[layer].astype(np.float16).astype(np.float32))
            k16, _ = pool.gather(1, layer, dtype=kvcache.DTYPE_F16, v=False)
            assert k16.dtype == np.float16
            np.testing.assert_array_equal(k16, ks[layer].astype(np.float16))


def int8_per_token_reference(x):
    """numpy int8 symmetric per-token (per token and KV head) quantization."""
    amax = np.max(np.abs(x), axis=-1, keepdims=True).astype(np.float32)
    scale = (amax / np.float32(127)).astype(np.float32)
    safe = np.where(scale > 0, scale, np.float32(1))
    q = np.clip(np.rint(x / safe), -127, 127)
    return (q * scale).astype(np.float32), scale


def test_model_kv_int8_codec_against_numpy(model, captured):
    ks, vs, _ = captured
    codec = kvcache.Codec()  # int8, per token
    assert codec.dtype == kvcache.DTYPE_INT8 and codec.granularity == kvcache.SCALE_PER_TOKEN
    with kvcache.Pool(model_config(model), codec, codec) as pool:
        fill(pool, 1, ks, vs)
        for layer in range(model.n_layers):
            k, v = pool.gather(1, layer)
            for got, x in ((k, ks[layer]), (v, vs[layer])):
                ref, scale = int8_per_token_reference(x)
                safe = np.where(scale > 0, scale, 1)
                # Within half a step of the input, the same integer codes as
                # numpy's (ties aside), each value code x scale to float rounding.
                assert np.all(np.abs(got - x) <= scale * 0.5 * (1 + 1e-5) + 1e-12)
                q_got, q_ref = np.rint(got / safe), np.rint(ref / safe)
                assert np.mean(q_got == q_ref) > 0.999
                assert np.all(np.abs(got - q_got * scale) <= 1e-6 * np.abs(got) + 1e-30)


def test_model_decode_reads_kv_from_pool(model, captured):
    """Run the model with attention over K/V written to and gathered from the
    pool: f32 storage gives the golden log-probs, f16 stays close."""
    toks, golden = golden_window0(N_TOKENS)
    for dtype, tol in ((kvcache.DTYPE_F32, 2e-4), (kvcache.DTYPE_F16, 2e-2)):
        cfg = model_config(model, block_size=8)
        cfg.k_dtype = cfg.v_dtype = dtype
        with kvcache.Pool(cfg) as pool:
            pool.seq_create(7)

            def kv(layer, pos, k, v):
                if layer == 0:
                    pool.reserve(7, 1)
                pool.append(7, layer, pos, k[None], v[None])
                return pool.gather(7, layer)

            lps = [log_softmax(model.step(toks[p], p, kv))[toks[p + 1]] for p in range(N_TOKENS)]
            assert pool.seq_length(7) == N_TOKENS
            assert len(pool.block_table(7, 0)) == N_TOKENS // 8
        assert np.max(np.abs(np.array(lps) - np.array(golden))) < tol, dtype


# ---------------------------------------------------------------- pool operations

def test_fork_copy_on_write(model, captured):
    ks, vs, _ = captured
    with kvcache.Pool(model_config(model, block_size=16)) as pool:
        fill(pool, 1, ks, vs)
        pool.seq_fork(1, 2)
        assert pool.seq_length(2) == N_TOKENS
        assert pool.block_table(2, 0) == pool.block_table(1, 0)
        assert pool.stats().blocks_shared == model.n_layers * (N_TOKENS // 16)
        # The child writes a new token: its last block is copied, the parent keeps its bytes.
        pool.seq_truncate(2, N_TOKENS - 1)
        pool.reserve(2, 1)
        new = np.full((1, model.n_kv_heads, model.head_dim), 3.0, np.float32)
        pool.append(2, 0, N_TOKENS - 1, new, new)
        kc, _ = pool.gather(2, 0)
        kp, _ = pool.gather(1, 0)
        np.testing.assert_array_equal(kc[-1], new[0])
        np.testing.assert_array_equal(kp, ks[0].astype(np.float16).astype(np.float32))
        assert pool.block_table(2, 0)[-1] != pool.block_table(1, 0)[-1]
        pool.seq_free(2)
        pool.seq_free(1)
        assert pool.stats().blocks_used == 0


def test_streaming_eviction(model, captured):
    ks, vs, _ = captured
    pc = kvcache.PolicyConfig()
    pc.kind = kvcache.POLICY_STREAMING
    pc.sink_tokens = 4
    pc.recent_tokens = 12
    with kvcache.Pool(model_config(model)) as pool, kvcache.Policy(pc) as policy:
        fill(pool, 1, ks, vs)
        dropped = pool.evict(1, policy)
        assert dropped == [N_TOKENS - 16] * model.n_layers  # per layer, as kvc_evict
        assert pool.evict(1, policy) == [0] * model.n_layers
        expect = list(range(4)) + list(range(N_TOKENS - 12, N_TOKENS))
        for layer in range(model.n_layers):
            assert pool.layer_tokens(1, layer) == 16
            assert list(pool.positions(1, layer, 0, 16)) == expect
            k, _ = pool.gather(1, layer)
            np.testing.assert_array_equal(k, ks[layer][expect].astype(np.float16).astype(np.float32))


def test_prefix_cache_lookup_attach_and_salt(model, captured):
    ks, vs, _ = captured
    toks, _ = golden_window0(N_TOKENS)
    prompt = np.array(toks[:N_TOKENS], np.int32)
    with kvcache.Pool(model_config(model)) as pool:
        pool.enable_prefix_cache(None, "stories260K", "tok512")
        fill(pool, 1, ks, vs)
        assert pool.prefix_insert(1, prompt, "tenant-a") == N_TOKENS // 16
        hit = pool.prefix_lookup(prompt, 0, "tenant-a")
        assert hit.hit_tokens == N_TOKENS - 16 and hit.hit_blocks == 2  # the last token is always computed
        assert pool.prefix_lookup(list(prompt), 0, "tenant-a").hit_tokens == N_TOKENS - 16  # a list works too
        assert pool.prefix_lookup(prompt, 0, "tenant-b").hit_tokens == 0
        assert pool.prefix_lookup(prompt).hit_tokens == 0
        res = pool.prefix_attach(2, prompt, 0, "tenant-a")
        assert res.hit_tokens == N_TOKENS - 16 and pool.seq_length(2) == N_TOKENS - 16
        k2, _ = pool.gather(2, 3)
        k1, _ = pool.gather(1, 3, 0, N_TOKENS - 16)
        np.testing.assert_array_equal(k2, k1)
        st = pool.prefix_stats()
        assert st.registered_blocks == 3 and st.hit_tokens >= 2 * (N_TOKENS - 16)


# ---------------------------------------------------------------- quantizer vs C

class CCodec(ctypes.Structure):
    _fields_ = [("struct_size", ctypes.c_size_t), ("dtype", ctypes.c_int), ("granularity", ctypes.c_int),
                ("group_size", ctypes.c_uint32), ("asymmetric", ctypes.c_uint32), ("scale_dtype", ctypes.c_int),
                ("rotation", ctypes.c_int), ("rotation_block", ctypes.c_uint32), ("static_scale", ctypes.c_uint32),
                ("scale", ctypes.c_double)]


def c_library():
    """libkvcache loaded by ctypes (the same file the extension links)."""
    import kvcache._native as ext  # noqa: F401
    with open("/proc/self/maps") as f:
        for line in f:
            path = line.split()[-1]
            if "/libkvcache.so" in path:
                return ctypes.CDLL(path)
    pytest.skip("libkvcache.so not found in the process")


def test_full_range_codec():
    """kvc_codec.full_range through the binding: llama.cpp q4_0's rule, by hand."""
    codec = kvcache.Codec()
    codec.dtype, codec.granularity, codec.full_range = kvcache.DTYPE_INT4, kvcache.SCALE_PER_TOKEN, 1
    x = np.array([[6.0, -5.0, 1.0, -6.0, 0.375, 3.0, -0.75, 2.25]], np.float32)
    codes, scales, zeros = codec.quantize(x)
    assert scales.view(np.float32).tolist() == [-0.75]  # 6 maps to -8
    assert bytes(codes.view(np.uint8)) == bytes([0xF0, 0xF7, 0x48, 0x59])  # q + 8, low nibble first
    back = codec.dequantize(codes, scales, zeros, 1, 8)
    assert back[0].tolist() == [6.0, -5.25, 0.75, -5.25, -0.0, 3.0, -0.75, 2.25]
    codec.asymmetric = 1
    with pytest.raises(kvcache.KvcError) as e:
        codec.quantize(x)
    assert e.value.status == kvcache.ERR_INVALID_ARGUMENT and "full_range" in str(e.value)


@pytest.mark.parametrize("dtype,gran,asym", [
    (kvcache.DTYPE_INT8, kvcache.SCALE_PER_TOKEN, 0),
    (kvcache.DTYPE_INT4, kvcache.SCALE_PER_GROUP, 1),
    (kvcache.DTYPE_INT2, kvcache.SCALE_PER_GROUP, 1),
    (kvcache.DTYPE_INT3, kvcache.SCALE_PER_GROUP, 1),
    (kvcache.DTYPE_INT3, kvcache.SCALE_PER_TOKEN, 0),
    (kvcache.DTYPE_FP8_E4M3, kvcache.SCALE_PER_TOKEN, 0),
])
def test_quantizer_matches_c(captured, dtype, gran, asym):
    x = np.ascontiguousarray(captured[0][2].reshape(N_TOKENS, -1))  # layer 2 keys [48, 32]
    codec = kvcache.Codec()
    codec.dtype, codec.granularity, codec.asymmetric, codec.group_size = dtype, gran, asym, 16
    codes, scales, zeros = codec.quantize(x)
    assert codes.nbytes == codec.sizes(*x.shape).codes_bytes > 0

    lib = c_library()
    cc = CCodec(ctypes.sizeof(CCodec), dtype, gran, 16, asym, kvcache.DTYPE_F32, 0, 0, 0, 0.0)
    c_codes = np.zeros_like(codes)
    c_scales = np.zeros_like(scales)
    c_zeros = np.zeros_like(zeros)
    ptr = lambda a: a.ctypes.data_as(ctypes.c_void_p)  # noqa: E731
    st = lib.kvc_quantize(ctypes.byref(cc), ptr(x), kvcache.DTYPE_F32, ctypes.c_uint64(x.shape[0]),
                          ctypes.c_uint64(x.shape[1]), ptr(c_codes), ptr(c_scales),
                          ptr(c_zeros) if zeros.nbytes else None)
    assert st == 0
    np.testing.assert_array_equal(codes, c_codes)
    np.testing.assert_array_equal(scales, c_scales)
    np.testing.assert_array_equal(zeros, c_zeros)

    back = codec.dequantize(codes, scales, zeros, *x.shape)
    c_back = np.zeros_like(x)
    st = lib.kvc_dequantize(ctypes.byref(cc), ptr(c_codes), ptr(c_scales), ptr(c_zeros) if zeros.nbytes else None,
                            ctypes.c_uint64(x.shape[0]), ctypes.c_uint64(x.shape[1]), ptr(c_back),
                            kvcache.DTYPE_F32)
    assert st == 0
    np.testing.assert_array_equal(back, c_back)
    # And it is a quantization of x: error well below the value range.
    bits = {kvcache.DTYPE_INT8: 8, kvcache.DTYPE_INT4: 4, kvcache.DTYPE_INT2: 2, kvcache.DTYPE_INT3: 3,
            kvcache.DTYPE_FP8_E4M3: 4}[dtype]
    assert np.max(np.abs(back - x)) <= np.max(np.abs(x)) * 2.0 ** (1 - bits) + 1e-6


# ---------------------------------------------------------------- errors

def status_of(excinfo):
    return excinfo.value.status


def test_error_bad_dimensions():
    cfg = small_config()
    cfg.head_dim = 0
    with pytest.raises(kvcache.KvcError) as e:
        kvcache.Pool(cfg)
    assert status_of(e) == kvcache.ERR_INVALID_ARGUMENT
    assert e.value.status_name == "KVC_ERR_INVALID_ARGUMENT"
    assert "head_dim" in e.value.message
    cfg.head_dim, cfg.num_q_heads = 64, 3  # not a multiple of num_kv_heads
    with pytest.raises(kvcache.KvcError) as e:
        kvcache.Pool(cfg)
    assert status_of(e) == kvcache.ERR_INVALID_ARGUMENT


def test_error_unknown_sequence():
    with kvcache.Pool(small_config()) as pool:
        with pytest.raises(kvcache.KvcError) as e:
            pool.seq_length(12345)
        assert status_of(e) == kvcache.ERR_SEQ_NOT_FOUND and "12345" in e.value.message
        with pytest.raises(kvcache.KvcError) as e:
            pool.seq_fork(1, 2)
        assert status_of(e) == kvcache.ERR_SEQ_NOT_FOUND
        pool.seq_create(1)
        with pytest.raises(kvcache.KvcError) as e:
            pool.seq_create(1)
        assert status_of(e) == kvcache.ERR_SEQ_EXISTS


def test_error_exhausted_pool_changes_nothing():
    with kvcache.Pool(small_config(blocks=8)) as pool:  # 8 blocks of 16 tokens for 2 layers
        pool.seq_create(1)
        pool.reserve(1, 48)  # 3 blocks per layer
        with pytest.raises(kvcache.KvcError) as e:
            pool.reserve(1, 32)  # 5 per layer: more than the pool has, never fits
        assert status_of(e) == kvcache.ERR_EXCEEDS_CAPACITY and e.value.message
        assert pool.seq_length(1) == 48 and pool.stats().blocks_used == 6
        pool.seq_create(2)
        pool.reserve(2, 16)
        with pytest.raises(kvcache.KvcError) as e:
            pool.reserve(1, 16)  # fits once sequence 2 is gone: not now
        assert status_of(e) == kvcache.ERR_POOL_EXHAUSTED and e.value.message
        assert pool.seq_length(1) == 48 and pool.stats().blocks_used == 8


def test_error_bad_buffers():
    with kvcache.Pool(small_config()) as pool:
        pool.seq_create(1)
        pool.reserve(1, 4)
        k = np.zeros((4, 2, 64), np.float32)
        with pytest.raises(kvcache.KvcError) as e:
            pool.append(1, 0, 0, k[:, :, :63].copy(), k[:, :, :63].copy())  # not whole token rows
        assert status_of(e) == kvcache.ERR_INVALID_ARGUMENT and "token rows" in e.value.message
        with pytest.raises(kvcache.KvcError) as e:
            pool.append(1, 0, 0, k, k[:2])
        assert status_of(e) == kvcache.ERR_INVALID_ARGUMENT
        with pytest.raises(kvcache.KvcError) as e:
            pool.append(1, 0, 2, k, k)  # positions 2..5: 4, 5 not reserved
        assert status_of(e) == kvcache.ERR_NOT_RESERVED
        with pytest.raises(kvcache.KvcError) as e:
            pool.append(1, 9, 0, k, k)
        assert status_of(e) == kvcache.ERR_OUT_OF_RANGE
        with pytest.raises(TypeError):
            pool.append(1, 0, 0, k.astype(np.int32), k.astype(np.int32))
        with pytest.raises(TypeError):
            pool.append(1, 0, 0, "not an array", k)
        bad = np.full((4, 2, 64), np.nan, np.float32)
        with kvcache.Pool(small_config(), kvcache.Codec(), kvcache.Codec()) as qpool:
            qpool.seq_create(1)
            qpool.reserve(1, 4)
            with pytest.raises(kvcache.KvcError) as e:
                qpool.append(1, 0, 0, bad, bad)
            assert status_of(e) == kvcache.ERR_NON_FINITE
        with pytest.raises(TypeError):
            pool.prefix_lookup(np.zeros(4, np.int64))
        with pytest.raises(kvcache.KvcError) as e:
            pool.prefix_lookup([1, 2, 3])  # prefix cache not enabled
        assert status_of(e) == kvcache.ERR_INVALID_ARGUMENT
        ro = np.zeros((4, 2, 64), np.float32)
        ro.flags.writeable = False
        with pytest.raises(TypeError):
            pool.gather_into(1, 0, 0, ro, None)
        # Nothing was written by the failed calls.
        got, _ = pool.gather(1, 0)
        np.testing.assert_array_equal(got, np.zeros((4, 2, 64), np.float32))


def test_closed_handles():
    pool = kvcache.Pool(small_config())
    pool.seq_create(1)
    pool.close()
    pool.close()  # idempotent
    assert pool.closed()
    with pytest.raises(kvcache.KvcError) as e:
        pool.seq_length(1)
    assert status_of(e) == kvcache.ERR_NULL_POINTER and "closed" in e.value.message
    pc = kvcache.PolicyConfig()
    pc.kind = kvcache.POLICY_STREAMING
    pc.recent_tokens = 4
    policy = kvcache.Policy(pc)
    policy.close()
    with kvcache.Pool(small_config()) as p2:
        p2.seq_create(1)
        with pytest.raises(kvcache.KvcError) as e:
            p2.evict(1, policy)
        assert "policy is closed" in e.value.message


# ---------------------------------------------------------------- DLPack and threads

class DLPackOnly:
    """Exposes only the DLPack protocol (like a tensor of another framework)."""

    def __init__(self, a):
        self._a = a

    def __dlpack__(self, **kw):
        return self._a.__dlpack__(**kw)

    def __dlpack_device__(self):
        return self._a.__dlpack_device__()


def test_dlpack_input():
    k = np.arange(3 * 2 * 64, dtype=np.float32).reshape(3, 2, 64) / 100
    with kvcache.Pool(small_config()) as pool:
        pool.seq_create(1)
        pool.reserve(1, 3)
        assert pool.append(1, 0, 0, DLPackOnly(k), DLPackOnly(k * 2)) == 3
        kg, vg = pool.gather(1, 0)
        np.testing.assert_array_equal(kg, k.astype(np.float16).astype(np.float32))
        np.testing.assert_array_equal(vg, (k * 2).astype(np.float16).astype(np.float32))


def test_torch_tensor_input():
    torch = pytest.importorskip("torch")
    k = torch.arange(2 * 2 * 64, dtype=torch.float32).reshape(2, 2, 64) / 100
    with kvcache.Pool(small_config()) as pool:
        pool.seq_create(1)
        pool.reserve(1, 2)
        pool.append(1, 0, 0, k, k)
        kg, _ = pool.gather(1, 0)
        np.testing.assert_array_equal(kg, k.numpy().astype(np.float16).astype(np.float32))


def test_error_message_is_per_call_across_threads():
    """Each thread's failure carries its own message (read inside the failing call)."""
    import threading
    with kvcache.Pool(small_config()) as pool:
        errors = {}

        def worker(i):
            msgs = set()
            for _ in range(200):
                try:
                    pool.seq_length(1000 + i)
                except kvcache.KvcError as e:
                    msgs.add(e.message)
            errors[i] = msgs

        threads = [threading.Thread(target=worker, args=(i,)) for i in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        for i in range(4):
            assert errors[i] == {"sequence %d does not exist" % (1000 + i)}


# ---------------------------------------------------------------- leaks

def rss_kib():
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    pytest.skip("no /proc/self/status")


def test_leak_10000_pools():
    cfg = small_config(blocks=4)

    def cycle(n):
        for i in range(n):
            if i % 2:
                with kvcache.Pool(cfg) as p:
                    p.seq_create(1)
            else:
                p = kvcache.Pool(cfg)  # dropped without close: the finalizer frees it
                p.seq_create(1)
                del p

    cycle(1000)
    gc.collect()
    before = rss_kib()
    cycle(10000)
    gc.collect()
    after = rss_kib()
    assert after - before < 4096, (before, after)


# ---------------------------------------------------------------- bad input (regressions)

def test_close_waits_for_calls_in_flight():
    """close() from one thread while others are inside calls: each call either
    completes or raises ERR_NULL_POINTER; no crash, one destroy."""
    import threading
    for _ in range(5):
        pool = kvcache.Pool(small_config(blocks=64))
        pool.seq_create(1)
        pool.reserve(1, 256)
        outcomes = []

        def reader():
            try:
                while True:
                    pool.gather(1, 0)
            except kvcache.KvcError as e:
                outcomes.append(e.status)

        threads = [threading.Thread(target=reader) for _ in range(3)]
        for t in threads:
            t.start()
        closers = [threading.Thread(target=pool.close) for _ in range(3)]
        for t in closers:
            t.start()
        for t in closers + threads:
            t.join()
        assert outcomes == [kvcache.ERR_NULL_POINTER] * 3


def test_sizes_checked_before_allocating():
    with kvcache.Pool(small_config()) as pool:
        pool.seq_create(1)
        pool.reserve(1, 4)
        for call in (lambda: pool.positions(1, 0, 0, 2 ** 31), lambda: pool.gather(1, 0, 0, 10 ** 12),
                     lambda: pool.gather(1, 0, 20), lambda: pool.positions(1, 0, 5, 0)):
            with pytest.raises(kvcache.KvcError) as e:
                call()
            assert status_of(e) == kvcache.ERR_OUT_OF_RANGE
    with pytest.raises(kvcache.KvcError) as e:
        kvcache.Int32Vector(2 ** 62)  # a C++ length_error: a status, not an abort
    assert status_of(e) == kvcache.ERR_OUT_OF_MEMORY
    codec = kvcache.Codec()
    with pytest.raises(kvcache.KvcError) as e:
        codec._quantize(np.zeros(8, np.float32), kvcache.DTYPE_F32, 2 ** 62, bytearray(8), bytearray(8), None)
    assert status_of(e) == kvcache.ERR_INVALID_ARGUMENT
    with pytest.raises(kvcache.KvcError) as e:
        codec.dequantize(np.zeros(8, np.uint8), None, None, 2 ** 40, 2 ** 24)
    assert status_of(e) == kvcache.ERR_OVERFLOW
    with pytest.raises(TypeError):
        codec.dequantize(None, None, None, 1, 8)


def test_explicit_dtype_must_match_the_array():
    with kvcache.Pool(small_config()) as pool:
        pool.seq_create(1)
        pool.reserve(1, 6)
        k = np.ones((3, 2, 64), np.float32)
        with pytest.raises(TypeError):
            pool.append(1, 0, 0, k, k, dtype=kvcache.DTYPE_F16)  # would be read as 6 f16 tokens
        with pytest.raises(TypeError):
            pool.append(1, 0, 0, k.astype(np.float64), k.astype(np.float64), dtype=kvcache.DTYPE_F32)
        bits = k.astype(np.float16).view(np.uint16)
        assert pool.append(1, 0, 0, bits, bits, dtype=kvcache.DTYPE_F16) == 3  # raw f16 bits are fine
        assert pool.append(1, 0, 3, k.tobytes(), k.tobytes(), dtype=kvcache.DTYPE_F32) == 3  # raw bytes
        got, _ = pool.gather(1, 0)
        np.testing.assert_array_equal(got, np.ones((6, 2, 64), np.float32))
        with pytest.raises(TypeError):
            pool.gather_into(1, 0, 0, np.zeros((4, 2, 64), np.float16), np.zeros((4, 2, 64), np.float32))
        kb = bytearray(6 * 2 * 64 * 4)
        assert pool.gather_into(1, 0, 0, kb, None, dtype=kvcache.DTYPE_F32) == 6
        np.testing.assert_array_equal(np.frombuffer(kb, np.float32), 1.0)


def test_python_side_argument_checks():
    cfg = small_config()
    with pytest.raises(AttributeError):
        cfg.num_block = 5  # a typo is an error, not an ignored setting
    with pytest.raises(AttributeError):
        cfg.k_codec = kvcache.Codec()  # codecs are Pool() arguments
    with kvcache.Pool(cfg) as pool:
        pool.seq_create(np.int64(5))  # numpy integers are integers
        assert pool.layer_tokens(np.uint64(5), np.int32(0)) == 0
        with pytest.raises(OverflowError):
            pool.seq_create(-1)
        with pytest.raises(TypeError):
            pool.seq_create(2.5)
        with pytest.raises(kvcache.KvcError) as e:
            pool.enable_prefix_cache(None, "model\0other")
        assert status_of(e) == kvcache.ERR_INVALID_ARGUMENT and "NUL" in e.value.message
        pc = kvcache.PrefixConfig()
        with pytest.raises(kvcache.KvcError):
            pc.set_seed(b"x" * 31)
        pc.set_seed(bytes(range(32)))
        assert pc.seed_set == 1
        pool.enable_prefix_cache(pc, model_id="m")
        toks = np.arange(40, dtype=np.int32)
        with pytest.raises(TypeError):
            pool.prefix_lookup(toks.astype(">i4"))  # big-endian ids are not read as native
        assert pool.prefix_lookup(np.arange(80, dtype=np.int32)[::2], salt="a").hit_tokens == 0  # strided: converted


# ---------------------------------------------------------------- save / restore

def test_save_and_restore_sequence(model, captured, tmp_path):
    ks, vs, _ = captured
    codec = kvcache.Codec()
    codec.dtype, codec.granularity, codec.group_size = kvcache.DTYPE_INT4, kvcache.SCALE_PER_GROUP, 8
    cfg = model_config(model)
    with kvcache.Pool(cfg, codec, codec) as a, kvcache.Pool(cfg, codec, codec) as b:
        fill(a, 1, ks, vs)
        rec = a.save(1)
        assert rec[:4] == b"KVCS" and len(rec) == a.save_size(1)
        b.restore(5, rec)
        path = str(tmp_path / "seq1.kvcs")
        a.save_file(1, path)
        b.restore_file(6, path)
        for layer in range(model.n_layers):
            want = a.gather(1, layer)
            for seq in (5, 6):
                got = b.gather(seq, layer)
                np.testing.assert_array_equal(got[0], want[0])
                np.testing.assert_array_equal(got[1], want[1])
        damaged = bytearray(rec)
        damaged[len(rec) // 2] ^= 1
        with pytest.raises(kvcache.KvcError) as e:
            b.restore(7, damaged)
        assert status_of(e) == kvcache.ERR_CORRUPT
    other = model_config(model, block_size=8)
    with kvcache.Pool(other) as c:
        with pytest.raises(kvcache.KvcError) as e:
            c.restore(1, rec)
        assert status_of(e) == kvcache.ERR_INCOMPATIBLE and "block_size" in e.value.message
        with pytest.raises(kvcache.KvcError) as e:
            c.restore_file(1, str(tmp_path / "missing.kvcs"))
        assert status_of(e) == kvcache.ERR_IO


def test_attention_decode_int8_query():
    """query_quant=QUERY_INT8: near the exact query's output on int8 keys (the same bytes where the CPU
    lacks AVX-512 VNNI), the exact bytes on f16 keys; QUERY_INT8_VALUES within 1e-3 of the output scale of
    QUERY_INT8 on int8 and int4 values (each weight within 2^-16 of the largest); an unknown mode raises with
    nothing written."""
    cfg = small_config()
    rng = np.random.default_rng(5)
    n = 40
    k = rng.standard_normal((n, cfg.num_kv_heads, cfg.head_dim)).astype(np.float32)
    v = rng.standard_normal((n, cfg.num_kv_heads, cfg.head_dim)).astype(np.float32)
    q = rng.standard_normal((1, cfg.num_q_heads, cfg.head_dim)).astype(np.float32)
    codec = kvcache.Codec()  # int8, per token
    full = kvcache.Codec()
    full.full_range = 1  # negative scales where a token's extreme is positive: signed weights
    int4 = kvcache.Codec()
    int4.dtype = kvcache.DTYPE_INT4  # int4 values: nibbles summed in integers too
    for codecs in ((codec, codec), (codec, full), (int4, int4), ()):
        with kvcache.Pool(cfg, *codecs) as pool:
            pool.seq_create(1)
            pool.reserve(1, n)
            pool.append(1, 0, 0, k, v)
            exact = pool.attention_decode(0, [1], q)
            fast = pool.attention_decode(0, [1], q, query_quant=kvcache.QUERY_INT8)
            both = pool.attention_decode(0, [1], q, query_quant=kvcache.QUERY_INT8_VALUES)
            assert exact.shape == fast.shape == both.shape == q.shape
            if codecs:
                assert np.max(np.abs(fast - exact)) < 0.05 * np.max(np.abs(exact)) + 1e-6
                assert np.max(np.abs(both - fast)) < 1e-3 * np.max(np.abs(exact)) + 1e-6
            else:
                assert np.array_equal(fast, exact) and np.array_equal(both, exact)
            out = np.full_like(q, 7.0)
            with pytest.raises(kvcache.KvcError) as e:
                pool.attention_decode(0, [1], q, out=out, query_quant=3)
            assert e.value.status == kvcache.ERR_INVALID_ARGUMENT and "query_quant 3" in str(e.value)
            assert np.all(out == 7.0)
