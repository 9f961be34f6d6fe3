//! Offload tiers through the safe API (docs/tiers.md): a host and a disk tier,
//! a prompt offloaded, reclaimed from the pool, found by lookup, loaded back
//! (synchronously and by prefetch + poll) and compared exactly; pins; per-tier
//! counters; a prefetch that times out; bad input.

use kvcache::{Dtype, Poll, Pool, PoolConfig, PrefixConfig, Status, TierConfig, TierKind};
use std::fs;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::thread::sleep;
use std::time::{Duration, Instant};

const LAYERS: u32 = 2;
const KV_HEADS: u32 = 2;
const HEAD_DIM: u32 = 8;
const BLOCK: u32 = 16;
const ROW: usize = (KV_HEADS * HEAD_DIM) as usize;

/// A temporary directory, removed on drop.
struct TempDir(PathBuf);

impl TempDir {
    fn new(name: &str) -> TempDir {
        let p = std::env::temp_dir().join(format!("kvc-tier-rs-{}-{}", name, std::process::id()));
        let _ = fs::remove_dir_all(&p);
        fs::create_dir_all(&p).unwrap();
        TempDir(p)
    }
    fn path(&self) -> &Path {
        &self.0
    }
    fn str(&self) -> &str {
        self.0.to_str().unwrap()
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = fs::remove_dir_all(&self.0);
    }
}

/// 2 layers, 2 KV heads of 8, blocks of 16, f32 storage (exact), 16 blocks;
/// the prefix cache with a fixed seed.
fn tier_pool() -> Pool {
    let cfg = PoolConfig::new(LAYERS, 4, KV_HEADS, HEAD_DIM)
        .block_size(BLOCK)
        .num_blocks(16)
        .k_dtype(Dtype::F32)
        .v_dtype(Dtype::F32);
    let pool = Pool::new(&cfg).unwrap();
    let mut seed = [0u8; 32];
    for (i, b) in seed.iter_mut().enumerate() {
        *b = 7 + i as u8;
    }
    pool.enable_prefix_cache(&PrefixConfig::new().seed(seed).model_id("tier-model"))
        .unwrap();
    pool
}

fn prompt(n: usize) -> Vec<i32> {
    (0..n).map(|i| ((i * 7919 + 11) % 32000) as i32).collect()
}

/// Creates seq with deterministic K/V for the prompt and registers it; returns (k, v) per layer.
fn write(pool: &Pool, seq: u64, prompt: &[i32], seed: u32) -> Vec<(Vec<f32>, Vec<f32>)> {
    let n = prompt.len();
    pool.seq_create(seq).unwrap();
    pool.seq_reserve(seq, n as u64).unwrap();
    let kv: Vec<(Vec<f32>, Vec<f32>)> = (0..LAYERS)
        .map(|l| {
            let f = |part: u32| -> Vec<f32> {
                (0..n * ROW)
                    .map(|j| ((j as u32 * 31 + l * 13 + part * 5 + seed) % 97) as f32 / 8.0 - 6.0)
                    .collect()
            };
            (f(0), f(1))
        })
        .collect();
    for (l, (k, v)) in kv.iter().enumerate() {
        pool.append(seq, l as u32, 0, k, v).unwrap();
    }
    assert_eq!(
        pool.prefix_insert(seq, prompt, &[]).unwrap(),
        (n / BLOCK as usize) as u64
    );
    kv
}

/// Fills every free and reclaimable block with other sequences (ids from
/// `first`), so the pool reclaims its cached prefix blocks; returns the next id.
fn squeeze(pool: &Pool, first: u64) -> u64 {
    let garbage = vec![-1.0f32; BLOCK as usize * ROW];
    let mut id = first;
    loop {
        let s = pool.stats().unwrap();
        if s.blocks_free + s.blocks_cached < LAYERS as u64 {
            return id;
        }
        pool.seq_create(id).unwrap();
        pool.seq_reserve(id, BLOCK as u64).unwrap();
        for l in 0..LAYERS {
            pool.append(id, l, 0, &garbage, &garbage).unwrap();
        }
        id += 1;
    }
}

fn free_range(pool: &Pool, first: u64, end: u64) {
    for id in first..end {
        pool.seq_free(id).unwrap();
    }
}

/// The first n tokens of seq are exactly the K/V written.
fn assert_holds(pool: &Pool, seq: u64, kv: &[(Vec<f32>, Vec<f32>)], n: usize) {
    assert_eq!(pool.seq_length(seq).unwrap(), n as u64);
    for (l, (k, v)) in kv.iter().enumerate() {
        let g = pool.gather::<f32>(seq, l as u32, 0, n).unwrap();
        assert_eq!(g.k, k[..n * ROW], "layer {l} K");
        assert_eq!(g.v, v[..n * ROW], "layer {l} V");
    }
}

fn status<T: std::fmt::Debug>(r: kvcache::Result<T>) -> Status {
    r.expect_err("the call must fail").status
}

#[test]
fn offload_load_prefetch_pin() {
    let dir = TempDir::new("main");
    let p = prompt(3 * BLOCK as usize + 1); // 3 whole blocks usable
    let disk = TierConfig::new(TierKind::Disk)
        .capacity_bytes(1 << 24)
        .path(dir.str());
    let kv;
    {
        let pool = tier_pool();
        let host = TierConfig::new(TierKind::Host).capacity_bytes(1 << 20);
        assert_eq!(pool.add_tier(&host).unwrap(), 0);
        assert_eq!(pool.add_tier(&disk).unwrap(), 1);
        pool.set_offload(64, 10000).unwrap();
        kv = write(&pool, 1, &p, 3);

        // Offloaded while still in the pool: write-through to both tiers.
        assert_eq!(pool.prefix_offload(&p, &[]).unwrap(), 3);
        pool.flush_tiers().unwrap();
        for (i, kind) in [(0, TierKind::Host), (1, TierKind::Disk)] {
            let s = pool.tier_stats(i).unwrap();
            assert_eq!(s.kind, Some(kind));
            assert_eq!(
                (s.demotions, s.entries, s.hits, s.promotions, s.errors),
                (3, 3, 0, 0, 0)
            );
            assert_eq!(s.last_error, "");
        }
        assert_eq!(fs::read_dir(dir.path()).unwrap().count(), 3);

        // The pool's copy reclaimed.
        pool.seq_free(1).unwrap();
        let end = squeeze(&pool, 100);
        pool.flush_tiers().unwrap();
        assert_eq!(pool.prefix_stats().unwrap().registered_blocks, 0);
        free_range(&pool, 100, end);

        let r = pool.prefix_lookup(&p, &[], false).unwrap();
        assert_eq!((r.hit_tokens, r.tier_tokens, r.pin), (0, 48, 0));
        assert_eq!(pool.prefix_load(&p, &[]).unwrap(), 48);
        assert_eq!(
            pool.prefix_attach(2, &p, &[], false).unwrap().hit_tokens,
            48
        );
        assert_holds(&pool, 2, &kv, 48);
        let (s0, s1) = (pool.tier_stats(0).unwrap(), pool.tier_stats(1).unwrap());
        assert_eq!((s0.hits, s0.promotions, s0.misses), (3, 3, 0));
        assert_eq!((s1.hits, s1.promotions), (0, 0));

        // Again by prefetch + poll.
        pool.seq_free(2).unwrap();
        let end = squeeze(&pool, 200);
        pool.flush_tiers().unwrap();
        free_range(&pool, 200, end);
        let ticket = pool.prefix_prefetch(&p, &[]).unwrap();
        assert_ne!(ticket, 0);
        let deadline = Instant::now() + Duration::from_secs(10);
        let loaded = loop {
            match pool.prefix_poll(ticket).unwrap() {
                Poll::Done(n) => break n,
                Poll::Pending => {
                    assert!(Instant::now() < deadline, "still pending after 10 s");
                    sleep(Duration::from_millis(1));
                }
            }
        };
        assert_eq!(loaded, 48);
        assert_eq!(status(pool.prefix_poll(ticket)), Status::InvalidArgument); // reported once
        pool.prefix_attach(3, &p, &[], false).unwrap();
        assert_holds(&pool, 3, &kv, 48);
        let s0 = pool.tier_stats(0).unwrap();
        assert_eq!((s0.hits, s0.promotions), (6, 6));

        // Pins, released once.
        pool.seq_free(3).unwrap();
        let end = squeeze(&pool, 300);
        pool.flush_tiers().unwrap();
        let r = pool.prefix_lookup_pinned(&p, &[], false).unwrap();
        assert_eq!(r.tier_tokens, 48);
        assert_ne!(r.pin, 0);
        assert_eq!(pool.tier_stats(0).unwrap().pinned, 3);
        pool.prefix_unpin(r.pin).unwrap();
        assert_eq!(pool.tier_stats(0).unwrap().pinned, 0);
        assert_eq!(status(pool.prefix_unpin(r.pin)), Status::InvalidArgument);
        assert_eq!(status(pool.prefix_unpin(0)), Status::InvalidArgument);
        free_range(&pool, 300, end);
    }
    // A new pool with the same seed and model finds the blocks on disk.
    let pool = tier_pool();
    assert_eq!(pool.add_tier(&disk).unwrap(), 0);
    assert_eq!(pool.prefix_lookup(&p, &[], false).unwrap().tier_tokens, 48);
    assert_eq!(pool.prefix_load(&p, &[]).unwrap(), 48);
    pool.prefix_attach(1, &p, &[], false).unwrap();
    assert_holds(&pool, 1, &kv, 48);
    let s = pool.tier_stats(0).unwrap();
    assert_eq!((s.hits, s.promotions, s.demotions, s.entries), (3, 3, 0, 3));
}

/// Opens each FIFO for writing without blocking and closes it (EOF for the
/// reader blocked on it); returns how many had a reader.
fn release(fifos: &[PathBuf]) -> usize {
    const O_NONBLOCK: i32 = 0o4000; // Linux
    let mut released = 0;
    let deadline = Instant::now() + Duration::from_secs(10);
    while released == 0 && Instant::now() < deadline {
        for f in fifos {
            if fs::OpenOptions::new()
                .write(true)
                .custom_flags(O_NONBLOCK)
                .open(f)
                .is_ok()
            {
                released += 1;
            }
        }
        sleep(Duration::from_millis(10));
    }
    released
}

/// A disk record that never answers (a FIFO nobody writes): the prefetch
/// times out (Status::Timeout from prefix_poll); released, the record is
/// refused and last_error says why.
#[test]
fn prefetch_timeout() {
    let dir = TempDir::new("timeout");
    let p = prompt(2 * BLOCK as usize + 1);
    let disk = TierConfig::new(TierKind::Disk)
        .capacity_bytes(1 << 24)
        .path(dir.str());
    {
        let pool = tier_pool();
        pool.add_tier(&disk).unwrap();
        write(&pool, 1, &p, 5);
        assert_eq!(pool.prefix_offload(&p, &[]).unwrap(), 2);
        pool.flush_tiers().unwrap();
    }
    let names: Vec<PathBuf> = fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    assert_eq!(names.len(), 2);
    let pool = tier_pool();
    pool.add_tier(&disk).unwrap();
    pool.set_offload(16, 200).unwrap();
    for f in &names {
        fs::remove_file(f).unwrap();
        let ok = std::process::Command::new("mkfifo")
            .arg(f)
            .status()
            .unwrap();
        assert!(ok.success());
    }
    assert_eq!(pool.prefix_lookup(&p, &[], false).unwrap().tier_tokens, 32);
    let ticket = pool.prefix_prefetch(&p, &[]).unwrap();
    sleep(Duration::from_millis(500));
    let polled = pool.prefix_poll(ticket);
    let released = release(&names); // before any assert: the loader must not stay blocked
    assert_eq!(status(polled), Status::Timeout);
    assert_eq!(released, 1);
    let deadline = Instant::now() + Duration::from_secs(10);
    while pool.tier_stats(0).unwrap().errors == 0 && Instant::now() < deadline {
        sleep(Duration::from_millis(10));
    }
    let s = pool.tier_stats(0).unwrap();
    assert_eq!((s.errors, s.hits, s.promotions), (1, 0, 0));
    assert!(s.last_error.contains("cannot be read"), "{}", s.last_error);
    assert_eq!(pool.stats().unwrap().blocks_used, 0);
}

#[test]
fn bad_input() {
    let pool = tier_pool();
    let host = TierConfig::new(TierKind::Host);
    assert_eq!(status(pool.add_tier(&host)), Status::InvalidArgument); // capacity 0
    let no_path = TierConfig::new(TierKind::Disk).capacity_bytes(1 << 20);
    assert_eq!(status(pool.add_tier(&no_path)), Status::InvalidArgument);
    assert_eq!(status(pool.set_offload(4, 100)), Status::InvalidArgument); // no tier yet
    assert_eq!(status(pool.tier_stats(0)), Status::OutOfRange);
    assert_eq!(
        status(pool.prefix_load(&[1, 2, 3, 4, 5], &[])),
        Status::InvalidArgument
    );
    assert_eq!(pool.add_tier(&host.capacity_bytes(1 << 20)).unwrap(), 0);
    assert_eq!(status(pool.set_offload(0, 100)), Status::InvalidArgument);
    assert_eq!(status(pool.set_offload(4, 0)), Status::InvalidArgument);
    assert_eq!(status(pool.prefix_poll(12345)), Status::InvalidArgument);
    let ticket = pool.prefix_prefetch(&[1, 2, 3, 4, 5], &[]).unwrap(); // nothing to load: done at once
    assert_eq!(pool.prefix_poll(ticket).unwrap(), Poll::Done(0));
    assert_eq!(status(pool.tier_stats(1)), Status::OutOfRange);
    // A pool without the prefix cache takes no tier.
    let plain = Pool::new(&PoolConfig::new(1, 1, 1, 8).num_blocks(4)).unwrap();
    let host = TierConfig::new(TierKind::Host).capacity_bytes(1 << 20);
    assert_eq!(status(plain.add_tier(&host)), Status::InvalidArgument);
    assert_eq!(Status::Timeout.code(), 22);
    assert_eq!(Status::Pending.name(), "KVC_ERR_PENDING");
}
