//! Codecs (how K or V values are stored) and the standalone quantizer.

use crate::error::{check, Error, Result, Status};
use crate::sized::init_struct;
use crate::sys;
use crate::types::{Dtype, Element, Granularity, Rotation};
use std::ptr;

/// A codec: storage dtype, scale granularity, zero points, rotation
/// (`kvc_codec`). Used for a pool's K or V ([`PoolConfig::k_codec`]) and by
/// [`Codec::quantize`]. Byte layouts: docs/codecs.md.
///
/// [`PoolConfig::k_codec`]: crate::PoolConfig::k_codec
#[derive(Clone, Copy, Debug)]
pub struct Codec {
    raw: sys::kvc_codec,
}

/// Buffer sizes the quantizer writes for an array `[n][d]`, in bytes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct QuantSizes {
    /// Codes: n rows of ceil(d x bits / 8) bytes.
    pub codes_bytes: u64,
    /// Scales, of the codec's scale dtype (0 for float dtypes).
    pub scales_bytes: u64,
    /// Zero points (asymmetric codecs), else 0.
    pub zeros_bytes: u64,
    /// Number of scale entries.
    pub num_scales: u64,
}

/// What [`Codec::quantize`] produced for an array `[n][d]`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Quantized {
    /// Rows.
    pub n: u64,
    /// Values per row.
    pub d: u64,
    /// Codes, `codes_bytes` bytes.
    pub codes: Vec<u8>,
    /// Scales, little-endian f32 or f16 (`scales_bytes` bytes; empty for float dtypes).
    pub scales: Vec<u8>,
    /// Zero points (asymmetric codecs), same encoding as the scales; else empty.
    pub zeros: Vec<u8>,
}

fn to_len(bytes: u64) -> Result<usize> {
    usize::try_from(bytes).map_err(|_| Error::new(Status::Overflow, "buffer size exceeds usize"))
}

/// Rows of an array of `len` values with `d` per row.
fn rows(len: usize, d: usize, what: &str) -> Result<u64> {
    if d == 0 || !len.is_multiple_of(d) {
        return Err(Error::new(
            Status::InvalidArgument,
            format!("{what} holds {len} values: not a whole number of rows of d = {d}"),
        ));
    }
    Ok((len / d) as u64)
}

fn check_len(what: &str, have: usize, need: u64) -> Result<()> {
    if (have as u64) < need {
        return Err(Error::new(
            Status::BufferTooSmall,
            format!("{what} has {have} bytes; {need} needed"),
        ));
    }
    Ok(())
}

fn ptr_or_null(buf: &[u8]) -> *const std::ffi::c_void {
    if buf.is_empty() {
        ptr::null()
    } else {
        buf.as_ptr().cast()
    }
}

fn mut_ptr_or_null(buf: &mut [u8]) -> *mut std::ffi::c_void {
    if buf.is_empty() {
        ptr::null_mut()
    } else {
        buf.as_mut_ptr().cast()
    }
}

impl Codec {
    /// The library's defaults for `dtype`: per-token symmetric scales in f32,
    /// group size 32, no rotation, dynamic scales (no scales for f32, f16 and
    /// bf16).
    pub fn new(dtype: Dtype) -> Codec {
        // kvc_codec_init_sized with this crate's size never fails.
        let mut raw: sys::kvc_codec = init_struct().expect("kvc_codec_init_sized");
        raw.dtype = dtype.to_raw();
        if dtype.is_float() {
            raw.granularity = Granularity::None.to_raw();
        }
        Codec { raw }
    }

    /// Which values share a scale.
    pub fn granularity(mut self, granularity: Granularity) -> Codec {
        self.raw.granularity = granularity.to_raw();
        self
    }

    /// Values (per group) or rows (per channel) per scale, 1..65536.
    pub fn group_size(mut self, group_size: u32) -> Codec {
        self.raw.group_size = group_size;
        self
    }

    /// Zero points (integer dtypes): `q = round((x - min) / scale)`.
    pub fn asymmetric(mut self, asymmetric: bool) -> Codec {
        self.raw.asymmetric = asymmetric as u32;
        self
    }

    /// Dtype of scales and zero points: [`Dtype::F32`] (default) or [`Dtype::F16`].
    pub fn scale_dtype(mut self, dtype: Dtype) -> Codec {
        self.raw.scale_dtype = dtype.to_raw();
        self
    }

    /// A rotation before quantizing, over blocks of `block` values (a power of
    /// two dividing the row; 0 = the largest such, at most 1024).
    pub fn rotation(mut self, rotation: Rotation, block: u32) -> Codec {
        self.raw.rotation = rotation.to_raw();
        self.raw.rotation_block = block;
        self
    }

    /// A static (calibrated) per-tensor scale, in [1e-30, 1e30] (vLLM's
    /// k_scale / v_scale); sets the granularity to per tensor.
    pub fn static_scale(mut self, scale: f64) -> Codec {
        self.raw.granularity = Granularity::PerTensor.to_raw();
        self.raw.static_scale = 1;
        self.raw.scale = scale;
        self
    }

    /// Symmetric integer codes over all 2^bits values (llama.cpp q4_0's rule:
    /// the value of largest magnitude maps to -2^(bits-1)); dynamic symmetric
    /// integer codecs only, CPU pools only.
    pub fn full_range(mut self, on: bool) -> Codec {
        self.raw.full_range = on as u32;
        self
    }

    /// Outliers per scale group (dense-and-sparse codes, docs/codecs.md): the
    /// `n` values of largest magnitude of each group are kept apart as
    /// (index, int8 code) pairs and the group's scale covers the others;
    /// symmetric integer codecs with per-token or per-group scales, pools only
    /// (the standalone quantizer gives [`Status::Unsupported`]), CPU only.
    pub fn outliers(mut self, n: u32) -> Codec {
        self.raw.outliers = n;
        self
    }

    /// The storage dtype.
    pub fn dtype(&self) -> Option<Dtype> {
        Dtype::from_raw(self.raw.dtype)
    }

    /// The C struct, for calls through [`sys`](crate::sys).
    pub fn as_raw(&self) -> &sys::kvc_codec {
        &self.raw
    }

    /// Bytes the quantizer writes for `[n][d]`.
    pub fn sizes(&self, n: u64, d: u64) -> Result<QuantSizes> {
        let mut raw: sys::kvc_quant_sizes = init_struct()?;
        // SAFETY: valid pointers to a codec and a sizes struct.
        check(unsafe { sys::kvc_quantize_sizes(&self.raw, n, d, &mut raw) })?;
        Ok(QuantSizes {
            codes_bytes: raw.codes_bytes,
            scales_bytes: raw.scales_bytes,
            zeros_bytes: raw.zeros_bytes,
            num_scales: raw.num_scales,
        })
    }

    /// Quantize `src` (`[n][d]` row-major, n = src.len() / d) into caller
    /// buffers at least [`sizes`](Codec::sizes) long (scales and zeros may be
    /// empty when their size is 0). Returns the sizes written. NaN or Inf gives
    /// [`Status::NonFinite`] and writes nothing.
    pub fn quantize_into<E: Element>(
        &self,
        src: &[E],
        d: usize,
        codes: &mut [u8],
        scales: &mut [u8],
        zeros: &mut [u8],
    ) -> Result<QuantSizes> {
        let n = rows(src.len(), d, "src")?;
        let sizes = self.sizes(n, d as u64)?;
        check_len("codes", codes.len(), sizes.codes_bytes)?;
        check_len("scales", scales.len(), sizes.scales_bytes)?;
        check_len("zeros", zeros.len(), sizes.zeros_bytes)?;
        // SAFETY: src holds n * d elements of E::DTYPE; each output buffer is
        // at least as large as kvc_quantize_sizes says it writes.
        check(unsafe {
            sys::kvc_quantize(
                &self.raw,
                src.as_ptr().cast(),
                E::DTYPE.to_raw(),
                n,
                d as u64,
                mut_ptr_or_null(codes),
                mut_ptr_or_null(scales),
                mut_ptr_or_null(zeros),
            )
        })?;
        Ok(sizes)
    }

    /// Quantize `src` (`[n][d]` row-major, n = src.len() / d) into new buffers.
    pub fn quantize<E: Element>(&self, src: &[E], d: usize) -> Result<Quantized> {
        let n = rows(src.len(), d, "src")?;
        let sizes = self.sizes(n, d as u64)?;
        let mut out = Quantized {
            n,
            d: d as u64,
            codes: vec![0; to_len(sizes.codes_bytes)?],
            scales: vec![0; to_len(sizes.scales_bytes)?],
            zeros: vec![0; to_len(sizes.zeros_bytes)?],
        };
        self.quantize_into(src, d, &mut out.codes, &mut out.scales, &mut out.zeros)?;
        Ok(out)
    }

    /// Dequantize codes, scales and zero points (as [`quantize_into`](Codec::quantize_into)
    /// wrote them with this codec) into `dst` (`[n][d]`, n = dst.len() / d),
    /// undoing the rotation. The inputs must be at least
    /// [`sizes`](Codec::sizes) long.
    pub fn dequantize_into<E: Element>(
        &self,
        codes: &[u8],
        scales: &[u8],
        zeros: &[u8],
        d: usize,
        dst: &mut [E],
    ) -> Result<()> {
        let n = rows(dst.len(), d, "dst")?;
        let sizes = self.sizes(n, d as u64)?;
        check_len("codes", codes.len(), sizes.codes_bytes)?;
        check_len("scales", scales.len(), sizes.scales_bytes)?;
        check_len("zeros", zeros.len(), sizes.zeros_bytes)?;
        // SAFETY: every input holds at least the bytes the codec reads for
        // [n][d]; dst holds n * d elements of E::DTYPE.
        check(unsafe {
            sys::kvc_dequantize(
                &self.raw,
                ptr_or_null(codes),
                ptr_or_null(scales),
                ptr_or_null(zeros),
                n,
                d as u64,
                dst.as_mut_ptr().cast(),
                E::DTYPE.to_raw(),
            )
        })
    }

    /// Dequantize what [`quantize`](Codec::quantize) returned: `[n][d]` values.
    pub fn dequantize<E: Element>(&self, q: &Quantized) -> Result<Vec<E>> {
        let len =
            q.n.checked_mul(q.d)
                .and_then(|v| usize::try_from(v).ok())
                .ok_or_else(|| Error::new(Status::Overflow, "n x d exceeds usize"))?;
        let mut out = vec![E::default(); len];
        self.dequantize_into(&q.codes, &q.scales, &q.zeros, q.d as usize, &mut out)?;
        Ok(out)
    }
}

/// The built-in codebook for rotated values (`kvc_codebook_gaussian`): the Lloyd-Max
/// levels of groups of `group_size` Gaussian values normalized by their signed extreme
/// (`head_dim` for per-token scales), `2^bits` ascending values in [-1, 1] for `bits` 2,
/// 3 or 4. [`Pool::set_codebook`](crate::Pool::set_codebook) takes one such table per
/// layer, concatenated. [`Status::InvalidArgument`] for `bits` outside 2..=4 or a
/// `group_size` of 0.
pub fn codebook_gaussian(bits: u32, group_size: u64) -> Result<Vec<f32>> {
    // The library writes 2^bits values and refuses a bits outside 2..=4 before writing.
    if bits > 8 {
        return Err(Error::new(
            Status::InvalidArgument,
            format!("bits {bits} is not 2, 3 or 4"),
        ));
    }
    let mut levels = vec![0f32; 1usize << bits];
    // SAFETY: levels holds 2^bits values, all the library writes.
    check(unsafe { sys::kvc_codebook_gaussian(bits, group_size, levels.as_mut_ptr()) })?;
    Ok(levels)
}
