//! The C API's promises through the safe crate (issue 26): slots reserved
//! but not written read as zeros, never as a freed sequence's bytes; a
//! request that never fits is `ExceedsCapacity`, not `PoolExhausted`.

use kvcache::{Dtype, Pool, PoolConfig, Status};

const LAYERS: u32 = 2;
const ROW: usize = 2 * 8;

fn pool(num_blocks: u64) -> Pool {
    let cfg = PoolConfig::new(LAYERS, 4, 2, 8)
        .block_size(4)
        .k_dtype(Dtype::F32)
        .v_dtype(Dtype::F32)
        .num_blocks(num_blocks);
    Pool::new(&cfg).expect("pool")
}

#[test]
fn unwritten_read_returns_zeros() {
    let p = pool(8);
    p.seq_create(9).unwrap();
    p.seq_reserve(9, 16).unwrap();
    let old = vec![7.5f32; 16 * ROW];
    for layer in 0..LAYERS {
        p.append(9, layer, 0, &old, &old).unwrap();
    }
    p.seq_free(9).unwrap();
    p.seq_create(1).unwrap();
    p.seq_reserve(1, 3).unwrap();
    let mine = vec![2.0f32; ROW];
    p.append(1, 0, 1, &mine, &mine).unwrap();
    let g = p.gather::<f32>(1, 0, 0, 3).unwrap();
    for i in 0..3 * ROW {
        let want = if i / ROW == 1 { 2.0 } else { 0.0 };
        assert_eq!(g.k[i], want, "k[{i}]");
        assert_eq!(g.v[i], want, "v[{i}]");
    }
    let g1 = p.gather::<f32>(1, 1, 0, 3).unwrap();
    assert!(g1.k.iter().chain(g1.v.iter()).all(|&x| x == 0.0));
}

#[test]
fn exceeds_capacity_is_not_exhausted() {
    let p = pool(8);
    p.seq_create(1).unwrap();
    let e = p.seq_reserve(1, 17).unwrap_err();
    assert_eq!(e.status, Status::ExceedsCapacity, "{e}");
    p.seq_create(2).unwrap();
    p.seq_reserve(2, 4).unwrap();
    let e = p.seq_reserve(1, 16).unwrap_err();
    assert_eq!(e.status, Status::PoolExhausted, "{e}");
}
