/* cmocka tests of the pool, sequences, append/gather, fork, truncate,
 * page-table export, stats and every error path of the C API. */
#include "../blackbox.h"

#include <math.h>
#include <stdio.h>

/* ---------------------------------------------------------------- basics */

static void test_version_and_strings(void **state) {
  (void)state;
  assert_int_equal(kvc_version(), KVC_VERSION_NUMBER);
  char expect[32];
  snprintf(expect, sizeof expect, "%d.%d.%d", KVC_VERSION_MAJOR, KVC_VERSION_MINOR,
           KVC_VERSION_PATCH);
  assert_string_equal(kvc_version_string(), expect);
  assert_string_equal(kvc_status_string(KVC_OK), "KVC_OK");
  assert_string_equal(kvc_status_string(KVC_ERR_POOL_EXHAUSTED), "KVC_ERR_POOL_EXHAUSTED");
  assert_string_equal(kvc_status_string(KVC_ERR_SEQ_NOT_FOUND), "KVC_ERR_SEQ_NOT_FOUND");
  assert_string_equal(kvc_status_string((kvc_status)12345), "KVC_ERR_UNKNOWN");
  /* Every defined code has its own name. */
  for (int a = 0; a <= KVC_ERR_TIMEOUT; ++a)
    for (int b = a + 1; b <= KVC_ERR_TIMEOUT; ++b)
      assert_string_not_equal(kvc_status_string((kvc_status)a), kvc_status_string((kvc_status)b));
  assert_int_equal(KVC_OK, 0);
}

static void test_dtype_size_and_convert(void **state) {
  (void)state;
  size_t b = 0;
  ASSERT_OK(kvc_dtype_size(KVC_DTYPE_F32, &b));
  assert_int_equal(b, 4);
  ASSERT_OK(kvc_dtype_size(KVC_DTYPE_F16, &b));
  assert_int_equal(b, 2);
  ASSERT_OK(kvc_dtype_size(KVC_DTYPE_BF16, &b));
  assert_int_equal(b, 2);
  ASSERT_STATUS(KVC_ERR_INVALID_ARGUMENT, kvc_dtype_size((kvc_dtype)7, &b));
  assert_non_null(strstr(kvc_last_error_message(), "dtype"));
  ASSERT_STATUS(KVC_ERR_NULL_POINTER, kvc_dtype_size(KVC_DTYPE_F32, NULL));

  const float src[6] = {1.0f, -2.5f, 65504.0f, 1e-8f, 3.14159265f, 70000.0f};
  uint16_t h[6], bf[6];
  float back[6];
  ASSERT_OK(kvc_convert(src, KVC_DTYPE_F32, h, KVC_DTYPE_F16, 6));
  assert_int_equal(h[0], 0x3c00);
  assert_int_equal(h[1], 0xc100);
  assert_int_equal(h[2], 0x7bff);
  assert_int_equal(h[5], 0x7c00); /* beyond f16 range: +Inf */
  ASSERT_OK(kvc_convert(h, KVC_DTYPE_F16, back, KVC_DTYPE_F32, 6));
  assert_float_equal(back[4], 3.140625f, 0.0f);
  assert_true(isinf(back[5]));
  ASSERT_OK(kvc_convert(src, KVC_DTYPE_F32, bf, KVC_DTYPE_BF16, 6));
  assert_int_equal(bf[0], 0x3f80);
  ASSERT_OK(kvc_convert(bf, KVC_DTYPE_BF16, back, KVC_DTYPE_F32, 6));
  assert_float_equal(back[1], -2.5f, 0.0f);
  ASSERT_OK(kvc_convert(NULL, KVC_DTYPE_F32, NULL, KVC_DTYPE_F16, 0));
  ASSERT_STATUS(KVC_ERR_NULL_POINTER, kvc_convert(NULL, KVC_DTYPE_F32, h, KVC_DTYPE_F16, 1));
  ASSERT_STATUS(KVC_ERR_INVALID_ARGUMENT, kvc_convert(src, (kvc_dtype)-1, h, KVC_DTYPE_F16, 1));
}

static void test_config_init_defaults(void **state) {
  (void)state;
  kvc_pool_config c;
  memset(&c, 0xab, sizeof c);
  ASSERT_OK(kvc_pool_config_init(&c));
  assert_int_equal(c.struct_size, sizeof c);
  assert_int_equal(c.block_size, 16);
  assert_int_equal(c.k_dtype, KVC_DTYPE_F16);
  assert_int_equal(c.v_dtype, KVC_DTYPE_F16);
  assert_int_equal(c.layout, KVC_LAYOUT_NHD);
  assert_int_equal(c.device, KVC_DEVICE_CPU);
  assert_int_equal(c.num_layers, 0);
  assert_int_equal(c.num_blocks, 0);
  assert_int_equal(c.flags, 0);
  /* The 0.3 functions: the header's macros need a typed pointer. */
  ASSERT_STATUS(KVC_ERR_NULL_POINTER, (kvc_pool_config_init)(NULL));
  kvc_stats s;
  ASSERT_OK(kvc_stats_init(&s));
  assert_int_equal(s.struct_size, sizeof s);
  ASSERT_STATUS(KVC_ERR_NULL_POINTER, (kvc_stats_init)(NULL));
  kvc_pool_layout l;
  ASSERT_OK(kvc_pool_layout_init(&l));
  assert_int_equal(l.struct_size, sizeof l);
  ASSERT_STATUS(KVC_ERR_NULL_POINTER, (kvc_pool_layout_init)(NULL));
}

/* Each bad config gets its own status and a message naming the field; `out`
 * is never written. */
static void expect_create_fails(kvc_pool_config *c, kvc_status expected, const char *needle) {
  kvc_pool *sentinel = (kvc_pool *)(uintptr_t)0x1234;
  kvc_pool *out = sentinel;
  ASSERT_STATUS(expected, kvc_pool_create(c, &out));
  assert_ptr_equal(out, sentinel);
  if (needle && !strstr(kvc_last_error_message(), needle)) {
    print_error("message '%s' lacks '%s'\n", kvc_last_error_message(), needle);
    fail();
  }
}

static void test_create_rejects_bad_config(void **state) {
  (void)state;
  kvc_pool_config c;
  kvc_pool *out = NULL;
  ASSERT_STATUS(KVC_ERR_NULL_POINTER, kvc_pool_create(NULL, &out));
  c = test_config(2, 2, 8, 16, 8);
  ASSERT_STATUS(KVC_ERR_NULL_POINTER, kvc_pool_create(&c, NULL));

  c = test_config(0, 2, 8, 16, 8);
  expect_create_fails(&c, KVC_ERR_INVALID_ARGUMENT, "num_layers 0");
  c = test_config(5000, 2, 8, 16, 8);
  expect_create_fails(&c, KVC_ERR_INVALID_ARGUMENT, "num_layers");
  c = test_config(2, 0, 8, 16, 8);
  c.num_q_heads = 4;
  expect_create_fails(&c, KVC_ERR_INVALID_ARGUMENT, "num_kv_heads 0");
  c = test_config(2, 2, 0, 16, 8);
  expect_create_fails(&c, KVC_ERR_INVALID_ARGUMENT, "head_dim 0: must be 1..1024");
  c = test_config(2, 2, 2048, 16, 8);
  expect_create_fails(&c, KVC_ERR_INVALID_ARGUMENT, "head_dim 2048");
  c = test_config(2, 2, 8, 0, 8);
  expect_create_fails(&c, KVC_ERR_INVALID_ARGUMENT, "block_size 0");
  c = test_config(2, 2, 8, 1u << 20, 8);
  expect_create_fails(&c, KVC_ERR_INVALID_ARGUMENT, "block_size");
  c = test_config(2, 4, 8, 16, 8);
  c.num_q_heads = 6;
  expect_create_fails(&c, KVC_ERR_INVALID_ARGUMENT, "multiple of num_kv_heads");
  c = test_config(2, 2, 8, 16, 0);
  expect_create_fails(&c, KVC_ERR_INVALID_ARGUMENT, "no capacity");
  c = test_config(2, 2, 8, 16, 8);
  c.capacity_bytes = 1 << 20;
  expect_create_fails(&c, KVC_ERR_INVALID_ARGUMENT, "both");
  c = test_config(2, 2, 8, 16, 0);
  c.capacity_bytes = 100; /* a block is 16*2*8*8 = 2048 bytes */
  expect_create_fails(&c, KVC_ERR_INVALID_ARGUMENT, "holds no block");
  c = test_config(2, 2, 8, 16, 8);
  c.k_dtype = (kvc_dtype)42;
  expect_create_fails(&c, KVC_ERR_INVALID_ARGUMENT, "k_dtype 42");
  c = test_config(2, 2, 8, 16, 8);
  c.v_dtype = (kvc_dtype)-3;
  expect_create_fails(&c, KVC_ERR_INVALID_ARGUMENT, "v_dtype");
  c = test_config(2, 2, 8, 16, 8);
  c.layout = (kvc_layout)9;
  expect_create_fails(&c, KVC_ERR_INVALID_ARGUMENT, "layout");
  c = test_config(2, 2, 8, 16, 8);
  c.flags = 0x80;
  expect_create_fails(&c, KVC_ERR_INVALID_ARGUMENT, "flags");
  c = test_config(2, 2, 8, 16, 8);
  c.device = KVC_DEVICE_CUDA;
  expect_create_fails(&c, KVC_ERR_DEVICE_UNAVAILABLE, "CUDA");
  c = test_config(2, 2, 8, 16, 8);
  c.device = (kvc_device)7;
  expect_create_fails(&c, KVC_ERR_INVALID_ARGUMENT, "device");
  c = test_config(2, 2, 8, 16, 8);
  c.device_index = 3;
  expect_create_fails(&c, KVC_ERR_INVALID_ARGUMENT, "device_index");
  /* Absurd sizes whose product overflows 64 bits. */
  c = test_config(1, 65536, 1024, 4096, 1u << 30);
  c.num_q_heads = 65536;
  expect_create_fails(&c, KVC_ERR_OVERFLOW, "overflows");
  c = test_config(1, 2, 8, 16, (uint64_t)1 << 40);
  expect_create_fails(&c, KVC_ERR_INVALID_ARGUMENT, "num_blocks");
  c = test_config(2, 2, 8, 16, 8);
  c.struct_size = 0;
  expect_create_fails(&c, KVC_ERR_STRUCT_SIZE, "struct_size 0");
  c.struct_size = offsetof(kvc_pool_config, capacity_bytes); /* cuts a required field */
  expect_create_fails(&c, KVC_ERR_STRUCT_SIZE, "struct_size");
}

static void test_capacity_bytes(void **state) {
  (void)state;
  kvc_pool_config c = test_config(2, 2, 8, 16, 0);
  c.capacity_bytes = 10 * 2048 + 100; /* 10 blocks fit */
  kvc_pool *p = NULL;
  ASSERT_OK(kvc_pool_create(&c, &p));
  kvc_pool_config got;
  got.struct_size = sizeof got;
  ASSERT_OK(kvc_pool_get_config(p, &got));
  assert_int_equal(got.num_blocks, 10);
  assert_int_equal(got.num_layers, 2);
  assert_int_equal(got.k_dtype, KVC_DTYPE_F32);
  kvc_stats s = get_stats(p);
  assert_int_equal(s.blocks_total, 10);
  assert_int_equal(s.bytes_per_block, 2048);
  assert_int_equal(s.bytes_total, 10 * 2048);
  got.struct_size = 4;
  ASSERT_STATUS(KVC_ERR_STRUCT_SIZE, kvc_pool_get_config(p, &got));
  ASSERT_STATUS(KVC_ERR_NULL_POINTER, kvc_pool_get_config(p, NULL));
  ASSERT_STATUS(KVC_ERR_NULL_POINTER, kvc_pool_get_config(NULL, &got));
  kvc_pool_destroy(p);
  kvc_pool_destroy(NULL); /* no-op */
}

/* A config from an "older header": struct_size ends before k_dtype. The
 * fields it does not cover take their defaults (f16, NHD, CPU) even though the
 * bytes behind them hold garbage. */
static void test_struct_size_older_header(void **state) {
  (void)state;
  kvc_pool_config c = test_config(1, 2, 8, 4, 4);
  c.struct_size = offsetof(kvc_pool_config, k_dtype);
  c.k_dtype = (kvc_dtype)77; /* not covered: must be ignored */
  c.v_dtype = (kvc_dtype)77;
  c.layout = (kvc_layout)77;
  c.device = (kvc_device)77;
  kvc_pool *p = NULL;
  ASSERT_OK(kvc_pool_create(&c, &p));
  kvc_pool_layout l;
  kvc_pool_layout_init(&l);
  ASSERT_OK(kvc_pool_get_layout(p, &l));
  assert_int_equal(l.k_dtype, KVC_DTYPE_F16);
  assert_int_equal(l.v_dtype, KVC_DTYPE_F16);
  assert_int_equal(l.layout, KVC_LAYOUT_NHD);
  assert_int_equal(l.device, KVC_DEVICE_CPU);

  /* Output structs from an older header: only the covered fields are written. */
  kvc_stats s;
  memset(&s, 0xee, sizeof s);
  s.struct_size = offsetof(kvc_stats, blocks_shared) + sizeof(uint64_t);
  ASSERT_OK(kvc_pool_stats(p, &s));
  assert_int_equal(s.blocks_total, 4);
  assert_int_equal(s.blocks_free, 4);
  assert_int_equal(s.bytes_per_block, 0xeeeeeeeeeeeeeeeeull); /* not covered: untouched */
  assert_int_equal(s.struct_size, offsetof(kvc_stats, blocks_shared) + sizeof(uint64_t));
  s.struct_size = offsetof(kvc_stats, blocks_shared);
  ASSERT_STATUS(KVC_ERR_STRUCT_SIZE, kvc_pool_stats(p, &s));
  kvc_pool_layout_init(&l);
  l.struct_size = offsetof(kvc_pool_layout, v_bytes);
  ASSERT_STATUS(KVC_ERR_STRUCT_SIZE, kvc_pool_get_layout(p, &l));
  kvc_pool_destroy(p);
}

/* A config from a "newer header": larger struct_size. Unknown fields that
 * are zero are accepted; a non-zero unknown field is refused. */
typedef struct {
  kvc_pool_config base;
  uint64_t future_field_a;
  uint32_t future_field_b;
  uint32_t pad;
} newer_config;

typedef struct {
  kvc_stats base;
  uint64_t future_counter;
} newer_stats;

static void test_struct_size_newer_header(void **state) {
  (void)state;
  newer_config n;
  memset(&n, 0, sizeof n);
  n.base = test_config(1, 2, 8, 4, 4);
  n.base.struct_size = sizeof n;
  kvc_pool *p = NULL;
  ASSERT_OK(kvc_pool_create(&n.base, &p));
  kvc_pool_destroy(p);
  p = NULL;
  n.future_field_b = 1;
  ASSERT_STATUS(KVC_ERR_UNSUPPORTED, kvc_pool_create(&n.base, &p));
  assert_null(p);
  assert_non_null(strstr(kvc_last_error_message(), "unknown"));
  n.future_field_b = 0;
  ASSERT_OK(kvc_pool_create(&n.base, &p));
  newer_stats s;
  memset(&s, 0x5a, sizeof s);
  s.base.struct_size = sizeof s;
  ASSERT_OK(kvc_pool_stats(p, &s.base));
  assert_int_equal(s.base.blocks_total, 4);
  assert_int_equal(s.base.struct_size, sizeof s);          /* left as the caller set it */
  assert_int_equal(s.future_counter, 0x5a5a5a5a5a5a5a5aull); /* never written past our size */
  kvc_pool_destroy(p);
}

/* ------------------------------------------------------------ sequences */

static void test_sequence_lifecycle_errors(void **state) {
  (void)state;
  kvc_pool *p = make_pool(2, 2, 8, 4, 16);
  uint64_t len = 99;
  ASSERT_STATUS(KVC_ERR_NULL_POINTER, kvc_seq_create(NULL, 1));
  ASSERT_OK(kvc_seq_create(p, 1));
  ASSERT_STATUS(KVC_ERR_SEQ_EXISTS, kvc_seq_create(p, 1));
  ASSERT_OK(kvc_seq_create(p, UINT64_MAX));
  ASSERT_OK(kvc_seq_length(p, 1, &len));
  assert_int_equal(len, 0);
  len = 99;
  ASSERT_STATUS(KVC_ERR_SEQ_NOT_FOUND, kvc_seq_length(p, 2, &len));
  assert_int_equal(len, 99); /* untouched on failure */
  assert_non_null(strstr(kvc_last_error_message(), "sequence 2"));
  ASSERT_STATUS(KVC_ERR_NULL_POINTER, kvc_seq_length(p, 1, NULL));
  ASSERT_STATUS(KVC_ERR_SEQ_NOT_FOUND, kvc_seq_fork(p, 2, 3));
  ASSERT_STATUS(KVC_ERR_SEQ_EXISTS, kvc_seq_fork(p, 1, UINT64_MAX));
  ASSERT_STATUS(KVC_ERR_SEQ_NOT_FOUND, kvc_seq_truncate(p, 2, 0));
  ASSERT_STATUS(KVC_ERR_SEQ_NOT_FOUND, kvc_seq_reserve(p, 2, 1, NULL));
  ASSERT_STATUS(KVC_ERR_INVALID_ARGUMENT, kvc_seq_reserve(p, 1, 0, NULL));
  ASSERT_STATUS(KVC_ERR_OVERFLOW, kvc_seq_reserve(p, 1, (uint64_t)1 << 40, NULL));
  uint64_t nt = 7;
  ASSERT_OK(kvc_seq_layer_tokens(p, 1, 1, &nt));
  assert_int_equal(nt, 0);
  ASSERT_STATUS(KVC_ERR_OUT_OF_RANGE, kvc_seq_layer_tokens(p, 1, 2, &nt));
  ASSERT_STATUS(KVC_ERR_SEQ_NOT_FOUND, kvc_seq_layer_tokens(p, 5, 0, &nt));
  ASSERT_STATUS(KVC_ERR_NULL_POINTER, kvc_seq_layer_tokens(p, 1, 0, NULL));
  kvc_stats s = get_stats(p);
  assert_int_equal(s.num_sequences, 2);
  ASSERT_OK(kvc_seq_free(p, 1));
  ASSERT_STATUS(KVC_ERR_SEQ_NOT_FOUND, kvc_seq_free(p, 1)); /* double free */
  ASSERT_STATUS(KVC_ERR_SEQ_NOT_FOUND, kvc_seq_reserve(p, 1, 1, NULL)); /* freed id */
  ASSERT_OK(kvc_seq_free(p, UINT64_MAX));
  s = get_stats(p);
  assert_int_equal(s.num_sequences, 0);
  assert_int_equal(s.blocks_free, 16);
  kvc_pool_destroy(p);
}

/* Writes `n` tokens at the end of seq (reserve + append in every layer). */
static void write_tokens(kvc_pool *p, uint64_t seq, uint32_t tag, uint64_t n, uint32_t layers,
                         uint32_t row) {
  uint64_t len;
  ASSERT_OK(kvc_seq_length(p, seq, &len));
  ASSERT_OK(kvc_seq_reserve(p, seq, n, NULL));
  float *k = malloc(sizeof(float) * n * row), *v = malloc(sizeof(float) * n * row);
  for (uint32_t l = 0; l < layers; ++l) {
    fill_rows(k, v, tag, l, len, n, row);
    ASSERT_OK(kvc_append(p, seq, l, len, n, k, v, KVC_DTYPE_F32));
  }
  free(k);
  free(v);
}

/* Checks that layer `l` of seq holds, at positions [from, to), the values of `tag`. */
static void expect_tokens(kvc_pool *p, uint64_t seq, uint32_t tag, uint32_t l, uint64_t from,
                          uint64_t to, uint32_t row) {
  const uint64_t n = to - from;
  if (n == 0) return;
  float *k = malloc(sizeof(float) * n * row), *v = malloc(sizeof(float) * n * row);
  int32_t *pos = malloc(sizeof(int32_t) * n);
  ASSERT_OK(kvc_gather(p, seq, l, from, n, k, v, KVC_DTYPE_F32, pos));
  for (uint64_t t = 0; t < n; ++t) {
    assert_int_equal(pos[t], from + t);
    for (uint32_t e = 0; e < row; ++e) {
      assert_float_equal(k[t * row + e], kv_value(tag, l, from + t, e, 0), 0.0f);
      assert_float_equal(v[t * row + e], kv_value(tag, l, from + t, e, 1), 0.0f);
    }
  }
  free(k);
  free(v);
  free(pos);
}

/* A new sequence made after others were freed (the pool reuses freed
 * sequences' tables: core/sequences.cpp's spares) starts empty: no tokens,
 * blocks or recorded scores, and holds what is written to it. More freed
 * sequences than the pool keeps, and one whose block table outgrew what a
 * spare keeps. */
static void test_freed_sequences_start_new(void **state) {
  (void)state;
  const uint32_t L = 3, H = 2, D = 8, bs = 16, row = H * D;
  kvc_pool *p = make_pool(L, H, D, bs, 96);
  float scores[64 * 2];
  for (int round = 0; round < 3; ++round) {
    const uint64_t base = 100 * (uint64_t)round;
    uint64_t used = 0;
    for (uint64_t i = 1; i <= 12; ++i) {
      const uint64_t id = base + i, n = (i * 5 + (uint64_t)round * 3) % 37 + 1;
      ASSERT_OK(kvc_seq_create(p, id));
      uint64_t len = 99, nt = 99;
      ASSERT_OK(kvc_seq_length(p, id, &len));
      assert_int_equal(len, 0);
      for (uint32_t l = 0; l < L; ++l) {
        size_t nb = 99;
        ASSERT_OK(kvc_seq_layer_tokens(p, id, l, &nt));
        assert_int_equal(nt, 0);
        ASSERT_OK(kvc_seq_block_table(p, id, l, NULL, 0, &nb));
        assert_int_equal(nb, 0);
      }
      write_tokens(p, id, (uint32_t)id, n, L, row);
      /* nothing recorded yet: zeros (a reused sequence's old scores would show) */
      for (uint64_t t = 0; t < n * H; ++t) scores[t] = -1.0f;
      ASSERT_OK(kvc_seq_scores(p, id, 0, scores, n));
      for (uint64_t t = 0; t < n * H; ++t) assert_float_equal(scores[t], 0.0f, 0.0f);
      for (uint64_t t = 0; t < n * H; ++t) scores[t] = (float)(t + 1 + id);
      ASSERT_OK(kvc_seq_observe_scores(p, id, 0, scores, n, 0));
      used += L * ((n + bs - 1) / bs);
    }
    kvc_stats s = get_stats(p);
    assert_int_equal(s.num_sequences, 12);
    assert_int_equal(s.blocks_used, used);
    for (uint64_t i = 1; i <= 12; ++i) {
      const uint64_t id = base + i, n = (i * 5 + (uint64_t)round * 3) % 37 + 1;
      for (uint32_t l = 0; l < L; ++l) expect_tokens(p, id, (uint32_t)id, l, 0, n, row);
      ASSERT_OK(kvc_seq_free(p, id));
    }
    s = get_stats(p);
    assert_int_equal(s.num_sequences, 0);
    assert_int_equal(s.blocks_used, 0);
  }
  kvc_pool_destroy(p);

  /* A block table longer than a spare keeps (core: 64 entries). */
  p = make_pool(1, 1, 4, 4, 300);
  ASSERT_OK(kvc_seq_create(p, 1));
  write_tokens(p, 1, 1, 4 * 200, 1, 4);
  ASSERT_OK(kvc_seq_free(p, 1));
  ASSERT_OK(kvc_seq_create(p, 2));
  size_t nb = 99;
  ASSERT_OK(kvc_seq_block_table(p, 2, 0, NULL, 0, &nb));
  assert_int_equal(nb, 0);
  write_tokens(p, 2, 2, 3, 1, 4);
  expect_tokens(p, 2, 2, 0, 0, 3, 4);
  ASSERT_OK(kvc_seq_block_table(p, 2, 0, NULL, 0, &nb));
  assert_int_equal(nb, 1);
  kvc_pool_destroy(p);
}

static void test_roundtrip_lengths(void **state) {
  (void)state;
  const uint32_t bs = 16, L = 3, H = 2, D = 8, row = H * D;
  const uint64_t lengths[] = {0, bs - 1, bs, bs + 1, 4 * bs};
  for (size_t i = 0; i < sizeof lengths / sizeof lengths[0]; ++i) {
    kvc_pool *p = make_pool(L, H, D, bs, 64);
    ASSERT_OK(kvc_seq_create(p, 7));
    if (lengths[i]) write_tokens(p, 7, 3, lengths[i], L, row);
    uint64_t len;
    ASSERT_OK(kvc_seq_length(p, 7, &len));
    assert_int_equal(len, lengths[i]);
    for (uint32_t l = 0; l < L; ++l) {
      uint64_t nt;
      ASSERT_OK(kvc_seq_layer_tokens(p, 7, l, &nt));
      assert_int_equal(nt, lengths[i]);
      expect_tokens(p, 7, 3, l, 0, lengths[i], row);
      size_t nb = 99;
      ASSERT_OK(kvc_seq_block_table(p, 7, l, NULL, 0, &nb));
      assert_int_equal(nb, (lengths[i] + bs - 1) / bs);
    }
    kvc_stats s = get_stats(p);
    assert_int_equal(s.blocks_used, L * ((lengths[i] + bs - 1) / bs));
    assert_int_equal(s.blocks_free + s.blocks_used + s.blocks_cached, s.blocks_total);
    /* n_tokens 0 gather is valid; beyond the end is out of range. */
    float k[1];
    ASSERT_OK(kvc_gather(p, 7, 0, lengths[i], 0, k, NULL, KVC_DTYPE_F32, NULL));
    ASSERT_STATUS(KVC_ERR_OUT_OF_RANGE, kvc_gather(p, 7, 0, lengths[i], 1, k, NULL,
                                                   KVC_DTYPE_F32, NULL));
    ASSERT_OK(kvc_seq_free(p, 7));
    s = get_stats(p);
    assert_int_equal(s.blocks_used, 0);
    kvc_pool_destroy(p);
  }
}

static void test_storage_dtypes_and_layouts(void **state) {
  (void)state;
  const uint32_t bs = 4, L = 2, H = 3, D = 5, row = H * D;
  const kvc_dtype dts[] = {KVC_DTYPE_F32, KVC_DTYPE_F16, KVC_DTYPE_BF16};
  for (int lay = 0; lay < 2; ++lay)
    for (int kd = 0; kd < 3; ++kd)
      for (int vd = 0; vd < 3; ++vd) {
        kvc_pool_config c = test_config(L, H, D, bs, 32);
        c.layout = (kvc_layout)lay;
        c.k_dtype = dts[kd];
        c.v_dtype = dts[vd];
        kvc_pool *p = NULL;
        ASSERT_OK(kvc_pool_create(&c, &p));
        ASSERT_OK(kvc_seq_create(p, 1));
        const uint64_t n = 11;
        ASSERT_OK(kvc_seq_reserve(p, 1, n, NULL));
        float k[11 * 15], v[11 * 15], kr[11 * 15], vr[11 * 15], ke[11 * 15], ve[11 * 15];
        uint16_t tmp[11 * 15];
        for (uint32_t l = 0; l < L; ++l) {
          fill_rows(k, v, 9, l, 0, n, row);
          for (int i = 0; i < (int)(n * row); ++i) { k[i] *= 0.37f; v[i] *= -0.61f; }
          /* Append in two pieces that cross a block boundary, from f32. */
          ASSERT_OK(kvc_append(p, 1, l, 0, 3, k, v, KVC_DTYPE_F32));
          ASSERT_OK(kvc_append(p, 1, l, 3, 8, k + 3 * row, v + 3 * row, KVC_DTYPE_F32));
          /* Expected values: the f32 input rounded through the storage dtype. */
          ASSERT_OK(kvc_convert(k, KVC_DTYPE_F32, dts[kd] == KVC_DTYPE_F32 ? (void *)ke : tmp,
                                dts[kd], n * row));
          if (dts[kd] != KVC_DTYPE_F32) ASSERT_OK(kvc_convert(tmp, dts[kd], ke, KVC_DTYPE_F32, n * row));
          ASSERT_OK(kvc_convert(v, KVC_DTYPE_F32, dts[vd] == KVC_DTYPE_F32 ? (void *)ve : tmp,
                                dts[vd], n * row));
          if (dts[vd] != KVC_DTYPE_F32) ASSERT_OK(kvc_convert(tmp, dts[vd], ve, KVC_DTYPE_F32, n * row));
          ASSERT_OK(kvc_gather(p, 1, l, 0, n, kr, vr, KVC_DTYPE_F32, NULL));
          assert_memory_equal(kr, ke, sizeof(float) * n * row);
          assert_memory_equal(vr, ve, sizeof(float) * n * row);
          /* Gather a sub-range into f16 and compare. */
          uint16_t kh[6 * 15], khe[6 * 15];
          ASSERT_OK(kvc_gather(p, 1, l, 2, 6, kh, NULL, KVC_DTYPE_F16, NULL));
          ASSERT_OK(kvc_convert(ke + 2 * row, KVC_DTYPE_F32, khe, KVC_DTYPE_F16, 6 * row));
          assert_memory_equal(kh, khe, sizeof kh);
          /* The same values read straight from the exported layout. */
          kvc_pool_layout lay_out;
          kvc_pool_layout_init(&lay_out);
          ASSERT_OK(kvc_pool_get_layout(p, &lay_out));
          int32_t table[8];
          size_t nb;
          ASSERT_OK(kvc_seq_block_table(p, 1, l, table, 8, &nb));
          assert_int_equal(nb, 3);
          for (uint64_t t = 0; t < n; ++t)
            for (uint32_t h = 0; h < H; ++h) {
              const char *blk = (const char *)lay_out.base + (uint64_t)table[t / bs] * lay_out.block_stride;
              const char *kp = blk + lay_out.k_offset + (t % bs) * lay_out.k_token_stride + h * lay_out.k_head_stride;
              const char *vp = blk + lay_out.v_offset + (t % bs) * lay_out.v_token_stride + h * lay_out.v_head_stride;
              float kx[5], vx[5];
              ASSERT_OK(kvc_convert(kp, lay_out.k_dtype, kx, KVC_DTYPE_F32, D));
              ASSERT_OK(kvc_convert(vp, lay_out.v_dtype, vx, KVC_DTYPE_F32, D));
              assert_memory_equal(kx, ke + t * row + h * D, sizeof kx);
              assert_memory_equal(vx, ve + t * row + h * D, sizeof vx);
            }
        }
        /* Input in f16 and bf16 too. */
        ASSERT_OK(kvc_convert(k, KVC_DTYPE_F32, tmp, KVC_DTYPE_BF16, row));
        ASSERT_OK(kvc_append(p, 1, 0, 0, 1, tmp, tmp, KVC_DTYPE_BF16));
        ASSERT_OK(kvc_append(p, 1, 0, 0, 1, tmp, tmp, KVC_DTYPE_F16));
        kvc_stats s = get_stats(p);
        size_t ek, ev;
        kvc_dtype_size(dts[kd], &ek);
        kvc_dtype_size(dts[vd], &ev);
        /* K part, then V part on the next 16-byte boundary; the block stride
         * rounded to 16 bytes too (every element aligned). */
        const uint64_t kb = bs * H * D * ek, vb = bs * H * D * ev;
        const uint64_t stride = (((kb + 15) / 16 * 16 + vb) + 15) / 16 * 16;
        assert_int_equal(s.bytes_per_block, stride);
        assert_int_equal(s.bytes_per_token, stride * L / bs);
        assert_int_equal(s.bytes_in_use, 6 * s.bytes_per_block);
        kvc_pool_destroy(p);
      }
}

static void test_slot_mapping(void **state) {
  (void)state;
  const uint32_t L = 2, bs = 4;
  kvc_pool *p = make_pool(L, 1, 4, bs, 32);
  ASSERT_OK(kvc_seq_create(p, 1));
  ASSERT_OK(kvc_seq_create(p, 2));
  int64_t slots[2 * 6];
  ASSERT_OK(kvc_seq_reserve(p, 1, 3, slots));
  ASSERT_OK(kvc_seq_reserve(p, 2, 2, NULL)); /* interleave another sequence's blocks */
  ASSERT_OK(kvc_seq_reserve(p, 1, 6, slots));
  for (uint32_t l = 0; l < L; ++l) {
    int32_t table[4];
    size_t nb;
    ASSERT_OK(kvc_seq_block_table(p, 1, l, table, 4, &nb));
    assert_int_equal(nb, 3);
    for (int i = 0; i < 6; ++i) {
      const int idx = 3 + i;
      assert_int_equal(slots[l * 6 + i], (int64_t)table[idx / bs] * bs + idx % bs);
    }
    /* Capacity too small: the count is still reported. */
    nb = 0;
    ASSERT_STATUS(KVC_ERR_BUFFER_TOO_SMALL, kvc_seq_block_table(p, 1, l, table, 2, &nb));
    assert_int_equal(nb, 3);
  }
  size_t nb;
  ASSERT_STATUS(KVC_ERR_NULL_POINTER, kvc_seq_block_table(p, 1, 0, NULL, 0, NULL));
  ASSERT_STATUS(KVC_ERR_OUT_OF_RANGE, kvc_seq_block_table(p, 1, 2, NULL, 0, &nb));
  ASSERT_STATUS(KVC_ERR_SEQ_NOT_FOUND, kvc_seq_block_table(p, 3, 0, NULL, 0, &nb));
  kvc_pool_destroy(p);
}

static void test_append_errors_change_nothing(void **state) {
  (void)state;
  const uint32_t L = 2, H = 2, D = 4, row = H * D;
  kvc_pool *p = make_pool(L, H, D, 4, 16);
  ASSERT_OK(kvc_seq_create(p, 1));
  write_tokens(p, 1, 5, 6, L, row);
  float k[8 * 8], v[8 * 8];
  memset(k, 0x7f, sizeof k);
  memset(v, 0x7f, sizeof v);
  kvc_stats before = get_stats(p);
  ASSERT_STATUS(KVC_ERR_NOT_RESERVED, kvc_append(p, 1, 0, 6, 1, k, v, KVC_DTYPE_F32));
  assert_non_null(strstr(kvc_last_error_message(), "not reserved"));
  ASSERT_STATUS(KVC_ERR_NOT_RESERVED, kvc_append(p, 1, 0, 4, 3, k, v, KVC_DTYPE_F32));
  ASSERT_STATUS(KVC_ERR_NOT_RESERVED, kvc_append(p, 1, 0, UINT64_MAX, 2, k, v, KVC_DTYPE_F32));
  ASSERT_STATUS(KVC_ERR_NOT_RESERVED, kvc_append(p, 1, 0, 0, UINT64_MAX, k, v, KVC_DTYPE_F32));
  ASSERT_STATUS(KVC_ERR_INVALID_ARGUMENT, kvc_append(p, 1, 0, 0, 0, k, v, KVC_DTYPE_F32));
  ASSERT_STATUS(KVC_ERR_OUT_OF_RANGE, kvc_append(p, 1, 2, 0, 1, k, v, KVC_DTYPE_F32));
  ASSERT_STATUS(KVC_ERR_OUT_OF_RANGE, kvc_append(p, 1, UINT32_MAX, 0, 1, k, v, KVC_DTYPE_F32));
  ASSERT_STATUS(KVC_ERR_NULL_POINTER, kvc_append(p, 1, 0, 0, 1, NULL, v, KVC_DTYPE_F32));
  ASSERT_STATUS(KVC_ERR_NULL_POINTER, kvc_append(p, 1, 0, 0, 1, k, NULL, KVC_DTYPE_F32));
  ASSERT_STATUS(KVC_ERR_NULL_POINTER, kvc_append(NULL, 1, 0, 0, 1, k, v, KVC_DTYPE_F32));
  ASSERT_STATUS(KVC_ERR_INVALID_ARGUMENT, kvc_append(p, 1, 0, 0, 1, k, v, (kvc_dtype)5));
  ASSERT_STATUS(KVC_ERR_SEQ_NOT_FOUND, kvc_append(p, 9, 0, 0, 1, k, v, KVC_DTYPE_F32));
  ASSERT_STATUS(KVC_ERR_NULL_POINTER, kvc_gather(p, 1, 0, 0, 1, NULL, NULL, KVC_DTYPE_F32, NULL));
  ASSERT_STATUS(KVC_ERR_INVALID_ARGUMENT, kvc_gather(p, 1, 0, 0, 1, k, v, (kvc_dtype)5, NULL));
  ASSERT_STATUS(KVC_ERR_OUT_OF_RANGE, kvc_gather(p, 1, 5, 0, 1, k, v, KVC_DTYPE_F32, NULL));
  ASSERT_STATUS(KVC_ERR_OUT_OF_RANGE, kvc_gather(p, 1, 0, UINT64_MAX, 2, k, v, KVC_DTYPE_F32, NULL));
  ASSERT_STATUS(KVC_ERR_SEQ_NOT_FOUND, kvc_gather(p, 2, 0, 0, 1, k, v, KVC_DTYPE_F32, NULL));
  kvc_stats after = get_stats(p);
  assert_memory_equal(&before, &after, sizeof before);
  for (uint32_t l = 0; l < L; ++l) expect_tokens(p, 1, 5, l, 0, 6, row);
  kvc_pool_destroy(p);
}

/* ---------------------------------------------------------- fork and CoW */

static void test_fork_copy_on_write(void **state) {
  (void)state;
  const uint32_t L = 2, H = 2, D = 4, row = H * D, bs = 16;
  kvc_pool *p = make_pool(L, H, D, bs, 64);
  ASSERT_OK(kvc_seq_create(p, 1));
  write_tokens(p, 1, 1, 20, L, row); /* 1 full block + 4 tokens per layer */
  ASSERT_OK(kvc_seq_fork(p, 1, 2));
  kvc_stats s = get_stats(p);
  assert_int_equal(s.blocks_used, 4);
  assert_int_equal(s.blocks_shared, 4);
  uint64_t len;
  ASSERT_OK(kvc_seq_length(p, 2, &len));
  assert_int_equal(len, 20);
  for (uint32_t l = 0; l < L; ++l) expect_tokens(p, 2, 1, l, 0, 20, row);

  /* The child writes position 20: its partly filled last block is copied. */
  write_tokens(p, 2, 2, 5, L, row);
  s = get_stats(p);
  assert_int_equal(s.blocks_used, 6);
  assert_int_equal(s.blocks_shared, 2); /* the full first blocks stay shared */
  /* The parent writes different data at the same positions. */
  write_tokens(p, 1, 3, 5, L, row);
  for (uint32_t l = 0; l < L; ++l) {
    expect_tokens(p, 1, 1, l, 0, 20, row);
    expect_tokens(p, 1, 3, l, 20, 25, row);
    expect_tokens(p, 2, 1, l, 0, 20, row);
    expect_tokens(p, 2, 2, l, 20, 25, row);
  }
  /* Truncate the child into the shared first block and write position 10:
   * the parent keeps its data. */
  ASSERT_OK(kvc_seq_truncate(p, 2, 10));
  write_tokens(p, 2, 4, 3, L, row);
  for (uint32_t l = 0; l < L; ++l) {
    expect_tokens(p, 1, 1, l, 0, 20, row);
    expect_tokens(p, 2, 1, l, 0, 10, row);
    expect_tokens(p, 2, 4, l, 10, 13, row);
  }
  /* Fork of a fork, then free in every order: no block stays used. */
  ASSERT_OK(kvc_seq_fork(p, 2, 3));
  ASSERT_OK(kvc_seq_free(p, 2));
  for (uint32_t l = 0; l < L; ++l) expect_tokens(p, 3, 1, l, 0, 10, row);
  ASSERT_OK(kvc_seq_free(p, 1));
  ASSERT_OK(kvc_seq_free(p, 3));
  s = get_stats(p);
  assert_int_equal(s.blocks_used, 0);
  assert_int_equal(s.blocks_shared, 0);
  assert_int_equal(s.blocks_free, 64);
  kvc_pool_destroy(p);
}

/* Fork while the parent has reserved but unwritten slots in a block: the
 * append that fills them copies the block first. */
static void test_fork_of_reserved_slots(void **state) {
  (void)state;
  const uint32_t L = 1, H = 1, D = 4, row = 4, bs = 8;
  kvc_pool *p = make_pool(L, H, D, bs, 8);
  ASSERT_OK(kvc_seq_create(p, 1));
  ASSERT_OK(kvc_seq_reserve(p, 1, 8, NULL));
  float k[8 * 4], v[8 * 4];
  fill_rows(k, v, 1, 0, 0, 4, row);
  ASSERT_OK(kvc_append(p, 1, 0, 0, 4, k, v, KVC_DTYPE_F32));
  ASSERT_OK(kvc_seq_fork(p, 1, 2));
  fill_rows(k, v, 1, 0, 4, 4, row);
  ASSERT_OK(kvc_append(p, 1, 0, 4, 4, k, v, KVC_DTYPE_F32)); /* parent fills: CoW */
  fill_rows(k, v, 2, 0, 4, 4, row);
  ASSERT_OK(kvc_append(p, 2, 0, 4, 4, k, v, KVC_DTYPE_F32)); /* child: no longer shared */
  expect_tokens(p, 1, 1, 0, 0, 8, row);
  expect_tokens(p, 2, 1, 0, 0, 4, row);
  expect_tokens(p, 2, 2, 0, 4, 8, row);
  kvc_stats s = get_stats(p);
  assert_int_equal(s.blocks_used, 2);
  assert_int_equal(s.blocks_shared, 0);
  kvc_pool_destroy(p);
}

/* ---------------------------------------------------------- truncation */

static void test_truncate_and_rewrite(void **state) {
  (void)state;
  const uint32_t L = 2, H = 1, D = 4, row = 4, bs = 4;
  kvc_pool *p = make_pool(L, H, D, bs, 16);
  ASSERT_OK(kvc_seq_create(p, 1));
  write_tokens(p, 1, 1, 14, L, row);
  assert_int_equal(get_stats(p).blocks_used, 8);
  ASSERT_OK(kvc_seq_truncate(p, 1, 100)); /* beyond the length: no-op */
  uint64_t len;
  ASSERT_OK(kvc_seq_length(p, 1, &len));
  assert_int_equal(len, 14);
  ASSERT_OK(kvc_seq_truncate(p, 1, 10));
  ASSERT_OK(kvc_seq_length(p, 1, &len));
  assert_int_equal(len, 10);
  assert_int_equal(get_stats(p).blocks_used, 6);
  float k[4], v[4];
  ASSERT_STATUS(KVC_ERR_NOT_RESERVED, kvc_append(p, 1, 0, 10, 1, k, v, KVC_DTYPE_F32));
  write_tokens(p, 1, 7, 1, L, row); /* position 10 again, new data */
  for (uint32_t l = 0; l < L; ++l) {
    expect_tokens(p, 1, 1, l, 0, 10, row);
    expect_tokens(p, 1, 7, l, 10, 11, row);
  }
  ASSERT_OK(kvc_seq_truncate(p, 1, 0));
  assert_int_equal(get_stats(p).blocks_used, 0);
  ASSERT_OK(kvc_seq_length(p, 1, &len));
  assert_int_equal(len, 0);
  write_tokens(p, 1, 8, 5, L, row);
  for (uint32_t l = 0; l < L; ++l) expect_tokens(p, 1, 8, l, 0, 5, row);
  kvc_pool_destroy(p);
}

/* ----------------------------------------------------------- exhaustion */

static void test_exhaustion_changes_nothing(void **state) {
  (void)state;
  const uint32_t L = 3, H = 1, D = 4, row = 4, bs = 4;
  kvc_pool *p = make_pool(L, H, D, bs, 11);
  ASSERT_OK(kvc_seq_create(p, 1));
  write_tokens(p, 1, 1, 6, L, row); /* 2 blocks per layer: 6 used, 5 free */
  ASSERT_OK(kvc_seq_create(p, 2));
  ASSERT_OK(kvc_seq_reserve(p, 2, 1, NULL)); /* 1 more in each layer: 2 free */
  kvc_stats before = get_stats(p);
  assert_int_equal(before.blocks_free, 2);
  /* 3 more tokens need 1 more block in each of 3 layers: only 2 free (9 in
   * of 11 would do, so "not now"). The first two layers could be served; the
   * reserve must not half-apply. */
  int64_t slots[3 * 3];
  memset(slots, 0x11, sizeof slots);
  ASSERT_STATUS(KVC_ERR_POOL_EXHAUSTED, kvc_seq_reserve(p, 1, 3, slots));
  assert_non_null(strstr(kvc_last_error_message(), "exhausted"));
  kvc_stats after = get_stats(p);
  assert_memory_equal(&before, &after, sizeof before);
  uint64_t len;
  ASSERT_OK(kvc_seq_length(p, 1, &len));
  assert_int_equal(len, 6);
  for (uint32_t l = 0; l < L; ++l) {
    uint64_t nt;
    ASSERT_OK(kvc_seq_layer_tokens(p, 1, l, &nt));
    assert_int_equal(nt, 6);
    expect_tokens(p, 1, 1, l, 0, 6, row);
  }
  /* Two tokens still fit in the existing blocks. */
  write_tokens(p, 1, 2, 2, L, row);
  kvc_pool_destroy(p);

  /* Copy-on-write with no free block: the append fails and writes nothing. */

  p = make_pool(1, H, D, bs, 2);
  ASSERT_OK(kvc_seq_create(p, 1));
  ASSERT_OK(kvc_seq_reserve(p, 1, 6, NULL)); /* both blocks, 2 slots unwritten */
  float k[4 * 4], v[4 * 4];
  fill_rows(k, v, 1, 0, 0, 4, row);
  ASSERT_OK(kvc_append(p, 1, 0, 0, 4, k, v, KVC_DTYPE_F32));
  ASSERT_OK(kvc_append(p, 1, 0, 4, 1, k, v, KVC_DTYPE_F32));
  ASSERT_OK(kvc_seq_fork(p, 1, 2));
  before = get_stats(p);
  fill_rows(k, v, 9, 0, 4, 2, row);
  ASSERT_STATUS(KVC_ERR_POOL_EXHAUSTED, kvc_append(p, 2, 0, 4, 2, k, v, KVC_DTYPE_F32));
  after = get_stats(p);
  assert_memory_equal(&before, &after, sizeof before);
  float kr[4], vr[4];
  ASSERT_OK(kvc_gather(p, 1, 0, 4, 1, kr, vr, KVC_DTYPE_F32, NULL));
  assert_float_equal(kr[0], kv_value(1, 0, 0, 0, 0), 0.0f); /* what was appended at 4 */
  ASSERT_OK(kvc_seq_free(p, 1));
  ASSERT_OK(kvc_append(p, 2, 0, 4, 2, k, v, KVC_DTYPE_F32)); /* now exclusive */
  kvc_pool_destroy(p);
}

/* ------------------------------------------------------ page-table export */

static void test_export_page_table(void **state) {
  (void)state;
  const uint32_t bs = 16;
  kvc_pool *p = make_pool(2, 1, 4, bs, 16);
  ASSERT_OK(kvc_seq_create(p, 10));
  ASSERT_OK(kvc_seq_create(p, 11));
  ASSERT_OK(kvc_seq_create(p, 12));
  ASSERT_OK(kvc_seq_reserve(p, 11, 17, NULL));
  ASSERT_OK(kvc_seq_reserve(p, 12, 16, NULL));
  const uint64_t ids[3] = {10, 11, 12};
  int32_t indptr[4], indices[8], last[3];
  size_t n = 0;
  ASSERT_OK(kvc_export_page_table(p, 1, ids, 3, indptr, indices, 8, last, &n));
  assert_int_equal(n, 3);
  assert_int_equal(indptr[0], 0);
  assert_int_equal(indptr[1], 0);
  assert_int_equal(indptr[2], 2);
  assert_int_equal(indptr[3], 3);
  assert_int_equal(last[0], 0);
  assert_int_equal(last[1], 1);
  assert_int_equal(last[2], 16);
  int32_t t11[2], t12[1];
  size_t nb;
  ASSERT_OK(kvc_seq_block_table(p, 11, 1, t11, 2, &nb));
  ASSERT_OK(kvc_seq_block_table(p, 12, 1, t12, 1, &nb));
  assert_int_equal(indices[0], t11[0]);
  assert_int_equal(indices[1], t11[1]);
  assert_int_equal(indices[2], t12[0]);
  /* Order [17, 0, 16] gives the same per-sequence rows. */
  const uint64_t ids2[3] = {11, 10, 12};
  ASSERT_OK(kvc_export_page_table(p, 1, ids2, 3, indptr, indices, 8, last, &n));
  assert_int_equal(indptr[1], 2);
  assert_int_equal(indptr[2], 2);
  assert_int_equal(last[0], 1);
  assert_int_equal(last[1], 0);
  /* Errors: buffer too small reports the size; nothing else is written. */
  int32_t small[2] = {-7, -7};
  n = 0;
  ASSERT_STATUS(KVC_ERR_BUFFER_TOO_SMALL,
                kvc_export_page_table(p, 1, ids, 3, indptr, small, 2, last, &n));
  assert_int_equal(n, 3);
  assert_int_equal(small[0], -7);
  const uint64_t bad[2] = {10, 99};
  ASSERT_STATUS(KVC_ERR_SEQ_NOT_FOUND, kvc_export_page_table(p, 1, bad, 2, indptr, indices, 8, last, &n));
  ASSERT_STATUS(KVC_ERR_OUT_OF_RANGE, kvc_export_page_table(p, 2, ids, 3, indptr, indices, 8, last, &n));
  ASSERT_STATUS(KVC_ERR_NULL_POINTER, kvc_export_page_table(p, 1, ids, 3, NULL, indices, 8, last, &n));
  ASSERT_STATUS(KVC_ERR_NULL_POINTER, kvc_export_page_table(p, 1, ids, 3, indptr, indices, 8, NULL, &n));
  ASSERT_STATUS(KVC_ERR_NULL_POINTER, kvc_export_page_table(p, 1, NULL, 3, indptr, indices, 8, last, &n));
  ASSERT_STATUS(KVC_ERR_NULL_POINTER, kvc_export_page_table(p, 1, ids, 3, indptr, indices, 8, last, NULL));
  ASSERT_STATUS(KVC_ERR_NULL_POINTER, kvc_export_page_table(p, 1, ids, 3, indptr, NULL, 8, last, &n));
  /* An empty batch. */
  ASSERT_OK(kvc_export_page_table(p, 0, NULL, 0, indptr, NULL, 0, NULL, &n));
  assert_int_equal(n, 0);
  assert_int_equal(indptr[0], 0);
  kvc_pool_destroy(p);
}

/* ------------------------------------------------------------ stats, zero */

static void test_stats_and_peak(void **state) {
  (void)state;
  kvc_pool *p = make_pool(2, 2, 8, 4, 32); /* block = 4*2*8*8 = 512 bytes */
  kvc_stats s = get_stats(p);
  assert_int_equal(s.blocks_total, 32);
  assert_int_equal(s.blocks_free, 32);
  assert_int_equal(s.bytes_per_block, 512);
  assert_int_equal(s.bytes_per_token, 2 * 2 * 8 * 8);
  assert_int_equal(s.bytes_in_use, 0);
  assert_int_equal(s.peak_bytes_in_use, 0);
  ASSERT_OK(kvc_seq_create(p, 1));
  ASSERT_OK(kvc_seq_reserve(p, 1, 9, NULL)); /* 3 blocks x 2 layers */
  s = get_stats(p);
  assert_int_equal(s.blocks_used, 6);
  assert_int_equal(s.bytes_in_use, 6 * 512);
  assert_int_equal(s.peak_bytes_in_use, 6 * 512);
  ASSERT_OK(kvc_seq_truncate(p, 1, 4));
  s = get_stats(p);
  assert_int_equal(s.bytes_in_use, 2 * 512);
  assert_int_equal(s.peak_bytes_in_use, 6 * 512);
  ASSERT_OK(kvc_pool_reset_peak(p));
  s = get_stats(p);
  assert_int_equal(s.peak_bytes_in_use, 2 * 512);
  ASSERT_STATUS(KVC_ERR_NULL_POINTER, kvc_pool_reset_peak(NULL));
  ASSERT_STATUS(KVC_ERR_NULL_POINTER, kvc_pool_stats(NULL, &s));
  ASSERT_STATUS(KVC_ERR_NULL_POINTER, kvc_pool_stats(p, NULL));
  kvc_pool_layout l;
  ASSERT_STATUS(KVC_ERR_NULL_POINTER, kvc_pool_get_layout(NULL, &l));
  ASSERT_STATUS(KVC_ERR_NULL_POINTER, kvc_pool_get_layout(p, NULL));
  kvc_pool_destroy(p);
}

static void test_layout_fields(void **state) {
  (void)state;
  kvc_pool_config c = test_config(1, 4, 8, 16, 3);
  c.k_dtype = KVC_DTYPE_F16;
  c.v_dtype = KVC_DTYPE_F32;
  c.layout = KVC_LAYOUT_HND;
  kvc_pool *p = NULL;
  ASSERT_OK(kvc_pool_create(&c, &p));
  kvc_pool_layout l;
  kvc_pool_layout_init(&l);
  ASSERT_OK(kvc_pool_get_layout(p, &l));
  assert_non_null(l.base);
  assert_int_equal(l.num_blocks, 3);
  assert_int_equal(l.block_size, 16);
  assert_int_equal(l.k_bytes, 16 * 4 * 8 * 2);
  assert_int_equal(l.v_bytes, 16 * 4 * 8 * 4);
  assert_int_equal(l.block_stride, l.k_bytes + l.v_bytes);
  assert_int_equal(l.k_offset, 0);
  assert_int_equal(l.v_offset, l.k_bytes);
  assert_int_equal(l.k_token_stride, 8 * 2);
  assert_int_equal(l.k_head_stride, 16 * 8 * 2);
  assert_int_equal(l.v_token_stride, 8 * 4);
  assert_int_equal(l.v_head_stride, 16 * 8 * 4);
  assert_int_equal(l.layout, KVC_LAYOUT_HND);
  kvc_pool_destroy(p);
}

static int block_is_zero(const kvc_pool_layout *l, int32_t b) {
  const unsigned char *m = (const unsigned char *)l->base + (uint64_t)b * l->block_stride;
  for (uint64_t i = 0; i < l->block_stride; ++i)
    if (m[i]) return 0;
  return 1;
}

static void test_zero_on_free(void **state) {
  (void)state;
  for (int flag = 0; flag < 2; ++flag) {
    kvc_pool_config c = test_config(1, 1, 4, 4, 4);
    c.flags = flag ? KVC_POOL_ZERO_ON_FREE : 0;
    kvc_pool *p = NULL;
    ASSERT_OK(kvc_pool_create(&c, &p));
    ASSERT_OK(kvc_seq_create(p, 1));
    write_tokens(p, 1, 3, 4, 1, 4);
    int32_t b;
    size_t nb;
    ASSERT_OK(kvc_seq_block_table(p, 1, 0, &b, 1, &nb));
    kvc_pool_layout l;
    kvc_pool_layout_init(&l);
    ASSERT_OK(kvc_pool_get_layout(p, &l));
    assert_false(block_is_zero(&l, b));
    ASSERT_OK(kvc_seq_fork(p, 1, 2));
    ASSERT_OK(kvc_seq_free(p, 1));
    assert_false(block_is_zero(&l, b)); /* still held by the child */
    ASSERT_OK(kvc_seq_free(p, 2));
    /* With the flag the freed block reads as zeros; without it the old
     * tenant's data is still there (which is what the flag prevents). */
    assert_int_equal(block_is_zero(&l, b), flag);
    kvc_pool_destroy(p);
  }
}

static void test_get_api_table(void **state) {
  (void)state;
  const kvc_api *api = kvc_get_api(1);
  assert_non_null(api);
  assert_int_equal(api->api_version, KVC_API_VERSION);
  assert_true(api->struct_size >= offsetof(kvc_api, dtype_size) + sizeof(void *));
  assert_ptr_equal(api->pool_create, kvc_pool_create);
  assert_ptr_equal(api->append, kvc_append);
  assert_ptr_equal(api->dtype_size, kvc_dtype_size);
  assert_ptr_equal(kvc_get_api(KVC_API_VERSION), api);
  assert_null(kvc_get_api(0));
  assert_null(kvc_get_api(KVC_API_VERSION + 1));
  assert_non_null(strstr(kvc_last_error_message(), "API version"));
}

/* kvc_pool_copy_blocks on a CPU pool (swap out / in), kvc_pool_set_stream and
 * kvc_pool_sync: round trip, all-or-nothing on a bad id, blocks written from
 * the host must be held by a sequence, a stream only for CUDA pools. */
static void test_copy_blocks_and_stream(void **state) {
  (void)state;
  kvc_pool_config c;
  kvc_pool_config_init(&c);
  c.num_layers = 1, c.num_q_heads = 2, c.num_kv_heads = 2, c.head_dim = 8, c.block_size = 4, c.num_blocks = 8;
  c.k_dtype = c.v_dtype = KVC_DTYPE_F32;
  kvc_pool *p = NULL;
  assert_int_equal(kvc_pool_create(&c, &p), KVC_OK);
  assert_int_equal(kvc_seq_create(p, 1), KVC_OK);
  assert_int_equal(kvc_seq_reserve(p, 1, 8, NULL), KVC_OK);
  float k[8 * 16], v[8 * 16];
  for (int i = 0; i < 8 * 16; ++i) k[i] = (float)i, v[i] = (float)-i;
  assert_int_equal(kvc_append(p, 1, 0, 0, 8, k, v, KVC_DTYPE_F32), KVC_OK);
  kvc_stats st;
  kvc_stats_init(&st);
  assert_int_equal(kvc_pool_stats(p, &st), KVC_OK);
  const size_t bb = (size_t)st.bytes_per_block;
  int32_t ids[2];
  size_t nb = 0;
  assert_int_equal(kvc_seq_block_table(p, 1, 0, ids, 2, &nb), KVC_OK);
  assert_int_equal(nb, 2);
  unsigned char *out = malloc(2 * bb), *zero = calloc(2, bb), *again = malloc(2 * bb);
  assert_non_null(out);
  assert_non_null(zero);
  assert_non_null(again);
  /* Swap out, overwrite with zeros, swap back in: the sequence reads its data again. */
  assert_int_equal(kvc_pool_copy_blocks(p, ids, 2, out, KVC_COPY_TO_HOST), KVC_OK);
  assert_int_equal(kvc_pool_copy_blocks(p, ids, 2, zero, KVC_COPY_FROM_HOST), KVC_OK);
  float g[8 * 16];
  assert_int_equal(kvc_gather(p, 1, 0, 0, 8, g, NULL, KVC_DTYPE_F32, NULL), KVC_OK);
  assert_true(g[17] == 0.0f);
  assert_int_equal(kvc_pool_copy_blocks(p, ids, 2, out, KVC_COPY_FROM_HOST), KVC_OK);
  assert_int_equal(kvc_gather(p, 1, 0, 0, 8, g, NULL, KVC_DTYPE_F32, NULL), KVC_OK);
  assert_memory_equal(g, k, sizeof g);
  /* A bad id anywhere: nothing copied, in either direction. */
  int32_t mixed[2] = {ids[0], 8};
  memset(again, 0x5a, 2 * bb);
  assert_int_equal(kvc_pool_copy_blocks(p, mixed, 2, again, KVC_COPY_TO_HOST), KVC_ERR_OUT_OF_RANGE);
  assert_true(again[0] == 0x5a && again[bb - 1] == 0x5a);
  assert_int_equal(kvc_pool_copy_blocks(p, mixed, 2, zero, KVC_COPY_FROM_HOST), KVC_ERR_OUT_OF_RANGE);
  assert_int_equal(kvc_gather(p, 1, 0, 0, 8, g, NULL, KVC_DTYPE_F32, NULL), KVC_OK);
  assert_memory_equal(g, k, sizeof g);
  /* Writing into a block no sequence holds is refused; reading one is fine. */
  int32_t free_id = -1;
  for (int32_t b = 0; b < 8 && free_id < 0; ++b)
    if (b != ids[0] && b != ids[1]) free_id = b;
  assert_int_equal(kvc_pool_copy_blocks(p, &free_id, 1, out, KVC_COPY_FROM_HOST), KVC_ERR_INVALID_ARGUMENT);
  assert_non_null(strstr(kvc_last_error_message(), "not held by any sequence"));
  assert_int_equal(kvc_pool_copy_blocks(p, &free_id, 1, again, KVC_COPY_TO_HOST), KVC_OK);
  assert_memory_equal(again, zero, bb);
  assert_int_equal(kvc_pool_copy_blocks(p, ids, 1, out, (kvc_copy_direction)2), KVC_ERR_INVALID_ARGUMENT);
  assert_int_equal(kvc_pool_copy_blocks(p, NULL, 0, NULL, KVC_COPY_TO_HOST), KVC_OK);
  assert_int_equal(kvc_pool_copy_blocks(p, NULL, 1, out, KVC_COPY_TO_HOST), KVC_ERR_NULL_POINTER);
  /* CPU pools: no stream, nothing to wait for. */
  assert_int_equal(kvc_pool_set_stream(p, NULL), KVC_OK);
  assert_int_equal(kvc_pool_set_stream(p, (void *)out), KVC_ERR_INVALID_ARGUMENT);
  assert_int_equal(kvc_pool_sync(p), KVC_OK);
  assert_int_equal(kvc_pool_sync(NULL), KVC_ERR_NULL_POINTER);
  free(out);
  free(zero);
  free(again);
  kvc_pool_destroy(p);
}

int main(int argc, char **argv) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_version_and_strings),
      cmocka_unit_test(test_dtype_size_and_convert),
      cmocka_unit_test(test_config_init_defaults),
      cmocka_unit_test(test_create_rejects_bad_config),
      cmocka_unit_test(test_capacity_bytes),
      cmocka_unit_test(test_struct_size_older_header),
      cmocka_unit_test(test_struct_size_newer_header),
      cmocka_unit_test(test_sequence_lifecycle_errors),
      cmocka_unit_test(test_roundtrip_lengths),
      cmocka_unit_test(test_freed_sequences_start_new),
      cmocka_unit_test(test_storage_dtypes_and_layouts),
      cmocka_unit_test(test_slot_mapping),
      cmocka_unit_test(test_append_errors_change_nothing),
      cmocka_unit_test(test_fork_copy_on_write),
      cmocka_unit_test(test_fork_of_reserved_slots),
      cmocka_unit_test(test_truncate_and_rewrite),
      cmocka_unit_test(test_exhaustion_changes_nothing),
      cmocka_unit_test(test_export_page_table),
      cmocka_unit_test(test_stats_and_peak),
      cmocka_unit_test(test_layout_fields),
      cmocka_unit_test(test_zero_on_free),
      cmocka_unit_test(test_get_api_table),
      cmocka_unit_test(test_copy_blocks_and_stream),
  };
  if (argc > 1) { /* one ctest per test function: the name must exist */
    int found = 0;
    for (size_t i = 0; i < sizeof tests / sizeof tests[0]; ++i)
      found |= strcmp(tests[i].name, argv[1]) == 0;
    if (!found) {
      fprintf(stderr, "no test named %s\n", argv[1]);
      return 1;
    }
    cmocka_set_test_filter(argv[1]);
  }
  return cmocka_run_group_tests_name("core_pool", tests, NULL, NULL);
}
