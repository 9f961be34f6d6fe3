// make_params_batch (params_avx2.h): the parameters of many groups at once
// for the AVX2 quantize paths.
#include "codec/params_avx2.h"

#ifdef KVC_CODEC_X86
namespace kvc::codec {

namespace {
// make_params of 8 groups one at a time (lohi: their lo, hi pairs): where a
// magnitude reaches 1e37, whose caps the vector rules do not apply.
inline void scalar8(const Spec &s, const float *lohi, Params *ps) {
  for (int j = 0; j < 8; ++j) ps[j] = make_params(s, lohi[2 * j], lohi[2 * j + 1]);
}
// 8 groups' scales and 1 / scales, no zero point (symmetric and full-range codes).
__attribute__((target("avx2"), always_inline)) inline void store8(__m256 sc, __m256 inv,
                                                                  Params *ps) {
  alignas(32) float vs[8], vi[8];
  _mm256_store_ps(vs, sc);
  _mm256_store_ps(vi, inv);
  for (int j = 0; j < 8; ++j) ps[j] = Params{vs[j], vi[j], 0.0f};
}
}  // namespace

__attribute__((target("avx2,fma,f16c"))) void make_params_batch(const Spec &s, const float *lohi,
                                                                uint64_t k, Params *ps) {
  // f16 scales: the f32 scale rounded up to an f16 (symmetric codes; an
  // asymmetric zero point's rounding down is make_params's)
  const bool half = s.scale_dtype == DType::F16;
  const bool vec = s.static_scale == 0.0 && !s.full_range &&
                   (s.scale_dtype == DType::F32 || (half && !(is_int(s.dtype) && s.asym))) &&
                   (is_int(s.dtype) || is_fp8(s.dtype));
  uint64_t i = 0;
  if (s.static_scale == 0.0 && is_int(s.dtype) && s.full_range && !s.asym &&
      (s.scale_dtype == DType::F32 || half)) {
    // Full range (make_params's rule), eight groups at a time in float
    // lanes: the value of largest magnitude (the positive one on a tie)
    // sets the magnitude m = a / (qmax + 1) rounded up to a float (ceil_div)
    // and to the scale dtype; the scale is -m where that value is positive.
    // Eight holding a magnitude of 1e37 or more (the 1e38 cap applies in
    // double) go through make_params.
    const __m256 q1 = _mm256_set1_ps(static_cast<float>(qmax_sym(s.dtype) + 1));
    const __m256 sign = _mm256_set1_ps(-0.0f);
    for (; i + 8 <= k; i += 8) {
      const __m256 p0 = _mm256_loadu_ps(lohi + 2 * i), p1 = _mm256_loadu_ps(lohi + 2 * i + 8);
      // lo0 lo1 lo2 lo3 | lo4 ..., hi0 hi1 ... (de-interleaved, in order)
      const __m256i order = _mm256_setr_epi32(0, 1, 4, 5, 2, 3, 6, 7);
      const __m256 lo = _mm256_permutevar8x32_ps(_mm256_shuffle_ps(p0, p1, 0x88), order);
      const __m256 hi = _mm256_permutevar8x32_ps(_mm256_shuffle_ps(p0, p1, 0xdd), order);
      const __m256 nlo = _mm256_xor_ps(lo, sign);
      const __m256 positive = _mm256_cmp_ps(hi, nlo, _CMP_GE_OQ);
      const __m256 a = _mm256_blendv_ps(nlo, hi, positive);
      const __m256 big = _mm256_cmp_ps(a, _mm256_set1_ps(1e37f), _CMP_GE_OQ);
      if (!_mm256_testz_ps(big, big)) {
        scalar8(s, lohi + 2 * i, ps + i);
        continue;
      }
      const __m256 valid = _mm256_cmp_ps(a, _mm256_setzero_ps(), _CMP_GT_OQ);
      __m256 m = ceil_div(a, q1);
      if (half) m = ceil_f16(m);
      const __m256 neg = _mm256_and_ps(positive, sign);
      const __m256 sc = _mm256_and_ps(_mm256_xor_ps(m, neg), valid);
      const __m256 inv =
          _mm256_and_ps(_mm256_xor_ps(_mm256_div_ps(_mm256_set1_ps(1.0f), m), neg), valid);
      store8(sc, inv, ps + i);
    }
  }
  if (vec) {
    const bool asym = is_int(s.dtype) && s.asym;
    const double q = asym              ? qmax_asym(s.dtype)
                     : is_fp8(s.dtype) ? static_cast<double>(fp8_max(s.dtype))
                                       : qmax_sym(s.dtype);
    const __m256d vq = _mm256_set1_pd(q);
    const __m256d cap =
        _mm256_set1_pd(is_int(s.dtype) ? 1e38 : std::numeric_limits<double>::infinity());
    const __m128 fmin = _mm_set1_ps(std::numeric_limits<float>::min());
    const __m256d sign = _mm256_set1_pd(-0.0);
    if (!asym) {
      // Symmetric: eight groups at a time in float lanes (ceil_div); eight
      // holding a magnitude of 1e37 or more (the integer codes' 1e38 cap
      // applies in double) go through make_params.
      const __m256 vqf = _mm256_set1_ps(static_cast<float>(q));
      const __m256 absm = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
      for (; i + 8 <= k; i += 8) {
        const __m256 p0 = _mm256_and_ps(_mm256_loadu_ps(lohi + 2 * i), absm);
        const __m256 p1 = _mm256_and_ps(_mm256_loadu_ps(lohi + 2 * i + 8), absm);
        const __m256 m0 = _mm256_max_ps(p0, _mm256_permute_ps(p0, 0xb1));
        const __m256 m1 = _mm256_max_ps(p1, _mm256_permute_ps(p1, 0xb1));
        const __m256 a = _mm256_castpd_ps(
            _mm256_permute4x64_pd(_mm256_castps_pd(_mm256_shuffle_ps(m0, m1, 0x88)), 0xd8));
        const __m256 big = _mm256_cmp_ps(a, _mm256_set1_ps(1e37f), _CMP_GE_OQ);
        if (!_mm256_testz_ps(big, big)) {
          scalar8(s, lohi + 2 * i, ps + i);
          continue;
        }
        const __m256 valid = _mm256_cmp_ps(a, _mm256_setzero_ps(), _CMP_GT_OQ);
        __m256 sc = _mm256_and_ps(ceil_div(a, vqf), valid);
        if (half) sc = _mm256_and_ps(ceil_f16(sc), valid);
        const __m256 inv = _mm256_and_ps(_mm256_div_ps(_mm256_set1_ps(1.0f), sc), valid);
        store8(sc, inv, ps + i);
      }
    }
    for (; i + 4 <= k; i += 4) {
      // lohi holds lo, hi pairs: de-interleave four of them.
      const __m256 pair = _mm256_loadu_ps(lohi + 2 * i);  // lo0 hi0 lo1 hi1 | lo2 hi2 lo3 hi3
      const __m256 perm = _mm256_permutevar8x32_ps(pair, _mm256_setr_epi32(0, 2, 4, 6, 1, 3, 5, 7));
      __m128 lo = _mm256_castps256_ps128(perm), hi = _mm256_extractf128_ps(perm, 1);
      lo = _mm_add_ps(lo, _mm_setzero_ps());  // -0 -> +0
      hi = _mm_add_ps(hi, _mm_setzero_ps());
      __m256d raw;
      __m128 zero = _mm_setzero_ps();
      if (asym) {
        lo = _mm_max_ps(lo, _mm_set1_ps(-1e38f));
        hi = _mm_min_ps(hi, _mm_set1_ps(1e38f));
        zero = lo;  // round_zero_down() keeps an f32 zero point as it is
        raw = _mm256_div_pd(_mm256_sub_pd(_mm256_cvtps_pd(hi), _mm256_cvtps_pd(lo)), vq);
      } else {
        const __m256d a = _mm256_max_pd(_mm256_andnot_pd(sign, _mm256_cvtps_pd(lo)),
                                        _mm256_andnot_pd(sign, _mm256_cvtps_pd(hi)));
        raw = _mm256_div_pd(_mm256_min_pd(cap, a), vq);
      }
      const __m128 f = _mm_max_ps(_mm256_cvtpd_ps(raw), fmin);
      // The next float up where f fell short of raw (f > 0 and finite).
      const __m128i bump = _mm_and_si128(narrow(_mm256_cmp_pd(_mm256_cvtps_pd(f), raw, _CMP_LT_OQ)),
                                         _mm_set1_epi32(1));
      __m128 sc = _mm_castsi128_ps(_mm_add_epi32(_mm_castps_si128(f), bump));
      // raw <= 0: scale 0
      sc = _mm_and_ps(
          sc, _mm_castsi128_ps(narrow(_mm256_cmp_pd(raw, _mm256_setzero_pd(), _CMP_GT_OQ))));
      if (half) sc = ceil_f16(sc);
      const __m128 inv =
          _mm_and_ps(_mm_div_ps(_mm_set1_ps(1.0f), sc), _mm_cmpgt_ps(sc, _mm_setzero_ps()));
      alignas(16) float vs[4], vi[4], vz[4];
      _mm_store_ps(vs, sc);
      _mm_store_ps(vi, inv);
      _mm_store_ps(vz, zero);
      for (int j = 0; j < 4; ++j) ps[i + j] = Params{vs[j], vi[j], asym ? vz[j] : 0.0f};
    }
  }
  for (; i < k; ++i) ps[i] = make_params(s, lohi[2 * i], lohi[2 * i + 1]);
}

}  // namespace kvc::codec
#endif  // KVC_CODEC_X86
