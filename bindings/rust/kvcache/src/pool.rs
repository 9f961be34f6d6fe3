//! Pools, sequences, K/V data, attention.

use crate::codec::Codec;
use crate::error::{check, Error, Result, Status};
use crate::policy::Policy;
use crate::sized::init_struct;
use crate::sys;
use crate::types::{c_enum, Device, Dtype, Element, Layout, RopeStyle};
use std::ptr::{self, NonNull};

/// Configuration of a pool (`kvc_pool_config`), starting from the library's
/// defaults: block size 16, f16 K and V, NHD, CPU, no codecs, RoPE theta
/// 10000. Set exactly one capacity: [`num_blocks`](PoolConfig::num_blocks) or
/// [`capacity_bytes`](PoolConfig::capacity_bytes).
#[derive(Clone, Debug)]
pub struct PoolConfig {
    /// The C struct; its codec pointers are always NULL (codecs are below).
    raw: sys::kvc_pool_config,
    k_codec: Option<Codec>,
    v_codec: Option<Codec>,
}

// SAFETY: the only pointers in `raw` (k_codec, v_codec) are always NULL; the
// codecs are held by value and pointed to only during Pool::new.
unsafe impl Send for PoolConfig {}
// SAFETY: as for Send; nothing is shared mutably.
unsafe impl Sync for PoolConfig {}

impl PoolConfig {
    /// The geometry of a model's cache: layers 1..4096, query heads and KV
    /// heads 1..65536 (query heads a multiple of KV heads), head_dim elements
    /// per head 1..1024. Ranges are checked by [`Pool::new`].
    pub fn new(num_layers: u32, num_q_heads: u32, num_kv_heads: u32, head_dim: u32) -> PoolConfig {
        // kvc_pool_config_init_sized with this crate's size never fails.
        let mut raw: sys::kvc_pool_config = init_struct().expect("kvc_pool_config_init_sized");
        raw.num_layers = num_layers;
        raw.num_q_heads = num_q_heads;
        raw.num_kv_heads = num_kv_heads;
        raw.head_dim = head_dim;
        PoolConfig {
            raw,
            k_codec: None,
            v_codec: None,
        }
    }

    /// Tokens per block, 1..4096 (default 16).
    pub fn block_size(mut self, tokens: u32) -> PoolConfig {
        self.raw.block_size = tokens;
        self
    }

    /// Capacity in blocks (all layers together); clears `capacity_bytes`.
    pub fn num_blocks(mut self, blocks: u64) -> PoolConfig {
        self.raw.num_blocks = blocks;
        self.raw.capacity_bytes = 0;
        self
    }

    /// Capacity as a byte budget for block memory; clears `num_blocks`.
    pub fn capacity_bytes(mut self, bytes: u64) -> PoolConfig {
        self.raw.capacity_bytes = bytes;
        self.raw.num_blocks = 0;
        self
    }

    /// Storage dtype of keys (without a codec; default f16).
    pub fn k_dtype(mut self, dtype: Dtype) -> PoolConfig {
        self.raw.k_dtype = dtype.to_raw();
        self
    }

    /// Storage dtype of values (without a codec; default f16).
    pub fn v_dtype(mut self, dtype: Dtype) -> PoolConfig {
        self.raw.v_dtype = dtype.to_raw();
        self
    }

    /// Order of tokens and heads in a block (default NHD).
    pub fn layout(mut self, layout: Layout) -> PoolConfig {
        self.raw.layout = layout.to_raw();
        self
    }

    /// Zero a block whenever it becomes free (`KVC_POOL_ZERO_ON_FREE`).
    pub fn zero_on_free(mut self, on: bool) -> PoolConfig {
        if on {
            self.raw.flags |= sys::KVC_POOL_ZERO_ON_FREE;
        } else {
            self.raw.flags &= !sys::KVC_POOL_ZERO_ON_FREE;
        }
        self
    }

    /// Quantize keys before RoPE (`KVC_POOL_PRE_ROPE_KEYS`, KVQuant): needs
    /// [`rope`](PoolConfig::rope) and a quantized key codec; CPU pools only.
    pub fn pre_rope_keys(mut self, on: bool) -> PoolConfig {
        if on {
            self.raw.flags |= sys::KVC_POOL_PRE_ROPE_KEYS;
        } else {
            self.raw.flags &= !sys::KVC_POOL_PRE_ROPE_KEYS;
        }
        self
    }

    /// Where blocks live and the device ordinal (0 for the CPU).
    pub fn device(mut self, device: Device, index: i32) -> PoolConfig {
        self.raw.device = device.to_raw();
        self.raw.device_index = index;
        self
    }

    /// Store keys with a codec (its dtype overrides `k_dtype`).
    pub fn k_codec(mut self, codec: Codec) -> PoolConfig {
        self.k_codec = Some(codec);
        self
    }

    /// Store values with a codec (its dtype overrides `v_dtype`).
    pub fn v_codec(mut self, codec: Codec) -> PoolConfig {
        self.v_codec = Some(codec);
        self
    }

    /// KIVI's residual window: the newest `tokens` of each layer stay in
    /// `dtype` (f16, bf16, f32, or int8 rows with an f16 scale per token and
    /// KV head) until they age; needs a quantized codec.
    pub fn residual_window(mut self, tokens: u32, dtype: Dtype) -> PoolConfig {
        self.raw.residual_window = tokens;
        self.raw.residual_dtype = dtype.to_raw();
        self
    }

    /// Hybrid precision: keep the newest floor(fraction x length) tokens in
    /// the residual dtype, fraction in [0, 1).
    pub fn residual_fraction(mut self, fraction: f64) -> PoolConfig {
        self.raw.residual_fraction = fraction;
        self
    }

    /// Attention sinks: the first `tokens` of each layer keep a copy in the
    /// residual dtype once encoded (KVQuant, IntactKV); at most block_size,
    /// needs a residual arena.
    pub fn residual_sinks(mut self, tokens: u32) -> PoolConfig {
        self.raw.residual_sinks = tokens;
        self
    }

    /// Capacity of the residual arena in blocks (0 = num_blocks).
    pub fn num_residual_blocks(mut self, blocks: u64) -> PoolConfig {
        self.raw.num_residual_blocks = blocks;
        self
    }

    /// The RoPE the engine applies to keys: style, rotated dimensions per head
    /// (even, at most head_dim; 0 = head_dim) and base theta.
    pub fn rope(mut self, style: RopeStyle, dims: u32, theta: f64) -> PoolConfig {
        self.raw.rope_style = style.to_raw();
        self.raw.rope_dims = dims;
        self.raw.rope_theta = theta;
        self
    }

    /// The C struct (codec pointers NULL), for reading fields.
    pub fn as_raw(&self) -> &sys::kvc_pool_config {
        &self.raw
    }
}

/// Counters of a pool (`kvc_stats`): blocks_total = blocks_free +
/// blocks_cached + blocks_used.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Stats {
    /// Blocks in the pool.
    pub blocks_total: u64,
    /// Blocks in the free list.
    pub blocks_free: u64,
    /// Blocks with reference count 0 kept for prefix reuse.
    pub blocks_cached: u64,
    /// Blocks with reference count >= 1.
    pub blocks_used: u64,
    /// Used blocks with reference count >= 2.
    pub blocks_shared: u64,
    /// Bytes of one block (K and V, one layer, all KV heads).
    pub bytes_per_block: u64,
    /// Bytes one token takes in all layers (K and V), metadata included.
    pub bytes_per_token: u64,
    /// Bytes of block memory allocated at create.
    pub bytes_total: u64,
    /// Bytes of used and cached blocks.
    pub bytes_in_use: u64,
    /// Largest bytes_in_use since create or [`Pool::reset_peak`].
    pub peak_bytes_in_use: u64,
    /// Live sequences.
    pub num_sequences: u64,
    /// Blocks of the residual arena.
    pub residual_blocks_total: u64,
    /// Residual blocks in use.
    pub residual_blocks_used: u64,
    /// Bytes of one residual block.
    pub residual_bytes_per_block: u64,
    /// Tokens held, summed over sequences and layers.
    pub tokens_stored: u64,
}

/// One layer's K, V and positions read by [`Pool::gather`].
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Gathered<E> {
    /// `[n_tokens][num_kv_heads][head_dim]`.
    pub k: Vec<E>,
    /// `[n_tokens][num_kv_heads][head_dim]`.
    pub v: Vec<E>,
    /// `[n_tokens]`: the position of each token.
    pub positions: Vec<i32>,
}

/// FlashInfer's paged-KV page table of a batch for one layer (CSR form).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PageTable {
    /// `[n_seqs + 1]`: sequence i's pages are `indices[indptr[i]..indptr[i + 1]]`.
    pub indptr: Vec<i32>,
    /// Block ids.
    pub indices: Vec<i32>,
    /// `[n_seqs]`: valid tokens of each sequence's last page (0 when it has none).
    pub last_page_len: Vec<i32>,
}

c_enum! {
    /// What an attention call records for the eviction policies.
    pub enum Observe => kvc_observe {
        /// Record nothing.
        None = KVC_OBSERVE_NONE,
        /// Add to the running totals (H2O).
        Accumulate = KVC_OBSERVE_ACCUMULATE,
        /// Replace them with this call's (TOVA).
        Replace = KVC_OBSERVE_REPLACE,
        /// Add the query rows to the sequence's query statistics (ExpectedAttention).
        Queries = KVC_OBSERVE_QUERIES,
        /// Raise them to this call's where larger: the largest attention (KVzip).
        Max = KVC_OBSERVE_MAX,
    }
}

c_enum! {
    /// How decode attention forms q.k over integer-coded keys.
    pub enum QueryQuant => kvc_query_quant {
        /// The f32 query (the same results on every CPU path).
        Exact = KVC_QUERY_EXACT,
        /// An int8 query against int8 / uint8 / int4 key codes (AVX-512 VNNI; faster, within the
        /// bound the C header gives; exact where it does not apply).
        Int8 = KVC_QUERY_INT8,
        /// `Int8`, and symmetric int8 or int4 value codes summed in integers too (AVX-512 VNNI;
        /// within the bound the C header gives).
        Int8Values = KVC_QUERY_INT8_VALUES,
    }
}

/// Parameters of [`Pool::attention_decode`] and [`Pool::attention_prefill`]
/// (the query heads and the q / out dtypes come from the pool and the slices).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct AttentionParams {
    /// Multiplies q.k; 0 = 1 / sqrt(head_dim).
    pub scale: f32,
    /// Record attention for eviction policies.
    pub observe: Observe,
    /// Threads for a decode batch, the caller's included (0 or 1: the caller only).
    pub num_threads: u32,
    /// Prefill: the first query row whose attention is recorded.
    pub observe_from: u64,
    /// Decode: the query's precision against integer keys.
    pub query_quant: QueryQuant,
}

impl Default for AttentionParams {
    fn default() -> AttentionParams {
        AttentionParams {
            scale: 0.0,
            observe: Observe::None,
            num_threads: 0,
            observe_from: 0,
            query_quant: QueryQuant::Exact,
        }
    }
}

/// A KV-cache pool (`kvc_pool`): one allocation of K/V memory cut into
/// blocks, holding sequences named by the caller's `u64` ids. Destroyed (with
/// every sequence) on drop.
///
/// K/V rows are `[n_tokens][num_kv_heads][head_dim]` row-major slices of an
/// [`Element`] type; their length fixes n_tokens. Positions and token counts
/// are in tokens.
///
/// `Pool` is `Send` and `Sync`: the header states that all functions are
/// thread-safe (structural calls take a pool lock; appends and gathers on
/// different sequences or layers run in parallel; racing writes to the same
/// positions give unspecified values, never undefined behaviour). Only the
/// destroy must not race other calls, which `Drop` taking the pool by value
/// guarantees.
#[derive(Debug)]
pub struct Pool {
    raw: NonNull<sys::kvc_pool>,
    num_layers: u32,
    num_q_heads: u32,
    num_kv_heads: u32,
    head_dim: u32,
    block_size: u32,
    device: Device,
    /// The extra-key names the prefix cache declares (set once, by
    /// [`Pool::enable_prefix_cache`]; docs/prefix-cache.md).
    pub(crate) extra_key_names: std::sync::OnceLock<Vec<String>>,
}

// SAFETY: the C API is thread-safe for every call on a pool (header,
// "Threads"); the handle carries no thread affinity.
unsafe impl Send for Pool {}
// SAFETY: as above; &Pool methods only make thread-safe calls, and nothing is
// exposed that the library does not synchronize (no raw block memory).
unsafe impl Sync for Pool {}

impl Drop for Pool {
    fn drop(&mut self) {
        // SAFETY: the pool came from kvc_pool_create and is destroyed once;
        // `&mut self` excludes any concurrent call.
        unsafe { sys::kvc_pool_destroy(self.raw.as_ptr()) }
    }
}

fn invalid(message: String) -> Error {
    Error::new(Status::InvalidArgument, message)
}

impl Pool {
    /// Create a pool: the config is validated, all block memory allocated
    /// (zeroed) at once. Bad dimensions give [`Status::InvalidArgument`].
    pub fn new(config: &PoolConfig) -> Result<Pool> {
        let mut raw = config.raw;
        raw.k_codec = config
            .k_codec
            .as_ref()
            .map_or(ptr::null(), |c| c.as_raw() as *const _);
        raw.v_codec = config
            .v_codec
            .as_ref()
            .map_or(ptr::null(), |c| c.as_raw() as *const _);
        let mut handle: *mut sys::kvc_pool = ptr::null_mut();
        // SAFETY: `raw` and the codecs it points to live across the call (the
        // library copies them); `handle` receives the pool.
        check(unsafe { sys::kvc_pool_create(&raw, &mut handle) })?;
        let raw_handle = NonNull::new(handle)
            .ok_or_else(|| Error::new(Status::Internal, "kvc_pool_create returned NULL"))?;
        let mut pool = Pool {
            raw: raw_handle,
            num_layers: 0,
            num_q_heads: 0,
            num_kv_heads: 0,
            head_dim: 0,
            block_size: 0,
            device: Device::Cpu,
            extra_key_names: std::sync::OnceLock::new(),
        };
        // The effective geometry (on error, drop destroys the pool).
        let effective = pool.config()?;
        let c = effective.as_raw();
        pool.num_layers = c.num_layers;
        pool.num_q_heads = c.num_q_heads;
        pool.num_kv_heads = c.num_kv_heads;
        pool.head_dim = c.head_dim;
        pool.block_size = c.block_size;
        pool.device = Device::from_raw(c.device).unwrap_or(Device::Cpu);
        Ok(pool)
    }

    /// The C handle, for calls through [`sys`](crate::sys). It stays owned by
    /// this `Pool`: do not destroy it.
    pub fn as_ptr(&self) -> *mut sys::kvc_pool {
        self.raw.as_ptr()
    }

    /// Transformer layers.
    pub fn num_layers(&self) -> u32 {
        self.num_layers
    }
    /// Query heads.
    pub fn num_q_heads(&self) -> u32 {
        self.num_q_heads
    }
    /// KV heads.
    pub fn num_kv_heads(&self) -> u32 {
        self.num_kv_heads
    }
    /// Elements per head.
    pub fn head_dim(&self) -> u32 {
        self.head_dim
    }
    /// Tokens per block.
    pub fn block_size(&self) -> u32 {
        self.block_size
    }
    /// Elements of one token's K (or V) row in one layer: num_kv_heads x head_dim.
    pub fn row_len(&self) -> usize {
        self.num_kv_heads as usize * self.head_dim as usize
    }

    /// The effective configuration (defaults resolved, num_blocks computed);
    /// codecs are not reported (see [`layout`](Pool::layout)).
    pub fn config(&self) -> Result<PoolConfig> {
        let mut raw = init_struct::<sys::kvc_pool_config>()?;
        // SAFETY: valid pool and struct with struct_size set.
        check(unsafe { sys::kvc_pool_get_config(self.as_ptr(), &mut raw) })?;
        raw.k_codec = ptr::null();
        raw.v_codec = ptr::null();
        Ok(PoolConfig {
            raw,
            k_codec: None,
            v_codec: None,
        })
    }

    /// A consistent snapshot of the pool's counters.
    pub fn stats(&self) -> Result<Stats> {
        let mut s = init_struct::<sys::kvc_stats>()?;
        // SAFETY: valid pool and struct with struct_size set.
        check(unsafe { sys::kvc_pool_stats(self.as_ptr(), &mut s) })?;
        Ok(Stats {
            blocks_total: s.blocks_total,
            blocks_free: s.blocks_free,
            blocks_cached: s.blocks_cached,
            blocks_used: s.blocks_used,
            blocks_shared: s.blocks_shared,
            bytes_per_block: s.bytes_per_block,
            bytes_per_token: s.bytes_per_token,
            bytes_total: s.bytes_total,
            bytes_in_use: s.bytes_in_use,
            peak_bytes_in_use: s.peak_bytes_in_use,
            num_sequences: s.num_sequences,
            residual_blocks_total: s.residual_blocks_total,
            residual_blocks_used: s.residual_blocks_used,
            residual_bytes_per_block: s.residual_bytes_per_block,
            tokens_stored: s.tokens_stored,
        })
    }

    /// Set the peak bytes in use to the current bytes in use.
    pub fn reset_peak(&self) -> Result<()> {
        // SAFETY: valid pool.
        check(unsafe { sys::kvc_pool_reset_peak(self.as_ptr()) })
    }

    /// Where and how block memory is laid out (offsets and strides in bytes).
    /// The `base` pointers are for engines' own kernels: reading or writing
    /// through them is `unsafe` and not synchronized by the library.
    pub fn layout(&self) -> Result<sys::kvc_pool_layout> {
        let mut layout = init_struct::<sys::kvc_pool_layout>()?;
        // SAFETY: valid pool and struct with struct_size set.
        check(unsafe { sys::kvc_pool_get_layout(self.as_ptr(), &mut layout) })?;
        Ok(layout)
    }

    /// Wait for a CUDA pool's queued work and report device-side errors
    /// ([`Status::NonFinite`] for appends refused since the last sync).
    /// Nothing to wait for on the CPU.
    pub fn sync(&self) -> Result<()> {
        // SAFETY: valid pool.
        check(unsafe { sys::kvc_pool_sync(self.as_ptr()) })
    }

    /// Per-tensor scales of a layer (K, V); 0 for a part without one.
    pub fn tensor_scales(&self, layer: u32) -> Result<(f32, f32)> {
        let (mut k, mut v) = (0f32, 0f32);
        // SAFETY: valid pool and output locations.
        check(unsafe { sys::kvc_pool_tensor_scales(self.as_ptr(), layer, &mut k, &mut v) })?;
        Ok((k, v))
    }

    /// Per-channel key smoothing (`kvc_pool_set_key_smoothing`, docs/codecs.md): keys are
    /// stored as codes of `(k - offset) / scale` per channel. `scale` (and `offset`, `None`:
    /// zeros) hold `num_layers x num_kv_heads x head_dim` values; an empty `scale` with no
    /// offset removes the smoothing. Only on a pool with no sequence and no prefix cache.
    /// [`Status::InvalidArgument`] for a wrong count, a value out of range, an offset of
    /// another length, or a pool holding sequences; [`Status::Unsupported`] for CUDA or
    /// head-wise pools.
    pub fn set_key_smoothing(&self, scale: &[f32], offset: Option<&[f32]>) -> Result<()> {
        if let Some(o) = offset {
            if o.len() != scale.len() {
                return Err(Error::new(
                    Status::InvalidArgument,
                    format!(
                        "offset holds {} values, scale {}: give as many or none",
                        o.len(),
                        scale.len()
                    ),
                ));
            }
        }
        let sp = if scale.is_empty() { std::ptr::null() } else { scale.as_ptr() };
        let op = offset.map_or(std::ptr::null(), |o| o.as_ptr());
        // SAFETY: valid pool; both arrays hold scale.len() values (checked above).
        check(unsafe { sys::kvc_pool_set_key_smoothing(self.as_ptr(), sp, op, scale.len()) })
    }

    /// A codebook of the pool's keys (`part` 0) or values (`part` 1)
    /// (`kvc_pool_set_codebook`, docs/codecs.md): the part's int2/int3/int4 codes index
    /// non-uniform levels instead of the evenly spaced integers; each scale group stores its
    /// signed extreme `e` and a value `x` reads back as the level nearest to `x / e`, times
    /// `e`. `levels` holds `num_layers x 2^bits` values, layer by layer, each in [-1, 1] and
    /// strictly ascending within a layer ([`codebook_gaussian`](crate::codebook_gaussian)
    /// gives levels for rotated values); `None` (or an empty slice) removes the part's
    /// codebook. Only on a pool with no sequence and no prefix cache.
    /// [`Status::InvalidArgument`] for a part other than 0 or 1, a codec that takes no
    /// codebook, a wrong count, a level out of range or order, or a pool holding sequences;
    /// [`Status::Unsupported`] for CUDA or head-wise pools.
    pub fn set_codebook(&self, part: u32, levels: Option<&[f32]>) -> Result<()> {
        let (lp, n) = match levels {
            Some(l) if !l.is_empty() => (l.as_ptr(), l.len()),
            _ => (std::ptr::null(), 0),
        };
        // SAFETY: valid pool; lp holds n values (or is null with n 0).
        check(unsafe { sys::kvc_pool_set_codebook(self.as_ptr(), part, lp, n) })
    }

    // ---- sequences ----

    /// Create an empty sequence (length 0). [`Status::SeqExists`] if the id is live.
    pub fn seq_create(&self, seq_id: u64) -> Result<()> {
        // SAFETY: valid pool.
        check(unsafe { sys::kvc_seq_create(self.as_ptr(), seq_id) })
    }

    /// Fork: `child_id` shares every block of `parent_id` (copy-on-write).
    pub fn seq_fork(&self, parent_id: u64, child_id: u64) -> Result<()> {
        // SAFETY: valid pool.
        check(unsafe { sys::kvc_seq_fork(self.as_ptr(), parent_id, child_id) })
    }

    /// Drop every token at position >= `new_length`.
    pub fn seq_truncate(&self, seq_id: u64, new_length: u64) -> Result<()> {
        // SAFETY: valid pool.
        check(unsafe { sys::kvc_seq_truncate(self.as_ptr(), seq_id, new_length) })
    }

    /// Free a sequence and release its blocks.
    pub fn seq_free(&self, seq_id: u64) -> Result<()> {
        // SAFETY: valid pool.
        check(unsafe { sys::kvc_seq_free(self.as_ptr(), seq_id) })
    }

    /// The sequence as a self-describing record (`kvc_seq_save`, docs/tiers.md):
    /// block bytes as stored, positions, scores and a fingerprint of the pool's
    /// configuration. [`Pool::seq_restore`] takes it back, in this pool or another
    /// with the same configuration.
    pub fn seq_save(&self, seq_id: u64) -> Result<Vec<u8>> {
        loop {
            let mut size = 0usize;
            // SAFETY: valid pool; a NULL buffer only queries the size.
            let st = unsafe {
                sys::kvc_seq_save(self.as_ptr(), seq_id, std::ptr::null_mut(), 0, &mut size)
            };
            if st != sys::kvc_status::KVC_ERR_BUFFER_TOO_SMALL {
                check(st)?;
            }
            let mut buf = vec![0u8; size];
            // SAFETY: buf holds `size` writable bytes.
            let st = unsafe {
                sys::kvc_seq_save(
                    self.as_ptr(),
                    seq_id,
                    buf.as_mut_ptr().cast(),
                    buf.len(),
                    &mut size,
                )
            };
            if st == sys::kvc_status::KVC_ERR_BUFFER_TOO_SMALL {
                continue; // the sequence grew between the two calls
            }
            check(st)?;
            buf.truncate(size);
            return Ok(buf);
        }
    }

    /// Creates `seq_id` from a record of [`Pool::seq_save`]; on any error
    /// (`Corrupt`, `Incompatible`, `PoolExhausted`, `SeqExists`) nothing changes.
    pub fn seq_restore(&self, seq_id: u64, record: &[u8]) -> Result<()> {
        // SAFETY: valid pool; record is readable for its length.
        check(unsafe {
            sys::kvc_seq_restore(self.as_ptr(), seq_id, record.as_ptr().cast(), record.len())
        })
    }

    /// Length in tokens: the next position to write (reserved positions included).
    pub fn seq_length(&self, seq_id: u64) -> Result<u64> {
        let mut length = 0u64;
        // SAFETY: valid pool and output location.
        check(unsafe { sys::kvc_seq_length(self.as_ptr(), seq_id, &mut length) })?;
        Ok(length)
    }

    /// Tokens a layer holds (the length until eviction drops some).
    pub fn seq_layer_tokens(&self, seq_id: u64, layer: u32) -> Result<u64> {
        let mut n = 0u64;
        // SAFETY: valid pool and output location.
        check(unsafe { sys::kvc_seq_layer_tokens(self.as_ptr(), seq_id, layer, &mut n) })?;
        Ok(n)
    }

    /// Reserve slots for `n_new` tokens in every layer (all or nothing) and
    /// extend the length. [`Status::PoolExhausted`] changes nothing.
    pub fn seq_reserve(&self, seq_id: u64, n_new: u64) -> Result<()> {
        // SAFETY: valid pool; NULL slot mapping is allowed.
        check(unsafe { sys::kvc_seq_reserve(self.as_ptr(), seq_id, n_new, ptr::null_mut()) })
    }

    /// As [`seq_reserve`](Pool::seq_reserve), returning the slot mapping
    /// `[num_layers][n_new]` (slot = block_id x block_size + offset).
    pub fn seq_reserve_slots(&self, seq_id: u64, n_new: u64) -> Result<Vec<i64>> {
        let len = usize::try_from(n_new)
            .ok()
            .and_then(|n| n.checked_mul(self.num_layers as usize))
            .ok_or_else(|| Error::new(Status::Overflow, "num_layers x n_new exceeds usize"))?;
        let mut slots = vec![0i64; len];
        // SAFETY: `slots` holds num_layers x n_new entries.
        check(unsafe { sys::kvc_seq_reserve(self.as_ptr(), seq_id, n_new, slots.as_mut_ptr()) })?;
        Ok(slots)
    }

    /// Tokens in a `[n][num_kv_heads][head_dim]` slice.
    fn tokens_in(&self, len: usize, what: &str) -> Result<u64> {
        let row = self.row_len();
        if !len.is_multiple_of(row) {
            return Err(invalid(format!(
                "{what} holds {len} values: not a multiple of num_kv_heads x head_dim = {row}"
            )));
        }
        Ok((len / row) as u64)
    }

    /// Write K and V of `n` tokens at positions [pos, pos + n) of a layer
    /// (reserved first), converted to the storage dtype. `k` and `v` are
    /// `[n][num_kv_heads][head_dim]`.
    pub fn append<E: Element>(
        &self,
        seq_id: u64,
        layer: u32,
        pos: u64,
        k: &[E],
        v: &[E],
    ) -> Result<()> {
        let n = self.tokens_in(k.len(), "k")?;
        if v.len() != k.len() {
            return Err(invalid(format!(
                "k holds {} values, v {}",
                k.len(),
                v.len()
            )));
        }
        // SAFETY: k and v hold n rows of num_kv_heads x head_dim elements of E.
        check(unsafe {
            sys::kvc_append(
                self.as_ptr(),
                seq_id,
                layer,
                pos,
                n,
                k.as_ptr().cast(),
                v.as_ptr().cast(),
                E::DTYPE.to_raw(),
            )
        })
    }

    /// Read tokens [first, first + n) of a layer (in the layer's order; equal
    /// to positions until eviction) into the given outputs: K and V
    /// `[n][num_kv_heads][head_dim]`, positions `[n]`. n comes from the
    /// outputs given, which must agree.
    pub fn gather_into<E: Element>(
        &self,
        seq_id: u64,
        layer: u32,
        first: u64,
        k_out: Option<&mut [E]>,
        v_out: Option<&mut [E]>,
        positions_out: Option<&mut [i32]>,
    ) -> Result<()> {
        let mut n: Option<u64> = None;
        let mut agree = |count: u64, what: &str| -> Result<()> {
            match n {
                Some(prev) if prev != count => Err(invalid(format!(
                    "gather: {what} is for {count} tokens, another output for {prev}"
                ))),
                _ => {
                    n = Some(count);
                    Ok(())
                }
            }
        };
        if let Some(k) = &k_out {
            agree(self.tokens_in(k.len(), "k_out")?, "k_out")?;
        }
        if let Some(v) = &v_out {
            agree(self.tokens_in(v.len(), "v_out")?, "v_out")?;
        }
        if let Some(p) = &positions_out {
            agree(p.len() as u64, "positions_out")?;
        }
        let n = n.unwrap_or(0);
        let k_ptr = k_out.map_or(ptr::null_mut(), |k| k.as_mut_ptr().cast());
        let v_ptr = v_out.map_or(ptr::null_mut(), |v| v.as_mut_ptr().cast());
        let p_ptr = positions_out.map_or(ptr::null_mut(), |p| p.as_mut_ptr());
        // SAFETY: every non-NULL output holds n tokens' worth of its type.
        check(unsafe {
            sys::kvc_gather(
                self.as_ptr(),
                seq_id,
                layer,
                first,
                n,
                k_ptr,
                v_ptr,
                E::DTYPE.to_raw(),
                p_ptr,
            )
        })
    }

    /// Read tokens [first, first + n_tokens) of a layer: K, V and positions.
    pub fn gather<E: Element>(
        &self,
        seq_id: u64,
        layer: u32,
        first: u64,
        n_tokens: usize,
    ) -> Result<Gathered<E>> {
        let len = n_tokens
            .checked_mul(self.row_len())
            .ok_or_else(|| Error::new(Status::Overflow, "n_tokens x row exceeds usize"))?;
        let mut out = Gathered {
            k: vec![E::default(); len],
            v: vec![E::default(); len],
            positions: vec![0; n_tokens],
        };
        self.gather_into(
            seq_id,
            layer,
            first,
            Some(&mut out.k),
            Some(&mut out.v),
            Some(&mut out.positions),
        )?;
        Ok(out)
    }

    /// The block table (ordered block ids) of one layer of a sequence.
    pub fn block_table(&self, seq_id: u64, layer: u32) -> Result<Vec<i32>> {
        let mut ids: Vec<i32> = Vec::new();
        loop {
            let mut n = 0usize;
            let buf = if ids.is_empty() {
                ptr::null_mut()
            } else {
                ids.as_mut_ptr()
            };
            // SAFETY: `buf` is NULL or holds ids.len() entries.
            let status = unsafe {
                sys::kvc_seq_block_table(self.as_ptr(), seq_id, layer, buf, ids.len(), &mut n)
            };
            if status == sys::kvc_status::KVC_ERR_BUFFER_TOO_SMALL
                || (status == sys::kvc_status::KVC_OK && n > ids.len())
            {
                ids = vec![0; n];
                continue;
            }
            check(status)?;
            ids.truncate(n);
            return Ok(ids);
        }
    }

    /// FlashInfer's paged-KV page table of `seq_ids` for one layer.
    pub fn export_page_table(&self, layer: u32, seq_ids: &[u64]) -> Result<PageTable> {
        let mut table = PageTable {
            indptr: vec![0; seq_ids.len() + 1],
            indices: Vec::new(),
            last_page_len: vec![0; seq_ids.len()],
        };
        loop {
            let mut n = 0usize;
            // SAFETY: indptr holds n_seqs + 1 entries, last_page_len n_seqs,
            // indices its length (the capacity passed).
            let status = unsafe {
                sys::kvc_export_page_table(
                    self.as_ptr(),
                    layer,
                    seq_ids.as_ptr(),
                    seq_ids.len(),
                    table.indptr.as_mut_ptr(),
                    table.indices.as_mut_ptr(),
                    table.indices.len(),
                    table.last_page_len.as_mut_ptr(),
                    &mut n,
                )
            };
            if status == sys::kvc_status::KVC_ERR_BUFFER_TOO_SMALL {
                table.indices = vec![0; n];
                continue;
            }
            check(status)?;
            table.indices.truncate(n);
            return Ok(table);
        }
    }

    // ---- eviction ----

    /// Evict: each layer keeps its budget of tokens chosen by `policy` (None:
    /// the sequence's policy, else the pool's default, else nothing). Returns
    /// the tokens each layer dropped, `[num_layers]`.
    pub fn evict(&self, seq_id: u64, policy: Option<&Policy>) -> Result<Vec<u64>> {
        let mut dropped = vec![0u64; self.num_layers as usize];
        let p = policy.map_or(ptr::null(), |p| p.as_ptr() as *const _);
        // SAFETY: valid pool and policy (or NULL); `dropped` holds num_layers entries.
        check(unsafe { sys::kvc_evict(self.as_ptr(), seq_id, p, dropped.as_mut_ptr()) })?;
        Ok(dropped)
    }

    /// Attach a policy to a sequence (None: the pool's default applies). The
    /// sequence keeps its own reference: the `Policy` may be dropped.
    pub fn set_seq_policy(&self, seq_id: u64, policy: Option<&Policy>) -> Result<()> {
        let p = policy.map_or(ptr::null(), |p| p.as_ptr() as *const _);
        // SAFETY: valid pool and policy (or NULL).
        check(unsafe { sys::kvc_seq_set_policy(self.as_ptr(), seq_id, p) })
    }

    /// Set the pool's default policy (None: no default).
    pub fn set_default_policy(&self, policy: Option<&Policy>) -> Result<()> {
        let p = policy.map_or(ptr::null(), |p| p.as_ptr() as *const _);
        // SAFETY: valid pool and policy (or NULL).
        check(unsafe { sys::kvc_pool_set_policy(self.as_ptr(), p) })
    }

    /// RoPE positions `[n]` at which to rotate the keys of positions [pos, pos + n).
    pub fn rope_positions(&self, seq_id: u64, layer: u32, pos: u64, n: usize) -> Result<Vec<i32>> {
        let mut out = vec![0i32; n];
        // SAFETY: `out` holds n entries.
        check(unsafe {
            sys::kvc_seq_rope_positions(
                self.as_ptr(),
                seq_id,
                layer,
                pos,
                n as u64,
                out.as_mut_ptr(),
            )
        })?;
        Ok(out)
    }

    /// Feed attention scores `[n_tokens][num_kv_heads]` (finite, >= 0; n_tokens
    /// the layer's token count), added to (`accumulate`) or replacing the
    /// recorded ones.
    pub fn observe_scores(
        &self,
        seq_id: u64,
        layer: u32,
        scores: &[f32],
        accumulate: bool,
    ) -> Result<()> {
        let heads = self.num_kv_heads as usize;
        if !scores.len().is_multiple_of(heads) {
            return Err(invalid(format!(
                "scores holds {} values: not a multiple of num_kv_heads = {heads}",
                scores.len()
            )));
        }
        let n = (scores.len() / heads) as u64;
        // SAFETY: scores holds n x num_kv_heads f32.
        check(unsafe {
            sys::kvc_seq_observe_scores(
                self.as_ptr(),
                seq_id,
                layer,
                scores.as_ptr(),
                n,
                accumulate as i32,
            )
        })
    }

    /// The recorded attention scores of a layer, `[n_tokens][num_kv_heads]`.
    pub fn scores(&self, seq_id: u64, layer: u32) -> Result<Vec<f32>> {
        let n = self.seq_layer_tokens(seq_id, layer)?;
        let len = usize::try_from(n)
            .ok()
            .and_then(|n| n.checked_mul(self.num_kv_heads as usize))
            .ok_or_else(|| Error::new(Status::Overflow, "n_tokens x num_kv_heads exceeds usize"))?;
        let mut out = vec![0f32; len];
        // SAFETY: `out` holds n x num_kv_heads f32.
        check(unsafe { sys::kvc_seq_scores(self.as_ptr(), seq_id, layer, out.as_mut_ptr(), n) })?;
        Ok(out)
    }

    // ---- attention ----

    fn attention_raw<Q: Element, O: Element>(
        &self,
        params: &AttentionParams,
    ) -> Result<sys::kvc_attention_params> {
        let mut raw = init_struct::<sys::kvc_attention_params>()?;
        raw.num_q_heads = self.num_q_heads;
        raw.scale = params.scale;
        raw.q_dtype = Q::DTYPE.to_raw();
        raw.out_dtype = O::DTYPE.to_raw();
        raw.observe = params.observe.to_raw();
        raw.num_threads = params.num_threads;
        raw.observe_from = params.observe_from;
        raw.query_quant = params.query_quant.to_raw();
        Ok(raw)
    }

    fn check_query(&self, len: usize, rows: usize, what: &str) -> Result<()> {
        let need = rows
            .checked_mul(self.num_q_heads as usize * self.head_dim as usize)
            .ok_or_else(|| Error::new(Status::Overflow, "query size exceeds usize"))?;
        if len != need {
            return Err(invalid(format!(
                "{what} holds {len} values; {rows} x num_q_heads x head_dim = {need} expected"
            )));
        }
        Ok(())
    }

    /// Decode attention for a batch: one query per sequence against every
    /// token the layer holds. `q` and `out` are `[n_seqs][num_q_heads][head_dim]`,
    /// `lse` (natural log-sum-exp of the scaled scores) `[n_seqs][num_q_heads]`.
    pub fn attention_decode<Q: Element, O: Element>(
        &self,
        layer: u32,
        seq_ids: &[u64],
        q: &[Q],
        out: &mut [O],
        lse: Option<&mut [f32]>,
        params: &AttentionParams,
    ) -> Result<()> {
        self.check_query(q.len(), seq_ids.len(), "q")?;
        self.check_query(out.len(), seq_ids.len(), "out")?;
        let lse_ptr = match lse {
            Some(l) if l.len() != seq_ids.len() * self.num_q_heads as usize => {
                return Err(invalid(format!(
                    "lse holds {} values; n_seqs x num_q_heads expected",
                    l.len()
                )));
            }
            Some(l) => l.as_mut_ptr(),
            None => ptr::null_mut(),
        };
        let raw = self.attention_raw::<Q, O>(params)?;
        // SAFETY: q, out and lse hold the sizes checked above.
        check(unsafe {
            sys::kvc_attention_decode(
                self.as_ptr(),
                layer,
                seq_ids.as_ptr(),
                seq_ids.len(),
                q.as_ptr().cast(),
                out.as_mut_ptr().cast(),
                lse_ptr,
                &raw,
            )
        })
    }

    /// Prefill attention: the layer's last n_q tokens attend causally to
    /// every token before them. `q` and `out` are `[n_q][num_q_heads][head_dim]`,
    /// `lse` `[n_q][num_q_heads]`.
    pub fn attention_prefill<Q: Element, O: Element>(
        &self,
        layer: u32,
        seq_id: u64,
        q: &[Q],
        out: &mut [O],
        lse: Option<&mut [f32]>,
        params: &AttentionParams,
    ) -> Result<()> {
        let per_row = self.num_q_heads as usize * self.head_dim as usize;
        let n_q = q.len() / per_row;
        self.check_query(q.len(), n_q, "q")?;
        self.check_query(out.len(), n_q, "out")?;
        let lse_ptr = match lse {
            Some(l) if l.len() != n_q * self.num_q_heads as usize => {
                return Err(invalid(format!(
                    "lse holds {} values; n_q x num_q_heads expected",
                    l.len()
                )));
            }
            Some(l) => l.as_mut_ptr(),
            None => ptr::null_mut(),
        };
        let raw = self.attention_raw::<Q, O>(params)?;
        // SAFETY: q, out and lse hold the sizes checked above.
        check(unsafe {
            sys::kvc_attention_prefill(
                self.as_ptr(),
                layer,
                seq_id,
                q.as_ptr().cast(),
                n_q as u64,
                out.as_mut_ptr().cast(),
                lse_ptr,
                &raw,
            )
        })
    }

    /// The pool's device.
    pub fn device(&self) -> Device {
        self.device
    }
}
