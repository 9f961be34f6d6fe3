// quantize()'s one-pass f16 path with 512-bit vectors (AVX-512 F + BW + VL,
// chosen at run time by use_avx512(); x86-64 only): the first pass (group
// extremes on the f16 bits, also the finiteness check) and the int8 / int4
// encoders of quantize_avx2.cpp's quantize_f16_direct, for groups of a
// multiple of 32 values; the same encoders for the f32 rows of its
// quantize_fast; the fp8 encoder of both; and the Hadamard rotation of blocks of 64 / 128 values in
// 16-lane registers for quantize_fast and dequantize_avx2.cpp's fused path
// (8 registers a block of 128: no spills, four in-vector stages), the
// latter decoding int8 / int4 groups straight into those registers. The same
// operations in the same order on twice as many lanes (exact f16 -> f32 conversion, one rounded
// multiply, round half to even, saturating packs), so codes, scales and zero points are the scalar
// reference's and the AVX2 path's, bit for bit (tests/codec checks all three).
//
// Why a second width for the same math: on CPUs that run 512-bit operations
// as two 256-bit halves (AMD Zen 4) the conversions and multiplies cost the
// same per value, but the byte packing, which is where the 256-bit encoder
// spends its shuffles (pack, pack, pack, permute per 32 values), takes one
// truncating or saturating down-convert per 16 values, and every group's
// scale is broadcast from memory instead of held per row.
// GCC 12's 512-bit intrinsics (conversions, permutes, extracts, min / max)
// start from an undefined vector that -W(maybe-)uninitialized reports once
// they are inlined here; no variable of this file is read uninitialized.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#endif

#include "codec/kernels.h"

#include <cstring>

#ifdef KVC_CODEC_X86
#include <immintrin.h>

#include "codec/kernels_avx2.h"

namespace kvc::codec {

namespace {

#define KVC_AVX512 __attribute__((target("avx2,fma,f16c,bmi2,avx512f,avx512bw,avx512vl")))

// Largest and smallest u16 of 32 lanes.
KVC_AVX512 inline uint16_t hmax_epu16_512(__m512i v) {
  const __m256i m = _mm256_max_epu16(_mm512_castsi512_si256(v), _mm512_extracti64x4_epi64(v, 1));
  const __m128i q = _mm_max_epu16(_mm256_castsi256_si128(m), _mm256_extracti128_si256(m, 1));
  return static_cast<uint16_t>(
      ~_mm_cvtsi128_si32(_mm_minpos_epu16(_mm_xor_si128(q, _mm_set1_epi32(-1)))));
}
KVC_AVX512 inline uint16_t hmin_epu16_512(__m512i v) {
  const __m256i m = _mm256_min_epu16(_mm512_castsi512_si256(v), _mm512_extracti64x4_epi64(v, 1));
  const __m128i q = _mm_min_epu16(_mm256_castsi256_si128(m), _mm256_extracti128_si256(m, 1));
  return static_cast<uint16_t>(_mm_cvtsi128_si32(_mm_minpos_epu16(q)));
}

// The ordered key of each f16 lane: h ^ (sign ? 0xffff : 0x8000), as
// h ^ ((h >> 15 arithmetic) | 0x8000) in one ternary-logic operation
// (A ^ (B | C): truth table 0x1e).
KVC_AVX512 inline __m512i order_keys(__m512i v) {
  return _mm512_ternarylogic_epi32(v, _mm512_srai_epi16(v, 15),
                                   _mm512_set1_epi16(static_cast<short>(0x8000)), 0x1e);
}

// The 32-lane extremes of the vectors of one group (g a multiple of 32).
template <bool Signed>
KVC_AVX512 inline void group_extremes(const uint16_t *h, uint64_t g, __m512i *lo_out,
                                      __m512i *hi_out) {
  if constexpr (Signed) {
    if (g == 32) {
      *lo_out = *hi_out = order_keys(_mm512_loadu_si512(h));
      return;
    }
    __m512i lo = _mm512_set1_epi16(-1), hi = _mm512_setzero_si512(), lo1 = lo, hi1 = hi;
    uint64_t j = 0;
    for (; j + 64 <= g; j += 64) {
      const __m512i kv = order_keys(_mm512_loadu_si512(h + j));
      const __m512i kw = order_keys(_mm512_loadu_si512(h + j + 32));
      lo = _mm512_min_epu16(lo, kv);
      hi = _mm512_max_epu16(hi, kv);
      lo1 = _mm512_min_epu16(lo1, kw);
      hi1 = _mm512_max_epu16(hi1, kw);
    }
    if (j < g) {  // 32 left
      const __m512i kv = order_keys(_mm512_loadu_si512(h + j));
      lo = _mm512_min_epu16(lo, kv);
      hi = _mm512_max_epu16(hi, kv);
    }
    *lo_out = _mm512_min_epu16(lo, lo1);
    *hi_out = _mm512_max_epu16(hi, hi1);
  } else {
    const __m512i abs_mask = _mm512_set1_epi16(0x7fff);
    if (g == 32) {  // one vector (int4 and lower-bit codecs' usual group)
      *hi_out = _mm512_and_si512(_mm512_loadu_si512(h), abs_mask);
      return;
    }
    if (g == 128) {  // per-token rows of the usual head_dim: straight-line
      const __m512i a = _mm512_max_epu16(_mm512_and_si512(_mm512_loadu_si512(h), abs_mask),
                                         _mm512_and_si512(_mm512_loadu_si512(h + 32), abs_mask));
      const __m512i b = _mm512_max_epu16(_mm512_and_si512(_mm512_loadu_si512(h + 64), abs_mask),
                                         _mm512_and_si512(_mm512_loadu_si512(h + 96), abs_mask));
      *hi_out = _mm512_max_epu16(a, b);
      return;
    }
    __m512i m0 = _mm512_setzero_si512(), m1 = m0;
    uint64_t j = 0;
    for (; j + 64 <= g; j += 64) {
      m0 = _mm512_max_epu16(m0, _mm512_and_si512(_mm512_loadu_si512(h + j), abs_mask));
      m1 = _mm512_max_epu16(m1, _mm512_and_si512(_mm512_loadu_si512(h + j + 32), abs_mask));
    }
    if (j < g) m1 = _mm512_max_epu16(m1, _mm512_and_si512(_mm512_loadu_si512(h + j), abs_mask));
    *hi_out = _mm512_max_epu16(m0, m1);
  }
}

template <bool Max>
KVC_AVX512 inline __m512i op16(__m512i a, __m512i b) {
  return Max ? _mm512_max_epu16(a, b) : _mm512_min_epu16(a, b);
}

// The extreme of each of 8 vectors of 32 u16 lanes, as 8 u16 in order: a
// tree of 128-bit lane shuffles (halves, quarters, 64-bit halves of lanes,
// then within 64 bits) instead of one horizontal reduction per vector.
// [halves of a | halves of b]: each 256-bit half its vector's 16-lane extremes.
template <bool Max>
KVC_AVX512 inline __m512i halves(__m512i a, __m512i b) {
  return op16<Max>(_mm512_shuffle_i64x2(a, b, _MM_SHUFFLE(1, 0, 1, 0)),
                   _mm512_shuffle_i64x2(a, b, _MM_SHUFFLE(3, 2, 3, 2)));
}
// [a0 a1 | b0 b1] x 2 -> each 128-bit lane one vector's 8-lane extremes.
template <bool Max>
KVC_AVX512 inline __m512i quarters(__m512i a, __m512i b) {
  return op16<Max>(_mm512_shuffle_i64x2(a, b, _MM_SHUFFLE(2, 0, 2, 0)),
                   _mm512_shuffle_i64x2(a, b, _MM_SHUFFLE(3, 1, 3, 1)));
}

template <bool Max>
KVC_AVX512 inline void reduce8(const __m512i *v, uint16_t *out) {
  const __m512i even =
      quarters<Max>(halves<Max>(v[0], v[2]), halves<Max>(v[4], v[6]));  // lanes: 0 2 4 6
  const __m512i odd =
      quarters<Max>(halves<Max>(v[1], v[3]), halves<Max>(v[5], v[7]));  // lanes: 1 3 5 7
  // 64-bit element 2 L: vector 2 L's 4-lane extremes, 2 L + 1: vector 2 L + 1's.
  __m512i x = op16<Max>(_mm512_unpacklo_epi64(even, odd), _mm512_unpackhi_epi64(even, odd));
  x = op16<Max>(x, _mm512_srli_epi64(x, 32));
  x = op16<Max>(x, _mm512_srli_epi64(x, 16));  // each element's low 16 bits
  _mm_storeu_si128(reinterpret_cast<__m128i *>(out), _mm512_cvtepi64_epi16(x));
}

// quantize_avx2.cpp's f16_group_keys for g a multiple of 32, 8 groups'
// reductions at a time.
template <bool Signed>
KVC_AVX512 bool group_keys(const uint16_t *h, uint64_t groups, uint64_t g, uint16_t *lo_keys,
                           uint16_t *hi_keys) {
  __m512i bad = _mm512_setzero_si512();  // unsigned: the largest |x| bits seen
  uint64_t k = 0;
  for (; k + 8 <= groups; k += 8, h += 8 * g) {
    __m512i lo[8], hi[8];  // (fully unrolled: held in registers)
#pragma GCC unroll 8
    for (int t = 0; t < 8; ++t) group_extremes<Signed>(h + t * g, g, lo + t, hi + t);
    if constexpr (Signed) reduce8<false>(lo, lo_keys + k);
    reduce8<true>(hi, hi_keys + k);
    if constexpr (!Signed)
#pragma GCC unroll 8
      for (int t = 0; t < 8; ++t) bad = _mm512_max_epu16(bad, hi[t]);
  }
  for (; k < groups; ++k, h += g) {
    __m512i lo, hi;
    group_extremes<Signed>(h, g, &lo, &hi);
    if constexpr (Signed) lo_keys[k] = hmin_epu16_512(lo);
    hi_keys[k] = hmax_epu16_512(hi);
    if constexpr (!Signed) bad = _mm512_max_epu16(bad, hi);
  }
  if constexpr (Signed) {
    // Keys of +Inf and above (NaN) are >= 0xfc00; of -Inf and below, <= 0x03ff.
    __mmask32 any = 0;
    uint64_t i = 0;
    for (; i + 32 <= groups; i += 32) {
      any |= _mm512_cmple_epu16_mask(_mm512_loadu_si512(lo_keys + i), _mm512_set1_epi16(0x03ff));
      any |= _mm512_cmpge_epu16_mask(_mm512_loadu_si512(hi_keys + i),
                                     _mm512_set1_epi16(static_cast<short>(0xfc00)));
    }
    bool ok = any == 0;
    for (; i < groups; ++i) ok = ok && lo_keys[i] > 0x03ff && hi_keys[i] < 0xfc00;
    return ok;
  } else {
    return hmax_epu16_512(bad) < 0x7c00;
  }
}

// 16 values from x (f16 or f32) -> their q (int32, before the offset):
// codes32_avx2's operations (quant8_avx2, with the clamp where Clamp).
template <typename In, int Mode, bool Clamp>
KVC_AVX512 inline __m512i quant16(const In *x, const float *iv, const float *zp, __m512 lo,
                                  __m512 hi) {
  __m512 y;
  if constexpr (sizeof(In) == 2)
    y = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i *>(x)));
  else
    y = _mm512_loadu_ps(x);
  if constexpr (Mode == 1) y = _mm512_sub_ps(y, _mm512_set1_ps(*zp));
  y = _mm512_mul_ps(y, _mm512_set1_ps(*iv));
  if constexpr (Clamp) y = _mm512_min_ps(_mm512_max_ps(y, lo), hi);
  return _mm512_cvtps_epi32(y);
}

// Codes of m groups of g values (g a multiple of 32; the groups consecutive in
// x, their codes consecutive in out) straight from f16 or f32 rows:
// quantize_avx2.cpp's encode_groups_f16 (f16: clamped for full-range groups
// alone) and encode_groups32 (f32: always clamped) for 8- and 4-bit codes, 64
// values per step across group boundaries (each 16-value vector lies in one
// group, whose 1 / scale and zero point it broadcasts: group k's at iv[k x
// ps], zp[k x ps], ps the stride in floats). Stream: the codes go around the
// caches (out 64-byte aligned, int8 only).
template <typename In, int Bits, int Mode, bool Stream>
KVC_AVX512 void encode_groups(const In *x, uint64_t m, uint64_t g, const float *iv, const float *zp,
                              uint64_t ps, const IntFormat &f, uint8_t *out) {
  constexpr bool Half = sizeof(In) == 2, Clamp = Mode == 2 || !Half;
  constexpr bool Wide = Bits == 8 && Mode == 1;  // asymmetric int8: q in 0..255, unsigned packs
  const __m512 lo = _mm512_set1_ps(f.lo), hi = _mm512_set1_ps(f.hi);
  const __m512i off8 = _mm512_set1_epi8(static_cast<char>(f.off));
  // q_t lane L's 4 values sit in dword 4 L + t after the packs.
  const __m512i order = _mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15);
  const uint64_t total = m * g;
  // 64 values from x + j: j .. j + 31 in group ka, j + 32 .. j + 63 in kb.
  const auto step = [&](uint64_t j, uint64_t ka, uint64_t kb) KVC_AVX512 {
    __m512i q[4];
    q[0] = quant16<In, Mode, Clamp>(x + j, iv + ka * ps, zp + ka * ps, lo, hi);
    q[1] = quant16<In, Mode, Clamp>(x + j + 16, iv + ka * ps, zp + ka * ps, lo, hi);
    q[2] = quant16<In, Mode, Clamp>(x + j + 32, iv + kb * ps, zp + kb * ps, lo, hi);
    q[3] = quant16<In, Mode, Clamp>(x + j + 48, iv + kb * ps, zp + kb * ps, lo, hi);
    const __m512i a = _mm512_packs_epi32(q[0], q[1]), b = _mm512_packs_epi32(q[2], q[3]);
    __m512i c;
    if constexpr (Wide)
      c = _mm512_packus_epi16(a, b);
    else if constexpr (Bits == 8)  // int_format: signed int8 codes have no offset
      c = _mm512_packs_epi16(a, b);
    else
      c = _mm512_add_epi8(_mm512_packs_epi16(a, b), off8);
    c = _mm512_permutexvar_epi32(order, c);
    if constexpr (Bits == 8) {
      if constexpr (Stream)
        _mm512_stream_si512(reinterpret_cast<__m512i *>(out + j), c);
      else
        _mm512_storeu_si512(out + j, c);
    } else {  // c0 + 16 c1 per 16-bit lane, truncated to bytes in order
      const __m512i w16 = _mm512_maddubs_epi16(c, _mm512_set1_epi16(0x1001));
      _mm256_storeu_si256(reinterpret_cast<__m256i *>(out + j / 2), _mm512_cvtepi16_epi8(w16));
    }
  };
  uint64_t j = 0, k = 0;
  if ((g & (g - 1)) == 0) {  // g a power of two (the usual 32 .. head_dim): k = j / g, shifted
    const int sh = __builtin_ctzll(g);
    for (; j + 64 <= total; j += 64) step(j, j >> sh, (j + 32) >> sh);
    k = j >> sh;
  } else {
    for (uint64_t pos = 0; j + 64 <= total; j += 64) {
      step(j, k, pos + 32 == g ? k + 1 : k);
      for (pos += 64; pos >= g; pos -= g) ++k;
    }
  }
  if (j < total) {  // the last 32 values (in group k), 256 bits wide
    const __m256i c = codes32_avx2<Mode == 1, Half, Clamp>(
        x, j, _mm256_set1_ps(iv[k * ps]),
        Mode == 1 ? _mm256_set1_ps(zp[k * ps]) : _mm256_setzero_ps(), _mm256_set1_ps(f.lo),
        _mm256_set1_ps(f.hi), _mm256_set1_epi8(static_cast<char>(f.off)), Wide);
    if constexpr (Bits == 8)
      _mm256_storeu_si256(reinterpret_cast<__m256i *>(out + j), c);
    else
      store_int4_32(c, out + j / 2);
  }
}

template <typename In, int Bits, int Mode>
void encode_stream(bool stream, const In *x, uint64_t m, uint64_t g, const float *iv,
                   const float *zp, uint64_t ps, const IntFormat &f, uint8_t *out) {
  if (Bits == 8 && stream)
    encode_groups<In, Bits, Mode, true>(x, m, g, iv, zp, ps, f, out);
  else
    encode_groups<In, Bits, Mode, false>(x, m, g, iv, zp, ps, f, out);
}

template <typename In>
void encode_any(int bits, int mode, bool stream, const In *x, uint64_t m, uint64_t g,
                const float *iv, const float *zp, uint64_t ps, const IntFormat &f, uint8_t *out) {
  if (bits == 8) {
    if (mode == 0)
      encode_stream<In, 8, 0>(stream, x, m, g, iv, zp, ps, f, out);
    else if (mode == 1)
      encode_stream<In, 8, 1>(stream, x, m, g, iv, zp, ps, f, out);
    else
      encode_stream<In, 8, 2>(stream, x, m, g, iv, zp, ps, f, out);
  } else {
    if (mode == 0)
      encode_stream<In, 4, 0>(false, x, m, g, iv, zp, ps, f, out);
    else if (mode == 1)
      encode_stream<In, 4, 1>(false, x, m, g, iv, zp, ps, f, out);
    else
      encode_stream<In, 4, 2>(false, x, m, g, iv, zp, ps, f, out);
  }
}

// --- fp8 codes (quantize_avx2.cpp's encode_fp8_groups, 16 lanes) ---
// 16 values of x from element j times one inverse scale (one rounding, as the
// 256-bit kernel's), as their f32 bit patterns.
template <typename In>
KVC_AVX512 inline __m512i scaled16(const In *x, uint64_t j, __m512 inv) {
  __m512 y;
  if constexpr (sizeof(In) == 2)
    y = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i *>(x + j)));
  else
    y = _mm512_loadu_ps(x + j);
  return _mm512_castps_si512(_mm512_mul_ps(y, inv));
}

// 64 scaled values (u[t]: 16 lanes each, in order) -> 64 fp8 codes in
// order: the fast step on the magnitudes as integers (the code less the
// smallest normal one, packed with signed saturation; a byte outside [0,
// largest - smallest normal code] marks a value under the smallest normal
// or past the largest finite one), else the exact step for all 64 (the
// saturating clamp and the subnormals' own rounding); the signs from the
// values' sign bits after packing. encode_fp8_groups's operations lane by
// lane, so its codes.
template <int kMant, int kBias, uint32_t kMaxCode>
KVC_AVX512 inline __m512i fp8_codes64(const __m512i *u) {
  constexpr int kDrop = 23 - kMant, kEmin = 1 - kBias;
  constexpr uint32_t kMaxBits =
      ((kMaxCode >> kMant) + 127 - kBias) << 23 | (kMaxCode & ((1u << kMant) - 1)) << kDrop;
  constexpr int kMinNormalCode = 1 << kMant, kLim = static_cast<int>(kMaxCode) - kMinNormalCode;
  const __m512i abs_mask = _mm512_set1_epi32(0x7fffffff), one = _mm512_set1_epi32(1);
  const __m512i fast_add = _mm512_set1_epi32(static_cast<int>(
      static_cast<uint32_t>((1 << (kDrop - 1)) - 1) - static_cast<uint32_t>((127 + kEmin) << 23)));
  __m512i c[4];
#pragma GCC unroll 4
  for (int t = 0; t < 4; ++t) {
    const __m512i odd = _mm512_and_si512(_mm512_srli_epi32(u[t], kDrop), one);
    c[t] = _mm512_srli_epi32(
        _mm512_add_epi32(_mm512_add_epi32(_mm512_and_si512(u[t], abs_mask), fast_add), odd), kDrop);
  }
  __m512i codes =
      _mm512_packs_epi16(_mm512_packs_epi32(c[0], c[1]), _mm512_packs_epi32(c[2], c[3]));
  const __m512i lim_add = _mm512_set1_epi8(static_cast<char>(0x7f - kLim));
  if (_mm512_movepi8_mask(_mm512_adds_epu8(codes, lim_add)) == 0) {
    codes = _mm512_add_epi8(codes, _mm512_set1_epi8(static_cast<char>(kMinNormalCode)));
  } else {  // the exact step
    const __m512i vmax = _mm512_set1_epi32(static_cast<int>(kMaxBits));
    const __m512i rebias = _mm512_set1_epi32((127 - kBias) << 23);
    const __m512i half = _mm512_set1_epi32((1 << (kDrop - 1)) - 1);
    const __m512i min_normal = _mm512_set1_epi32((127 + kEmin) << 23);
    const __m512 inv_step = _mm512_castsi512_ps(_mm512_set1_epi32((127 - kEmin + kMant) << 23));
#pragma GCC unroll 4
    for (int t = 0; t < 4; ++t) {
      const __m512i a = _mm512_min_epu32(_mm512_and_si512(u[t], abs_mask), vmax);
      const __m512i r = _mm512_sub_epi32(a, rebias);
      const __m512i odd = _mm512_and_si512(_mm512_srli_epi32(r, kDrop), one);
      const __m512i cn = _mm512_srli_epi32(_mm512_add_epi32(r, _mm512_add_epi32(odd, half)), kDrop);
      const __m512i q = _mm512_cvtps_epi32(_mm512_mul_ps(_mm512_castsi512_ps(a), inv_step));
      c[t] = _mm512_mask_blend_epi32(_mm512_cmpgt_epi32_mask(min_normal, a), cn, q);
    }
    codes = _mm512_packus_epi16(_mm512_packus_epi32(c[0], c[1]), _mm512_packus_epi32(c[2], c[3]));
  }
  const __m512i signs = _mm512_and_si512(
      _mm512_packs_epi16(_mm512_packs_epi32(u[0], u[1]), _mm512_packs_epi32(u[2], u[3])),
      _mm512_set1_epi8(static_cast<char>(0x80)));
  // dword 4 L + t of the packs: vector t's lane L (4 values)
  return _mm512_permutexvar_epi32(
      _mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15),
      _mm512_or_si512(codes, signs));
}

// m groups of g values (g a multiple of 32), 64 a step across group
// boundaries (each 32 values lie in one group); the last 32, if any, with
// zeros after them (their codes are not stored). ahead (elements, 0: none):
// each step prefetches its own values' lines that far ahead.
template <typename In, int kMant, int kBias, uint32_t kMaxCode>
KVC_AVX512 void encode_fp8(const In *x, uint64_t m, uint64_t g, const float *iv, uint8_t *out,
                           uint64_t ahead) {
  const uint64_t total = m * g;
  uint64_t j = 0, k = 0, pos = 0;  // j's group and its offset in it
  for (; j + 64 <= total; j += 64) {
    if (ahead)  // (an address past the input when the next chunk is shorter: a hint, no access)
      for (uint64_t l = 0; l < 64 * sizeof(In); l += 64)
        _mm_prefetch(reinterpret_cast<const char *>(reinterpret_cast<uintptr_t>(x) +
                                                    (j + ahead) * sizeof(In) + l),
                     _MM_HINT_T0);
    const uint64_t k2 = pos + 32 == g ? k + 1 : k;
    const __m512 i1 = _mm512_set1_ps(iv[k]), i2 = _mm512_set1_ps(iv[k2]);
    const __m512i u[4] = {scaled16(x, j, i1), scaled16(x, j + 16, i1), scaled16(x, j + 32, i2),
                          scaled16(x, j + 48, i2)};
    for (pos += 64; pos >= g; pos -= g) ++k;
    _mm512_storeu_si512(out + j, fp8_codes64<kMant, kBias, kMaxCode>(u));
  }
  if (j < total) {  // 32 left, in group k
    const __m512 i1 = _mm512_set1_ps(iv[k]);
    const __m512i u[4] = {scaled16(x, j, i1), scaled16(x, j + 16, i1), _mm512_setzero_si512(),
                          _mm512_setzero_si512()};
    _mm256_storeu_si256(reinterpret_cast<__m256i *>(out + j),
                        _mm512_castsi512_si256(fp8_codes64<kMant, kBias, kMaxCode>(u)));
  }
}

template <typename In>
void encode_fp8_any(bool e4m3, const In *x, uint64_t m, uint64_t g, const float *iv, uint8_t *out,
                    uint64_t ahead) {
  if (e4m3)
    encode_fp8<In, 3, 7, 0x7eu>(x, m, g, iv, out, ahead);
  else
    encode_fp8<In, 2, 15, 0x7bu>(x, m, g, iv, out, ahead);
}

// --- Hadamard rotation (hadamard_avx2.h's register transform, 16 lanes) ---
// Stages h = 1, 2, 4, 8 inside one vector of 16 values, each as one shuffle
// and one fused multiply-add (butterfly8's rule: s + y x (+1 in a pair's
// first lane, -1 in its second) is a + c or a - c exactly before its one
// rounding), so the same bits as the scalar loop's stages.
KVC_AVX512 inline __m512 butterfly16(__m512 y) {
  const __m512 one = _mm512_set1_ps(1.0f);
  y = _mm512_fmadd_ps(y, _mm512_mask_blend_ps(0xaaaa, one, _mm512_set1_ps(-1.0f)),
                      _mm512_permute_ps(y, 0xb1));
  y = _mm512_fmadd_ps(y, _mm512_mask_blend_ps(0xcccc, one, _mm512_set1_ps(-1.0f)),
                      _mm512_permute_ps(y, 0x4e));
  y = _mm512_fmadd_ps(y, _mm512_mask_blend_ps(0xf0f0, one, _mm512_set1_ps(-1.0f)),
                      _mm512_shuffle_f32x4(y, y, _MM_SHUFFLE(2, 3, 0, 1)));
  return _mm512_fmadd_ps(y, _mm512_mask_blend_ps(0xff00, one, _mm512_set1_ps(-1.0f)),
                         _mm512_shuffle_f32x4(y, y, _MM_SHUFFLE(1, 0, 3, 2)));
}

// The vector stages h = H, 2H, .. NV / 2 over r[0 .. NV) (H a template
// argument: constant trip counts, fully unrolled; see hadamard_avx2.h).
template <int NV, int H>
KVC_AVX512 inline void vector_stages(__m512 *r) {
  if constexpr (H < NV) {
#pragma GCC unroll 8
    for (int i = 0; i < NV; i += 2 * H)
#pragma GCC unroll 8
      for (int j = i; j < i + H; ++j) {
        const __m512 a = _mm512_add_ps(r[j], r[j + H]);
        r[j + H] = _mm512_sub_ps(r[j], r[j + H]);
        r[j] = a;
      }
    vector_stages<NV, 2 * H>(r);
  }
}

// The rest of a block's transform once its in-vector stages are done: the
// vector stages, the normalization, and the store to out (f32, or f16
// rounded to nearest even).
template <typename Out, int NV>
KVC_AVX512 inline void finish_block(__m512 *r, __m512 norm, Out *out) {
  vector_stages<NV, 1>(r);
#pragma GCC unroll 8
  for (int i = 0; i < NV; ++i) {
    const __m512 y = _mm512_mul_ps(r[i], norm);
    if constexpr (sizeof(Out) == 2)
      _mm256_storeu_si256(reinterpret_cast<__m256i *>(out + 16 * i),
                          _mm512_cvtps_ph(y, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
    else
      _mm512_storeu_ps(out + 16 * i, y);
  }
}

// The normalized transform of blocks of 16 NV values (NV 4: 64, 8: 128) of
// one row (f16 or f32) into out (f32, or f16 rounded to nearest even):
// loaded, every stage in registers, scaled by norm, stored (the vector
// stages h = 16, 32, 64 as a + b and a - b of the same operands, in the same
// order, as the scalar loop).
// The 16 NV values of a block at x (f16 or f32) as floats, their in-vector
// stages done.
template <typename In, int NV>
KVC_AVX512 inline void load_block(const In *x, __m512 *r) {
#pragma GCC unroll 8
  for (int i = 0; i < NV; ++i) {
    if constexpr (sizeof(In) == 2)
      r[i] = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i *>(x + 16 * i)));
    else
      r[i] = _mm512_loadu_ps(x + 16 * i);
    r[i] = butterfly16(r[i]);
  }
}

template <typename In, typename Out, int NV>
KVC_AVX512 void rotate_blocks(const In *row, Out *out, uint64_t d, __m512 norm) {
  for (uint64_t b = 0; b < d; b += 16 * NV) {
    __m512 r[NV];
    load_block<In, NV>(row + b, r);
    finish_block<Out, NV>(r, norm, out + b);
  }
}

// Four groups' lane extremes a[0..3] (16 lanes each) reduced: quarter k of
// the result holds group k's minimum (Max false) or maximum in all four lanes.
template <bool Max>
KVC_AVX512 inline __m512 op512(__m512 a, __m512 b) {
  return Max ? _mm512_max_ps(a, b) : _mm512_min_ps(a, b);
}
template <bool Max>
KVC_AVX512 inline __m512 reduce4(const __m512 *a) {
  // 128-bit quarters: [a0 . a2, a1 . a3, b0 . b2, b1 . b3]
  const __m512 ab =
      op512<Max>(_mm512_shuffle_f32x4(a[0], a[1], 0x44), _mm512_shuffle_f32x4(a[0], a[1], 0xee));
  const __m512 cd =
      op512<Max>(_mm512_shuffle_f32x4(a[2], a[3], 0x44), _mm512_shuffle_f32x4(a[2], a[3], 0xee));
  // quarter k: group k's four lanes
  __m512 p = op512<Max>(_mm512_shuffle_f32x4(ab, cd, 0x88), _mm512_shuffle_f32x4(ab, cd, 0xdd));
  p = op512<Max>(p, _mm512_permute_ps(p, 0x4e));
  return op512<Max>(p, _mm512_permute_ps(p, 0xb1));
}

// The pairs lohi[2k], lohi[2k + 1] = min, max of the first n of four groups
// (their lane minima lo[0..3] and maxima hi[0..3]).
KVC_AVX512 inline void minmax4_out(const __m512 *lo, const __m512 *hi, int n, float *lohi) {
  const __m512 pairs = _mm512_permutex2var_ps(
      reduce4<false>(lo), _mm512_setr_epi32(0, 16, 4, 20, 8, 24, 12, 28, 0, 0, 0, 0, 0, 0, 0, 0),
      reduce4<true>(hi));
  _mm256_mask_storeu_ps(lohi, static_cast<__mmask8>((1u << (2 * n)) - 1),
                        _mm512_castps512_ps256(pairs));
}

// rotate_blocks into f32 (the same bits) that also takes the min and max of
// each group of g values of the rotated row (g a multiple of 16) from the
// registers, as quantize_fast's min / max pass does from the stored row (the
// same floats: a finite group's extremes in any order). Returns false when a
// rotated value is NaN or Inf.
template <typename In, int NV>
KVC_AVX512 bool rotate_minmax_blocks(const In *row, float *out, uint64_t d, float norm_f,
                                     uint64_t g, float *lohi) {
  const __m512 norm = _mm512_set1_ps(norm_f);
  const __m512i mag = _mm512_set1_epi32(0x7fffffff), fmax = _mm512_set1_epi32(0x7f7fffff);
  __m512 lo = _mm512_setzero_ps(), hi = lo, plo[4], phi[4];
  __mmask16 bad = 0;
  uint64_t filled = 0;
  int np = 0;
  for (uint64_t b = 0; b < d; b += 16 * NV) {
    __m512 r[NV];
    load_block<In, NV>(row + b, r);
    vector_stages<NV, 1>(r);
#pragma GCC unroll 8
    for (int i = 0; i < NV; ++i) {
      const __m512 y = _mm512_mul_ps(r[i], norm);
      _mm512_storeu_ps(out + b + 16 * i, y);
      // |x| bits above FLT_MAX's: NaN or Inf
      bad |= _mm512_cmpgt_epi32_mask(_mm512_and_si512(_mm512_castps_si512(y), mag), fmax);
      lo = filled ? _mm512_min_ps(lo, y) : y;
      hi = filled ? _mm512_max_ps(hi, y) : y;
      filled += 16;
      if (filled == g) {
        plo[np] = lo;
        phi[np++] = hi;
        filled = 0;
        if (np == 4) {
          minmax4_out(plo, phi, 4, lohi);
          lohi += 8;
          np = 0;
        }
      }
    }
  }
  if (np) {
    for (int i = np; i < 4; ++i) {
      plo[i] = plo[0];
      phi[i] = phi[0];
    }
    minmax4_out(plo, phi, np, lohi);
  }
  return bad == 0;
}

template <typename In, typename Out>
KVC_AVX512 void rotate_any(const In *row, Out *out, uint64_t d, uint32_t block, float norm) {
  if (block == 128)
    rotate_blocks<In, Out, 8>(row, out, d, _mm512_set1_ps(norm));
  else
    rotate_blocks<In, Out, 4>(row, out, d, _mm512_set1_ps(norm));
}

// 16 integer codes of a row from element j (j % 16 == 0) as int32 q: int8
// codes sign-extended (asymmetric: zero-extended), int4 nibbles (element 2i
// in byte i's low nibble) less off; unpack8's values (kernels_avx2.h).
template <int Bits, bool Asym>
KVC_AVX512 inline __m512i unpack16(const uint8_t *in, uint64_t j, __m512i off) {
  if constexpr (Bits == 8) {
    const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i *>(in + j));
    return Asym ? _mm512_cvtepu8_epi32(b) : _mm512_cvtepi8_epi32(b);
  } else {
    const __m128i b = _mm_loadl_epi64(reinterpret_cast<const __m128i *>(in + j / 2));
    const __m128i m = _mm_set1_epi8(0x0f);
    const __m128i e =
        _mm_unpacklo_epi8(_mm_and_si128(b, m), _mm_and_si128(_mm_srli_epi16(b, 4), m));
    return _mm512_sub_epi32(_mm512_cvtepu8_epi32(e), off);
  }
}

// decode_unrotate_row_avx512 for one code width, zero-point mode and output
// type: each block's values decoded straight into the registers the
// transform runs in (q x scale, plus the zero point: decode_groups_row's
// operations), no f32 row between them.
// Group k's stored scale or zero point (little-endian f32, or f16 when
// half: exact in f32) broadcast.
KVC_AVX512 inline __m512 scale16(const uint8_t *p, uint64_t k, bool half) {
  if (half) {
    uint16_t h;
    std::memcpy(&h, p + 2 * k, 2);
    return _mm512_set1_ps(_cvtsh_ss(h));
  }
  float f;
  std::memcpy(&f, p + 4 * k, 4);
  return _mm512_set1_ps(f);
}

template <int Bits, bool Asym, typename Out, int NV>
KVC_AVX512 void decode_unrotate(const uint8_t *in, const uint8_t *sc, const uint8_t *zr,
                                bool f16_scales, uint64_t g, uint64_t d, int32_t off, __m512 norm,
                                Out *out) {
  const __m512i voff = _mm512_set1_epi32(off);
  for (uint64_t b = 0; b < d; b += 16 * NV) {
    __m512 r[NV];
#pragma GCC unroll 8
    for (int i = 0; i < NV; ++i) {
      const uint64_t j = b + 16 * i, k = j / g;
      __m512 x = _mm512_mul_ps(_mm512_cvtepi32_ps(unpack16<Bits, Asym>(in, j, voff)),
                               scale16(sc, k, f16_scales));
      if constexpr (Asym) x = _mm512_add_ps(x, scale16(zr, k, f16_scales));
      r[i] = butterfly16(x);
    }
    finish_block<Out, NV>(r, norm, out + b);
  }
}

template <int Bits, bool Asym, typename Out>
KVC_AVX512 void decode_unrotate_any(const uint8_t *in, const uint8_t *sc, const uint8_t *zr,
                                    bool f16_scales, uint64_t g, uint64_t d, uint32_t block,
                                    int32_t off, float norm, Out *out) {
  if (block == 128)
    decode_unrotate<Bits, Asym, Out, 8>(in, sc, zr, f16_scales, g, d, off, _mm512_set1_ps(norm),
                                        out);
  else
    decode_unrotate<Bits, Asym, Out, 4>(in, sc, zr, f16_scales, g, d, off, _mm512_set1_ps(norm),
                                        out);
}

template <typename Out>
void decode_unrotate_out(int bits, bool asym, const uint8_t *in, const uint8_t *sc,
                         const uint8_t *zr, bool f16_scales, uint64_t g, uint64_t d, uint32_t block,
                         int32_t off, float norm, Out *out) {
  if (bits == 8 && asym)
    decode_unrotate_any<8, true>(in, sc, zr, f16_scales, g, d, block, off, norm, out);
  else if (bits == 8)
    decode_unrotate_any<8, false>(in, sc, zr, f16_scales, g, d, block, off, norm, out);
  else if (asym)
    decode_unrotate_any<4, true>(in, sc, zr, f16_scales, g, d, block, off, norm, out);
  else
    decode_unrotate_any<4, false>(in, sc, zr, f16_scales, g, d, block, off, norm, out);
}

// True when no 16-bit float of h [n] has its exponent field (mask: 0x7c00
// f16, 0x7f80 bf16) all ones: the largest magnitude's bits (h & 0x7fff, which
// order as the magnitudes do) are below mask. 128 values a step into four
// independent maxima (no loop-carried chain of one vector).
KVC_AVX512 bool all_finite_16(const uint16_t *h, uint64_t n, uint16_t mask) {
  const __m512i abs = _mm512_set1_epi16(0x7fff);
  __m512i m0 = _mm512_setzero_si512(), m1 = m0, m2 = m0, m3 = m0;
  uint64_t i = 0;
  for (; i + 128 <= n; i += 128) {
    m0 = _mm512_max_epu16(m0, _mm512_and_si512(_mm512_loadu_si512(h + i), abs));
    m1 = _mm512_max_epu16(m1, _mm512_and_si512(_mm512_loadu_si512(h + i + 32), abs));
    m2 = _mm512_max_epu16(m2, _mm512_and_si512(_mm512_loadu_si512(h + i + 64), abs));
    m3 = _mm512_max_epu16(m3, _mm512_and_si512(_mm512_loadu_si512(h + i + 96), abs));
  }
  for (; i + 32 <= n; i += 32)
    m0 = _mm512_max_epu16(m0, _mm512_and_si512(_mm512_loadu_si512(h + i), abs));
  if (i < n) {  // the last 1 .. 31 values, masked
    const __mmask32 tail = static_cast<__mmask32>((uint64_t{1} << (n - i)) - 1);
    m1 = _mm512_max_epu16(m1, _mm512_and_si512(_mm512_maskz_loadu_epi16(tail, h + i), abs));
  }
  const __m512i m = _mm512_max_epu16(_mm512_max_epu16(m0, m1), _mm512_max_epu16(m2, m3));
  return _mm512_cmpge_epu16_mask(m, _mm512_set1_epi16(static_cast<short>(mask))) == 0;
}

}  // namespace

bool all_finite_16_avx512(const uint16_t *h, uint64_t n, uint16_t mask) {
  return all_finite_16(h, n, mask);
}

bool f16_group_keys_avx512(bool is_signed, const uint16_t *h, uint64_t groups, uint64_t g,
                           uint16_t *lo_keys, uint16_t *hi_keys) {
  return is_signed ? group_keys<true>(h, groups, g, lo_keys, hi_keys)
                   : group_keys<false>(h, groups, g, lo_keys, hi_keys);
}

void encode_groups_f16_avx512(int bits, int mode, bool stream, const uint16_t *x, uint64_t m,
                              uint64_t g, const float *iv, const float *zp, const IntFormat &f,
                              uint8_t *out) {
  encode_any<uint16_t>(bits, mode, stream, x, m, g, iv, zp, 1, f, out);
}

void encode_groups_f32_avx512(int bits, int mode, const float *x, uint64_t m, uint64_t g,
                              const Params *ps, uint64_t ps_step, const IntFormat &f,
                              uint8_t *out) {
  constexpr uint64_t kFloats = sizeof(Params) / sizeof(float);
  encode_any<float>(bits, mode, false, x, m, g, &ps->inv, &ps->zero, ps_step * kFloats, f, out);
}

void encode_fp8_groups_avx512(bool e4m3, bool half, const void *x, uint64_t m, uint64_t g,
                              const float *iv, uint8_t *out, uint64_t ahead) {
  if (half)
    encode_fp8_any(e4m3, static_cast<const uint16_t *>(x), m, g, iv, out, ahead);
  else
    encode_fp8_any(e4m3, static_cast<const float *>(x), m, g, iv, out, ahead);
}

void rotate_row_avx512(const void *row, bool half, float *x, uint64_t d, uint32_t block,
                       float norm) {
  if (half)
    rotate_any(static_cast<const uint16_t *>(row), x, d, block, norm);
  else
    rotate_any(static_cast<const float *>(row), x, d, block, norm);
}

bool rotate_row_minmax_avx512(const void *row, bool half, float *x, uint64_t d, uint32_t block,
                              float norm, uint64_t g, float *lohi) {
  if (half)
    return block == 128 ? rotate_minmax_blocks<uint16_t, 8>(static_cast<const uint16_t *>(row), x,
                                                            d, norm, g, lohi)
                        : rotate_minmax_blocks<uint16_t, 4>(static_cast<const uint16_t *>(row), x,
                                                            d, norm, g, lohi);
  return block == 128
             ? rotate_minmax_blocks<float, 8>(static_cast<const float *>(row), x, d, norm, g, lohi)
             : rotate_minmax_blocks<float, 4>(static_cast<const float *>(row), x, d, norm, g, lohi);
}

void unrotate_row_avx512(const float *x, bool half, void *out, uint64_t d, uint32_t block,
                         float norm) {
  if (half)
    rotate_any(x, static_cast<uint16_t *>(out), d, block, norm);
  else
    rotate_any(x, static_cast<float *>(out), d, block, norm);
}

void decode_unrotate_row_avx512(int bits, bool asym, int32_t off, const uint8_t *in,
                                const uint8_t *sc, const uint8_t *zr, bool f16_scales, uint64_t g,
                                uint64_t d, uint32_t block, float norm, bool half, void *out) {
  if (half)
    decode_unrotate_out(bits, asym, in, sc, zr, f16_scales, g, d, block, off, norm,
                        static_cast<uint16_t *>(out));
  else
    decode_unrotate_out(bits, asym, in, sc, zr, f16_scales, g, d, block, off, norm,
                        static_cast<float *>(out));
}

}  // namespace kvc::codec
#endif
