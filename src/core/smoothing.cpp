// Per-channel key smoothing (kvc_pool_set_key_smoothing): keys are encoded as
// (k - offset) / scale per channel and read back as decoded * scale + offset,
// with scale and offset calibrated offline (`kvcache calibrate`). Dividing
// each channel by its typical magnitude flattens the outlier channels that
// make per-token key codes lossy (SmoothAttention, QServe arXiv 2405.04532);
// subtracting each channel's mean removes the offsets that KVQuant (arXiv
// 2401.18079) calibrates per channel. docs/codecs.md has the whole contract.
#include <xxhash.h>

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstring>

#include "common/convert.h"
#include "common/error.h"
#include "common/le.h"
#include "common/strings.h"
#include "core/format.h"
#include "core/pool.h"

namespace kvc::core {

namespace {
// Largest smoothed magnitude: the Hadamard rotation of a block of rb values
// (and undoing RoPE, up to sqrt(2) x) then stays finite.
float smooth_limit(uint32_t rotation_block) {
  return FLT_MAX / (2.0f * static_cast<float>(std::max<uint32_t>(1, rotation_block)));
}
}  // namespace

void BlockFormat::smooth_keys(const KeySmoothing &s, uint32_t layer, float *x, uint64_t n) const {
  const uint64_t row = static_cast<uint64_t>(cfg_.num_kv_heads) * cfg_.head_dim;
  const float *sc = s.scale.data() + layer * row;
  const float *off = s.offset.empty() ? nullptr : s.offset.data() + layer * row;
  const float lim = smooth_limit(rotation_block(0));
  for (uint64_t t = 0; t < n; ++t) {
    float *r = x + t * row;
    for (uint64_t c = 0; c < row; ++c) {
      const float y = ((off ? r[c] - off[c] : r[c]) / sc[c]);
      r[c] = std::clamp(y, -lim, lim);  // also an Inf from a huge quotient
    }
  }
}

void BlockFormat::unsmooth_keys(uint32_t layer, float *x, uint64_t n) const {
  const KeySmoothing &s = *smooth;
  const uint64_t row = static_cast<uint64_t>(cfg_.num_kv_heads) * cfg_.head_dim;
  const float *sc = s.scale.data() + layer * row;
  const float *off = s.offset.empty() ? nullptr : s.offset.data() + layer * row;
  for (uint64_t t = 0; t < n; ++t) {
    float *r = x + t * row;
    if (off) {
      for (uint64_t c = 0; c < row; ++c)
        r[c] = std::clamp(r[c] * sc[c] + off[c], -FLT_MAX, FLT_MAX);
    } else {
      for (uint64_t c = 0; c < row; ++c) r[c] = std::clamp(r[c] * sc[c], -FLT_MAX, FLT_MAX);
    }
  }
}

void Pool::require_empty_for(const char *what) const {
  if (seqs_.size())
    fail(Errc::InvalidArgument, "the pool holds " + u64s(seqs_.size()) + " sequences: set " + what +
                                    " before the first kvc_seq_create() (their codes would change "
                                    "meaning)");
  if (events_)
    fail(Errc::InvalidArgument, std::string("the prefix cache is enabled: set ") + what +
                                    " before kvc_pool_enable_prefix_cache()");
}

void Pool::digest128(const std::vector<uint8_t> &b, uint8_t out[16]) {
  const XXH128_hash_t h = XXH3_128bits(b.data(), b.size());
  XXH128_canonical_t canon;
  XXH128_canonicalFromHash(&canon, h);
  std::memcpy(out, canon.digest, 16);
}

void Pool::set_key_smoothing(const float *scale, const float *offset, size_t count) {
  std::unique_lock lk(mu_);
  const uint64_t row = static_cast<uint64_t>(cfg_.num_kv_heads) * cfg_.head_dim;
  const uint64_t want = static_cast<uint64_t>(cfg_.num_layers) * row;
  if (!scale && count) fail(Errc::NullPointer, "scale is NULL with count " + u64s(count));
  if (!scale && offset)
    fail(Errc::InvalidArgument, "an offset without a scale: give both, or neither to remove");
  if (cfg_.device == Device::CUDA)
    fail(Errc::Unsupported, "device CUDA: key smoothing is CPU-only in this version");
  if (headwise())
    fail(Errc::Unsupported,
         "head-wise pools (KVC_POOL_HEADWISE) do not smooth keys in this version");
  if (scale && !fmt_.quantized(0))
    fail(Errc::InvalidArgument,
         "key smoothing applies to quantized keys: set a k_codec with an fp8 or integer dtype");
  if (scale && count != want)
    fail(Errc::InvalidArgument, "count " + u64s(count) + " is not num_layers x num_kv_heads x " +
                                    "head_dim = " + u64s(want));
  require_empty_for("key smoothing");
  std::shared_ptr<KeySmoothing> s;
  if (scale) {
    s = std::make_shared<KeySmoothing>();
    bool any_offset = false;
    for (uint64_t i = 0; i < want; ++i) {
      const std::string at = " at layer " + u64s(i / row) + ", channel " + u64s(i % row);
      if (!(std::isfinite(scale[i]) && scale[i] >= 1e-30f && scale[i] <= 1e30f))
        fail(Errc::InvalidArgument, "scale " + fmt_g(scale[i]) + at + " is not in [1e-30, 1e30]");
      if (offset && !(std::isfinite(offset[i]) && std::fabs(offset[i]) <= 1e30f))
        fail(Errc::InvalidArgument,
             "offset " + fmt_g(offset[i]) + at + " is not finite within [-1e30, 1e30]");
      any_offset = any_offset || (offset && offset[i] != 0.0f);
    }
    s->scale.assign(scale, scale + want);
    if (any_offset) s->offset.assign(offset, offset + want);
    // The digest: "KSM1", then the scales' and the offsets' (zeros when none) bits, little-endian.
    std::vector<uint8_t> b;
    b.reserve(4 + 8 * want);
    append_le32(b, kKeySmoothingTag);
    for (float v : s->scale) append_le32(b, f32_bits(v));
    for (uint64_t i = 0; i < want; ++i) append_le32(b, any_offset ? f32_bits(s->offset[i]) : 0u);
    digest128(b, s->digest);
  }
  // The pool holds no key: dynamic per-tensor key scales calibrate again,
  // from the first smoothed write.
  for (uint32_t l = 0; l < cfg_.num_layers; ++l)
    if (fmt_.per_tensor(0, l) && fmt_.part(l, 0).spec.static_scale <= 0.0)
      fmt_.scale[0][l].store(0, std::memory_order_release);
  cfg_.k_smoothing = s;
  std::lock_guard<std::mutex> g(fmt_.smooth_mu);  // an append's prepare reads it unlocked
  fmt_.smooth = s;
}

}  // namespace kvc::core
