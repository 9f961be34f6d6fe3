// The Hadamard rotation: the normalized fast Walsh-Hadamard transform of each
// block (scalar butterflies, and the same butterflies in AVX2 registers),
// the default block and the overflow check before rotating.
#if defined(__x86_64__)
#include <immintrin.h>
#endif

#include <cmath>
#include <limits>
#include <string>

#include "codec/codec.h"
#include "codec/kernels.h"
#include "common/error.h"

namespace kvc::codec {

uint32_t default_rotation_block(uint64_t d) {
  uint32_t b = 1;
  while (b < 1024 && d % (static_cast<uint64_t>(b) * 2) == 0) b *= 2;
  return b;
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
__attribute__((target("avx2"), always_inline)) inline void butterfly64(const float *in,
                                                                       float *out) {
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
__attribute__((target("avx2"))) void hadamard_avx2(float *x, uint64_t d, uint32_t block,
                                                   float norm) {
  const __m256 vn = _mm256_set1_ps(norm);
  for (uint64_t base = 0; base < d; base += block) {
    float *v = x + base;
    uint32_t h;
    if (block >= 64) {
      for (uint32_t j = 0; j < block; j += 64) butterfly64(v + j, v + j);
      h = 64;
    } else {
      for (uint32_t j = 0; j < block; j += 8)
        _mm256_storeu_ps(v + j, butterfly8(_mm256_loadu_ps(v + j)));
      h = 8;
    }
    if (h == block) {
      for (uint32_t j = 0; j < block; j += 8)
        _mm256_storeu_ps(v + j, _mm256_mul_ps(_mm256_loadu_ps(v + j), vn));
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

// The unnormalized butterfly grows a block's values by up to `block` times
// before the final normalization: inputs at or above FLT_MAX / block could
// overflow to Inf on the way, so they are refused (before anything is written).
void check_rotatable(const float *x, uint64_t n, uint32_t block) {
  if (!block) return;
  const float limit = std::numeric_limits<float>::max() / static_cast<float>(block);
  for (uint64_t i = 0; i < n; ++i)
    if (!(std::fabs(x[i]) < limit))
      fail(Errc::NonFinite, "element " + u64s(i) + " (" + fmt_g(x[i]) +
                                ") is too large to rotate: the Hadamard "
                                "transform of a block of " +
                                u64s(block) + " would overflow (|x| must stay below " +
                                fmt_g(limit) + "); nothing was written");
}

}  // namespace kvc::codec
