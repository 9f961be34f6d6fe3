// AVX2 kernels without templates: integer decode runs, min / max of a run,
// finiteness checks of f32 and 16-bit float input (declared in kernels.h).
#include "codec/kernels_avx2.h"

#ifdef KVC_CODEC_X86
namespace kvc::codec {

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

}  // namespace kvc::codec
#endif
