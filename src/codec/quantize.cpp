// The standalone array API (kvc_quantize / kvc_dequantize): conversion from
// and to f32 / f16 / bf16, rotation, finiteness checks, then encode() /
// decode(); the AVX2 one-pass and fused paths (quantize_avx2.cpp,
// dequantize_avx2.cpp) take the shapes they cover, with the same results.
#include <cstring>
#include <string>

#include "codec/codec.h"
#include "codec/kernels.h"
#include "codec/kernels_avx2.h"
#include "common/error.h"
#include "common/scratch.h"

namespace kvc::codec {

namespace {
// Per-thread scratch (common/scratch.h): grown on demand (no allocation per
// call in steady state), released after a call that made it large.
float *scratch_floats(uint64_t n) {
  thread_local ScratchBuffer<float> buf;
  return buf.get(n);
}
}  // namespace

// (codec.h) f16 / bf16: the exponent field all ones.
void check_finite_raw(const void *src, DType t, uint64_t n, const char *what, uint64_t row,
                      uint64_t head_dim) {
  if (t == DType::F32) return check_finite(static_cast<const float *>(src), n, what, row, head_dim);
  const uint16_t *h = static_cast<const uint16_t *>(src);
  const uint16_t mask = t == DType::F16 ? 0x7c00 : 0x7f80;
#ifdef KVC_CODEC_X86
  if (use_avx512() ? all_finite_16_avx512(h, n, mask)
                   : use_avx2() && all_finite_16_avx2(h, n, mask))
    return;
#endif
  uint16_t any = 0;
  for (uint64_t i = 0; i < n; ++i) any |= static_cast<uint16_t>((h[i] & mask) == mask);
  if (!any) return;
  for (uint64_t i = 0; i < n; ++i)
    if ((h[i] & mask) == mask)
      fail(Errc::NonFinite, element_name(what, i, row, head_dim) + " is " +
                                ((h[i] & (t == DType::F16 ? 0x03ff : 0x007f)) ? "NaN" : "Inf") +
                                ": nothing was written");
}

namespace {
#ifdef KVC_CODEC_X86
// memcpy for the staged outputs: from 1 MiB on, non-temporal stores (the
// destination's lines are written whole, so the caches need not read them
// first: a quarter less memory traffic than memcpy's regular stores).
__attribute__((target("avx2"))) void copy_out(uint8_t *dst, const uint8_t *src, uint64_t n) {
  if (n < (uint64_t(1) << 20) || !use_avx2()) {
    std::memcpy(dst, src, n);
    return;
  }
  const uint64_t head = (32 - reinterpret_cast<uintptr_t>(dst) % 32) % 32;
  std::memcpy(dst, src, head);
  uint64_t i = head;
  for (; i + 128 <= n; i += 128)
    for (int k = 0; k < 4; ++k)
      _mm256_stream_si256(reinterpret_cast<__m256i *>(dst + i + 32 * k),
                          _mm256_loadu_si256(reinterpret_cast<const __m256i *>(src + i + 32 * k)));
  std::memcpy(dst + i, src + i, n - i);
  _mm_sfence();  // the streamed bytes are visible before the call returns
}
#endif
}  // namespace

bool f16_keys_apply(const Spec &s, uint64_t d) {
#ifdef KVC_CODEC_X86
  return use_avx2() && convert_has_simd() && !s.rotation_block && s.static_scale == 0.0 &&
         d % 8 == 0 && d > 0 && (is_int(s.dtype) || is_fp8(s.dtype)) &&
         (s.gran == Gran::Token || (s.gran == Gran::Group && s.group % 8 == 0 && d % s.group == 0));
#else
  (void)s;
  (void)d;
  return false;
#endif
}

uint64_t f16_keys_count(const Spec &s, uint64_t n, uint64_t d) {
  return n * (d / (s.gran == Gran::Group ? s.group : d)) + 4;
}

bool f16_keys(const Spec &s, const uint16_t *x, uint64_t n, uint64_t d, uint16_t *lo,
              uint16_t *hi) {
  if (!f16_keys_apply(s, d)) fail(Errc::Internal, "f16_keys: not the direct path's shape");
  const uint64_t groups = f16_keys_count(s, n, d) - 4;
  for (uint64_t k = groups; k < groups + 4; ++k)
    lo[k] = hi[k] = s.asym || s.full_range ? 0x8000 : 0;
#ifdef KVC_CODEC_X86
  return f16_keys_avx2(s, x, n, d, lo, hi);
#else
  (void)x;
  return false;
#endif
}

void quantize(const Spec &s, const void *src, DType src_type, uint64_t n, uint64_t d,
              uint8_t *codes, uint8_t *scales, uint8_t *zeros, const F16Keys *keys) {
#ifdef KVC_CODEC_X86
  // f16 rows with dynamic per-token or per-group scales and no rotation: the
  // direct path, whose first pass is also the finiteness check (on a NaN or
  // Inf it writes nothing and the check below reports the element) unless
  // the caller's keys stand for it.
  if (src_type == DType::F16 && f16_keys_apply(s, d)) {
    if (quantize_f16_direct_avx2(s, static_cast<const uint16_t *>(src), n, d, codes, scales, zeros,
                                 keys))
      return;
  }
#endif
#ifdef KVC_CODEC_X86
  // The fused path below with no rotation (or f16 input, which no rotation
  // overflows): one read of the input, checking it while it converts (and
  // rotates), into staging copies of the outputs (up to 64 MiB) that reach
  // the caller's buffers only when every row was finite (a separate check
  // would read the whole input once more).
  if (use_avx2() && convert_has_simd() && (!s.rotation_block || src_type == DType::F16) &&
      d % 8 == 0 && d > 0 && (is_int(s.dtype) || is_fp8(s.dtype)) &&
      (src_type == DType::F16 || src_type == DType::F32) &&
      (s.gran == Gran::Token || (s.gran == Gran::Tensor && s.static_scale > 0.0) ||
       (s.gran == Gran::Group && s.group % 8 == 0 && d % s.group == 0))) {
    const uint64_t cb = n * row_bytes(s.dtype, d), sb = num_scales(s, n, d) * scale_bytes(s);
    const uint64_t zb = s.asym ? sb : 0;
    if (cb + sb + zb <= (uint64_t(64) << 20)) {
      thread_local ScratchBuffer<uint8_t> stage;
      uint8_t *st = stage.get(cb + sb + zb + 1);
      float *buf = scratch_floats(quantize_fast_scratch(s, d));
      bool bad = false;
      quantize_fast_avx2(s, src, src_type == DType::F16, n, d, st, sb ? st + cb : nullptr,
                         zb ? st + cb + sb : nullptr, buf, &bad);
      if (bad) {
        check_finite_raw(src, src_type, n * d, "input", d);  // throws, naming the element
        fail(Errc::NonFinite, "the input holds a NaN or Inf: nothing was written");
      }
      copy_out(codes, st, cb);
      if (sb && scales) copy_out(scales, st + cb, sb);
      if (zb && zeros) copy_out(zeros, st + cb + sb, zb);
      return;
    }
  }
#endif
  check_finite_raw(src, src_type, n * d, "input", d);  // before anything is written
  if (s.rotation_block && src_type == DType::F32)
    check_rotatable(static_cast<const float *>(src), n * d, s.rotation_block, "input", d);
  // (f16 and bf16 inputs: f16 is always far below the limit; bf16 is checked after conversion
  // below)
  if (s.rotation_block && src_type == DType::BF16) {
    float *tmp = scratch_floats(n * d);
    convert(src, src_type, tmp, DType::F32, n * d);
    check_rotatable(tmp, n * d, s.rotation_block, "input", d);
  }
  const uint64_t esz = dtype_bytes(src_type);
#ifdef KVC_CODEC_X86
  // Fused path: groups of whole 8-value vectors (per-channel scales and
  // dynamic per-tensor scales need statistics over rows: general path).
  const bool fast_shape =
      d % 8 == 0 && d > 0 &&
      (s.gran == Gran::Token || (s.gran == Gran::Tensor && s.static_scale > 0.0) ||
       (s.gran == Gran::Group && s.group % 8 == 0 && d % s.group == 0));
  if (use_avx2() && convert_has_simd() && fast_shape && (is_int(s.dtype) || is_fp8(s.dtype)) &&
      (src_type == DType::F16 || src_type == DType::F32)) {
    float *buf = scratch_floats(quantize_fast_scratch(s, d));
    quantize_fast_avx2(s, src, src_type == DType::F16, n, d, codes, scales, zeros, buf);
    return;
  }
#endif
  if (s.gran == Gran::Token || s.gran == Gran::Group || s.gran == Gran::None) {
    // Row by row through a small buffer that stays in cache.
    float *row = scratch_floats(d);
    const uint64_t rb = row_bytes(s.dtype, d);
    const uint64_t per_row = n ? num_scales(s, n, d) / n : 0;
    const uint64_t sb = scale_bytes(s);
    for (uint64_t r = 0; r < n; ++r) {
      convert(static_cast<const uint8_t *>(src) + r * d * esz, src_type, row, DType::F32, d);
      if (s.rotation_block) hadamard(row, d, s.rotation_block);
      encode(s, row, 1, d, codes + r * rb, scales ? scales + r * per_row * sb : nullptr,
             zeros ? zeros + r * per_row * sb : nullptr);
    }
    return;
  }
  float *x = scratch_floats(n * d);
  convert(src, src_type, x, DType::F32, n * d);
  if (s.rotation_block)
    for (uint64_t r = 0; r < n; ++r) hadamard(x + r * d, d, s.rotation_block);
  encode(s, x, n, d, codes, scales, zeros);
}

void dequantize(const Spec &s, const uint8_t *codes, const uint8_t *scales, const uint8_t *zeros,
                uint64_t n, uint64_t d, void *dst, DType dst_type) {
  const uint64_t esz = dtype_bytes(dst_type);
#ifdef KVC_CODEC_X86
  const bool fast_shape = d % 8 == 0 && d > 0 &&
                          (s.gran == Gran::Token || s.gran == Gran::Tensor ||
                           (s.gran == Gran::Group && s.group % 8 == 0 && d % s.group == 0));
  if (use_avx2() && convert_has_simd() && fast_shape && has_scales(s) && !s.rotation_block &&
      (dst_type == DType::F16 || dst_type == DType::F32)) {
    if (dequantize_direct_avx2(s, dst_type == DType::F16, codes, scales, zeros, n, d, dst)) return;
  }
  const bool fast_any = d % 8 == 0 && d > 0 && has_scales(s) &&
                        (s.gran == Gran::Token || s.gran == Gran::Tensor ||
                         (s.gran == Gran::Group && s.group % 8 == 0 && d % s.group == 0));
  if (use_avx2() && convert_has_simd() && fast_any &&
      (dst_type == DType::F16 || dst_type == DType::F32)) {
    float *buf = scratch_floats(d);
    dequantize_fast_avx2(s, dst_type == DType::F16, codes, scales, zeros, n, d, dst, buf);
    return;
  }
#endif
  if (dst_type == DType::F32 && !s.rotation_block) {
    decode(s, codes, scales, zeros, n, d, static_cast<float *>(dst));
    return;
  }
  if (s.gran == Gran::Token || s.gran == Gran::Group || s.gran == Gran::None) {
    float *row = scratch_floats(d);
    const uint64_t rb = row_bytes(s.dtype, d);
    const uint64_t per_row = n ? num_scales(s, n, d) / n : 0;
    const uint64_t sb = scale_bytes(s);
    for (uint64_t r = 0; r < n; ++r) {
      decode(s, codes + r * rb, scales ? scales + r * per_row * sb : nullptr,
             zeros ? zeros + r * per_row * sb : nullptr, 1, d, row);
      if (s.rotation_block) hadamard(row, d, s.rotation_block);
      convert(row, DType::F32, static_cast<uint8_t *>(dst) + r * d * esz, dst_type, d);
    }
    return;
  }
  float *x = scratch_floats(n * d);
  decode(s, codes, scales, zeros, n, d, x);
  if (s.rotation_block)
    for (uint64_t r = 0; r < n; ++r) hadamard(x + r * d, d, s.rotation_block);
  convert(x, DType::F32, dst, dst_type, n * d);
}

}  // namespace kvc::codec
