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
  const char *name = kv ? "v_codec" : "k_codec";
  const codec::Spec &sp = fmt_.part[kv].spec;
  if (cfg_.device == Device::CUDA)
    fail(Errc::Unsupported, "device CUDA: codebooks are CPU-only in this version");
  if (headwise())
    fail(Errc::Unsupported,
         "head-wise pools (KVC_POOL_HEADWISE) do not take codebooks in this "
         "version");
  const int bits = fmt_.quantized(kv) && is_int(sp.dtype) ? bits_of(sp.dtype) : 0;
  if (levels) {
    if (bits < 2 || bits > 4)
      fail(Errc::InvalidArgument, std::string("a codebook needs an int2, int3 or int4 ") + name +
                                      " (the part is " + dtype_name(sp.dtype) + ")");
    if (sp.gran != codec::Gran::Token && sp.gran != codec::Gran::Group)
      fail(Errc::InvalidArgument, std::string(name) +
                                      ": a codebook needs per-token or per-group scales "
                                      "(KVC_SCALE_PER_TOKEN or KVC_SCALE_PER_GROUP)");
    if (sp.asym || sp.full_range)
      fail(Errc::InvalidArgument, std::string(name) +
                                      ": a codebook replaces the symmetric level rule; set neither "
                                      "asymmetric nor full_range (its scale is each group's signed "
                                      "extreme)");
    if (sp.outliers)
      fail(Errc::InvalidArgument, std::string(name) + ": outliers and a codebook do not combine");
    const uint64_t row = static_cast<uint64_t>(cfg_.num_kv_heads) * cfg_.head_dim;
    if (sp.gran == codec::Gran::Group && (sp.group == 0 || row % sp.group != 0))
      fail(Errc::InvalidArgument,
           std::string(name) + ": group_size " + u64s(sp.group) +
               " does not divide a token's row of num_kv_heads x head_dim = " + u64s(row) +
               " values; a codebook's groups must tile it");
  }
  const uint64_t per_layer = bits ? (uint64_t{1} << bits) : 0;
  const uint64_t want = static_cast<uint64_t>(cfg_.num_layers) * per_layer;
  if (levels && count != want)
    fail(Errc::InvalidArgument,
         "count " + u64s(count) + " is not num_layers x 2^bits = " + u64s(want));
  require_empty_for("codebooks");
  std::shared_ptr<Codebook> cb;
  if (levels) {
    for (uint64_t i = 0; i < want; ++i) {
      auto at = [&] {
        return " at layer " + u64s(i / per_layer) + ", level " + u64s(i % per_layer);
      };
      if (!(std::isfinite(levels[i]) && levels[i] >= -1.0f && levels[i] <= 1.0f))
        fail(Errc::InvalidArgument, "level " + fmt_g(levels[i]) + at() + " is not in [-1, 1]");
      if (i % per_layer && !(levels[i] > levels[i - 1]))
        fail(Errc::InvalidArgument, "level " + fmt_g(levels[i]) + at() +
                                        " is not above the one before it (" + fmt_g(levels[i - 1]) +
                                        "): levels ascend strictly");
    }
    cb = std::make_shared<Codebook>();
    cb->per_layer = static_cast<uint32_t>(per_layer);
    cb->levels.assign(levels, levels + want);
    // The digest: "CBK1", the part, the levels per layer, the levels' bits, little-endian.
    std::vector<uint8_t> b;
    b.reserve(12 + 4 * want);
    append_le32(b, kCodebookTag);
    append_le32(b, static_cast<uint32_t>(kv));
    append_le32(b, cb->per_layer);
    for (float v : cb->levels) append_le32(b, f32_bits(v));
    digest128(b, cb->digest);
  }
  cfg_.codebook[kv] = cb;
  fmt_.codebook[kv] = cb;
}

}  // namespace kvc::core
