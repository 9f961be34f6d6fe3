/*
 * Sample scorer plugin: key norm (Devoto et al., "A Simple and Effective L2
 * Norm-Based Strategy for KV Cache Compression", arXiv 2406.11430): keys
 * with a small L2 norm tend to receive high attention, so a token's score is
 * minus the sum over KV heads of its key norm. Built as a shared object and
 * loaded with kvc_plugin_load() by the plugin_ tests.
 *
 * KVC_SAMPLE_VARIANT selects deliberately broken builds for the tests:
 * 1 = speaks only ABI version 99, 2 = returns a table claiming version 7,
 * 3 = a table without a score function, 4 = scores are NaN, 5 = score fails.
 */
#include <math.h>
#include <stddef.h>

#include "kvcache/kvcache_plugin.h"

#ifndef KVC_SAMPLE_VARIANT
#define KVC_SAMPLE_VARIANT 0
#endif

static int keynorm_score(void *state, const kvc_plugin_layer_view *view, float *out) {
  (void)state;
  if (KVC_SAMPLE_VARIANT == 5) return 3;
  const size_t row = (size_t)view->num_kv_heads * view->head_dim;
  for (uint64_t t = 0; t < view->n_tokens; ++t) {
    double s = 0.0;
    for (uint32_t h = 0; h < view->num_kv_heads; ++h) {
      double n2 = 0.0;
      for (uint32_t i = 0; i < view->head_dim; ++i) {
        const double x = view->keys[t * row + (size_t)h * view->head_dim + i];
        n2 += x * x;
      }
      s += sqrt(n2);
    }
    out[t] = KVC_SAMPLE_VARIANT == 4 ? NAN : (float)-s;
  }
  return 0;
}

static const kvc_plugin_scorer table = {
    sizeof(kvc_plugin_scorer),
    KVC_SAMPLE_VARIANT == 2 ? 7u : KVC_PLUGIN_ABI_VERSION,
    0,
    "keynorm",
    NULL,
    NULL,
    KVC_SAMPLE_VARIANT == 3 ? NULL : keynorm_score,
};

#if defined(__GNUC__)
__attribute__((visibility("default")))
#endif
const kvc_plugin_scorer *kvc_plugin_get(uint32_t abi_version) {
  if (abi_version != (KVC_SAMPLE_VARIANT == 1 ? 99u : KVC_PLUGIN_ABI_VERSION)) return NULL;
  return &table;
}
