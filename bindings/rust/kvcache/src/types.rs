//! Enumerations of the C API and the element types of K/V data.

use crate::error::{check, Error, Result, Status};
use crate::sys;

/// Defines a Rust enum for a C enum (a bindgen newtype), with conversions.
macro_rules! c_enum {
    (
        $(#[$meta:meta])*
        pub enum $name:ident => $raw:ident {
            $( $(#[$vmeta:meta])* $variant:ident = $constant:ident, )+
        }
    ) => {
        $(#[$meta])*
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
        pub enum $name {
            $( $(#[$vmeta])* $variant, )+
        }

        impl $name {
            /// The C value.
            pub fn to_raw(self) -> sys::$raw {
                match self {
                    $( $name::$variant => sys::$raw::$constant, )+
                }
            }

            /// The variant of a C value (`None` for a value this crate does not know).
            pub fn from_raw(raw: sys::$raw) -> Option<$name> {
                $( if raw == sys::$raw::$constant { return Some($name::$variant); } )+
                None
            }
        }
    };
}
pub(crate) use c_enum;

c_enum! {
    /// Element types: K/V input and output (f32, f16, bf16) and storage
    /// formats of a pool or a [`Codec`](crate::Codec) (all of them).
    pub enum Dtype => kvc_dtype {
        /// IEEE binary32, 4 bytes.
        F32 = KVC_DTYPE_F32,
        /// IEEE binary16, 2 bytes.
        F16 = KVC_DTYPE_F16,
        /// bfloat16 (the top half of binary32), 2 bytes.
        Bf16 = KVC_DTYPE_BF16,
        /// OCP fp8 E4M3 "FN" (max 448), 1 byte, with a scale; storage only.
        Fp8E4m3 = KVC_DTYPE_FP8_E4M3,
        /// OCP fp8 E5M2 (max 57344), 1 byte, with a scale; storage only.
        Fp8E5m2 = KVC_DTYPE_FP8_E5M2,
        /// 8-bit integer codes with scales; storage only.
        Int8 = KVC_DTYPE_INT8,
        /// 4-bit integer codes (two per byte) with scales; storage only.
        Int4 = KVC_DTYPE_INT4,
        /// 2-bit integer codes (four per byte) with scales; storage only.
        Int2 = KVC_DTYPE_INT2,
        /// 3-bit integer codes (eight in three bytes) with scales; storage only, CPU pools only.
        Int3 = KVC_DTYPE_INT3,
    }
}

impl Dtype {
    /// Bytes of one element of a float dtype (4 for f32, 2 for f16 and bf16);
    /// the library refuses the storage-only dtypes ([`Status::InvalidArgument`]).
    pub fn size(self) -> Result<usize> {
        let mut bytes = 0usize;
        // SAFETY: `bytes` is a valid output location.
        check(unsafe { sys::kvc_dtype_size(self.to_raw(), &mut bytes) })?;
        Ok(bytes)
    }

    /// Whether the dtype is f32, f16 or bf16 (stored without scales).
    pub fn is_float(self) -> bool {
        matches!(self, Dtype::F32 | Dtype::F16 | Dtype::Bf16)
    }
}

c_enum! {
    /// Order of tokens and heads inside one block (FlashInfer's names).
    pub enum Layout => kvc_layout {
        /// `[block_size][num_kv_heads][head_dim]` (vLLM / FlashInfer "NHD").
        Nhd = KVC_LAYOUT_NHD,
        /// `[num_kv_heads][block_size][head_dim]` (FlashInfer "HND").
        Hnd = KVC_LAYOUT_HND,
    }
}

c_enum! {
    /// Where a pool's blocks live.
    pub enum Device => kvc_device {
        /// Host memory.
        Cpu = KVC_DEVICE_CPU,
        /// An NVIDIA GPU ([`Status::DeviceUnavailable`] without one).
        Cuda = KVC_DEVICE_CUDA,
    }
}

c_enum! {
    /// Which values share one scale (and zero point) of a quantized codec.
    pub enum Granularity => kvc_granularity {
        /// No scales (float storage).
        None = KVC_SCALE_NONE,
        /// One scale for the whole array (in a pool: per layer, for K or V).
        PerTensor = KVC_SCALE_PER_TENSOR,
        /// One scale per row (in a pool: per token and KV head).
        PerToken = KVC_SCALE_PER_TOKEN,
        /// One scale per `group_size` consecutive values of a row.
        PerGroup = KVC_SCALE_PER_GROUP,
        /// One scale per column over `group_size` rows (KIVI's keys).
        PerChannel = KVC_SCALE_PER_CHANNEL,
    }
}

c_enum! {
    /// Orthogonal rotation applied before quantizing.
    pub enum Rotation => kvc_rotation {
        /// No rotation.
        None = KVC_ROTATION_NONE,
        /// Block-diagonal normalized Walsh-Hadamard transform.
        Hadamard = KVC_ROTATION_HADAMARD,
    }
}

c_enum! {
    /// The rotary position embedding the engine applied to keys.
    pub enum RopeStyle => kvc_rope_style {
        /// Unknown or none: positions never shift.
        None = KVC_ROPE_NONE,
        /// Pairs (2i, 2i+1): Meta LLaMA, GPT-J.
        Interleaved = KVC_ROPE_INTERLEAVED,
        /// Pairs (i, i + dims/2), "rotate half": GPT-NeoX, Hugging Face LLaMA.
        Neox = KVC_ROPE_NEOX,
    }
}

mod sealed {
    pub trait Sealed {}
    impl Sealed for f32 {}
    impl Sealed for super::F16 {}
    impl Sealed for super::Bf16 {}
}

/// An element type K/V data, queries and outputs can be passed in: `f32`,
/// [`F16`] or [`Bf16`]. Sealed: the library takes no others.
pub trait Element: Copy + Default + sealed::Sealed {
    /// The library's name of the type.
    const DTYPE: Dtype;
}

/// An IEEE binary16 value, as its bits (Rust has no stable `f16`).
#[repr(transparent)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct F16(pub u16);

/// A bfloat16 value, as its bits (the top 16 bits of an `f32`).
#[repr(transparent)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct Bf16(pub u16);

impl Element for f32 {
    const DTYPE: Dtype = Dtype::F32;
}
impl Element for F16 {
    const DTYPE: Dtype = Dtype::F16;
}
impl Element for Bf16 {
    const DTYPE: Dtype = Dtype::Bf16;
}

/// Convert `src` into `dst` (the same length) between f32, f16 and bf16 with
/// the library's rounding (to nearest even; beyond f16's range gives +-Inf).
pub fn convert<S: Element, D: Element>(src: &[S], dst: &mut [D]) -> Result<()> {
    if src.len() != dst.len() {
        return Err(Error::new(
            Status::InvalidArgument,
            format!("convert: src has {} elements, dst {}", src.len(), dst.len()),
        ));
    }
    // SAFETY: both buffers hold src.len() elements of the dtypes named, and
    // they cannot overlap (one is borrowed mutably).
    check(unsafe {
        sys::kvc_convert(
            src.as_ptr().cast(),
            S::DTYPE.to_raw(),
            dst.as_mut_ptr().cast(),
            D::DTYPE.to_raw(),
            src.len(),
        )
    })
}

/// `values` converted to another element type (see [`convert`]).
pub fn convert_vec<S: Element, D: Element>(values: &[S]) -> Result<Vec<D>> {
    let mut out = vec![D::default(); values.len()];
    convert(values, &mut out)?;
    Ok(out)
}
