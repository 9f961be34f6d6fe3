//! Eviction policies.

use crate::error::{check, Error, Result, Status};
use crate::sized::init_struct;
use crate::sys;
use crate::types::c_enum;
use std::ptr::{self, NonNull};

c_enum! {
    /// Eviction policy families (plugins are reachable through `sys` only).
    pub enum PolicyKind => kvc_policy_kind {
        /// Keep every token.
        None = KVC_POLICY_NONE,
        /// StreamingLLM: the first `sink_tokens` + the newest tokens.
        Streaming = KVC_POLICY_STREAMING,
        /// H2O: recent tokens + heavy hitters of accumulated attention.
        H2o = KVC_POLICY_H2O,
        /// SnapKV: the observation window + the prefix tokens it attends most.
        SnapKv = KVC_POLICY_SNAPKV,
        /// PyramidKV: SnapKV under budgets falling from the first layer to the last.
        PyramidKv = KVC_POLICY_PYRAMIDKV,
        /// TOVA: the tokens the latest query attends most.
        Tova = KVC_POLICY_TOVA,
        /// Knorm: the tokens whose keys have the smallest L2 norm (no attention observed).
        Knorm = KVC_POLICY_KNORM,
        /// ExpectedAttention: the attention expected from future queries' statistics
        /// (observe them with `Observe::Queries`).
        ExpectedAttention = KVC_POLICY_EXPECTED_ATTENTION,
        /// KVzip: the largest attention each token gets while the model reconstructs the
        /// context (observe that pass with `Observe::Max`, or feed its scores).
        Kvzip = KVC_POLICY_KVZIP,
    }
}

c_enum! {
    /// Pooling of SnapKV scores along the tokens.
    pub enum Pooling => kvc_pooling {
        /// Max over the kernel.
        Max = KVC_POOLING_MAX,
        /// Mean over the kernel.
        Avg = KVC_POOLING_AVG,
    }
}

c_enum! {
    /// PyramidKV per-layer budget schedules.
    pub enum PyramidSchedule => kvc_pyramid_schedule {
        /// The paper's: linear from 2B - B/beta (first layer) to B/beta (last).
        Paper = KVC_PYRAMID_PAPER,
        /// Linear from 1.0 x B to 0.2 x B.
        Linear = KVC_PYRAMID_LINEAR,
    }
}

/// Configuration of an eviction policy (`kvc_policy_config`), from the
/// library's defaults. A layer's budget B (tokens) is the smallest of
/// `budget_tokens` and floor(n x (1 - compression_ratio)) that are set;
/// streaming without either keeps sink_tokens + recent_tokens.
#[derive(Clone, Copy, Debug)]
pub struct PolicyConfig {
    /// The C struct; its plugin pointer is always NULL.
    raw: sys::kvc_policy_config,
}

// SAFETY: the only pointer in `raw` (plugin) is always NULL.
unsafe impl Send for PolicyConfig {}
// SAFETY: as for Send.
unsafe impl Sync for PolicyConfig {}

impl PolicyConfig {
    /// The defaults for a policy family (sinks 4, window 32, kernel 7, ...).
    pub fn new(kind: PolicyKind) -> PolicyConfig {
        // kvc_policy_config_init_sized with this crate's size never fails.
        let mut raw: sys::kvc_policy_config = init_struct().expect("kvc_policy_config_init_sized");
        raw.kind = kind.to_raw();
        PolicyConfig { raw }
    }

    /// StreamingLLM keeping `sink_tokens` attention sinks and the newest
    /// `recent_tokens` of each layer (sink_tokens 0: a sliding window).
    pub fn streaming(sink_tokens: u32, recent_tokens: u32) -> PolicyConfig {
        PolicyConfig::new(PolicyKind::Streaming)
            .sink_tokens(sink_tokens)
            .recent_tokens(recent_tokens)
    }

    /// Streaming: attention sinks kept at the start.
    pub fn sink_tokens(mut self, tokens: u32) -> PolicyConfig {
        self.raw.sink_tokens = tokens;
        self
    }
    /// Per-layer cap in tokens (0: none).
    pub fn budget_tokens(mut self, tokens: u64) -> PolicyConfig {
        self.raw.budget_tokens = tokens;
        self
    }
    /// Fraction dropped at each eviction, in [0, 1) (0: none).
    pub fn compression_ratio(mut self, ratio: f64) -> PolicyConfig {
        self.raw.compression_ratio = ratio;
        self
    }
    /// Streaming: the window when no budget is set; plugins: protected newest tokens.
    pub fn recent_tokens(mut self, tokens: u32) -> PolicyConfig {
        self.raw.recent_tokens = tokens;
        self
    }
    /// SnapKV / PyramidKV: observation window in tokens (always kept).
    pub fn window(mut self, tokens: u32) -> PolicyConfig {
        self.raw.window = tokens;
        self
    }
    /// H2O: share of the budget kept as the recent window, in [0, 1].
    pub fn recent_fraction(mut self, fraction: f64) -> PolicyConfig {
        self.raw.recent_fraction = fraction;
        self
    }
    /// SnapKV / PyramidKV: odd pooling kernel, 1..1025 tokens.
    pub fn kernel_size(mut self, tokens: u32) -> PolicyConfig {
        self.raw.kernel_size = tokens;
        self
    }
    /// SnapKV / PyramidKV pooling.
    pub fn pooling(mut self, pooling: Pooling) -> PolicyConfig {
        self.raw.pooling = pooling.to_raw();
        self
    }
    /// PyramidKV budget schedule and beta (paper schedule: the last layer keeps B / beta).
    pub fn schedule(mut self, schedule: PyramidSchedule, beta: f64) -> PolicyConfig {
        self.raw.schedule = schedule.to_raw();
        self.raw.beta = beta;
        self
    }
    /// Re-rotate kept keys so token i of the cache has RoPE position i
    /// (needs the pool's RoPE).
    pub fn shift_positions(mut self, on: bool) -> PolicyConfig {
        self.raw.shift_positions = on as u32;
        self
    }
    /// Evict layers over `budget_tokens` before each reserve.
    pub fn auto_evict(mut self, on: bool) -> PolicyConfig {
        self.raw.auto_evict = on as u32;
        self
    }
    /// ExpectedAttention: next positions the query rotation is averaged over, 1..1048576.
    pub fn future_positions(mut self, positions: u32) -> PolicyConfig {
        self.raw.future_positions = positions;
        self
    }

    /// The C struct, for reading fields.
    pub fn as_raw(&self) -> &sys::kvc_policy_config {
        &self.raw
    }
}

/// An eviction policy (`kvc_policy`), released on drop. Pools and sequences
/// it is attached to keep their own reference.
#[derive(Debug)]
pub struct Policy {
    raw: NonNull<sys::kvc_policy>,
}

// SAFETY: a policy is immutable after creation and reference counted by the
// library, whose functions are all thread-safe.
unsafe impl Send for Policy {}
// SAFETY: as for Send.
unsafe impl Sync for Policy {}

impl Policy {
    /// Create a policy (the config is copied).
    pub fn new(config: &PolicyConfig) -> Result<Policy> {
        let mut out: *mut sys::kvc_policy = ptr::null_mut();
        // SAFETY: valid config; `out` receives the handle.
        check(unsafe { sys::kvc_policy_create(&config.raw, &mut out) })?;
        NonNull::new(out)
            .map(|raw| Policy { raw })
            .ok_or_else(|| Error::new(Status::Internal, "kvc_policy_create returned NULL"))
    }

    /// The C handle (still owned by this `Policy`).
    pub fn as_ptr(&self) -> *mut sys::kvc_policy {
        self.raw.as_ptr()
    }
}

impl Drop for Policy {
    fn drop(&mut self) {
        // SAFETY: the handle came from kvc_policy_create and is released once.
        unsafe { sys::kvc_policy_destroy(self.raw.as_ptr()) }
    }
}
