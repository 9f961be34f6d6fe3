"""kvcache.Store (kvc_store_*): a tier by itself, addressed by str or bytes keys."""
import os
import tempfile

import numpy as np
import pytest

import kvcache


def test_host_round_trip_and_types():
    with kvcache.Store.host(1 << 20, scope="model-a") as s:
        a = np.arange(64, dtype=np.float32)
        s.put("page-0", a)
        s.put(b"\x00\x01", b"raw bytes")
        s.put("strided", np.arange(20, dtype=np.int16)[::2])  # copied to contiguous
        assert np.array_equal(np.frombuffer(s.get("page-0"), np.float32), a)
        assert s.get(b"\x00\x01") == b"raw bytes"
        assert np.array_equal(np.frombuffer(s.get("strided"), np.int16), np.arange(0, 20, 2))
        assert s.get("absent") is None
        out = np.zeros(64, np.float32)
        assert s.get_into("page-0", out) == 256 and np.array_equal(out, a)
        small = bytearray(4)
        assert s.get_into("page-0", small) == 256 and small == bytearray(4)  # too small: untouched
        assert s.get_into("absent", small) == -1
        assert s.contains(["page-0", "absent", b"\x00\x01"]) == [True, False, True]
        assert s.contains([]) == []
        assert "page-0" in s and "x" not in s
        # A long value through get()'s retry with a larger buffer.
        big = os.urandom(200000)
        s.put("big", big)
        assert s.get("big", size_hint=16) == big
        st = s.stats()
        assert st.kind == kvcache.TIER_HOST and st.entries == 4 and st.errors == 0


def test_scopes_and_disk_reopen():
    with tempfile.TemporaryDirectory() as d:
        with kvcache.Store.disk(d, 1 << 20, scope="a") as s:
            s.put("k", b"value-a")
        with kvcache.Store.disk(d, 1 << 20, scope="b") as t:
            assert t.get("k") is None
            t.put("k", b"value-b")
        with kvcache.Store.disk(d, 1 << 20, scope="a") as s:
            assert s.get("k") == b"value-a"
            assert s.remove("k") and not s.remove("k")
            assert s.get("k") is None
        with kvcache.Store.disk(d, 1 << 20, scope="b") as t:
            assert t.get("k") == b"value-b"


def test_pins():
    s = kvcache.Store.host(3 * 1040, scope="x")
    v = bytes(1000)
    s.put("a", v)
    s.put("b", v)
    assert s.pin("a") and not s.pin("zz")
    s.put("c", v)
    s.put("d", v)  # evicts b, not the pinned a
    assert s.get("a") == v and s.get("b") is None
    assert s.stats().pinned == 1
    assert s.unpin("a") and not s.unpin("a")
    s.close()


def test_errors():
    s = kvcache.Store.host(4096)
    with pytest.raises(ValueError):
        s.put("", b"x")
    with pytest.raises(TypeError):
        s.put(3, b"x")
    with pytest.raises(TypeError):
        s.put("k", [1, 2, 3])
    with pytest.raises(kvcache.KvcError) as e:
        s.put("k" * 5000, b"x")
    assert e.value.status == kvcache.ERR_INVALID_ARGUMENT
    with pytest.raises(kvcache.KvcError) as e:
        s.put("k", bytes(10000))  # larger than the store
    assert e.value.status == kvcache.ERR_EXCEEDS_CAPACITY
    with pytest.raises(ValueError):
        s.get_into("k", np.zeros((4, 4), np.float32)[:, ::2])  # not contiguous
    with pytest.raises(kvcache.KvcError):
        kvcache.Store.host(0)  # a host store needs a capacity
    with pytest.raises(kvcache.KvcError):
        kvcache.Store.redis("no-port")
    with pytest.raises(kvcache.KvcError):
        kvcache.Store.host(4096, scope="s" * 5000)
    s.close()
    s.close()  # idempotent
    with pytest.raises(kvcache.KvcError) as e:
        s.put("k", b"x")
    assert e.value.status == kvcache.ERR_NULL_POINTER
