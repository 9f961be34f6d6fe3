/*
 * libkvcache - scorer plugin ABI.
 * SPDX-License-Identifier: Apache-2.0
 */
/**
 * @file kvcache_plugin.h
 * @brief The ABI a shared object implements to score tokens for eviction
 * (policy kind ::KVC_POLICY_PLUGIN of kvcache.h).
 *
 * A plugin is a shared library exporting one C function, `kvc_plugin_get`
 * (type ::kvc_plugin_get_fn). kvc_plugin_load() dlopen()s the file, calls
 * `kvc_plugin_get(KVC_PLUGIN_ABI_VERSION)` and accepts the returned table
 * only when its `abi_version` equals the requested version, its struct_size
 * covers every version-1 field and `name` and `score` are set. A plugin that
 * does not speak the requested version returns NULL.
 *
 * At eviction time the library calls `score` once per layer with the layer's
 * keys (dequantized to f32), token positions and observed attention; the
 * plugin writes one finite score per token (higher = more important). The
 * library keeps the policy's protected recent window plus the tokens with the
 * highest scores. `score` may be called from several threads at once for
 * different sequences; the plugin's state must allow that.
 *
 * The header is C99 and C++ compatible and depends on nothing but the C
 * standard headers, so a plugin needs no other file from libkvcache.
 */
#ifndef KVCACHE_KVCACHE_PLUGIN_H
#define KVCACHE_KVCACHE_PLUGIN_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/** @brief The plugin ABI version this header describes. @since 0.3 */
#define KVC_PLUGIN_ABI_VERSION 1u

/** @brief Name of the one symbol a plugin exports. @since 0.3 */
#define KVC_PLUGIN_ENTRY "kvc_plugin_get"

/**
 * @brief What a scorer sees of one layer of one sequence.
 * @since 0.3
 */
typedef struct kvc_plugin_layer_view {
  size_t struct_size;    /**< sizeof(kvc_plugin_layer_view) of the library. */
  uint32_t layer;        /**< Layer index, 0..num_layers-1. */
  uint32_t num_layers;   /**< Layers of the pool. */
  uint64_t n_tokens;     /**< Tokens the layer holds (>= 1). */
  uint32_t num_kv_heads; /**< KV heads. */
  uint32_t head_dim;     /**< Elements per head. */
  const float *keys;     /**< `[n_tokens][num_kv_heads][head_dim]` f32 keys as stored (dequantized;
                            after RoPE). */
  const int32_t *positions; /**< `[n_tokens]` position of each token. */
  const float *attention;   /**< `[n_tokens][num_kv_heads]` attention mass observed so far
                               (kvc_attention_* with an observe flag, or kvc_seq_observe_scores()), or
                               NULL when none was observed. */
} kvc_plugin_layer_view;

/**
 * @brief A scorer's function table, returned by the plugin's kvc_plugin_get().
 * @since 0.3
 */
typedef struct kvc_plugin_scorer {
  size_t struct_size;   /**< sizeof(kvc_plugin_scorer) the plugin was built with. */
  uint32_t abi_version; /**< Must equal the version the host asked for. */
  uint32_t reserved;    /**< Zero. */
  const char *name;     /**< Short name, e.g. "keynorm" (static string). */
  /** Optional: creates the plugin's state at load (NULL: no state). Returns NULL on failure only if
   * `destroy` is also NULL-safe. */
  void *(*create)(void);
  /** Optional: frees the state at unload. */
  void (*destroy)(void *state);
  /**
   * Required: write `view->n_tokens` finite scores to `scores_out`
   * (higher = keep). Return 0 on success, non-zero on failure (the eviction
   * then fails with ::KVC_ERR_INVALID_ARGUMENT and changes nothing).
   */
  int (*score)(void *state, const kvc_plugin_layer_view *view, float *scores_out);
} kvc_plugin_scorer;

/** @brief Type of the exported entry point: the table for `abi_version`, or NULL. @since 0.3 */
typedef const kvc_plugin_scorer *(*kvc_plugin_get_fn)(uint32_t abi_version);

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* KVCACHE_KVCACHE_PLUGIN_H */
