/* Registration only of what was written: kvc_prefix_insert refuses a block
 * with a slot that was reserved but never written, registers nothing then,
 * and no later call makes such a block findable. */
#include "../blackbox.h"

enum { LAYERS = 2, HEADS = 1, HD = 4, ROW = HEADS * HD, BS = 4, BLOCKS = 32 };

static kvc_pool *prefix_pool(void) {
  kvc_pool *p = make_pool(LAYERS, HEADS, HD, BS, BLOCKS);
  kvc_prefix_config pc;
  kvc_prefix_config_init(&pc);
  ASSERT_OK(kvc_pool_enable_prefix_cache(p, &pc));
  return p;
}

static void write_rows(kvc_pool *p, uint64_t id, uint32_t layer, uint64_t pos, uint64_t n) {
  float k[16 * ROW], v[16 * ROW];
  fill_rows(k, v, 1, layer, pos, n, ROW);
  ASSERT_OK(kvc_append(p, id, layer, pos, n, k, v, KVC_DTYPE_F32));
}

static const int32_t kTokens[9] = {5, 6, 7, 8, 9, 10, 11, 12, 13};

static uint64_t registered(kvc_pool *p) {
  kvc_prefix_stats st;
  kvc_prefix_stats_init(&st);
  ASSERT_OK(kvc_prefix_get_stats(p, &st));
  return st.registered_blocks;
}

static uint64_t hits(kvc_pool *p) {
  kvc_prefix_result r;
  memset(&r, 0, sizeof r);
  r.struct_size = sizeof r;
  ASSERT_OK(kvc_prefix_lookup(p, kTokens, 9, NULL, 0, 0, &r));
  return r.hit_tokens;
}

/* One layer left a slot unwritten: refused, nothing registered, nothing found. */
static void test_insert_refused(void **state) {
  (void)state;
  kvc_pool *p = prefix_pool();
  ASSERT_OK(kvc_seq_create(p, 1));
  ASSERT_OK(kvc_seq_reserve(p, 1, 8, NULL));
  write_rows(p, 1, 0, 0, 8);
  write_rows(p, 1, 1, 0, 6); /* layer 1 positions 6, 7 unwritten */
  uint64_t n = 77;
  ASSERT_STATUS(KVC_ERR_INVALID_ARGUMENT, kvc_prefix_insert(p, 1, kTokens, 8, NULL, 0, &n));
  assert_non_null(strstr(kvc_last_error_message(), "position 6 of layer 1"));
  assert_int_equal(n, 77); /* not written on failure */
  assert_int_equal(registered(p), 0);
  assert_int_equal(hits(p), 0);
  write_rows(p, 1, 1, 6, 2);
  ASSERT_OK(kvc_prefix_insert(p, 1, kTokens, 8, NULL, 0, &n));
  assert_int_equal(n, 2);
  assert_int_equal(hits(p), 8);
  kvc_pool_destroy(p);
}

/* Written out of order: the newest positions first. */
static void test_out_of_order(void **state) {
  (void)state;
  kvc_pool *p = prefix_pool();
  ASSERT_OK(kvc_seq_create(p, 1));
  ASSERT_OK(kvc_seq_reserve(p, 1, 8, NULL));
  for (uint32_t l = 0; l < LAYERS; ++l) write_rows(p, 1, l, 4, 4);
  ASSERT_STATUS(KVC_ERR_INVALID_ARGUMENT, kvc_prefix_insert(p, 1, kTokens, 8, NULL, 0, NULL));
  assert_non_null(strstr(kvc_last_error_message(), "position 0 of layer 0"));
  /* Only the first block asked for: still unwritten. */
  ASSERT_STATUS(KVC_ERR_INVALID_ARGUMENT, kvc_prefix_insert(p, 1, kTokens, 4, NULL, 0, NULL));
  for (uint32_t l = 0; l < LAYERS; ++l) write_rows(p, 1, l, 0, 4);
  ASSERT_OK(kvc_prefix_insert(p, 1, kTokens, 8, NULL, 0, NULL));
  assert_int_equal(registered(p), 2);
  kvc_pool_destroy(p);
}

/* A registered block cut by truncation and grown again (its slots reserved
 * anew, unwritten) is neither findable nor registrable until written. */
static void test_truncate_and_reserve(void **state) {
  (void)state;
  kvc_pool *p = prefix_pool();
  ASSERT_OK(kvc_seq_create(p, 1));
  ASSERT_OK(kvc_seq_reserve(p, 1, 8, NULL));
  for (uint32_t l = 0; l < LAYERS; ++l) write_rows(p, 1, l, 0, 8);
  ASSERT_OK(kvc_prefix_insert(p, 1, kTokens, 8, NULL, 0, NULL));
  assert_int_equal(hits(p), 8);
  ASSERT_OK(kvc_seq_truncate(p, 1, 6)); /* sole holder: the second block leaves the index */
  assert_int_equal(hits(p), 4);
  ASSERT_OK(kvc_seq_reserve(p, 1, 2, NULL));
  ASSERT_STATUS(KVC_ERR_INVALID_ARGUMENT, kvc_prefix_insert(p, 1, kTokens, 8, NULL, 0, NULL));
  assert_int_equal(hits(p), 4);
  /* Freed with the slots unwritten: the unregistered block goes free, not cached. */
  ASSERT_OK(kvc_seq_free(p, 1));
  assert_int_equal(registered(p), 1);
  assert_int_equal(hits(p), 4);
  kvc_pool_destroy(p);
}

/* A fork shares the parent's unwritten slots: the child cannot register them. */
static void test_fork(void **state) {
  (void)state;
  kvc_pool *p = prefix_pool();
  ASSERT_OK(kvc_seq_create(p, 1));
  ASSERT_OK(kvc_seq_reserve(p, 1, 4, NULL));
  write_rows(p, 1, 0, 0, 4);
  write_rows(p, 1, 1, 0, 3);
  ASSERT_OK(kvc_seq_fork(p, 1, 2));
  ASSERT_STATUS(KVC_ERR_INVALID_ARGUMENT, kvc_prefix_insert(p, 2, kTokens, 4, NULL, 0, NULL));
  /* The child writes the slot (copy on write): its own block registers. */
  write_rows(p, 2, 1, 3, 1);
  ASSERT_OK(kvc_prefix_insert(p, 2, kTokens, 4, NULL, 0, NULL));
  assert_int_equal(hits(p), 4);
  ASSERT_STATUS(KVC_ERR_INVALID_ARGUMENT, kvc_prefix_insert(p, 1, kTokens, 4, NULL, 0, NULL));
  kvc_pool_destroy(p);
}

/* A record keeps the unwritten positions unwritten: the restored sequence
 * registers its blocks only once it writes them. */
static void test_restore_written(void **state) {
  (void)state;
  kvc_pool *p = prefix_pool();
  ASSERT_OK(kvc_seq_create(p, 1));
  ASSERT_OK(kvc_seq_reserve(p, 1, 8, NULL));
  for (uint32_t l = 0; l < LAYERS; ++l) write_rows(p, 1, l, 0, 7);
  size_t size = 0;
  ASSERT_STATUS(KVC_ERR_BUFFER_TOO_SMALL, kvc_seq_save(p, 1, NULL, 0, &size));
  uint8_t *rec = malloc(size);
  ASSERT_OK(kvc_seq_save(p, 1, rec, size, &size));
  ASSERT_OK(kvc_seq_free(p, 1));
  ASSERT_OK(kvc_seq_restore(p, 2, rec, size));
  ASSERT_STATUS(KVC_ERR_INVALID_ARGUMENT, kvc_prefix_insert(p, 2, kTokens, 8, NULL, 0, NULL));
  assert_non_null(strstr(kvc_last_error_message(), "position 7 of layer 0"));
  uint64_t n = 0;
  ASSERT_OK(kvc_prefix_insert(p, 2, kTokens, 4, NULL, 0, &n)); /* the written first block */
  assert_int_equal(n, 1);
  for (uint32_t l = 0; l < LAYERS; ++l) write_rows(p, 2, l, 7, 1);
  ASSERT_OK(kvc_prefix_insert(p, 2, kTokens, 8, NULL, 0, &n));
  assert_int_equal(n, 1);
  free(rec);
  kvc_pool_destroy(p);
}

int main(int argc, char **argv) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_insert_refused),       cmocka_unit_test(test_out_of_order),
      cmocka_unit_test(test_truncate_and_reserve), cmocka_unit_test(test_fork),
      cmocka_unit_test(test_restore_written),
  };
  return run_named_tests("prefix_unwritten", tests, sizeof tests / sizeof tests[0], argc, argv);
}
