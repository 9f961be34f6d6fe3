#include "codec/codec.h"

#if defined(__x86_64__)
#include <immintrin.h>
#endif

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <vector>

#include "common/fp8.h"
#include "common/error.h"
#include "common/scratch.h"

namespace kvc::codec {


namespace {

std::string fmt_g(double v) {
  char b[32];
  std::snprintf(b, sizeof b, "%g", v);
  return b;
}

std::string u64s(uint64_t v) { return std::to_string(v); }

struct Params {
  float scale = 0.0f;  // stored value
  float inv = 0.0f;    // 1 / scale (0 when scale is 0)
  float zero = 0.0f;   // stored zero point (asymmetric)
};

int qmax_sym(DType d) { return d == DType::INT8 ? 127 : d == DType::INT4 ? 7 : d == DType::INT3 ? 3 : 1; }
int qmax_asym(DType d) { return d == DType::INT8 ? 255 : d == DType::INT4 ? 15 : d == DType::INT3 ? 7 : 3; }
float fp8_max(DType d) { return d == DType::FP8_E4M3 ? kFp8E4m3Max : kFp8E5m2Max; }

// Scales are computed in double (so max - min cannot overflow), never below
// the smallest normal float (so 1 / scale stays finite: a group of tiny
// values still quantizes within half a step instead of giving 0 * Inf), and
// rounded up to the scale dtype (so no value of the group is clipped by it).
__attribute__((always_inline)) inline Params make_params(const Spec &s, float lo, float hi) {
  Params p;
  if (s.static_scale != 0.0) {
    // The scale as stored (rounded to the scale dtype), so encoding and
    // decoding use the same value. (Negative only for a pool's per-tensor
    // full-range scale, calibrated by dynamic_scale(); callers' static scales
    // are validated positive.)
    p.scale = s.scale_dtype == DType::F16
                  ? f16_to_f32_scalar(f32_to_f16_scalar(static_cast<float>(s.static_scale)))
                  : static_cast<float>(s.static_scale);
    p.inv = 1.0f / p.scale;
    return p;
  }
  lo += 0.0f;  // -0 -> +0: every path (any min/max order) gets the same zero point
  hi += 0.0f;
  double raw;
  if (is_int(s.dtype) && s.asym) {
    // q * scale + zero must stay finite: asymmetric codes cover at most
    // [-1e38, 1e38] (values beyond saturate).
    lo = std::max(lo, -1e38f);
    hi = std::min(hi, 1e38f);
    p.zero = round_zero_down(lo, s.scale_dtype);
    raw = (static_cast<double>(hi) - p.zero) / qmax_asym(s.dtype);
  } else if (is_int(s.dtype) && s.full_range) {
    // Full range (llama.cpp q4_0's rule): the value of largest magnitude (the
    // larger one on a tie) maps to the code -2^(b-1), so the scale is negative
    // when that value is positive, and all 2^b codes are used; values of the
    // other sign beyond (2^(b-1) - 1) steps clamp. Magnitudes capped as below.
    // The sign is chosen on the values as given (capping first would make a
    // tie of -2e38 and 1.5e38, and pick the positive one).
    const bool positive = static_cast<double>(hi) >= -static_cast<double>(lo);
    const double mag = std::min(1e38, positive ? static_cast<double>(hi) : -static_cast<double>(lo)) /
                       (qmax_sym(s.dtype) + 1);
    if (mag > 0.0) {
      const float f = std::max(static_cast<float>(mag), std::numeric_limits<float>::min());
      const float up = static_cast<double>(f) < mag ? bits_f32(f32_bits(f) + 1) : f;
      const float m = round_scale_up(up, s.scale_dtype);
      p.scale = positive ? -m : m;
      p.inv = positive ? -(1.0f / m) : 1.0f / m;
    }
    return p;
  } else {
    // Symmetric integer codes cover at most [-1e38, 1e38] too (q x scale must
    // stay finite; values beyond saturate).
    const double cap = is_int(s.dtype) ? 1e38 : std::numeric_limits<double>::infinity();
    const double absmax = std::min(cap, std::max(std::fabs(static_cast<double>(lo)), std::fabs(static_cast<double>(hi))));
    raw = absmax / (is_fp8(s.dtype) ? fp8_max(s.dtype) : qmax_sym(s.dtype));
  }
  if (raw > 0.0) {
    const float f = std::max(static_cast<float>(raw), std::numeric_limits<float>::min());
    // Round up to a float: the next float above f when f fell short (f > 0,
    // finite: a positive float's successor is its bit pattern plus one).
    const float up = static_cast<double>(f) < raw ? bits_f32(f32_bits(f) + 1) : f;
    p.scale = round_scale_up(up, s.scale_dtype);
  }
  p.inv = p.scale > 0.0f ? 1.0f / p.scale : 0.0f;
  return p;
}

// ---- run kernels: a contiguous run of values sharing one Params ----------
// Scalar reference and AVX2 versions compute the same float operations in
// the same order (multiply by the reciprocal, clamp, round half to even), so
// their results are identical bit for bit (tests/codec checks it).

inline int32_t quant_int(float x, const Params &p, bool asym, float lo, float hi) {
  float y = asym ? (x - p.zero) * p.inv : x * p.inv;
  y = y < lo ? lo : y > hi ? hi : y;
  return static_cast<int32_t>(std::nearbyint(y));  // default rounding mode: half to even
}

struct IntFormat {
  int bits;
  int32_t off;  // stored code = q + off
  float lo, hi;
};
inline IntFormat int_format(DType d, bool asym, bool full_range = false) {
  if (full_range && !asym) {  // codes -2^(b-1) .. 2^(b-1) - 1
    switch (d) {
      case DType::INT8: return IntFormat{8, 0, -128, 127};
      case DType::INT4: return IntFormat{4, 8, -8, 7};
      case DType::INT3: return IntFormat{3, 4, -4, 3};
      default: return IntFormat{2, 2, -2, 1};
    }
  }
  switch (d) {
    case DType::INT8: return asym ? IntFormat{8, 0, 0, 255} : IntFormat{8, 0, -127, 127};
    case DType::INT4: return asym ? IntFormat{4, 0, 0, 15} : IntFormat{4, 8, -7, 7};
    case DType::INT3: return asym ? IntFormat{3, 0, 0, 7} : IntFormat{3, 4, -3, 3};
    default: return asym ? IntFormat{2, 0, 0, 3} : IntFormat{2, 2, -1, 1};
  }
}

// Stores code c of element j of a row (int4 / int3 / int2 rows are zeroed
// first). int3: code j holds bits 3j .. 3j + 2 of the row read as one
// little-endian bit string (8 codes in 3 bytes; a code may straddle two bytes).
inline void put_code(uint8_t *out, int bits, uint64_t j, uint32_t c) {
  if (bits == 8) out[j] = static_cast<uint8_t>(c);
  else if (bits == 4) out[j >> 1] |= static_cast<uint8_t>(c << ((j & 1) * 4));
  else if (bits == 3) {
    const uint64_t b = 3 * j;
    const unsigned sh = static_cast<unsigned>(b & 7);
    out[b >> 3] |= static_cast<uint8_t>(c << sh);
    if (sh > 5) out[(b >> 3) + 1] |= static_cast<uint8_t>(c >> (8 - sh));
  } else out[j >> 2] |= static_cast<uint8_t>(c << ((j & 3) * 2));
}
inline int32_t get_code(const uint8_t *in, int bits, uint64_t j) {
  if (bits == 8) return in[j];
  if (bits == 4) return (in[j >> 1] >> ((j & 1) * 4)) & 0xf;
  if (bits == 3) {
    const uint64_t b = 3 * j;
    const unsigned sh = static_cast<unsigned>(b & 7);
    uint32_t w = in[b >> 3];
    if (sh > 5) w |= static_cast<uint32_t>(in[(b >> 3) + 1]) << 8;
    return static_cast<int32_t>((w >> sh) & 0x7);
  }
  return (in[j >> 2] >> ((j & 3) * 2)) & 0x3;
}
// Elements per whole number of code bytes: a vector kernel starts at a
// multiple of it (int3: 8 codes = 3 bytes).
inline uint64_t code_unit(int bits) { return bits == 3 ? 8 : static_cast<uint64_t>(8 / bits); }

void encode_int_run_scalar(const IntFormat &f, bool asym, const float *x, uint64_t j0, uint64_t j1,
                           const Params &p, uint8_t *out) {
  for (uint64_t j = j0; j < j1; ++j)
    put_code(out, f.bits, j, static_cast<uint32_t>(quant_int(x[j], p, asym, f.lo, f.hi) + f.off) &
                                 ((1u << f.bits) - 1u));
}

void decode_int_run_scalar(const IntFormat &f, bool asym, const uint8_t *in, uint64_t j0,
                           uint64_t j1, const Params &p, float *x) {
  for (uint64_t j = j0; j < j1; ++j) {
    int32_t c = get_code(in, f.bits, j);
    if (f.bits == 8 && !asym) c = static_cast<int8_t>(c);
    const float q = static_cast<float>(c - (f.bits == 8 ? 0 : f.off));
    x[j] = asym ? q * p.scale + p.zero : q * p.scale;
  }
}

#if defined(__x86_64__)
#define KVC_CODEC_X86 1
// Clamped to the code range, then converted with the current rounding mode
// (round half to even, as std::nearbyint in the scalar reference).
// 8 values of a row of f16 (Half) or f32 from element j (exact conversion).
template <bool Half>
__attribute__((target("avx2,f16c"), always_inline)) inline __m256 load8(const void *row, uint64_t j) {
  if constexpr (Half)
    return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i *>(static_cast<const uint16_t *>(row) + j)));
  else return _mm256_loadu_ps(static_cast<const float *>(row) + j);
}

// Clamp false: the caller knows |y * inv| stays below qmax + 1/2 (a
// symmetric group's own absmax scale), where the clamp changes nothing.
template <bool Asym, bool Clamp = true>
__attribute__((target("avx2"), always_inline)) inline __m256i quant8_avx2(__m256 y, __m256 inv, __m256 z,
                                                                           __m256 lo, __m256 hi) {
  y = Asym ? _mm256_mul_ps(_mm256_sub_ps(y, z), inv) : _mm256_mul_ps(y, inv);
  if constexpr (Clamp) y = _mm256_min_ps(_mm256_max_ps(y, lo), hi);
  return _mm256_cvtps_epi32(y);
}

// 32 values from element j of x (f16 or f32) -> 32 byte codes (code = q +
// off, q already clamped), in order.
template <bool Asym, bool Half, bool Clamp = true>
__attribute__((target("avx2,f16c"), always_inline)) inline __m256i codes32_avx2(const void *x, uint64_t j,
                                                                                 __m256 inv, __m256 z, __m256 lo,
                                                                                 __m256 hi, __m256i off,
                                                                                 bool is_signed) {
  const __m256i q0 = _mm256_add_epi32(quant8_avx2<Asym, Clamp>(load8<Half>(x, j), inv, z, lo, hi), off);
  const __m256i q1 = _mm256_add_epi32(quant8_avx2<Asym, Clamp>(load8<Half>(x, j + 8), inv, z, lo, hi), off);
  const __m256i q2 = _mm256_add_epi32(quant8_avx2<Asym, Clamp>(load8<Half>(x, j + 16), inv, z, lo, hi), off);
  const __m256i q3 = _mm256_add_epi32(quant8_avx2<Asym, Clamp>(load8<Half>(x, j + 24), inv, z, lo, hi), off);
  const __m256i a = _mm256_packs_epi32(q0, q1), b = _mm256_packs_epi32(q2, q3);
  const __m256i c = is_signed ? _mm256_packs_epi16(a, b) : _mm256_packus_epi16(a, b);
  return _mm256_permutevar8x32_epi32(c, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
}

// 32 byte codes (each < 8, in order) -> the 12 bytes of their int3 bit
// string: c0 + 8 c1 per 16-bit lane, then 4 codes (12 bits) per 32-bit lane,
// then 8 codes (24 bits) per 64-bit lane, 3 bytes each.
__attribute__((target("avx2"), always_inline)) inline void store_int3_32(__m256i c, uint8_t *out) {
  const __m256i w16 = _mm256_maddubs_epi16(c, _mm256_set1_epi16(0x0801));    // c0 + 8 c1
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
__attribute__((target("avx2"), always_inline)) inline __m256i load_int3_8(const uint8_t *in, uint64_t j) {
  const uint8_t *p = in + j / 8 * 3;
  const uint32_t w = static_cast<uint32_t>(p[0]) | static_cast<uint32_t>(p[1]) << 8 | static_cast<uint32_t>(p[2]) << 16;
  const __m256i v = _mm256_srlv_epi32(_mm256_set1_epi32(static_cast<int>(w)), _mm256_setr_epi32(0, 3, 6, 9, 12, 15, 18, 21));
  return _mm256_and_si256(v, _mm256_set1_epi32(0x7));
}

// Codes of elements [j0, j1) of a row x of f32 or (Half) f16 values.
template <bool Asym, bool Half = false, bool Clamp = true>
__attribute__((target("avx2,f16c"))) void encode_int_run_avx2(const IntFormat &f, const void *x, uint64_t j0,
                                                              uint64_t j1, const Params &p, uint8_t *out) {
  const __m256 inv = _mm256_set1_ps(p.inv), z = _mm256_set1_ps(p.zero);
  const __m256 lo = _mm256_set1_ps(f.lo), hi = _mm256_set1_ps(f.hi);
  const __m256i off = _mm256_set1_epi32(f.off);
  uint64_t j = j0;
  // Vector part: 32 values at a time, starting on a byte boundary of the codes.
  const uint64_t per_byte = code_unit(f.bits);
  if (j % per_byte != 0 && !Half) return encode_int_run_scalar(f, Asym, static_cast<const float *>(x), j0, j1, p, out);
  for (; j + 32 <= j1 && j % per_byte == 0; j += 32) {
    const __m256i c = codes32_avx2<Asym, Half, Clamp>(x, j, inv, z, lo, hi, off, f.bits == 8 && !Asym);
    if (f.bits == 8) {
      _mm256_storeu_si256(reinterpret_cast<__m256i *>(out + j), c);
    } else if (f.bits == 4) {  // int4: pairs of bytes -> one byte, low nibble first
      const __m256i nib = _mm256_or_si256(_mm256_and_si256(c, _mm256_set1_epi16(0x000f)),
                                          _mm256_and_si256(_mm256_srli_epi16(c, 4), _mm256_set1_epi16(0x00f0)));
      const __m256i packed = _mm256_permute4x64_epi64(_mm256_packus_epi16(nib, nib), 0xd8);
      _mm_storeu_si128(reinterpret_cast<__m128i *>(out + j / 2), _mm256_castsi256_si128(packed));
    } else if (f.bits == 3) {
      store_int3_32(c, out + j / 8 * 3);
    } else {  // int2: four bytes -> one byte, c0 | c1 << 2 | c2 << 4 | c3 << 6
      const __m256i w16 = _mm256_maddubs_epi16(c, _mm256_set1_epi16(0x0401));    // c0 + 4 c1
      const __m256i w32 = _mm256_madd_epi16(w16, _mm256_set1_epi32(0x00100001));  // + 16 (c2 + 4 c3)
      const __m256i b8 = _mm256_packus_epi16(_mm256_packus_epi32(w32, w32), _mm256_setzero_si256());
      const __m256i lanes = _mm256_permutevar8x32_epi32(b8, _mm256_setr_epi32(0, 4, 0, 0, 0, 0, 0, 0));
      _mm_storel_epi64(reinterpret_cast<__m128i *>(out + j / 4), _mm256_castsi256_si128(lanes));
    }
  }
  if constexpr (Half) {
    const uint16_t *h = static_cast<const uint16_t *>(x);
    for (; j < j1; ++j)
      put_code(out, f.bits, j, static_cast<uint32_t>(quant_int(f16_to_f32_scalar(h[j]), p, Asym, f.lo, f.hi) +
                                                     f.off) & ((1u << f.bits) - 1u));
  } else {
    encode_int_run_scalar(f, Asym, static_cast<const float *>(x), j, j1, p, out);
  }
}

__attribute__((target("avx2"))) void decode_int_run_avx2(const IntFormat &f, bool asym,
                                                         const uint8_t *in, uint64_t j0,
                                                         uint64_t j1, const Params &p, float *x) {
  const __m256 s = _mm256_set1_ps(p.scale), z = _mm256_set1_ps(p.zero);
  uint64_t j = j0;
  if (j % code_unit(f.bits) != 0) return decode_int_run_scalar(f, asym, in, j0, j1, p, x);
  if (f.bits == 8) {
    for (; j + 8 <= j1; j += 8) {
      const __m128i b = _mm_loadl_epi64(reinterpret_cast<const __m128i *>(in + j));
      const __m256i q = asym ? _mm256_cvtepu8_epi32(b) : _mm256_cvtepi8_epi32(b);
      const __m256 v = _mm256_mul_ps(_mm256_cvtepi32_ps(q), s);
      _mm256_storeu_ps(x + j, asym ? _mm256_add_ps(v, z) : v);
    }
  } else if (f.bits == 3) {
    const __m256i off = _mm256_set1_epi32(f.off);
    for (; j + 8 <= j1; j += 8) {
      const __m256i q = _mm256_sub_epi32(load_int3_8(in, j), off);
      const __m256 r = _mm256_mul_ps(_mm256_cvtepi32_ps(q), s);
      _mm256_storeu_ps(x + j, asym ? _mm256_add_ps(r, z) : r);
    }
  } else if (f.bits == 2) {
    const __m256i off = _mm256_set1_epi32(f.off);
    for (; j + 8 <= j1; j += 8) {
      uint16_t w;
      std::memcpy(&w, in + j / 4, 2);
      // Spread 8 two-bit codes over 8 lanes: lane i gets bits 2i..2i+1.
      const __m256i v = _mm256_srlv_epi32(_mm256_set1_epi32(static_cast<int>(w)),
                                          _mm256_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14));
      const __m256i q = _mm256_sub_epi32(_mm256_and_si256(v, _mm256_set1_epi32(0x3)), off);
      const __m256 r = _mm256_mul_ps(_mm256_cvtepi32_ps(q), s);
      _mm256_storeu_ps(x + j, asym ? _mm256_add_ps(r, z) : r);
    }
  } else {
    const __m256i off = _mm256_set1_epi32(f.off);
    for (; j + 8 <= j1; j += 8) {
      uint32_t w;
      std::memcpy(&w, in + j / 2, 4);
      // Spread 8 nibbles over 8 lanes: lane i gets bits 4i..4i+3.
      const __m256i v = _mm256_srlv_epi32(_mm256_set1_epi32(static_cast<int>(w)),
                                          _mm256_setr_epi32(0, 4, 8, 12, 16, 20, 24, 28));
      const __m256i q = _mm256_sub_epi32(_mm256_and_si256(v, _mm256_set1_epi32(0xf)), off);
      const __m256 r = _mm256_mul_ps(_mm256_cvtepi32_ps(q), s);
      _mm256_storeu_ps(x + j, asym ? _mm256_add_ps(r, z) : r);
    }
  }
  decode_int_run_scalar(f, asym, in, j, j1, p, x);
}

bool detect_avx2() {
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx2");
}
#endif

bool g_force_scalar = false;

inline bool use_avx2() {
#ifdef KVC_CODEC_X86
  static const bool has = detect_avx2();
  return has && !g_force_scalar;
#else
  return false;
#endif
}

void encode_int_run(const IntFormat &f, bool asym, const float *x, uint64_t j0, uint64_t j1,
                    const Params &p, uint8_t *out) {
#ifdef KVC_CODEC_X86
  if (use_avx2() && j1 - j0 >= 32)
    return asym ? encode_int_run_avx2<true>(f, x, j0, j1, p, out) : encode_int_run_avx2<false>(f, x, j0, j1, p, out);
#endif
  encode_int_run_scalar(f, asym, x, j0, j1, p, out);
}

void decode_int_run(const IntFormat &f, bool asym, const uint8_t *in, uint64_t j0, uint64_t j1,
                    const Params &p, float *x) {
#ifdef KVC_CODEC_X86
  if (use_avx2() && j1 - j0 >= 8) return decode_int_run_avx2(f, asym, in, j0, j1, p, x);
#endif
  decode_int_run_scalar(f, asym, in, j0, j1, p, x);
}

// ---- fp8 run kernels -------------------------------------------------------
#ifdef KVC_CODEC_X86
// 8 floats -> 8 fp8 codes (in the low byte of each 32-bit lane), bit for bit
// what fp8_encode<kMant, kBias, kMaxCode> gives. Normal results: rebias the
// exponent and round the mantissa half to even in the integer domain (a carry
// into the exponent is the correct next binade), saturating at the largest
// finite code. Subnormal results (|x| below the smallest normal) are the
// multiple of the subnormal step nearest to |x|: |x| / step is exact (a power
// of two) and the conversion rounds half to even, and the boundary case
// rounds to the smallest normal code, whose bits are the same integer.
template <int kMant, int kBias, uint32_t kMaxCode>
__attribute__((target("avx2"), always_inline)) inline __m256i fp8_encode8(__m256 v) {
  const __m256i u = _mm256_castps_si256(v);
  const __m256i a = _mm256_and_si256(u, _mm256_set1_epi32(0x7fffffff));
  constexpr int kDrop = 23 - kMant, kEmin = 1 - kBias;
  __m256i r = _mm256_sub_epi32(a, _mm256_set1_epi32((127 - kBias) << 23));
  const __m256i odd = _mm256_and_si256(_mm256_srli_epi32(r, kDrop), _mm256_set1_epi32(1));
  r = _mm256_add_epi32(r, _mm256_add_epi32(odd, _mm256_set1_epi32((1 << (kDrop - 1)) - 1)));
  r = _mm256_min_epu32(_mm256_srli_epi32(r, kDrop), _mm256_set1_epi32(kMaxCode));
  // step = 2^(kEmin - kMant): multiply by its inverse (exact), round to even.
  const __m256 inv_step = _mm256_castsi256_ps(_mm256_set1_epi32((127 - kEmin + kMant) << 23));
  const __m256i q = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_castsi256_ps(a), inv_step));
  const __m256i is_sub = _mm256_cmpgt_epi32(_mm256_set1_epi32((127 + kEmin) << 23), a);
  const __m256i code = _mm256_blendv_epi8(r, q, is_sub);
  const __m256i sign = _mm256_and_si256(_mm256_srli_epi32(u, 24), _mm256_set1_epi32(0x80));
  return _mm256_or_si256(code, sign);
}

template <int kMant, int kBias, uint32_t kMaxCode, bool Half = false>
__attribute__((target("avx2,f16c"))) void encode_fp8_run_avx2(const void *x, uint64_t j0, uint64_t j1,
                                                              float inv, uint8_t *out) {
  const __m256 vinv = _mm256_set1_ps(inv);
  uint64_t j = j0;
  for (; j + 32 <= j1; j += 32) {
    __m256i c[4];
    #pragma GCC unroll 4
    for (int k = 0; k < 4; ++k)
      c[k] = fp8_encode8<kMant, kBias, kMaxCode>(_mm256_mul_ps(load8<Half>(x, j + 8 * k), vinv));
    const __m256i a16 = _mm256_packus_epi32(c[0], c[1]), b16 = _mm256_packus_epi32(c[2], c[3]);
    const __m256i b = _mm256_permutevar8x32_epi32(_mm256_packus_epi16(a16, b16),
                                                  _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
    _mm256_storeu_si256(reinterpret_cast<__m256i *>(out + j), b);
  }
  for (; j < j1; ++j) {
    const float v = Half ? f16_to_f32_scalar(static_cast<const uint16_t *>(x)[j])
                         : static_cast<const float *>(x)[j];
    out[j] = fp8_encode<kMant, kBias, kMaxCode>(v * inv);
  }
}

// 8 fp8 codes -> 8 floats, the table's values bit for bit: normal codes by
// moving exponent and mantissa into place and rebiasing the exponent with one
// integer add, subnormal codes (exponent field 0) as mantissa x step (exact).
// A vector holding a NaN or Inf code (never written by the encoder, possible
// in caller-supplied codes) takes the table.
template <int kMant, int kBias>
__attribute__((target("avx2"), always_inline)) inline __m256 fp8_decode8(const float *table, __m128i b8) {
  const __m256i c = _mm256_cvtepu8_epi32(b8);
  const __m256i mag = _mm256_and_si256(c, _mm256_set1_epi32(0x7f));
  constexpr int kExpMask = ((1 << (7 - kMant)) - 1) << kMant;
  const __m256i special = kMant == 3 ? _mm256_cmpeq_epi32(mag, _mm256_set1_epi32(0x7f))
                                     : _mm256_cmpeq_epi32(_mm256_and_si256(mag, _mm256_set1_epi32(kExpMask)),
                                                          _mm256_set1_epi32(kExpMask));
  if (!_mm256_testz_si256(special, special)) return _mm256_i32gather_ps(table, c, 4);
  const __m256i normal = _mm256_add_epi32(_mm256_slli_epi32(mag, 23 - kMant), _mm256_set1_epi32((127 - kBias) << 23));
  const __m256 step = _mm256_castsi256_ps(_mm256_set1_epi32((127 + 1 - kBias - kMant) << 23));
  const __m256 sub = _mm256_mul_ps(_mm256_cvtepi32_ps(mag), step);  // exponent 0: mag is the mantissa
  const __m256i is_sub = _mm256_cmpeq_epi32(_mm256_and_si256(mag, _mm256_set1_epi32(kExpMask)), _mm256_setzero_si256());
  const __m256 v = _mm256_blendv_ps(_mm256_castsi256_ps(normal), sub, _mm256_castsi256_ps(is_sub));
  const __m256i sign = _mm256_slli_epi32(_mm256_and_si256(c, _mm256_set1_epi32(0x80)), 24);
  return _mm256_or_ps(v, _mm256_castsi256_ps(sign));
}

template <int kMant, int kBias>
__attribute__((target("avx2"))) void decode_fp8_run_avx2(const float *table, const uint8_t *in,
                                                         uint64_t j0, uint64_t j1, float scale,
                                                         float *x) {
  const __m256 s = _mm256_set1_ps(scale);
  uint64_t j = j0;
  for (; j + 8 <= j1; j += 8)
    _mm256_storeu_ps(x + j, _mm256_mul_ps(fp8_decode8<kMant, kBias>(
                                              table, _mm_loadl_epi64(reinterpret_cast<const __m128i *>(in + j))), s));
  for (; j < j1; ++j) x[j] = table[in[j]] * scale;
}
#endif

void encode_fp8_run(DType dt, const float *x, uint64_t j0, uint64_t j1, float inv, uint8_t *out) {
#ifdef KVC_CODEC_X86
  if (use_avx2() && j1 - j0 >= 32) {
    if (dt == DType::FP8_E4M3) return encode_fp8_run_avx2<3, 7, 0x7eu>(x, j0, j1, inv, out);
    return encode_fp8_run_avx2<2, 15, 0x7bu>(x, j0, j1, inv, out);
  }
#endif
  if (dt == DType::FP8_E4M3)
    for (uint64_t j = j0; j < j1; ++j) out[j] = fp8_e4m3_encode(x[j] * inv);
  else
    for (uint64_t j = j0; j < j1; ++j) out[j] = fp8_e5m2_encode(x[j] * inv);
}

void decode_fp8_run(DType dt, const uint8_t *in, uint64_t j0, uint64_t j1, float scale, float *x) {
  const float *t = dt == DType::FP8_E4M3 ? fp8_e4m3_table() : fp8_e5m2_table();
#ifdef KVC_CODEC_X86
  if (use_avx2() && j1 - j0 >= 8)
    return dt == DType::FP8_E4M3 ? decode_fp8_run_avx2<3, 7>(t, in, j0, j1, scale, x)
                                 : decode_fp8_run_avx2<2, 15>(t, in, j0, j1, scale, x);
#endif
  for (uint64_t j = j0; j < j1; ++j) x[j] = t[in[j]] * scale;
}

// Encodes one row of d values; element j uses params[j / col_group].
void encode_row(const Spec &s, const float *x, uint64_t d, const Params *params,
                uint64_t col_group, uint8_t *out) {
  if (is_int(s.dtype)) {
    const IntFormat f = int_format(s.dtype, s.asym, s.full_range);
    if (f.bits < 8) std::memset(out, 0, row_bytes(s.dtype, d));
    for (uint64_t j0 = 0, g = 0; j0 < d; j0 += col_group, ++g)
      encode_int_run(f, s.asym, x, j0, std::min(d, j0 + col_group), params[g], out);
    return;
  }
  switch (s.dtype) {
    case DType::FP8_E4M3:
    case DType::FP8_E5M2:
      for (uint64_t j0 = 0, g = 0; j0 < d; j0 += col_group, ++g)
        encode_fp8_run(s.dtype, x, j0, std::min(d, j0 + col_group), params[g].inv, out);
      break;
    default:
      convert(x, DType::F32, out, static_cast<DType>(s.dtype), d);
      break;
  }
}

void decode_row(const Spec &s, const uint8_t *in, uint64_t d, const Params *params,
                uint64_t col_group, float *x) {
  if (is_int(s.dtype)) {
    const IntFormat f = int_format(s.dtype, s.asym, s.full_range);
    for (uint64_t j0 = 0, g = 0; j0 < d; j0 += col_group, ++g)
      decode_int_run(f, s.asym, in, j0, std::min(d, j0 + col_group), params[g], x);
    return;
  }
  switch (s.dtype) {
    case DType::FP8_E4M3:
    case DType::FP8_E5M2:
      for (uint64_t j0 = 0, g = 0; j0 < d; j0 += col_group, ++g)
        decode_fp8_run(s.dtype, in, j0, std::min(d, j0 + col_group), params[g].scale, x);
      break;
    default:
      convert(in, static_cast<DType>(s.dtype), x, DType::F32, d);
      break;
  }
}

#ifdef KVC_CODEC_X86
__attribute__((target("avx2"))) void min_max_avx2(const float *x, uint64_t n, float *lo, float *hi) {
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

__attribute__((target("avx2"))) bool all_finite_avx2(const float *x, uint64_t n) {
  const __m256i expo = _mm256_set1_epi32(0x7f800000);
  __m256i bad = _mm256_setzero_si256();
  uint64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256i v = _mm256_and_si256(_mm256_loadu_si256(reinterpret_cast<const __m256i *>(x + i)), expo);
    bad = _mm256_or_si256(bad, _mm256_cmpeq_epi32(v, expo));
  }
  if (!_mm256_testz_si256(bad, bad)) return false;
  for (; i < n; ++i)
    if (!std::isfinite(x[i])) return false;
  return true;
}
#endif

#ifdef KVC_CODEC_X86
// True when no 16-bit float has its exponent field all ones.
__attribute__((target("avx2"))) bool all_finite_16_avx2(const uint16_t *h, uint64_t n, uint16_t mask) {
  const __m256i m = _mm256_set1_epi16(static_cast<short>(mask));
  __m256i bad = _mm256_setzero_si256();
  uint64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const __m256i v = _mm256_and_si256(_mm256_loadu_si256(reinterpret_cast<const __m256i *>(h + i)), m);
    bad = _mm256_or_si256(bad, _mm256_cmpeq_epi16(v, m));
  }
  if (!_mm256_testz_si256(bad, bad)) return false;
  for (; i < n; ++i)
    if ((h[i] & mask) == mask) return false;
  return true;
}
#endif

// Min and max of n values x[0], x[stride], ... (exact in any order).
void min_max(const float *x, uint64_t n, uint64_t stride, float *lo, float *hi) {
#ifdef KVC_CODEC_X86
  if (stride == 1 && n >= 16 && use_avx2()) return min_max_avx2(x, n, lo, hi);
#endif
  float a = x[0], b = x[0];
  for (uint64_t i = 1; i < n; ++i) {
    const float v = x[i * stride];
    a = v < a ? v : a;
    b = v > b ? v : b;
  }
  *lo = a;
  *hi = b;
}

bool has_scales(const Spec &s) { return !is_float(s.dtype); }

}  // namespace

void set_force_scalar(bool on) { g_force_scalar = on; }
bool simd_active() { return use_avx2(); }

float load_scale(const uint8_t *p, DType sd) {
  if (sd == DType::F16) return f16_to_f32_scalar(static_cast<uint16_t>(p[0] | (p[1] << 8)));
  const uint32_t u = static_cast<uint32_t>(p[0]) | static_cast<uint32_t>(p[1]) << 8 |
                     static_cast<uint32_t>(p[2]) << 16 | static_cast<uint32_t>(p[3]) << 24;
  return bits_f32(u);
}

void store_scale(uint8_t *p, DType sd, float v) {
  if (sd == DType::F16) {
    const uint16_t h = f32_to_f16_scalar(v);
    p[0] = static_cast<uint8_t>(h);
    p[1] = static_cast<uint8_t>(h >> 8);
    return;
  }
  const uint32_t u = f32_bits(v);
  p[0] = static_cast<uint8_t>(u);
  p[1] = static_cast<uint8_t>(u >> 8);
  p[2] = static_cast<uint8_t>(u >> 16);
  p[3] = static_cast<uint8_t>(u >> 24);
}

float dynamic_scale(const Spec &s, float lo, float hi) {
  Spec d = s;
  d.static_scale = 0.0;
  return make_params(d, lo, hi).scale;
}

float round_scale_up(float v, DType sd) {
  if (sd != DType::F16) return v;
  const float big = 65504.0f;
  if (v >= big) return big;
  uint16_t h = f32_to_f16_scalar(v);
  if (f16_to_f32_scalar(h) < v) ++h;  // next f16 up (v > 0)
  return f16_to_f32_scalar(h);
}

float round_zero_down(float v, DType sd) {
  if (sd != DType::F16) return v;
  if (v <= -65504.0f) return -65504.0f;
  if (v >= 65504.0f) return 65504.0f;
  uint16_t h = f32_to_f16_scalar(v);
  if (f16_to_f32_scalar(h) > v) {
    // one step towards -inf
    if (h == 0x0000) h = 0x8001;
    else if (h & 0x8000) ++h;
    else --h;
  }
  return f16_to_f32_scalar(h);
}

uint64_t num_scales(const Spec &s, uint64_t n, uint64_t d) {
  if (!has_scales(s)) return 0;
  switch (s.gran) {
    case Gran::None: return 0;
    case Gran::Tensor: return 1;
    case Gran::Token: return n;
    case Gran::Group: return n * ((d + s.group - 1) / s.group);
    case Gran::Channel: return ((n + s.group - 1) / s.group) * d;
  }
  return 0;
}

uint32_t default_rotation_block(uint64_t d) {
  uint32_t b = 1;
  while (b < 1024 && d % (static_cast<uint64_t>(b) * 2) == 0) b *= 2;
  return b;
}

void validate(const Spec &s, uint64_t d) {
  const int32_t dt = static_cast<int32_t>(s.dtype);
  if (dt < 0 || dt > 8) fail(Errc::InvalidArgument, "dtype " + std::to_string(dt) + ": unknown storage dtype");
  const int32_t g = static_cast<int32_t>(s.gran);
  if (g < 0 || g > 4) fail(Errc::InvalidArgument, "granularity " + std::to_string(g) + ": unknown");
  if (is_float(s.dtype)) {
    if (s.gran != Gran::None)
      fail(Errc::InvalidArgument, std::string("dtype ") + dtype_name(s.dtype) +
                                      " stores values directly: granularity must be KVC_SCALE_NONE");
    if (s.asym) fail(Errc::InvalidArgument, "asymmetric applies to integer dtypes only");
    if (s.static_scale != 0.0) fail(Errc::InvalidScale, "a scale applies to fp8 and integer dtypes only");
    if (s.rotation_block) fail(Errc::InvalidArgument, "rotation applies to fp8 and integer dtypes only");
    return;
  }
  if (s.gran == Gran::None)
    fail(Errc::InvalidArgument, std::string("dtype ") + dtype_name(s.dtype) +
                                    " needs a scale granularity (tensor, token, group or channel)");
  if (s.asym && is_fp8(s.dtype)) fail(Errc::InvalidArgument, "fp8 dtypes are symmetric only");
  if (s.scale_dtype != DType::F32 && s.scale_dtype != DType::F16)
    fail(Errc::InvalidArgument, "scale_dtype must be f32 or f16");
  if (s.gran == Gran::Group || s.gran == Gran::Channel) {
    if (s.group < 1 || s.group > 65536)
      fail(Errc::InvalidArgument, "group_size " + u64s(s.group) + ": must be 1..65536");
  }
  if (std::isnan(s.static_scale) || s.static_scale < 0.0 || std::isinf(s.static_scale))
    fail(Errc::InvalidScale, "scale " + fmt_g(s.static_scale) + ": must be a finite value > 0 (0 = dynamic)");
  if (s.static_scale != 0.0) {
    if (s.static_scale < 1e-30 || s.static_scale > 1e30)
      fail(Errc::InvalidScale, "scale " + fmt_g(s.static_scale) +
                                   ": must be in [1e-30, 1e30] (0 = dynamic)");
    if (s.gran != Gran::Tensor)
      fail(Errc::InvalidArgument, "a static scale needs per-tensor granularity");
    if (s.asym) fail(Errc::InvalidArgument, "a static scale is symmetric: asymmetric must be off");
    if (s.scale_dtype == DType::F16 && (s.static_scale < 6.103515625e-05 || s.static_scale > 65504.0))
      fail(Errc::InvalidScale, "scale " + fmt_g(s.static_scale) +
                                   ": with f16 scales a static scale must be in [6.1e-5, 65504]");
  }
  if (s.rotation_block) {
    const uint32_t b = s.rotation_block;
    if ((b & (b - 1)) != 0 || b > 65536)
      fail(Errc::InvalidArgument, "rotation block " + u64s(b) + ": must be a power of two, at most 65536");
    if (d % b != 0)
      fail(Errc::InvalidArgument, "rotation block " + u64s(b) + " does not divide the row of " + u64s(d));
  }
}

#ifdef KVC_CODEC_X86
namespace {
// The same butterflies as the scalar loop, in registers for h = 1, 2, 4
// (lane permutes) and on whole vectors for h >= 8: each output is the same
// a + b or a - b of the same operands, so the result is identical.
// Stages h = 1, 2, 4 of the butterfly inside one vector of 8 values.
__attribute__((target("avx2"), always_inline)) inline __m256 butterfly8(__m256 y) {
  __m256 t = _mm256_permute_ps(y, 0xb1);  // h = 1: [x1 x0 x3 x2 ...]
  y = _mm256_blend_ps(_mm256_add_ps(y, t), _mm256_sub_ps(t, y), 0xaa);
  t = _mm256_permute_ps(y, 0x4e);  // h = 2: [x2 x3 x0 x1 ...]
  y = _mm256_blend_ps(_mm256_add_ps(y, t), _mm256_sub_ps(t, y), 0xcc);
  t = _mm256_permute2f128_ps(y, y, 1);  // h = 4: swap the 128-bit halves
  return _mm256_blend_ps(_mm256_add_ps(y, t), _mm256_sub_ps(t, y), 0xf0);
}

// Stages h = 1 .. 32 of 64 values in eight registers (no normalization).
__attribute__((target("avx2"), always_inline)) inline void bfly(__m256 &a, __m256 &b) {
  const __m256 s = _mm256_add_ps(a, b);
  b = _mm256_sub_ps(a, b);
  a = s;
}
__attribute__((target("avx2"), always_inline)) inline void butterfly64(const float *in, float *out) {
  __m256 r0 = butterfly8(_mm256_loadu_ps(in)), r1 = butterfly8(_mm256_loadu_ps(in + 8));
  __m256 r2 = butterfly8(_mm256_loadu_ps(in + 16)), r3 = butterfly8(_mm256_loadu_ps(in + 24));
  __m256 r4 = butterfly8(_mm256_loadu_ps(in + 32)), r5 = butterfly8(_mm256_loadu_ps(in + 40));
  __m256 r6 = butterfly8(_mm256_loadu_ps(in + 48)), r7 = butterfly8(_mm256_loadu_ps(in + 56));
  bfly(r0, r1), bfly(r2, r3), bfly(r4, r5), bfly(r6, r7);  // h = 8
  bfly(r0, r2), bfly(r1, r3), bfly(r4, r6), bfly(r5, r7);  // h = 16
  bfly(r0, r4), bfly(r1, r5), bfly(r2, r6), bfly(r3, r7);  // h = 32
  _mm256_storeu_ps(out, r0), _mm256_storeu_ps(out + 8, r1), _mm256_storeu_ps(out + 16, r2);
  _mm256_storeu_ps(out + 24, r3), _mm256_storeu_ps(out + 32, r4), _mm256_storeu_ps(out + 40, r5);
  _mm256_storeu_ps(out + 48, r6), _mm256_storeu_ps(out + 56, r7);
}

// The scalar butterfly's additions and subtractions, pair for pair and stage
// by stage (the first stages in registers), then the normalization: the same
// float operations in the same order, so the same bits.
__attribute__((target("avx2"))) void hadamard_avx2(float *x, uint64_t d, uint32_t block, float norm) {
  const __m256 vn = _mm256_set1_ps(norm);
  for (uint64_t base = 0; base < d; base += block) {
    float *v = x + base;
    uint32_t h;
    if (block >= 64) {
      for (uint32_t j = 0; j < block; j += 64) butterfly64(v + j, v + j);
      h = 64;
    } else {
      for (uint32_t j = 0; j < block; j += 8) _mm256_storeu_ps(v + j, butterfly8(_mm256_loadu_ps(v + j)));
      h = 8;
    }
    if (h == block) {
      for (uint32_t j = 0; j < block; j += 8) _mm256_storeu_ps(v + j, _mm256_mul_ps(_mm256_loadu_ps(v + j), vn));
      continue;
    }
    for (; h < block; h *= 2) {
      const bool last = 2 * h == block;  // the normalization folded into the last stage
      for (uint32_t i = 0; i < block; i += 2 * h)
        for (uint32_t j = i; j < i + h; j += 8) {
          const __m256 a = _mm256_loadu_ps(v + j), b = _mm256_loadu_ps(v + j + h);
          __m256 s = _mm256_add_ps(a, b), t = _mm256_sub_ps(a, b);
          if (last) {
            s = _mm256_mul_ps(s, vn);
            t = _mm256_mul_ps(t, vn);
          }
          _mm256_storeu_ps(v + j, s);
          _mm256_storeu_ps(v + j + h, t);
        }
    }
  }
}
}  // namespace
#endif

void hadamard(float *x, uint64_t d, uint32_t block) {
  if (block <= 1) return;
  const float norm = 1.0f / std::sqrt(static_cast<float>(block));
#ifdef KVC_CODEC_X86
  if (block >= 8 && use_avx2()) return hadamard_avx2(x, d, block, norm);
#endif
  for (uint64_t base = 0; base < d; base += block) {
    float *v = x + base;
    for (uint32_t h = 1; h < block; h *= 2)
      for (uint32_t i = 0; i < block; i += 2 * h)
        for (uint32_t j = i; j < i + h; ++j) {
          const float a = v[j], b = v[j + h];
          v[j] = a + b;
          v[j + h] = a - b;
        }
    for (uint32_t j = 0; j < block; ++j) v[j] *= norm;
  }
}

void check_finite(const float *x, uint64_t n, const char *what) {
#ifdef KVC_CODEC_X86
  if (use_avx2() && all_finite_avx2(x, n)) return;
#endif
  for (uint64_t i = 0; i < n; ++i)
    if (!std::isfinite(x[i]))
      fail(Errc::NonFinite, std::string(what) + " element " + u64s(i) + " is " +
                                (std::isnan(x[i]) ? "NaN" : "Inf") + ": nothing was written");
}

void encode(const Spec &s, const float *x, uint64_t n, uint64_t d, uint8_t *codes, uint8_t *scales,
            uint8_t *zeros) {
  const uint64_t rb = row_bytes(s.dtype, d);
  if (!has_scales(s)) {
    for (uint64_t r = 0; r < n; ++r) encode_row(s, x + r * d, d, nullptr, d, codes + r * rb);
    return;
  }
  const uint64_t sb = scale_bytes(s);
  auto put = [&](uint64_t idx, const Params &p) {
    if (scales) store_scale(scales + idx * sb, s.scale_dtype, p.scale);
    if (s.asym && zeros) store_scale(zeros + idx * sb, s.scale_dtype, p.zero);
  };
  switch (s.gran) {
    case Gran::None: break;
    case Gran::Tensor: {
      float lo = 0, hi = 0;
      if (n > 0 && d > 0) min_max(x, n * d, 1, &lo, &hi);
      const Params p = make_params(s, lo, hi);
      put(0, p);
      for (uint64_t r = 0; r < n; ++r) encode_row(s, x + r * d, d, &p, d ? d : 1, codes + r * rb);
      break;
    }
    case Gran::Token: {
      for (uint64_t r = 0; r < n; ++r) {
        float lo = 0, hi = 0;
        if (d) min_max(x + r * d, d, 1, &lo, &hi);
        const Params p = make_params(s, lo, hi);
        put(r, p);
        encode_row(s, x + r * d, d, &p, d ? d : 1, codes + r * rb);
      }
      break;
    }
    case Gran::Group: {
      const uint64_t ng = (d + s.group - 1) / s.group;
      std::vector<Params> ps(ng);
      for (uint64_t r = 0; r < n; ++r) {
        for (uint64_t g = 0; g < ng; ++g) {
          const uint64_t b = g * s.group, len = std::min<uint64_t>(s.group, d - b);
          float lo, hi;
          min_max(x + r * d + b, len, 1, &lo, &hi);  // real values only: no padding
          ps[g] = make_params(s, lo, hi);
          put(r * ng + g, ps[g]);
        }
        encode_row(s, x + r * d, d, ps.data(), s.group, codes + r * rb);
      }
      break;
    }
    case Gran::Channel: {
      std::vector<Params> ps(d);
      for (uint64_t r0 = 0; r0 < n; r0 += s.group) {
        const uint64_t rows = std::min<uint64_t>(s.group, n - r0);
        for (uint64_t c = 0; c < d; ++c) {
          float lo, hi;
          min_max(x + r0 * d + c, rows, d, &lo, &hi);
          ps[c] = make_params(s, lo, hi);
          put((r0 / s.group) * d + c, ps[c]);
        }
        for (uint64_t r = r0; r < r0 + rows; ++r) encode_row(s, x + r * d, d, ps.data(), 1, codes + r * rb);
      }
      break;
    }
  }
}

void decode(const Spec &s, const uint8_t *codes, const uint8_t *scales, const uint8_t *zeros,
            uint64_t n, uint64_t d, float *out) {
  const uint64_t rb = row_bytes(s.dtype, d);
  if (!has_scales(s)) {
    for (uint64_t r = 0; r < n; ++r) decode_row(s, codes + r * rb, d, nullptr, d, out + r * d);
    return;
  }
  const uint64_t sb = scale_bytes(s);
  auto get = [&](uint64_t idx) {
    Params p;
    p.scale = load_scale(scales + idx * sb, s.scale_dtype);
    if (s.asym) p.zero = load_scale(zeros + idx * sb, s.scale_dtype);
    return p;
  };
  switch (s.gran) {
    case Gran::None: break;
    case Gran::Tensor: {
      const Params p = get(0);
      for (uint64_t r = 0; r < n; ++r) decode_row(s, codes + r * rb, d, &p, d ? d : 1, out + r * d);
      break;
    }
    case Gran::Token:
      for (uint64_t r = 0; r < n; ++r) {
        const Params p = get(r);
        decode_row(s, codes + r * rb, d, &p, d ? d : 1, out + r * d);
      }
      break;
    case Gran::Group: {
      const uint64_t ng = (d + s.group - 1) / s.group;
      std::vector<Params> ps(ng);
      for (uint64_t r = 0; r < n; ++r) {
        for (uint64_t g = 0; g < ng; ++g) ps[g] = get(r * ng + g);
        decode_row(s, codes + r * rb, d, ps.data(), s.group, out + r * d);
      }
      break;
    }
    case Gran::Channel: {
      std::vector<Params> ps(d);
      for (uint64_t r = 0; r < n; ++r) {
        if (r % s.group == 0)
          for (uint64_t c = 0; c < d; ++c) ps[c] = get((r / s.group) * d + c);
        decode_row(s, codes + r * rb, d, ps.data(), 1, out + r * d);
      }
      break;
    }
  }
}

namespace {
// Per-thread scratch (core/scratch.h): grown on demand (no allocation per
// call in steady state), released after a call that made it large.
float *scratch_floats(uint64_t n) {
  thread_local ScratchBuffer<float> buf;
  return buf.get(n);
}

// Checks raw input for NaN / Inf without converting it (f16 / bf16: the
// exponent field all ones).
void check_finite_raw(const void *src, DType t, uint64_t n) {
  if (t == DType::F32) return check_finite(static_cast<const float *>(src), n, "input");
  const uint16_t *h = static_cast<const uint16_t *>(src);
  const uint16_t mask = t == DType::F16 ? 0x7c00 : 0x7f80;
#ifdef KVC_CODEC_X86
  if (use_avx2() && all_finite_16_avx2(h, n, mask)) return;
#endif
  uint16_t any = 0;
  for (uint64_t i = 0; i < n; ++i) any |= static_cast<uint16_t>((h[i] & mask) == mask);
  if (!any) return;
  for (uint64_t i = 0; i < n; ++i)
    if ((h[i] & mask) == mask)
      fail(Errc::NonFinite, "input element " + u64s(i) + " is " +
                                ((h[i] & (t == DType::F16 ? 0x03ff : 0x007f)) ? "NaN" : "Inf") +
                                ": nothing was written");
}
}  // namespace

#ifdef KVC_CODEC_X86
namespace {

// Horizontal min and max of 8 lanes (exact in any order).
__attribute__((target("avx2"), always_inline)) inline void hminmax(__m256 a, __m256 b, float *lo, float *hi) {
  __m128 l = _mm_min_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));
  __m128 h = _mm_max_ps(_mm256_castps256_ps128(b), _mm256_extractf128_ps(b, 1));
  l = _mm_min_ps(l, _mm_movehl_ps(l, l));
  h = _mm_max_ps(h, _mm_movehl_ps(h, h));
  l = _mm_min_ss(l, _mm_shuffle_ps(l, l, 1));
  h = _mm_max_ss(h, _mm_shuffle_ps(h, h, 1));
  *lo = _mm_cvtss_f32(l);
  *hi = _mm_cvtss_f32(h);
}

// Every integer and fp8 codec with per-token, per-group or static
// per-tensor scales, straight from f16 or f32 input, a chunk of rows at a
// time: one pass converts the rows into an L1 buffer while taking each
// group's min and max (after the rotation when there is one); then the
// parameters of all the chunk's groups (independent scalar work that the CPU
// overlaps); then the run kernels encode each group from the buffer. The same
// operations as the scalar reference, so the codes, scales and zero points
// are identical bit for bit.
constexpr uint64_t kChunkFloats = 2048;

template <bool Half>
__attribute__((target("avx2,f16c"))) void quantize_fast(const Spec &s, const void *src, uint64_t n,
                                                       uint64_t d, uint8_t *codes, uint8_t *scales,
                                                       uint8_t *zeros, float *buf) {
  const bool fixed = s.gran == Gran::Tensor;  // static scale (checked by the caller)
  const uint64_t g = s.gran == Gran::Group ? s.group : d, ng = d / g;
  const uint64_t esz = Half ? 2 : 4, rb = row_bytes(s.dtype, d), sb = scale_bytes(s);
  const uint64_t chunk = std::max<uint64_t>(1, kChunkFloats / d);
  const bool integer = is_int(s.dtype), rotate = s.rotation_block != 0;
  const IntFormat f = int_format(s.dtype, s.asym, s.full_range);
  const Params fixed_p = fixed ? make_params(s, 0.0f, 0.0f) : Params{};
  if (fixed) {
    store_scale(scales, s.scale_dtype, fixed_p.scale);
    if (s.asym && zeros) store_scale(zeros, s.scale_dtype, fixed_p.zero);
  }
  Params *ps = reinterpret_cast<Params *>(buf + chunk * d);  // chunk * ng of them
  float *lohi = buf + chunk * d + chunk * ng * (sizeof(Params) / sizeof(float));
  for (uint64_t r0 = 0; r0 < n; r0 += chunk) {
    const uint64_t rows = std::min(chunk, n - r0);
    // Pass 1: convert (and rotate), min and max per group.
    for (uint64_t r = 0; r < rows; ++r) {
      const uint8_t *row = static_cast<const uint8_t *>(src) + (r0 + r) * d * esz;
      float *x = buf + r * d;
      if (rotate || fixed) {
        for (uint64_t j = 0; j < d; j += 8) _mm256_storeu_ps(x + j, load8<Half>(row, j));
        if (rotate) hadamard(x, d, s.rotation_block);
      }
      if (fixed) continue;
      for (uint64_t gi = 0; gi < ng; ++gi) {
        const uint64_t j0 = gi * g, j1 = j0 + g;
        __m256 lo0 = _mm256_set1_ps(std::numeric_limits<float>::infinity()), lo1 = lo0;
        __m256 hi0 = _mm256_set1_ps(-std::numeric_limits<float>::infinity()), hi1 = hi0;
        uint64_t j = j0;
        for (; j + 16 <= j1; j += 16) {
          const __m256 a = rotate ? _mm256_loadu_ps(x + j) : load8<Half>(row, j);
          const __m256 b = rotate ? _mm256_loadu_ps(x + j + 8) : load8<Half>(row, j + 8);
          if (!rotate) {
            _mm256_storeu_ps(x + j, a);
            _mm256_storeu_ps(x + j + 8, b);
          }
          lo0 = _mm256_min_ps(lo0, a);
          hi0 = _mm256_max_ps(hi0, a);
          lo1 = _mm256_min_ps(lo1, b);
          hi1 = _mm256_max_ps(hi1, b);
        }
        if (j < j1) {
          const __m256 a = rotate ? _mm256_loadu_ps(x + j) : load8<Half>(row, j);
          if (!rotate) _mm256_storeu_ps(x + j, a);
          lo0 = _mm256_min_ps(lo0, a);
          hi0 = _mm256_max_ps(hi0, a);
        }
        hminmax(_mm256_min_ps(lo0, lo1), _mm256_max_ps(hi0, hi1), &lohi[2 * (r * ng + gi)],
                &lohi[2 * (r * ng + gi) + 1]);
      }
    }
    // Parameters of every group of the chunk, and their scales and zeros.
    if (!fixed) {
      for (uint64_t k = 0; k < rows * ng; ++k) ps[k] = make_params(s, lohi[2 * k], lohi[2 * k + 1]);
      const uint64_t base = r0 * ng;
      if (s.scale_dtype == DType::F32) {
        for (uint64_t k = 0; k < rows * ng; ++k) std::memcpy(scales + (base + k) * 4, &ps[k].scale, 4);
      } else {
        for (uint64_t k = 0; k < rows * ng; ++k) store_scale(scales + (base + k) * sb, s.scale_dtype, ps[k].scale);
      }
      if (s.asym && zeros)
        for (uint64_t k = 0; k < rows * ng; ++k) store_scale(zeros + (base + k) * sb, s.scale_dtype, ps[k].zero);
    }
    // Pass 2: encode.
    for (uint64_t r = 0; r < rows; ++r) {
      uint8_t *out = codes + (r0 + r) * rb;
      if (f.bits < 8 && integer) std::memset(out, 0, rb);
      const float *x = buf + r * d;
      for (uint64_t gi = 0; gi < ng; ++gi) {
        const Params &p = fixed ? fixed_p : ps[r * ng + gi];
        const uint64_t j0 = gi * g, j1 = j0 + g;
        if (integer) {
          if (s.asym) encode_int_run_avx2<true>(f, x, j0, j1, p, out);
          else encode_int_run_avx2<false>(f, x, j0, j1, p, out);
        } else if (s.dtype == DType::FP8_E4M3) {
          encode_fp8_run_avx2<3, 7, 0x7eu>(x, j0, j1, p.inv, out);
        } else {
          encode_fp8_run_avx2<2, 15, 0x7bu>(x, j0, j1, p.inv, out);
        }
      }
    }
  }
}

// ---- f16 input, dynamic per-token / per-group scales, no rotation ---------
// The common case of a KV append (an engine's f16 K and V rows): two passes
// over the input and no float staging.
//
// Pass 1 reads every row once and takes each group's extremes on the f16
// bits themselves: for finite values, |x| orders as the integer h & 0x7fff,
// and x orders as the unsigned key h ^ (sign ? 0xffff : 0x8000). A key at or
// beyond Inf's marks a NaN or Inf, so this pass is also the finiteness check
// that must come before anything is written. Pass 2 turns each group's
// extremes into its parameters (make_params on the same floats the other
// paths see: f16 -> f32 is exact and monotonic, and -0 / +0 are normalized
// there) and encodes straight from the f16 row. Codes, scales and zero points
// are those of the scalar reference, bit for bit.

// Largest u16 of a vector of 16 (as the minimum of the complement).
__attribute__((target("avx2"), always_inline)) inline uint16_t hmax_epu16(__m256i v) {
  const __m128i m = _mm_max_epu16(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
  return static_cast<uint16_t>(~_mm_cvtsi128_si32(_mm_minpos_epu16(_mm_xor_si128(m, _mm_set1_epi32(-1)))));
}
__attribute__((target("avx2"), always_inline)) inline uint16_t hmin_epu16(__m256i v) {
  const __m128i m = _mm_min_epu16(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
  return static_cast<uint16_t>(_mm_cvtsi128_si32(_mm_minpos_epu16(m)));
}

// 16 f16 values from h (8 when only 8 remain: the upper half repeats them,
// which changes no extreme).
__attribute__((target("avx2"), always_inline)) inline __m256i load16h(const uint16_t *h, uint64_t left) {
  if (left >= 16) return _mm256_loadu_si256(reinterpret_cast<const __m256i *>(h));
  return _mm256_broadcastsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i *>(h)));
}

// Pass 1. Signed: lo[k] / hi[k] = the ordered keys of group k's minimum and
// maximum; otherwise hi[k] = the largest |x| bits of group k. Returns false
// (having looked at every value) when any is NaN or Inf.
template <bool Signed>
__attribute__((target("avx2"))) bool f16_group_keys(const uint16_t *h, uint64_t groups, uint64_t g,
                                                    uint16_t *lo_keys, uint16_t *hi_keys) {
  const __m256i abs_mask = _mm256_set1_epi16(0x7fff), top = _mm256_set1_epi16(static_cast<short>(0x8000));
  [[maybe_unused]] __m256i bad = _mm256_setzero_si256();  // unsigned keys: max of |x| bits, >= 0x7c00 is NaN / Inf
  for (uint64_t k = 0; k < groups; ++k, h += g) {
    if constexpr (Signed) {
      // (NaN and Inf are caught on the keys: at or above Inf's, or at or
      // below -Inf's.)
      __m256i lo = _mm256_set1_epi16(-1), hi = _mm256_setzero_si256(), lo1 = lo, hi1 = hi;
      uint64_t j = 0;
      for (; j + 32 <= g; j += 32) {
        const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i *>(h + j));
        const __m256i w = _mm256_loadu_si256(reinterpret_cast<const __m256i *>(h + j + 16));
        const __m256i kv = _mm256_xor_si256(v, _mm256_or_si256(_mm256_srai_epi16(v, 15), top));
        const __m256i kw = _mm256_xor_si256(w, _mm256_or_si256(_mm256_srai_epi16(w, 15), top));
        lo = _mm256_min_epu16(lo, kv);
        hi = _mm256_max_epu16(hi, kv);
        lo1 = _mm256_min_epu16(lo1, kw);
        hi1 = _mm256_max_epu16(hi1, kw);
      }
      for (; j < g; j += 16) {
        const __m256i v = load16h(h + j, g - j);
        const __m256i key = _mm256_xor_si256(v, _mm256_or_si256(_mm256_srai_epi16(v, 15), top));
        lo = _mm256_min_epu16(lo, key);
        hi = _mm256_max_epu16(hi, key);
      }
      lo_keys[k] = hmin_epu16(_mm256_min_epu16(lo, lo1));
      hi_keys[k] = hmax_epu16(_mm256_max_epu16(hi, hi1));
    } else {
      __m256i m0 = _mm256_setzero_si256(), m1 = m0;
      uint64_t j = 0;
      for (; j + 32 <= g; j += 32) {
        m0 = _mm256_max_epu16(m0, _mm256_and_si256(_mm256_loadu_si256(reinterpret_cast<const __m256i *>(h + j)), abs_mask));
        m1 = _mm256_max_epu16(m1, _mm256_and_si256(_mm256_loadu_si256(reinterpret_cast<const __m256i *>(h + j + 16)), abs_mask));
      }
      for (; j < g; j += 16) m1 = _mm256_max_epu16(m1, _mm256_and_si256(load16h(h + j, g - j), abs_mask));
      const __m256i m = _mm256_max_epu16(m0, m1);
      bad = _mm256_max_epu16(bad, m);
      hi_keys[k] = hmax_epu16(m);
    }
  }
  if constexpr (Signed) {
    // Keys of +Inf and above (NaN) are >= 0xfc00; of -Inf and below, <= 0x03ff.
    const __m256i hi_bad = _mm256_set1_epi16(static_cast<short>(0xfc00 - 0x8000)), lo_bad = _mm256_set1_epi16(0x03ff - 0x8000);
    const __m256i flip = _mm256_set1_epi16(static_cast<short>(0x8000));
    __m256i any = _mm256_setzero_si256();
    uint64_t k = 0;
    for (; k + 16 <= groups; k += 16) {  // signed compares on keys - 0x8000
      const __m256i a = _mm256_xor_si256(_mm256_loadu_si256(reinterpret_cast<const __m256i *>(lo_keys + k)), flip);
      const __m256i b = _mm256_xor_si256(_mm256_loadu_si256(reinterpret_cast<const __m256i *>(hi_keys + k)), flip);
      any = _mm256_or_si256(any, _mm256_or_si256(_mm256_cmpgt_epi16(_mm256_add_epi16(lo_bad, _mm256_set1_epi16(1)), a),
                                                 _mm256_cmpgt_epi16(b, _mm256_sub_epi16(hi_bad, _mm256_set1_epi16(1)))));
    }
    bool ok = _mm256_testz_si256(any, any);
    for (; k < groups; ++k) ok = ok && lo_keys[k] > 0x03ff && hi_keys[k] < 0xfc00;
    return ok;
  } else {
    return hmax_epu16(bad) < 0x7c00;
  }
}

// 4 ordered keys -> their f16 values as floats.
__attribute__((target("avx2,f16c"), always_inline)) inline __m128 f16_of_keys4(const uint16_t *keys) {
  const __m128i k = _mm_loadl_epi64(reinterpret_cast<const __m128i *>(keys));
  const __m128i neg = _mm_srai_epi16(k, 15);  // key top bit set: a value >= +0
  const __m128i flip = _mm_or_si128(_mm_andnot_si128(neg, _mm_set1_epi32(-1)), _mm_set1_epi16(static_cast<short>(0x8000)));
  return _mm_cvtph_ps(_mm_xor_si128(k, flip));
}

// The parameters of 4 groups from their extremes: make_params's operations
// for dynamic scales (in double where it uses double), 4 lanes at a time.
// Mode 0: symmetric (integer or fp8), 1: asymmetric, 2: full range. For f16
// input only: the extremes are f16 values, so round_zero_down leaves them as
// they are and the 1e38 caps never bind.
template <int Mode>
__attribute__((target("avx2,f16c"), always_inline)) inline void params4(__m128 lo, __m128 hi, double q, bool f16_scale,
                                                                       float *scale, float *inv, float *zero) {
  lo = _mm_add_ps(lo, _mm_setzero_ps());  // -0 -> +0
  hi = _mm_add_ps(hi, _mm_setzero_ps());
  const __m256d vq = _mm256_set1_pd(q);
  __m256d raw;
  __m128 positive = _mm_setzero_ps();
  if constexpr (Mode == 1) {
    raw = _mm256_div_pd(_mm256_sub_pd(_mm256_cvtps_pd(hi), _mm256_cvtps_pd(lo)), vq);
    _mm_storeu_ps(zero, lo);
  } else if constexpr (Mode == 2) {
    const __m128 nlo = _mm_sub_ps(_mm_setzero_ps(), lo);
    positive = _mm_cmpge_ps(hi, nlo);
    raw = _mm256_div_pd(_mm256_cvtps_pd(_mm_blendv_ps(nlo, hi, positive)), vq);
  } else {
    const __m128 abs = _mm_castsi128_ps(_mm_set1_epi32(0x7fffffff));
    raw = _mm256_div_pd(_mm256_cvtps_pd(_mm_max_ps(_mm_and_ps(lo, abs), _mm_and_ps(hi, abs))), vq);
  }
  const __m128 f = _mm_max_ps(_mm256_cvtpd_ps(raw), _mm_set1_ps(std::numeric_limits<float>::min()));
  // 64-bit compare masks -> 32-bit lanes (the even halves).
  const __m256i even = _mm256_setr_epi32(0, 2, 4, 6, 0, 2, 4, 6);
  const __m128i below = _mm256_castsi256_si128(_mm256_permutevar8x32_epi32(
      _mm256_castpd_si256(_mm256_cmp_pd(_mm256_cvtps_pd(f), raw, _CMP_LT_OQ)), even));
  const __m128i valid = _mm256_castsi256_si128(_mm256_permutevar8x32_epi32(
      _mm256_castpd_si256(_mm256_cmp_pd(raw, _mm256_setzero_pd(), _CMP_GT_OQ)), even));
  __m128 up = _mm_castsi128_ps(_mm_sub_epi32(_mm_castps_si128(f), below));  // + 1 ulp where f < raw
  if (f16_scale) up = _mm_cvtph_ps(_mm_cvtps_ph(_mm_min_ps(up, _mm_set1_ps(65504.0f)), _MM_FROUND_TO_POS_INF));
  const __m128 m = _mm_and_ps(up, _mm_castsi128_ps(valid));
  const __m128 r = _mm_and_ps(_mm_div_ps(_mm_set1_ps(1.0f), m), _mm_castsi128_ps(valid));
  if constexpr (Mode == 2) {
    const __m128 sign = _mm_and_ps(positive, _mm_set1_ps(-0.0f));
    _mm_storeu_ps(scale, _mm_and_ps(_mm_xor_ps(m, sign), _mm_castsi128_ps(valid)));
    _mm_storeu_ps(inv, _mm_and_ps(_mm_xor_ps(r, sign), _mm_castsi128_ps(valid)));
  } else {
    _mm_storeu_ps(scale, m);
    _mm_storeu_ps(inv, r);
  }
}

// Codes of m integer groups of g values (g a multiple of 32) straight from
// f16, the run kernel's operations with the constants kept in registers
// across groups. No clamp for symmetric and asymmetric groups: each group's
// own scale (rounded up) and zero point (its minimum, exact for f16 input)
// keep y = (x - zero) / scale within [0, qmax] or [-qmax, qmax] up to a few
// ulps, which round to the same codes the clamp gives. Full-range groups
// clamp (values of the other sign may exceed 2^(b-1) - 1 steps).
// Stream: the codes go around the caches (non-temporal stores, for outputs
// far larger than the caches; out 16-byte aligned, g * Bits / 8 a multiple of
// 32).
template <int Bits, int Mode, bool Stream = false>
__attribute__((target("avx2,f16c"))) void encode_groups_f16(const uint16_t *x, uint64_t m, uint64_t g,
                                                            const float *iv, const float *zp, const IntFormat &f,
                                                            uint8_t *out) {
  constexpr bool Asym = Mode == 1;
  const __m256 lo = _mm256_set1_ps(f.lo), hi = _mm256_set1_ps(f.hi);
  const __m256i off = _mm256_set1_epi32(f.off);
  for (uint64_t k = 0; k < m; ++k, x += g, out += g * Bits / 8) {
    const __m256 inv = _mm256_set1_ps(iv[k]), z = Asym ? _mm256_set1_ps(zp[k]) : _mm256_setzero_ps();
    for (uint64_t j = 0; j < g; j += 32) {
      const __m256i c = codes32_avx2<Asym, true, Mode == 2>(x, j, inv, z, lo, hi, off, Bits == 8 && !Asym);
      if constexpr (Bits == 8) {
        if constexpr (Stream) {
          _mm_stream_si128(reinterpret_cast<__m128i *>(out + j), _mm256_castsi256_si128(c));
          _mm_stream_si128(reinterpret_cast<__m128i *>(out + j + 16), _mm256_extracti128_si256(c, 1));
        } else {
          _mm256_storeu_si256(reinterpret_cast<__m256i *>(out + j), c);
        }
      } else if constexpr (Bits == 4) {
        const __m256i nib = _mm256_or_si256(_mm256_and_si256(c, _mm256_set1_epi16(0x000f)),
                                            _mm256_and_si256(_mm256_srli_epi16(c, 4), _mm256_set1_epi16(0x00f0)));
        const __m256i packed = _mm256_permute4x64_epi64(_mm256_packus_epi16(nib, nib), 0xd8);
        _mm_storeu_si128(reinterpret_cast<__m128i *>(out + j / 2), _mm256_castsi256_si128(packed));
      } else if constexpr (Bits == 3) {
        store_int3_32(c, out + j / 8 * 3);
      } else {
        const __m256i w16 = _mm256_maddubs_epi16(c, _mm256_set1_epi16(0x0401));
        const __m256i w32 = _mm256_madd_epi16(w16, _mm256_set1_epi32(0x00100001));
        const __m256i b8 = _mm256_packus_epi16(_mm256_packus_epi32(w32, w32), _mm256_setzero_si256());
        const __m256i lanes = _mm256_permutevar8x32_epi32(b8, _mm256_setr_epi32(0, 4, 0, 0, 0, 0, 0, 0));
        _mm_storel_epi64(reinterpret_cast<__m128i *>(out + j / 4), _mm256_castsi256_si128(lanes));
      }
    }
  }
}

// fp8 codes of m groups of g values (g a multiple of 32) straight from f16:
// fp8_encode8's operations on magnitudes, with the subnormal branch taken only
// for the 32 values that need it and the signs added after packing (the
// saturating packs keep each value's sign in the top bit of its byte). Each
// group's own scale keeps |y| within the largest finite code up to a few
// ulps, which round to it: fp8_encode8's saturation never binds.
template <int kMant, int kBias, uint32_t kMaxCode>
__attribute__((target("avx2,f16c"))) void encode_fp8_groups_f16(const uint16_t *x, uint64_t m, uint64_t g,
                                                                const float *iv, uint8_t *out) {
  constexpr int kDrop = 23 - kMant, kEmin = 1 - kBias;
  const __m256i order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
  const __m256i abs_mask = _mm256_set1_epi32(0x7fffffff), rebias = _mm256_set1_epi32((127 - kBias) << 23);
  const __m256i one = _mm256_set1_epi32(1), half = _mm256_set1_epi32((1 << (kDrop - 1)) - 1);
  const __m256i min_normal = _mm256_set1_epi32((127 + kEmin) << 23);
  const __m256 inv_step = _mm256_castsi256_ps(_mm256_set1_epi32((127 - kEmin + kMant) << 23));
  for (uint64_t k = 0; k < m; ++k, x += g, out += g) {
    const __m256 vinv = _mm256_set1_ps(iv[k]);
    for (uint64_t j = 0; j < g; j += 32) {
      __m256i u[4], a[4], c[4];
      #pragma GCC unroll 4
      for (int t = 0; t < 4; ++t) {
        u[t] = _mm256_castps_si256(_mm256_mul_ps(load8<true>(x, j + 8 * t), vinv));
        a[t] = _mm256_and_si256(u[t], abs_mask);
        const __m256i r = _mm256_sub_epi32(a[t], rebias);
        const __m256i odd = _mm256_and_si256(_mm256_srli_epi32(r, kDrop), one);
        c[t] = _mm256_srli_epi32(_mm256_add_epi32(r, _mm256_add_epi32(odd, half)), kDrop);
      }
      const __m256i amin = _mm256_min_epu32(_mm256_min_epu32(a[0], a[1]), _mm256_min_epu32(a[2], a[3]));
      const __m256i any_sub = _mm256_cmpgt_epi32(min_normal, amin);
      if (!_mm256_testz_si256(any_sub, any_sub)) {
        #pragma GCC unroll 4
        for (int t = 0; t < 4; ++t) {
          const __m256i q = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_castsi256_ps(a[t]), inv_step));
          c[t] = _mm256_blendv_epi8(c[t], q, _mm256_cmpgt_epi32(min_normal, a[t]));
        }
      }
      const __m256i codes = _mm256_packus_epi16(_mm256_packus_epi32(c[0], c[1]), _mm256_packus_epi32(c[2], c[3]));
      const __m256i signs = _mm256_and_si256(
          _mm256_packs_epi16(_mm256_packs_epi32(u[0], u[1]), _mm256_packs_epi32(u[2], u[3])),
          _mm256_set1_epi8(static_cast<char>(0x80)));
      _mm256_storeu_si256(reinterpret_cast<__m256i *>(out + j),
                          _mm256_permutevar8x32_epi32(_mm256_or_si256(codes, signs), order));
    }
  }
  (void)kMaxCode;
}

// m floats (f16 values already, so the conversion is exact) as little-endian
// f16 scales or zero points.
__attribute__((target("avx2,f16c"))) void store_f16_values(uint8_t *dst, const float *v, uint64_t m) {
  uint64_t k = 0;
  for (; k + 8 <= m; k += 8)
    _mm_storeu_si128(reinterpret_cast<__m128i *>(dst + k * 2),
                     _mm256_cvtps_ph(_mm256_loadu_ps(v + k), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
  for (; k < m; ++k) store_scale(dst + k * 2, DType::F16, v[k]);
}

// Returns false, having written nothing, when the input holds a NaN or Inf.
template <int Mode>
__attribute__((target("avx2,f16c"))) bool quantize_f16_direct(const Spec &s, const uint16_t *src, uint64_t n,
                                                              uint64_t d, uint8_t *codes, uint8_t *scales,
                                                              uint8_t *zeros) {
  constexpr bool Signed = Mode != 0;
  const uint64_t g = s.gran == Gran::Group ? s.group : d, groups = n * (d / g);
  // Keys of every group (the whole input is checked before anything is
  // written), then chunks of groups: parameters, scales, codes. Every group
  // of the flat input is g consecutive values, its codes g * bits / 8
  // consecutive bytes and its scale the next one (d is a multiple of g).
  constexpr uint64_t kChunk = 256;
  thread_local ScratchBuffer<uint16_t> keys_buf;
  thread_local std::vector<float> par_buf;  // fixed size: 3 x kChunk
  const uint64_t padded = (groups + 3) / 4 * 4;
  if (par_buf.size() < 3 * kChunk) par_buf.resize(3 * kChunk);
  uint16_t *lo_keys = keys_buf.get(2 * padded), *hi_keys = lo_keys + padded;
  for (uint64_t k = groups; k < padded; ++k) lo_keys[k] = hi_keys[k] = Signed ? 0x8000 : 0;  // +0
  if (!f16_group_keys<Signed>(src, groups, g, lo_keys, hi_keys)) return false;
  const bool integer = is_int(s.dtype), f16_scale = s.scale_dtype == DType::F16;
  const IntFormat f = int_format(s.dtype, s.asym, s.full_range);
  const uint64_t gb = g * (integer ? static_cast<uint64_t>(f.bits) : 8) / 8;  // code bytes per group
  const double q = Mode == 1 ? qmax_asym(s.dtype)
                   : Mode == 2 ? qmax_sym(s.dtype) + 1
                   : is_fp8(s.dtype) ? static_cast<double>(fp8_max(s.dtype))
                                     : qmax_sym(s.dtype);
  float *sc = par_buf.data(), *iv = sc + kChunk, *zp = iv + kChunk;
  // Outputs beyond a few MiB bypass the caches (the input is read twice and
  // should stay in them).
  const bool stream = integer && f.bits == 8 && g % 32 == 0 && groups * gb >= (uint64_t(4) << 20) &&
                      reinterpret_cast<uintptr_t>(codes) % 16 == 0;
  for (uint64_t k0 = 0; k0 < groups; k0 += kChunk) {
    const uint64_t m = std::min(kChunk, groups - k0);
    for (uint64_t k = 0; k < m; k += 4) {
      const uint64_t kk = k0 + k;
      const __m128 hi = Signed ? f16_of_keys4(hi_keys + kk)
                               : _mm_cvtph_ps(_mm_loadl_epi64(reinterpret_cast<const __m128i *>(hi_keys + kk)));
      const __m128 lo = Signed ? f16_of_keys4(lo_keys + kk) : _mm_sub_ps(_mm_setzero_ps(), hi);
      params4<Mode>(lo, hi, q, f16_scale, sc + k, iv + k, zp + k);
    }
    if (f16_scale) {  // (the values are f16 already: the conversion is exact; x86 is little-endian)
      store_f16_values(scales + k0 * 2, sc, m);
      if (Mode == 1 && zeros) store_f16_values(zeros + k0 * 2, zp, m);
    } else {
      std::memcpy(scales + k0 * 4, sc, m * 4);  // little-endian f32, as store_scale writes
      if (Mode == 1 && zeros) std::memcpy(zeros + k0 * 4, zp, m * 4);
    }
    if (g % 32 == 0) {
      const uint16_t *x = src + k0 * g;
      uint8_t *out = codes + k0 * gb;
      if (!integer) {
        if (s.dtype == DType::FP8_E4M3) encode_fp8_groups_f16<3, 7, 0x7eu>(x, m, g, iv, out);
        else encode_fp8_groups_f16<2, 15, 0x7bu>(x, m, g, iv, out);
      } else if (f.bits == 8) {
        if (stream) encode_groups_f16<8, Mode, true>(x, m, g, iv, zp, f, out);
        else encode_groups_f16<8, Mode>(x, m, g, iv, zp, f, out);
      } else if (f.bits == 4) {
        encode_groups_f16<4, Mode>(x, m, g, iv, zp, f, out);
      } else if (f.bits == 3) {
        encode_groups_f16<3, Mode>(x, m, g, iv, zp, f, out);
      } else {
        encode_groups_f16<2, Mode>(x, m, g, iv, zp, f, out);
      }
      continue;
    }
    if (integer && f.bits < 8) std::memset(codes + k0 * gb, 0, m * gb);  // scalar tails OR codes in
    for (uint64_t k = 0; k < m; ++k) {
      const uint16_t *x = src + (k0 + k) * g;
      uint8_t *out = codes + (k0 + k) * gb;
      Params p;
      p.scale = sc[k];
      p.inv = iv[k];
      p.zero = Mode == 1 ? zp[k] : 0.0f;
      if (integer) encode_int_run_avx2<Mode == 1, true, Mode != 0>(f, x, 0, g, p, out);
      else if (s.dtype == DType::FP8_E4M3) encode_fp8_run_avx2<3, 7, 0x7eu, true>(x, 0, g, p.inv, out);
      else encode_fp8_run_avx2<2, 15, 0x7bu, true>(x, 0, g, p.inv, out);
    }
  }
  if (stream) _mm_sfence();  // the streamed codes are visible before we return
  return true;
}

// Floats of scratch quantize_fast needs for rows of d values.
uint64_t quantize_fast_scratch(const Spec &s, uint64_t d) {
  const uint64_t chunk = std::max<uint64_t>(1, kChunkFloats / d);
  const uint64_t ng = s.gran == Gran::Group ? d / s.group : 1;
  return chunk * d + chunk * ng * (sizeof(Params) / sizeof(float) + 2);
}
}  // namespace
#endif

// The unnormalized butterfly grows a block's values by up to `block` times
// before the final normalization: inputs at or above FLT_MAX / block could
// overflow to Inf on the way, so they are refused (before anything is written).
void check_rotatable(const float *x, uint64_t n, uint32_t block) {
  if (!block) return;
  const float limit = std::numeric_limits<float>::max() / static_cast<float>(block);
  for (uint64_t i = 0; i < n; ++i)
    if (!(std::fabs(x[i]) < limit))
      fail(Errc::NonFinite, "element " + u64s(i) + " (" + fmt_g(x[i]) + ") is too large to rotate: the Hadamard "
                            "transform of a block of " + u64s(block) + " would overflow (|x| must stay below " +
                            fmt_g(limit) + "); nothing was written");
}

void quantize(const Spec &s, const void *src, DType src_type, uint64_t n, uint64_t d,
              uint8_t *codes, uint8_t *scales, uint8_t *zeros) {
#ifdef KVC_CODEC_X86
  // f16 rows with dynamic per-token or per-group scales and no rotation: the
  // direct path, whose first pass is also the finiteness check (on a NaN or
  // Inf it writes nothing and the check below reports the element).
  if (src_type == DType::F16 && use_avx2() && convert_has_simd() && !s.rotation_block &&
      s.static_scale == 0.0 && d % 8 == 0 && d > 0 && (is_int(s.dtype) || is_fp8(s.dtype)) &&
      (s.gran == Gran::Token || (s.gran == Gran::Group && s.group % 8 == 0 && d % s.group == 0))) {
    const uint16_t *h = static_cast<const uint16_t *>(src);
    const bool done = s.asym        ? quantize_f16_direct<1>(s, h, n, d, codes, scales, zeros)
                      : s.full_range ? quantize_f16_direct<2>(s, h, n, d, codes, scales, zeros)
                                     : quantize_f16_direct<0>(s, h, n, d, codes, scales, zeros);
    if (done) return;
  }
#endif
  check_finite_raw(src, src_type, n * d);  // before anything is written
  if (s.rotation_block && src_type == DType::F32)
    check_rotatable(static_cast<const float *>(src), n * d, s.rotation_block);
  // (f16 and bf16 inputs: f16 is always far below the limit; bf16 is checked after conversion below)
  if (s.rotation_block && src_type == DType::BF16) {
    float *tmp = scratch_floats(n * d);
    convert(src, src_type, tmp, DType::F32, n * d);
    check_rotatable(tmp, n * d, s.rotation_block);
  }
  const uint64_t esz = dtype_bytes(src_type);
#ifdef KVC_CODEC_X86
  // Fused path: groups of whole 8-value vectors (per-channel scales and
  // dynamic per-tensor scales need statistics over rows: general path).
  const bool fast_shape = d % 8 == 0 && d > 0 &&
                          (s.gran == Gran::Token || (s.gran == Gran::Tensor && s.static_scale > 0.0) ||
                           (s.gran == Gran::Group && s.group % 8 == 0 && d % s.group == 0));
  if (use_avx2() && convert_has_simd() && fast_shape && (is_int(s.dtype) || is_fp8(s.dtype)) &&
      (src_type == DType::F16 || src_type == DType::F32)) {
    float *buf = scratch_floats(quantize_fast_scratch(s, d));
    if (src_type == DType::F16) quantize_fast<true>(s, src, n, d, codes, scales, zeros, buf);
    else quantize_fast<false>(s, src, n, d, codes, scales, zeros, buf);
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

#ifdef KVC_CODEC_X86
namespace {
// A scale or zero point as stored (f16 through F16C: exact, as load_scale).
__attribute__((target("avx2,f16c"), always_inline)) inline float load_scale_fast(const uint8_t *p, DType sd) {
  if (sd == DType::F32) {
    float v;
    std::memcpy(&v, p, 4);  // little-endian, as store_scale writes
    return v;
  }
  uint16_t h;
  std::memcpy(&h, p, 2);
  return _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(h)));
}

// 8 codes from element j of a row of `Bits`-bit codes, as int32 q = code - off
// (int8 symmetric: the signed byte).
template <int Bits, bool Asym>
__attribute__((target("avx2"), always_inline)) inline __m256i unpack8(const uint8_t *in, uint64_t j, __m256i off) {
  if constexpr (Bits == 8) {
    const __m128i b = _mm_loadl_epi64(reinterpret_cast<const __m128i *>(in + j));
    return Asym ? _mm256_cvtepu8_epi32(b) : _mm256_cvtepi8_epi32(b);
  } else if constexpr (Bits == 3) {
    return _mm256_sub_epi32(load_int3_8(in, j), off);
  } else if constexpr (Bits == 4) {
    uint32_t w;
    std::memcpy(&w, in + j / 2, 4);
    const __m256i v = _mm256_srlv_epi32(_mm256_set1_epi32(static_cast<int>(w)), _mm256_setr_epi32(0, 4, 8, 12, 16, 20, 24, 28));
    return _mm256_sub_epi32(_mm256_and_si256(v, _mm256_set1_epi32(0xf)), off);
  } else {
    uint16_t w;
    std::memcpy(&w, in + j / 4, 2);
    const __m256i v = _mm256_srlv_epi32(_mm256_set1_epi32(static_cast<int>(w)), _mm256_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14));
    return _mm256_sub_epi32(_mm256_and_si256(v, _mm256_set1_epi32(0x3)), off);
  }
}

template <bool Half>
__attribute__((target("avx2,f16c"), always_inline)) inline void store8(void *dst, uint64_t i, __m256 x) {
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
                                                               const uint8_t *scales, const uint8_t *zeros,
                                                               uint64_t n, uint64_t d, void *dst) {
  const uint64_t g = s.gran == Gran::Group ? s.group : d, ng = d / g;
  const uint64_t rb = row_bytes(s.dtype, d), sb = scale_bytes(s);
  const IntFormat f = int_format(s.dtype, s.asym, s.full_range);
  const __m256i off = _mm256_set1_epi32(Bits == 8 ? 0 : f.off);
  for (uint64_t r = 0; r < n; ++r) {
    const uint8_t *in = codes + r * rb;
    for (uint64_t gi = 0; gi < ng; ++gi) {
      const uint64_t idx = s.gran == Gran::Tensor ? 0 : r * ng + gi;
      const __m256 vs = _mm256_set1_ps(load_scale_fast(scales + idx * sb, s.scale_dtype));
      const __m256 vz = Asym ? _mm256_set1_ps(load_scale_fast(zeros + idx * sb, s.scale_dtype)) : _mm256_setzero_ps();
      for (uint64_t j = gi * g; j < (gi + 1) * g; j += 8) {
        const __m256 x = _mm256_mul_ps(_mm256_cvtepi32_ps(unpack8<Bits, Asym>(in, j, off)), vs);
        store8<Half>(dst, r * d + j, Asym ? _mm256_add_ps(x, vz) : x);
      }
    }
  }
}

// dequantize_int_direct for the output type (f16 or f32) and the mode.
template <int Bits>
void dequantize_int_direct_any(const Spec &s, bool half, const uint8_t *codes, const uint8_t *scales,
                               const uint8_t *zeros, uint64_t n, uint64_t d, void *dst) {
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
                                                               const uint8_t *scales, uint64_t n, uint64_t d,
                                                               void *dst) {
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
        const __m128i special = E4M3 ? _mm_cmpeq_epi8(_mm_or_si128(b, _mm_set1_epi8(static_cast<char>(0x80))),
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

// Every integer and fp8 codec with per-tensor, per-token or per-group scales
// (and the rotation) to f16 or f32: each group decoded by the run kernels
// into an L1 row buffer (or straight into f32 output), the inverse rotation
// applied there, then one F16C conversion pass. The scalar path's operations.
template <bool Half>
__attribute__((target("avx2,f16c"))) void dequantize_fast(const Spec &s, const uint8_t *codes,
                                                         const uint8_t *scales, const uint8_t *zeros,
                                                         uint64_t n, uint64_t d, void *dst, float *buf) {
  const uint64_t g = s.gran == Gran::Group ? s.group : d, ng = d / g;
  const uint64_t rb = row_bytes(s.dtype, d), sb = scale_bytes(s);
  const bool integer = is_int(s.dtype), rotate = s.rotation_block != 0;
  const IntFormat f = int_format(s.dtype, s.asym, s.full_range);
  const float *table = s.dtype == DType::FP8_E4M3 ? fp8_e4m3_table() : fp8_e5m2_table();
  for (uint64_t r = 0; r < n; ++r) {
    const uint8_t *in = codes + r * rb;
    float *x = Half || rotate ? buf : static_cast<float *>(dst) + r * d;
    for (uint64_t gi = 0; gi < ng; ++gi) {
      const uint64_t idx = s.gran == Gran::Tensor ? 0 : r * ng + gi;
      Params p;
      p.scale = load_scale(scales + idx * sb, s.scale_dtype);
      if (s.asym) p.zero = load_scale(zeros + idx * sb, s.scale_dtype);
      if (integer) decode_int_run_avx2(f, s.asym, in, gi * g, (gi + 1) * g, p, x);
      else if (s.dtype == DType::FP8_E4M3) decode_fp8_run_avx2<3, 7>(table, in, gi * g, (gi + 1) * g, p.scale, x);
      else decode_fp8_run_avx2<2, 15>(table, in, gi * g, (gi + 1) * g, p.scale, x);
    }
    if (rotate) hadamard(buf, d, s.rotation_block);
    if constexpr (Half) {
      uint16_t *o = static_cast<uint16_t *>(dst) + r * d;
      for (uint64_t j = 0; j < d; j += 8)
        _mm_storeu_si128(reinterpret_cast<__m128i *>(o + j),
                         _mm256_cvtps_ph(_mm256_loadu_ps(buf + j), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
    } else if (rotate) {
      std::memcpy(static_cast<float *>(dst) + r * d, buf, d * 4);
    }
  }
}
}  // namespace
#endif

void dequantize(const Spec &s, const uint8_t *codes, const uint8_t *scales, const uint8_t *zeros,
                uint64_t n, uint64_t d, void *dst, DType dst_type) {
  const uint64_t esz = dtype_bytes(dst_type);
#ifdef KVC_CODEC_X86
  const bool fast_shape = d % 8 == 0 && d > 0 &&
                          (s.gran == Gran::Token || s.gran == Gran::Tensor ||
                           (s.gran == Gran::Group && s.group % 8 == 0 && d % s.group == 0));
  if (use_avx2() && convert_has_simd() && fast_shape && has_scales(s) && !s.rotation_block &&
      (dst_type == DType::F16 || dst_type == DType::F32)) {
    const bool h = dst_type == DType::F16;
    switch (s.dtype) {
      case DType::INT8: return dequantize_int_direct_any<8>(s, h, codes, scales, zeros, n, d, dst);
      case DType::INT4: return dequantize_int_direct_any<4>(s, h, codes, scales, zeros, n, d, dst);
      case DType::INT3: return dequantize_int_direct_any<3>(s, h, codes, scales, zeros, n, d, dst);
      case DType::INT2: return dequantize_int_direct_any<2>(s, h, codes, scales, zeros, n, d, dst);
      case DType::FP8_E4M3:
        return h ? dequantize_fp8_direct<true, true>(s, codes, scales, n, d, dst)
                 : dequantize_fp8_direct<false, true>(s, codes, scales, n, d, dst);
      case DType::FP8_E5M2:
        return h ? dequantize_fp8_direct<true, false>(s, codes, scales, n, d, dst)
                 : dequantize_fp8_direct<false, false>(s, codes, scales, n, d, dst);
      default:
        break;
    }
  }
  const bool fast_any = d % 8 == 0 && d > 0 && has_scales(s) &&
                        (s.gran == Gran::Token || s.gran == Gran::Tensor ||
                         (s.gran == Gran::Group && s.group % 8 == 0 && d % s.group == 0));
  if (use_avx2() && convert_has_simd() && fast_any &&
      (dst_type == DType::F16 || dst_type == DType::F32)) {
    float *buf = scratch_floats(d);
    if (dst_type == DType::F16) dequantize_fast<true>(s, codes, scales, zeros, n, d, dst, buf);
    else dequantize_fast<false>(s, codes, scales, zeros, n, d, dst, buf);
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
