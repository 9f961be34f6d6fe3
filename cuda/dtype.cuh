// Device helpers of the element types: kvc::DType's values (common/dtype.h)
// as the kernels compare them, bits per element, f16 / bf16 conversions and
// plain element reads and writes.
#pragma once
#include <cuda_fp16.h>

#include <cstdint>

#include "backend.h"
#include "common/dtype.h"

namespace kvc::cuda {

namespace {

// ---- dtypes: kvc::DType's values, as the descriptors carry them (int3 is
// CPU-only: core refuses it for a CUDA pool, and the kernels take the others)
constexpr int32_t F32 = static_cast<int32_t>(DType::F32);
constexpr int32_t F16 = static_cast<int32_t>(DType::F16);
constexpr int32_t BF16 = static_cast<int32_t>(DType::BF16);
constexpr int32_t E4M3 = static_cast<int32_t>(DType::FP8_E4M3);
constexpr int32_t E5M2 = static_cast<int32_t>(DType::FP8_E5M2);
constexpr int32_t I8 = static_cast<int32_t>(DType::INT8);
constexpr int32_t I4 = static_cast<int32_t>(DType::INT4);
constexpr int32_t I2 = static_cast<int32_t>(DType::INT2);
// Scale granularities: backend.h's values (codec::Gran's, checked in core/store_cuda.cpp).
enum : int32_t {
  G_NONE = kGranNone,
  G_TENSOR = kGranTensor,
  G_TOKEN = kGranToken,
  G_GROUP = kGranGroup,
  G_CHANNEL = kGranChannel
};

__host__ __device__ constexpr int bits_of(int32_t d) {
  return d == F32                              ? 32
         : (d == F16 || d == BF16)             ? 16
         : (d == E4M3 || d == E5M2 || d == I8) ? 8
         : d == I4                             ? 4
                                               : 2;
}
__host__ __device__ inline uint64_t row_bytes(int32_t d, uint64_t n) {
  return (n * bits_of(d) + 7) / 8;
}
__device__ inline bool is_int(int32_t d) {
  return d == I8 || d == I4 || d == I2;
}
// bits_of() agrees with common/dtype.h's table for every dtype the kernels take.
static_assert(bits_of(F32) == kvc::bits_of(DType::F32) &&
                  bits_of(F16) == kvc::bits_of(DType::F16) &&
                  bits_of(BF16) == kvc::bits_of(DType::BF16) &&
                  bits_of(E4M3) == kvc::bits_of(DType::FP8_E4M3) &&
                  bits_of(E5M2) == kvc::bits_of(DType::FP8_E5M2) &&
                  bits_of(I8) == kvc::bits_of(DType::INT8) &&
                  bits_of(I4) == kvc::bits_of(DType::INT4) &&
                  bits_of(I2) == kvc::bits_of(DType::INT2),
              "the kernels' bits_of() disagrees with common/dtype.h");

__device__ inline float h2f(uint16_t h) {
  return __half2float(__ushort_as_half(h));
}
__device__ inline uint16_t f2h(float f) {
  return __half_as_ushort(__float2half_rn(f));
}
__device__ inline float bf2f(uint16_t b) {
  return __uint_as_float(static_cast<uint32_t>(b) << 16);
}
// Round to nearest even (src/common/convert.h's f32_to_bf16_scalar).
__device__ inline uint16_t f2bf(float f) {
  const uint32_t u = __float_as_uint(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x40u);
  return static_cast<uint16_t>((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

// Plain element read / write (f32, f16, bf16).
__device__ inline float load_plain(const uint8_t *p, int32_t dt) {
  if (dt == F32) return *reinterpret_cast<const float *>(p);
  const uint16_t h = *reinterpret_cast<const uint16_t *>(p);
  return dt == F16 ? h2f(h) : bf2f(h);
}
__device__ inline void store_plain(uint8_t *p, int32_t dt, float v) {
  if (dt == F32)
    *reinterpret_cast<float *>(p) = v;
  else
    *reinterpret_cast<uint16_t *>(p) = dt == F16 ? f2h(v) : f2bf(v);
}
__host__ __device__ inline uint32_t plain_bytes(int32_t dt) {
  return dt == F32 ? 4 : 2;
}

__device__ inline float load_src(const void *src, int32_t dt, uint64_t i) {
  if (dt == F32) return static_cast<const float *>(src)[i];
  const uint16_t h = static_cast<const uint16_t *>(src)[i];
  return dt == F16 ? h2f(h) : bf2f(h);
}

}  // namespace
}  // namespace kvc::cuda
