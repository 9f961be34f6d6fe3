// The fields of every public struct that follows the struct_size rule
// (docs/abi-policy.md), for src/api/struct_io.h: a caller's struct_size must
// not end inside a field, and the old kvc_<thing>_init symbols fill the
// struct's 0.3 size forever.
//
// Appending a field to a struct in kvcache.h means appending it here too:
// check_table() below fails the build otherwise (it sees the grown sizeof).
#pragma once
#include <cstddef>

#include "kvcache/kvcache.h"

namespace kvc::api {

struct Field {
  size_t offset;
  size_t size;
  const char *name;
};

// StructInfo<T>: `name`, `fields` (in order, from struct_size on) and
// `size_0_3`, the struct's sizeof in 0.3 (what the 0.3 init symbols fill).
template <typename T>
struct StructInfo;

#define KVC_FIELD(T, f)              \
  Field {                            \
    offsetof(T, f), sizeof(T::f), #f \
  }
// The end of a field: the smallest struct_size that covers it.
#define KVC_FIELD_END(T, f) (offsetof(T, f) + sizeof(T::f))

template <>
struct StructInfo<kvc_codec> {
  static constexpr const char *name = "kvc_codec";
  static constexpr Field fields[] = {
      KVC_FIELD(kvc_codec, struct_size),  KVC_FIELD(kvc_codec, dtype),
      KVC_FIELD(kvc_codec, granularity),  KVC_FIELD(kvc_codec, group_size),
      KVC_FIELD(kvc_codec, asymmetric),   KVC_FIELD(kvc_codec, scale_dtype),
      KVC_FIELD(kvc_codec, rotation),     KVC_FIELD(kvc_codec, rotation_block),
      KVC_FIELD(kvc_codec, static_scale), KVC_FIELD(kvc_codec, scale),
      KVC_FIELD(kvc_codec, full_range),  // 0.3
      KVC_FIELD(kvc_codec, reserved0),   // 0.4
      KVC_FIELD(kvc_codec, outliers),
  };
  static constexpr size_t size_0_3 = 56;
  static constexpr size_t end_0_3 = KVC_FIELD_END(kvc_codec, full_range);
};

template <>
struct StructInfo<kvc_pool_config> {
  static constexpr const char *name = "kvc_pool_config";
  static constexpr Field fields[] = {
      KVC_FIELD(kvc_pool_config, struct_size),
      KVC_FIELD(kvc_pool_config, num_layers),
      KVC_FIELD(kvc_pool_config, num_q_heads),
      KVC_FIELD(kvc_pool_config, num_kv_heads),
      KVC_FIELD(kvc_pool_config, head_dim),
      KVC_FIELD(kvc_pool_config, block_size),
      KVC_FIELD(kvc_pool_config, flags),
      KVC_FIELD(kvc_pool_config, num_blocks),
      KVC_FIELD(kvc_pool_config, capacity_bytes),
      KVC_FIELD(kvc_pool_config, k_dtype),
      KVC_FIELD(kvc_pool_config, v_dtype),
      KVC_FIELD(kvc_pool_config, layout),
      KVC_FIELD(kvc_pool_config, device),
      KVC_FIELD(kvc_pool_config, device_index),
      KVC_FIELD(kvc_pool_config, k_codec),  // 0.2
      KVC_FIELD(kvc_pool_config, v_codec),
      KVC_FIELD(kvc_pool_config, residual_window),
      KVC_FIELD(kvc_pool_config, residual_dtype),
      KVC_FIELD(kvc_pool_config, residual_fraction),
      KVC_FIELD(kvc_pool_config, num_residual_blocks),
      KVC_FIELD(kvc_pool_config, rope_style),  // 0.3
      KVC_FIELD(kvc_pool_config, rope_dims),
      KVC_FIELD(kvc_pool_config, rope_theta),
      KVC_FIELD(kvc_pool_config, residual_sinks),
      KVC_FIELD(kvc_pool_config, layer_k_codecs),  // 0.4
      KVC_FIELD(kvc_pool_config, layer_v_codecs),
  };
  static constexpr size_t size_0_3 = 136;
  static constexpr size_t end_0_3 = KVC_FIELD_END(kvc_pool_config, residual_sinks);
};

template <>
struct StructInfo<kvc_stats> {
  static constexpr const char *name = "kvc_stats";
  static constexpr Field fields[] = {
      KVC_FIELD(kvc_stats, struct_size),           KVC_FIELD(kvc_stats, blocks_total),
      KVC_FIELD(kvc_stats, blocks_free),           KVC_FIELD(kvc_stats, blocks_cached),
      KVC_FIELD(kvc_stats, blocks_used),           KVC_FIELD(kvc_stats, blocks_shared),
      KVC_FIELD(kvc_stats, bytes_per_block),       KVC_FIELD(kvc_stats, bytes_per_token),
      KVC_FIELD(kvc_stats, bytes_total),           KVC_FIELD(kvc_stats, bytes_in_use),
      KVC_FIELD(kvc_stats, peak_bytes_in_use),     KVC_FIELD(kvc_stats, num_sequences),
      KVC_FIELD(kvc_stats, residual_blocks_total),  // 0.2
      KVC_FIELD(kvc_stats, residual_blocks_used),  KVC_FIELD(kvc_stats, residual_bytes_per_block),
      KVC_FIELD(kvc_stats, tokens_stored),
  };
  static constexpr size_t size_0_3 = 128;
  static constexpr size_t end_0_3 = KVC_FIELD_END(kvc_stats, tokens_stored);
};

template <>
struct StructInfo<kvc_pool_layout> {
  static constexpr const char *name = "kvc_pool_layout";
  static constexpr Field fields[] = {
      KVC_FIELD(kvc_pool_layout, struct_size),
      KVC_FIELD(kvc_pool_layout, base),
      KVC_FIELD(kvc_pool_layout, num_blocks),
      KVC_FIELD(kvc_pool_layout, block_stride),
      KVC_FIELD(kvc_pool_layout, block_size),
      KVC_FIELD(kvc_pool_layout, num_kv_heads),
      KVC_FIELD(kvc_pool_layout, head_dim),
      KVC_FIELD(kvc_pool_layout, layout),
      KVC_FIELD(kvc_pool_layout, k_dtype),
      KVC_FIELD(kvc_pool_layout, v_dtype),
      KVC_FIELD(kvc_pool_layout, k_offset),
      KVC_FIELD(kvc_pool_layout, k_token_stride),
      KVC_FIELD(kvc_pool_layout, k_head_stride),
      KVC_FIELD(kvc_pool_layout, k_bytes),
      KVC_FIELD(kvc_pool_layout, v_offset),
      KVC_FIELD(kvc_pool_layout, v_token_stride),
      KVC_FIELD(kvc_pool_layout, v_head_stride),
      KVC_FIELD(kvc_pool_layout, v_bytes),
      KVC_FIELD(kvc_pool_layout, device),
      KVC_FIELD(kvc_pool_layout, device_index),
      KVC_FIELD(kvc_pool_layout, k_codes_bytes),  // 0.2
      KVC_FIELD(kvc_pool_layout, k_scale_offset),
      KVC_FIELD(kvc_pool_layout, k_zero_offset),
      KVC_FIELD(kvc_pool_layout, k_scales_per_token),
      KVC_FIELD(kvc_pool_layout, k_scale_dtype),
      KVC_FIELD(kvc_pool_layout, v_codes_bytes),
      KVC_FIELD(kvc_pool_layout, v_scale_offset),
      KVC_FIELD(kvc_pool_layout, v_zero_offset),
      KVC_FIELD(kvc_pool_layout, v_scales_per_token),
      KVC_FIELD(kvc_pool_layout, v_scale_dtype),
      KVC_FIELD(kvc_pool_layout, k_granularity),
      KVC_FIELD(kvc_pool_layout, k_group_size),
      KVC_FIELD(kvc_pool_layout, v_granularity),
      KVC_FIELD(kvc_pool_layout, v_group_size),
      KVC_FIELD(kvc_pool_layout, residual_base),
      KVC_FIELD(kvc_pool_layout, residual_num_blocks),
      KVC_FIELD(kvc_pool_layout, residual_block_stride),
      KVC_FIELD(kvc_pool_layout, residual_dtype),
      KVC_FIELD(kvc_pool_layout, reserved0),
  };
  static constexpr size_t size_0_3 = 240;
  static constexpr size_t end_0_3 = KVC_FIELD_END(kvc_pool_layout, reserved0);
};

template <>
struct StructInfo<kvc_quant_sizes> {
  static constexpr const char *name = "kvc_quant_sizes";
  static constexpr Field fields[] = {
      KVC_FIELD(kvc_quant_sizes, struct_size),  KVC_FIELD(kvc_quant_sizes, codes_bytes),
      KVC_FIELD(kvc_quant_sizes, scales_bytes), KVC_FIELD(kvc_quant_sizes, zeros_bytes),
      KVC_FIELD(kvc_quant_sizes, num_scales),
  };
  static constexpr size_t size_0_3 = 40;
  static constexpr size_t end_0_3 = KVC_FIELD_END(kvc_quant_sizes, num_scales);
};

template <>
struct StructInfo<kvc_attention_params> {
  static constexpr const char *name = "kvc_attention_params";
  static constexpr Field fields[] = {
      KVC_FIELD(kvc_attention_params, struct_size), KVC_FIELD(kvc_attention_params, num_q_heads),
      KVC_FIELD(kvc_attention_params, scale),       KVC_FIELD(kvc_attention_params, q_dtype),
      KVC_FIELD(kvc_attention_params, out_dtype),   KVC_FIELD(kvc_attention_params, observe),
      KVC_FIELD(kvc_attention_params, num_threads), KVC_FIELD(kvc_attention_params, observe_from),
      KVC_FIELD(kvc_attention_params, query_quant),  // 0.4
  };
  static constexpr size_t size_0_3 = 40;
  static constexpr size_t end_0_3 = KVC_FIELD_END(kvc_attention_params, observe_from);
};

template <>
struct StructInfo<kvc_policy_config> {
  static constexpr const char *name = "kvc_policy_config";
  static constexpr Field fields[] = {
      KVC_FIELD(kvc_policy_config, struct_size),
      KVC_FIELD(kvc_policy_config, kind),
      KVC_FIELD(kvc_policy_config, sink_tokens),
      KVC_FIELD(kvc_policy_config, budget_tokens),
      KVC_FIELD(kvc_policy_config, compression_ratio),
      KVC_FIELD(kvc_policy_config, recent_tokens),
      KVC_FIELD(kvc_policy_config, window),
      KVC_FIELD(kvc_policy_config, recent_fraction),
      KVC_FIELD(kvc_policy_config, kernel_size),
      KVC_FIELD(kvc_policy_config, pooling),
      KVC_FIELD(kvc_policy_config, schedule),
      KVC_FIELD(kvc_policy_config, beta),
      KVC_FIELD(kvc_policy_config, shift_positions),
      KVC_FIELD(kvc_policy_config, auto_evict),
      KVC_FIELD(kvc_policy_config, plugin),
      KVC_FIELD(kvc_policy_config, future_positions),  // 0.4
      KVC_FIELD(kvc_policy_config, head_budget),       // 0.4
      KVC_FIELD(kvc_policy_config, head_floor),        // 0.4
      KVC_FIELD(kvc_policy_config, head_gates),        // 0.4
      KVC_FIELD(kvc_policy_config, num_head_gates),    // 0.4
      KVC_FIELD(kvc_policy_config, gate_threshold),    // 0.4
  };
  static constexpr size_t size_0_3 = 88;
  static constexpr size_t end_0_3 = KVC_FIELD_END(kvc_policy_config, plugin);
};

template <>
struct StructInfo<kvc_prefix_config> {
  static constexpr const char *name = "kvc_prefix_config";
  static constexpr Field fields[] = {
      KVC_FIELD(kvc_prefix_config, struct_size),
      KVC_FIELD(kvc_prefix_config, hash),
      KVC_FIELD(kvc_prefix_config, verify_tokens),
      KVC_FIELD(kvc_prefix_config, seed_set),
      KVC_FIELD(kvc_prefix_config, seed),
      KVC_FIELD(kvc_prefix_config, model_id),
      KVC_FIELD(kvc_prefix_config, tokenizer_id),
      KVC_FIELD(kvc_prefix_config, extra_key_names),
      KVC_FIELD(kvc_prefix_config, n_extra_key_names),
  };
  static constexpr size_t size_0_3 = 72;
  static constexpr size_t end_0_3 = KVC_FIELD_END(kvc_prefix_config, tokenizer_id);
};

template <>
struct StructInfo<kvc_prefix_result> {
  static constexpr const char *name = "kvc_prefix_result";
  static constexpr Field fields[] = {
      KVC_FIELD(kvc_prefix_result, struct_size), KVC_FIELD(kvc_prefix_result, hit_tokens),
      KVC_FIELD(kvc_prefix_result, hit_blocks),  KVC_FIELD(kvc_prefix_result, partial_tokens),
      KVC_FIELD(kvc_prefix_result, tier_tokens), KVC_FIELD(kvc_prefix_result, pin),
  };
  static constexpr size_t size_0_3 = 48;
  static constexpr size_t end_0_3 = KVC_FIELD_END(kvc_prefix_result, pin);
};

template <>
struct StructInfo<kvc_prefix_stats> {
  static constexpr const char *name = "kvc_prefix_stats";
  static constexpr Field fields[] = {
      KVC_FIELD(kvc_prefix_stats, struct_size),
      KVC_FIELD(kvc_prefix_stats, queried_tokens),
      KVC_FIELD(kvc_prefix_stats, hit_tokens),
      KVC_FIELD(kvc_prefix_stats, partial_tokens),
      KVC_FIELD(kvc_prefix_stats, registered_blocks),
      KVC_FIELD(kvc_prefix_stats, reclaimable_blocks),
      KVC_FIELD(kvc_prefix_stats, referenced_blocks),
      KVC_FIELD(kvc_prefix_stats, stored_total),
      KVC_FIELD(kvc_prefix_stats, removed_total),
      KVC_FIELD(kvc_prefix_stats, reclaimed_total),
  };
  static constexpr size_t size_0_3 = 80;
  static constexpr size_t end_0_3 = KVC_FIELD_END(kvc_prefix_stats, reclaimed_total);
};

template <>
struct StructInfo<kvc_tier_config> {
  static constexpr const char *name = "kvc_tier_config";
  static constexpr Field fields[] = {
      KVC_FIELD(kvc_tier_config, struct_size), KVC_FIELD(kvc_tier_config, kind),
      KVC_FIELD(kvc_tier_config, flags),       KVC_FIELD(kvc_tier_config, capacity_bytes),
      KVC_FIELD(kvc_tier_config, path),        KVC_FIELD(kvc_tier_config, address),
      KVC_FIELD(kvc_tier_config, timeout_ms),  KVC_FIELD(kvc_tier_config, reserved),
      KVC_FIELD(kvc_tier_config, ttl_seconds),
  };
  static constexpr size_t size_0_3 = 56;
  static constexpr size_t end_0_3 = KVC_FIELD_END(kvc_tier_config, ttl_seconds);
};

template <>
struct StructInfo<kvc_tier_stats> {
  static constexpr const char *name = "kvc_tier_stats";
  static constexpr Field fields[] = {
      KVC_FIELD(kvc_tier_stats, struct_size), KVC_FIELD(kvc_tier_stats, kind),
      KVC_FIELD(kvc_tier_stats, reserved),    KVC_FIELD(kvc_tier_stats, bytes),
      KVC_FIELD(kvc_tier_stats, entries),     KVC_FIELD(kvc_tier_stats, hits),
      KVC_FIELD(kvc_tier_stats, misses),      KVC_FIELD(kvc_tier_stats, demotions),
      KVC_FIELD(kvc_tier_stats, promotions),  KVC_FIELD(kvc_tier_stats, drops),
      KVC_FIELD(kvc_tier_stats, evictions),   KVC_FIELD(kvc_tier_stats, errors),
      KVC_FIELD(kvc_tier_stats, pinned),      KVC_FIELD(kvc_tier_stats, last_error),
  };
  static constexpr size_t size_0_3 = 352;
  static constexpr size_t end_0_3 = KVC_FIELD_END(kvc_tier_stats, last_error);
};

#undef KVC_FIELD
#undef KVC_FIELD_END

// The alignment a field of `size` bytes has at most in these structs (all
// scalars are naturally aligned; arrays are of bytes).
constexpr size_t max_field_align(size_t size) {
  return size == 1 || size == 2 || size == 4 || size == 8 ? size : 1;
}

// The table of T is complete and in order: it starts with struct_size, its
// fields do not overlap, no gap between two of them could hold a field it
// lacks, and the struct's sizeof leaves no room for one after the last (so a
// field appended to the header without an entry here fails the build). The
// 0.3 size is the 0.3 fields rounded up to the struct's alignment, and fits.
template <typename T>
constexpr bool check_table() {
  const auto &f = StructInfo<T>::fields;
  const size_t n = sizeof f / sizeof f[0];
  if (f[0].offset != 0 || f[0].size != sizeof(size_t)) return false;
  for (size_t i = 1; i < n; ++i) {
    const size_t prev_end = f[i - 1].offset + f[i - 1].size;
    if (f[i].offset < prev_end || f[i].offset - prev_end >= max_field_align(f[i].size))
      return false;
  }
  const size_t last_end = f[n - 1].offset + f[n - 1].size;
  if (last_end > sizeof(T) || sizeof(T) - last_end >= alignof(T)) return false;
  const size_t s03 = StructInfo<T>::size_0_3;
  const size_t e03 = StructInfo<T>::end_0_3;
  return s03 % alignof(T) == 0 && s03 >= e03 && s03 - e03 < alignof(T) && s03 <= sizeof(T);
}

#define KVC_CHECK_TABLE(T) \
  static_assert(check_table<T>(), #T ": src/api/struct_fields.h does not match kvcache.h")
KVC_CHECK_TABLE(kvc_codec);
KVC_CHECK_TABLE(kvc_pool_config);
KVC_CHECK_TABLE(kvc_stats);
KVC_CHECK_TABLE(kvc_pool_layout);
KVC_CHECK_TABLE(kvc_quant_sizes);
KVC_CHECK_TABLE(kvc_attention_params);
KVC_CHECK_TABLE(kvc_policy_config);
KVC_CHECK_TABLE(kvc_prefix_config);
KVC_CHECK_TABLE(kvc_prefix_result);
KVC_CHECK_TABLE(kvc_prefix_stats);
KVC_CHECK_TABLE(kvc_tier_config);
KVC_CHECK_TABLE(kvc_tier_stats);
#undef KVC_CHECK_TABLE

}  // namespace kvc::api
