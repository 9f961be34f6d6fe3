// The pool: configuration, create / destroy, statistics, layout, device
// streams and block copies.
#include <cstddef>
#include <cstring>
#include <string>
#include <vector>

#include "api/api_int.h"
#include "core/arrays.h"
#include "core/sizing.h"

using namespace kvc::api;

namespace {

// Minimum struct sizes accepted (docs/abi-policy.md): the fields of the first
// release the library cannot do without. Fields past the caller's size take
// defaults (inputs) or are not written (outputs).
constexpr size_t kPoolConfigMin = offsetof(kvc_pool_config, capacity_bytes) + sizeof(uint64_t);
constexpr size_t kPoolStatsMin = offsetof(kvc_stats, blocks_shared) + sizeof(uint64_t);
constexpr size_t kPoolLayoutMin = offsetof(kvc_pool_layout, v_bytes) + sizeof(uint64_t);

kvc::core::PoolConfig to_core(const kvc_pool_config &c) {
  kvc::core::PoolConfig p;
  p.num_layers = c.num_layers;
  p.num_q_heads = c.num_q_heads;
  p.num_kv_heads = c.num_kv_heads;
  p.head_dim = c.head_dim;
  p.block_size = c.block_size;
  p.flags = c.flags;
  p.num_blocks = c.num_blocks;
  p.capacity_bytes = c.capacity_bytes;
  p.k_dtype = static_cast<DType>(c.k_dtype);
  p.v_dtype = static_cast<DType>(c.v_dtype);
  p.layout = static_cast<kvc::core::Layout>(c.layout);
  p.device = static_cast<kvc::core::Device>(c.device);
  p.device_index = c.device_index;
  p.residual_window = c.residual_window;
  p.residual_dtype = static_cast<DType>(c.residual_dtype);
  p.residual_fraction = c.residual_fraction;
  p.num_residual_blocks = c.num_residual_blocks;
  p.rope_style = static_cast<kvc::core::RopeStyle>(c.rope_style);
  p.rope_dims = c.rope_dims;
  p.rope_theta = c.rope_theta;
  p.residual_sinks = c.residual_sinks;
  for (int kv = 0; kv < 2; ++kv) {
    const kvc_codec *in = kv == 0 ? c.k_codec : c.v_codec;
    if (!in) continue;
    const char *name = kv == 0 ? "k_codec" : "v_codec";
    kvc::core::CodecSpec sp = to_spec(in, name, c.head_dim);
    if (kvc::is_float(sp.dtype)) {  // a float codec: plain storage of that dtype
      try {
        kvc::core::check_codec(sp, c.head_dim);
      } catch (const kvc::Error &e) {
        fail(e.code(), std::string(name) + ": " + e.what());
      }
      (kv == 0 ? p.k_dtype : p.v_dtype) = static_cast<DType>(sp.dtype);
      continue;
    }
    (kv == 0 ? p.k_codec : p.v_codec) = sp;
  }
  // Per-layer codecs: every layer's spec resolved (NULL entries: the pool's).
  if (c.layer_k_codecs || c.layer_v_codecs) {
    if (c.num_layers == 0 || c.num_layers > 4096)
      fail(kvc::Errc::InvalidArgument, "num_layers " + std::to_string(c.num_layers) +
                                           ": must be 1..4096 (with per-layer codecs)");
    for (int kv = 0; kv < 2; ++kv) {
      const kvc_codec *const *table = kv == 0 ? c.layer_k_codecs : c.layer_v_codecs;
      kvc::core::CodecSpec pool_spec = kv == 0 ? p.k_codec : p.v_codec;
      if (!(kv == 0 ? c.k_codec : c.v_codec) || kvc::is_float(pool_spec.dtype)) {
        pool_spec = kvc::core::CodecSpec{};  // plain storage
        pool_spec.dtype = kv == 0 ? p.k_dtype : p.v_dtype;
      }
      std::vector<kvc::core::CodecSpec> &out = p.layer_codec[kv];
      out.assign(c.num_layers, pool_spec);
      if (!table) continue;
      for (uint32_t l = 0; l < c.num_layers; ++l) {
        const kvc_codec *in = table[l];
        if (!in) continue;
        const std::string name =
            std::string(kv == 0 ? "layer_k_codecs[" : "layer_v_codecs[") + std::to_string(l) + "]";
        kvc::core::CodecSpec sp = to_spec(in, name.c_str(), c.head_dim);
        if (kvc::is_float(sp.dtype)) {  // a float codec: plain storage of that dtype
          try {
            kvc::core::check_codec(sp, c.head_dim);
          } catch (const kvc::Error &e) {
            fail(e.code(), name + ": " + e.what());
          }
          const kvc::DType d = static_cast<DType>(sp.dtype);
          sp = kvc::core::CodecSpec{};
          sp.dtype = d;
        }
        out[l] = sp;
      }
    }
  }
  return p;
}

void defaults(kvc_pool_config *c) {
  std::memset(c, 0, sizeof *c);
  c->struct_size = sizeof *c;
  c->block_size = 16;
  c->k_dtype = KVC_DTYPE_F16;
  c->v_dtype = KVC_DTYPE_F16;
  c->layout = KVC_LAYOUT_NHD;
  c->device = KVC_DEVICE_CPU;
  c->residual_dtype = KVC_DTYPE_F16;
  c->rope_theta = 10000.0;
}

}  // namespace

extern "C" {

// The 0.3 symbols of the init functions (the header's macros of the same
// names call the _sized functions): parenthesized, so the macros do not apply.
KVC_API kvc_status(kvc_pool_config_init)(kvc_pool_config *config) {
  return kvc_pool_config_init_sized(config, kvc::api::size_0_3<kvc_pool_config>);
}

KVC_API kvc_status kvc_pool_config_init_sized(kvc_pool_config *config, size_t struct_size) {
  return guard([&] {
    need(config, "config");
    kvc_pool_config d;
    defaults(&d);
    kvc::api::init_sized(config, struct_size, kPoolConfigMin, d);
  });
}

KVC_API kvc_status kvc_pool_create(const kvc_pool_config *config, kvc_pool **out) {
  return guard([&] {
    need(config, "config");
    need(out, "out");
    kvc_pool_config c;
    defaults(&c);
    // (A struct_size ending inside a field is refused: every field is
    // either the caller's or its default.)
    kvc::api::read_input_struct(config, kPoolConfigMin, "kvc_pool_config", &c);
    kvc::core::PoolConfig pc = to_core(c);
    *out = new kvc_pool(pc);
  });
}

KVC_API void kvc_pool_destroy(kvc_pool *pool) {
  delete pool;
}

KVC_API kvc_status kvc_pool_seq_bytes(const kvc_pool_config *config, uint64_t n_tokens,
                                      uint64_t *bytes, uint64_t *peak_bytes) {
  return guard([&] {
    need(config, "config");
    kvc_pool_config c;
    defaults(&c);
    kvc::api::read_input_struct(config, kPoolConfigMin, "kvc_pool_config", &c);
    const kvc::core::SeqSize s = kvc::core::seq_bytes(to_core(c), n_tokens);
    if (bytes) *bytes = s.bytes;
    if (peak_bytes) *peak_bytes = s.peak;
  });
}

KVC_API kvc_status(kvc_stats_init)(kvc_stats *stats) {
  return kvc_stats_init_sized(stats, kvc::api::size_0_3<kvc_stats>);
}

KVC_API kvc_status kvc_stats_init_sized(kvc_stats *stats, size_t struct_size) {
  return guard([&] {
    need(stats, "stats");
    kvc::api::init_sized(stats, struct_size, kPoolStatsMin, zeroed_struct<kvc_stats>());
  });
}

KVC_API kvc_status kvc_pool_stats(kvc_pool *pool, kvc_stats *stats) {
  return guard([&] {
    auto &p = core_of(pool);
    need(stats, "stats");
    kvc::api::check_output_struct(stats, kPoolStatsMin, "kvc_stats");
    const auto s = p.stats();
    kvc_stats full{};
    full.struct_size = sizeof full;
    full.blocks_total = s.blocks_total;
    full.blocks_free = s.blocks_free;
    full.blocks_cached = s.blocks_cached;
    full.blocks_used = s.blocks_used;
    full.blocks_shared = s.blocks_shared;
    full.bytes_per_block = s.bytes_per_block;
    full.bytes_per_token = s.bytes_per_token;
    full.bytes_total = s.bytes_total;
    full.bytes_in_use = s.bytes_in_use;
    full.peak_bytes_in_use = s.peak_bytes_in_use;
    full.num_sequences = s.num_sequences;
    full.residual_blocks_total = s.residual_blocks_total;
    full.residual_blocks_used = s.residual_blocks_used;
    full.residual_bytes_per_block = s.residual_bytes_per_block;
    full.tokens_stored = s.tokens_stored;
    kvc::api::write_output_struct(full, stats);
  });
}

KVC_API kvc_status kvc_pool_reset_peak(kvc_pool *pool) {
  return guard([&] { core_of(pool).reset_peak(); });
}

KVC_API kvc_status kvc_pool_set_stream(kvc_pool *pool, void *stream) {
  return guard([&] { core_of(pool).set_stream(stream); });
}

KVC_API kvc_status kvc_pool_sync(kvc_pool *pool) {
  return guard([&] { core_of(pool).sync(); });
}

KVC_API kvc_status kvc_pool_copy_blocks(kvc_pool *pool, const int32_t *blocks, size_t n_blocks,
                                        void *host, kvc_copy_direction direction) {
  return guard([&] {
    kvc::core::Pool &p = core_of(pool);
    const int32_t d = static_cast<int32_t>(direction);
    if (d != KVC_COPY_TO_HOST && d != KVC_COPY_FROM_HOST)
      kvc::fail(kvc::Errc::InvalidArgument, "direction " + std::to_string(d) +
                                                ": must be KVC_COPY_TO_HOST or KVC_COPY_FROM_HOST");
    if (n_blocks == 0) return;
    need(blocks, "blocks");
    need(host, "host");
    p.copy_blocks(blocks, n_blocks, host, d == KVC_COPY_TO_HOST);
  });
}

KVC_API kvc_status(kvc_pool_layout_init)(kvc_pool_layout *layout) {
  return kvc_pool_layout_init_sized(layout, kvc::api::size_0_3<kvc_pool_layout>);
}

KVC_API kvc_status kvc_pool_layout_init_sized(kvc_pool_layout *layout, size_t struct_size) {
  return guard([&] {
    need(layout, "layout");
    kvc::api::init_sized(layout, struct_size, kPoolLayoutMin, zeroed_struct<kvc_pool_layout>());
  });
}

KVC_API kvc_status kvc_pool_get_layout(kvc_pool *pool, kvc_pool_layout *layout) {
  return guard([&] {
    auto &p = core_of(pool);
    need(layout, "layout");
    kvc::api::check_output_struct(layout, kPoolLayoutMin, "kvc_pool_layout");
    const auto l = p.layout();
    const auto &c = p.config();
    kvc_pool_layout full{};
    full.struct_size = sizeof full;
    full.base = l.base;
    full.num_blocks = l.num_blocks;
    full.block_stride = l.block_stride;
    full.block_size = c.block_size;
    full.num_kv_heads = c.num_kv_heads;
    full.head_dim = c.head_dim;
    full.layout = static_cast<kvc_layout>(c.layout);
    full.k_dtype = static_cast<kvc_dtype>(l.part[0].spec.dtype);
    full.v_dtype = static_cast<kvc_dtype>(l.part[1].spec.dtype);
    full.k_offset = l.part[0].offset;
    full.k_token_stride = l.part[0].token_stride;
    full.k_head_stride = l.part[0].head_stride;
    full.k_bytes = l.part[0].bytes;
    full.v_offset = l.part[1].offset;
    full.v_token_stride = l.part[1].token_stride;
    full.v_head_stride = l.part[1].head_stride;
    full.v_bytes = l.part[1].bytes;
    full.k_codes_bytes = l.part[0].codes_bytes;
    full.k_scale_offset = l.part[0].scale_offset;
    full.k_zero_offset = l.part[0].zero_offset;
    full.k_scales_per_token = static_cast<uint32_t>(l.part[0].scales_per_token);
    full.k_scale_dtype = static_cast<kvc_dtype>(l.part[0].spec.scale_dtype);
    full.v_codes_bytes = l.part[1].codes_bytes;
    full.v_scale_offset = l.part[1].scale_offset;
    full.v_zero_offset = l.part[1].zero_offset;
    full.v_scales_per_token = static_cast<uint32_t>(l.part[1].scales_per_token);
    full.v_scale_dtype = static_cast<kvc_dtype>(l.part[1].spec.scale_dtype);
    full.k_granularity = static_cast<kvc_granularity>(l.part[0].spec.gran);
    full.k_group_size = l.part[0].spec.group;
    full.v_granularity = static_cast<kvc_granularity>(l.part[1].spec.gran);
    full.v_group_size = l.part[1].spec.group;
    full.residual_base = l.residual_base;
    full.residual_num_blocks = l.residual_num_blocks;
    full.residual_block_stride = l.residual_block_stride;
    full.residual_dtype = static_cast<kvc_dtype>(c.residual_dtype);
    full.device = static_cast<kvc_device>(c.device);
    full.device_index = c.device_index;
    kvc::api::write_output_struct(full, layout);
  });
}

KVC_API kvc_status kvc_pool_get_config(kvc_pool *pool, kvc_pool_config *config) {
  return guard([&] {
    auto &p = core_of(pool);
    need(config, "config");
    kvc::api::check_output_struct(config, kPoolConfigMin, "kvc_pool_config");
    const auto c = p.caller_config();  // a head-wise pool's as its caller gave it
    kvc_pool_config full;
    defaults(&full);
    full.num_layers = c.num_layers;
    full.num_q_heads = c.num_q_heads;
    full.num_kv_heads = c.num_kv_heads;
    full.head_dim = c.head_dim;
    full.block_size = c.block_size;
    full.flags = c.flags;
    full.num_blocks = c.num_blocks;
    full.capacity_bytes = c.capacity_bytes;
    full.k_dtype = static_cast<kvc_dtype>(c.k_dtype);
    full.v_dtype = static_cast<kvc_dtype>(c.v_dtype);
    full.layout = static_cast<kvc_layout>(c.layout);
    full.device = static_cast<kvc_device>(c.device);
    full.device_index = c.device_index;
    full.residual_window = c.residual_window;
    full.residual_dtype = static_cast<kvc_dtype>(c.residual_dtype);
    full.residual_fraction = c.residual_fraction;
    full.num_residual_blocks = c.num_residual_blocks;
    full.rope_style = static_cast<kvc_rope_style>(c.rope_style);
    full.rope_dims = c.rope_dims;
    full.rope_theta = c.rope_theta;
    full.residual_sinks = c.residual_sinks;
    kvc::api::write_output_struct(full, config);
  });
}

}  // extern "C"
