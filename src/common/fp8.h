// FP8 formats of the OCP 8-bit floating point specification (as used by
// vLLM, TensorRT-LLM and H100 tensor cores):
// - E4M3 "FN": bias 7, 3 mantissa bits, no infinities, 0x7f/0xff are NaN,
//   largest finite value 448;
// - E5M2: bias 15, 2 mantissa bits, IEEE-like (0x7c = Inf), largest finite
//   value 57344.
// Encoding rounds to nearest even and saturates to the largest finite value
// (never produces Inf or NaN from finite input).
#pragma once
#include <cstdint>

// The encoder is shared with the CUDA kernels (cuda/codec.cuh), which must
// store the same bytes: callable from device code when nvcc compiles it.
#if defined(__CUDACC__)
#define KVC_HOST_DEVICE __host__ __device__
#else
#define KVC_HOST_DEVICE
#endif

namespace kvc {

template <int kMant, int kBias, uint32_t kMaxCode>
KVC_HOST_DEVICE inline uint8_t fp8_encode(float f) {
  uint32_t u;
  __builtin_memcpy(&u, &f, 4);
  const uint8_t sign = static_cast<uint8_t>((u >> 24) & 0x80u);
  const uint32_t a = u & 0x7fffffffu;
  constexpr int kEmin = 1 - kBias;  // exponent of the smallest normal
  const int e = static_cast<int>(a >> 23) - 127;
  uint32_t code;
  if (a >= 0x7f800000u) {
    code = kMaxCode;  // Inf saturates (NaN is rejected before encoding)
  } else if (e < kEmin) {
    // Subnormal in fp8 (or zero), in units of 2^(kEmin - kMant):
    // q = mant24 * 2^(e - 23) / 2^(kEmin - kMant) = mant24 >> shift.
    const int shift = 23 + kEmin - kMant - e;
    if (a < 0x00800000u || shift >= 25) {
      code = 0;  // below half the smallest subnormal (f32 subnormals included)
    } else {
      const uint32_t mant = (a & 0x7fffffu) | 0x800000u;
      uint32_t q = mant >> shift;
      const uint32_t rem = mant & ((1u << shift) - 1u);
      const uint32_t half = 1u << (shift - 1);
      if (rem > half || (rem == half && (q & 1u))) ++q;
      code = q;  // q == 2^kMant is exactly the smallest normal's code
    }
  } else {
    uint32_t r = a - (static_cast<uint32_t>(127 - kBias) << 23);
    constexpr int kDrop = 23 - kMant;
    const uint32_t rem = r & ((1u << kDrop) - 1u);
    r >>= kDrop;
    if (rem > (1u << (kDrop - 1)) || (rem == (1u << (kDrop - 1)) && (r & 1u))) ++r;
    code = r > kMaxCode ? kMaxCode : r;
  }
  return static_cast<uint8_t>(sign | code);
}

KVC_HOST_DEVICE inline uint8_t fp8_e4m3_encode(float f) {
  return fp8_encode<3, 7, 0x7eu>(f);
}
KVC_HOST_DEVICE inline uint8_t fp8_e5m2_encode(float f) {
  return fp8_encode<2, 15, 0x7bu>(f);
}

// Decoding tables (256 entries each), built once.
const float *fp8_e4m3_table();
const float *fp8_e5m2_table();

constexpr float kFp8E4m3Max = 448.0f;
constexpr float kFp8E5m2Max = 57344.0f;

}  // namespace kvc
