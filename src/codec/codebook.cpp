// Codebooks (non-uniform levels): a group's codes index a table of 2^b
// levels in [-1, 1], in units of the group's signed extreme (the value of
// largest magnitude, its sign kept), instead of the evenly spaced integers of
// the uniform codes. Levels fitted to the distribution of the normalized
// values cut the error of a uniform grid at 2-4 bits: KVQuant (arXiv
// 2401.18079) fits non-uniform levels per layer offline; TurboQuant (arXiv
// 2504.19874) uses Lloyd-Max levels of the near-Gaussian values a random
// rotation makes. The built-in tables (codebook_gaussian.inc, written by
// bench/calib/lloyd_max.py) are the Lloyd-Max levels of Gaussian groups
// normalized by their signed extreme. Byte layout and contract:
// docs/codecs.md ("Codebooks").
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "codec/codec.h"
#include "codec/kernels.h"
#include "codec/kernels_avx2.h"
#include "codec/scalar.h"

namespace kvc::codec {

namespace {

struct GaussianTable {
  uint32_t group, bits;
  float levels[16];
};
constexpr GaussianTable kGaussian[] = {
#include "codec/codebook_gaussian.inc"
};

// The signed extreme of a group (ties: the first).
float signed_extreme(const float *x, uint64_t n) {
  float e = 0.0f, a = 0.0f;
  for (uint64_t j = 0; j < n; ++j)
    if (std::fabs(x[j]) > a) {
      a = std::fabs(x[j]);
      e = x[j];
    }
  return e;
}

// Midpoints between neighbouring levels: a value y gets the number of
// midpoints below it (strictly), the nearest level (ties: the lower).
// Levels one ulp apart have no f32 between them: a midpoint rounded up onto
// the upper level would send that level itself to the lower one; the lower
// level as the midpoint sends each to its own.
void midpoints(const float *levels, uint32_t nl, float *mid) {
  for (uint32_t i = 0; i + 1 < nl; ++i) {
    mid[i] = (levels[i] + levels[i + 1]) * 0.5f;
    if (mid[i] >= levels[i + 1]) mid[i] = levels[i];
  }
}

inline uint32_t nearest(float y, const float *mid, uint32_t nm) {
  uint32_t c = 0;
  for (uint32_t i = 0; i < nm; ++i) c += y > mid[i] ? 1u : 0u;
  return c;
}

// Codes of x[0, n) (one byte each).
void nearest_scalar(const float *x, uint64_t n, float inv, const float *mid, uint32_t nm,
                    uint8_t *c) {
  for (uint64_t j = 0; j < n; ++j) c[j] = static_cast<uint8_t>(nearest(x[j] * inv, mid, nm));
}

void decode_group_scalar(int bits, const uint8_t *in, uint64_t j0, uint64_t j1, float sc,
                         const float *levels, float *x) {
  for (uint64_t j = j0; j < j1; ++j) x[j] = levels[get_code(in, bits, j)] * sc;
}

#ifdef KVC_CODEC_X86
// The codes of 8 values at a time (the same multiply and comparisons as the
// scalar rule).
__attribute__((target("avx2"))) void nearest_avx2(const float *x, uint64_t n, float inv,
                                                  const float *mid, uint32_t nm, uint8_t *cd) {
  const __m256 vi = _mm256_set1_ps(inv);
  uint64_t j = 0;
  for (; j + 8 <= n; j += 8) {
    const __m256 y = _mm256_mul_ps(_mm256_loadu_ps(x + j), vi);
    __m256i c = _mm256_setzero_si256();
    for (uint32_t i = 0; i < nm; ++i)  // a true comparison is all ones: -1
      c = _mm256_sub_epi32(
          c, _mm256_castps_si256(_mm256_cmp_ps(y, _mm256_set1_ps(mid[i]), _CMP_GT_OQ)));
    alignas(32) uint32_t cs[8];
    _mm256_store_si256(reinterpret_cast<__m256i *>(cs), c);
    for (int u = 0; u < 8; ++u) cd[j + u] = static_cast<uint8_t>(cs[u]);
  }
  nearest_scalar(x + j, n - j, inv, mid, nm, cd + j);
}

// x = levels[code] x scale for the n rows of d values of a call, 8 at a
// time: a table lookup by permutation (two and a blend for 16 levels), then
// the scalar path's one multiply. The level vectors are built once per call
// (groups of 8 values are common: head_dim 8); a group that does not start
// on whole code bytes, and each group's tail, take the scalar path.
template <int Bits>
__attribute__((target("avx2"))) void decode_rows_avx2(const Spec &s, const float *levels,
                                                      const uint8_t *codes, const uint8_t *scales,
                                                      uint64_t n, uint64_t d, uint64_t g,
                                                      float *out) {
  alignas(32) float lv[16] = {};
  std::memcpy(lv, levels, sizeof(float) << Bits);
  const __m256 lo = _mm256_load_ps(lv), hi = _mm256_load_ps(lv + 8);
  const __m256i zero = _mm256_setzero_si256();
  const uint64_t rb = row_bytes(s.dtype, d), sb = scale_bytes(s);
  for (uint64_t r = 0; r < n; ++r) {
    const uint8_t *in = codes + r * rb;
    float *x = out + r * d;
    for (uint64_t j0 = 0, k = r * (d / g); j0 < d; j0 += g, ++k) {
      const float sc = inl::load_scale(scales + k * sb, s.scale_dtype);
      const uint64_t j1 = j0 + g;
      uint64_t j = j0;
      if (j % code_unit(Bits) == 0) {
        const __m256 vs = _mm256_set1_ps(sc);
        for (; j + 8 <= j1; j += 8) {
          const __m256i idx = unpack8<Bits, true>(in, j, zero);
          __m256 v = _mm256_permutevar8x32_ps(lo, idx);
          if constexpr (Bits == 4)
            v = _mm256_blendv_ps(v, _mm256_permutevar8x32_ps(hi, idx),
                                 _mm256_castsi256_ps(_mm256_slli_epi32(idx, 28)));
          _mm256_storeu_ps(x + j, _mm256_mul_ps(v, vs));
        }
      }
      decode_group_scalar(Bits, in, j, j1, sc, levels, x);
    }
  }
}
#endif

uint64_t group_of(const Spec &s, uint64_t d) {
  return s.gran == Gran::Group ? s.group : d;
}

}  // namespace

const float *gaussian_levels(uint32_t bits, uint64_t group) {
  if (bits < 2 || bits > 4 || group == 0) return nullptr;
  // The table of the nearest power of two in [8, 1024] (by its logarithm).
  uint32_t g = 8;
  while (g < 1024 && static_cast<double>(group) > g * std::sqrt(2.0)) g *= 2;
  for (const GaussianTable &t : kGaussian)
    if (t.group == g && t.bits == bits) return t.levels;
  return nullptr;
}

void encode_codebook(const Spec &s, const float *levels, const float *x, uint64_t n, uint64_t d,
                     uint8_t *codes, uint8_t *scales) {
  const int bits = bits_of(s.dtype);
  const uint32_t nl = 1u << bits, nm = nl - 1;
  float mid[15];
  midpoints(levels, nl, mid);
  const uint64_t g = group_of(s, d), rb = row_bytes(s.dtype, d), sb = scale_bytes(s);
  thread_local std::vector<uint8_t> cd;
  thread_local std::vector<float> up;  // a group of subnormal values, x 2^64
  if (cd.size() < g) cd.resize(g);
  for (uint64_t r = 0; r < n; ++r) {
    const float *xr = x + r * d;
    uint8_t *out = codes + r * rb;
    std::memset(out, 0, rb);
    for (uint64_t j0 = 0, k = r * (d / g); j0 < d; j0 += g, ++k) {
      const float e = signed_extreme(xr + j0, g);
      float inv = e != 0.0f ? 1.0f / e : 0.0f;
      const float *xg = xr + j0;
      if (!std::isfinite(inv)) {
        // |e| below 1 / FLT_MAX (subnormal): 1 / e overflows, and x x inf
        // would send every value to an end level (a zero to NaN, level 0).
        // The group x 2^64 instead: exact (every |x| <= |e| < 2^-127), the
        // same ratios x / e, and 1 / (2^64 e) finite.
        if (up.size() < g) up.resize(g);
        for (uint64_t j = 0; j < g; ++j) up[j] = xg[j] * 0x1p64f;
        inv = 1.0f / (e * 0x1p64f);
        xg = up.data();
      }
#ifdef KVC_CODEC_X86
      if (use_avx2())
        nearest_avx2(xg, g, inv, mid, nm, cd.data());
      else
#endif
        nearest_scalar(xg, g, inv, mid, nm, cd.data());
      // The scale keeps the group's norm: |scale| = |x| / |levels[codes]|
      // (in double, one order in both paths), the extreme's sign.
      double xx = 0.0, cc = 0.0;
      for (uint64_t j = 0; j < g; ++j) {
        const double lv = levels[cd[j]], xv = xr[j0 + j];
        xx += xv * xv;
        cc += lv * lv;
        put_code(out, bits, j0 + j, cd[j]);
      }
      float sc = cc > 0.0 ? static_cast<float>(std::sqrt(xx / cc)) : 0.0f;
      if (!std::isfinite(sc)) sc = std::numeric_limits<float>::max();
      if (e < 0.0f) sc = -sc;
      if (s.scale_dtype == DType::F16) sc = std::clamp(sc, -65504.0f, 65504.0f);
      inl::store_scale(scales + k * sb, s.scale_dtype, sc);
    }
  }
}

void decode_codebook(const Spec &s, const float *levels, const uint8_t *codes,
                     const uint8_t *scales, uint64_t n, uint64_t d, float *out) {
  const int bits = bits_of(s.dtype);
  const uint64_t g = group_of(s, d), rb = row_bytes(s.dtype, d), sb = scale_bytes(s);
#ifdef KVC_CODEC_X86
  if (use_avx2()) {
    if (bits == 2) return decode_rows_avx2<2>(s, levels, codes, scales, n, d, g, out);
    if (bits == 3) return decode_rows_avx2<3>(s, levels, codes, scales, n, d, g, out);
    return decode_rows_avx2<4>(s, levels, codes, scales, n, d, g, out);
  }
#endif
  for (uint64_t r = 0; r < n; ++r) {
    const uint8_t *in = codes + r * rb;
    float *xr = out + r * d;
    for (uint64_t j0 = 0, k = r * (d / g); j0 < d; j0 += g, ++k)
      decode_group_scalar(bits, in, j0, j0 + g, inl::load_scale(scales + k * sb, s.scale_dtype),
                          levels, xr);
  }
}

}  // namespace kvc::codec
