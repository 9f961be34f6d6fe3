// The one element-type enum of the library and its facts, used by the API
// translation, core, the codecs and the CUDA kernels alike (nvcc compiles it
// too: no standard-library types beyond the fixed-width integers).
//
// Values equal the public kvc_dtype values (checked in src/api): f32, f16 and
// bf16 are plain storage and conversion types; fp8 and the integer types are
// codec storage (codes with scales, docs/codecs.md).
#pragma once
#include <cstddef>
#include <cstdint>

namespace kvc {

enum class DType : int32_t {
  F32 = 0,
  F16 = 1,
  BF16 = 2,
  FP8_E4M3 = 3,
  FP8_E5M2 = 4,
  INT8 = 5,
  INT4 = 6,
  INT2 = 7,
  INT3 = 8,
};

// One row per DType, in value order.
struct DTypeTraits {
  const char *name;  // as the public API and docs spell it
  int32_t bits;      // bits of one element (codes for fp8 and integers)
  bool is_float;     // f32 / f16 / bf16: plain values, no scales
  bool is_fp8;
  bool is_int;
  float sym_max;  // largest magnitude a symmetric code stands for (0: plain types)
};

inline constexpr DTypeTraits kDTypeTraits[] = {
    {"f32", 32, true, false, false, 0.0f},         {"f16", 16, true, false, false, 0.0f},
    {"bf16", 16, true, false, false, 0.0f},        {"fp8_e4m3", 8, false, true, false, 448.0f},
    {"fp8_e5m2", 8, false, true, false, 57344.0f}, {"int8", 8, false, false, true, 127.0f},
    {"int4", 4, false, false, true, 7.0f},         {"int2", 2, false, false, true, 1.0f},
    {"int3", 3, false, false, true, 3.0f},
};
inline constexpr int32_t kNumDTypes =
    static_cast<int32_t>(sizeof kDTypeTraits / sizeof kDTypeTraits[0]);

// Any DType value (f32 .. int3).
constexpr bool dtype_known(int32_t d) {
  return d >= 0 && d < kNumDTypes;
}
// A plain storage / conversion type: f32, f16 or bf16.
constexpr bool dtype_is_plain(int32_t d) {
  return d >= 0 && d <= 2;
}

constexpr const DTypeTraits &traits(DType d) {
  return kDTypeTraits[static_cast<int32_t>(d)];
}
constexpr bool is_float(DType d) {
  return traits(d).is_float;
}
constexpr bool is_fp8(DType d) {
  return traits(d).is_fp8;
}
constexpr bool is_int(DType d) {
  return traits(d).is_int;
}
constexpr int bits_of(DType d) {
  return traits(d).bits;
}
constexpr const char *dtype_name(DType d) {
  return traits(d).name;
}
// The largest magnitude a symmetric (non-full-range) code stands for: 448 /
// 57344 for fp8, qmax (127, 7, 3, 1) for integers.
constexpr float sym_max(DType d) {
  return traits(d).sym_max;
}
// Bytes of one element of a plain type (f32: 4, f16 / bf16: 2).
constexpr size_t dtype_bytes(DType d) {
  return d == DType::F32 ? 4 : 2;
}

static_assert(kNumDTypes == 9 && traits(DType::INT3).bits == 3 && traits(DType::FP8_E5M2).is_fp8,
              "kDTypeTraits is in DType value order");

}  // namespace kvc
