// The parameter rules of the AVX2 quantize paths (x86-64): make_params()
// of many groups at once, from their extremes, in vector lanes. The same IEEE
// operations as the scalar make_params (exact conversions, max / min, one
// correctly rounded division, the round-ups), so the same bits. Internal to
// the codec module (quantize_avx2.cpp, params_avx2.cpp).
#pragma once

#include "codec/kernels.h"

#ifdef KVC_CODEC_X86
#include <immintrin.h>

#include <cstdint>
#include <limits>

namespace kvc::codec {
namespace {

// Four 64-bit lane masks as four 32-bit ones.
__attribute__((target("avx2"), always_inline)) inline __m128i narrow(__m256d m) {
  return _mm256_castsi256_si128(_mm256_permutevar8x32_epi32(
      _mm256_castpd_si256(m), _mm256_setr_epi32(0, 2, 4, 6, 0, 0, 0, 0)));
}
// The smallest float >= a / q (at least FLT_MIN), for finite a > 0 and an
// integer float q >= 1 (every symmetric code range): the rounded quotient,
// raised by one ulp where q times it falls short of a. The fused
// multiply-add's residual is exact (f x q and a are both multiples of the
// smallest subnormal, f x q - a is representable), so its sign is. The same
// float as make_params's rounding of the double quotient up to a float: both
// are the exact quotient's ceiling (a double quotient that lands on a float
// is that float exactly). Checked against make_params's rule on 445 million
// magnitudes across every binade, for q = 1 .. 57344.
template <typename V>
__attribute__((target("avx2,fma"), always_inline)) inline V ceil_div(V a, V q);
template <>
__attribute__((target("avx2,fma"), always_inline)) inline __m256 ceil_div(__m256 a, __m256 q) {
  const __m256 f =
      _mm256_max_ps(_mm256_div_ps(a, q), _mm256_set1_ps(std::numeric_limits<float>::min()));
  const __m256 short_ = _mm256_cmp_ps(_mm256_fmsub_ps(f, q, a), _mm256_setzero_ps(), _CMP_LT_OQ);
  return _mm256_castsi256_ps(_mm256_sub_epi32(_mm256_castps_si256(f), _mm256_castps_si256(short_)));
}
template <>
__attribute__((target("avx2,fma"), always_inline)) inline __m128 ceil_div(__m128 a, __m128 q) {
  const __m128 f = _mm_max_ps(_mm_div_ps(a, q), _mm_set1_ps(std::numeric_limits<float>::min()));
  const __m128 short_ = _mm_cmplt_ps(_mm_fmsub_ps(f, q, a), _mm_setzero_ps());
  return _mm_castsi128_ps(_mm_sub_epi32(_mm_castps_si128(f), _mm_castps_si128(short_)));
}

// round_scale_up to f16 of positive floats (0 stays 0): the smallest f16 at
// or above each (the conversion rounding towards +Inf), at most 65504.
__attribute__((target("avx2,f16c"), always_inline)) inline __m256 ceil_f16(__m256 v) {
  return _mm256_min_ps(
      _mm256_cvtph_ps(_mm256_cvtps_ph(v, _MM_FROUND_TO_POS_INF | _MM_FROUND_NO_EXC)),
      _mm256_set1_ps(65504.0f));
}
__attribute__((target("avx2,f16c"), always_inline)) inline __m128 ceil_f16(__m128 v) {
  return _mm_min_ps(_mm_cvtph_ps(_mm_cvtps_ph(v, _MM_FROUND_TO_POS_INF | _MM_FROUND_NO_EXC)),
                    _mm_set1_ps(65504.0f));
}

// The parameters of 4 groups from their extremes: make_params's operations
// for dynamic scales (in double where it uses double), 4 lanes at a time.
// Mode 0: symmetric (integer or fp8), 1: asymmetric, 2: full range. For f16
// input only: the extremes are f16 values, so round_zero_down leaves them as
// they are and the 1e38 caps never bind.
template <int Mode>
__attribute__((target("avx2,fma,f16c"), always_inline)) inline void params4(
    __m128 lo, __m128 hi, double q, bool f16_scale, float *scale, float *inv, float *zero) {
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
    // Symmetric: the ceiling of a / q in float lanes (ceil_div); f16
    // extremes never reach the integer codes' cap.
    const __m128 abs = _mm_castsi128_ps(_mm_set1_epi32(0x7fffffff));
    const __m128 a = _mm_max_ps(_mm_and_ps(lo, abs), _mm_and_ps(hi, abs));
    const __m128 valid = _mm_cmpgt_ps(a, _mm_setzero_ps());
    __m128 up = ceil_div(a, _mm_set1_ps(static_cast<float>(q)));
    if (f16_scale)
      up = _mm_cvtph_ps(_mm_cvtps_ph(_mm_min_ps(up, _mm_set1_ps(65504.0f)), _MM_FROUND_TO_POS_INF));
    const __m128 m = _mm_and_ps(up, valid);
    _mm_storeu_ps(scale, m);
    _mm_storeu_ps(inv, _mm_and_ps(_mm_div_ps(_mm_set1_ps(1.0f), m), valid));
    return;
  }
  const __m128 f = _mm_max_ps(_mm256_cvtpd_ps(raw), _mm_set1_ps(std::numeric_limits<float>::min()));
  // 64-bit compare masks -> 32-bit lanes (the even halves).
  const __m256i even = _mm256_setr_epi32(0, 2, 4, 6, 0, 2, 4, 6);
  const __m128i below = _mm256_castsi256_si128(_mm256_permutevar8x32_epi32(
      _mm256_castpd_si256(_mm256_cmp_pd(_mm256_cvtps_pd(f), raw, _CMP_LT_OQ)), even));
  const __m128i valid = _mm256_castsi256_si128(_mm256_permutevar8x32_epi32(
      _mm256_castpd_si256(_mm256_cmp_pd(raw, _mm256_setzero_pd(), _CMP_GT_OQ)), even));
  __m128 up = _mm_castsi128_ps(_mm_sub_epi32(_mm_castps_si128(f), below));  // + 1 ulp where f < raw
  if (f16_scale)
    up = _mm_cvtph_ps(_mm_cvtps_ph(_mm_min_ps(up, _mm_set1_ps(65504.0f)), _MM_FROUND_TO_POS_INF));
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

// params4<0>'s operations for 8 groups of symmetric codes from their largest
// |x| (f16 values, >= +0): the same scales and 1 / scales.
__attribute__((target("avx2,fma,f16c"), always_inline)) inline void params8_sym(__m256 a, float q,
                                                                                bool f16_scale,
                                                                                float *scale,
                                                                                float *inv) {
  const __m256 valid = _mm256_cmp_ps(a, _mm256_setzero_ps(), _CMP_GT_OS);
  __m256 up = ceil_div(a, _mm256_set1_ps(q));
  if (f16_scale)
    up = _mm256_cvtph_ps(
        _mm256_cvtps_ph(_mm256_min_ps(up, _mm256_set1_ps(65504.0f)), _MM_FROUND_TO_POS_INF));
  const __m256 m = _mm256_and_ps(up, valid);
  _mm256_storeu_ps(scale, m);
  _mm256_storeu_ps(inv, _mm256_and_ps(_mm256_div_ps(_mm256_set1_ps(1.0f), m), valid));
}

}  // namespace

// make_params() of k groups from their (lo, hi) pairs, four at a time in
// double lanes (symmetric ones eight at a time in float lanes) for dynamic
// scales stored as f32 (symmetric or asymmetric integers, fp8) or as f16
// (symmetric: the scale rounded up to an f16 by the conversion's
// round-towards-+Inf mode, saturated at 65504): the same IEEE operations
// (exact conversions, max / min, one correctly rounded division, the
// round-ups) as the scalar function, so the same bits; the other cases call
// it.
__attribute__((target("avx2,fma,f16c"))) void make_params_batch(const Spec &s, const float *lohi,
                                                                uint64_t k, Params *ps);

}  // namespace kvc::codec
#endif  // KVC_CODEC_X86
