/*
 * Compile-time layout checks of every public struct of kvcache.h on x86-64
 * LP64 (the ABI the baseline in tests/abi/libkvcache.abi records). A field
 * moved, resized or inserted anywhere but at the end fails the build; a field
 * appended at the end fails too, on purpose: update the sizes below in the
 * same change and record it in CHANGELOG.md (docs/abi-policy.md).
 *
 * Built as C11 (for _Static_assert). The run-time part only says whether the
 * checks applied: exit 77 (skipped) on other targets.
 */
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "kvcache/kvcache.h"

#if defined(__x86_64__) && defined(__LP64__)
#define KVC_LAYOUT_CHECKED 1

#define OFF(type, field, off) \
  _Static_assert(offsetof(type, field) == (off), #type "." #field " moved")
#define FSIZE(type, field, sz) \
  _Static_assert(sizeof(((type *)0)->field) == (sz), #type "." #field " changed size")
#define FIELD(type, field, off, sz) \
  OFF(type, field, off);            \
  FSIZE(type, field, sz)
#define SIZE(type, sz) _Static_assert(sizeof(type) == (sz), "sizeof(" #type ") changed")

/* ---- enums: 32-bit, fixed values ---- */
SIZE(kvc_status, 4);
SIZE(kvc_dtype, 4);
SIZE(kvc_device, 4);
SIZE(kvc_layout, 4);
SIZE(kvc_copy_direction, 4);
SIZE(kvc_granularity, 4);
SIZE(kvc_rotation, 4);
_Static_assert(KVC_DTYPE_FP8_E4M3 == 3 && KVC_DTYPE_FP8_E5M2 == 4 && KVC_DTYPE_INT8 == 5 &&
                   KVC_DTYPE_INT4 == 6 && KVC_DTYPE_INT2 == 7, "dtype values");
_Static_assert(KVC_SCALE_NONE == 0 && KVC_SCALE_PER_TENSOR == 1 && KVC_SCALE_PER_TOKEN == 2 &&
                   KVC_SCALE_PER_GROUP == 3 && KVC_SCALE_PER_CHANNEL == 4, "granularity values");
_Static_assert(KVC_ROTATION_NONE == 0 && KVC_ROTATION_HADAMARD == 1, "rotation values");
_Static_assert(KVC_OK == 0, "status value");
_Static_assert(KVC_ERR_INVALID_ARGUMENT == 1, "status value");
_Static_assert(KVC_ERR_NULL_POINTER == 2, "status value");
_Static_assert(KVC_ERR_STRUCT_SIZE == 3, "status value");
_Static_assert(KVC_ERR_UNSUPPORTED == 4, "status value");
_Static_assert(KVC_ERR_OVERFLOW == 5, "status value");
_Static_assert(KVC_ERR_OUT_OF_MEMORY == 6, "status value");
_Static_assert(KVC_ERR_POOL_EXHAUSTED == 7, "status value");
_Static_assert(KVC_ERR_SEQ_NOT_FOUND == 8, "status value");
_Static_assert(KVC_ERR_SEQ_EXISTS == 9, "status value");
_Static_assert(KVC_ERR_OUT_OF_RANGE == 10, "status value");
_Static_assert(KVC_ERR_NOT_RESERVED == 11, "status value");
_Static_assert(KVC_ERR_BUFFER_TOO_SMALL == 12, "status value");
_Static_assert(KVC_ERR_DEVICE_UNAVAILABLE == 13, "status value");
_Static_assert(KVC_ERR_VERSION == 14, "status value");
_Static_assert(KVC_ERR_INVALID_SCALE == 15, "status value");
_Static_assert(KVC_ERR_NON_FINITE == 16, "status value");
_Static_assert(KVC_ERR_INTERNAL == 17, "status value");
_Static_assert(KVC_ERR_INCOMPATIBLE == 18, "status value");
_Static_assert(KVC_ERR_CORRUPT == 19, "status value");
_Static_assert(KVC_ERR_IO == 20, "status value");
_Static_assert(KVC_ERR_PENDING == 21, "status value");
_Static_assert(KVC_ERR_TIMEOUT == 22, "status value");
_Static_assert(KVC_STATUS_FORCE_32BIT == 0x7fffffff, "status sentinel");
_Static_assert(KVC_STATUS_FORCE_SIGNED == INT32_MIN && KVC_PREFIX_EVENT_FORCE_SIGNED == INT32_MIN,
               "signed enums (0.4)");
_Static_assert(KVC_STRUCT_SIZE_MAX == 65536u, "struct_size bound (0.4)");
/* Every enum is signed (a FORCE_SIGNED member, 0.4 for kvc_status and
 * kvc_prefix_event_kind): bindgen and every binding see int32. */
#define SIGNED_ENUM(type) _Static_assert((type)-1 < 0, #type " is not signed")
SIGNED_ENUM(kvc_status);
SIGNED_ENUM(kvc_dtype);
SIGNED_ENUM(kvc_device);
SIGNED_ENUM(kvc_layout);
SIGNED_ENUM(kvc_granularity);
SIGNED_ENUM(kvc_rotation);
SIGNED_ENUM(kvc_rope_style);
SIGNED_ENUM(kvc_copy_direction);
SIGNED_ENUM(kvc_observe);
SIGNED_ENUM(kvc_query_quant);
SIGNED_ENUM(kvc_policy_kind);
SIGNED_ENUM(kvc_pooling);
SIGNED_ENUM(kvc_pyramid_schedule);
SIGNED_ENUM(kvc_prefix_hash);
SIGNED_ENUM(kvc_prefix_event_kind);
SIGNED_ENUM(kvc_tier_kind);
SIGNED_ENUM(kvc_llama_type);
_Static_assert(KVC_DTYPE_F32 == 0 && KVC_DTYPE_F16 == 1 && KVC_DTYPE_BF16 == 2, "dtype values");
_Static_assert(KVC_DEVICE_CPU == 0 && KVC_DEVICE_CUDA == 1, "device values");
_Static_assert(KVC_LAYOUT_NHD == 0 && KVC_LAYOUT_HND == 1, "layout values");
_Static_assert(KVC_POOL_ZERO_ON_FREE == 0x1u, "flag value");
_Static_assert(KVC_API_VERSION >= 1, "api version");

/* ---- kvc_pool_config (minimum accepted size: through capacity_bytes = 48) ---- */
FIELD(kvc_pool_config, struct_size, 0, 8);
FIELD(kvc_pool_config, num_layers, 8, 4);
FIELD(kvc_pool_config, num_q_heads, 12, 4);
FIELD(kvc_pool_config, num_kv_heads, 16, 4);
FIELD(kvc_pool_config, head_dim, 20, 4);
FIELD(kvc_pool_config, block_size, 24, 4);
FIELD(kvc_pool_config, flags, 28, 4);
FIELD(kvc_pool_config, num_blocks, 32, 8);
FIELD(kvc_pool_config, capacity_bytes, 40, 8);
FIELD(kvc_pool_config, k_dtype, 48, 4);
FIELD(kvc_pool_config, v_dtype, 52, 4);
FIELD(kvc_pool_config, layout, 56, 4);
FIELD(kvc_pool_config, device, 60, 4);
FIELD(kvc_pool_config, device_index, 64, 4);
FIELD(kvc_pool_config, k_codec, 72, 8); /* 0.2 */
FIELD(kvc_pool_config, v_codec, 80, 8); /* 0.2 */
FIELD(kvc_pool_config, residual_window, 88, 4);
FIELD(kvc_pool_config, residual_dtype, 92, 4);
FIELD(kvc_pool_config, residual_fraction, 96, 8);
FIELD(kvc_pool_config, num_residual_blocks, 104, 8);
FIELD(kvc_pool_config, rope_style, 112, 4); /* 0.3 */
FIELD(kvc_pool_config, rope_dims, 116, 4);
FIELD(kvc_pool_config, rope_theta, 120, 8);
FIELD(kvc_pool_config, residual_sinks, 128, 4);
FIELD(kvc_pool_config, layer_k_codecs, 136, 8); /* 0.4 */
FIELD(kvc_pool_config, layer_v_codecs, 144, 8); /* 0.4 */
SIZE(kvc_pool_config, 152);

/* ---- kvc_stats (minimum accepted size: through blocks_shared = 48) ---- */
FIELD(kvc_stats, struct_size, 0, 8);
FIELD(kvc_stats, blocks_total, 8, 8);
FIELD(kvc_stats, blocks_free, 16, 8);
FIELD(kvc_stats, blocks_cached, 24, 8);
FIELD(kvc_stats, blocks_used, 32, 8);
FIELD(kvc_stats, blocks_shared, 40, 8);
FIELD(kvc_stats, bytes_per_block, 48, 8);
FIELD(kvc_stats, bytes_per_token, 56, 8);
FIELD(kvc_stats, bytes_total, 64, 8);
FIELD(kvc_stats, bytes_in_use, 72, 8);
FIELD(kvc_stats, peak_bytes_in_use, 80, 8);
FIELD(kvc_stats, num_sequences, 88, 8);
FIELD(kvc_stats, residual_blocks_total, 96, 8); /* 0.2 */
FIELD(kvc_stats, residual_blocks_used, 104, 8);
FIELD(kvc_stats, residual_bytes_per_block, 112, 8);
FIELD(kvc_stats, tokens_stored, 120, 8);
SIZE(kvc_stats, 128);

/* ---- kvc_pool_layout (minimum accepted size: through v_bytes = 120) ---- */
FIELD(kvc_pool_layout, struct_size, 0, 8);
FIELD(kvc_pool_layout, base, 8, 8);
FIELD(kvc_pool_layout, num_blocks, 16, 8);
FIELD(kvc_pool_layout, block_stride, 24, 8);
FIELD(kvc_pool_layout, block_size, 32, 4);
FIELD(kvc_pool_layout, num_kv_heads, 36, 4);
FIELD(kvc_pool_layout, head_dim, 40, 4);
FIELD(kvc_pool_layout, layout, 44, 4);
FIELD(kvc_pool_layout, k_dtype, 48, 4);
FIELD(kvc_pool_layout, v_dtype, 52, 4);
FIELD(kvc_pool_layout, k_offset, 56, 8);
FIELD(kvc_pool_layout, k_token_stride, 64, 8);
FIELD(kvc_pool_layout, k_head_stride, 72, 8);
FIELD(kvc_pool_layout, k_bytes, 80, 8);
FIELD(kvc_pool_layout, v_offset, 88, 8);
FIELD(kvc_pool_layout, v_token_stride, 96, 8);
FIELD(kvc_pool_layout, v_head_stride, 104, 8);
FIELD(kvc_pool_layout, v_bytes, 112, 8);
FIELD(kvc_pool_layout, device, 120, 4);
FIELD(kvc_pool_layout, device_index, 124, 4);
FIELD(kvc_pool_layout, k_codes_bytes, 128, 8); /* 0.2 */
FIELD(kvc_pool_layout, k_scale_offset, 136, 8);
FIELD(kvc_pool_layout, k_zero_offset, 144, 8);
FIELD(kvc_pool_layout, k_scales_per_token, 152, 4);
FIELD(kvc_pool_layout, k_scale_dtype, 156, 4);
FIELD(kvc_pool_layout, v_codes_bytes, 160, 8);
FIELD(kvc_pool_layout, v_scale_offset, 168, 8);
FIELD(kvc_pool_layout, v_zero_offset, 176, 8);
FIELD(kvc_pool_layout, v_scales_per_token, 184, 4);
FIELD(kvc_pool_layout, v_scale_dtype, 188, 4);
FIELD(kvc_pool_layout, k_granularity, 192, 4);
FIELD(kvc_pool_layout, k_group_size, 196, 4);
FIELD(kvc_pool_layout, v_granularity, 200, 4);
FIELD(kvc_pool_layout, v_group_size, 204, 4);
FIELD(kvc_pool_layout, residual_base, 208, 8);
FIELD(kvc_pool_layout, residual_num_blocks, 216, 8);
FIELD(kvc_pool_layout, residual_block_stride, 224, 8);
FIELD(kvc_pool_layout, residual_dtype, 232, 4);
FIELD(kvc_pool_layout, reserved0, 236, 4);
SIZE(kvc_pool_layout, 240);

/* ---- kvc_codec (0.2; minimum accepted size: 48, up to scale; full_range 0.3) ---- */
FIELD(kvc_codec, struct_size, 0, 8);
FIELD(kvc_codec, dtype, 8, 4);
FIELD(kvc_codec, granularity, 12, 4);
FIELD(kvc_codec, group_size, 16, 4);
FIELD(kvc_codec, asymmetric, 20, 4);
FIELD(kvc_codec, scale_dtype, 24, 4);
FIELD(kvc_codec, rotation, 28, 4);
FIELD(kvc_codec, rotation_block, 32, 4);
FIELD(kvc_codec, static_scale, 36, 4);
FIELD(kvc_codec, scale, 40, 8);
FIELD(kvc_codec, full_range, 48, 4);
FIELD(kvc_codec, reserved0, 52, 4); /* 0.4: the 0.3 tail padding, made explicit */
FIELD(kvc_codec, outliers, 56, 4);
SIZE(kvc_codec, 64);

/* ---- kvc_quant_sizes (0.2) ---- */
FIELD(kvc_quant_sizes, struct_size, 0, 8);
FIELD(kvc_quant_sizes, codes_bytes, 8, 8);
FIELD(kvc_quant_sizes, scales_bytes, 16, 8);
FIELD(kvc_quant_sizes, zeros_bytes, 24, 8);
FIELD(kvc_quant_sizes, num_scales, 32, 8);
SIZE(kvc_quant_sizes, 40);

/* ---- kvc_api: the function table only grows at the end ---- */
FIELD(kvc_api, struct_size, 0, 8);
FIELD(kvc_api, api_version, 8, 4);
FIELD(kvc_api, reserved, 12, 4);
/* version 1 */
FIELD(kvc_api, version, 16, 8);
FIELD(kvc_api, version_string, 24, 8);
FIELD(kvc_api, status_string, 32, 8);
FIELD(kvc_api, last_error_message, 40, 8);
FIELD(kvc_api, pool_config_init, 48, 8);
FIELD(kvc_api, pool_create, 56, 8);
FIELD(kvc_api, pool_destroy, 64, 8);
FIELD(kvc_api, stats_init, 72, 8);
FIELD(kvc_api, pool_stats, 80, 8);
FIELD(kvc_api, pool_reset_peak, 88, 8);
FIELD(kvc_api, pool_layout_init, 96, 8);
FIELD(kvc_api, pool_get_layout, 104, 8);
FIELD(kvc_api, pool_get_config, 112, 8);
FIELD(kvc_api, seq_create, 120, 8);
FIELD(kvc_api, seq_fork, 128, 8);
FIELD(kvc_api, seq_truncate, 136, 8);
FIELD(kvc_api, seq_free, 144, 8);
FIELD(kvc_api, seq_length, 152, 8);
FIELD(kvc_api, seq_layer_tokens, 160, 8);
FIELD(kvc_api, seq_reserve, 168, 8);
FIELD(kvc_api, append, 176, 8);
FIELD(kvc_api, gather, 184, 8);
FIELD(kvc_api, seq_block_table, 192, 8);
FIELD(kvc_api, export_page_table, 200, 8);
FIELD(kvc_api, convert, 208, 8);
FIELD(kvc_api, dtype_size, 216, 8); /* end of version 1 (224 bytes) */
FIELD(kvc_api, codec_init, 224, 8);
FIELD(kvc_api, pool_tensor_scales, 232, 8);
FIELD(kvc_api, quant_sizes_init, 240, 8);
FIELD(kvc_api, quantize_sizes, 248, 8);
FIELD(kvc_api, quantize, 256, 8);
FIELD(kvc_api, dequantize, 264, 8);
/* end of version 2 (272 bytes) */
FIELD(kvc_api, attention_params_init, 272, 8); /* version 3 */
FIELD(kvc_api, attention_decode, 280, 8);
FIELD(kvc_api, attention_prefill, 288, 8);
FIELD(kvc_api, seq_observe_scores, 296, 8);
FIELD(kvc_api, seq_scores, 304, 8);
FIELD(kvc_api, seq_rope_positions, 312, 8);
FIELD(kvc_api, policy_config_init, 320, 8);
FIELD(kvc_api, policy_create, 328, 8);
FIELD(kvc_api, policy_destroy, 336, 8);
FIELD(kvc_api, seq_set_policy, 344, 8);
FIELD(kvc_api, pool_set_policy, 352, 8);
FIELD(kvc_api, evict, 360, 8);
FIELD(kvc_api, plugin_load, 368, 8);
FIELD(kvc_api, plugin_unload, 376, 8);
FIELD(kvc_api, plugin_name, 384, 8);
FIELD(kvc_api, prefix_config_init, 392, 8);
FIELD(kvc_api, pool_enable_prefix_cache, 400, 8);
FIELD(kvc_api, prefix_lookup, 408, 8);
FIELD(kvc_api, prefix_attach, 416, 8);
FIELD(kvc_api, prefix_insert, 424, 8);
FIELD(kvc_api, prefix_keys, 432, 8);
FIELD(kvc_api, prefix_stats_init, 440, 8);
FIELD(kvc_api, prefix_get_stats, 448, 8);
FIELD(kvc_api, prefix_set_callback, 456, 8);
FIELD(kvc_api, pool_set_stream, 464, 8);
FIELD(kvc_api, pool_sync, 472, 8);
FIELD(kvc_api, pool_copy_blocks, 480, 8);
FIELD(kvc_api, seq_save, 488, 8);
FIELD(kvc_api, seq_restore, 496, 8);
FIELD(kvc_api, seq_save_file, 504, 8);
FIELD(kvc_api, seq_restore_file, 512, 8);
FIELD(kvc_api, tier_config_init, 520, 8);
FIELD(kvc_api, pool_add_tier, 528, 8);
FIELD(kvc_api, pool_set_offload, 536, 8);
FIELD(kvc_api, tier_stats_init, 544, 8);
FIELD(kvc_api, pool_tier_stats, 552, 8);
FIELD(kvc_api, prefix_offload, 560, 8);
FIELD(kvc_api, pool_flush_tiers, 568, 8);
FIELD(kvc_api, prefix_load, 576, 8);
FIELD(kvc_api, prefix_prefetch, 584, 8);
FIELD(kvc_api, prefix_poll, 592, 8);
FIELD(kvc_api, prefix_unpin, 600, 8);           /* end of version 3 (608 bytes) */
FIELD(kvc_api, pool_config_init_sized, 608, 8); /* version 4 (0.4) */
FIELD(kvc_api, stats_init_sized, 616, 8);
FIELD(kvc_api, pool_layout_init_sized, 624, 8);
FIELD(kvc_api, codec_init_sized, 632, 8);
FIELD(kvc_api, quant_sizes_init_sized, 640, 8);
FIELD(kvc_api, attention_params_init_sized, 648, 8);
FIELD(kvc_api, policy_config_init_sized, 656, 8);
FIELD(kvc_api, prefix_config_init_sized, 664, 8);
FIELD(kvc_api, prefix_stats_init_sized, 672, 8);
FIELD(kvc_api, tier_config_init_sized, 680, 8);
FIELD(kvc_api, tier_stats_init_sized, 688, 8);
FIELD(kvc_api, seq_keep, 696, 8);               /* end of version 4 (704 bytes) */
FIELD(kvc_api, pool_seq_bytes, 704, 8);         /* version 5 (0.4) */
FIELD(kvc_api, seq_observe_queries, 712, 8);    /* version 6 (0.4) */
FIELD(kvc_api, store_open, 720, 8);             /* version 7 (0.4) */
FIELD(kvc_api, store_close, 728, 8);
FIELD(kvc_api, store_put, 736, 8);
FIELD(kvc_api, store_get, 744, 8);
FIELD(kvc_api, store_contains, 752, 8);
FIELD(kvc_api, store_remove, 760, 8);
FIELD(kvc_api, store_pin, 768, 8);
FIELD(kvc_api, store_stats, 776, 8);
FIELD(kvc_api, seq_import_llama, 784, 8);      /* version 8 (0.4) */
FIELD(kvc_api, seq_export_llama, 792, 8);
FIELD(kvc_api, seq_head_tokens, 800, 8); /* version 9 */
FIELD(kvc_api, gather_head, 808, 8);
FIELD(kvc_api, seq_head_block_table, 816, 8);
FIELD(kvc_api, export_head_page_table, 824, 8);
FIELD(kvc_api, seq_keep_head, 832, 8);
FIELD(kvc_api, pool_set_key_smoothing, 840, 8); /* version 10 */
FIELD(kvc_api, pool_set_codebook, 848, 8);      /* version 11 */
FIELD(kvc_api, codebook_gaussian, 856, 8);
SIZE(kvc_api, 864); /* end of version 11 */

/* ---- prefix cache structs (0.3) ---- */
FIELD(kvc_prefix_config, struct_size, 0, 8);
FIELD(kvc_prefix_config, hash, 8, 4);
FIELD(kvc_prefix_config, verify_tokens, 12, 4);
FIELD(kvc_prefix_config, seed_set, 16, 4);
FIELD(kvc_prefix_config, seed, 20, 32);
FIELD(kvc_prefix_config, model_id, 56, 8);
FIELD(kvc_prefix_config, tokenizer_id, 64, 8);
FIELD(kvc_prefix_config, extra_key_names, 72, 8);   /* 0.4 */
FIELD(kvc_prefix_config, n_extra_key_names, 80, 4); /* 0.4 */
SIZE(kvc_prefix_config, 88);
_Static_assert(KVC_PREFIX_MAX_EXTRA_KEY_NAMES == 64 && KVC_PREFIX_MAX_EXTRA_KEY_NAME_BYTES == 64,
               "name limits");
FIELD(kvc_prefix_extra, data, 0, 8);
FIELD(kvc_prefix_extra, size, 8, 8);
SIZE(kvc_prefix_extra, 16);
FIELD(kvc_prefix_result, struct_size, 0, 8);
FIELD(kvc_prefix_result, hit_tokens, 8, 8);
FIELD(kvc_prefix_result, hit_blocks, 16, 8);
FIELD(kvc_prefix_result, partial_tokens, 24, 8);
FIELD(kvc_prefix_result, tier_tokens, 32, 8);
FIELD(kvc_prefix_result, pin, 40, 8);
SIZE(kvc_prefix_result, 48);
_Static_assert(KVC_PREFIX_PIN == 0x2u, "flag value");
_Static_assert(KVC_TIER_HOST == 0 && KVC_TIER_DISK == 1 && KVC_TIER_REDIS == 2, "tier kinds");
_Static_assert(KVC_TIER_FSYNC == 0x1u && KVC_TIER_REDIS_CLUSTER == 0x2u, "tier flags");
_Static_assert(KVC_LLAMA_F32 == 0 && KVC_LLAMA_F16 == 1 && KVC_LLAMA_Q8_0 == 8, "llama.cpp types");
_Static_assert(KVC_LLAMA_ATTN_ROT == 0x1u && KVC_LLAMA_V_TRANS == 0x2u, "llama.cpp state flags");
FIELD(kvc_tier_config, struct_size, 0, 8);
FIELD(kvc_tier_config, kind, 8, 4);
FIELD(kvc_tier_config, flags, 12, 4);
FIELD(kvc_tier_config, capacity_bytes, 16, 8);
FIELD(kvc_tier_config, path, 24, 8);
FIELD(kvc_tier_config, address, 32, 8);
FIELD(kvc_tier_config, timeout_ms, 40, 4);
FIELD(kvc_tier_config, reserved, 44, 4);
FIELD(kvc_tier_config, ttl_seconds, 48, 8);
SIZE(kvc_tier_config, 56);
FIELD(kvc_tier_stats, struct_size, 0, 8);
FIELD(kvc_tier_stats, kind, 8, 4);
FIELD(kvc_tier_stats, bytes, 16, 8);
FIELD(kvc_tier_stats, pinned, 88, 8);
FIELD(kvc_tier_stats, last_error, 96, 256);
SIZE(kvc_tier_stats, 352);
FIELD(kvc_prefix_event, struct_size, 0, 8);
FIELD(kvc_prefix_event, kind, 8, 4);
FIELD(kvc_prefix_event, key_size, 12, 4);
FIELD(kvc_prefix_event, key, 16, 8);
FIELD(kvc_prefix_event, parent_key, 24, 8);
FIELD(kvc_prefix_event, depth, 32, 8);
SIZE(kvc_prefix_event, 40);
FIELD(kvc_prefix_stats, struct_size, 0, 8);
FIELD(kvc_prefix_stats, queried_tokens, 8, 8);
FIELD(kvc_prefix_stats, reclaimed_total, 72, 8);
SIZE(kvc_prefix_stats, 80);

/* ---- kvc_attention_params (0.3; minimum: the whole first version) ---- */
FIELD(kvc_attention_params, struct_size, 0, 8);
FIELD(kvc_attention_params, num_q_heads, 8, 4);
FIELD(kvc_attention_params, scale, 12, 4);
FIELD(kvc_attention_params, q_dtype, 16, 4);
FIELD(kvc_attention_params, out_dtype, 20, 4);
FIELD(kvc_attention_params, observe, 24, 4);
FIELD(kvc_attention_params, num_threads, 28, 4);
FIELD(kvc_attention_params, observe_from, 32, 8);
FIELD(kvc_attention_params, query_quant, 40, 4); /* 0.4 */
SIZE(kvc_attention_params, 48);

/* ---- kvc_policy_config (0.3; minimum: the whole first version) ---- */
FIELD(kvc_policy_config, struct_size, 0, 8);
FIELD(kvc_policy_config, kind, 8, 4);
FIELD(kvc_policy_config, sink_tokens, 12, 4);
FIELD(kvc_policy_config, budget_tokens, 16, 8);
FIELD(kvc_policy_config, compression_ratio, 24, 8);
FIELD(kvc_policy_config, recent_tokens, 32, 4);
FIELD(kvc_policy_config, window, 36, 4);
FIELD(kvc_policy_config, recent_fraction, 40, 8);
FIELD(kvc_policy_config, kernel_size, 48, 4);
FIELD(kvc_policy_config, pooling, 52, 4);
FIELD(kvc_policy_config, schedule, 56, 4);
FIELD(kvc_policy_config, beta, 64, 8);
FIELD(kvc_policy_config, shift_positions, 72, 4);
FIELD(kvc_policy_config, auto_evict, 76, 4);
FIELD(kvc_policy_config, plugin, 80, 8);
FIELD(kvc_policy_config, future_positions, 88, 4); /* 0.4 */
FIELD(kvc_policy_config, head_budget, 92, 4);      /* 0.4 */
FIELD(kvc_policy_config, head_floor, 96, 8);       /* 0.4 */
FIELD(kvc_policy_config, head_gates, 104, 8);      /* 0.4 */
FIELD(kvc_policy_config, num_head_gates, 112, 4);  /* 0.4 */
FIELD(kvc_policy_config, gate_threshold, 116, 4);  /* 0.4 */
SIZE(kvc_policy_config, 120);
_Static_assert(KVC_POLICY_NONE == 0 && KVC_POLICY_STREAMING == 1 && KVC_POLICY_H2O == 2 &&
                   KVC_POLICY_SNAPKV == 3 && KVC_POLICY_PYRAMIDKV == 4 && KVC_POLICY_TOVA == 5 &&
                   KVC_POLICY_PLUGIN == 6 && KVC_POLICY_KNORM == 7 &&
                   KVC_POLICY_EXPECTED_ATTENTION == 8,
               "policy kind values");
_Static_assert(KVC_ROPE_NONE == 0 && KVC_ROPE_INTERLEAVED == 1 && KVC_ROPE_NEOX == 2, "rope values");
_Static_assert(KVC_OBSERVE_NONE == 0 && KVC_OBSERVE_ACCUMULATE == 1 && KVC_OBSERVE_REPLACE == 2 &&
                   KVC_OBSERVE_QUERIES == 3,
               "observe values");
#else
#define KVC_LAYOUT_CHECKED 0
#endif

int kvc_abi_api_types_checked(void); /* api_table_types.cpp */

int main(void) {
  if (!KVC_LAYOUT_CHECKED) {
    printf("struct layout checks apply to x86-64 LP64 only: skipped\n");
    return 77;
  }
  printf("struct layouts and kvc_api offsets checked at compile time (x86-64 LP64); "
         "%d function-table types checked\n", kvc_abi_api_types_checked());
  return 0;
}
