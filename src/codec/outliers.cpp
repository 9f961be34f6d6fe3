// Dense-and-sparse codes (Spec::outliers; after KVQuant, arXiv 2401.18079,
// section 3.4, which keeps about 1 % of the values of each vector apart in
// fp16): the few values of largest magnitude of each scale group are taken
// out before the group's scale is computed, so they no longer stretch every
// other value's step, and are kept as (index, int8 code) pairs in units of
// the group's own scale: two bytes each, and within half a step like every
// other value (the scale is at least the largest outlier's magnitude / 127).
// The dense codes go through encode() unchanged (the AVX2 kernels and their
// bit-exactness included); only the selection and the pairs are here.
#include <algorithm>
#include <cmath>
#include <cstring>

#include "codec/codec.h"
#include "codec/kernels.h"
#include "common/scratch.h"

namespace kvc::codec {

namespace {

// The levels on the side of a symmetric code's largest magnitude: qmax, or
// 2^(bits-1) with full range (the extreme maps to -2^(bits-1)).
float side_levels(const Spec &s) {
  const int bits = bits_of(s.dtype);
  return s.full_range ? static_cast<float>(1 << (bits - 1))
                      : static_cast<float>((1 << (bits - 1)) - 1);
}

}  // namespace

void encode_outliers(const Spec &s, const float *x, uint64_t n, uint64_t d, uint8_t *codes,
                     uint8_t *scales, uint8_t *outl) {
  const uint64_t g = outlier_group(s, d), groups = n * (d / g), k = s.outliers;
  thread_local ScratchBuffer<float> buf;
  float *tmp = buf.get(n * d);
  std::memcpy(tmp, x, n * d * sizeof(float));
  const float levels = side_levels(s);
  // Take the outliers out of each group (their pairs' indices first).
  for (uint64_t gi = 0; gi < groups; ++gi) {
    float *v = tmp + gi * g;
    uint8_t *pairs = outl + gi * k * 2;
    float top = 0.0f;  // the largest outlier's magnitude
    for (uint64_t j = 0; j < k; ++j) {
      uint64_t best = g;
      float mag = -1.0f;
      for (uint64_t i = 0; i < g; ++i) {
        bool taken = false;
        for (uint64_t t = 0; t < j; ++t) taken = taken || pairs[2 * t] == i;
        if (!taken && std::fabs(v[i]) > mag) mag = std::fabs(v[i]), best = i;
      }
      pairs[2 * j] = static_cast<uint8_t>(best);
      top = std::max(top, mag);
    }
    float rest = 0.0f;
    for (uint64_t j = 0; j < k; ++j) v[pairs[2 * j]] = 0.0f;
    for (uint64_t i = 0; i < g; ++i) rest = std::max(rest, std::fabs(v[i]));
    // The scale must reach the outliers within 127 steps: a group whose other
    // values are too small gets a stand-in extreme at the first outlier's slot
    // (its dense code is never read: the pair overrides it).
    const float need = top * levels / 127.0f;
    if (rest < need) v[pairs[0]] = need;
  }
  Spec dense = s;
  dense.outliers = 0;
  encode(dense, tmp, n, d, codes, scales, nullptr);
  // The pairs' codes, in units of each group's stored scale.
  const uint64_t sb = scale_bytes(s);
  for (uint64_t gi = 0; gi < groups; ++gi) {
    const float sc = inl::load_scale(scales + gi * sb, s.scale_dtype);
    uint8_t *pairs = outl + gi * k * 2;
    for (uint64_t j = 0; j < k; ++j) {
      const float val = x[gi * g + pairs[2 * j]];
      double q = sc != 0.0f ? std::nearbyint(static_cast<double>(val) / sc) : 0.0;
      q = std::clamp(q, -128.0, 127.0);
      pairs[2 * j + 1] = static_cast<uint8_t>(static_cast<int8_t>(q));
    }
  }
}

void apply_outliers(const Spec &s, const uint8_t *scales, const uint8_t *outl, uint64_t n,
                    uint64_t d, float *out) {
  const uint64_t g = outlier_group(s, d), groups = n * (d / g), k = s.outliers;
  const uint64_t sb = scale_bytes(s);
  for (uint64_t gi = 0; gi < groups; ++gi) {
    const float sc = inl::load_scale(scales + gi * sb, s.scale_dtype);
    const uint8_t *pairs = outl + gi * k * 2;
    for (uint64_t j = 0; j < k; ++j) {
      const uint64_t i = pairs[2 * j];
      if (i < g)  // (a record's bytes are checked elsewhere; never write past the group)
        out[gi * g + i] = static_cast<float>(static_cast<int8_t>(pairs[2 * j + 1])) * sc;
    }
  }
}

}  // namespace kvc::codec
