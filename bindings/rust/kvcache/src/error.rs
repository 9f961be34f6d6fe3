//! Status codes and the error type.

use crate::sys;
use std::ffi::CStr;
use std::fmt;

/// Why a call failed: the library's `kvc_status` codes other than `KVC_OK`.
///
/// Codes are fixed forever; a code this crate does not know (from a newer
/// library) is kept as [`Status::Other`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Status {
    /// `KVC_ERR_INVALID_ARGUMENT`: an argument outside its documented range
    /// (also raised by this crate for slices of the wrong length).
    InvalidArgument,
    /// `KVC_ERR_NULL_POINTER`: a required pointer was NULL.
    NullPointer,
    /// `KVC_ERR_STRUCT_SIZE`: a struct older than the oldest supported one.
    StructSize,
    /// `KVC_ERR_UNSUPPORTED`: valid, but not supported by this build or version.
    Unsupported,
    /// `KVC_ERR_OVERFLOW`: sizes overflow 64 bits or the address space.
    Overflow,
    /// `KVC_ERR_OUT_OF_MEMORY`: the host (or device) allocator failed.
    OutOfMemory,
    /// `KVC_ERR_POOL_EXHAUSTED`: not enough free or reclaimable blocks; nothing changed.
    PoolExhausted,
    /// `KVC_ERR_SEQ_NOT_FOUND`: no live sequence has this id.
    SeqNotFound,
    /// `KVC_ERR_SEQ_EXISTS`: a sequence with this id already exists.
    SeqExists,
    /// `KVC_ERR_OUT_OF_RANGE`: a position, token index or layer outside what the sequence holds.
    OutOfRange,
    /// `KVC_ERR_NOT_RESERVED`: a write outside the sequence's reserved slots.
    NotReserved,
    /// `KVC_ERR_BUFFER_TOO_SMALL`: an output buffer is too small (also raised by this crate).
    BufferTooSmall,
    /// `KVC_ERR_DEVICE_UNAVAILABLE`: the device does not exist or has no driver.
    DeviceUnavailable,
    /// `KVC_ERR_VERSION`: an API or ABI version the library does not provide.
    Version,
    /// `KVC_ERR_INVALID_SCALE`: a quantization scale is zero, negative, NaN, Inf or out of range.
    InvalidScale,
    /// `KVC_ERR_NON_FINITE`: NaN or Inf where it is not allowed.
    NonFinite,
    /// `KVC_ERR_INTERNAL`: a bug in the library.
    Internal,
    /// `KVC_ERR_INCOMPATIBLE`: saved data from a pool of another configuration or format.
    Incompatible,
    /// `KVC_ERR_CORRUPT`: saved data that fails its checksum or structure checks.
    Corrupt,
    /// `KVC_ERR_IO`: a file could not be read or written.
    Io,
    /// `KVC_ERR_PENDING`: an asynchronous load has not finished; poll again.
    Pending,
    /// `KVC_ERR_TIMEOUT`: an offload tier did not answer within the load timeout.
    Timeout,
    /// `KVC_ERR_EXCEEDS_CAPACITY`: the request cannot fit even in an empty pool
    /// (retrying never helps, unlike `PoolExhausted`).
    ExceedsCapacity,
    /// A code this crate does not know (`kvc_status` is a signed 32-bit
    /// enum, as every enum of the header).
    Other(i32),
}

const KNOWN: [(Status, sys::kvc_status); 23] = [
    (
        Status::InvalidArgument,
        sys::kvc_status::KVC_ERR_INVALID_ARGUMENT,
    ),
    (Status::NullPointer, sys::kvc_status::KVC_ERR_NULL_POINTER),
    (Status::StructSize, sys::kvc_status::KVC_ERR_STRUCT_SIZE),
    (Status::Unsupported, sys::kvc_status::KVC_ERR_UNSUPPORTED),
    (Status::Overflow, sys::kvc_status::KVC_ERR_OVERFLOW),
    (Status::OutOfMemory, sys::kvc_status::KVC_ERR_OUT_OF_MEMORY),
    (
        Status::PoolExhausted,
        sys::kvc_status::KVC_ERR_POOL_EXHAUSTED,
    ),
    (Status::SeqNotFound, sys::kvc_status::KVC_ERR_SEQ_NOT_FOUND),
    (Status::SeqExists, sys::kvc_status::KVC_ERR_SEQ_EXISTS),
    (Status::OutOfRange, sys::kvc_status::KVC_ERR_OUT_OF_RANGE),
    (Status::NotReserved, sys::kvc_status::KVC_ERR_NOT_RESERVED),
    (
        Status::BufferTooSmall,
        sys::kvc_status::KVC_ERR_BUFFER_TOO_SMALL,
    ),
    (
        Status::DeviceUnavailable,
        sys::kvc_status::KVC_ERR_DEVICE_UNAVAILABLE,
    ),
    (Status::Version, sys::kvc_status::KVC_ERR_VERSION),
    (Status::InvalidScale, sys::kvc_status::KVC_ERR_INVALID_SCALE),
    (Status::NonFinite, sys::kvc_status::KVC_ERR_NON_FINITE),
    (Status::Internal, sys::kvc_status::KVC_ERR_INTERNAL),
    (Status::Incompatible, sys::kvc_status::KVC_ERR_INCOMPATIBLE),
    (Status::Corrupt, sys::kvc_status::KVC_ERR_CORRUPT),
    (Status::Io, sys::kvc_status::KVC_ERR_IO),
    (Status::Pending, sys::kvc_status::KVC_ERR_PENDING),
    (Status::Timeout, sys::kvc_status::KVC_ERR_TIMEOUT),
    (Status::ExceedsCapacity, sys::kvc_status::KVC_ERR_EXCEEDS_CAPACITY),
];

impl Status {
    /// The status for a C code (`KVC_OK` has none: it is not an error).
    pub fn from_raw(raw: sys::kvc_status) -> Option<Status> {
        if raw == sys::kvc_status::KVC_OK {
            return None;
        }
        Some(
            KNOWN
                .iter()
                .find(|(_, code)| *code == raw)
                .map_or(Status::Other(raw.0), |(status, _)| *status),
        )
    }

    /// The C code.
    pub fn to_raw(self) -> sys::kvc_status {
        match self {
            Status::Other(code) => sys::kvc_status(code),
            known => KNOWN
                .iter()
                .find(|(status, _)| *status == known)
                .map(|(_, code)| *code)
                .expect("every named status is in the table"),
        }
    }

    /// The numeric code (`KVC_ERR_POOL_EXHAUSTED` is 7).
    pub fn code(self) -> i32 {
        self.to_raw().0
    }

    /// The library's name of the code, e.g. `"KVC_ERR_POOL_EXHAUSTED"`
    /// (`"KVC_ERR_UNKNOWN"` for codes the library does not know).
    pub fn name(self) -> &'static str {
        // SAFETY: kvc_status_string accepts any value and returns a static,
        // NUL-terminated ASCII string.
        unsafe { CStr::from_ptr(sys::kvc_status_string(self.to_raw())) }
            .to_str()
            .unwrap_or("KVC_ERR_UNKNOWN")
    }
}

impl fmt::Display for Status {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A failed call: the status and the library's explanation
/// (`kvc_last_error_message()`, read right after the call), or this crate's
/// own explanation for arguments it refuses before calling the library.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Error {
    /// What went wrong.
    pub status: Status,
    /// Why, in words (e.g. `"head_dim 0: must be 1..1024"`).
    pub message: String,
}

/// The result of every fallible call of this crate.
pub type Result<T> = std::result::Result<T, Error>;

impl Error {
    /// An error raised by this crate itself (the library was not called).
    pub(crate) fn new(status: Status, message: impl Into<String>) -> Error {
        Error {
            status,
            message: message.into(),
        }
    }

    /// The error for a failed library call: must run right after the call, on
    /// the same thread, before any other call into the library.
    fn from_failed_call(status: Status) -> Error {
        Error {
            status,
            message: last_error_message(),
        }
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.message.is_empty() {
            write!(f, "{}", self.status)
        } else {
            write!(f, "{}: {}", self.status, self.message)
        }
    }
}

impl std::error::Error for Error {}

/// The explanation of the calling thread's last failed library call (`""`
/// when none failed yet). [`Error::message`] already holds it; this is for
/// code that calls the raw `sys` functions.
pub fn last_error_message() -> String {
    // SAFETY: the library returns a NUL-terminated string valid until this
    // thread's next call into it; it is copied at once.
    unsafe { CStr::from_ptr(sys::kvc_last_error_message()) }
        .to_string_lossy()
        .into_owned()
}

/// `Ok(())` for `KVC_OK`, else the error with the thread's last message.
pub(crate) fn check(raw: sys::kvc_status) -> Result<()> {
    match Status::from_raw(raw) {
        None => Ok(()),
        Some(status) => Err(Error::from_failed_call(status)),
    }
}
