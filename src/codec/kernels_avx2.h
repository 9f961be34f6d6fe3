// AVX2 run kernels of the integer codes, the vector helpers the fp8 kernels
// and the standalone API's one-pass paths share, min / max of a run and the
// finiteness checks (x86-64 only: each function carries its own target
// attribute). Results are the scalar reference's (scalar.h), bit for bit.
#pragma once
#include "codec/kernels.h"
#include "codec/scalar.h"

#ifdef KVC_CODEC_X86
#include <immintrin.h>

#include <cstring>

namespace kvc::codec {
namespace {

// Clamped to the code range, then converted with the current rounding mode
// (round half to even, as std::nearbyint in the scalar reference).
// 8 values of a row of f16 (Half) or f32 from element j (exact conversion).
template <bool Half>
__attribute__((target("avx2,f16c"), always_inline)) inline __m256 load8(const void *row,
                                                                        uint64_t j) {
  if constexpr (Half)
    return _mm256_cvtph_ps(
        _mm_loadu_si128(reinterpret_cast<const __m128i *>(static_cast<const uint16_t *>(row) + j)));
  else
    return _mm256_loadu_ps(static_cast<const float *>(row) + j);
}

// Clamp false: the caller knows |y * inv| stays below qmax + 1/2 (a
// symmetric group's own absmax scale), where the clamp changes nothing.
template <bool Asym, bool Clamp = true>
__attribute__((target("avx2"), always_inline)) inline __m256i quant8_avx2(__m256 y, __m256 inv,
                                                                          __m256 z, __m256 lo,
                                                                          __m256 hi) {
  y = Asym ? _mm256_mul_ps(_mm256_sub_ps(y, z), inv) : _mm256_mul_ps(y, inv);
  if constexpr (Clamp) y = _mm256_min_ps(_mm256_max_ps(y, lo), hi);
  return _mm256_cvtps_epi32(y);
}

// 32 values from element j of x (f16 or f32) -> 32 byte codes (code = q +
// off, q already clamped), in order. q is packed to bytes first and off (in
// every byte of off8) added once: q fits a signed byte for every format but
// asymmetric int8 (wide: q in 0..255, off 0, unsigned packs).
template <bool Asym, bool Half, bool Clamp = true>
__attribute__((target("avx2,f16c"), always_inline)) inline __m256i codes32_avx2(
    const void *x, uint64_t j, __m256 inv, __m256 z, __m256 lo, __m256 hi, __m256i off8,
    bool wide) {
  const __m256i q0 = quant8_avx2<Asym, Clamp>(load8<Half>(x, j), inv, z, lo, hi);
  const __m256i q1 = quant8_avx2<Asym, Clamp>(load8<Half>(x, j + 8), inv, z, lo, hi);
  const __m256i q2 = quant8_avx2<Asym, Clamp>(load8<Half>(x, j + 16), inv, z, lo, hi);
  const __m256i q3 = quant8_avx2<Asym, Clamp>(load8<Half>(x, j + 24), inv, z, lo, hi);
  const __m256i a = _mm256_packs_epi32(q0, q1), b = _mm256_packs_epi32(q2, q3);
  const __m256i c =
      wide ? _mm256_packus_epi16(a, b) : _mm256_add_epi8(_mm256_packs_epi16(a, b), off8);
  return _mm256_permutevar8x32_epi32(c, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
}

// 32 byte codes (each < 16, in order) -> their 16 bytes of int4 codes, low
// nibble first: c0 + 16 c1 per 16-bit lane, packed.
__attribute__((target("avx2"), always_inline)) inline void store_int4_32(__m256i c, uint8_t *out) {
  const __m256i w16 = _mm256_maddubs_epi16(c, _mm256_set1_epi16(0x1001));
  const __m256i packed = _mm256_permute4x64_epi64(_mm256_packus_epi16(w16, w16), 0xd8);
  _mm_storeu_si128(reinterpret_cast<__m128i *>(out), _mm256_castsi256_si128(packed));
}

// 32 byte codes (each < 8, in order) -> the 12 bytes of their int3 bit
// string: c0 + 8 c1 per 16-bit lane, then 4 codes (12 bits) per 32-bit lane,
// then 8 codes (24 bits) per 64-bit lane, 3 bytes each.
__attribute__((target("avx2"), always_inline)) inline void store_int3_32(__m256i c, uint8_t *out) {
  const __m256i w16 = _mm256_maddubs_epi16(c, _mm256_set1_epi16(0x0801));     // c0 + 8 c1
  const __m256i w32 = _mm256_madd_epi16(w16, _mm256_set1_epi32(0x00400001));  // + 64 (c2 + 8 c3)
  const __m256i w64 = _mm256_and_si256(_mm256_or_si256(w32, _mm256_srli_epi64(w32, 20)),
                                       _mm256_set1_epi64x(0xffffff));
  const uint64_t lo = static_cast<uint64_t>(_mm256_extract_epi64(w64, 0)) |
                      static_cast<uint64_t>(_mm256_extract_epi64(w64, 1)) << 24;
  const uint64_t hi = static_cast<uint64_t>(_mm256_extract_epi64(w64, 2)) |
                      static_cast<uint64_t>(_mm256_extract_epi64(w64, 3)) << 24;
  std::memcpy(out, &lo, 6);  // little-endian (x86)
  std::memcpy(out + 6, &hi, 6);
}

// The 8 int3 codes of elements j .. j + 7 (j a multiple of 8) in 8 lanes.
__attribute__((target("avx2"), always_inline)) inline __m256i load_int3_8(const uint8_t *in,
                                                                          uint64_t j) {
  const uint8_t *p = in + j / 8 * 3;
  const uint32_t w = static_cast<uint32_t>(p[0]) | static_cast<uint32_t>(p[1]) << 8 |
                     static_cast<uint32_t>(p[2]) << 16;
  const __m256i v = _mm256_srlv_epi32(_mm256_set1_epi32(static_cast<int>(w)),
                                      _mm256_setr_epi32(0, 3, 6, 9, 12, 15, 18, 21));
  return _mm256_and_si256(v, _mm256_set1_epi32(0x7));
}

// Codes of elements [j0, j1) of a row x of f32 or (Half) f16 values.
template <bool Asym, bool Half = false, bool Clamp = true>
__attribute__((target("avx2,f16c"))) void encode_int_run_avx2(const IntFormat &f, const void *x,
                                                              uint64_t j0, uint64_t j1,
                                                              const Params &p, uint8_t *out) {
  const __m256 inv = _mm256_set1_ps(p.inv), z = _mm256_set1_ps(p.zero);
  const __m256 lo = _mm256_set1_ps(f.lo), hi = _mm256_set1_ps(f.hi);
  const __m256i off8 = _mm256_set1_epi8(static_cast<char>(f.off));
  uint64_t j = j0;
  // Vector part: 32 values at a time, starting on a byte boundary of the codes.
  const uint64_t per_byte = code_unit(f.bits);
  if (j % per_byte != 0 && !Half)
    return encode_int_run_scalar(f, Asym, static_cast<const float *>(x), j0, j1, p, out);
  for (; j + 32 <= j1 && j % per_byte == 0; j += 32) {
    const __m256i c =
        codes32_avx2<Asym, Half, Clamp>(x, j, inv, z, lo, hi, off8, f.bits == 8 && Asym);
    if (f.bits == 8) {
      _mm256_storeu_si256(reinterpret_cast<__m256i *>(out + j), c);
    } else if (f.bits == 4) {  // int4: pairs of bytes -> one byte, low nibble first
      store_int4_32(c, out + j / 2);
    } else if (f.bits == 3) {
      store_int3_32(c, out + j / 8 * 3);
    } else {  // int2: four bytes -> one byte, c0 | c1 << 2 | c2 << 4 | c3 << 6
      const __m256i w16 = _mm256_maddubs_epi16(c, _mm256_set1_epi16(0x0401));  // c0 + 4 c1
      const __m256i w32 =
          _mm256_madd_epi16(w16, _mm256_set1_epi32(0x00100001));  // + 16 (c2 + 4 c3)
      const __m256i b8 = _mm256_packus_epi16(_mm256_packus_epi32(w32, w32), _mm256_setzero_si256());
      const __m256i lanes =
          _mm256_permutevar8x32_epi32(b8, _mm256_setr_epi32(0, 4, 0, 0, 0, 0, 0, 0));
      _mm_storel_epi64(reinterpret_cast<__m128i *>(out + j / 4), _mm256_castsi256_si128(lanes));
    }
  }
  if constexpr (Half) {
    const uint16_t *h = static_cast<const uint16_t *>(x);
    for (; j < j1; ++j)
      put_code(
          out, f.bits, j,
          static_cast<uint32_t>(quant_int(f16_to_f32_scalar(h[j]), p, Asym, f.lo, f.hi) + f.off) &
              ((1u << f.bits) - 1u));
  } else {
    encode_int_run_scalar(f, Asym, static_cast<const float *>(x), j, j1, p, out);
  }
}

// 8 codes from element j of a row of `Bits`-bit codes, as int32 q = code - off
// (int8 symmetric: the signed byte).
template <int Bits, bool Asym>
__attribute__((target("avx2"), always_inline)) inline __m256i unpack8(const uint8_t *in, uint64_t j,
                                                                      __m256i off) {
  if constexpr (Bits == 8) {
    const __m128i b = _mm_loadl_epi64(reinterpret_cast<const __m128i *>(in + j));
    return Asym ? _mm256_cvtepu8_epi32(b) : _mm256_cvtepi8_epi32(b);
  } else if constexpr (Bits == 3) {
    return _mm256_sub_epi32(load_int3_8(in, j), off);
  } else if constexpr (Bits == 4) {
    uint32_t w;
    std::memcpy(&w, in + j / 2, 4);
    const __m256i v = _mm256_srlv_epi32(_mm256_set1_epi32(static_cast<int>(w)),
                                        _mm256_setr_epi32(0, 4, 8, 12, 16, 20, 24, 28));
    return _mm256_sub_epi32(_mm256_and_si256(v, _mm256_set1_epi32(0xf)), off);
  } else {
    uint16_t w;
    std::memcpy(&w, in + j / 4, 2);
    const __m256i v = _mm256_srlv_epi32(_mm256_set1_epi32(static_cast<int>(w)),
                                        _mm256_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14));
    return _mm256_sub_epi32(_mm256_and_si256(v, _mm256_set1_epi32(0x3)), off);
  }
}

// x[j] = q * scale (+ zero when asymmetric) for j in [j0, j1), 8 at a time:
// a multiply, then an add, as the scalar path (the same bytes). PerColumn:
// the scale and zero point of column j are sc[j] and zr[j] (per-channel
// keys); else p's.
template <int Bits, bool PerColumn>
__attribute__((target("avx2"))) void decode_int_run_avx2_bits(const IntFormat &f, bool asym,
                                                              const uint8_t *in, uint64_t j0,
                                                              uint64_t j1, const Params &p,
                                                              const float *sc, const float *zr,
                                                              float *x) {
  const __m256 s = _mm256_set1_ps(p.scale), z = _mm256_set1_ps(p.zero);
  const __m256i off = _mm256_set1_epi32(f.off);
  uint64_t j = j0;
  for (; j + 8 <= j1; j += 8) {
    const __m256 r = _mm256_mul_ps(_mm256_cvtepi32_ps(asym ? unpack8<Bits, true>(in, j, off)
                                                           : unpack8<Bits, false>(in, j, off)),
                                   PerColumn ? _mm256_loadu_ps(sc + j) : s);
    _mm256_storeu_ps(x + j, asym ? _mm256_add_ps(r, PerColumn ? _mm256_loadu_ps(zr + j) : z) : r);
  }
  if constexpr (PerColumn) {
    for (; j < j1; ++j) {
      Params pj;
      pj.scale = sc[j];
      pj.zero = asym ? zr[j] : 0.0f;
      decode_int_run_scalar(f, asym, in, j, j + 1, pj, x);
    }
  } else {
    decode_int_run_scalar(f, asym, in, j, j1, p, x);
  }
}

template <bool PerColumn>
__attribute__((target("avx2"))) void decode_int_run_avx2_any(const IntFormat &f, bool asym,
                                                             const uint8_t *in, uint64_t j0,
                                                             uint64_t j1, const Params &p,
                                                             const float *sc, const float *zr,
                                                             float *x) {
  switch (f.bits) {
    case 8:
      return decode_int_run_avx2_bits<8, PerColumn>(f, asym, in, j0, j1, p, sc, zr, x);
    case 3:
      return decode_int_run_avx2_bits<3, PerColumn>(f, asym, in, j0, j1, p, sc, zr, x);
    case 2:
      return decode_int_run_avx2_bits<2, PerColumn>(f, asym, in, j0, j1, p, sc, zr, x);
    default:
      return decode_int_run_avx2_bits<4, PerColumn>(f, asym, in, j0, j1, p, sc, zr, x);
  }
}

[[maybe_unused]] __attribute__((target("avx2"))) void decode_int_run_avx2(
    const IntFormat &f, bool asym, const uint8_t *in, uint64_t j0, uint64_t j1, const Params &p,
    float *x) {
  if (j0 % code_unit(f.bits) != 0) return decode_int_run_scalar(f, asym, in, j0, j1, p, x);
  decode_int_run_avx2_any<false>(f, asym, in, j0, j1, p, nullptr, nullptr, x);
}

// A whole row of d values whose scale and zero point differ per column
// (per-channel keys: sc[j], zr[j]).
[[maybe_unused]] __attribute__((target("avx2"))) void decode_int_row_channel_avx2(
    const IntFormat &f, bool asym, const uint8_t *in, uint64_t d, const float *sc, const float *zr,
    float *x) {
  decode_int_run_avx2_any<true>(f, asym, in, 0, d, Params{}, sc, zr, x);
}

[[maybe_unused]] __attribute__((target("avx2"))) void min_max_avx2(const float *x, uint64_t n,
                                                                   float *lo, float *hi) {
  __m256 a = _mm256_set1_ps(x[0]), b = a;
  uint64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256 v = _mm256_loadu_ps(x + i);
    a = _mm256_min_ps(a, v);
    b = _mm256_max_ps(b, v);
  }
  float la[8], lb[8];
  _mm256_storeu_ps(la, a);
  _mm256_storeu_ps(lb, b);
  float ra = la[0], rb = lb[0];
  for (int k = 1; k < 8; ++k) {
    ra = la[k] < ra ? la[k] : ra;
    rb = lb[k] > rb ? lb[k] : rb;
  }
  for (; i < n; ++i) {
    ra = x[i] < ra ? x[i] : ra;
    rb = x[i] > rb ? x[i] : rb;
  }
  *lo = ra;
  *hi = rb;
}

[[maybe_unused]] __attribute__((target("avx2"))) bool all_finite_avx2(const float *x, uint64_t n) {
  const __m256i expo = _mm256_set1_epi32(0x7f800000);
  __m256i bad = _mm256_setzero_si256();
  uint64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256i v =
        _mm256_and_si256(_mm256_loadu_si256(reinterpret_cast<const __m256i *>(x + i)), expo);
    bad = _mm256_or_si256(bad, _mm256_cmpeq_epi32(v, expo));
  }
  if (!_mm256_testz_si256(bad, bad)) return false;
  for (; i < n; ++i)
    if (!std::isfinite(x[i])) return false;
  return true;
}

// True when no 16-bit float has its exponent field (mask) all ones: the
// largest magnitude's bits (h & 0x7fff, ordered as the magnitudes are) are
// below mask; two independent maxima, 32 values a step.
[[maybe_unused]] __attribute__((target("avx2"))) bool all_finite_16_avx2(const uint16_t *h,
                                                                         uint64_t n,
                                                                         uint16_t mask) {
  const __m256i abs = _mm256_set1_epi16(0x7fff);
  __m256i m0 = _mm256_setzero_si256(), m1 = m0;
  uint64_t i = 0;
  for (; i + 32 <= n; i += 32) {
    m0 = _mm256_max_epu16(
        m0, _mm256_and_si256(_mm256_loadu_si256(reinterpret_cast<const __m256i *>(h + i)), abs));
    m1 = _mm256_max_epu16(
        m1,
        _mm256_and_si256(_mm256_loadu_si256(reinterpret_cast<const __m256i *>(h + i + 16)), abs));
  }
  const __m256i m = _mm256_max_epu16(m0, m1);
  const __m256i thr = _mm256_set1_epi16(static_cast<short>(mask));
  // lanes where m >= mask: max(m, mask) == m
  if (!_mm256_testz_si256(_mm256_cmpeq_epi16(_mm256_max_epu16(m, thr), m),
                          _mm256_cmpeq_epi16(_mm256_max_epu16(m, thr), m)))
    return false;
  for (; i < n; ++i)
    if ((h[i] & mask) == mask) return false;
  return true;
}

}  // namespace
}  // namespace kvc::codec
#endif
