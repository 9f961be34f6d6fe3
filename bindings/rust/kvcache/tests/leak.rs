//! Creating and dropping pools leaves the process's memory flat (its own test
//! binary, so no other test allocates meanwhile).

use kvcache::{Pool, PoolConfig};

/// Resident set size of this process in KiB (Linux /proc).
fn rss_kib() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").expect("/proc/self/status");
    status
        .lines()
        .find_map(|line| line.strip_prefix("VmRSS:"))
        .and_then(|rest| rest.trim().trim_end_matches("kB").trim().parse().ok())
        .expect("VmRSS line")
}

/// One pool used a little (so its block memory is touched), then dropped.
fn cycle(config: &PoolConfig, k: &[f32]) {
    let pool = Pool::new(config).expect("pool");
    pool.seq_create(1).unwrap();
    pool.seq_reserve(1, 16).unwrap();
    for layer in 0..pool.num_layers() {
        pool.append(1, layer, 0, k, k).unwrap();
    }
}

#[test]
fn ten_thousand_pools_leave_rss_flat() {
    // 2 layers, 2 KV heads of 64, f16: 8 KiB blocks, 8 of them per pool.
    let config = PoolConfig::new(2, 4, 2, 64).num_blocks(8);
    let k: Vec<f32> = (0..16 * 2 * 64).map(|i| (i % 97) as f32 / 97.0).collect();
    for _ in 0..500 {
        cycle(&config, &k); // warm-up: allocator arenas, lazy initialisation
    }
    let before = rss_kib();
    for _ in 0..10_000 {
        cycle(&config, &k);
    }
    let after = rss_kib();
    eprintln!("VmRSS {before} KiB -> {after} KiB over 10,000 pools");
    let slack_kib = 4 * 1024;
    assert!(
        after <= before + slack_kib,
        "VmRSS grew from {before} KiB to {after} KiB over 10,000 pools (slack {slack_kib} KiB)"
    );
}
