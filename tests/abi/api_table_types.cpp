// Compile-time check that every member of kvc_api has exactly the type of the
// direct export it points at, so a table entry and its function can never drift.
#include <type_traits>

#include "kvcache/kvcache.h"

#define SAME(member, fn)                                                     \
  static_assert(std::is_same_v<decltype(kvc_api::member), decltype(&fn)>,  \
                "kvc_api::" #member " does not have the type of " #fn);     \
  ++n

extern "C" int kvc_abi_api_types_checked(void) {
  int n = 0;
  SAME(version, kvc_version);
  SAME(version_string, kvc_version_string);
  SAME(status_string, kvc_status_string);
  SAME(last_error_message, kvc_last_error_message);
  SAME(pool_config_init, kvc_pool_config_init);
  SAME(pool_create, kvc_pool_create);
  SAME(pool_destroy, kvc_pool_destroy);
  SAME(stats_init, kvc_stats_init);
  SAME(pool_stats, kvc_pool_stats);
  SAME(pool_reset_peak, kvc_pool_reset_peak);
  SAME(pool_layout_init, kvc_pool_layout_init);
  SAME(pool_get_layout, kvc_pool_get_layout);
  SAME(pool_get_config, kvc_pool_get_config);
  SAME(seq_create, kvc_seq_create);
  SAME(seq_fork, kvc_seq_fork);
  SAME(seq_truncate, kvc_seq_truncate);
  SAME(seq_free, kvc_seq_free);
  SAME(seq_length, kvc_seq_length);
  SAME(seq_layer_tokens, kvc_seq_layer_tokens);
  SAME(seq_reserve, kvc_seq_reserve);
  SAME(append, kvc_append);
  SAME(gather, kvc_gather);
  SAME(seq_block_table, kvc_seq_block_table);
  SAME(export_page_table, kvc_export_page_table);
  SAME(convert, kvc_convert);
  SAME(dtype_size, kvc_dtype_size);
#if KVC_API_VERSION >= 2
  SAME(codec_init, kvc_codec_init);
  SAME(pool_tensor_scales, kvc_pool_tensor_scales);
  SAME(quant_sizes_init, kvc_quant_sizes_init);
  SAME(quantize_sizes, kvc_quantize_sizes);
  SAME(quantize, kvc_quantize);
  SAME(dequantize, kvc_dequantize);
#endif
#if KVC_API_VERSION >= 3
  SAME(attention_params_init, kvc_attention_params_init);
  SAME(attention_decode, kvc_attention_decode);
  SAME(attention_prefill, kvc_attention_prefill);
  SAME(seq_observe_scores, kvc_seq_observe_scores);
  SAME(seq_scores, kvc_seq_scores);
  SAME(seq_rope_positions, kvc_seq_rope_positions);
  SAME(policy_config_init, kvc_policy_config_init);
  SAME(policy_create, kvc_policy_create);
  SAME(policy_destroy, kvc_policy_destroy);
  SAME(seq_set_policy, kvc_seq_set_policy);
  SAME(pool_set_policy, kvc_pool_set_policy);
  SAME(evict, kvc_evict);
  SAME(plugin_load, kvc_plugin_load);
  SAME(plugin_unload, kvc_plugin_unload);
  SAME(plugin_name, kvc_plugin_name);
  SAME(prefix_config_init, kvc_prefix_config_init);
  SAME(pool_enable_prefix_cache, kvc_pool_enable_prefix_cache);
  SAME(prefix_lookup, kvc_prefix_lookup);
  SAME(prefix_attach, kvc_prefix_attach);
  SAME(prefix_insert, kvc_prefix_insert);
  SAME(prefix_keys, kvc_prefix_keys);
  SAME(prefix_stats_init, kvc_prefix_stats_init);
  SAME(prefix_get_stats, kvc_prefix_get_stats);
  SAME(prefix_set_callback, kvc_prefix_set_callback);
  SAME(pool_set_stream, kvc_pool_set_stream);
  SAME(pool_sync, kvc_pool_sync);
  SAME(pool_copy_blocks, kvc_pool_copy_blocks);
  SAME(seq_save, kvc_seq_save);
  SAME(seq_restore, kvc_seq_restore);
  SAME(seq_save_file, kvc_seq_save_file);
  SAME(seq_restore_file, kvc_seq_restore_file);
  SAME(tier_config_init, kvc_tier_config_init);
  SAME(pool_add_tier, kvc_pool_add_tier);
  SAME(pool_set_offload, kvc_pool_set_offload);
  SAME(tier_stats_init, kvc_tier_stats_init);
  SAME(pool_tier_stats, kvc_pool_tier_stats);
  SAME(prefix_offload, kvc_prefix_offload);
  SAME(pool_flush_tiers, kvc_pool_flush_tiers);
  SAME(prefix_load, kvc_prefix_load);
  SAME(prefix_prefetch, kvc_prefix_prefetch);
  SAME(prefix_poll, kvc_prefix_poll);
  SAME(prefix_unpin, kvc_prefix_unpin);
#endif
#if KVC_API_VERSION >= 4
  SAME(pool_config_init_sized, kvc_pool_config_init_sized);
  SAME(stats_init_sized, kvc_stats_init_sized);
  SAME(pool_layout_init_sized, kvc_pool_layout_init_sized);
  SAME(codec_init_sized, kvc_codec_init_sized);
  SAME(quant_sizes_init_sized, kvc_quant_sizes_init_sized);
  SAME(attention_params_init_sized, kvc_attention_params_init_sized);
  SAME(policy_config_init_sized, kvc_policy_config_init_sized);
  SAME(prefix_config_init_sized, kvc_prefix_config_init_sized);
  SAME(prefix_stats_init_sized, kvc_prefix_stats_init_sized);
  SAME(tier_config_init_sized, kvc_tier_config_init_sized);
  SAME(tier_stats_init_sized, kvc_tier_stats_init_sized);
  SAME(seq_keep, kvc_seq_keep);
#endif
#if KVC_API_VERSION >= 5
  SAME(pool_seq_bytes, kvc_pool_seq_bytes);
#endif
#if KVC_API_VERSION >= 6
  SAME(seq_observe_queries, kvc_seq_observe_queries);
#endif
#if KVC_API_VERSION >= 7
  SAME(store_open, kvc_store_open);
  SAME(store_close, kvc_store_close);
  SAME(store_put, kvc_store_put);
  SAME(store_get, kvc_store_get);
  SAME(store_contains, kvc_store_contains);
  SAME(store_remove, kvc_store_remove);
  SAME(store_pin, kvc_store_pin);
  SAME(store_stats, kvc_store_stats);
  SAME(seq_import_llama, kvc_seq_import_llama);
  SAME(seq_export_llama, kvc_seq_export_llama);
#endif
#if KVC_API_VERSION >= 9
  SAME(seq_head_tokens, kvc_seq_head_tokens);
  SAME(gather_head, kvc_gather_head);
  SAME(seq_head_block_table, kvc_seq_head_block_table);
  SAME(export_head_page_table, kvc_export_head_page_table);
  SAME(seq_keep_head, kvc_seq_keep_head);
#endif
#if KVC_API_VERSION >= 10
  SAME(pool_set_key_smoothing, kvc_pool_set_key_smoothing);
#endif
#if KVC_API_VERSION >= 11
  SAME(pool_set_codebook, kvc_pool_set_codebook);
  SAME(codebook_gaussian, kvc_codebook_gaussian);
#endif
  return n;
}
