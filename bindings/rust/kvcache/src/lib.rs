//! Safe Rust API of libkvcache: the key/value cache of transformer inference
//! (paged pools, copy-on-write forks, quantized storage, eviction policies, a
//! prefix cache), over the raw [`sys`] crate generated from
//! `include/kvcache/kvcache.h`.
//!
//! - [`Pool`] owns a `kvc_pool` (destroyed on drop); sequences inside it are
//!   named by the caller's `u64` ids.
//! - Every fallible call returns [`Result`]; an [`Error`] carries the
//!   library's [`Status`] and its message (`kvc_last_error_message()`, read
//!   right after the failed call).
//! - K/V data are slices of an [`Element`] type (`f32`, [`F16`], [`Bf16`])
//!   shaped `[n_tokens][num_kv_heads][head_dim]`, row-major; the slice length
//!   gives the token count. Sizes are in bytes or tokens as named.
//! - [`Codec`] describes quantized storage and runs the standalone quantizer.
//! - [`Policy`] is an eviction policy (released on drop).
//! - Every C struct is initialised with `kvc_<thing>_init_sized` and this
//!   crate's size; [`init_sized_bytes`] initialises a buffer of another
//!   header's size (the struct_size rule, docs/abi-policy.md).
//!
//! Linking: the kvcache-sys build script finds libkvcache through
//! `KVC_LIB_DIR` (the folder of libkvcache.so) or `pkg-config kvcache`, and
//! this crate's tests get an rpath to it. Programs depending on this crate
//! need the library on their loader path (or their own rpath).
//!
//! Not wrapped (use [`sys`] with [`Pool::as_ptr`]): plugins, the prefix event
//! callback, CUDA streams and block swapping (`kvc_pool_copy_blocks`), whose
//! asynchronous copies outlive a borrow.

#![warn(missing_docs)]

pub use kvcache_sys as sys;

mod codec;
mod error;
mod policy;
mod pool;
mod prefix;
mod sized;
mod tier;
mod types;

pub use codec::{codebook_gaussian, Codec, QuantSizes, Quantized};
pub use error::{last_error_message, Error, Result, Status};
pub use policy::{Policy, PolicyConfig, PolicyKind, Pooling, PyramidSchedule};
pub use pool::{
    AttentionParams, Gathered, Observe, PageTable, Pool, PoolConfig, QueryQuant, Stats,
};
pub use prefix::{ExtraKeys, PrefixConfig, PrefixHash, PrefixMatch, PrefixStats};
pub use sized::{init_sized_bytes, SizedStruct};
pub use tier::{Poll, TierConfig, TierKind, TierStats};
pub use types::{
    convert, convert_vec, Bf16, Device, Dtype, Element, Granularity, Layout, RopeStyle, Rotation,
    F16,
};

use std::ffi::CStr;

/// Version of the loaded library: major x 10000 + minor x 100 + patch.
pub fn version() -> u32 {
    // SAFETY: no arguments, never fails.
    unsafe { sys::kvc_version() }
}

/// Version of the loaded library as text, e.g. `"0.4.0"`.
pub fn version_string() -> &'static str {
    // SAFETY: the library returns a static NUL-terminated ASCII string.
    unsafe { CStr::from_ptr(sys::kvc_version_string()) }
        .to_str()
        .unwrap_or("")
}

// The README's examples run as doc tests (the same code docs/bindings.md shows).
#[doc = include_str!("../../README.md")]
#[cfg(doctest)]
pub struct ReadmeDoctests;
