// The standalone quantizer (kvc_quantize, kvc_dequantize,
// kvc_quantize_sizes): [n][d] arrays in a codec's format outside any pool,
// byte for byte as a pool stores them (docs/codecs.md).
#pragma once
#include <cstdint>

#include "core/types.h"

namespace kvc::core {

// A codec checked for rows of d values and the sizes of an [n][d] array's
// outputs: codes, scales and zero points in bytes, and the number of scales.
struct ArrayPlan {
  CodecSpec spec;
  uint64_t codes = 0, scales = 0, zeros = 0, num_scales = 0;
};

// Checks d (1..2^24), n (0..2^40), the spec for rows of d values, and that
// every size fits the address space; throws Error (InvalidArgument,
// InvalidScale, Overflow).
ArrayPlan plan_array(const CodecSpec &spec, uint64_t n, uint64_t d);
// src [n][d] of src_type -> codes, scales, zeros (sizes from the plan).
void quantize_array(const ArrayPlan &p, const void *src, DType src_type, uint64_t n, uint64_t d,
                    uint8_t *codes, uint8_t *scales, uint8_t *zeros);
// The inverse, into dst [n][d] of dst_type.
void dequantize_array(const ArrayPlan &p, const uint8_t *codes, const uint8_t *scales,
                      const uint8_t *zeros, uint64_t n, uint64_t d, void *dst, DType dst_type);

// Checks a codec for rows (or heads) of d values; throws Error.
void check_codec(const CodecSpec &spec, uint64_t d);
// Largest power of two dividing d (capped at 1024): the default Hadamard block.
uint32_t default_rotation_block(uint64_t d);

}  // namespace kvc::core
