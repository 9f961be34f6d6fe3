// The versioned function table of dlopen hosts (kvc_get_api): append-only,
// each entry the direct export.
#include "api/api_int.h"

extern "C" {

static const kvc_api g_api = {
    sizeof(kvc_api),
    KVC_API_VERSION,
    0,
    kvc_version,
    kvc_version_string,
    kvc_status_string,
    kvc_last_error_message,
    kvc_pool_config_init,
    kvc_pool_create,
    kvc_pool_destroy,
    kvc_stats_init,
    kvc_pool_stats,
    kvc_pool_reset_peak,
    kvc_pool_layout_init,
    kvc_pool_get_layout,
    kvc_pool_get_config,
    kvc_seq_create,
    kvc_seq_fork,
    kvc_seq_truncate,
    kvc_seq_free,
    kvc_seq_length,
    kvc_seq_layer_tokens,
    kvc_seq_reserve,
    kvc_append,
    kvc_gather,
    kvc_seq_block_table,
    kvc_export_page_table,
    kvc_convert,
    kvc_dtype_size,
    kvc_codec_init,
    kvc_pool_tensor_scales,
    kvc_quant_sizes_init,
    kvc_quantize_sizes,
    kvc_quantize,
    kvc_dequantize,
    kvc_attention_params_init,
    kvc_attention_decode,
    kvc_attention_prefill,
    kvc_seq_observe_scores,
    kvc_seq_scores,
    kvc_seq_rope_positions,
    kvc_policy_config_init,
    kvc_policy_create,
    kvc_policy_destroy,
    kvc_seq_set_policy,
    kvc_pool_set_policy,
    kvc_evict,
    kvc_plugin_load,
    kvc_plugin_unload,
    kvc_plugin_name,
    kvc_prefix_config_init,
    kvc_pool_enable_prefix_cache,
    kvc_prefix_lookup,
    kvc_prefix_attach,
    kvc_prefix_insert,
    kvc_prefix_keys,
    kvc_prefix_stats_init,
    kvc_prefix_get_stats,
    kvc_prefix_set_callback,
    kvc_pool_set_stream,
    kvc_pool_sync,
    kvc_pool_copy_blocks,
    kvc_seq_save,
    kvc_seq_restore,
    kvc_seq_save_file,
    kvc_seq_restore_file,
    kvc_tier_config_init,
    kvc_pool_add_tier,
    kvc_pool_set_offload,
    kvc_tier_stats_init,
    kvc_pool_tier_stats,
    kvc_prefix_offload,
    kvc_pool_flush_tiers,
    kvc_prefix_load,
    kvc_prefix_prefetch,
    kvc_prefix_poll,
    kvc_prefix_unpin,
    // version 4 (0.4)
    kvc_pool_config_init_sized,
    kvc_stats_init_sized,
    kvc_pool_layout_init_sized,
    kvc_codec_init_sized,
    kvc_quant_sizes_init_sized,
    kvc_attention_params_init_sized,
    kvc_policy_config_init_sized,
    kvc_prefix_config_init_sized,
    kvc_prefix_stats_init_sized,
    kvc_tier_config_init_sized,
    kvc_tier_stats_init_sized,
    kvc_seq_keep,
    // version 5 (0.4)
    kvc_pool_seq_bytes,
    // version 6 (0.4)
    kvc_seq_observe_queries,
    // version 7 (0.4)
    kvc_store_open,
    kvc_store_close,
    kvc_store_put,
    kvc_store_get,
    kvc_store_contains,
    kvc_store_remove,
    kvc_store_pin,
    kvc_store_stats,
    // version 8 (0.4)
    kvc_seq_import_llama,
    kvc_seq_export_llama,
    // version 9 (0.4)
    kvc_seq_head_tokens,
    kvc_gather_head,
    kvc_seq_head_block_table,
    kvc_export_head_page_table,
    kvc_seq_keep_head,
    // version 10 (0.4)
    kvc_pool_set_key_smoothing,
    // version 11 (0.4)
    kvc_pool_set_codebook,
    kvc_codebook_gaussian,
};

KVC_API const kvc_api *kvc_get_api(uint32_t api_version) {
  if (api_version == 0 || api_version > KVC_API_VERSION) {
    char msg[96];
    std::snprintf(msg, sizeof msg, "API version %u: this library provides versions 1..%u",
                  static_cast<unsigned>(api_version), static_cast<unsigned>(KVC_API_VERSION));
    kvc::api::set_error(KVC_ERR_VERSION, msg);
    return nullptr;
  }
  return &g_api;
}

}  // extern "C"
