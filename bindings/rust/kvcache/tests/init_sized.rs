//! ctest abi_init_rust: the crates initialise the C structs with
//! `kvc_<thing>_init_sized`, never past the caller's struct
//! (docs/abi-policy.md). A caller buffer of an older header's size, followed
//! by guard bytes, is initialised through `init_sized_bytes` (the call the
//! safe types make with `size_of::<T>()`): the guard bytes stay, struct_size
//! is the caller's size; sizes inside a field are refused and write nothing.

use kvcache::{init_sized_bytes, sys, SizedStruct, Status};
use std::mem::size_of;

const GUARD: usize = 64;
const G: u8 = 0xa5;

/// 8-byte aligned bytes (what a C struct needs).
#[repr(C, align(8))]
struct Buf([u8; 512]);

fn guarded() -> Buf {
    Buf([G; 512])
}

fn struct_size(b: &Buf) -> usize {
    usize::from_ne_bytes(b.0[..8].try_into().unwrap())
}

fn u32_at(b: &Buf, off: usize) -> u32 {
    u32::from_ne_bytes(b.0[off..off + 4].try_into().unwrap())
}

/// One struct: its 0.3 size, older callers' sizes, a size inside a field
/// (0: none), a covered u32 default (offset, value).
struct Case {
    size03: usize,
    older: &'static [usize],
    inside: usize,
    default: Option<(usize, u32)>,
}

fn check<T: SizedStruct>(c: Case) {
    assert!(size_of::<T>() >= c.size03, "{}", T::NAME);
    // Older callers: the guard bytes stay, struct_size is theirs.
    for &size in c.older {
        let mut b = guarded();
        init_sized_bytes::<T>(&mut b.0, size).unwrap();
        assert_eq!(struct_size(&b), size, "{}", T::NAME);
        assert!(
            b.0[size..].iter().all(|&x| x == G),
            "{}: an init of {size} bytes wrote past them",
            T::NAME
        );
        assert!(b.0[8..size].iter().all(|&x| x != G), "{}", T::NAME);
        if let Some((off, value)) = c.default {
            if off + 4 <= size {
                assert_eq!(u32_at(&b, off), value, "{} default at {off}", T::NAME);
            }
        }
    }
    // Refused sizes write nothing.
    let mut refused = vec![0, 8, c.older[0] - 8];
    if c.inside != 0 {
        refused.push(c.inside);
    }
    for size in refused {
        let mut b = guarded();
        let e = init_sized_bytes::<T>(&mut b.0, size).unwrap_err();
        assert_eq!(e.status, Status::StructSize, "{} {size}: {e}", T::NAME);
        if c.inside != 0 && size == c.inside {
            assert!(e.message.contains("inside field"), "{e}");
        }
        assert!(b.0.iter().all(|&x| x == G), "{}", T::NAME);
    }
    // The crate's own checks: a short buffer, a misaligned one.
    let mut b = guarded();
    let e = init_sized_bytes::<T>(&mut b.0[..c.size03 - 8], c.size03).unwrap_err();
    assert_eq!(e.status, Status::BufferTooSmall);
    let e = init_sized_bytes::<T>(&mut b.0[1..], c.size03).unwrap_err();
    assert_eq!(e.status, Status::InvalidArgument);
    assert!(b.0.iter().all(|&x| x == G));
    // A newer caller's struct: the unknown tail zeroed, nothing after it.
    let size = size_of::<T>() + 24;
    init_sized_bytes::<T>(&mut b.0, size).unwrap();
    assert_eq!(struct_size(&b), size);
    assert!(b.0[size_of::<T>()..size].iter().all(|&x| x == 0));
    assert!(b.0[size..size + GUARD].iter().all(|&x| x == G));
}

#[test]
fn init_sized_every_struct() {
    check::<sys::kvc_pool_config>(Case {
        size03: 136,
        older: &[48, 72, 112, 136],
        inside: 76,
        default: Some((24, 16)), // block_size
    });
    check::<sys::kvc_codec>(Case {
        size03: 56,
        older: &[48, 52, 56],
        inside: 50,
        default: Some((16, 32)), // group_size
    });
    check::<sys::kvc_stats>(Case {
        size03: 128,
        older: &[48, 96, 128],
        inside: 52,
        default: None,
    });
    check::<sys::kvc_pool_layout>(Case {
        size03: 240,
        older: &[120, 128, 240],
        inside: 122,
        default: None,
    });
    check::<sys::kvc_quant_sizes>(Case {
        size03: 40,
        older: &[40],
        inside: 0,
        default: None,
    });
    check::<sys::kvc_attention_params>(Case {
        size03: 40,
        older: &[40],
        inside: 0,
        default: None,
    });
    check::<sys::kvc_policy_config>(Case {
        size03: 88,
        older: &[88],
        inside: 0,
        default: Some((12, 4)), // sink_tokens
    });
    check::<sys::kvc_prefix_config>(Case {
        size03: 72,
        older: &[72],
        inside: 0,
        default: Some((12, 1)), // verify_tokens
    });
    check::<sys::kvc_prefix_stats>(Case {
        size03: 80,
        older: &[80],
        inside: 0,
        default: None,
    });
    check::<sys::kvc_tier_config>(Case {
        size03: 56,
        older: &[56],
        inside: 0,
        default: Some((40, 1000)), // timeout_ms
    });
    check::<sys::kvc_tier_stats>(Case {
        size03: 352,
        older: &[352],
        inside: 0,
        default: None,
    });
}

/// The safe types' own structs carry this crate's size (init_sized with
/// size_of::<T>()), and the library accepts them.
#[test]
fn safe_types_use_their_own_size() {
    let layout = {
        let pool = kvcache::Pool::new(&kvcache::PoolConfig::new(1, 2, 2, 8).num_blocks(4)).unwrap();
        pool.layout().unwrap()
    };
    assert_eq!(layout.struct_size, size_of::<sys::kvc_pool_layout>());
    assert_eq!(layout.num_blocks, 4);
}
