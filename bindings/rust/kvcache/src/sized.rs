//! Initialising the C structs that grow (`struct_size` first; the rule in
//! docs/abi-policy.md) through `kvc_<thing>_init_sized`.
//!
//! This crate fills every struct it passes to the library with
//! `kvc_<thing>_init_sized(&mut s, size_of::<T>())`: the library writes
//! exactly this crate's struct, whatever its own version. [`init_sized_bytes`]
//! does the same for a caller's buffer of another size (a struct laid out by
//! an older or a newer header), e.g. memory shared with C code.

use crate::error::{check, Error, Result, Status};
use crate::sys;
use std::mem::{align_of, size_of, MaybeUninit};

/// A C struct of `kvcache.h` that starts with `struct_size` and has a
/// `kvc_<thing>_init_sized` function.
///
/// # Safety
///
/// `init_sized` must be the struct's own init function, which writes at most
/// `struct_size` bytes at `ptr` and, for `struct_size == size_of::<Self>()`,
/// every field.
pub unsafe trait SizedStruct: Copy {
    /// The C name of the struct, e.g. `"kvc_pool_config"`.
    const NAME: &'static str;
    /// Calls `kvc_<thing>_init_sized(ptr, struct_size)` (a tier config is
    /// one of a host tier).
    ///
    /// # Safety
    ///
    /// `ptr` must be valid for writes of `struct_size` bytes and aligned for `Self`.
    unsafe fn init_sized(ptr: *mut Self, struct_size: usize) -> sys::kvc_status;
}

macro_rules! sized_struct {
    ($($ty:ident => $init:ident,)+) => {
        $(
            // SAFETY: the struct's own init function (bindgen's declaration).
            unsafe impl SizedStruct for sys::$ty {
                const NAME: &'static str = stringify!($ty);
                unsafe fn init_sized(ptr: *mut Self, struct_size: usize) -> sys::kvc_status {
                    // SAFETY: the caller's contract.
                    unsafe { sys::$init(ptr, struct_size) }
                }
            }
        )+
    };
}

sized_struct! {
    kvc_pool_config => kvc_pool_config_init_sized,
    kvc_stats => kvc_stats_init_sized,
    kvc_pool_layout => kvc_pool_layout_init_sized,
    kvc_codec => kvc_codec_init_sized,
    kvc_quant_sizes => kvc_quant_sizes_init_sized,
    kvc_attention_params => kvc_attention_params_init_sized,
    kvc_policy_config => kvc_policy_config_init_sized,
    kvc_prefix_config => kvc_prefix_config_init_sized,
    kvc_prefix_stats => kvc_prefix_stats_init_sized,
    kvc_tier_stats => kvc_tier_stats_init_sized,
}

// SAFETY: the struct's own init function, for a host tier.
unsafe impl SizedStruct for sys::kvc_tier_config {
    const NAME: &'static str = "kvc_tier_config";
    unsafe fn init_sized(ptr: *mut Self, struct_size: usize) -> sys::kvc_status {
        // SAFETY: the caller's contract.
        unsafe {
            sys::kvc_tier_config_init_sized(ptr, sys::kvc_tier_kind::KVC_TIER_HOST, struct_size)
        }
    }
}

/// The library's defaults for `T`, of this crate's size
/// (`kvc_<thing>_init_sized(&mut s, size_of::<T>())`).
pub(crate) fn init_struct<T: SizedStruct>() -> Result<T> {
    let mut value = MaybeUninit::<T>::zeroed();
    // SAFETY: `value` is writable, aligned storage of size_of::<T>() bytes.
    check(unsafe { T::init_sized(value.as_mut_ptr(), size_of::<T>()) })?;
    // SAFETY: the init function filled every field (and the zeroed start is
    // a valid value of these plain-data structs).
    Ok(unsafe { value.assume_init() })
}

/// Fill the first `struct_size` bytes of `buf` as a `T` of a caller whose
/// header has that size (an older or a newer one): the library's defaults,
/// `struct_size` set to `struct_size`, the bytes past the library's own
/// struct zeroed. Nothing after `struct_size` bytes is written, and nothing
/// at all on an error.
///
/// Errors: [`Status::BufferTooSmall`] (`buf` shorter than `struct_size`),
/// [`Status::InvalidArgument`] (`buf` not aligned for `T`), and the
/// library's [`Status::StructSize`] (a size below the struct's oldest, ending
/// inside a field, or above `KVC_STRUCT_SIZE_MAX`).
///
/// ```
/// use kvcache::{init_sized_bytes, sys};
/// #[repr(C, align(8))]
/// struct Buf([u8; 64]);
/// let mut buf = Buf([0xa5; 64]);
/// // A kvc_pool_config of 0.1 (72 bytes) would not fit; the minimum (48) does.
/// init_sized_bytes::<sys::kvc_pool_config>(&mut buf.0, 48)?;
/// assert_eq!(buf.0[..8], 48usize.to_ne_bytes());
/// assert!(buf.0[48..].iter().all(|&b| b == 0xa5));
/// # Ok::<(), kvcache::Error>(())
/// ```
pub fn init_sized_bytes<T: SizedStruct>(buf: &mut [u8], struct_size: usize) -> Result<()> {
    if buf.len() < struct_size {
        return Err(Error::new(
            Status::BufferTooSmall,
            format!(
                "{}: the buffer holds {} bytes; struct_size is {struct_size}",
                T::NAME,
                buf.len()
            ),
        ));
    }
    if buf.as_ptr() as usize % align_of::<T>() != 0 {
        return Err(Error::new(
            Status::InvalidArgument,
            format!(
                "{}: the buffer is not {}-byte aligned",
                T::NAME,
                align_of::<T>()
            ),
        ));
    }
    // SAFETY: `buf` is valid for writes of struct_size bytes and aligned for T.
    check(unsafe { T::init_sized(buf.as_mut_ptr().cast::<T>(), struct_size) })
}
