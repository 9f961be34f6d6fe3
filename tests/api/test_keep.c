/* kvc_seq_keep: the caller names the survivors of one layer (kvpress's
 * presses through kvcache.hf, an engine's own scorer); the others are
 * dropped as an eviction drops them, and nothing changes on bad input. */
#include "../blackbox.h"

enum { LAYERS = 2, HEADS = 2, HD = 4, ROW = HEADS * HD, BS = 4, BLOCKS = 32 };

static void write_layer(kvc_pool *p, uint64_t id, uint32_t tag, uint32_t layer, uint64_t n) {
  float *k = calloc(n * ROW, sizeof(float)), *v = calloc(n * ROW, sizeof(float));
  fill_rows(k, v, tag, layer, 0, n, ROW);
  ASSERT_OK(kvc_append(p, id, layer, 0, n, k, v, KVC_DTYPE_F32));
  free(k);
  free(v);
}

/* A sequence `id` of n tokens in every layer. */
static void make_seq(kvc_pool *p, uint64_t id, uint32_t tag, uint64_t n) {
  ASSERT_OK(kvc_seq_create(p, id));
  ASSERT_OK(kvc_seq_reserve(p, id, n, NULL));
  for (uint32_t l = 0; l < LAYERS; ++l) write_layer(p, id, tag, l, n);
}

/* Asserts the layer holds exactly the tokens of `pos` (text positions, in order). */
static void expect_tokens(kvc_pool *p, uint64_t id, uint32_t tag, uint32_t layer, const uint64_t *pos, uint64_t n) {
  uint64_t held = 0;
  ASSERT_OK(kvc_seq_layer_tokens(p, id, layer, &held));
  assert_int_equal(held, n);
  float *k = calloc(n * ROW + 1, sizeof(float)), *v = calloc(n * ROW + 1, sizeof(float));
  int32_t *got = calloc(n + 1, sizeof(int32_t));
  if (n) ASSERT_OK(kvc_gather(p, id, layer, 0, n, k, v, KVC_DTYPE_F32, got));
  for (uint64_t t = 0; t < n; ++t) {
    assert_int_equal(got[t], (int32_t)pos[t]);
    for (uint32_t e = 0; e < ROW; ++e) {
      assert_float_equal(k[t * ROW + e], kv_value(tag, layer, pos[t], e, 0), 0.0f);
      assert_float_equal(v[t * ROW + e], kv_value(tag, layer, pos[t], e, 1), 0.0f);
    }
  }
  free(k), free(v), free(got);
}

static void test_keep_subset_frees_blocks(void **state) {
  (void)state;
  kvc_pool *p = make_pool(LAYERS, HEADS, HD, BS, BLOCKS);
  make_seq(p, 1, 1, 10); /* 3 blocks per layer */
  const uint64_t before = get_stats(p).blocks_used;
  const uint64_t keep[] = {0, 3, 4, 9};
  uint64_t dropped = 0;
  ASSERT_OK(kvc_seq_keep(p, 1, 0, keep, 4, &dropped));
  assert_int_equal(dropped, 6);
  expect_tokens(p, 1, 1, 0, keep, 4);
  const uint64_t all[] = {0, 1, 2, 3, 4, 5, 6, 7, 8, 9};
  expect_tokens(p, 1, 1, 1, all, 10); /* the other layer is untouched */
  assert_int_equal(get_stats(p).blocks_used, before - 2); /* layer 0: 3 blocks -> 1 */
  /* Appends continue at the sequence's next position. */
  ASSERT_OK(kvc_seq_reserve(p, 1, 1, NULL));
  float k[ROW], v[ROW];
  fill_rows(k, v, 1, 0, 10, 1, ROW);
  ASSERT_OK(kvc_append(p, 1, 0, 10, 1, k, v, KVC_DTYPE_F32));
  const uint64_t after[] = {0, 3, 4, 9, 10};
  expect_tokens(p, 1, 1, 0, after, 5);
  kvc_pool_destroy(p);
}

static void test_keep_all_and_none(void **state) {
  (void)state;
  kvc_pool *p = make_pool(LAYERS, HEADS, HD, BS, BLOCKS);
  make_seq(p, 1, 1, 6);
  const uint64_t all[] = {0, 1, 2, 3, 4, 5};
  uint64_t dropped = 99;
  ASSERT_OK(kvc_seq_keep(p, 1, 1, all, 6, &dropped));
  assert_int_equal(dropped, 0);
  expect_tokens(p, 1, 1, 1, all, 6);
  ASSERT_OK(kvc_seq_keep(p, 1, 1, NULL, 0, &dropped));
  assert_int_equal(dropped, 6);
  expect_tokens(p, 1, 1, 1, NULL, 0);
  kvc_pool_destroy(p);
}

/* A fork shares the blocks: the kept sequence copies before it writes. */
static void test_keep_fork_unchanged(void **state) {
  (void)state;
  kvc_pool *p = make_pool(LAYERS, HEADS, HD, BS, BLOCKS);
  make_seq(p, 1, 1, 8);
  ASSERT_OK(kvc_seq_fork(p, 1, 2));
  const uint64_t keep[] = {1, 2, 6};
  ASSERT_OK(kvc_seq_keep(p, 2, 0, keep, 3, NULL));
  expect_tokens(p, 2, 1, 0, keep, 3);
  const uint64_t all[] = {0, 1, 2, 3, 4, 5, 6, 7};
  expect_tokens(p, 1, 1, 0, all, 8);
  kvc_pool_destroy(p);
}

/* Recorded scores follow their tokens. */
static void test_keep_scores_follow(void **state) {
  (void)state;
  kvc_pool *p = make_pool(LAYERS, HEADS, HD, BS, BLOCKS);
  make_seq(p, 1, 1, 5);
  float sc[5 * HEADS];
  for (int i = 0; i < 5 * HEADS; ++i) sc[i] = (float)i;
  ASSERT_OK(kvc_seq_observe_scores(p, 1, 0, sc, 5, 0));
  const uint64_t keep[] = {1, 4};
  ASSERT_OK(kvc_seq_keep(p, 1, 0, keep, 2, NULL));
  float got[2 * HEADS];
  ASSERT_OK(kvc_seq_scores(p, 1, 0, got, 2));
  for (int h = 0; h < HEADS; ++h) {
    assert_float_equal(got[h], sc[1 * HEADS + h], 0.0f);
    assert_float_equal(got[HEADS + h], sc[4 * HEADS + h], 0.0f);
  }
  kvc_pool_destroy(p);
}

static void test_keep_bad_input_changes_nothing(void **state) {
  (void)state;
  kvc_pool *p = make_pool(LAYERS, HEADS, HD, BS, BLOCKS);
  make_seq(p, 1, 1, 6);
  const uint64_t all[] = {0, 1, 2, 3, 4, 5};
  const uint64_t dup[] = {0, 2, 2}, down[] = {3, 1}, far[] = {0, 6}, seven[] = {0, 1, 2, 3, 4, 5, 6};
  ASSERT_STATUS(KVC_ERR_INVALID_ARGUMENT, kvc_seq_keep(p, 1, 0, dup, 3, NULL));
  ASSERT_STATUS(KVC_ERR_INVALID_ARGUMENT, kvc_seq_keep(p, 1, 0, down, 2, NULL));
  ASSERT_STATUS(KVC_ERR_OUT_OF_RANGE, kvc_seq_keep(p, 1, 0, far, 2, NULL));
  ASSERT_STATUS(KVC_ERR_INVALID_ARGUMENT, kvc_seq_keep(p, 1, 0, seven, 7, NULL));
  ASSERT_STATUS(KVC_ERR_OUT_OF_RANGE, kvc_seq_keep(p, 1, LAYERS, all, 1, NULL));
  ASSERT_STATUS(KVC_ERR_NULL_POINTER, kvc_seq_keep(p, 1, 0, NULL, 2, NULL));
  ASSERT_STATUS(KVC_ERR_SEQ_NOT_FOUND, kvc_seq_keep(p, 7, 0, all, 1, NULL));
  ASSERT_STATUS(KVC_ERR_NULL_POINTER, kvc_seq_keep(NULL, 1, 0, all, 1, NULL));
  for (uint32_t l = 0; l < LAYERS; ++l) expect_tokens(p, 1, 1, l, all, 6);
  kvc_pool_destroy(p);
}

/* A residual window stages tokens: dropping is refused, nothing changes. */
static void test_keep_residual_unsupported(void **state) {
  (void)state;
  kvc_pool_config c = test_config(LAYERS, HEADS, HD, BS, BLOCKS);
  c.residual_window = 4;
  kvc_pool *p = quantized_pool(c, KVC_DTYPE_INT8);
  ASSERT_OK(kvc_seq_create(p, 1));
  ASSERT_OK(kvc_seq_reserve(p, 1, 6, NULL));
  for (uint32_t l = 0; l < LAYERS; ++l) write_layer(p, 1, 1, l, 6);
  const uint64_t keep[] = {0, 5};
  ASSERT_STATUS(KVC_ERR_UNSUPPORTED, kvc_seq_keep(p, 1, 0, keep, 2, NULL));
  uint64_t held = 0;
  ASSERT_OK(kvc_seq_layer_tokens(p, 1, 0, &held));
  assert_int_equal(held, 6);
  kvc_pool_destroy(p);
}

int main(int argc, char **argv) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_keep_subset_frees_blocks), cmocka_unit_test(test_keep_all_and_none),
      cmocka_unit_test(test_keep_fork_unchanged),      cmocka_unit_test(test_keep_scores_follow),
      cmocka_unit_test(test_keep_bad_input_changes_nothing), cmocka_unit_test(test_keep_residual_unsupported),
  };
  return run_named_tests("core_keep", tests, sizeof tests / sizeof tests[0], argc, argv);
}
