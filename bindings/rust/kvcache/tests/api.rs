//! The safe API against the library, with a model-shaped cache: 2 layers,
//! 4 query heads, 2 KV heads, head_dim 64, blocks of 16 tokens, f16 storage,
//! f32 input of deterministic pseudo-random values.

use kvcache::sys;
use kvcache::{
    codebook_gaussian, convert_vec, last_error_message, AttentionParams, Codec, Dtype, Error,
    Granularity, Policy, PolicyConfig, Pool, PoolConfig, PrefixConfig, QueryQuant, RopeStyle,
    Status, F16,
};

const LAYERS: u32 = 2;
const Q_HEADS: u32 = 4;
const KV_HEADS: u32 = 2;
const HEAD_DIM: u32 = 64;
const BLOCK: u32 = 16;
/// Values of one token's K (or V) row in one layer.
const ROW: usize = (KV_HEADS * HEAD_DIM) as usize;

/// xorshift64*: the same values on every run and machine.
struct Rng(u64);

impl Rng {
    fn new(seed: u64) -> Rng {
        Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1)
    }
    /// Uniform in [-1, 1).
    fn next_f32(&mut self) -> f32 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        let bits = self.0.wrapping_mul(0x2545_F491_4F6C_DD1D) >> 40; // 24 bits
        bits as f32 / (1u32 << 23) as f32 - 1.0
    }
    fn values(&mut self, n: usize, amplitude: f32) -> Vec<f32> {
        (0..n).map(|_| self.next_f32() * amplitude).collect()
    }
}

fn model_config() -> PoolConfig {
    PoolConfig::new(LAYERS, Q_HEADS, KV_HEADS, HEAD_DIM)
        .block_size(BLOCK)
        .k_dtype(Dtype::F16)
        .v_dtype(Dtype::F16)
}

fn model_pool(num_blocks: u64) -> Pool {
    Pool::new(&model_config().num_blocks(num_blocks)).expect("pool")
}

/// K and V of one layer: `[n][KV_HEADS][HEAD_DIM]` each.
struct LayerKv {
    k: Vec<f32>,
    v: Vec<f32>,
}

/// Reserve `n` tokens of `seq` and append pseudo-random K/V at `pos` in every layer.
fn append_tokens(pool: &Pool, seq: u64, pos: u64, n: usize, rng: &mut Rng) -> Vec<LayerKv> {
    pool.seq_reserve(seq, n as u64).expect("reserve");
    (0..LAYERS)
        .map(|layer| {
            let kv = LayerKv {
                k: rng.values(n * ROW, 2.0),
                v: rng.values(n * ROW, 2.0),
            };
            pool.append(seq, layer, pos, &kv.k, &kv.v).expect("append");
            kv
        })
        .collect()
}

/// `got` is `want` rounded to f16: within half an f16 ulp (subnormals: 2^-25).
fn assert_f16_rounded(got: &[f32], want: &[f32], what: &str) {
    assert_eq!(got.len(), want.len(), "{what}: lengths");
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        let tolerance = (w.abs() * 2f32.powi(-11)).max(2f32.powi(-25));
        assert!(
            (g - w).abs() <= tolerance,
            "{what}[{i}]: got {g}, want {w} (tolerance {tolerance})"
        );
    }
}

fn rows(values: &[f32], first: usize, n: usize) -> &[f32] {
    &values[first * ROW..(first + n) * ROW]
}

#[test]
fn version_matches_the_header() {
    assert_eq!(kvcache::version(), sys::KVC_VERSION_NUMBER);
    assert!(kvcache::version_string().starts_with(&format!("{}.", sys::KVC_VERSION_MAJOR)));
}

#[test]
fn append_fork_and_gather_round_trip() {
    let pool = model_pool(64);
    assert_eq!((pool.num_layers(), pool.row_len()), (LAYERS, ROW));
    let mut rng = Rng::new(1);
    pool.seq_create(1).unwrap();
    let prompt = append_tokens(&pool, 1, 0, 20, &mut rng);
    assert_eq!(pool.seq_length(1).unwrap(), 20);
    assert_eq!(pool.stats().unwrap().blocks_used, 2 * LAYERS as u64);

    // The child shares both blocks of every layer.
    pool.seq_fork(1, 2).unwrap();
    let stats = pool.stats().unwrap();
    assert_eq!((stats.blocks_used, stats.blocks_shared), (4, 4));

    // One more token each: the shared, partly filled last block is copied.
    let child_next = append_tokens(&pool, 2, 20, 1, &mut rng);
    let parent_next = append_tokens(&pool, 1, 20, 1, &mut rng);
    let stats = pool.stats().unwrap();
    assert_eq!((stats.blocks_used, stats.blocks_shared), (6, 2));
    for layer in 0..LAYERS {
        let (parent_table, child_table) = (
            pool.block_table(1, layer).unwrap(),
            pool.block_table(2, layer).unwrap(),
        );
        assert_eq!(parent_table.len(), 2);
        assert_eq!(parent_table[0], child_table[0], "first block still shared");
        assert_ne!(
            parent_table[1], child_table[1],
            "last block copied on write"
        );
    }

    for (seq, next) in [(1u64, &parent_next), (2, &child_next)] {
        for layer in 0..LAYERS as usize {
            let got = pool.gather::<f32>(seq, layer as u32, 0, 21).unwrap();
            assert_eq!(got.positions, (0..21).collect::<Vec<i32>>());
            let what = format!("seq {seq} layer {layer}");
            assert_f16_rounded(rows(&got.k, 0, 20), &prompt[layer].k, &format!("{what} k"));
            assert_f16_rounded(rows(&got.v, 0, 20), &prompt[layer].v, &format!("{what} v"));
            assert_f16_rounded(
                rows(&got.k, 20, 1),
                &next[layer].k,
                &format!("{what} new k"),
            );
            assert_f16_rounded(
                rows(&got.v, 20, 1),
                &next[layer].v,
                &format!("{what} new v"),
            );

            // Read as f16: exactly the library's own f32 -> f16 conversion.
            let got16 = pool.gather::<F16>(seq, layer as u32, 0, 20).unwrap();
            assert_eq!(got16.k, convert_vec::<f32, F16>(&prompt[layer].k).unwrap());
            assert_eq!(got16.v, convert_vec::<f32, F16>(&prompt[layer].v).unwrap());
        }
    }

    pool.seq_free(2).unwrap();
    pool.seq_free(1).unwrap();
    let stats = pool.stats().unwrap();
    assert_eq!((stats.blocks_used, stats.num_sequences), (0, 0));
}

#[test]
fn streaming_eviction_keeps_sinks_and_window() {
    let pool = model_pool(64);
    let mut rng = Rng::new(2);
    pool.seq_create(7).unwrap();
    let kv = append_tokens(&pool, 7, 0, 40, &mut rng);
    assert_eq!(pool.stats().unwrap().blocks_used, 3 * LAYERS as u64);

    let (sinks, window) = (4usize, 8usize);
    let policy = Policy::new(&PolicyConfig::streaming(sinks as u32, window as u32)).unwrap();
    let dropped = pool.evict(7, Some(&policy)).unwrap();
    assert_eq!(dropped, vec![28; LAYERS as usize]);
    assert_eq!(
        pool.seq_length(7).unwrap(),
        40,
        "the length does not change"
    );
    assert_eq!(
        pool.stats().unwrap().blocks_used,
        LAYERS as u64,
        "12 survivors fit one block per layer"
    );

    let mut expected_positions: Vec<i32> = (0..sinks as i32).collect();
    expected_positions.extend(40 - window as i32..40);
    for layer in 0..LAYERS {
        assert_eq!(pool.seq_layer_tokens(7, layer).unwrap(), 12);
        let got = pool.gather::<f32>(7, layer, 0, 12).unwrap();
        assert_eq!(got.positions, expected_positions);
        for (i, &pos) in expected_positions.iter().enumerate() {
            let what = format!("layer {layer} survivor {i} (position {pos})");
            assert_f16_rounded(
                rows(&got.k, i, 1),
                rows(&kv[layer as usize].k, pos as usize, 1),
                &what,
            );
            assert_f16_rounded(
                rows(&got.v, i, 1),
                rows(&kv[layer as usize].v, pos as usize, 1),
                &what,
            );
        }
    }
    // Reading beyond the survivors is refused.
    assert_eq!(
        pool.gather::<f32>(7, 0, 0, 13).unwrap_err().status,
        Status::OutOfRange
    );
}

#[test]
fn prefix_cache_finds_an_inserted_prompt() {
    let pool = model_pool(64);
    pool.enable_prefix_cache(&PrefixConfig::new().model_id("test-model"))
        .unwrap();
    let mut rng = Rng::new(3);
    let prompt: Vec<i32> = (0..40).map(|i| 1000 + 7 * i).collect();
    pool.seq_create(1).unwrap();
    append_tokens(&pool, 1, 0, prompt.len(), &mut rng);
    assert_eq!(
        pool.prefix_insert(1, &prompt, &[]).unwrap(),
        2,
        "two full blocks"
    );

    let hit = pool.prefix_lookup(&prompt, &[], false).unwrap();
    assert_eq!(
        (hit.hit_tokens, hit.hit_blocks, hit.partial_tokens),
        (32, 2, 0)
    );
    let mut changed = prompt.clone();
    changed[20] += 1;
    assert_eq!(
        pool.prefix_lookup(&changed, &[], false).unwrap().hit_tokens,
        16
    );
    assert_eq!(
        pool.prefix_lookup(&prompt, &[b"tenant-b"], false)
            .unwrap()
            .hit_tokens,
        0,
        "extras change keys"
    );
    assert_eq!(
        pool.prefix_lookup(&prompt[..32], &[], false)
            .unwrap()
            .hit_tokens,
        16,
        "last token is computed"
    );

    let attached = pool.prefix_attach(2, &prompt, &[], false).unwrap();
    assert_eq!(attached.hit_tokens, 32);
    assert_eq!(pool.seq_length(2).unwrap(), 32);
    for layer in 0..LAYERS {
        let (a, b) = (
            pool.gather::<f32>(1, layer, 0, 32).unwrap(),
            pool.gather::<f32>(2, layer, 0, 32).unwrap(),
        );
        assert_eq!(a, b);
    }
    let stats = pool.prefix_stats().unwrap();
    assert_eq!((stats.registered_blocks, stats.referenced_blocks), (2, 2));
    let keys = pool.prefix_keys(&prompt, &[]).unwrap();
    assert_eq!(keys.len(), 2);
    assert!(keys.iter().all(|k| k.len() == 32), "SHA-256 keys");
}

#[test]
fn full_range_codec_follows_the_q4_0_rule() {
    // The value of largest magnitude, 6, maps to -8: scale -0.75; -6 clamps to 7.
    let src: Vec<f32> = vec![6.0, -5.0, 1.0, -6.0, 0.375, 3.0, -0.75, 2.25];
    let codec = Codec::new(Dtype::Int4)
        .granularity(Granularity::PerToken)
        .full_range(true);
    let q = codec.quantize(&src, 8).unwrap();
    assert_eq!(q.scales, (-0.75f32).to_le_bytes().to_vec());
    assert_eq!(q.codes, vec![0xF0, 0xF7, 0x48, 0x59]);
    let back: Vec<f32> = codec.dequantize(&q).unwrap();
    assert_eq!(back, vec![6.0, -5.25, 0.75, -5.25, 0.0, 3.0, -0.75, 2.25]);
    let err = codec.asymmetric(true).quantize(&src, 8).unwrap_err();
    assert_eq!(err.status, Status::InvalidArgument);
}

#[test]
fn quantizer_matches_the_raw_call_and_its_error_bound() {
    let (n, d, group) = (8usize, ROW, 32usize);
    let src = Rng::new(4).values(n * d, 3.0);
    let codec = Codec::new(Dtype::Int4)
        .granularity(Granularity::PerGroup)
        .group_size(group as u32);
    let q = codec.quantize(&src, d).unwrap();
    assert_eq!(q.codes.len(), n * d / 2, "two int4 codes per byte");
    assert_eq!(
        q.scales.len(),
        n * (d / group) * 4,
        "one f32 scale per group"
    );
    assert!(q.zeros.is_empty());

    // The same through kvcache-sys directly, with a codec built there.
    // SAFETY: every pointer is valid for the sizes kvc_quantize_sizes reports.
    let (codes, scales) = unsafe {
        let mut raw: sys::kvc_codec = std::mem::zeroed();
        assert_eq!(sys::kvc_codec_init(&mut raw), sys::kvc_status::KVC_OK);
        raw.dtype = sys::kvc_dtype::KVC_DTYPE_INT4;
        raw.granularity = sys::kvc_granularity::KVC_SCALE_PER_GROUP;
        raw.group_size = group as u32;
        let mut sizes: sys::kvc_quant_sizes = std::mem::zeroed();
        assert_eq!(
            sys::kvc_quant_sizes_init(&mut sizes),
            sys::kvc_status::KVC_OK
        );
        assert_eq!(
            sys::kvc_quantize_sizes(&raw, n as u64, d as u64, &mut sizes),
            sys::kvc_status::KVC_OK
        );
        let mut codes = vec![0u8; sizes.codes_bytes as usize];
        let mut scales = vec![0u8; sizes.scales_bytes as usize];
        let status = sys::kvc_quantize(
            &raw,
            src.as_ptr().cast(),
            sys::kvc_dtype::KVC_DTYPE_F32,
            n as u64,
            d as u64,
            codes.as_mut_ptr().cast(),
            scales.as_mut_ptr().cast(),
            std::ptr::null_mut(),
        );
        assert_eq!(status, sys::kvc_status::KVC_OK);
        (codes, scales)
    };
    assert_eq!(q.codes, codes);
    assert_eq!(q.scales, scales);

    // Error bound: half a step (the group's stored scale), plus f32 rounding.
    let back: Vec<f32> = codec.dequantize(&q).unwrap();
    for (g, chunk) in src.chunks(group).enumerate() {
        let scale = f32::from_le_bytes(q.scales[4 * g..4 * g + 4].try_into().unwrap());
        let absmax = chunk.iter().fold(0f32, |m, x| m.max(x.abs()));
        assert!(
            scale >= absmax / 7.0 * (1.0 - 1e-6),
            "group {g}: scale {scale} clips absmax {absmax}"
        );
        for (i, x) in chunk.iter().enumerate() {
            let y = back[g * group + i];
            let bound = scale / 2.0 * (1.0 + 1e-5) + x.abs() * 1e-6;
            assert!(
                (x - y).abs() <= bound,
                "group {g} value {i}: {x} -> {y}, bound {bound}"
            );
        }
    }
    // And the slice API refuses short buffers before calling C.
    let mut out = vec![0f32; n * d];
    let err = codec
        .dequantize_into(&q.codes[1..], &q.scales, &[], d, &mut out)
        .unwrap_err();
    assert_eq!(err.status, Status::BufferTooSmall);
}

/// The error carries the status and the message the library reported for
/// this very call (nothing else ran on this thread in between).
fn assert_library_error(err: &Error, status: Status, mentions: &str) {
    assert_eq!(err.status, status, "{err}");
    assert!(!err.message.is_empty(), "{status}: empty message");
    assert_eq!(
        err.message,
        last_error_message(),
        "message read right after the call"
    );
    assert!(
        err.message.contains(mentions),
        "{err:?} should mention {mentions:?}"
    );
    let shown = err.to_string();
    assert!(
        shown.starts_with(status.name()) && shown.contains(&err.message),
        "{shown}"
    );
}

#[test]
fn bad_dimensions_are_an_invalid_argument() {
    let err = Pool::new(&PoolConfig::new(LAYERS, Q_HEADS, KV_HEADS, 0).num_blocks(8)).unwrap_err();
    assert_library_error(&err, Status::InvalidArgument, "head_dim");
    let err = Pool::new(&PoolConfig::new(LAYERS, 4, 3, HEAD_DIM).num_blocks(8)).unwrap_err();
    assert_library_error(&err, Status::InvalidArgument, "num_q_heads");
    let err = Pool::new(&model_config()).unwrap_err();
    assert_eq!(err.status, Status::InvalidArgument, "no capacity: {err}");
}

#[test]
fn unknown_sequences_are_not_found() {
    let pool = model_pool(8);
    assert_library_error(
        &pool.seq_length(999).unwrap_err(),
        Status::SeqNotFound,
        "999",
    );
    assert_library_error(
        &pool.seq_fork(999, 1000).unwrap_err(),
        Status::SeqNotFound,
        "999",
    );
    assert_library_error(
        &pool.gather::<f32>(999, 0, 0, 1).unwrap_err(),
        Status::SeqNotFound,
        "999",
    );
    pool.seq_create(1).unwrap();
    assert_library_error(&pool.seq_create(1).unwrap_err(), Status::SeqExists, "1");
    pool.seq_free(1).unwrap();
    assert_library_error(&pool.seq_free(1).unwrap_err(), Status::SeqNotFound, "1");
}

#[test]
fn an_exhausted_pool_changes_nothing() {
    let pool = model_pool(4); // two blocks per layer: 32 tokens
    pool.seq_create(1).unwrap();
    // 40 tokens never fit (three blocks per layer); 32 fit but not while
    // another sequence holds blocks.
    let err = pool.seq_reserve(1, 40).unwrap_err();
    assert_library_error(&err, Status::ExceedsCapacity, "has 4 in all");
    assert_eq!(pool.seq_length(1).unwrap(), 0);
    assert_eq!(pool.stats().unwrap().blocks_free, 4);
    pool.seq_create(2).unwrap();
    pool.seq_reserve(2, 1).unwrap();
    assert_library_error(
        &pool.seq_reserve(1, 32).unwrap_err(),
        Status::PoolExhausted,
        "available",
    );
    assert_eq!(pool.seq_length(1).unwrap(), 0);
    pool.seq_free(2).unwrap();
    pool.seq_reserve(1, 32).unwrap();
    assert_library_error(
        &pool.seq_reserve(1, 1).unwrap_err(),
        Status::ExceedsCapacity,
        "",
    );
    assert_eq!(pool.seq_length(1).unwrap(), 32);
}

#[test]
fn slices_of_the_wrong_shape_are_refused_before_the_call() {
    let pool = model_pool(8);
    pool.seq_create(1).unwrap();
    pool.seq_reserve(1, 1).unwrap();
    let half = vec![0f32; ROW / 2];
    let err = pool.append(1, 0, 0, &half, &half).unwrap_err();
    assert_eq!(err.status, Status::InvalidArgument);
    assert!(err.message.contains("num_kv_heads x head_dim"), "{err}");
    let (k, v) = (vec![0f32; ROW], vec![0f32; 2 * ROW]);
    assert_eq!(
        pool.append(1, 0, 0, &k, &v).unwrap_err().status,
        Status::InvalidArgument
    );
}

#[test]
fn status_codes_and_names() {
    for code in 1..=17i32 {
        let status = Status::from_raw(sys::kvc_status(code)).unwrap();
        assert!(!matches!(status, Status::Other(_)), "code {code} is named");
        assert_eq!(status.code(), code);
        assert!(status.name().starts_with("KVC_ERR_"), "{}", status.name());
    }
    assert_eq!(Status::PoolExhausted.name(), "KVC_ERR_POOL_EXHAUSTED");
    assert_eq!(Status::PoolExhausted.code(), 7);
    assert_eq!(Status::from_raw(sys::kvc_status::KVC_OK), None);
    assert_eq!(
        Status::from_raw(sys::kvc_status(999)),
        Some(Status::Other(999))
    );
    assert_eq!(Status::Other(999).name(), "KVC_ERR_UNKNOWN");
    // Every C enum is a signed 32-bit newtype (each has a FORCE_SIGNED
    // member): a negative code is representable, as in C.
    let signed: [i32; 4] = [
        sys::kvc_status::KVC_OK.0,
        sys::kvc_prefix_event_kind::KVC_PREFIX_STORED.0,
        sys::kvc_dtype::KVC_DTYPE_F32.0,
        sys::kvc_tier_kind::KVC_TIER_HOST.0,
    ];
    assert_eq!(signed, [0, 0, 0, 0]);
    assert_eq!(
        Status::from_raw(sys::kvc_status(-1)),
        Some(Status::Other(-1))
    );
    assert_eq!(Status::Other(-1).name(), "KVC_ERR_UNKNOWN");
}

#[test]
fn decode_attention_matches_a_direct_softmax() {
    let pool = model_pool(16);
    let mut rng = Rng::new(5);
    pool.seq_create(3).unwrap();
    let n = 20usize;
    append_tokens(&pool, 3, 0, n, &mut rng);
    let layer = 1;
    let cached = pool.gather::<f32>(3, layer, 0, n).unwrap(); // the stored (f16) values
    let hd = HEAD_DIM as usize;
    let q = rng.values(Q_HEADS as usize * hd, 1.0);
    let mut out = vec![0f32; q.len()];
    let mut lse = vec![0f32; Q_HEADS as usize];
    pool.attention_decode(
        layer,
        &[3],
        &q,
        &mut out,
        Some(&mut lse),
        &AttentionParams::default(),
    )
    .unwrap();

    let group = (Q_HEADS / KV_HEADS) as usize;
    for h in 0..Q_HEADS as usize {
        let kv_head = h / group;
        let qh = &q[h * hd..(h + 1) * hd];
        let scores: Vec<f32> = (0..n)
            .map(|t| {
                let k = &cached.k[t * ROW + kv_head * hd..][..hd];
                qh.iter().zip(k).map(|(a, b)| a * b).sum::<f32>() / (hd as f32).sqrt()
            })
            .collect();
        let max = scores.iter().cloned().fold(f32::MIN, f32::max);
        let weights: Vec<f32> = scores.iter().map(|s| (s - max).exp()).collect();
        let sum: f32 = weights.iter().sum();
        assert!((lse[h] - (max + sum.ln())).abs() < 1e-4, "head {h} lse");
        for i in 0..hd {
            let want: f32 = (0..n)
                .map(|t| weights[t] * cached.v[t * ROW + kv_head * hd + i])
                .sum::<f32>()
                / sum;
            let got = out[h * hd + i];
            assert!(
                (got - want).abs() < 1e-4,
                "head {h} dim {i}: {got} vs {want}"
            );
        }
    }
    // An int8 query applies to integer keys only: over these f16 keys, the same bytes.
    let mut out8 = vec![0f32; q.len()];
    let params = AttentionParams {
        query_quant: QueryQuant::Int8,
        ..AttentionParams::default()
    };
    pool.attention_decode(layer, &[3], &q, &mut out8, None, &params)
        .unwrap();
    assert_eq!(out8, out);
}

#[test]
fn a_pool_is_shared_between_threads() {
    fn send_and_sync<T: Send + Sync>() {}
    send_and_sync::<Pool>();
    send_and_sync::<Policy>();

    let pool = model_pool(32);
    std::thread::scope(|scope| {
        for seq in 0..4u64 {
            let pool = &pool;
            scope.spawn(move || {
                let mut rng = Rng::new(100 + seq);
                pool.seq_create(seq).unwrap();
                let kv = append_tokens(pool, seq, 0, 24, &mut rng);
                for layer in 0..LAYERS {
                    let got = pool.gather::<f32>(seq, layer, 0, 24).unwrap();
                    assert_f16_rounded(&got.k, &kv[layer as usize].k, "threaded k");
                }
            });
        }
    });
    assert_eq!(pool.stats().unwrap().num_sequences, 4);
}

#[test]
fn save_and_restore_round_trip() {
    let config = PoolConfig::new(2, 4, 2, 64).block_size(16).num_blocks(64);
    let a = Pool::new(&config).unwrap();
    let b = Pool::new(&config).unwrap();
    let row = a.row_len();
    a.seq_create(1).unwrap();
    a.seq_reserve(1, 21).unwrap();
    let k: Vec<f32> = (0..21 * row).map(|i| (i % 97) as f32 / 97.0).collect();
    for layer in 0..2 {
        a.append(1, layer, 0, &k, &k).unwrap();
    }
    let rec = a.seq_save(1).unwrap();
    assert_eq!(&rec[..4], b"KVCS");
    b.seq_restore(3, &rec).unwrap();
    for layer in 0..2 {
        let x = a.gather::<f32>(1, layer, 0, 21).unwrap();
        let y = b.gather::<f32>(3, layer, 0, 21).unwrap();
        assert_eq!(x.k, y.k);
        assert_eq!(x.v, y.v);
    }
    let mut bad = rec.clone();
    let mid = bad.len() / 2;
    bad[mid] ^= 1;
    assert_eq!(b.seq_restore(4, &bad).unwrap_err().status, Status::Corrupt);
    let other = Pool::new(&PoolConfig::new(2, 4, 2, 32).block_size(16).num_blocks(64)).unwrap();
    let err = other.seq_restore(1, &rec).unwrap_err();
    assert_eq!(err.status, Status::Incompatible);
    assert!(err.message.contains("head_dim"), "{}", err.message);
}

#[test]
fn pre_rope_keys_need_rope_and_read_back_post_rope() {
    // Keys that are one row before RoPE (interleaved pairs, theta 10000):
    // per-channel int4 codes over 16 tokens hold them exactly (f32 staging).
    let (hd, heads) = (8usize, 2usize);
    let key = |pos: u64| -> Vec<f32> {
        let mut row = vec![0f32; heads * hd];
        for h in 0..heads {
            for i in 0..hd / 2 {
                let (b0, b1) = (0.5 + 0.3 * (h * hd + i) as f64, -1.0 + 0.2 * i as f64);
                let a = pos as f64 * 10000f64.powf(-2.0 * i as f64 / hd as f64);
                row[h * hd + 2 * i] = (b0 * a.cos() - b1 * a.sin()) as f32;
                row[h * hd + 2 * i + 1] = (b0 * a.sin() + b1 * a.cos()) as f32;
            }
        }
        row
    };
    let codec = Codec::new(Dtype::Int4)
        .granularity(Granularity::PerChannel)
        .group_size(16)
        .asymmetric(true);
    let base = PoolConfig::new(1, 4, heads as u32, hd as u32)
        .block_size(16)
        .num_blocks(8)
        .residual_window(0, Dtype::F32)
        .k_codec(codec)
        .pre_rope_keys(true);
    let err = Pool::new(&base).unwrap_err();
    assert_eq!(
        err.status,
        Status::InvalidArgument,
        "needs the RoPE settings"
    );
    let pool = Pool::new(&base.rope(RopeStyle::Interleaved, 0, 10000.0)).unwrap();
    pool.seq_create(1).unwrap();
    for pos in 0..32u64 {
        pool.seq_reserve(1, 1).unwrap();
        let k = key(pos);
        pool.append(1, 0, pos, &k, &k).unwrap();
    }
    let k = pool.gather::<f32>(1, 0, 0, 32).unwrap().k;
    for pos in 0..32u64 {
        let want = key(pos);
        for e in 0..heads * hd {
            let got = k[pos as usize * heads * hd + e];
            assert!(
                (got - want[e]).abs() < 2e-6,
                "pos {pos} elem {e}: {got} vs {}",
                want[e]
            );
        }
    }
}

/// Per-channel key smoothing (`Pool::set_key_smoothing`): an int8 key whose
/// channels are `offset + scale x u` reads back within a step of its own
/// channel's scale; a pool holding a sequence refuses a new smoothing.
#[test]
fn key_smoothing_rescales_channels() {
    let n = 8usize;
    let codec = Codec::new(Dtype::Int8);
    let cfg = model_config().num_blocks(16).k_codec(codec);
    let pool = Pool::new(&cfg).unwrap();
    let total = LAYERS as usize * ROW;
    let scale: Vec<f32> = (0..total).map(|i| if i % 9 == 0 { 50.0 } else { 0.01 }).collect();
    let offset: Vec<f32> = (0..total).map(|i| (i % 4) as f32 - 1.5).collect();
    assert_eq!(
        pool.set_key_smoothing(&scale, Some(&offset[..3])).unwrap_err().status,
        Status::InvalidArgument
    );
    pool.set_key_smoothing(&scale, Some(&offset)).unwrap();
    let mut rng = Rng::new(77);
    let k: Vec<f32> = (0..n * ROW)
        .map(|i| offset[i % ROW] + scale[i % ROW] * rng.next_f32())
        .collect();
    pool.seq_create(1).unwrap();
    pool.seq_reserve(1, n as u64).unwrap();
    pool.append(1, 0, 0, &k, &k).unwrap();
    let got = pool.gather::<f32>(1, 0, 0, n).unwrap().k;
    for i in 0..n * ROW {
        // |y| <= 1 per channel: int8 steps of 1 / 127, half a step of the channel's scale.
        let tol = scale[i % ROW] / 254.0 * 1.001 + 1e-6;
        assert!((got[i] - k[i]).abs() <= tol, "key {i}: {} vs {}", got[i], k[i]);
    }
    assert_eq!(
        pool.set_key_smoothing(&scale, None).unwrap_err().status,
        Status::InvalidArgument
    );
}

/// Codec outliers (`Codec::outliers`): a spike per head no longer stretches
/// the other values' step in a pool; the standalone quantizer refuses them.
#[test]
fn codec_outliers_keep_the_other_values_step() {
    let n = 8usize;
    let mut rng = Rng::new(91);
    let mut k = rng.values(n * ROW, 1.0);
    for i in 0..n * KV_HEADS as usize {
        k[i * HEAD_DIM as usize + 5] = 40.0;
    }
    let mut errs = [0f32; 2];
    for (j, outl) in [0u32, 2].iter().enumerate() {
        let codec = Codec::new(Dtype::Int4)
            .granularity(Granularity::PerToken)
            .outliers(*outl);
        let pool = Pool::new(&model_config().num_blocks(16).k_codec(codec)).unwrap();
        pool.seq_create(1).unwrap();
        pool.seq_reserve(1, n as u64).unwrap();
        pool.append(1, 0, 0, &k, &k).unwrap();
        let got = pool.gather::<f32>(1, 0, 0, n).unwrap().k;
        for i in 0..n * ROW {
            if i % HEAD_DIM as usize != 5 {
                errs[j] = errs[j].max((got[i] - k[i]).abs());
            }
        }
    }
    assert!(errs[1] * 5.0 < errs[0], "{errs:?}");
    let c = Codec::new(Dtype::Int4)
        .granularity(Granularity::PerToken)
        .outliers(1);
    assert_eq!(c.sizes(2, 64).unwrap_err().status, Status::Unsupported);
}

/// The codebook rule for one group: each value's code is the level nearest to
/// `x / e` (`e` the group's signed extreme), the scale keeps the group's L2 norm.
fn codebook_group(x: &[f32], lv: &[f32]) -> Vec<f32> {
    let (mut e, mut a) = (0f32, 0f32);
    for &xi in x {
        if xi.abs() > a {
            a = xi.abs();
            e = xi;
        }
    }
    let inv = if e != 0.0 { 1.0 / e } else { 0.0 };
    let code: Vec<usize> = x
        .iter()
        .map(|&xi| {
            let y = xi * inv;
            (0..lv.len() - 1)
                .filter(|&i| y > (lv[i] + lv[i + 1]) * 0.5)
                .count()
        })
        .collect();
    let xx: f64 = x.iter().map(|&xi| xi as f64 * xi as f64).sum();
    let cc: f64 = code.iter().map(|&c| lv[c] as f64 * lv[c] as f64).sum();
    let mut sc = if cc > 0.0 {
        (xx / cc).sqrt() as f32
    } else {
        0.0
    };
    if e < 0.0 {
        sc = -sc;
    }
    code.iter().map(|&c| lv[c] * sc).collect()
}

/// Codebooks (`Pool::set_codebook`, `codebook_gaussian`): the built-in levels
/// ascend in [-1, 1]; an int3 pool with them reads each head's group back as
/// its levels times a scale that keeps the group's L2 norm (f32 scales);
/// refusals are errors; `None` removes a codebook.
#[test]
fn codebook_keeps_group_norms() {
    for bits in 2..=4u32 {
        let g = codebook_gaussian(bits, HEAD_DIM as u64).unwrap();
        assert_eq!(g.len(), 1 << bits);
        assert!(g.iter().all(|x| (-1.0..=1.0).contains(x)), "{g:?}");
        assert!(g.windows(2).all(|w| w[1] > w[0]), "{g:?}");
        assert_eq!(codebook_gaussian(bits, 88).unwrap(), g); // nearer 64 than 128
    }
    for (bits, group) in [(5, 64), (1, 64), (3, 0), (1000, 64)] {
        assert_eq!(
            codebook_gaussian(bits, group).unwrap_err().status,
            Status::InvalidArgument,
            "bits {bits}, group {group}"
        );
    }

    let n = 16usize;
    let lv = codebook_gaussian(3, HEAD_DIM as u64).unwrap();
    let levels: Vec<f32> = (0..LAYERS).flat_map(|_| lv.iter().copied()).collect();
    let codec = Codec::new(Dtype::Int3); // per token, f32 scales, symmetric
    let cfg = model_config().num_blocks(16).k_codec(codec).v_codec(codec);
    let (pool, plain) = (Pool::new(&cfg).unwrap(), Pool::new(&cfg).unwrap());
    assert_eq!(
        pool.set_codebook(2, Some(&levels)).unwrap_err().status,
        Status::InvalidArgument
    );
    assert_eq!(
        pool.set_codebook(1, Some(&levels[1..])).unwrap_err().status,
        Status::InvalidArgument
    );
    let mut bad = levels.clone();
    bad[lv.len() + 5] = bad[lv.len() + 4];
    let err = pool.set_codebook(1, Some(&bad)).unwrap_err();
    assert!(err.message.contains("layer 1, level 5"), "{}", err.message);
    pool.set_codebook(1, Some(&levels)).unwrap();
    pool.set_codebook(0, Some(&levels)).unwrap();
    pool.set_codebook(0, None).unwrap(); // removed: the keys' uniform codes again
    let mut rng = Rng::new(91);
    let (k, v) = (rng.values(n * ROW, 2.0), rng.values(n * ROW, 2.0));
    for p in [&pool, &plain] {
        p.seq_create(1).unwrap();
        p.seq_reserve(1, n as u64).unwrap();
        p.append(1, 1, 0, &k, &v).unwrap();
    }
    let got = pool.gather::<f32>(1, 1, 0, n).unwrap();
    let uniform = plain.gather::<f32>(1, 1, 0, n).unwrap();
    assert_eq!(got.k, uniform.k);
    assert_ne!(got.v, uniform.v);
    let hd = HEAD_DIM as usize;
    for (i, (x, y)) in v.chunks(hd).zip(got.v.chunks(hd)).enumerate() {
        let want = codebook_group(x, &lv);
        for (j, (w, g)) in want.iter().zip(y).enumerate() {
            assert!(
                (w - g).abs() <= w.abs() * 1e-5 + 1e-6,
                "group {i} value {j}: {g} vs {w}"
            );
        }
        let a: f64 = x.iter().map(|&t| t as f64 * t as f64).sum::<f64>().sqrt();
        let b: f64 = y.iter().map(|&t| t as f64 * t as f64).sum::<f64>().sqrt();
        assert!((a - b).abs() <= 1e-5 * a, "group {i}: norm {b} vs {a}");
    }
    let err = pool.set_codebook(1, None).unwrap_err();
    assert_eq!(err.status, Status::InvalidArgument);
    assert!(err.message.contains("sequences"), "{}", err.message);
    let asym = Codec::new(Dtype::Int3).asymmetric(true);
    let q = Pool::new(&model_config().num_blocks(16).k_codec(asym).v_codec(asym)).unwrap();
    assert_eq!(
        q.set_codebook(0, Some(&levels)).unwrap_err().status,
        Status::InvalidArgument
    );
    q.set_codebook(0, Some(&[])).unwrap(); // an empty table removes (there is none)
}
