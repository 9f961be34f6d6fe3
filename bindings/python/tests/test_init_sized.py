"""ctest abi_init_python: the binding initialises structs with
kvc_<thing>_init_sized, never past the caller's struct (docs/abi-policy.md).

Each config and result class has init_sized(buffer, struct_size), the call
its constructor makes with the binding's own size. A caller buffer of an
older header's size, followed by guard bytes, is initialised through it: the
guard bytes stay, struct_size is the caller's size, the covered defaults are
set; sizes that end inside a field are refused and write nothing."""

import numpy as np
import pytest

import kvcache

GUARD = 64
G = 0xA5

# class, sizeof in 0.3, sizes of older callers (field boundaries), a size
# that ends inside a field (or None), a covered default (offset, value of a
# uint32 field) or None.
CASES = [
    (kvcache.PoolConfig, 136, [48, 72, 112, 136], 76, (24, 16)),  # block_size 16
    (kvcache.Codec, 56, [48, 52, 56], 50, (16, 32)),  # group_size 32
    (kvcache.PolicyConfig, 88, [88], None, (12, 4)),  # sink_tokens 4
    (kvcache.PrefixConfig, 72, [72], None, (12, 1)),  # verify_tokens 1
    (kvcache.Stats, 128, [48, 96, 128], 52, None),
    (kvcache.PrefixStats, 80, [80], None, None),
    (kvcache.QuantSizes, 40, [40], None, None),
    (kvcache.TierConfig, 56, [56], None, (40, 1000)),  # timeout_ms 1000
    (kvcache.TierStats, 352, [352], None, None),
]
IDS = [c[0].__name__ for c in CASES]
# sizeof of the structs that grew after 0.3 (0.4: kvc_prefix_config's extra_key_names, n_extra_key_names;
# kvc_policy_config's future_positions; kvc_codec's reserved0, outliers).
GROWN = {kvcache.PrefixConfig: 88, kvcache.PolicyConfig: 120, kvcache.Codec: 64, kvcache.PoolConfig: 152}


def buffer(n):
    """n guard bytes, 8-byte aligned (numpy aligns its allocations)."""
    b = np.full(n, G, np.uint8)
    assert b.ctypes.data % 8 == 0
    return b


def struct_size(b):
    return int.from_bytes(b[:8].tobytes(), "little")


def u32(b, off):
    return int.from_bytes(b[off:off + 4].tobytes(), "little")


@pytest.mark.parametrize("cls,size03,older,inside,default", CASES, ids=IDS)
def test_older_caller_guard_bytes(cls, size03, older, inside, default):
    # The binding's own struct: the constructor's init_sized with its sizeof.
    # (structs grown since 0.3 are larger: PrefixConfig's extra-key names)
    assert cls().struct_size == GROWN.get(cls, size03)
    for size in older:
        b = buffer(size + GUARD)
        cls.init_sized(b, size)
        assert struct_size(b) == size
        assert (b[size:] == G).all(), f"{cls.__name__}: init of {size} bytes wrote past them"
        assert (b[8:size] != G).all()  # every covered byte written (defaults, zeros)
        if default is not None and default[0] + 4 <= size:
            assert u32(b, default[0]) == default[1]


@pytest.mark.parametrize("cls,size03,older,inside,default", CASES, ids=IDS)
def test_refused_sizes_write_nothing(cls, size03, older, inside, default):
    sizes = [0, 8, min(older) - 8]
    if inside is not None:
        sizes.append(inside)
    for size in sizes:
        b = buffer(size03 + GUARD)
        with pytest.raises(kvcache.KvcError) as e:
            cls.init_sized(b, size)
        assert e.value.status == kvcache.ERR_STRUCT_SIZE
        assert (b == G).all()
        if size == inside:
            assert "inside field" in e.value.message
    # The binding's own checks: a buffer shorter than struct_size, one not
    # 8-byte aligned.
    b = buffer(size03 + GUARD)
    with pytest.raises(kvcache.KvcError) as e:
        cls.init_sized(b[:size03 - 8], size03)
    assert e.value.status == kvcache.ERR_BUFFER_TOO_SMALL
    with pytest.raises(kvcache.KvcError) as e:
        cls.init_sized(b[1:], size03)
    assert e.value.status == kvcache.ERR_INVALID_ARGUMENT
    assert (b == G).all()


@pytest.mark.parametrize("cls,size03,older,inside,default", CASES, ids=IDS)
def test_newer_caller_tail_zeroed(cls, size03, older, inside, default):
    size = size03 + 40  # a newer header's struct, 5 fields more
    b = buffer(size + GUARD)
    cls.init_sized(b, size)
    assert struct_size(b) == size
    known = GROWN.get(cls, size03)  # the library's own fields are filled (defaults), the rest zeroed
    if cls is kvcache.PolicyConfig:
        assert int(b[88:92].view(np.uint32)[0]) == 512  # future_positions
        assert float(b[96:104].view(np.float64)[0]) == 0.2  # head_floor
        assert float(b[116:120].view(np.float32)[0]) == 0.5  # gate_threshold
    assert (b[known:size] == 0).all()
    assert (b[size:] == G).all()


def test_tier_config_kind():
    b = buffer(56 + GUARD)
    kvcache.TierConfig.init_sized(b, 56, kvcache.TIER_DISK)
    assert u32(b, 8) == kvcache.TIER_DISK
    with pytest.raises(kvcache.KvcError) as e:
        kvcache.TierConfig.init_sized(buffer(64), 56, 9)
    assert e.value.status == kvcache.ERR_INVALID_ARGUMENT
