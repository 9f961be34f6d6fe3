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
#include "codec/hadamard_avx2.h"
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
template <int NV>
__attribute__((target("avx2,fma"), always_inline)) inline void rotate_in_place(float *v,
                                                                               __m256 vn) {
  __m256 r[NV];
#pragma GCC unroll 16
  for (int i = 0; i < NV; ++i) r[i] = _mm256_loadu_ps(v + 8 * i);
  rotate_regs<NV>(r, vn);
#pragma GCC unroll 16
  for (int i = 0; i < NV; ++i) _mm256_storeu_ps(v + 8 * i, r[i]);
}

// The scalar butterfly's additions and subtractions, pair for pair and stage
// by stage (the first stages in registers), then the normalization: the same
// float operations in the same order, so the same bits.
__attribute__((target("avx2,fma"))) void hadamard_avx2(float *x, uint64_t d, uint32_t block,
                                                       float norm) {
  const __m256 vn = _mm256_set1_ps(norm);
  for (uint64_t base = 0; base < d; base += block) {
    float *v = x + base;
    if (block == 128) {  // the whole block in registers
      rotate_in_place<16>(v, vn);
      continue;
    }
    if (block == 64) {
      rotate_in_place<8>(v, vn);
      continue;
    }
    uint32_t h;
    if (block >= 64) {
      for (uint32_t j = 0; j < block; j += 64) {
        __m256 r[8];
        for (int i = 0; i < 8; ++i) r[i] = _mm256_loadu_ps(v + j + 8 * i);
        butterfly_regs<8>(r);
        for (int i = 0; i < 8; ++i) _mm256_storeu_ps(v + j + 8 * i, r[i]);
      }
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
#ifdef KVC_CODEC_X86
namespace {
// Whether every |x| < limit (NaN: no), eight lanes at a time.
__attribute__((target("avx2"))) bool all_below_avx2(const float *x, uint64_t n, float limit) {
  const __m256 lim = _mm256_set1_ps(limit),
               abs = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
  __m256 ok = _mm256_castsi256_ps(_mm256_set1_epi32(-1));
  uint64_t i = 0;
  for (; i + 8 <= n; i += 8)
    ok = _mm256_and_ps(ok,
                       _mm256_cmp_ps(_mm256_and_ps(_mm256_loadu_ps(x + i), abs), lim, _CMP_LT_OQ));
  bool all = _mm256_movemask_ps(ok) == 0xff;
  for (; i < n; ++i) all = all && std::fabs(x[i]) < limit;
  return all;
}
}  // namespace
#endif

void check_rotatable(const float *x, uint64_t n, uint32_t block, const char *what, uint64_t row,
                     uint64_t head_dim) {
  if (!block) return;
  const float limit = std::numeric_limits<float>::max() / static_cast<float>(block);
#ifdef KVC_CODEC_X86
  if (use_avx2() && all_below_avx2(x, n, limit)) return;  // (else the loop names the element)
#endif
  for (uint64_t i = 0; i < n; ++i)
    if (!(std::fabs(x[i]) < limit))
      fail(Errc::NonFinite, element_name(what, i, row, head_dim) + " (" + fmt_g(x[i]) +
                                ") is too large to rotate: the Hadamard "
                                "transform of a block of " +
                                u64s(block) + " would overflow (|x| must stay below " +
                                fmt_g(limit) + "); nothing was written");
}

}  // namespace kvc::codec
