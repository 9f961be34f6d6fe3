/* cmocka tests of kvc_seq_import_llama / kvc_seq_export_llama on llama.cpp's
 * own blobs (tests/fixtures/smollm2/llama-state-*.bin, made by
 * make_llama_state.py with llama-cpp-python 0.3.36 on SmolLM2-135M: 30 layers,
 * 3 KV heads of 64, 8 tokens): imports export back byte-identical (f16, f16
 * with V transposed, q8_0 rotated and not); llama.cpp's Hadamard rotation is
 * undone (the rotated blob's K / V match the unrotated blob's); truncated,
 * extended, damaged and foreign blobs are refused without creating anything;
 * the export's errors. */
#include "../blackbox.h"

#include <math.h>

#ifndef KVC_LLAMA_FIXTURES
#error "KVC_LLAMA_FIXTURES (the fixtures folder) is set by tests/api/CMakeLists.txt"
#endif

enum { LAYERS = 30, KV_HEADS = 3, HEAD_DIM = 64, ROW = KV_HEADS * HEAD_DIM, TOKENS = 8 };

static uint8_t *read_fixture(const char *name, size_t *size) {
  char path[1024];
  snprintf(path, sizeof path, "%s/llama-state-%s.bin", KVC_LLAMA_FIXTURES, name);
  FILE *f = fopen(path, "rb");
  if (!f) print_error("cannot open %s\n", path);
  assert_non_null(f);
  fseek(f, 0, SEEK_END);
  long n = ftell(f);
  fseek(f, 0, SEEK_SET);
  assert_true(n > 0);
  uint8_t *b = malloc((size_t)n);
  assert_non_null(b);
  assert_int_equal(fread(b, 1, (size_t)n, f), (size_t)n);
  fclose(f);
  *size = (size_t)n;
  return b;
}

static kvc_pool *smollm2_pool(kvc_dtype dtype, uint32_t layers, uint32_t head_dim) {
  kvc_pool_config c = test_config(layers, KV_HEADS, head_dim, 16, 256);
  c.num_q_heads = 9;
  c.k_dtype = c.v_dtype = dtype;
  kvc_pool *p = NULL;
  ASSERT_OK(kvc_pool_create(&c, &p));
  return p;
}

static int seq_exists(kvc_pool *p, uint64_t id) {
  uint64_t len = 0;
  return kvc_seq_length(p, id, &len) == KVC_OK;
}

/* Imports `name` into a fresh pool of `dtype` and exports it back as the blob was. */
static void round_trip(const char *name, kvc_dtype dtype, kvc_llama_type type, uint32_t flags) {
  size_t n = 0;
  uint8_t *blob = read_fixture(name, &n);
  kvc_pool *p = smollm2_pool(dtype, LAYERS, HEAD_DIM);
  uint64_t tokens = 0;
  ASSERT_OK(kvc_seq_import_llama(p, 7, blob, n, flags & KVC_LLAMA_ATTN_ROT, &tokens));
  assert_int_equal(tokens, TOKENS);
  uint64_t len = 0;
  ASSERT_OK(kvc_seq_length(p, 7, &len));
  assert_int_equal(len, TOKENS);
  size_t size = 0;
  ASSERT_STATUS(KVC_ERR_BUFFER_TOO_SMALL,
                kvc_seq_export_llama(p, 7, 0, type, type, flags, NULL, 0, &size));
  assert_int_equal(size, n);
  uint8_t *out = malloc(size);
  ASSERT_OK(kvc_seq_export_llama(p, 7, 0, type, type, flags, out, size, &size));
  assert_int_equal(size, n);
  assert_memory_equal(out, blob, n);
  free(out);
  free(blob);
  kvc_pool_destroy(p);
}

static void test_f16_round_trip(void **state) {
  (void)state;
  round_trip("f16", KVC_DTYPE_F16, KVC_LLAMA_F16, 0);
  round_trip("f16", KVC_DTYPE_F32, KVC_LLAMA_F16, 0);
  round_trip("f16-vtrans", KVC_DTYPE_F16, KVC_LLAMA_F16, KVC_LLAMA_V_TRANS);
}

static void test_q8_0_round_trip(void **state) {
  (void)state;
  round_trip("q8_0", KVC_DTYPE_F32, KVC_LLAMA_Q8_0, KVC_LLAMA_ATTN_ROT);
  round_trip("q8_0", KVC_DTYPE_F32, KVC_LLAMA_Q8_0, 0);
  round_trip("q8_0-norot", KVC_DTYPE_F32, KVC_LLAMA_Q8_0, 0);
}

static float *gather_all(kvc_pool *p, uint64_t id, int is_v) {
  float *x = malloc(sizeof(float) * LAYERS * TOKENS * ROW);
  for (uint32_t l = 0; l < LAYERS; ++l)
    ASSERT_OK(kvc_gather(p, id, l, 0, TOKENS, is_v ? NULL : x + (size_t)l * TOKENS * ROW,
                         is_v ? x + (size_t)l * TOKENS * ROW : NULL, KVC_DTYPE_F32, NULL));
  return x;
}

/* max |a - b| / max |b| over layer 0 (the layers after it see llama.cpp's attention of the
 * quantized cache, which differs between the two contexts). */
static double rel_diff_layer0(const float *a, const float *b) {
  double m = 0, d = 0;
  for (size_t i = 0; i < (size_t)TOKENS * ROW; ++i) {
    m = fmax(m, fabs((double)b[i]));
    d = fmax(d, fabs((double)a[i] - (double)b[i]));
  }
  return d / m;
}

static void test_rotation_undone(void **state) {
  (void)state;
  size_t nr = 0, nn = 0, nf = 0;
  uint8_t *rot = read_fixture("q8_0", &nr), *norot = read_fixture("q8_0-norot", &nn),
          *f16 = read_fixture("f16", &nf);
  kvc_pool *p = smollm2_pool(KVC_DTYPE_F32, LAYERS, HEAD_DIM);
  ASSERT_OK(kvc_seq_import_llama(p, 1, rot, nr, KVC_LLAMA_ATTN_ROT, NULL));
  ASSERT_OK(kvc_seq_import_llama(p, 2, norot, nn, 0, NULL));
  ASSERT_OK(kvc_seq_import_llama(p, 3, rot, nr, 0, NULL)); /* left rotated */
  ASSERT_OK(kvc_seq_import_llama(p, 4, f16, nf, 0, NULL));
  for (int is_v = 0; is_v < 2; ++is_v) {
    float *a = gather_all(p, 1, is_v), *b = gather_all(p, 2, is_v), *c = gather_all(p, 3, is_v),
          *ref = gather_all(p, 4, is_v);
    /* Undone, both q8_0 blobs hold the model's K / V up to q8_0 rounding (about 1 % of the
     * largest value); left rotated, the values are others altogether. */
    const double un = rel_diff_layer0(a, ref), plain = rel_diff_layer0(b, ref),
                 left = rel_diff_layer0(c, ref);
    print_message("%s: rotated blob undone %.4f, unrotated blob %.4f, left rotated %.4f\n",
                  is_v ? "V" : "K", un, plain, left);
    assert_true(un < 0.02);
    assert_true(plain < 0.02);
    assert_true(left > 0.2);
    free(a);
    free(b);
    free(c);
    free(ref);
  }
  free(rot);
  free(norot);
  free(f16);
  kvc_pool_destroy(p);
}

static void put_i32(uint8_t *b, size_t at, int32_t v) {
  memcpy(b + at, &v, 4);
}

static void expect_refused(kvc_pool *p, const uint8_t *b, size_t n, kvc_status want) {
  ASSERT_STATUS(want, kvc_seq_import_llama(p, 9, b, n, 0, NULL));
  assert_false(seq_exists(p, 9));
}

static void test_bad_blobs(void **state) {
  (void)state;
  size_t n = 0;
  uint8_t *blob = read_fixture("f16", &n);
  uint8_t *b = malloc(n + 1);
  kvc_pool *p = smollm2_pool(KVC_DTYPE_F16, LAYERS, HEAD_DIM);
  /* Every truncation is refused (the short ones one by one, then a stride), nothing made. */
  for (size_t len = 0; len < n; len += len < 512 ? 1 : 509) {
    kvc_status st = kvc_seq_import_llama(p, 9, blob, len, 0, NULL);
    assert_int_not_equal(st, KVC_OK);
    assert_false(seq_exists(p, 9));
  }
  memcpy(b, blob, n);
  b[n] = 0;
  expect_refused(p, b, n + 1, KVC_ERR_CORRUPT); /* a trailing byte */
  /* magic, seq id, n_stream, cell_count, then the cells: 16 + 12 i; positions, sequence counts,
   * sequence ids. */
  const size_t cells = 16, after_cells = cells + 12 * TOKENS;
  memcpy(b, blob, n);
  put_i32(b, cells + 12 * 3, 2); /* position 2 twice */
  expect_refused(p, b, n, KVC_ERR_CORRUPT);
  memcpy(b, blob, n);
  put_i32(b, cells + 12 * 5, TOKENS); /* a position past the cells */
  expect_refused(p, b, n, KVC_ERR_CORRUPT);
  memcpy(b, blob, n);
  put_i32(b, cells + 4, 2); /* a cell of two sequences */
  expect_refused(p, b, n, KVC_ERR_CORRUPT);
  memcpy(b, blob, n);
  put_i32(b, 12, 1 << 30); /* a cell count far beyond the blob */
  expect_refused(p, b, n, KVC_ERR_CORRUPT);
  memcpy(b, blob, n);
  put_i32(b, after_cells, 7); /* v_trans */
  expect_refused(p, b, n, KVC_ERR_CORRUPT);
  memcpy(b, blob, n);
  put_i32(b, after_cells + 8, 2); /* K of layer 0 said q4_0 */
  expect_refused(p, b, n, KVC_ERR_UNSUPPORTED);
  memcpy(b, blob, n);
  put_i32(b, after_cells + 12, 100); /* a row size of another model */
  expect_refused(p, b, n, KVC_ERR_INCOMPATIBLE);
  memcpy(b, blob, n);
  put_i32(b, 8, 2); /* two streams: the second's count is read from the cells */
  assert_int_not_equal(kvc_seq_import_llama(p, 9, b, n, 0, NULL), KVC_OK);
  assert_false(seq_exists(p, 9));
  put_i32(b, 8, 0);
  expect_refused(p, b, n, KVC_ERR_CORRUPT);
  memcpy(b, blob, n);
  put_i32(b, 0, 0x12345678); /* another magic: another format */
  expect_refused(p, b, n, KVC_ERR_VERSION);
  memcpy(b, blob, n);
  put_i32(b, 4, -3); /* a negative sequence id */
  expect_refused(p, b, n, KVC_ERR_CORRUPT);
  /* Foreign pools: layers, head size. */
  kvc_pool *fewer = smollm2_pool(KVC_DTYPE_F16, LAYERS - 1, HEAD_DIM);
  ASSERT_STATUS(KVC_ERR_INCOMPATIBLE, kvc_seq_import_llama(fewer, 1, blob, n, 0, NULL));
  assert_false(seq_exists(fewer, 1));
  kvc_pool_destroy(fewer);
  kvc_pool *narrow = smollm2_pool(KVC_DTYPE_F16, LAYERS, 32);
  ASSERT_STATUS(KVC_ERR_INCOMPATIBLE, kvc_seq_import_llama(narrow, 1, blob, n, 0, NULL));
  kvc_pool_destroy(narrow);
  /* Arguments. */
  ASSERT_STATUS(KVC_ERR_NULL_POINTER, kvc_seq_import_llama(NULL, 1, blob, n, 0, NULL));
  ASSERT_STATUS(KVC_ERR_NULL_POINTER, kvc_seq_import_llama(p, 1, NULL, n, 0, NULL));
  ASSERT_STATUS(KVC_ERR_INVALID_ARGUMENT, kvc_seq_import_llama(p, 1, blob, n, 0x80, NULL));
  ASSERT_STATUS(KVC_ERR_INVALID_ARGUMENT,
                kvc_seq_import_llama(p, 1, blob, n, KVC_LLAMA_V_TRANS, NULL));
  ASSERT_OK(kvc_seq_import_llama(p, 1, blob, n, 0, NULL));
  ASSERT_STATUS(KVC_ERR_SEQ_EXISTS, kvc_seq_import_llama(p, 1, blob, n, 0, NULL));
  /* Random damage to the cells and headers never crashes; a refused blob leaves nothing. */
  uint32_t x = 12345;
  for (int i = 0; i < 400; ++i) {
    memcpy(b, blob, n);
    for (int j = 0; j < 3; ++j) {
      x = x * 1664525u + 1013904223u;
      const size_t at = (x >> 8) % (after_cells + 24);
      x = x * 1664525u + 1013904223u;
      b[at] ^= (uint8_t)(1u << ((x >> 13) % 8));
    }
    kvc_status st = kvc_seq_import_llama(p, 10, b, n, 0, NULL);
    if (st == KVC_OK) {
      ASSERT_OK(kvc_seq_free(p, 10));
    } else {
      assert_false(seq_exists(p, 10));
    }
  }
  uint64_t len = 0;
  ASSERT_OK(kvc_seq_length(p, 1, &len));
  assert_int_equal(len, TOKENS);
  free(b);
  free(blob);
  kvc_pool_destroy(p);
}

static void test_export_errors(void **state) {
  (void)state;
  size_t n = 0, size = 0;
  uint8_t *blob = read_fixture("f16", &n);
  kvc_pool *p = smollm2_pool(KVC_DTYPE_F32, LAYERS, HEAD_DIM);
  ASSERT_OK(kvc_seq_import_llama(p, 1, blob, n, 0, NULL));
  uint8_t *out = malloc(n);
  memset(out, 0xAB, n);
  ASSERT_STATUS(KVC_ERR_BUFFER_TOO_SMALL,
                kvc_seq_export_llama(p, 1, 0, KVC_LLAMA_F16, KVC_LLAMA_F16, 0, out, n - 1, &size));
  assert_int_equal(size, n);
  assert_int_equal(out[0], 0xAB); /* nothing written */
  ASSERT_STATUS(KVC_ERR_NULL_POINTER,
                kvc_seq_export_llama(p, 1, 0, KVC_LLAMA_F16, KVC_LLAMA_F16, 0, out, n, NULL));
  ASSERT_STATUS(KVC_ERR_NULL_POINTER,
                kvc_seq_export_llama(p, 1, 0, KVC_LLAMA_F16, KVC_LLAMA_F16, 0, NULL, n, &size));
  ASSERT_STATUS(KVC_ERR_SEQ_NOT_FOUND,
                kvc_seq_export_llama(p, 2, 0, KVC_LLAMA_F16, KVC_LLAMA_F16, 0, out, n, &size));
  ASSERT_STATUS(KVC_ERR_INVALID_ARGUMENT,
                kvc_seq_export_llama(p, 1, 0, (kvc_llama_type)2, KVC_LLAMA_F16, 0, out, n, &size));
  ASSERT_STATUS(KVC_ERR_INVALID_ARGUMENT,
                kvc_seq_export_llama(p, 1, -1, KVC_LLAMA_F16, KVC_LLAMA_F16, 0, out, n, &size));
  ASSERT_STATUS(KVC_ERR_INVALID_ARGUMENT,
                kvc_seq_export_llama(p, 1, 0, KVC_LLAMA_F16, KVC_LLAMA_Q8_0, KVC_LLAMA_V_TRANS, out,
                                     n, &size));
  ASSERT_STATUS(KVC_ERR_INVALID_ARGUMENT,
                kvc_seq_export_llama(p, 1, 0, KVC_LLAMA_F16, KVC_LLAMA_F16, 0x10, out, n, &size));
  /* Another sequence id in every cell. */
  ASSERT_OK(kvc_seq_export_llama(p, 1, 5, KVC_LLAMA_F16, KVC_LLAMA_F16, 0, out, n, &size));
  int32_t seq = 0;
  memcpy(&seq, out + 4, 4);
  assert_int_equal(seq, 5);
  memcpy(&seq, out + 16 + 8, 4);
  assert_int_equal(seq, 5);
  /* Layers holding different tokens (per-layer eviction) have no llama.cpp form. */
  const uint64_t keep[4] = {0, 2, 4, 6};
  ASSERT_OK(kvc_seq_keep(p, 1, 3, keep, 4, NULL));
  ASSERT_STATUS(KVC_ERR_UNSUPPORTED,
                kvc_seq_export_llama(p, 1, 0, KVC_LLAMA_F16, KVC_LLAMA_F16, 0, out, n, &size));
  /* Evicted alike in every layer: the kept tokens keep their positions; such a blob is
   * llama.cpp's to restore, not ours (its positions are not 0..n-1). */
  for (uint32_t l = 0; l < LAYERS; ++l)
    if (l != 3) ASSERT_OK(kvc_seq_keep(p, 1, l, keep, 4, NULL));
  ASSERT_OK(kvc_seq_export_llama(p, 1, 0, KVC_LLAMA_F16, KVC_LLAMA_F16, 0, out, n, &size));
  assert_int_equal(size, 16 + 4 * 12 + 8 + LAYERS * 2 * (12 + 4 * ROW * 2));
  int32_t pos = 0;
  memcpy(&pos, out + 16 + 12 * 3, 4);
  assert_int_equal(pos, 6);
  ASSERT_STATUS(KVC_ERR_CORRUPT, kvc_seq_import_llama(p, 2, out, size, 0, NULL));
  /* An empty sequence: one stream, no cells; it imports back empty. */
  ASSERT_OK(kvc_seq_create(p, 3));
  ASSERT_OK(kvc_seq_export_llama(p, 3, 0, KVC_LLAMA_Q8_0, KVC_LLAMA_Q8_0, 0, out, n, &size));
  assert_int_equal(size, 16);
  uint64_t tokens = 99;
  ASSERT_OK(kvc_seq_import_llama(p, 4, out, size, 0, &tokens));
  assert_int_equal(tokens, 0);
  /* q8_0 needs rows in blocks of 32 values. */
  kvc_pool *small = make_pool(2, 1, 8, 16, 8);
  ASSERT_OK(kvc_seq_create(small, 1));
  ASSERT_STATUS(KVC_ERR_INVALID_ARGUMENT,
                kvc_seq_export_llama(small, 1, 0, KVC_LLAMA_Q8_0, KVC_LLAMA_F16, 0, out, n, &size));
  kvc_pool_destroy(small);
  free(out);
  free(blob);
  kvc_pool_destroy(p);
}

/* Values a type cannot hold are refused, never written as Inf; a pool with a small residual arena
 * imports a blob larger than the arena (the tokens come in chunks, as appends would). */
static void test_ranges_and_residual_pools(void **state) {
  (void)state;
  kvc_pool *p = make_pool(2, 1, 64, 4, 64);
  ASSERT_OK(kvc_seq_create(p, 1));
  ASSERT_OK(kvc_seq_reserve(p, 1, 32, NULL));
  float k[32 * 64], v[32 * 64];
  for (int i = 0; i < 32 * 64; ++i) {
    k[i] = (float)((i * 37) % 19) - 9.0f;
    v[i] = (float)((i * 11) % 7) * 0.25f;
  }
  for (uint32_t l = 0; l < 2; ++l) ASSERT_OK(kvc_append(p, 1, l, 0, 32, k, v, KVC_DTYPE_F32));
  size_t size = 0;
  ASSERT_STATUS(KVC_ERR_BUFFER_TOO_SMALL,
                kvc_seq_export_llama(p, 1, 0, KVC_LLAMA_F32, KVC_LLAMA_F32, 0, NULL, 0, &size));
  uint8_t *blob = malloc(size);
  ASSERT_OK(kvc_seq_export_llama(p, 1, 0, KVC_LLAMA_F32, KVC_LLAMA_F32, 0, blob, size, &size));
  /* int8 with a residual window of 4 and an arena of 4 blocks of 4 tokens: 32 tokens fit as an
   * engine appends them; the import's chunks do too. */
  kvc_pool_config c = test_config(2, 1, 64, 4, 64);
  c.residual_window = 4;
  c.num_residual_blocks = 4;
  kvc_pool *r = quantized_pool(c, KVC_DTYPE_INT8);
  assert_non_null(r);
  uint64_t n = 0;
  ASSERT_OK(kvc_seq_import_llama(r, 5, blob, size, 0, &n));
  assert_int_equal(n, 32);
  float got[32 * 64];
  ASSERT_OK(kvc_gather(r, 5, 1, 0, 32, got, NULL, KVC_DTYPE_F32, NULL));
  for (int i = 0; i < 32 * 64; ++i) assert_true(fabsf(got[i] - k[i]) <= 9.0f / 127.0f + 1e-6f);
  kvc_pool_destroy(r);
  free(blob);
  /* Out of range: f16 above 65504, q8_0 above 65504 x 127 (its scale); f32 holds both. */
  ASSERT_OK(kvc_seq_create(p, 2));
  ASSERT_OK(kvc_seq_reserve(p, 2, 1, NULL));
  k[3] = 1e7f;
  for (uint32_t l = 0; l < 2; ++l) ASSERT_OK(kvc_append(p, 2, l, 0, 1, k, v, KVC_DTYPE_F32));
  uint8_t out[4096];
  ASSERT_STATUS(KVC_ERR_NON_FINITE, kvc_seq_export_llama(p, 2, 0, KVC_LLAMA_F16, KVC_LLAMA_F16, 0,
                                                         out, sizeof out, &size));
  ASSERT_STATUS(KVC_ERR_NON_FINITE, kvc_seq_export_llama(p, 2, 0, KVC_LLAMA_Q8_0, KVC_LLAMA_F16, 0,
                                                         out, sizeof out, &size));
  ASSERT_OK(kvc_seq_export_llama(p, 2, 0, KVC_LLAMA_F32, KVC_LLAMA_F16, 0, out, sizeof out, &size));
  k[3] = 65504.0f * 100.0f; /* q8_0 holds it (a scale of 51578), f16 does not */
  ASSERT_OK(kvc_seq_free(p, 2));
  ASSERT_OK(kvc_seq_create(p, 2));
  ASSERT_OK(kvc_seq_reserve(p, 2, 1, NULL));
  for (uint32_t l = 0; l < 2; ++l) ASSERT_OK(kvc_append(p, 2, l, 0, 1, k, v, KVC_DTYPE_F32));
  ASSERT_OK(
      kvc_seq_export_llama(p, 2, 0, KVC_LLAMA_Q8_0, KVC_LLAMA_Q8_0, 0, out, sizeof out, &size));
  /* A negative type is refused, not undefined. */
  ASSERT_STATUS(
      KVC_ERR_INVALID_ARGUMENT,
      kvc_seq_export_llama(p, 2, 0, (kvc_llama_type)-1, KVC_LLAMA_F16, 0, out, sizeof out, &size));
  kvc_pool_destroy(p);
}

static void test_api_table(void **state) {
  (void)state;
  const kvc_api *api = kvc_get_api(8);
  assert_non_null(api);
  size_t n = 0, size = 0;
  uint8_t *blob = read_fixture("q8_0", &n);
  kvc_pool *p = smollm2_pool(KVC_DTYPE_F32, LAYERS, HEAD_DIM);
  ASSERT_OK(api->seq_import_llama(p, 1, blob, n, KVC_LLAMA_ATTN_ROT, NULL));
  ASSERT_STATUS(KVC_ERR_BUFFER_TOO_SMALL,
                api->seq_export_llama(p, 1, 0, KVC_LLAMA_Q8_0, KVC_LLAMA_Q8_0, 0, NULL, 0, &size));
  assert_int_equal(size, n);
  free(blob);
  kvc_pool_destroy(p);
}

int main(int argc, char **argv) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_f16_round_trip),
      cmocka_unit_test(test_q8_0_round_trip),
      cmocka_unit_test(test_rotation_undone),
      cmocka_unit_test(test_bad_blobs),
      cmocka_unit_test(test_export_errors),
      cmocka_unit_test(test_api_table),
      cmocka_unit_test(test_ranges_and_residual_pools),
  };
  return run_named_tests("llamacpp", tests, sizeof tests / sizeof tests[0], argc, argv);
}
