/* The helper of the black-box tests (tests/api): cmocka tests in C of the
 * public header only: status checks, small pools, deterministic K/V rows,
 * one ctest per test function (kvc_cmocka_tests in tests/CMakeLists.txt). */
#ifndef KVC_TESTS_BLACKBOX_H
#define KVC_TESTS_BLACKBOX_H
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>

#include <kvcache/kvcache.h>

/* Asserts a status, printing the library's message when it differs. */
#define ASSERT_STATUS(expected, call)                                                   \
  do {                                                                                  \
    kvc_status st_ = (call);                                                            \
    if (st_ != (expected))                                                              \
      print_error("%s -> %s (%s), expected %s\n", #call, kvc_status_string(st_),        \
                  kvc_last_error_message(), kvc_status_string(expected));               \
    assert_int_equal(st_, (expected));                                                  \
  } while (0)
#define ASSERT_OK(call) ASSERT_STATUS(KVC_OK, call)

static inline kvc_pool_config test_config(uint32_t layers, uint32_t kv_heads, uint32_t head_dim,
                                          uint32_t block_size, uint64_t num_blocks) {
  kvc_pool_config c;
  kvc_pool_config_init(&c);
  c.num_layers = layers;
  c.num_q_heads = kv_heads * 2;
  c.num_kv_heads = kv_heads;
  c.head_dim = head_dim;
  c.block_size = block_size;
  c.num_blocks = num_blocks;
  c.k_dtype = KVC_DTYPE_F32;
  c.v_dtype = KVC_DTYPE_F32;
  return c;
}

static inline kvc_pool *make_pool(uint32_t layers, uint32_t kv_heads, uint32_t head_dim,
                                  uint32_t block_size, uint64_t num_blocks) {
  kvc_pool_config c = test_config(layers, kv_heads, head_dim, block_size, num_blocks);
  kvc_pool *p = NULL;
  ASSERT_OK(kvc_pool_create(&c, &p));
  assert_non_null(p);
  return p;
}

/* A pool of config `c` whose K and V use a default codec of `dtype` (int8,
 * int4, ... per token); the codec is copied by kvc_pool_create. */
static inline kvc_pool *quantized_pool(kvc_pool_config c, kvc_dtype dtype) {
  kvc_codec cod;
  kvc_codec_init(&cod);
  cod.dtype = dtype;
  c.k_codec = &cod;
  c.v_codec = &cod;
  kvc_pool *p = NULL;
  ASSERT_OK(kvc_pool_create(&c, &p));
  return p;
}

/* A deterministic value for (seq tag, layer, position, element, k-or-v). */
static inline float kv_value(uint32_t tag, uint32_t layer, uint64_t pos, uint32_t e, int is_v) {
  return (float)(tag * 1000 + layer * 100) + (float)pos + (float)e / 64.0f + (is_v ? 0.5f : 0.0f);
}

/* Fills rows [n][row] for positions pos0.. */
static inline void fill_rows(float *k, float *v, uint32_t tag, uint32_t layer, uint64_t pos0,
                             uint64_t n, uint32_t row) {
  for (uint64_t t = 0; t < n; ++t)
    for (uint32_t e = 0; e < row; ++e) {
      k[t * row + e] = kv_value(tag, layer, pos0 + t, e, 0);
      v[t * row + e] = kv_value(tag, layer, pos0 + t, e, 1);
    }
}

static inline kvc_stats get_stats(kvc_pool *p) {
  kvc_stats s;
  kvc_stats_init(&s);
  kvc_status st = kvc_pool_stats(p, &s);
  assert_int_equal(st, KVC_OK);
  return s;
}

/* Runs one test by name (argv[1]: ctest runs each alone) or all of them. */
#define run_named_tests(group, tests, n, argc, argv)                                 \
  (((argc) > 1 && !has_test((tests), (n), (argv)[1]))                                \
       ? (fprintf(stderr, "no test named %s\n", (argv)[1]), 1)                      \
       : ((argc) > 1 ? cmocka_set_test_filter((argv)[1]) : (void)0,                  \
          _cmocka_run_group_tests((group), (tests), (n), NULL, NULL)))

static inline int has_test(const struct CMUnitTest *tests, size_t n, const char *name) {
  for (size_t i = 0; i < n; ++i)
    if (strcmp(tests[i].name, name) == 0) return 1;
  return 0;
}

/* kvc_attention_decode() of one sequence (query heads 2 per KV head, as
 * test_config makes them; q `[2 * kv_heads][head_dim]`) against a float64
 * softmax over the `n` rows kvc_gather() returns for the layer: each output
 * within abs_tol + rel_tol x |reference|. */
static inline void assert_decode_matches_gather_rows(kvc_pool *p, uint64_t seq, uint32_t layer,
                                                     uint64_t n, uint32_t kv_heads,
                                                     uint32_t head_dim, const float *q,
                                                     double abs_tol, double rel_tol) {
  const uint64_t row = (uint64_t)kv_heads * head_dim, hq = 2 * (uint64_t)kv_heads;
  float *kg = (float *)malloc(sizeof(float) * n * row), *vg = (float *)malloc(sizeof(float) * n * row);
  float *out = (float *)malloc(sizeof(float) * hq * head_dim);
  double *sc = (double *)malloc(sizeof(double) * n);
  assert_true(kg && vg && out && sc);
  kvc_attention_params ap;
  kvc_attention_params_init(&ap);
  ap.num_q_heads = (uint32_t)hq;
  ASSERT_OK(kvc_attention_decode(p, layer, &seq, 1, q, out, NULL, &ap));
  ASSERT_OK(kvc_gather(p, seq, layer, 0, n, kg, vg, KVC_DTYPE_F32, NULL));
  for (uint64_t h = 0; h < hq; ++h) {
    const uint64_t g = h / 2;
    double mx = -1e300, sum = 0.0;
    for (uint64_t t = 0; t < n; ++t) {
      double d = 0.0;
      for (uint64_t e = 0; e < head_dim; ++e) d += (double)q[h * head_dim + e] * kg[t * row + g * head_dim + e];
      sc[t] = d / sqrt((double)head_dim);
      if (sc[t] > mx) mx = sc[t];
    }
    for (uint64_t t = 0; t < n; ++t) sum += exp(sc[t] - mx);
    for (uint64_t e = 0; e < head_dim; ++e) {
      double o = 0.0;
      for (uint64_t t = 0; t < n; ++t) o += exp(sc[t] - mx) / sum * vg[t * row + g * head_dim + e];
      assert_true(fabs((double)out[h * head_dim + e] - o) <= abs_tol + rel_tol * fabs(o));
    }
  }
  free(kg);
  free(vg);
  free(out);
  free(sc);
}

#endif /* KVC_TESTS_BLACKBOX_H */
