// SPDX-License-Identifier: Apache-2.0
// libFuzzer target of the standalone quantizer (kvc_quantize_sizes /
// kvc_quantize / kvc_dequantize): any codec descriptor and any f32 input
// (NaN, Inf, subnormals, huge values included) either is refused with a
// documented status and nothing written, or round-trips with
// - every byte written inside the sizes kvc_quantize_sizes() gave (guards);
// - the scalar and AVX2 kernels writing the same codes, scales, zero points
//   and decoded values, bit for bit;
// - finite decoded values (fp8 and integer codes; f16 storage overflows to
//   Inf as documented);
// - for unrotated integer codecs with dynamic f32 scales and inputs below
//   1e30: every value within half a step of its input (full range: one step
//   for the values that clamp), the step being the value's own scale.
// Input: 24 bytes of descriptor, then f32 values (cycled). Seeds:
// tests/fuzz/corpus-codec.
#include <kvcache/kvcache.h>

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "codec/codec.h"

namespace {

[[noreturn]] void die(const char *what, const kvc_codec &c, uint64_t n, uint64_t d) {
  std::fprintf(stderr,
               "fuzz_codec: %s (dtype %d gran %d group %u asym %u full_range %u scale_dtype %d rotation %d "
               "block %u static %u scale %g n %llu d %llu)\n",
               what, int(c.dtype), int(c.granularity), c.group_size, c.asymmetric, c.full_range,
               int(c.scale_dtype), int(c.rotation), c.rotation_block, c.static_scale, c.scale,
               (unsigned long long)n, (unsigned long long)d);
  std::abort();
}

float scale_at(const std::vector<uint8_t> &scales, kvc_dtype sd, uint64_t idx) {
  if (sd == KVC_DTYPE_F16) {
    uint16_t h;
    std::memcpy(&h, scales.data() + idx * 2, 2);
    return kvc::f16_to_f32_scalar(h);
  }
  float f;
  std::memcpy(&f, scales.data() + idx * 4, 4);
  return f;
}

struct Out {
  std::vector<uint8_t> codes, scales, zeros;
  std::vector<float> back;
  std::vector<uint16_t> back16;  // the same codes dequantized to f16
  kvc_status q = KVC_OK, dq = KVC_OK, dq16 = KVC_OK;
};

constexpr uint8_t kGuard = 0xa5;
constexpr size_t kPad = 16;

// Input as f32, or (h non-empty) as the f16 values h.
Out run(const kvc_codec &c, const kvc_quant_sizes &qs, const std::vector<float> &x, const std::vector<uint16_t> &h,
        uint64_t n, uint64_t d) {
  Out o;
  o.codes.assign(qs.codes_bytes + kPad, kGuard);
  o.scales.assign(qs.scales_bytes + kPad, kGuard);
  o.zeros.assign(qs.zeros_bytes + kPad, kGuard);
  o.q = h.empty() ? kvc_quantize(&c, x.data(), KVC_DTYPE_F32, n, d, o.codes.data(), o.scales.data(),
                                 qs.zeros_bytes ? o.zeros.data() : nullptr)
                  : kvc_quantize(&c, h.data(), KVC_DTYPE_F16, n, d, o.codes.data(), o.scales.data(),
                                 qs.zeros_bytes ? o.zeros.data() : nullptr);
  if (o.q == KVC_OK) {
    o.back.assign(n * d + kPad, 1234.5f);
    o.dq = kvc_dequantize(&c, o.codes.data(), o.scales.data(), qs.zeros_bytes ? o.zeros.data() : nullptr, n, d,
                          o.back.data(), KVC_DTYPE_F32);
    o.back16.assign(n * d + kPad, 0x5a5a);
    o.dq16 = kvc_dequantize(&c, o.codes.data(), o.scales.data(), qs.zeros_bytes ? o.zeros.data() : nullptr, n, d,
                            o.back16.data(), KVC_DTYPE_F16);
  }
  return o;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (size < 24) return 0;
  kvc_codec c;
  kvc_codec_init(&c);
  c.dtype = static_cast<kvc_dtype>(data[0] % 10);  // 9: unknown
  c.granularity = static_cast<kvc_granularity>(data[1] % 6);  // 5: unknown
  uint16_t group;
  std::memcpy(&group, data + 2, 2);
  c.group_size = group % 300;
  c.asymmetric = data[4] % 3;  // 2: invalid
  c.full_range = data[5] % 3;  // 2: invalid
  c.scale_dtype = data[6] % 4 == 0 ? KVC_DTYPE_F16 : data[6] % 4 == 1 ? KVC_DTYPE_BF16 : KVC_DTYPE_F32;
  c.rotation = static_cast<kvc_rotation>(data[7] % 3);  // 2: unknown
  c.rotation_block = data[8] % 4 == 0 ? 0u : 1u << (data[8] % 11);
  c.static_scale = data[9] % 3 == 1;
  double sc;
  std::memcpy(&sc, data + 10, 8);
  c.scale = sc;
  const uint64_t n = 1 + data[18] % 9;
  uint16_t dd;
  std::memcpy(&dd, data + 19, 2);
  const uint64_t d = 1 + dd % 300;
  const bool tame = data[21] % 2 == 0;  // inputs scaled into a finite, moderate range
  c.outliers = data[23] % 8 == 0 ? 1u + data[23] / 8 % 20 : 0u;  // pools only: always refused here
  const size_t nf = (size - 24) / 4;
  std::vector<float> x(n * d);
  for (uint64_t i = 0; i < n * d; ++i) {
    float v = 0.0f;
    if (nf) std::memcpy(&v, data + 24 + 4 * (i % nf), 4);
    if (tame) v = std::isfinite(v) ? std::fmod(v, 1000.0f) * (1.0f + float(i % 7)) : float(i % 5) - 2.0f;
    x[i] = v;
  }
  // Half the inputs arrive as f16 (the KV append case, with its own direct
  // path): x becomes the f16 values, so every check below applies to them.
  std::vector<uint16_t> h;
  if (data[22] % 2) {
    h.resize(n * d);
    kvc_convert(x.data(), KVC_DTYPE_F32, h.data(), KVC_DTYPE_F16, n * d);
    kvc_convert(h.data(), KVC_DTYPE_F16, x.data(), KVC_DTYPE_F32, n * d);
  }

  kvc_quant_sizes qs;
  kvc_quant_sizes_init(&qs);
  const kvc_status s = kvc_quantize_sizes(&c, n, d, &qs);
  if (c.outliers && s == KVC_OK) die("outliers accepted by the standalone quantizer", c, n, d);
  if (s != KVC_OK) {
    if (s != KVC_ERR_INVALID_ARGUMENT && s != KVC_ERR_INVALID_SCALE &&
        !(c.outliers && s == KVC_ERR_UNSUPPORTED))
      die("unexpected status from sizes", c, n, d);
    return 0;
  }
  if (qs.codes_bytes == 0 || qs.codes_bytes > (64u << 20)) die("implausible codes_bytes", c, n, d);

  kvc::codec::set_force_scalar(true);
  const Out a = run(c, qs, x, h, n, d);
  kvc::codec::set_force_scalar(false);
  const Out b = run(c, qs, x, h, n, d);
  if (a.q != b.q) die("scalar and SIMD statuses differ", c, n, d);
  if (b.q != KVC_OK) {
    if (b.q != KVC_ERR_NON_FINITE) die("unexpected status from kvc_quantize", c, n, d);
    for (const auto *v : {&b.codes, &b.scales, &b.zeros})
      for (uint8_t byte : *v)
        if (byte != kGuard) die("a refused quantize wrote bytes", c, n, d);
    return 0;
  }
  if (a.dq != KVC_OK || b.dq != KVC_OK || a.dq16 != KVC_OK || b.dq16 != KVC_OK)
    die("dequantize of fresh codes failed", c, n, d);
  if (a.back16 != b.back16) die("scalar and SIMD f16 decodings differ", c, n, d);
  for (size_t i = 0; i < kPad; ++i)
    if (b.back16[n * d + i] != 0x5a5a) die("f16 write past the sizes", c, n, d);
  for (const Out *o : {&a, &b}) {
    for (size_t i = 0; i < kPad; ++i)
      if (o->codes[qs.codes_bytes + i] != kGuard || o->scales[qs.scales_bytes + i] != kGuard ||
          o->zeros[qs.zeros_bytes + i] != kGuard || o->back[n * d + i] != 1234.5f)
        die("write past the sizes", c, n, d);
  }
  const bool integer = c.dtype >= KVC_DTYPE_INT8;
  if (a.codes != b.codes || a.scales != b.scales || a.zeros != b.zeros) die("scalar and SIMD codes differ", c, n, d);
  // NaN scales are impossible here (inputs are finite), so the bits must agree.
  if (std::memcmp(a.back.data(), b.back.data(), n * d * 4) != 0) die("scalar and SIMD decodings differ", c, n, d);
  // Codes and fp8 saturate; plain f16 storage turns values beyond 65504 into
  // +-Inf, as every conversion to f16 does (documented at kvc_dtype).
  if (c.dtype >= KVC_DTYPE_FP8_E4M3)
    for (uint64_t i = 0; i < n * d; ++i)
      if (!std::isfinite(b.back[i])) die("non-finite decoded value", c, n, d);

  // The analytic bound, where it is exact: unrotated integer codes, dynamic f32 scales.
  bool moderate = true;
  for (float v : x) moderate = moderate && std::fabs(v) < 1e30f;
  if (!integer || c.rotation != KVC_ROTATION_NONE || c.static_scale || c.scale_dtype != KVC_DTYPE_F32 || !moderate)
    return 0;
  const uint64_t g = c.group_size;
  for (uint64_t r = 0; r < n; ++r)
    for (uint64_t j = 0; j < d; ++j) {
      uint64_t idx = 0;
      switch (c.granularity) {
        case KVC_SCALE_PER_TENSOR: idx = 0; break;
        case KVC_SCALE_PER_TOKEN: idx = r; break;
        case KVC_SCALE_PER_GROUP: idx = r * ((d + g - 1) / g) + j / g; break;
        case KVC_SCALE_PER_CHANNEL: idx = (r / g) * d + j; break;
        default: die("unexpected granularity accepted", c, n, d);
      }
      const float step = std::fabs(scale_at(b.scales, c.scale_dtype, idx));
      const float v = x[r * d + j], err = std::fabs(b.back[r * d + j] - v);
      // Half a step, plus the float rounding of x * (1 / step), q * step and,
      // asymmetric, of x - zero (about an ulp of the zero point).
      float slack = 0.5f * step * (1.0f + 1e-5f) + 4e-7f * std::fabs(v) + 1e-37f;
      if (c.asymmetric) slack += 4e-7f * std::fabs(scale_at(b.zeros, c.scale_dtype, idx)) + 4e-7f * step * 255.0f;
      if (c.full_range) slack += 0.5f * step;  // values of the other sign may clamp by up to a step
      if (err > slack) die("error beyond the bound", c, n, d);
    }
  return 0;
}
