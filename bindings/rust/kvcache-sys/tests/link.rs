//! The raw crate links and calls into the library.

use kvcache_sys as sys;
use std::ffi::CStr;

#[test]
fn loaded_library_matches_the_header() {
    // SAFETY: both functions take no arguments and never fail; the string is static.
    let (number, text) = unsafe {
        (
            sys::kvc_version(),
            CStr::from_ptr(sys::kvc_version_string()).to_str().unwrap(),
        )
    };
    assert_eq!(number, sys::KVC_VERSION_NUMBER);
    let expected = format!(
        "{}.{}.{}",
        sys::KVC_VERSION_MAJOR,
        sys::KVC_VERSION_MINOR,
        sys::KVC_VERSION_PATCH
    );
    assert_eq!(text, expected);
}

#[test]
fn config_init_fills_documented_defaults() {
    let mut config = std::mem::MaybeUninit::<sys::kvc_pool_config>::zeroed();
    // SAFETY: the pointer is valid for writes of one kvc_pool_config. (C's
    // kvc_pool_config_init macro passes the caller's sizeof; the function of
    // that name fills the 0.3 struct, which is shorter since 0.4.)
    let status = unsafe {
        sys::kvc_pool_config_init_sized(
            config.as_mut_ptr(),
            std::mem::size_of::<sys::kvc_pool_config>(),
        )
    };
    assert_eq!(status, sys::kvc_status::KVC_OK);
    // SAFETY: kvc_pool_config_init filled the struct.
    let config = unsafe { config.assume_init() };
    assert_eq!(
        config.struct_size,
        std::mem::size_of::<sys::kvc_pool_config>()
    );
    assert_eq!(config.block_size, 16);
    assert_eq!(config.k_dtype, sys::kvc_dtype::KVC_DTYPE_F16);
    assert_eq!(config.layout, sys::kvc_layout::KVC_LAYOUT_NHD);
    assert_eq!(config.rope_theta, 10000.0);
}
