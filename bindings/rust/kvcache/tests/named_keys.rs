//! Named extra keys through the safe API (docs/prefix-cache.md): a pool
//! declares extra-key names and the `_named` methods take an [`ExtraKeys`]
//! builder, passed in the pool's declared order. Keys match the spec's test
//! vectors and do not depend on the declaration order; salt=x and adapter=x
//! never share a block; unknown names and bad declarations are refused; a
//! disk tier serves a block to a pool declaring the names in another order.

use kvcache::{
    Dtype, ExtraKeys, Poll, Pool, PoolConfig, PrefixConfig, Status, TierConfig, TierKind,
};
use std::fs;

const LAYERS: u32 = 2;
const KV_HEADS: u32 = 2;
const HEAD_DIM: u32 = 8;
const BLOCK: u32 = 16;
const ROW: usize = (KV_HEADS * HEAD_DIM) as usize;

fn named_pool(names: &[&str]) -> Pool {
    let cfg = PoolConfig::new(LAYERS, 4, KV_HEADS, HEAD_DIM)
        .block_size(BLOCK)
        .num_blocks(32)
        .k_dtype(Dtype::F32)
        .v_dtype(Dtype::F32);
    let pool = Pool::new(&cfg).unwrap();
    let mut seed = [0u8; 32];
    for (i, b) in seed.iter_mut().enumerate() {
        *b = 3 + i as u8;
    }
    let pc = PrefixConfig::new()
        .seed(seed)
        .model_id("named-model")
        .extra_key_names(names);
    pool.enable_prefix_cache(&pc).unwrap();
    pool
}

fn prompt(n: usize) -> Vec<i32> {
    (0..n).map(|i| ((i * 7919 + 11) % 32000) as i32).collect()
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

fn write(pool: &Pool, seq: u64, p: &[i32], keys: &ExtraKeys) -> Vec<Vec<f32>> {
    pool.seq_create(seq).unwrap();
    pool.seq_reserve(seq, p.len() as u64).unwrap();
    let kv: Vec<Vec<f32>> = (0..LAYERS)
        .map(|l| {
            (0..p.len() * ROW)
                .map(|j| ((j as u32 * 31 + l * 13) % 97) as f32 / 8.0)
                .collect()
        })
        .collect();
    for (l, k) in kv.iter().enumerate() {
        pool.append(seq, l as u32, 0, k, k).unwrap();
    }
    assert_eq!(
        pool.prefix_insert_named(seq, p, keys).unwrap(),
        (p.len() / BLOCK as usize) as u64
    );
    kv
}

#[test]
fn named_keys_spec_vectors() {
    let cfg = PoolConfig::new(1, 2, 2, 4)
        .block_size(4)
        .num_blocks(16)
        .k_dtype(Dtype::F32)
        .v_dtype(Dtype::F32);
    let pool = Pool::new(&cfg).unwrap();
    let pc = PrefixConfig::new()
        .seed([0; 32])
        .model_id("stories260K")
        .tokenizer_id("tok512")
        .extra_key_names(&["salt", "adapter"]);
    pool.enable_prefix_cache(&pc).unwrap();
    assert_eq!(pool.extra_key_names(), ["salt", "adapter"]);
    let toks: Vec<i32> = (10..18).collect();
    let k = pool
        .prefix_keys_named(
            &toks,
            &ExtraKeys::new().set("adapter", "lora-7").set("salt", "abc"),
        )
        .unwrap();
    assert_eq!(
        k.iter().map(|x| hex(x)).collect::<Vec<_>>(),
        [
            "4b39a455995209a14f0fc08fe5a3dded304a1a2290be2ab53f3c347aff3f6843",
            "7ec33c152d328c65c85f4917878cc9b696ea528441ffde46065b21b4a04e19cb"
        ]
    );
    let a = pool
        .prefix_keys_named(&toks, &ExtraKeys::new().set("adapter", b"abc"))
        .unwrap();
    assert_eq!(
        hex(&a[0]),
        "a56f4e5afbc3ed88b60f0b1b9a5693035b86800e3f7268c7929332a5cc32effa"
    );
    // The positional form of the same pool: one value per name, in order.
    assert_eq!(
        pool.prefix_keys(&toks, &[&b""[..], &b"abc"[..]]).unwrap(),
        a
    );
    let none = pool.prefix_keys_named(&toks, &ExtraKeys::new()).unwrap();
    assert_eq!(
        hex(&none[0]),
        "fb6ca8a8e2808f267ed596bf3760298379fb27898f5afb246bdda2ac6aa2fa0a"
    );
}

#[test]
fn named_keys_order_and_isolation() {
    let a = named_pool(&["salt", "adapter"]);
    let b = named_pool(&["adapter", "media", "salt"]);
    let legacy = named_pool(&[]);
    let toks = prompt(3 * BLOCK as usize);
    let both = ExtraKeys::new()
        .set("salt", "tenant-1")
        .set("adapter", "lora-7");
    let ka = a.prefix_keys_named(&toks, &both).unwrap();
    assert_eq!(ka.len(), 3);
    assert_eq!(
        b.prefix_keys_named(&toks, &both.clone().set("media", ""))
            .unwrap(),
        ka
    );
    assert_ne!(
        b.prefix_keys_named(&toks, &both.clone().set("media", "img"))
            .unwrap(),
        ka
    );
    let sx = a
        .prefix_keys_named(&toks, &ExtraKeys::new().set("salt", "x"))
        .unwrap();
    let ax = a
        .prefix_keys_named(&toks, &ExtraKeys::new().set("adapter", "x"))
        .unwrap();
    let lx = legacy.prefix_keys(&toks, &[&b"x"[..]]).unwrap();
    assert!(sx != ax && sx != lx && ax != lx);
    assert_eq!(
        a.prefix_keys_named(&toks, &ExtraKeys::new()).unwrap(),
        legacy.prefix_keys(&toks, &[]).unwrap()
    );

    let p = prompt(3 * BLOCK as usize + 1);
    let salt_x = ExtraKeys::new().set("salt", "x");
    write(&a, 1, &p, &salt_x);
    assert_eq!(
        a.prefix_lookup_named(&p, &salt_x, false)
            .unwrap()
            .hit_tokens,
        48
    );
    let m = a
        .prefix_lookup_named(&p, &ExtraKeys::new().set("adapter", "x"), true)
        .unwrap();
    assert_eq!((m.hit_tokens, m.partial_tokens), (0, 0));
    assert_eq!(
        a.prefix_attach_named(2, &p, &ExtraKeys::new().set("adapter", "x"), false)
            .unwrap()
            .hit_tokens,
        0
    );
    assert_eq!(
        a.prefix_attach_named(3, &p, &salt_x, false)
            .unwrap()
            .hit_tokens,
        48
    );
    assert_eq!(a.seq_length(3).unwrap(), 48);
}

#[test]
fn named_keys_unknown_names_and_bad_declarations() {
    let a = named_pool(&["salt", "adapter"]);
    let legacy = named_pool(&[]);
    let toks = prompt(20);
    let e = a
        .prefix_lookup_named(&toks, &ExtraKeys::new().set("tenant", "x"), false)
        .unwrap_err();
    assert_eq!(e.status, Status::InvalidArgument);
    assert!(
        e.message.contains("\"tenant\" is not declared"),
        "{}",
        e.message
    );
    let e = legacy
        .prefix_keys_named(&toks, &ExtraKeys::new().set("salt", "x"))
        .unwrap_err();
    assert_eq!(e.status, Status::InvalidArgument);
    assert_eq!(a.prefix_stats().unwrap().queried_tokens, 0); // nothing reached the library
                                                             // The library's own check of the count (positional calls on a named pool).
    let e = a.prefix_lookup(&toks, &[&b"x"[..]], false).unwrap_err();
    assert_eq!(e.status, Status::InvalidArgument);
    assert!(
        e.message.contains("2 extra-key names (salt, adapter)"),
        "{}",
        e.message
    );

    let cfg = PoolConfig::new(1, 1, 1, 4).block_size(4).num_blocks(8);
    let pool = Pool::new(&cfg).unwrap();
    let long = "n".repeat(65);
    for names in [
        &["salt", "salt"][..],
        &["salt", ""],
        &[long.as_str()],
        &["a\0b"],
    ] {
        let e = pool
            .enable_prefix_cache(&PrefixConfig::new().extra_key_names(names))
            .unwrap_err();
        assert_eq!(e.status, Status::InvalidArgument, "{names:?}");
        assert!(pool.extra_key_names().is_empty());
    }
    assert_eq!(
        pool.prefix_stats().unwrap_err().status,
        Status::InvalidArgument
    ); // still off
}

#[test]
fn named_keys_disk_tier() {
    let dir = std::env::temp_dir().join(format!("kvc-named-rs-{}", std::process::id()));
    let _ = fs::remove_dir_all(&dir);
    fs::create_dir_all(&dir).unwrap();
    let disk = TierConfig::new(TierKind::Disk)
        .capacity_bytes(1 << 24)
        .path(dir.to_str().unwrap());
    let p = prompt(3 * BLOCK as usize + 1);
    let keys = ExtraKeys::new()
        .set("salt", "tenant-1")
        .set("adapter", "lora-7");
    let kv;
    {
        let w = named_pool(&["salt", "adapter"]);
        w.add_tier(&disk).unwrap();
        kv = write(&w, 1, &p, &keys);
        assert_eq!(w.prefix_offload_named(&p, &keys).unwrap(), 3);
        w.flush_tiers().unwrap();
    }
    let r = named_pool(&["media", "adapter", "salt"]);
    r.add_tier(&disk).unwrap();
    let swapped = ExtraKeys::new()
        .set("salt", "lora-7")
        .set("adapter", "tenant-1");
    assert_eq!(
        r.prefix_lookup_named(&p, &swapped, false)
            .unwrap()
            .tier_tokens,
        0
    );
    assert_eq!(r.prefix_load_named(&p, &swapped).unwrap(), 0);
    let pinned = r.prefix_lookup_pinned_named(&p, &keys, false).unwrap();
    assert_eq!(pinned.tier_tokens, 48);
    r.prefix_unpin(pinned.pin).unwrap();
    let ticket = r.prefix_prefetch_named(&p, &keys).unwrap();
    loop {
        match r.prefix_poll(ticket).unwrap() {
            Poll::Pending => std::thread::yield_now(),
            Poll::Done(n) => {
                assert_eq!(n, 48);
                break;
            }
        }
    }
    assert_eq!(
        r.prefix_attach_named(2, &p, &keys, false)
            .unwrap()
            .hit_tokens,
        48
    );
    for (l, k) in kv.iter().enumerate() {
        let g = r.gather::<f32>(2, l as u32, 0, 48).unwrap();
        assert_eq!(g.k, k[..48 * ROW]);
        assert_eq!(g.v, k[..48 * ROW]);
    }
    drop(r);
    let _ = fs::remove_dir_all(&dir);
}
