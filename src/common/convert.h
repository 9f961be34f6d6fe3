// Element conversion between f32, f16 and bf16 (round to nearest even).
// Scalar reference plus F16C/AVX2 paths chosen at run time; both give
// bit-identical results (tests/test_convert checks every f16 value).
#pragma once
#include <cstddef>
#include <cstdint>
#include <cstring>

#include "common/dtype.h"

namespace kvc {

inline uint32_t f32_bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}
inline float bits_f32(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

// IEEE binary32 -> binary16, round to nearest even; overflow -> Inf; NaN stays
// NaN (quiet, top payload bits kept, as x86 F16C does).
inline uint16_t f32_to_f16_scalar(float f) {
  const uint32_t u = f32_bits(f);
  const uint32_t sign = (u >> 16) & 0x8000u;
  const uint32_t abs = u & 0x7fffffffu;
  if (abs >= 0x7f800000u) {  // Inf or NaN
    if (abs == 0x7f800000u) return static_cast<uint16_t>(sign | 0x7c00u);
    return static_cast<uint16_t>(sign | 0x7e00u | ((abs >> 13) & 0x3ffu));
  }
  if (abs >= 0x477ff000u) return static_cast<uint16_t>(sign | 0x7c00u);  // rounds to >= 65520
  if (abs < 0x38800000u) {  // result is subnormal or zero (|f| < 2^-14)
    if (abs < 0x33000000u) return static_cast<uint16_t>(sign);  // < 2^-25: rounds to 0
    const uint32_t exp = abs >> 23;
    const uint32_t mant = (abs & 0x7fffffu) | 0x800000u;
    const uint32_t shift = 126u - exp;  // 14 - (exp - 127) + 23 - 10 - 1 + 1
    // value = mant * 2^(exp-150); half subnormal unit = 2^-24 -> mant >> (126 - exp)
    uint32_t q = mant >> shift;
    const uint32_t rem = mant & ((1u << shift) - 1u);
    const uint32_t half = 1u << (shift - 1u);
    if (rem > half || (rem == half && (q & 1u))) ++q;
    return static_cast<uint16_t>(sign | q);
  }
  uint32_t r = abs - 0x38000000u;  // rebias exponent 127 -> 15
  const uint32_t rem = r & 0x1fffu;
  r >>= 13;
  if (rem > 0x1000u || (rem == 0x1000u && (r & 1u))) ++r;
  return static_cast<uint16_t>(sign | r);
}

inline float f16_to_f32_scalar(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t exp = (h >> 10) & 0x1fu;
  uint32_t mant = h & 0x3ffu;
  if (exp == 0x1fu) return bits_f32(sign | 0x7f800000u | (mant << 13) | (mant ? 0x400000u : 0u));
  if (exp == 0) {
    if (mant == 0) return bits_f32(sign);
    // subnormal: normalize
    int e = -1;
    do {
      mant <<= 1;
      ++e;
    } while ((mant & 0x400u) == 0);
    mant &= 0x3ffu;
    return bits_f32(sign | static_cast<uint32_t>(127 - 15 - e) << 23 | (mant << 13));
  }
  return bits_f32(sign | ((exp + 112u) << 23) | (mant << 13));
}

inline uint16_t f32_to_bf16_scalar(float f) {
  const uint32_t u = f32_bits(f);
  if ((u & 0x7fffffffu) > 0x7f800000u)
    return static_cast<uint16_t>((u >> 16) | 0x40u);  // quiet NaN
  return static_cast<uint16_t>((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}
inline float bf16_to_f32_scalar(uint16_t b) {
  return bits_f32(static_cast<uint32_t>(b) << 16);
}

// Convert n elements. src and dst must not overlap unless identical dtype and
// pointer. Uses the fastest available path (F16C/AVX2 when the CPU has them).
void convert(const void *src, DType src_type, void *dst, DType dst_type, size_t n);

// Scalar-only variant (the reference the SIMD path must match bit for bit).
void convert_scalar(const void *src, DType src_type, void *dst, DType dst_type, size_t n);

// True when the F16C/AVX2 path is in use.
bool convert_has_simd();

}  // namespace kvc
