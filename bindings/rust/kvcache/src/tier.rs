//! Offload tiers below a pool with the prefix cache (docs/tiers.md): host
//! memory, a disk directory, Redis. Blocks the pool reclaims go down to them;
//! lookups report what they hold (`tier_tokens`), loads bring it back.

use crate::error::{check, Result};
use crate::pool::Pool;
use crate::prefix::{c_string, extras_ptr, raw_extras, ExtraKeys};
use crate::sized::init_struct;
use crate::sys;
use crate::types::c_enum;
use std::ffi::CString;
use std::ptr;

c_enum! {
    /// Kind of an offload tier.
    pub enum TierKind => kvc_tier_kind {
        /// Host memory with a byte capacity and LRU replacement.
        Host = KVC_TIER_HOST,
        /// A directory of one file per block; survives restarts.
        Disk = KVC_TIER_DISK,
        /// A Redis server or Redis Cluster, shared by processes and machines.
        Redis = KVC_TIER_REDIS,
    }
}

/// Settings of one tier ([`Pool::add_tier`]), from `kvc_tier_config_init`'s
/// defaults: no flags, capacity 0 (host and disk must set one), no path or
/// address, timeout 1000 ms, no TTL.
#[derive(Clone, Debug)]
pub struct TierConfig {
    kind: TierKind,
    flags: u32,
    capacity_bytes: u64,
    path: Option<CString>,
    address: Option<CString>,
    timeout_ms: u32,
    ttl_seconds: u64,
}

impl TierConfig {
    /// The defaults for `kind`.
    pub fn new(kind: TierKind) -> TierConfig {
        TierConfig {
            kind,
            flags: 0,
            capacity_bytes: 0,
            path: None,
            address: None,
            timeout_ms: 1000,
            ttl_seconds: 0,
        }
    }
    /// Host and disk: the most bytes the tier holds (records with headers), > 0.
    pub fn capacity_bytes(mut self, bytes: u64) -> TierConfig {
        self.capacity_bytes = bytes;
        self
    }
    /// Disk: the directory (created if missing; cut at a NUL character).
    pub fn path(mut self, path: &str) -> TierConfig {
        self.path = Some(c_string(path));
        self
    }
    /// Redis: `"host:port"`, or seed nodes `"host:port,host:port,..."` with
    /// [`TierConfig::redis_cluster`].
    pub fn address(mut self, address: &str) -> TierConfig {
        self.address = Some(c_string(address));
        self
    }
    /// Disk: fsync every record before it is visible (`KVC_TIER_FSYNC`).
    pub fn fsync(mut self, on: bool) -> TierConfig {
        self.set_flag(sys::KVC_TIER_FSYNC, on);
        self
    }
    /// Redis: the address lists seed nodes of a cluster (`KVC_TIER_REDIS_CLUSTER`).
    pub fn redis_cluster(mut self, on: bool) -> TierConfig {
        self.set_flag(sys::KVC_TIER_REDIS_CLUSTER, on);
        self
    }
    /// Redis: connect and command timeout in milliseconds.
    pub fn timeout_ms(mut self, ms: u32) -> TierConfig {
        self.timeout_ms = ms;
        self
    }
    /// Redis: records expire after this many seconds (0: never).
    pub fn ttl_seconds(mut self, seconds: u64) -> TierConfig {
        self.ttl_seconds = seconds;
        self
    }
    fn set_flag(&mut self, flag: u32, on: bool) {
        if on {
            self.flags |= flag;
        } else {
            self.flags &= !flag;
        }
    }
}

/// Counters of one tier (`kvc_tier_stats`).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct TierStats {
    /// The tier's kind (`None` for a kind this crate does not know).
    pub kind: Option<TierKind>,
    /// Bytes held now (Redis: an estimate).
    pub bytes: u64,
    /// Blocks held now.
    pub entries: u64,
    /// Reads that returned a block.
    pub hits: u64,
    /// Reads that found nothing usable.
    pub misses: u64,
    /// Blocks written to this tier by the offload writer.
    pub demotions: u64,
    /// Blocks loaded from this tier into the pool.
    pub promotions: u64,
    /// Demotions dropped because the writer's queue was full.
    pub drops: u64,
    /// Blocks this tier removed for room (LRU).
    pub evictions: u64,
    /// Failed writes and reads, refused records, connection failures.
    pub errors: u64,
    /// Blocks pinned now ([`Pool::prefix_lookup_pinned`]).
    pub pinned: u64,
    /// The reason of the tier's last error, `""` if none.
    pub last_error: String,
}

/// The state of a prefetch ([`Pool::prefix_poll`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Poll {
    /// Still reading: poll again.
    Pending,
    /// Done: the tokens loaded (whole blocks); the ticket is forgotten.
    Done(u64),
}

/// Offload tiers. `tokens` and `extras` are as for [`Pool::prefix_lookup`].
impl Pool {
    /// Add an offload tier below the pool (after the ones already added);
    /// returns its index (0 for the first). The prefix cache must be on.
    pub fn add_tier(&self, config: &TierConfig) -> Result<u32> {
        // SAFETY: plain data (NULL pointers are valid); init fills it.
        let mut raw: sys::kvc_tier_config = unsafe { std::mem::zeroed() };
        // SAFETY: `raw` is a valid struct of size_of::<kvc_tier_config>() bytes.
        check(unsafe {
            sys::kvc_tier_config_init_sized(
                &mut raw,
                config.kind.to_raw(),
                std::mem::size_of_val(&raw),
            )
        })?;
        raw.flags = config.flags;
        raw.capacity_bytes = config.capacity_bytes;
        raw.path = config.path.as_ref().map_or(ptr::null(), |p| p.as_ptr());
        raw.address = config.address.as_ref().map_or(ptr::null(), |a| a.as_ptr());
        raw.timeout_ms = config.timeout_ms;
        raw.ttl_seconds = config.ttl_seconds;
        let mut index = 0u32;
        // SAFETY: valid pool; the strings outlive the call (the library copies them).
        check(unsafe { sys::kvc_pool_add_tier(self.as_ptr(), &raw, &mut index) })?;
        Ok(index)
    }

    /// The offload writer's queue in blocks (1..=2^20) and the load timeout
    /// in milliseconds (1..=3600000); defaults 256 and 10000.
    pub fn set_offload(&self, queue_blocks: u32, load_timeout_ms: u32) -> Result<()> {
        // SAFETY: valid pool.
        check(unsafe { sys::kvc_pool_set_offload(self.as_ptr(), queue_blocks, load_timeout_ms) })
    }

    /// The counters of tier `index` ([`crate::Status::OutOfRange`]: no such tier).
    pub fn tier_stats(&self, index: u32) -> Result<TierStats> {
        let mut s: sys::kvc_tier_stats = init_struct()?;
        // SAFETY: valid pool and struct.
        check(unsafe { sys::kvc_pool_tier_stats(self.as_ptr(), index, &mut s) })?;
        // The array up to its first NUL (all of it if the library wrote none).
        let bytes: Vec<u8> = s.last_error.iter().map(|&c| c as u8).collect();
        let end = bytes.iter().position(|&b| b == 0).unwrap_or(bytes.len());
        let last_error = String::from_utf8_lossy(&bytes[..end]).into_owned();
        Ok(TierStats {
            kind: TierKind::from_raw(s.kind),
            bytes: s.bytes,
            entries: s.entries,
            hits: s.hits,
            misses: s.misses,
            demotions: s.demotions,
            promotions: s.promotions,
            drops: s.drops,
            evictions: s.evictions,
            errors: s.errors,
            pinned: s.pinned,
            last_error,
        })
    }

    /// Queue the prompt's blocks registered in the pool for writing to every
    /// tier; returns the blocks queued (the others were dropped: queue full).
    pub fn prefix_offload(&self, tokens: &[i32], extras: &[&[u8]]) -> Result<u64> {
        let ex = raw_extras(extras)?;
        let mut queued = 0u64;
        // SAFETY: tokens and extras are valid for their lengths during the call.
        check(unsafe {
            sys::kvc_prefix_offload(
                self.as_ptr(),
                tokens.as_ptr(),
                tokens.len() as u64,
                extras_ptr(&ex),
                ex.len() as u32,
                &mut queued,
            )
        })?;
        Ok(queued)
    }

    /// Wait until the offload writer has written every queued block.
    pub fn flush_tiers(&self) -> Result<()> {
        // SAFETY: valid pool.
        check(unsafe { sys::kvc_pool_flush_tiers(self.as_ptr()) })
    }

    /// Load the tier blocks that follow the pool's hit of a prompt into the
    /// pool and wait; returns the tokens loaded. [`crate::Status::Timeout`]: the
    /// tiers did not answer within the load timeout (nothing loaded).
    pub fn prefix_load(&self, tokens: &[i32], extras: &[&[u8]]) -> Result<u64> {
        let ex = raw_extras(extras)?;
        let mut loaded = 0u64;
        // SAFETY: tokens and extras are valid for their lengths during the call.
        check(unsafe {
            sys::kvc_prefix_load(
                self.as_ptr(),
                tokens.as_ptr(),
                tokens.len() as u64,
                extras_ptr(&ex),
                ex.len() as u32,
                &mut loaded,
            )
        })?;
        Ok(loaded)
    }

    /// Start loading as [`Pool::prefix_load`] does, in the background;
    /// returns the ticket for [`Pool::prefix_poll`].
    pub fn prefix_prefetch(&self, tokens: &[i32], extras: &[&[u8]]) -> Result<u64> {
        let ex = raw_extras(extras)?;
        let mut ticket = 0u64;
        // SAFETY: tokens and extras are valid during the call (the library copies them).
        check(unsafe {
            sys::kvc_prefix_prefetch(
                self.as_ptr(),
                tokens.as_ptr(),
                tokens.len() as u64,
                extras_ptr(&ex),
                ex.len() as u32,
                &mut ticket,
            )
        })?;
        Ok(ticket)
    }

    /// [`Pool::prefix_offload`] with the extra keys by name ([`ExtraKeys`]).
    pub fn prefix_offload_named(&self, tokens: &[i32], keys: &ExtraKeys) -> Result<u64> {
        self.prefix_offload(tokens, &self.ordered(keys)?)
    }

    /// [`Pool::prefix_load`] with the extra keys by name ([`ExtraKeys`]).
    pub fn prefix_load_named(&self, tokens: &[i32], keys: &ExtraKeys) -> Result<u64> {
        self.prefix_load(tokens, &self.ordered(keys)?)
    }

    /// [`Pool::prefix_prefetch`] with the extra keys by name ([`ExtraKeys`]).
    pub fn prefix_prefetch_named(&self, tokens: &[i32], keys: &ExtraKeys) -> Result<u64> {
        self.prefix_prefetch(tokens, &self.ordered(keys)?)
    }

    /// The state of a prefetch: [`Poll::Pending`] or [`Poll::Done`] with the
    /// tokens loaded. A load that timed out is [`crate::Status::Timeout`]; an
    /// unknown or already reported ticket [`crate::Status::InvalidArgument`].
    pub fn prefix_poll(&self, ticket: u64) -> Result<Poll> {
        let mut loaded = 0u64;
        // SAFETY: valid pool.
        let status = unsafe { sys::kvc_prefix_poll(self.as_ptr(), ticket, &mut loaded) };
        if status == sys::kvc_status::KVC_ERR_PENDING {
            return Ok(Poll::Pending);
        }
        check(status)?;
        Ok(Poll::Done(loaded))
    }

    /// Release the pins of a [`Pool::prefix_lookup_pinned`] (its result's
    /// `pin`); an unknown, 0 or already released pin is [`crate::Status::InvalidArgument`].
    pub fn prefix_unpin(&self, pin: u64) -> Result<()> {
        // SAFETY: valid pool.
        check(unsafe { sys::kvc_prefix_unpin(self.as_ptr(), pin) })
    }
}
