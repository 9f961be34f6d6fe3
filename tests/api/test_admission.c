/* Admission: a request that cannot fit even in an empty pool is refused with
 * KVC_ERR_EXCEEDS_CAPACITY ("never"), one that fits once blocks are freed with
 * KVC_ERR_POOL_EXHAUSTED ("not now"); both change nothing. */
#include "../blackbox.h"

enum { LAYERS = 2, HEADS = 1, HD = 4, ROW = HEADS * HD, BS = 4, BLOCKS = 8 };

static void write_all(kvc_pool *p, uint64_t id, uint64_t pos, uint64_t n) {
  float *k = calloc(n * ROW + 1, sizeof(float)), *v = calloc(n * ROW + 1, sizeof(float));
  for (uint32_t l = 0; l < LAYERS; ++l) {
    fill_rows(k, v, (uint32_t)id, l, pos, n, ROW);
    ASSERT_OK(kvc_append(p, id, l, pos, n, k, v, KVC_DTYPE_F32));
  }
  free(k);
  free(v);
}

static void assert_unchanged(kvc_pool *p, uint64_t id, uint64_t length, uint64_t used) {
  uint64_t len = 0;
  ASSERT_OK(kvc_seq_length(p, id, &len));
  assert_int_equal(len, length);
  assert_int_equal(get_stats(p).blocks_used, used);
}

/* More blocks than the pool has: never, whatever is freed. */
static void test_never_fits(void **state) {
  (void)state;
  kvc_pool *p = make_pool(LAYERS, HEADS, HD, BS, BLOCKS);
  ASSERT_OK(kvc_seq_create(p, 1));
  /* 17 tokens: 5 blocks per layer, 10 in all, the pool has 8. */
  ASSERT_STATUS(KVC_ERR_EXCEEDS_CAPACITY, kvc_seq_reserve(p, 1, 17, NULL));
  const char *msg = kvc_last_error_message();
  assert_non_null(strstr(msg, "needs 10 blocks"));
  assert_non_null(strstr(msg, "has 8 in all"));
  assert_unchanged(p, 1, 0, 0);
  assert_string_equal(kvc_status_string(KVC_ERR_EXCEEDS_CAPACITY), "KVC_ERR_EXCEEDS_CAPACITY");
  /* 16 tokens fill the pool exactly. */
  ASSERT_OK(kvc_seq_reserve(p, 1, 16, NULL));
  assert_unchanged(p, 1, 16, 8);
  /* One more token can never fit, even though the pool is merely full. */
  ASSERT_STATUS(KVC_ERR_EXCEEDS_CAPACITY, kvc_seq_reserve(p, 1, 1, NULL));
  assert_unchanged(p, 1, 16, 8);
  kvc_pool_destroy(p);
}

/* Room taken by another sequence: not now, and it fits once that one is freed. */
static void test_not_now(void **state) {
  (void)state;
  kvc_pool *p = make_pool(LAYERS, HEADS, HD, BS, BLOCKS);
  ASSERT_OK(kvc_seq_create(p, 1));
  ASSERT_OK(kvc_seq_create(p, 2));
  ASSERT_OK(kvc_seq_reserve(p, 1, 8, NULL)); /* 4 blocks */
  ASSERT_STATUS(KVC_ERR_POOL_EXHAUSTED, kvc_seq_reserve(p, 2, 12, NULL)); /* 6 blocks, 4 free */
  assert_non_null(strstr(kvc_last_error_message(), "needs 6 blocks, 4 available"));
  assert_unchanged(p, 2, 0, 4);
  ASSERT_OK(kvc_seq_free(p, 1));
  ASSERT_OK(kvc_seq_reserve(p, 2, 12, NULL));
  assert_unchanged(p, 2, 12, 6);
  kvc_pool_destroy(p);
}

/* Blocks shared with a fork count once: the child alone would hold them. */
static void test_shared_blocks_count_once(void **state) {
  (void)state;
  kvc_pool *p = make_pool(LAYERS, HEADS, HD, BS, BLOCKS);
  ASSERT_OK(kvc_seq_create(p, 1));
  ASSERT_OK(kvc_seq_reserve(p, 1, 8, NULL)); /* 2 blocks per layer */
  write_all(p, 1, 0, 8);
  ASSERT_OK(kvc_seq_fork(p, 1, 2));
  /* The child with 9 more tokens would hold 5 blocks per layer: 10 > 8. */
  ASSERT_STATUS(KVC_ERR_EXCEEDS_CAPACITY, kvc_seq_reserve(p, 2, 9, NULL));
  /* With 8 more it holds 8 (4 shared, 4 new): fits, and 4 are free now. */
  ASSERT_OK(kvc_seq_reserve(p, 2, 8, NULL));
  assert_unchanged(p, 2, 16, 8);
  /* A second child needs 4 new blocks: possible once others go, so not now. */
  ASSERT_OK(kvc_seq_fork(p, 1, 3));
  ASSERT_STATUS(KVC_ERR_POOL_EXHAUSTED, kvc_seq_reserve(p, 3, 8, NULL));
  ASSERT_OK(kvc_seq_free(p, 2));
  ASSERT_OK(kvc_seq_reserve(p, 3, 8, NULL));
  kvc_pool_destroy(p);
}

/* Cached prefix blocks are reclaimable room, not capacity taken. */
static void test_cached_blocks_are_room(void **state) {
  (void)state;
  kvc_pool *p = make_pool(LAYERS, HEADS, HD, BS, BLOCKS);
  kvc_prefix_config pc;
  kvc_prefix_config_init(&pc);
  ASSERT_OK(kvc_pool_enable_prefix_cache(p, &pc));
  int32_t tokens[16];
  for (int i = 0; i < 16; ++i) tokens[i] = 100 + i;
  ASSERT_OK(kvc_seq_create(p, 1));
  ASSERT_OK(kvc_seq_reserve(p, 1, 16, NULL));
  write_all(p, 1, 0, 16);
  uint64_t reg = 0;
  ASSERT_OK(kvc_prefix_insert(p, 1, tokens, 16, NULL, 0, &reg));
  assert_int_equal(reg, 4);
  ASSERT_OK(kvc_seq_free(p, 1));
  assert_int_equal(get_stats(p).blocks_cached, 8);
  ASSERT_OK(kvc_seq_create(p, 2));
  ASSERT_OK(kvc_seq_reserve(p, 2, 16, NULL)); /* reclaims every cached block */
  ASSERT_STATUS(KVC_ERR_EXCEEDS_CAPACITY, kvc_seq_reserve(p, 2, 1, NULL));
  kvc_pool_destroy(p);
}

/* A residual window: the residual arena has its own capacity. */
static void test_residual_arena(void **state) {
  (void)state;
  kvc_pool_config c = test_config(LAYERS, HEADS, HD, BS, BLOCKS);
  c.residual_window = 8;
  c.num_residual_blocks = 4; /* 2 per layer: 8 staged tokens at most */
  kvc_pool *p = quantized_pool(c, KVC_DTYPE_INT8);
  ASSERT_OK(kvc_seq_create(p, 1));
  /* 9 new tokens stay staged (nothing older to age): 3 residual blocks per layer. */
  ASSERT_STATUS(KVC_ERR_EXCEEDS_CAPACITY, kvc_seq_reserve(p, 1, 9, NULL));
  assert_non_null(strstr(kvc_last_error_message(), "residual blocks (the pool has 4)"));
  ASSERT_OK(kvc_seq_reserve(p, 1, 8, NULL));
  write_all(p, 1, 0, 8);
  /* Tokens age into the main arena as new ones come: a long sequence fits. */
  for (uint64_t pos = 8; pos < 24; pos += 4) {
    ASSERT_OK(kvc_seq_reserve(p, 1, 4, NULL));
    write_all(p, 1, pos, 4);
  }
  kvc_pool_destroy(p);
}

/* A residual that no longer starts at its block's first slot needs one more
 * block: a lone sequence decoding token by token into a residual arena too
 * small for that is told "never", not "not now" for ever. */
static void test_residual_offset(void **state) {
  (void)state;
  kvc_pool_config c = test_config(LAYERS, HEADS, HD, 16, 64);
  c.residual_window = 8;
  c.num_residual_blocks = 2; /* one per layer */
  kvc_pool *p = quantized_pool(c, KVC_DTYPE_INT8);
  ASSERT_OK(kvc_seq_create(p, 1));
  kvc_status st = KVC_OK;
  uint64_t pos = 0;
  for (; pos < 64 && st == KVC_OK; ++pos) {
    st = kvc_seq_reserve(p, 1, 1, NULL);
    if (st == KVC_OK) write_all(p, 1, pos, 1);
  }
  /* It stops at some token, and says it never fits. */
  assert_true(pos < 64);
  ASSERT_STATUS(KVC_ERR_EXCEEDS_CAPACITY, st);
  kvc_pool_destroy(p);
}

/* kvc_seq_restore: a record larger than the whole pool never fits. */
static void test_restore(void **state) {
  (void)state;
  kvc_pool *big = make_pool(LAYERS, HEADS, HD, BS, 4 * BLOCKS);
  kvc_pool *p = make_pool(LAYERS, HEADS, HD, BS, BLOCKS);
  ASSERT_OK(kvc_seq_create(big, 1));
  ASSERT_OK(kvc_seq_reserve(big, 1, 20, NULL)); /* 10 blocks */
  write_all(big, 1, 0, 20);
  size_t size = 0;
  ASSERT_STATUS(KVC_ERR_BUFFER_TOO_SMALL, kvc_seq_save(big, 1, NULL, 0, &size));
  uint8_t *rec = malloc(size);
  ASSERT_OK(kvc_seq_save(big, 1, rec, size, &size));
  ASSERT_STATUS(KVC_ERR_EXCEEDS_CAPACITY, kvc_seq_restore(p, 7, rec, size));
  assert_non_null(strstr(kvc_last_error_message(), "needs 10 blocks (the pool has 8)"));
  assert_int_equal(get_stats(p).num_sequences, 0);
  /* A record that fits once room is freed: not now. */
  ASSERT_OK(kvc_seq_truncate(big, 1, 12)); /* 6 blocks */
  ASSERT_OK(kvc_seq_save(big, 1, rec, size, &size));
  ASSERT_OK(kvc_seq_create(p, 2));
  ASSERT_OK(kvc_seq_reserve(p, 2, 8, NULL)); /* 4 blocks taken */
  ASSERT_STATUS(KVC_ERR_POOL_EXHAUSTED, kvc_seq_restore(p, 7, rec, size));
  ASSERT_OK(kvc_seq_free(p, 2));
  ASSERT_OK(kvc_seq_restore(p, 7, rec, size));
  free(rec);
  kvc_pool_destroy(p);
  kvc_pool_destroy(big);
}

/* With an auto-evicting policy what counts is the sequence after eviction. */
static void test_auto_evict(void **state) {
  (void)state;
  kvc_pool *p = make_pool(LAYERS, HEADS, HD, BS, BLOCKS);
  kvc_policy_config pc;
  kvc_policy_config_init(&pc);
  pc.kind = KVC_POLICY_STREAMING;
  pc.sink_tokens = 0;
  pc.budget_tokens = 8;
  pc.auto_evict = 1;
  kvc_policy *pol = NULL;
  ASSERT_OK(kvc_policy_create(&pc, &pol));
  ASSERT_OK(kvc_pool_set_policy(p, pol));
  ASSERT_OK(kvc_seq_create(p, 1));
  /* A long stream stays under the budget: 3 blocks per layer at most. */
  for (uint64_t pos = 0; pos < 64; pos += 4) {
    ASSERT_OK(kvc_seq_reserve(p, 1, 4, NULL));
    write_all(p, 1, pos, 4);
  }
  /* 17 new tokens exceed the pool whatever the eviction keeps. */
  ASSERT_STATUS(KVC_ERR_EXCEEDS_CAPACITY, kvc_seq_reserve(p, 1, 17, NULL));
  kvc_policy_destroy(pol);
  kvc_pool_destroy(p);
}

int main(int argc, char **argv) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_never_fits),
      cmocka_unit_test(test_not_now),
      cmocka_unit_test(test_shared_blocks_count_once),
      cmocka_unit_test(test_cached_blocks_are_room),
      cmocka_unit_test(test_residual_arena),
      cmocka_unit_test(test_residual_offset),
      cmocka_unit_test(test_restore),
      cmocka_unit_test(test_auto_evict),
  };
  return run_named_tests("core_admission", tests, sizeof tests / sizeof tests[0], argc, argv);
}
