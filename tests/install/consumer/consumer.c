/* A program built against the *installed* libkvcache (pkg-config and CMake's
 * find_package): create a pool, write and read back one layer, print stats. */
#include <kvcache/kvcache.h>
#include <stdio.h>
#include <string.h>

int main(void) {
  kvc_pool_config cfg;
  kvc_pool *pool = NULL;
  kvc_stats st;
  float k[3 * 2 * 4], v[3 * 2 * 4], k2[3 * 2 * 4], v2[3 * 2 * 4];
  size_t i;
  kvc_pool_config_init(&cfg);
  cfg.num_layers = 1;
  cfg.num_q_heads = 2;
  cfg.num_kv_heads = 2;
  cfg.head_dim = 4;
  cfg.block_size = 2;
  cfg.num_blocks = 8;
  cfg.k_dtype = KVC_DTYPE_F32;
  cfg.v_dtype = KVC_DTYPE_F32;
  if (kvc_pool_create(&cfg, &pool) != KVC_OK) {
    fprintf(stderr, "kvc_pool_create: %s\n", kvc_last_error_message());
    return 1;
  }
  for (i = 0; i < 24; ++i) {
    k[i] = (float)i;
    v[i] = (float)(100 + i);
  }
  if (kvc_seq_create(pool, 7) != KVC_OK || kvc_seq_reserve(pool, 7, 3, NULL) != KVC_OK ||
      kvc_append(pool, 7, 0, 0, 3, k, v, KVC_DTYPE_F32) != KVC_OK ||
      kvc_gather(pool, 7, 0, 0, 3, k2, v2, KVC_DTYPE_F32, NULL) != KVC_OK) {
    fprintf(stderr, "round trip failed: %s\n", kvc_last_error_message());
    return 1;
  }
  if (memcmp(k, k2, sizeof k) != 0 || memcmp(v, v2, sizeof v) != 0) {
    fprintf(stderr, "data differs\n");
    return 1;
  }
  kvc_stats_init(&st);
  kvc_pool_stats(pool, &st);
  printf("libkvcache %s: %llu of %llu blocks used\n", kvc_version_string(),
         (unsigned long long)st.blocks_used, (unsigned long long)st.blocks_total);
  kvc_pool_destroy(pool);
  return st.blocks_used == 2 ? 0 : 1;
}
