// AVX2 run kernels of the fp8 codes (x86-64 only), bit for bit common/fp8.h's
// encoder and tables (the scalar reference, used by encode.cpp's run dispatch).
#pragma once
#include "codec/kernels_avx2.h"

#ifdef KVC_CODEC_X86
namespace kvc::codec {
namespace {

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

// 32 scaled floats -> 32 fp8 codes in order, bit for bit fp8_encode8 (and so
// fp8_encode), in fewer operations: the magnitude is clamped to the largest
// finite value (a NaN too, as the scalar encoder saturates it); its binade
// is raised to the smallest normal's (fp8 subnormals share that step); then
// a + m, with m = 1.5 x 2^(23 - kMant) x the binade, lies in m's binade,
// whose ulp is the fp8 step there, and the addition rounds half to even, so
// the bits of a + m less those of m count the rounded steps. The code is
// the binade's fp8 exponent field plus those steps (a carry into the next
// binade is that binade's code). Every intermediate is a normal float or an
// integer: flush-to-zero and denormals-are-zero modes change nothing an
// f32 input could not (an f32 subnormal encodes to 0 either way). The signs
// come from the scaled values' own sign bits, packed with signed saturation
// (-0 and values that round to 0 keep their sign, as the scalar encoder
// does).
template <int kMant, int kBias, uint32_t kMaxCode>
__attribute__((target("avx2"), always_inline)) inline __m256i fp8_encode32(const __m256 v[4]) {
  constexpr int kDrop = 23 - kMant, kEmin = 1 - kBias;
  constexpr uint32_t kMaxBits =
      ((kMaxCode >> kMant) + 127 - kBias) << 23 | (kMaxCode & ((1u << kMant) - 1)) << kDrop;
  const __m256 vmax = _mm256_castsi256_ps(_mm256_set1_epi32(static_cast<int>(kMaxBits)));
  const __m256 sign = _mm256_castsi256_ps(_mm256_set1_epi32(INT32_MIN));
  const __m256i expo = _mm256_set1_epi32(0x7f800000), emin = _mm256_set1_epi32((127 + kEmin) << 23);
  const __m256i magic = _mm256_set1_epi32(kDrop << 23 | 1 << 22);
  // The fp8 exponent field of a binade, in place: (binade >> kDrop) - rebias.
  const __m256i rebias = _mm256_set1_epi32((128 - kBias) << kMant);
  __m256i c[4];
#pragma GCC unroll 4
  for (int k = 0; k < 4; ++k) {
    const __m256 a = _mm256_min_ps(_mm256_andnot_ps(sign, v[k]), vmax);
    const __m256i binade = _mm256_max_epi32(_mm256_and_si256(_mm256_castps_si256(a), expo), emin);
    const __m256i m = _mm256_add_epi32(binade, magic);
    const __m256i steps =
        _mm256_sub_epi32(_mm256_castps_si256(_mm256_add_ps(a, _mm256_castsi256_ps(m))), m);
    c[k] = _mm256_add_epi32(_mm256_sub_epi32(_mm256_srli_epi32(binade, kDrop), rebias), steps);
  }
  const __m256i codes =
      _mm256_packus_epi16(_mm256_packus_epi32(c[0], c[1]), _mm256_packus_epi32(c[2], c[3]));
  const __m256i signs =
      _mm256_packs_epi16(_mm256_packs_epi32(_mm256_castps_si256(v[0]), _mm256_castps_si256(v[1])),
                         _mm256_packs_epi32(_mm256_castps_si256(v[2]), _mm256_castps_si256(v[3])));
  const __m256i b =
      _mm256_or_si256(codes, _mm256_and_si256(signs, _mm256_set1_epi8(static_cast<char>(0x80))));
  return _mm256_permutevar8x32_epi32(b, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
}

template <int kMant, int kBias, uint32_t kMaxCode, bool Half = false>
__attribute__((target("avx2,f16c"))) void encode_fp8_run_avx2(const void *x, uint64_t j0,
                                                              uint64_t j1, float inv,
                                                              uint8_t *out) {
  const __m256 vinv = _mm256_set1_ps(inv);
  uint64_t j = j0;
  for (; j + 32 <= j1; j += 32) {
    __m256 v[4];
#pragma GCC unroll 4
    for (int k = 0; k < 4; ++k) v[k] = _mm256_mul_ps(load8<Half>(x, j + 8 * k), vinv);
    _mm256_storeu_si256(reinterpret_cast<__m256i *>(out + j),
                        fp8_encode32<kMant, kBias, kMaxCode>(v));
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
__attribute__((target("avx2"), always_inline)) inline __m256 fp8_decode8(const float *table,
                                                                         __m128i b8) {
  const __m256i c = _mm256_cvtepu8_epi32(b8);
  const __m256i mag = _mm256_and_si256(c, _mm256_set1_epi32(0x7f));
  constexpr int kExpMask = ((1 << (7 - kMant)) - 1) << kMant;
  const __m256i special =
      kMant == 3 ? _mm256_cmpeq_epi32(mag, _mm256_set1_epi32(0x7f))
                 : _mm256_cmpeq_epi32(_mm256_and_si256(mag, _mm256_set1_epi32(kExpMask)),
                                      _mm256_set1_epi32(kExpMask));
  if (!_mm256_testz_si256(special, special)) return _mm256_i32gather_ps(table, c, 4);
  const __m256i normal =
      _mm256_add_epi32(_mm256_slli_epi32(mag, 23 - kMant), _mm256_set1_epi32((127 - kBias) << 23));
  const __m256 step = _mm256_castsi256_ps(_mm256_set1_epi32((127 + 1 - kBias - kMant) << 23));
  const __m256 sub =
      _mm256_mul_ps(_mm256_cvtepi32_ps(mag), step);  // exponent 0: mag is the mantissa
  const __m256i is_sub = _mm256_cmpeq_epi32(_mm256_and_si256(mag, _mm256_set1_epi32(kExpMask)),
                                            _mm256_setzero_si256());
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
    _mm256_storeu_ps(
        x + j, _mm256_mul_ps(fp8_decode8<kMant, kBias>(
                                 table, _mm_loadl_epi64(reinterpret_cast<const __m128i *>(in + j))),
                             s));
  for (; j < j1; ++j) x[j] = table[in[j]] * scale;
}

}  // namespace
}  // namespace kvc::codec
#endif
