// The Hadamard rotation's butterflies in AVX2 registers (x86-64 only), shared
// by hadamard.cpp and the fused quantize / dequantize paths: a block of 64 or
// 128 values is transformed whole in 8 or 16 registers (one load and one
// store per vector instead of one per stage). Each output is the same a + b
// or a - b of the same operands, stage by stage, as the scalar loop, then the
// same multiply by the normalization, so the results are identical bit for
// bit.
#pragma once
#include "codec/kernels.h"

#ifdef KVC_CODEC_X86
#include <immintrin.h>

namespace kvc::codec {
namespace {

// Stages h = 1, 2, 4 of the butterfly inside one vector of 8 values, each
// as one shuffle and one fused multiply-add: with s = y with its pairs (j,
// j + h) swapped, s + y x (+1 in the pair's first lane, -1 in its second)
// gives a + c in the first lane (c + a: the same bits) and a - c in the
// second, each exact before its one rounding, so the same bits as the scalar
// loop's a + c and a - c.
__attribute__((target("avx2,fma"), always_inline)) inline __m256 butterfly8(__m256 y) {
  y = _mm256_fmadd_ps(y, _mm256_setr_ps(1, -1, 1, -1, 1, -1, 1, -1), _mm256_permute_ps(y, 0xb1));
  y = _mm256_fmadd_ps(y, _mm256_setr_ps(1, 1, -1, -1, 1, 1, -1, -1), _mm256_permute_ps(y, 0x4e));
  return _mm256_fmadd_ps(y, _mm256_setr_ps(1, 1, 1, 1, -1, -1, -1, -1),
                         _mm256_permute2f128_ps(y, y, 0x01));
}

__attribute__((target("avx2,fma"), always_inline)) inline void bfly(__m256 &a, __m256 &b) {
  const __m256 s = _mm256_add_ps(a, b);
  b = _mm256_sub_ps(a, b);
  a = s;
}

// The vector stages h = H, 2H, .. NV / 2 of a block of NV vectors in r[0 ..
// NV), pairs (j, j + H) in order. H is a template argument so every loop has
// a constant trip count and unrolls fully; a runtime h (h *= 2) made clang
// spend minutes on this under -fsanitize=undefined with halt-on-error.
template <int NV, int H>
__attribute__((target("avx2,fma"), always_inline)) inline void butterfly_stages(__m256 *r) {
  if constexpr (H < NV) {
#pragma GCC unroll 16
    for (int i = 0; i < NV; i += 2 * H)
#pragma GCC unroll 16
      for (int j = i; j < i + H; ++j) bfly(r[j], r[j + H]);
    butterfly_stages<NV, 2 * H>(r);
  }
}

// Every stage (h = 1 .. 4 NV) of a block of 8 NV values held in r[0 .. NV),
// without the normalization.
template <int NV>
__attribute__((target("avx2,fma"), always_inline)) inline void butterfly_regs(__m256 *r) {
#pragma GCC unroll 16
  for (int i = 0; i < NV; ++i) r[i] = butterfly8(r[i]);
  butterfly_stages<NV, 1>(r);
}

// The normalized transform of one block of 8 NV values in r[0 .. NV), in
// place (the caller loads and stores in fully unrolled loops, so the block
// stays in registers).
template <int NV>
__attribute__((target("avx2,fma"), always_inline)) inline void rotate_regs(__m256 *r, __m256 norm) {
  butterfly_regs<NV>(r);
#pragma GCC unroll 16
  for (int i = 0; i < NV; ++i) r[i] = _mm256_mul_ps(r[i], norm);
}

// Whether a rotation block takes the register path.
inline bool hadamard_in_registers(uint32_t block) {
  return block == 64 || block == 128;
}

}  // namespace
}  // namespace kvc::codec
#endif
