//! The prefix cache: reuse of the K/V of prompts' leading blocks.

use crate::error::{check, Error, Result, Status};
use crate::pool::Pool;
use crate::sized::init_struct;
use crate::sys;
use crate::types::c_enum;
use std::collections::BTreeMap;
use std::ffi::CString;
use std::ptr;

c_enum! {
    /// Hash of the prefix cache's block keys.
    pub enum PrefixHash => kvc_prefix_hash {
        /// SHA-256, 32-byte keys (default): safe between tenants that do not trust each other.
        Sha256 = KVC_PREFIX_HASH_SHA256,
        /// XXH3-128, 16-byte keys: fast, not collision resistant against an adversary.
        Xxh3_128 = KVC_PREFIX_HASH_XXH3_128,
    }
}

/// Prefix cache settings, from the library's defaults: SHA-256, token
/// verification on, a random seed, empty model and tokenizer ids.
#[derive(Clone, Debug)]
pub struct PrefixConfig {
    hash: PrefixHash,
    verify_tokens: bool,
    seed: Option<[u8; 32]>,
    model_id: CString,
    tokenizer_id: CString,
    extra_key_names: Vec<String>,
}

impl Default for PrefixConfig {
    fn default() -> PrefixConfig {
        PrefixConfig::new()
    }
}

/// `text` as a C string, cut at its first NUL character (C cannot see past it).
pub(crate) fn c_string(text: &str) -> CString {
    let end = text.find('\0').unwrap_or(text.len());
    CString::new(&text[..end]).expect("no NUL before the first one")
}

impl PrefixConfig {
    /// The defaults.
    pub fn new() -> PrefixConfig {
        PrefixConfig {
            hash: PrefixHash::Sha256,
            verify_tokens: true,
            seed: None,
            model_id: CString::default(),
            tokenizer_id: CString::default(),
            extra_key_names: Vec::new(),
        }
    }
    /// The key hash.
    pub fn hash(mut self, hash: PrefixHash) -> PrefixConfig {
        self.hash = hash;
        self
    }
    /// Compare cached token ids on every hit (default on).
    pub fn verify_tokens(mut self, on: bool) -> PrefixConfig {
        self.verify_tokens = on;
        self
    }
    /// A fixed root seed (keys then survive restarts and match other pools).
    pub fn seed(mut self, seed: [u8; 32]) -> PrefixConfig {
        self.seed = Some(seed);
        self
    }
    /// The model's identity mixed into every key (cut at a NUL character).
    pub fn model_id(mut self, id: &str) -> PrefixConfig {
        self.model_id = c_string(id);
        self
    }
    /// The tokenizer's identity mixed into every key (cut at a NUL character).
    pub fn tokenizer_id(mut self, id: &str) -> PrefixConfig {
        self.tokenizer_id = c_string(id);
        self
    }
    /// Declare the names of the extra keys ("salt", "adapter", "media"...;
    /// docs/prefix-cache.md): the `_named` methods then take the values by
    /// name ([`ExtraKeys`]) and the keys depend on the assignment {name:
    /// value}, not on the order. At most 64 names of 1 to 64 bytes, unique,
    /// without NUL ([`Pool::enable_prefix_cache`] refuses others). Empty (the
    /// default): positional extra keys.
    pub fn extra_key_names(mut self, names: &[&str]) -> PrefixConfig {
        self.extra_key_names = names.iter().map(|n| n.to_string()).collect();
        self
    }
}

/// The values of a pool's named extra keys, set by name; the `_named`
/// methods pass them in the pool's declared order (a declared name not set,
/// or set to an empty value, has none). A name the pool does not declare is
/// refused with [`Status::InvalidArgument`].
///
/// ```
/// # use kvcache::ExtraKeys;
/// let keys = ExtraKeys::new().set("salt", "tenant-1").set("adapter", b"lora-7");
/// assert_eq!(keys.get("salt"), Some(&b"tenant-1"[..]));
/// ```
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ExtraKeys {
    values: BTreeMap<String, Vec<u8>>,
}

impl ExtraKeys {
    /// No values.
    pub fn new() -> ExtraKeys {
        ExtraKeys::default()
    }
    /// The value of `name` (replacing an earlier one).
    pub fn set(mut self, name: &str, value: impl AsRef<[u8]>) -> ExtraKeys {
        self.values
            .insert(name.to_string(), value.as_ref().to_vec());
        self
    }
    /// The value set for `name`, if any.
    pub fn get(&self, name: &str) -> Option<&[u8]> {
        self.values.get(name).map(Vec::as_slice)
    }
}

/// How much of a prompt the cache holds (`kvc_prefix_result`), in tokens.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PrefixMatch {
    /// Leading tokens reusable as whole cached blocks (a multiple of
    /// block_size, at most n_tokens - 1).
    pub hit_tokens: u64,
    /// hit_tokens / block_size.
    pub hit_blocks: u64,
    /// With `partial`: tokens after hit_tokens matching a cached block's start.
    pub partial_tokens: u64,
    /// Lookups of a pool with offload tiers: whole-block tokens after
    /// hit_tokens that the tiers hold (docs/tiers.md).
    pub tier_tokens: u64,
    /// From [`Pool::prefix_lookup_pinned`]: the pin handle for
    /// [`Pool::prefix_unpin`] (0: nothing was pinned).
    pub pin: u64,
}

/// Prefix cache counters (`kvc_prefix_stats`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PrefixStats {
    /// Tokens passed to lookup and attach.
    pub queried_tokens: u64,
    /// Whole-block tokens they found.
    pub hit_tokens: u64,
    /// Token-granular matches they found.
    pub partial_tokens: u64,
    /// Blocks (each spanning all layers) in the index now.
    pub registered_blocks: u64,
    /// Of those, held by no sequence.
    pub reclaimable_blocks: u64,
    /// Of those, held by a sequence.
    pub referenced_blocks: u64,
    /// Blocks ever registered.
    pub stored_total: u64,
    /// Blocks ever removed from the index.
    pub removed_total: u64,
    /// Of those, reclaimed for reuse.
    pub reclaimed_total: u64,
}

/// Extra keys (tenant salt, adapter id...) as the C array; borrows `extras`.
pub(crate) fn raw_extras(extras: &[&[u8]]) -> Result<Vec<sys::kvc_prefix_extra>> {
    if u32::try_from(extras.len()).is_err() {
        return Err(Error::new(Status::InvalidArgument, "too many extra keys"));
    }
    Ok(extras
        .iter()
        .map(|e| sys::kvc_prefix_extra {
            data: if e.is_empty() {
                ptr::null()
            } else {
                e.as_ptr().cast()
            },
            size: e.len(),
        })
        .collect())
}

pub(crate) fn extras_ptr(extras: &[sys::kvc_prefix_extra]) -> *const sys::kvc_prefix_extra {
    if extras.is_empty() {
        ptr::null()
    } else {
        extras.as_ptr()
    }
}

fn flags(partial: bool) -> u32 {
    if partial {
        sys::KVC_PREFIX_PARTIAL
    } else {
        0
    }
}

/// An empty result struct (the C API has no init function for it).
fn new_result() -> sys::kvc_prefix_result {
    sys::kvc_prefix_result {
        struct_size: std::mem::size_of::<sys::kvc_prefix_result>(),
        hit_tokens: 0,
        hit_blocks: 0,
        partial_tokens: 0,
        tier_tokens: 0,
        pin: 0,
    }
}

fn to_match(r: &sys::kvc_prefix_result) -> PrefixMatch {
    PrefixMatch {
        hit_tokens: r.hit_tokens,
        hit_blocks: r.hit_blocks,
        partial_tokens: r.partial_tokens,
        tier_tokens: r.tier_tokens,
        pin: r.pin,
    }
}

/// The prefix cache of a pool. `tokens` are a prompt's token ids; `extras`
/// are extra keys mixed into every block key (at most 64, each at most 1 MiB):
/// positional on a pool without declared names (the legacy form), one value
/// per declared name, in declaration order, on a pool with names (the
/// `_named` methods take them by name instead); `partial` also reuses a
/// partly matching next block (token-granular).
impl Pool {
    /// Turn on the prefix cache (once per pool).
    pub fn enable_prefix_cache(&self, config: &PrefixConfig) -> Result<()> {
        let mut raw: sys::kvc_prefix_config = init_struct()?;
        raw.hash = config.hash.to_raw();
        raw.verify_tokens = config.verify_tokens as u32;
        if let Some(seed) = config.seed {
            raw.seed_set = 1;
            raw.seed = seed;
        }
        raw.model_id = config.model_id.as_ptr();
        raw.tokenizer_id = config.tokenizer_id.as_ptr();
        let names = config
            .extra_key_names
            .iter()
            .map(|n| {
                CString::new(n.as_str()).map_err(|_| {
                    Error::new(
                        Status::InvalidArgument,
                        format!("extra-key name {n:?} contains a NUL character"),
                    )
                })
            })
            .collect::<Result<Vec<CString>>>()?;
        let ptrs: Vec<*const std::os::raw::c_char> = names.iter().map(|n| n.as_ptr()).collect();
        raw.extra_key_names = if ptrs.is_empty() {
            ptr::null()
        } else {
            ptrs.as_ptr()
        };
        raw.n_extra_key_names = u32::try_from(ptrs.len()).unwrap_or(u32::MAX);
        // SAFETY: valid pool; the strings and the name array outlive the call
        // (the library copies them).
        check(unsafe { sys::kvc_pool_enable_prefix_cache(self.as_ptr(), &raw) })?;
        let _ = self.extra_key_names.set(config.extra_key_names.clone());
        Ok(())
    }

    /// The extra-key names the prefix cache declares, in order (empty:
    /// positional extra keys, or the prefix cache is off).
    pub fn extra_key_names(&self) -> &[String] {
        self.extra_key_names.get().map_or(&[], Vec::as_slice)
    }

    /// The values of `keys` in the pool's declared order (empty: none).
    pub(crate) fn ordered<'a>(&self, keys: &'a ExtraKeys) -> Result<Vec<&'a [u8]>> {
        let names = self.extra_key_names();
        if names.is_empty() && !keys.values.is_empty() {
            return Err(Error::new(
                Status::InvalidArgument,
                "extra keys by name need a pool that declares them (PrefixConfig::extra_key_names); \
                 this one takes positional extra keys",
            ));
        }
        if let Some(unknown) = keys.values.keys().find(|k| !names.contains(k)) {
            return Err(Error::new(
                Status::InvalidArgument,
                format!(
                    "extra key {unknown:?} is not declared by this pool (it declares {})",
                    names.join(", ")
                ),
            ));
        }
        Ok(names.iter().map(|n| keys.get(n).unwrap_or(&[])).collect())
    }

    /// [`Pool::prefix_lookup`] with the extra keys by name.
    pub fn prefix_lookup_named(
        &self,
        tokens: &[i32],
        keys: &ExtraKeys,
        partial: bool,
    ) -> Result<PrefixMatch> {
        self.prefix_lookup(tokens, &self.ordered(keys)?, partial)
    }

    /// [`Pool::prefix_lookup_pinned`] with the extra keys by name.
    pub fn prefix_lookup_pinned_named(
        &self,
        tokens: &[i32],
        keys: &ExtraKeys,
        partial: bool,
    ) -> Result<PrefixMatch> {
        self.prefix_lookup_pinned(tokens, &self.ordered(keys)?, partial)
    }

    /// [`Pool::prefix_attach`] with the extra keys by name.
    pub fn prefix_attach_named(
        &self,
        seq_id: u64,
        tokens: &[i32],
        keys: &ExtraKeys,
        partial: bool,
    ) -> Result<PrefixMatch> {
        self.prefix_attach(seq_id, tokens, &self.ordered(keys)?, partial)
    }

    /// [`Pool::prefix_insert`] with the extra keys by name.
    pub fn prefix_insert_named(
        &self,
        seq_id: u64,
        tokens: &[i32],
        keys: &ExtraKeys,
    ) -> Result<u64> {
        self.prefix_insert(seq_id, tokens, &self.ordered(keys)?)
    }

    /// [`Pool::prefix_keys`] with the extra keys by name.
    pub fn prefix_keys_named(&self, tokens: &[i32], keys: &ExtraKeys) -> Result<Vec<Vec<u8>>> {
        self.prefix_keys(tokens, &self.ordered(keys)?)
    }

    /// How many leading tokens of a prompt are cached (changes nothing).
    pub fn prefix_lookup(
        &self,
        tokens: &[i32],
        extras: &[&[u8]],
        partial: bool,
    ) -> Result<PrefixMatch> {
        self.lookup_flags(tokens, extras, flags(partial))
    }

    /// [`Pool::prefix_lookup`] that also pins the tier blocks counted in
    /// `tier_tokens` (`KVC_PREFIX_PIN`), so the tiers keep them until
    /// [`Pool::prefix_unpin`] of the result's `pin` (0: nothing pinned).
    pub fn prefix_lookup_pinned(
        &self,
        tokens: &[i32],
        extras: &[&[u8]],
        partial: bool,
    ) -> Result<PrefixMatch> {
        self.lookup_flags(tokens, extras, flags(partial) | sys::KVC_PREFIX_PIN)
    }

    fn lookup_flags(&self, tokens: &[i32], extras: &[&[u8]], flags: u32) -> Result<PrefixMatch> {
        let ex = raw_extras(extras)?;
        let mut r = new_result();
        // SAFETY: tokens and extras are valid for their lengths during the call.
        check(unsafe {
            sys::kvc_prefix_lookup(
                self.as_ptr(),
                tokens.as_ptr(),
                tokens.len() as u64,
                extras_ptr(&ex),
                ex.len() as u32,
                flags,
                &mut r,
            )
        })?;
        Ok(to_match(&r))
    }

    /// Create sequence `seq_id` holding the cached prefix of a prompt; its
    /// length is hit_tokens + partial_tokens.
    pub fn prefix_attach(
        &self,
        seq_id: u64,
        tokens: &[i32],
        extras: &[&[u8]],
        partial: bool,
    ) -> Result<PrefixMatch> {
        let ex = raw_extras(extras)?;
        let mut r = new_result();
        // SAFETY: tokens and extras are valid for their lengths during the call.
        check(unsafe {
            sys::kvc_prefix_attach(
                self.as_ptr(),
                seq_id,
                tokens.as_ptr(),
                tokens.len() as u64,
                extras_ptr(&ex),
                ex.len() as u32,
                flags(partial),
                &mut r,
            )
        })?;
        Ok(to_match(&r))
    }

    /// Register the full blocks of a sequence's prompt (its first
    /// tokens.len() positions hold `tokens`); returns the blocks newly registered.
    pub fn prefix_insert(&self, seq_id: u64, tokens: &[i32], extras: &[&[u8]]) -> Result<u64> {
        let ex = raw_extras(extras)?;
        let mut registered = 0u64;
        // SAFETY: tokens and extras are valid for their lengths during the call.
        check(unsafe {
            sys::kvc_prefix_insert(
                self.as_ptr(),
                seq_id,
                tokens.as_ptr(),
                tokens.len() as u64,
                extras_ptr(&ex),
                ex.len() as u32,
                &mut registered,
            )
        })?;
        Ok(registered)
    }

    /// The chain keys of a prompt's full blocks, one `Vec` of key-size bytes
    /// (32 for SHA-256, 16 for XXH3-128) per block.
    pub fn prefix_keys(&self, tokens: &[i32], extras: &[&[u8]]) -> Result<Vec<Vec<u8>>> {
        let ex = raw_extras(extras)?;
        let blocks = tokens.len() / self.block_size() as usize;
        let mut buf: Vec<u8> = Vec::new();
        loop {
            let mut key_size = 0usize;
            // SAFETY: tokens and extras valid; buf holds buf.len() bytes.
            let status = unsafe {
                sys::kvc_prefix_keys(
                    self.as_ptr(),
                    tokens.as_ptr(),
                    tokens.len() as u64,
                    extras_ptr(&ex),
                    ex.len() as u32,
                    buf.as_mut_ptr(),
                    buf.len(),
                    &mut key_size,
                )
            };
            if status == sys::kvc_status::KVC_ERR_BUFFER_TOO_SMALL && buf.len() < blocks * key_size
            {
                buf = vec![0; blocks * key_size];
                continue;
            }
            check(status)?;
            if key_size == 0 {
                return Ok(Vec::new());
            }
            return Ok(buf[..blocks * key_size]
                .chunks(key_size)
                .map(<[u8]>::to_vec)
                .collect());
        }
    }

    /// The prefix cache counters.
    pub fn prefix_stats(&self) -> Result<PrefixStats> {
        let mut s: sys::kvc_prefix_stats = init_struct()?;
        // SAFETY: valid pool and struct.
        check(unsafe { sys::kvc_prefix_get_stats(self.as_ptr(), &mut s) })?;
        Ok(PrefixStats {
            queried_tokens: s.queried_tokens,
            hit_tokens: s.hit_tokens,
            partial_tokens: s.partial_tokens,
            registered_blocks: s.registered_blocks,
            reclaimable_blocks: s.reclaimable_blocks,
            referenced_blocks: s.referenced_blocks,
            stored_total: s.stored_total,
            removed_total: s.removed_total,
            reclaimed_total: s.reclaimed_total,
        })
    }
}
