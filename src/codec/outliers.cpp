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

namespace {

// Takes the outliers out of one group of g values in place (their pair
// indices into `pairs`) and, if the group's other values are too small for
// the scale to reach them within 127 steps, puts a stand-in extreme at the
// first outlier's slot (its dense code is never read: the pair overrides it).
void take_outliers(const Spec &s, float *v, uint64_t g, uint8_t *pairs) {
  const uint64_t k = s.outliers;
  double top = 0.0;  // the largest outlier's magnitude (NaN counts as the largest)
  for (uint64_t j = 0; j < k; ++j) {
    uint64_t best = g;
    float mag = 0.0f;
    for (uint64_t i = 0; i < g; ++i) {
      bool taken = false;
      for (uint64_t t = 0; t < j; ++t) taken = taken || pairs[2 * t] == i;
      if (taken) continue;
      if (best == g || !(std::fabs(v[i]) <= mag)) mag = std::fabs(v[i]), best = i;
      if (std::isnan(mag)) break;
    }
    pairs[2 * j] = static_cast<uint8_t>(best);  // best < g: k <= g / 4
    if (!std::isnan(mag)) top = std::max<double>(top, mag);
  }
  for (uint64_t j = 0; j < k; ++j) v[pairs[2 * j]] = 0.0f;
  float rest = 0.0f, rest_v = 0.0f;  // the other values' largest magnitude, and that value
  for (uint64_t i = 0; i < g; ++i)
    if (std::fabs(v[i]) > rest) rest = std::fabs(v[i]), rest_v = v[i];
  // Codes cover at most 1e38 (docs/codecs.md): so does the stand-in, in double.
  const double need = std::min(top, 1e38) * side_levels(s) / 127.0;
  if (rest < need)  // the sign of the others' extreme: full-range scales follow it
    v[pairs[0]] = static_cast<float>(std::copysign(need, rest_v < 0.0f ? -1.0 : 1.0));
}

// The pair's code of value x in units of the stored scale sc.
uint8_t pair_code(float x, float sc) {
  double q = 0.0;
  if (sc != 0.0f && !std::isnan(x))
    q = std::nearbyint(std::clamp<double>(x, -1e38, 1e38) / static_cast<double>(sc));
  return static_cast<uint8_t>(static_cast<int8_t>(std::clamp(q, -128.0, 127.0)));
}

}  // namespace

void encode_outliers(const Spec &s, const float *x, uint64_t n, uint64_t d, uint8_t *codes,
                     uint8_t *scales, uint8_t *outl) {
  const uint64_t g = outlier_group(s, d), k = s.outliers, sb = scale_bytes(s);
  Spec dense = s;
  dense.outliers = 0;
  if (s.gran == Gran::Token) {
    // One row (one group, at most 256 values) at a time on the stack: no
    // allocation, so callers that must not throw can encode.
    const uint64_t rb = row_bytes(s.dtype, d);
    float v[kMaxOutlierGroup];
    for (uint64_t r = 0; r < n; ++r) {
      std::memcpy(v, x + r * d, d * sizeof(float));
      uint8_t *pairs = outl + r * k * 2;
      take_outliers(s, v, d, pairs);
      encode(dense, v, 1, d, codes + r * rb, scales + r * sb, nullptr);
      const float sc = inl::load_scale(scales + r * sb, s.scale_dtype);
      for (uint64_t j = 0; j < k; ++j) pairs[2 * j + 1] = pair_code(x[r * d + pairs[2 * j]], sc);
    }
    return;
  }
  // Per group: the whole array (per-group encoding allocates its parameters anyway).
  const uint64_t groups = n * (d / g);
  thread_local ScratchBuffer<float> buf;
  float *tmp = buf.get(n * d);
  std::memcpy(tmp, x, n * d * sizeof(float));
  for (uint64_t gi = 0; gi < groups; ++gi) take_outliers(s, tmp + gi * g, g, outl + gi * k * 2);
  encode(dense, tmp, n, d, codes, scales, nullptr);
  for (uint64_t gi = 0; gi < groups; ++gi) {
    const float sc = inl::load_scale(scales + gi * sb, s.scale_dtype);
    uint8_t *pairs = outl + gi * k * 2;
    for (uint64_t j = 0; j < k; ++j) pairs[2 * j + 1] = pair_code(x[gi * g + pairs[2 * j]], sc);
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
