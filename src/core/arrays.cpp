// The standalone quantizer (core/arrays.h) over the codecs.
#include "core/arrays.h"

#include <string>

#include "codec/codec.h"
#include "common/error.h"

namespace kvc::core {

ArrayPlan plan_array(const CodecSpec &spec, uint64_t n, uint64_t d) {
  if (d < 1 || d > (1u << 24))
    fail(Errc::InvalidArgument, "d " + std::to_string(d) + ": must be 1..2^24");
  if (n > (uint64_t(1) << 40))
    fail(Errc::InvalidArgument, "n " + std::to_string(n) + ": must be 0..2^40");
  ArrayPlan q;
  q.spec = spec;
  codec::validate(q.spec, d);
  // Every size fits in the address space (n * d values are also staged as f32).
  const uint64_t limit = uint64_t(1) << 56;
  uint64_t nd = 0, groups = 0;
  const uint64_t g = q.spec.group ? q.spec.group : 1;
  if (__builtin_mul_overflow(n, d, &nd) || nd > limit / 4 ||
      __builtin_mul_overflow(n, (d + g - 1) / g, &groups) || groups > limit / 8)
    fail(Errc::Overflow, "an array of " + std::to_string(n) + " x " + std::to_string(d) +
                             " values (or its scales) overflows the address space");
  q.codes = n * codec::row_bytes(q.spec.dtype, d);
  q.num_scales = codec::num_scales(q.spec, n, d);
  q.scales = q.num_scales * codec::scale_bytes(q.spec);
  q.zeros = q.spec.asym ? q.scales : 0;
  return q;
}

void quantize_array(const ArrayPlan &p, const void *src, DType src_type, uint64_t n, uint64_t d,
                    uint8_t *codes, uint8_t *scales, uint8_t *zeros) {
  codec::quantize(p.spec, src, src_type, n, d, codes, scales, zeros);
}

void dequantize_array(const ArrayPlan &p, const uint8_t *codes, const uint8_t *scales,
                      const uint8_t *zeros, uint64_t n, uint64_t d, void *dst, DType dst_type) {
  codec::dequantize(p.spec, codes, scales, zeros, n, d, dst, dst_type);
}

void check_codec(const CodecSpec &spec, uint64_t d) {
  codec::validate(spec, d);
}

uint32_t default_rotation_block(uint64_t d) {
  return codec::default_rotation_block(d);
}

}  // namespace kvc::core
