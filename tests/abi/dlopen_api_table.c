/*
 * A host that loads libkvcache at run time: dlopen() of the SONAME
 * (libkvcache.so.0), no link-time dependency on the library, everything
 * through kvc_get_api(). Checks the oldest table version (1) and the newest
 * (KVC_API_VERSION), that each table entry is the direct export (version 3's
 * and 4's too), a full round trip through the table (version 4 initialising
 * structs with kvc_<thing>_init_sized and its own sizeof), and that unknown
 * versions give NULL plus a message.
 *
 * Usage: dlopen_api_table [library]   (default "libkvcache.so.0", found via
 * LD_LIBRARY_PATH, which the ctest registration sets).
 */
#include <dlfcn.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kvcache/kvcache.h"

static int g_failures = 0;
#define CHECK(cond)                                                      \
  do {                                                                   \
    if (!(cond)) {                                                       \
      fprintf(stderr, "%s:%d: check failed: %s\n", __FILE__, __LINE__, #cond); \
      ++g_failures;                                                      \
    }                                                                    \
  } while (0)
#define CHECK_OK(api, call)                                                        \
  do {                                                                             \
    kvc_status s_ = (call);                                                        \
    if (s_ != KVC_OK) {                                                            \
      fprintf(stderr, "%s:%d: %s -> %s (%s)\n", __FILE__, __LINE__, #call,        \
              (api)->status_string(s_), (api)->last_error_message());              \
      ++g_failures;                                                                \
    }                                                                              \
  } while (0)

typedef const kvc_api *(*get_api_fn)(uint32_t);

/* Table entry == dlsym() of the direct export with that name. */
static void check_entry(void *lib, const char *name, void (*entry)(void)) {
  void *direct = dlsym(lib, name);
  if (!direct) {
    fprintf(stderr, "dlsym(%s): %s\n", name, dlerror());
    ++g_failures;
    return;
  }
  /* Compare as integers: ISO C has no function <-> object pointer conversion. */
  uintptr_t a = 0, b = 0;
  memcpy(&a, &entry, sizeof entry < sizeof a ? sizeof entry : sizeof a);
  memcpy(&b, &direct, sizeof direct < sizeof b ? sizeof direct : sizeof b);
  if (a != b) {
    fprintf(stderr, "table entry for %s is not the exported function\n", name);
    ++g_failures;
  }
}

#define ENTRY(api, member) check_entry(lib, "kvc_" #member, (void (*)(void))(api)->member)

static void check_table(void *lib, const kvc_api *api, uint32_t asked) {
  CHECK(api != NULL);
  if (!api) return;
  CHECK(api->api_version >= asked);
  CHECK(api->api_version <= KVC_API_VERSION || asked <= KVC_API_VERSION);
  /* The library's table covers at least every field this header knows for the asked version. */
  CHECK(api->struct_size >= sizeof(kvc_api) || asked < KVC_API_VERSION);
  CHECK(api->struct_size >= offsetof(kvc_api, dtype_size) + sizeof(api->dtype_size));
  CHECK(api->reserved == 0);
  ENTRY(api, version);
  ENTRY(api, version_string);
  ENTRY(api, status_string);
  ENTRY(api, last_error_message);
  ENTRY(api, pool_config_init);
  ENTRY(api, pool_create);
  ENTRY(api, pool_destroy);
  ENTRY(api, stats_init);
  ENTRY(api, pool_stats);
  ENTRY(api, pool_reset_peak);
  ENTRY(api, pool_layout_init);
  ENTRY(api, pool_get_layout);
  ENTRY(api, pool_get_config);
  ENTRY(api, seq_create);
  ENTRY(api, seq_fork);
  ENTRY(api, seq_truncate);
  ENTRY(api, seq_free);
  ENTRY(api, seq_length);
  ENTRY(api, seq_layer_tokens);
  ENTRY(api, seq_reserve);
  ENTRY(api, append);
  ENTRY(api, gather);
  ENTRY(api, seq_block_table);
  ENTRY(api, export_page_table);
  ENTRY(api, convert);
  ENTRY(api, dtype_size);
#if KVC_API_VERSION >= 2
  if (api->api_version >= 2) {
    CHECK(api->struct_size >= offsetof(kvc_api, dequantize) + sizeof(api->dequantize));
    ENTRY(api, codec_init);
    ENTRY(api, pool_tensor_scales);
    ENTRY(api, quant_sizes_init);
    ENTRY(api, quantize_sizes);
    ENTRY(api, quantize);
    ENTRY(api, dequantize);
  }
#endif
#if KVC_API_VERSION >= 3
  if (api->api_version >= 3) {
    CHECK(api->struct_size >= offsetof(kvc_api, prefix_unpin) + sizeof(api->prefix_unpin));
    ENTRY(api, attention_params_init);
    ENTRY(api, attention_decode);
    ENTRY(api, attention_prefill);
    ENTRY(api, seq_observe_scores);
    ENTRY(api, seq_scores);
    ENTRY(api, seq_rope_positions);
    ENTRY(api, policy_config_init);
    ENTRY(api, policy_create);
    ENTRY(api, policy_destroy);
    ENTRY(api, seq_set_policy);
    ENTRY(api, pool_set_policy);
    ENTRY(api, evict);
    ENTRY(api, plugin_load);
    ENTRY(api, plugin_unload);
    ENTRY(api, plugin_name);
    ENTRY(api, prefix_config_init);
    ENTRY(api, pool_enable_prefix_cache);
    ENTRY(api, prefix_lookup);
    ENTRY(api, prefix_attach);
    ENTRY(api, prefix_insert);
    ENTRY(api, prefix_keys);
    ENTRY(api, prefix_stats_init);
    ENTRY(api, prefix_get_stats);
    ENTRY(api, prefix_set_callback);
    ENTRY(api, pool_set_stream);
    ENTRY(api, pool_sync);
    ENTRY(api, pool_copy_blocks);
    ENTRY(api, seq_save);
    ENTRY(api, seq_restore);
    ENTRY(api, seq_save_file);
    ENTRY(api, seq_restore_file);
    ENTRY(api, tier_config_init);
    ENTRY(api, pool_add_tier);
    ENTRY(api, pool_set_offload);
    ENTRY(api, tier_stats_init);
    ENTRY(api, pool_tier_stats);
    ENTRY(api, prefix_offload);
    ENTRY(api, pool_flush_tiers);
    ENTRY(api, prefix_load);
    ENTRY(api, prefix_prefetch);
    ENTRY(api, prefix_poll);
    ENTRY(api, prefix_unpin);
  }
#endif
#if KVC_API_VERSION >= 4
  if (api->api_version >= 4) {
    CHECK(api->struct_size >=
          offsetof(kvc_api, seq_keep) + sizeof(api->seq_keep));
    ENTRY(api, pool_config_init_sized);
    ENTRY(api, stats_init_sized);
    ENTRY(api, pool_layout_init_sized);
    ENTRY(api, codec_init_sized);
    ENTRY(api, quant_sizes_init_sized);
    ENTRY(api, attention_params_init_sized);
    ENTRY(api, policy_config_init_sized);
    ENTRY(api, prefix_config_init_sized);
    ENTRY(api, prefix_stats_init_sized);
    ENTRY(api, tier_config_init_sized);
    ENTRY(api, tier_stats_init_sized);
    ENTRY(api, seq_keep);
  }
#endif
#if KVC_API_VERSION >= 5
  if (api->api_version >= 5) {
    CHECK(api->struct_size >= offsetof(kvc_api, pool_seq_bytes) + sizeof(api->pool_seq_bytes));
    ENTRY(api, pool_seq_bytes);
  }
#endif
#if KVC_API_VERSION >= 6
  if (api->api_version >= 6) {
    CHECK(api->struct_size >= offsetof(kvc_api, seq_observe_queries) +
                                   sizeof(api->seq_observe_queries));
    ENTRY(api, seq_observe_queries);
  }
#endif
#if KVC_API_VERSION >= 7
  if (api->api_version >= 7) {
    CHECK(api->struct_size >= offsetof(kvc_api, store_stats) + sizeof(api->store_stats));
    ENTRY(api, store_open);
    ENTRY(api, store_close);
    ENTRY(api, store_put);
    ENTRY(api, store_get);
    ENTRY(api, store_contains);
    ENTRY(api, store_remove);
    ENTRY(api, store_pin);
    ENTRY(api, store_stats);
  }
#endif
#if KVC_API_VERSION >= 8
  if (api->api_version >= 8) {
    CHECK(api->struct_size >= offsetof(kvc_api, seq_export_llama) + sizeof(api->seq_export_llama));
    ENTRY(api, seq_import_llama);
    ENTRY(api, seq_export_llama);
  }
#endif
#if KVC_API_VERSION >= 9
  if (api->api_version >= 9) {
    CHECK(api->struct_size >= offsetof(kvc_api, seq_keep_head) + sizeof(api->seq_keep_head));
    ENTRY(api, seq_head_tokens);
    ENTRY(api, gather_head);
    ENTRY(api, seq_head_block_table);
    ENTRY(api, export_head_page_table);
    ENTRY(api, seq_keep_head);
  }
#endif
#if KVC_API_VERSION >= 10
  if (api->api_version >= 10) {
    CHECK(api->struct_size >=
          offsetof(kvc_api, pool_set_key_smoothing) + sizeof(api->pool_set_key_smoothing));
    ENTRY(api, pool_set_key_smoothing);
  }
#endif
#if KVC_API_VERSION >= 11
  if (api->api_version >= 11) {
    CHECK(api->struct_size >= offsetof(kvc_api, codebook_gaussian) + sizeof(api->codebook_gaussian));
    ENTRY(api, pool_set_codebook);
    ENTRY(api, codebook_gaussian);
  }
#endif
}

/* Full round trip through the table only (a version-1 host). */
static void round_trip(const kvc_api *api) {
  enum { LAYERS = 2, KV_HEADS = 2, HEAD_DIM = 8, BLOCK = 4, N = 6 };
  const size_t row = (size_t)KV_HEADS * HEAD_DIM;
  float k[N * KV_HEADS * HEAD_DIM], v[N * KV_HEADS * HEAD_DIM];
  float k_out[N * KV_HEADS * HEAD_DIM], v_out[N * KV_HEADS * HEAD_DIM];
  int64_t slots[LAYERS * N];
  int32_t pos[N], table[8];
  size_t n_blocks = 0, i;
  uint64_t len = 0;
  kvc_pool_config cfg;
  kvc_pool *pool = NULL;
  kvc_stats st;

  CHECK(api->version() == KVC_VERSION_NUMBER || api->version() / 10000 == KVC_VERSION_MAJOR);
  CHECK(api->version_string() != NULL && api->version_string()[0] != '\0');
  CHECK(strcmp(api->status_string(KVC_ERR_POOL_EXHAUSTED), "KVC_ERR_POOL_EXHAUSTED") == 0);

  /* A host of version 4 initialises with its own sizeof; the 0.3 member
   * fills the 0.3 size (this header's sizeof or less). */
#if KVC_API_VERSION >= 4
  if (api->api_version >= 4)
    CHECK_OK(api, api->pool_config_init_sized(&cfg, sizeof cfg));
  else
#endif
    CHECK_OK(api, api->pool_config_init(&cfg));
  CHECK(api->api_version >= 4 ? cfg.struct_size == sizeof cfg : cfg.struct_size <= sizeof cfg);
  cfg.num_layers = LAYERS;
  cfg.num_q_heads = 4;
  cfg.num_kv_heads = KV_HEADS;
  cfg.head_dim = HEAD_DIM;
  cfg.block_size = BLOCK;
  cfg.num_blocks = 16;
  cfg.k_dtype = KVC_DTYPE_F32;
  cfg.v_dtype = KVC_DTYPE_F32;
  CHECK_OK(api, api->pool_create(&cfg, &pool));
  CHECK(pool != NULL);
  if (!pool) return;

  CHECK_OK(api, api->seq_create(pool, 42));
  CHECK_OK(api, api->seq_reserve(pool, 42, N, slots));
  CHECK_OK(api, api->seq_length(pool, 42, &len));
  CHECK(len == N);
  for (i = 0; i < N * row; ++i) {
    k[i] = (float)i * 0.5f;
    v[i] = -(float)i;
  }
  CHECK_OK(api, api->append(pool, 42, 1, 0, N, k, v, KVC_DTYPE_F32));
  memset(k_out, 0, sizeof k_out);
  memset(v_out, 0, sizeof v_out);
  CHECK_OK(api, api->gather(pool, 42, 1, 0, N, k_out, v_out, KVC_DTYPE_F32, pos));
  CHECK(memcmp(k, k_out, sizeof k) == 0);
  CHECK(memcmp(v, v_out, sizeof v) == 0);
  for (i = 0; i < N; ++i) CHECK(pos[i] == (int32_t)i);
  CHECK_OK(api, api->seq_block_table(pool, 42, 1, table, 8, &n_blocks));
  CHECK(n_blocks == (N + BLOCK - 1) / BLOCK);
  /* Slots of layer 1 agree with its block table. */
  for (i = 0; i < N; ++i) CHECK(slots[N + i] == (int64_t)table[i / BLOCK] * BLOCK + (int64_t)(i % BLOCK));

#if KVC_API_VERSION >= 4
  if (api->api_version >= 4)
    CHECK_OK(api, api->stats_init_sized(&st, sizeof st));
  else
#endif
    CHECK_OK(api, api->stats_init(&st));
  CHECK_OK(api, api->pool_stats(pool, &st));
  CHECK(st.blocks_total == 16);
  CHECK(st.blocks_used == LAYERS * n_blocks);
  CHECK(st.blocks_free + st.blocks_cached + st.blocks_used == st.blocks_total);
  CHECK(st.num_sequences == 1);
#if KVC_API_VERSION >= 5
  /* The sizing call (version 5) agrees with what the pool holds. */
  if (api->api_version >= 5) {
    uint64_t bytes = 0, peak = 0;
    CHECK_OK(api, api->pool_seq_bytes(&cfg, N, &bytes, &peak));
    CHECK(bytes == st.bytes_in_use && peak == bytes);
  }
#endif

  CHECK_OK(api, api->seq_free(pool, 42));
  CHECK(api->seq_free(pool, 42) == KVC_ERR_SEQ_NOT_FOUND);
  CHECK(api->last_error_message()[0] != '\0');
  CHECK_OK(api, api->pool_stats(pool, &st));
  CHECK(st.blocks_used == 0 && st.blocks_free == 16 && st.num_sequences == 0);
  api->pool_destroy(pool);
}

int main(int argc, char **argv) {
  const char *path = argc > 1 ? argv[1] : "libkvcache.so.0";
  void *lib = dlopen(path, RTLD_NOW | RTLD_LOCAL);
  get_api_fn get_api;
  const kvc_api *v1, *vn;
  if (!lib) {
    fprintf(stderr, "dlopen(%s): %s\n", path, dlerror());
    return 1;
  }
  {
    void *p = dlsym(lib, "kvc_get_api");
    memcpy(&get_api, &p, sizeof get_api);
  }
  if (!get_api) {
    fprintf(stderr, "dlsym(kvc_get_api): %s\n", dlerror());
    return 1;
  }

  v1 = get_api(1); /* the oldest table: what a host built against 0.1 asks for */
  check_table(lib, v1, 1);
  if (v1) round_trip(v1);

  vn = get_api(KVC_API_VERSION);
  check_table(lib, vn, KVC_API_VERSION);
  CHECK(vn == NULL || vn->api_version == KVC_API_VERSION);
  if (vn) round_trip(vn);

  {
    const char *(*last_error)(void);
    void *p = dlsym(lib, "kvc_last_error_message");
    memcpy(&last_error, &p, sizeof last_error);
    CHECK(last_error != NULL);
    CHECK(get_api(KVC_API_VERSION + 1) == NULL);
    if (last_error) {
      CHECK(strstr(last_error(), "version") != NULL);
      printf("kvc_get_api(%d): NULL, \"%s\"\n", KVC_API_VERSION + 1, last_error());
    }
    CHECK(get_api(0) == NULL);
    if (last_error) CHECK(last_error()[0] != '\0');
  }

  dlclose(lib);
  if (g_failures) {
    fprintf(stderr, "%d check(s) failed\n", g_failures);
    return 1;
  }
  printf("dlopen %s: tables v1 and v%d checked, round trip ok\n", path, KVC_API_VERSION);
  return 0;
}
