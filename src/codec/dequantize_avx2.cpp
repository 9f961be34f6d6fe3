// dequantize()'s AVX2 paths (x86-64): integer and fp8 codes straight to f16 or
// f32 in one pass (no rotation), and the fused path (run kernels into an L1
// row buffer, the inverse rotation, one conversion pass). The scalar path's
// operations, so the same bits.
#include "codec/kernels.h"

#ifdef KVC_CODEC_X86
#include <immintrin.h>

#include <cmath>
#include <cstring>

#include "codec/codec.h"
#include "codec/fp8_avx2.h"
#include "codec/hadamard_avx2.h"
#include "codec/kernels_avx2.h"

namespace kvc::codec {

namespace {
// A scale or zero point as stored (f16 through F16C: exact, as load_scale).
__attribute__((target("avx2,f16c"), always_inline)) inline float load_scale_fast(const uint8_t *p,
                                                                                 DType sd) {
  if (sd == DType::F32) {
    float v;
    std::memcpy(&v, p, 4);  // little-endian, as store_scale writes
    return v;
  }
  uint16_t h;
  std::memcpy(&h, p, 2);
  return _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(h)));
}

template <bool Half>
__attribute__((target("avx2,f16c"), always_inline)) inline void store8(void *dst, uint64_t i,
                                                                       __m256 x) {
  if constexpr (Half)
    _mm_storeu_si128(reinterpret_cast<__m128i *>(static_cast<uint16_t *>(dst) + i),
                     _mm256_cvtps_ph(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
  else
    _mm256_storeu_ps(static_cast<float *>(dst) + i, x);
}

// Integer codes (any width, symmetric, asymmetric or full range) with
// per-tensor, per-token or per-group scales, no rotation, straight to f16 or
// f32: q * scale (+ zero) in f32, then (for f16) the F16C conversion with
// round half to even: the scalar path's operations, in one pass.
template <bool Half, int Bits, bool Asym>
__attribute__((target("avx2,f16c"))) void dequantize_int_direct(const Spec &s, const uint8_t *codes,
                                                                const uint8_t *scales,
                                                                const uint8_t *zeros, uint64_t n,
                                                                uint64_t d, void *dst) {
  const uint64_t g = s.gran == Gran::Group ? s.group : d, ng = d / g;
  const uint64_t rb = row_bytes(s.dtype, d), sb = scale_bytes(s);
  const IntFormat f = int_format(s.dtype, s.asym, s.full_range);
  const __m256i off = _mm256_set1_epi32(Bits == 8 ? 0 : f.off);
  for (uint64_t r = 0; r < n; ++r) {
    const uint8_t *in = codes + r * rb;
    for (uint64_t gi = 0; gi < ng; ++gi) {
      const uint64_t idx = s.gran == Gran::Tensor ? 0 : r * ng + gi;
      const __m256 vs = _mm256_set1_ps(load_scale_fast(scales + idx * sb, s.scale_dtype));
      const __m256 vz = Asym ? _mm256_set1_ps(load_scale_fast(zeros + idx * sb, s.scale_dtype))
                             : _mm256_setzero_ps();
      for (uint64_t j = gi * g; j < (gi + 1) * g; j += 8) {
        const __m256 x = _mm256_mul_ps(_mm256_cvtepi32_ps(unpack8<Bits, Asym>(in, j, off)), vs);
        store8<Half>(dst, r * d + j, Asym ? _mm256_add_ps(x, vz) : x);
      }
    }
  }
}

// dequantize_int_direct for the output type (f16 or f32) and the mode.
template <int Bits>
void dequantize_int_direct_any(const Spec &s, bool half, const uint8_t *codes,
                               const uint8_t *scales, const uint8_t *zeros, uint64_t n, uint64_t d,
                               void *dst) {
  if (s.asym)
    half ? dequantize_int_direct<true, Bits, true>(s, codes, scales, zeros, n, d, dst)
         : dequantize_int_direct<false, Bits, true>(s, codes, scales, zeros, n, d, dst);
  else
    half ? dequantize_int_direct<true, Bits, false>(s, codes, scales, zeros, n, d, dst)
         : dequantize_int_direct<false, Bits, false>(s, codes, scales, zeros, n, d, dst);
}

// fp8 codes with per-tensor, per-token or per-group scales, no rotation,
// straight to f16 or f32. A code moved into the f16 fields is the code's value
// exactly: e5m2 is f16's top byte; e4m3's sign, exponent and mantissa placed
// as f16's give value x 2^-8 for normal and subnormal codes alike (x 256 is
// exact). Then x scale in f32 (the table's value times the scale, as the
// scalar path computes it) and the F16C conversion. A group holding e4m3's
// NaN code (0x7f / 0xff) or an e5m2 Inf / NaN code (never written by the
// encoder, possible in caller-supplied codes) takes the table.
template <bool Half, bool E4M3>
__attribute__((target("avx2,f16c"))) void dequantize_fp8_direct(const Spec &s, const uint8_t *codes,
                                                                const uint8_t *scales, uint64_t n,
                                                                uint64_t d, void *dst) {
  const uint64_t g = s.gran == Gran::Group ? s.group : d, ng = d / g;
  const uint64_t sb = scale_bytes(s);
  const float *table = E4M3 ? fp8_e4m3_table() : fp8_e5m2_table();
  const __m256 two8 = _mm256_set1_ps(256.0f);
  for (uint64_t r = 0; r < n; ++r) {
    const uint8_t *in = codes + r * d;
    for (uint64_t gi = 0; gi < ng; ++gi) {
      const uint64_t idx = s.gran == Gran::Tensor ? 0 : r * ng + gi;
      const float sc = load_scale_fast(scales + idx * sb, s.scale_dtype);
      const __m256 vs = _mm256_set1_ps(sc);
      for (uint64_t j = gi * g; j < (gi + 1) * g; j += 8) {
        const __m128i b = _mm_loadl_epi64(reinterpret_cast<const __m128i *>(in + j));
        __m128i h = _mm_unpacklo_epi8(_mm_setzero_si128(), b);  // code << 8 in 8 u16 lanes
        __m256 x;
        // e4m3: 0x7f / 0xff (NaN); e5m2: exponent field all ones (Inf, NaN).
        const __m128i special =
            E4M3 ? _mm_cmpeq_epi8(_mm_or_si128(b, _mm_set1_epi8(static_cast<char>(0x80))),
                                  _mm_set1_epi8(static_cast<char>(0xff)))
                 : _mm_cmpeq_epi8(_mm_and_si128(b, _mm_set1_epi8(0x7c)), _mm_set1_epi8(0x7c));
        if (_mm_movemask_epi8(special) & 0xff) {
          float t[8];
          for (int k = 0; k < 8; ++k) t[k] = table[in[j + k]] * sc;
          store8<Half>(dst, r * d + j, _mm256_loadu_ps(t));
          continue;
        }
        if constexpr (E4M3) {
          h = _mm_or_si128(_mm_and_si128(h, _mm_set1_epi16(static_cast<short>(0x8000))),
                           _mm_srli_epi16(_mm_and_si128(h, _mm_set1_epi16(0x7f00)), 1));
          x = _mm256_mul_ps(_mm256_cvtph_ps(h), two8);
        } else {
          x = _mm256_cvtph_ps(h);
        }
        store8<Half>(dst, r * d + j, _mm256_mul_ps(x, vs));
      }
    }
  }
}

// One row's integer groups (g a multiple of 8) decoded into x: the run
// kernel's vector step (decode_int_run_avx2_bits: the code times the scale,
// plus the zero point) inline, without a call per group.
template <int Bits, bool Asym>
__attribute__((target("avx2"), always_inline)) inline void decode_groups_row(
    const IntFormat &f, const uint8_t *in, uint64_t ng, uint64_t g, const uint8_t *scales,
    const uint8_t *zeros, uint64_t sb, DType sd, float *x) {
  const __m256i off = _mm256_set1_epi32(f.off);
  for (uint64_t gi = 0; gi < ng; ++gi) {
    const __m256 s = _mm256_set1_ps(inl::load_scale(scales + gi * sb, sd));
    const __m256 z = Asym ? _mm256_set1_ps(inl::load_scale(zeros + gi * sb, sd)) : s;
    for (uint64_t j = gi * g; j < (gi + 1) * g; j += 8) {
      const __m256 r = _mm256_mul_ps(_mm256_cvtepi32_ps(unpack8<Bits, Asym>(in, j, off)), s);
      _mm256_storeu_ps(x + j, Asym ? _mm256_add_ps(r, z) : r);
    }
  }
}
template <int Bits>
__attribute__((target("avx2"))) void decode_groups_rows(const IntFormat &f, bool asym,
                                                        const uint8_t *in, uint64_t ng, uint64_t g,
                                                        const uint8_t *scales, const uint8_t *zeros,
                                                        uint64_t sb, DType sd, float *x) {
  if (asym)
    decode_groups_row<Bits, true>(f, in, ng, g, scales, zeros, sb, sd, x);
  else
    decode_groups_row<Bits, false>(f, in, ng, g, scales, zeros, sb, sd, x);
}

// The inverse rotation of 8 NV decoded values x, written to dst (f16 or
// f32) from element o.
template <bool Half, int NV>
__attribute__((target("avx2,fma,f16c"), always_inline)) inline void unrotate_block(const float *x,
                                                                                   void *dst,
                                                                                   uint64_t o,
                                                                                   __m256 norm) {
  __m256 r[NV];
#pragma GCC unroll 16
  for (int i = 0; i < NV; ++i) r[i] = _mm256_loadu_ps(x + 8 * i);
  rotate_regs<NV>(r, norm);
#pragma GCC unroll 16
  for (int i = 0; i < NV; ++i) store8<Half>(dst, o + 8 * i, r[i]);
}

// Every integer and fp8 codec with per-tensor, per-token or per-group scales
// (and the rotation) to f16 or f32: each group decoded by the run kernels
// into an L1 row buffer (or straight into f32 output), the inverse rotation
// applied there, then one F16C conversion pass. The scalar path's operations.
template <bool Half>
__attribute__((target("avx2,fma,f16c"))) void dequantize_fast(const Spec &s, const uint8_t *codes,
                                                              const uint8_t *scales,
                                                              const uint8_t *zeros, uint64_t n,
                                                              uint64_t d, void *dst, float *buf) {
  const uint64_t g = s.gran == Gran::Group ? s.group : d, ng = d / g;
  const uint64_t rb = row_bytes(s.dtype, d), sb = scale_bytes(s);
  const bool integer = is_int(s.dtype), rotate = s.rotation_block != 0;
  const IntFormat f = int_format(s.dtype, s.asym, s.full_range);
  const float *table = s.dtype == DType::FP8_E4M3 ? fp8_e4m3_table() : fp8_e5m2_table();
  // hadamard()'s normalization, the same float.
  const __m256 vnorm =
      _mm256_set1_ps(rotate ? 1.0f / std::sqrt(static_cast<float>(s.rotation_block)) : 1.0f);
  // Rotated int8 / int4 rows with 512-bit vectors: decoded straight into
  // the transform's registers (quantize_avx512.cpp; the same bits).
  const bool fused512 = use_avx512() && rotate && hadamard_in_registers(s.rotation_block) &&
                        integer && (f.bits == 8 || f.bits == 4) && s.gran != Gran::Tensor &&
                        g % 16 == 0;
  for (uint64_t r = 0; r < n; ++r) {
    const uint8_t *in = codes + r * rb;
    float *x = Half || rotate ? buf : static_cast<float *>(dst) + r * d;
    if (fused512) {
      decode_unrotate_row_avx512(
          f.bits, s.asym, f.off, in, scales + r * ng * sb, s.asym ? zeros + r * ng * sb : nullptr,
          s.scale_dtype == DType::F16, g, d, s.rotation_block, _mm256_cvtss_f32(vnorm), Half,
          static_cast<uint8_t *>(dst) + r * d * (Half ? 2 : 4));
      continue;
    }
    if (integer && s.gran != Gran::Tensor && g % 8 == 0) {
      const uint8_t *sc = scales + r * ng * sb, *zr = s.asym ? zeros + r * ng * sb : nullptr;
      switch (f.bits) {
        case 8:
          decode_groups_rows<8>(f, s.asym, in, ng, g, sc, zr, sb, s.scale_dtype, x);
          break;
        case 4:
          decode_groups_rows<4>(f, s.asym, in, ng, g, sc, zr, sb, s.scale_dtype, x);
          break;
        case 3:
          decode_groups_rows<3>(f, s.asym, in, ng, g, sc, zr, sb, s.scale_dtype, x);
          break;
        default:
          decode_groups_rows<2>(f, s.asym, in, ng, g, sc, zr, sb, s.scale_dtype, x);
      }
    } else {
      for (uint64_t gi = 0; gi < ng; ++gi) {
        const uint64_t idx = s.gran == Gran::Tensor ? 0 : r * ng + gi;
        Params p;
        p.scale = inl::load_scale(scales + idx * sb, s.scale_dtype);
        if (s.asym) p.zero = inl::load_scale(zeros + idx * sb, s.scale_dtype);
        if (integer)
          decode_int_run_avx2(f, s.asym, in, gi * g, (gi + 1) * g, p, x);
        else if (s.dtype == DType::FP8_E4M3)
          decode_fp8_run_avx2<3, 7>(table, in, gi * g, (gi + 1) * g, p.scale, x);
        else
          decode_fp8_run_avx2<2, 15>(table, in, gi * g, (gi + 1) * g, p.scale, x);
      }
    }
    if (rotate && hadamard_in_registers(s.rotation_block)) {
      // The inverse rotation a block at a time in registers, written
      // straight to the output (converted to f16 there).
      if (use_avx512()) {  // 16 lanes, 32 registers (quantize_avx512.cpp: the same bits)
        unrotate_row_avx512(buf, Half, static_cast<uint8_t *>(dst) + r * d * (Half ? 2 : 4), d,
                            s.rotation_block, _mm256_cvtss_f32(vnorm));
        continue;
      }
      for (uint64_t b = 0; b < d; b += s.rotation_block) {
        if (s.rotation_block == 128)
          unrotate_block<Half, 16>(buf + b, dst, r * d + b, vnorm);
        else
          unrotate_block<Half, 8>(buf + b, dst, r * d + b, vnorm);
      }
      continue;
    }
    if (rotate) hadamard(buf, d, s.rotation_block);
    if constexpr (Half) {
      uint16_t *o = static_cast<uint16_t *>(dst) + r * d;
      for (uint64_t j = 0; j < d; j += 8)
        _mm_storeu_si128(reinterpret_cast<__m128i *>(o + j),
                         _mm256_cvtps_ph(_mm256_loadu_ps(buf + j),
                                         _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
    } else if (rotate) {
      std::memcpy(static_cast<float *>(dst) + r * d, buf, d * 4);
    }
  }
}
}  // namespace

bool dequantize_direct_avx2(const Spec &s, bool half, const uint8_t *codes, const uint8_t *scales,
                            const uint8_t *zeros, uint64_t n, uint64_t d, void *dst) {
  switch (s.dtype) {
    case DType::INT8:
      dequantize_int_direct_any<8>(s, half, codes, scales, zeros, n, d, dst);
      return true;
    case DType::INT4:
      dequantize_int_direct_any<4>(s, half, codes, scales, zeros, n, d, dst);
      return true;
    case DType::INT3:
      dequantize_int_direct_any<3>(s, half, codes, scales, zeros, n, d, dst);
      return true;
    case DType::INT2:
      dequantize_int_direct_any<2>(s, half, codes, scales, zeros, n, d, dst);
      return true;
    case DType::FP8_E4M3:
      if (half)
        dequantize_fp8_direct<true, true>(s, codes, scales, n, d, dst);
      else
        dequantize_fp8_direct<false, true>(s, codes, scales, n, d, dst);
      return true;
    case DType::FP8_E5M2:
      if (half)
        dequantize_fp8_direct<true, false>(s, codes, scales, n, d, dst);
      else
        dequantize_fp8_direct<false, false>(s, codes, scales, n, d, dst);
      return true;
    default:
      return false;
  }
}

void dequantize_fast_avx2(const Spec &s, bool half, const uint8_t *codes, const uint8_t *scales,
                          const uint8_t *zeros, uint64_t n, uint64_t d, void *dst, float *buf) {
  if (half)
    dequantize_fast<true>(s, codes, scales, zeros, n, d, dst, buf);
  else
    dequantize_fast<false>(s, codes, scales, zeros, n, d, dst, buf);
}

}  // namespace kvc::codec
#endif
