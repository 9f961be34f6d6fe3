// Codebooks of a pool's K or V codes (kvc_pool_set_codebook): the codes of
// a symmetric 2..4-bit integer codec index a layer's table of 2^bits levels
// (in units of each group's signed extreme) instead of the uniform grid
// (codec/codebook.cpp; KVQuant's per-layer non-uniform levels, TurboQuant's
// Lloyd-Max levels for rotated values). docs/codecs.md has the contract.
#include <cmath>
#include <cstring>

#include "common/convert.h"
#include "common/error.h"
#include "common/le.h"
#include "common/strings.h"
#include "core/format.h"
#include "core/pool.h"

namespace kvc::core {

const float *Pool::gaussian_codebook(uint32_t bits, uint64_t group) {
  return codec::gaussian_levels(bits, group);
}

void Pool::set_codebook(int kv, const float *levels, size_t count) {
  std::unique_lock lk(mu_);
  if (kv != 0 && kv != 1)
    fail(Errc::InvalidArgument, "part " + std::to_string(kv) + " is not 0 (keys) or 1 (values)");
  if (!levels && count) fail(Errc::NullPointer, "levels is NULL with count " + u64s(count));
  if (cfg_.device == Device::CUDA)
    fail(Errc::Unsupported, "device CUDA: codebooks are CPU-only in this version");
  if (headwise())
    fail(Errc::Unsupported,
         "head-wise pools (KVC_POOL_HEADWISE) do not take codebooks in this "
         "version");
  // Each layer's codec (a pool with per-layer codecs: its own bits), checked.
  const std::string part = kv ? "v_codec" : "k_codec";
  std::vector<uint64_t> offset(cfg_.num_layers + 1, 0);
  bool any = false;  // a layer that takes levels
  for (uint32_t l = 0; l < cfg_.num_layers; ++l) {
    const codec::Spec &sp = fmt_.part(l, kv).spec;
    const std::string name =
        fmt_.mixed() ? std::string(kv ? "layer_v_codecs[" : "layer_k_codecs[") + u64s(l) + "]"
                     : part;
    const int bits = fmt_.quantized(kv) && is_int(sp.dtype) ? bits_of(sp.dtype) : 0;
    // Per-layer codecs: an int8 or fp8 layer takes no levels (its uniform codes stay).
    if (fmt_.mixed() && fmt_.quantized(kv) && (bits == 8 || !is_int(sp.dtype))) {
      offset[l + 1] = offset[l];
      continue;
    }
    any = true;
    if (levels) {
      if (bits < 2 || bits > 4)
        fail(Errc::InvalidArgument, "a codebook needs an int2, int3 or int4 " + name +
                                        " (the part is " + dtype_name(sp.dtype) + ")");
      if (sp.gran != codec::Gran::Token && sp.gran != codec::Gran::Group)
        fail(Errc::InvalidArgument, name +
                                        ": a codebook needs per-token or per-group scales "
                                        "(KVC_SCALE_PER_TOKEN or KVC_SCALE_PER_GROUP)");
      if (sp.asym || sp.full_range)
        fail(Errc::InvalidArgument, name +
                                        ": a codebook replaces the symmetric level rule; set "
                                        "neither asymmetric nor full_range (its scale is each "
                                        "group's signed extreme)");
      if (sp.outliers)
        fail(Errc::InvalidArgument, name + ": outliers and a codebook do not combine");
      const uint64_t row = static_cast<uint64_t>(cfg_.num_kv_heads) * cfg_.head_dim;
      if (sp.gran == codec::Gran::Group && (sp.group == 0 || row % sp.group != 0))
        fail(Errc::InvalidArgument,
             name + ": group_size " + u64s(sp.group) +
                 " does not divide a token's row of num_kv_heads x head_dim = " + u64s(row) +
                 " values; a codebook's groups must tile it");
    }
    offset[l + 1] = offset[l] + (bits ? (uint64_t{1} << bits) : 0);
  }
  if (levels && !any)
    fail(Errc::InvalidArgument, std::string("no layer's ") + (kv ? "values" : "keys") +
                                    " take a codebook (every layer's codec is int8 or fp8)");
  const uint64_t want = offset[cfg_.num_layers];
  const uint64_t per_layer = fmt_.mixed() ? 0 : want / cfg_.num_layers;
  if (levels && count != want)
    fail(Errc::InvalidArgument,
         "count " + u64s(count) +
             (fmt_.mixed() ? " is not the sum over the layers of 2^bits (int8 and fp8 layers: 0) = "
                           : " is not num_layers x 2^bits = ") +
             u64s(want));
  require_empty_for("codebooks");
  std::shared_ptr<Codebook> cb;
  if (levels) {
    uint32_t l = 0;
    for (uint64_t i = 0; i < want; ++i) {
      while (i >= offset[l + 1]) ++l;
      auto at = [&] { return " at layer " + u64s(l) + ", level " + u64s(i - offset[l]); };
      if (!(std::isfinite(levels[i]) && levels[i] >= -1.0f && levels[i] <= 1.0f))
        fail(Errc::InvalidArgument, "level " + fmt_g(levels[i]) + at() + " is not in [-1, 1]");
      if (i != offset[l] && !(levels[i] > levels[i - 1]))
        fail(Errc::InvalidArgument, "level " + fmt_g(levels[i]) + at() +
                                        " is not above the one before it (" + fmt_g(levels[i - 1]) +
                                        "): levels ascend strictly");
    }
    cb = std::make_shared<Codebook>();
    cb->per_layer = static_cast<uint32_t>(per_layer);
    cb->levels.assign(levels, levels + want);
    if (fmt_.mixed()) cb->offset = offset;
    // The digest: "CBK1", the part, the levels per layer (0 with per-layer
    // codecs, then each layer's count), the levels' bits, little-endian.
    std::vector<uint8_t> b;
    b.reserve(12 + 4 * cfg_.num_layers + 4 * want);
    append_le32(b, kCodebookTag);
    append_le32(b, static_cast<uint32_t>(kv));
    append_le32(b, cb->per_layer);
    if (fmt_.mixed())
      for (uint32_t k = 0; k < cfg_.num_layers; ++k)
        append_le32(b, static_cast<uint32_t>(offset[k + 1] - offset[k]));
    for (float v : cb->levels) append_le32(b, f32_bits(v));
    digest128(b, cb->digest);
  }
  cfg_.codebook[kv] = cb;
  fmt_.codebook[kv] = cb;
}

}  // namespace kvc::core
