/* kvc_pool_seq_bytes: one sequence's bytes without a pool, against what real
 * pools of the same configurations hold token by token; bad input refused. */
#include "../blackbox.h"

enum { LAYERS = 3, HEADS = 2, HD = 16, ROW = HEADS * HD, BS = 8 };

/* Grows one sequence of `c` (with room for n_max tokens) one token at a time
 * and checks bytes_in_use and its running maximum against the call at every
 * length. */
static void check_against_pool(kvc_pool_config c, uint64_t n_max) {
  c.num_blocks = 0;
  c.capacity_bytes = 0;
  c.num_residual_blocks = 0;
  uint64_t one_block = 0;
  ASSERT_OK(kvc_pool_seq_bytes(&c, 1, &one_block, NULL));
  assert_true(one_block > 0);
  c.num_blocks = LAYERS * (n_max / BS + 2);
  kvc_pool *p = NULL;
  ASSERT_OK(kvc_pool_create(&c, &p));
  ASSERT_OK(kvc_seq_create(p, 1));
  float k[ROW], v[ROW];
  uint64_t running = 0;
  for (uint64_t n = 1; n <= n_max; ++n) {
    ASSERT_OK(kvc_seq_reserve(p, 1, 1, NULL));
    for (uint32_t l = 0; l < LAYERS; ++l) {
      fill_rows(k, v, 1, l, n - 1, 1, ROW);
      ASSERT_OK(kvc_append(p, 1, l, n - 1, 1, k, v, KVC_DTYPE_F32));
    }
    const uint64_t used = get_stats(p).bytes_in_use;
    if (used > running) running = used;
    uint64_t bytes = 0, peak = 0;
    ASSERT_OK(kvc_pool_seq_bytes(&c, n, &bytes, &peak));
    if (bytes != used || peak != running)
      print_error("at %llu tokens: pool %llu (peak %llu), kvc_pool_seq_bytes %llu (%llu)\n",
                  (unsigned long long)n, (unsigned long long)used, (unsigned long long)running,
                  (unsigned long long)bytes, (unsigned long long)peak);
    assert_int_equal(bytes, used);
    assert_int_equal(peak, running);
  }
  kvc_pool_destroy(p);
}

/* Plain storage: whole blocks per layer, equal to the pool's. */
static void test_plain_matches_pool(void **state) {
  (void)state;
  kvc_pool_config c = test_config(LAYERS, HEADS, HD, BS, 0);
  c.k_dtype = KVC_DTYPE_F16;
  c.v_dtype = KVC_DTYPE_BF16;
  check_against_pool(c, 40);
  /* By hand: 17 tokens take 3 blocks per layer of BS x ROW x 2 bytes x 2 parts. */
  uint64_t bytes = 0, peak = 0;
  ASSERT_OK(kvc_pool_seq_bytes(&c, 17, &bytes, &peak));
  assert_int_equal(bytes, (uint64_t)LAYERS * 3 * BS * ROW * 2 * 2);
  assert_int_equal(peak, bytes);
  ASSERT_OK(kvc_pool_seq_bytes(&c, 0, &bytes, &peak));
  assert_int_equal(bytes, 0);
  assert_int_equal(peak, 0);
}

/* A KIVI pool (per-channel keys in groups, a residual window, sinks): staged
 * tokens leave the residual as they age, so bytes fall and peak does not. */
static void test_residual_matches_pool(void **state) {
  (void)state;
  kvc_codec kc, vc;
  kvc_codec_init(&kc);
  kc.dtype = KVC_DTYPE_INT4;
  kc.granularity = KVC_SCALE_PER_CHANNEL;
  kc.group_size = 4;
  kc.asymmetric = 1;
  kvc_codec_init(&vc);
  vc.dtype = KVC_DTYPE_INT4;
  vc.granularity = KVC_SCALE_PER_TOKEN;
  vc.asymmetric = 1;
  kvc_pool_config c = test_config(LAYERS, HEADS, HD, BS, 0);
  c.k_codec = &kc;
  c.v_codec = &vc;
  c.residual_window = 5;
  c.residual_sinks = 2;
  check_against_pool(c, 60);
  uint64_t bytes = 0, peak = 0;
  ASSERT_OK(kvc_pool_seq_bytes(&c, 60, &bytes, &peak));
  assert_true(peak >= bytes);
  /* A hybrid share: the newest quarter stays staged. */
  c.residual_window = 0;
  c.residual_sinks = 0;
  c.residual_fraction = 0.25;
  check_against_pool(c, 60);
}

/* Sizes far beyond memory saturate instead of wrapping. */
static void test_saturates(void **state) {
  (void)state;
  kvc_pool_config c = test_config(4096, 64, 1024, 16, 0);
  uint64_t bytes = 0, peak = 0;
  ASSERT_OK(kvc_pool_seq_bytes(&c, UINT64_MAX / 2, &bytes, &peak));
  assert_int_equal(bytes, UINT64_MAX);
  assert_int_equal(peak, UINT64_MAX);
  /* The largest length returns too (a loop up to n must not wrap). */
  bytes = peak = 0;
  ASSERT_OK(kvc_pool_seq_bytes(&c, UINT64_MAX, &bytes, &peak));
  assert_int_equal(bytes, UINT64_MAX);
  assert_int_equal(peak, UINT64_MAX);
  /* One block larger than this machine's memory: sized all the same (nothing is allocated). */
  kvc_pool_config big = test_config(1, 65536, 1024, 4096, 0);
  big.num_q_heads = 65536;
  ASSERT_OK(kvc_pool_seq_bytes(&big, 1, &bytes, &peak));
  assert_int_equal(bytes, (uint64_t)4096 * 65536 * 1024 * 4 * 2);
}

/* Bad input: a clear status, and outputs left as they were. */
static void test_bad_input(void **state) {
  (void)state;
  uint64_t bytes = 7, peak = 9;
  ASSERT_STATUS(KVC_ERR_NULL_POINTER, kvc_pool_seq_bytes(NULL, 4, &bytes, &peak));
  kvc_pool_config c = test_config(LAYERS, HEADS, HD, BS, 0);
  c.num_kv_heads = 0;
  ASSERT_STATUS(KVC_ERR_INVALID_ARGUMENT, kvc_pool_seq_bytes(&c, 4, &bytes, &peak));
  assert_non_null(strstr(kvc_last_error_message(), "num_kv_heads"));
  c = test_config(LAYERS, HEADS, HD, BS, 0);
  c.residual_window = 8; /* a residual window without a quantized codec */
  ASSERT_STATUS(KVC_ERR_INVALID_ARGUMENT, kvc_pool_seq_bytes(&c, 4, &bytes, &peak));
  c = test_config(LAYERS, HEADS, HD, BS, 0);
  c.struct_size = 3; /* ends inside a field */
  ASSERT_STATUS(KVC_ERR_STRUCT_SIZE, kvc_pool_seq_bytes(&c, 4, &bytes, &peak));
  assert_int_equal(bytes, 7);
  assert_int_equal(peak, 9);
  /* Either output may be NULL. */
  c = test_config(LAYERS, HEADS, HD, BS, 0);
  ASSERT_OK(kvc_pool_seq_bytes(&c, 4, NULL, NULL));
  ASSERT_OK(kvc_pool_seq_bytes(&c, 4, &bytes, NULL));
  assert_int_equal(bytes, (uint64_t)LAYERS * BS * ROW * 4 * 2);
}

int main(int argc, char **argv) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_plain_matches_pool),
      cmocka_unit_test(test_residual_matches_pool),
      cmocka_unit_test(test_saturates),
      cmocka_unit_test(test_bad_input),
  };
  return run_named_tests("core_seq_bytes", tests, sizeof tests / sizeof tests[0], argc, argv);
}
