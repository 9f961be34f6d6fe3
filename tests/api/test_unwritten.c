/* Readers never see another sequence's old bytes: kvc_gather, attention and
 * records return zeros for slots that were reserved but never written, with
 * no pool flag (KVC_POOL_ZERO_ON_FREE off). Each case first leaves another
 * sequence's data in the blocks the next one gets. */
#include <math.h>

#include "../blackbox.h"

enum { LAYERS = 2, HEADS = 2, HD = 8, ROW = HEADS * HD, BS = 4, BLOCKS = 16 };

static void write_rows(kvc_pool *p, uint64_t id, uint32_t tag, uint32_t layer, uint64_t pos, uint64_t n) {
  float *k = calloc(n * ROW + 1, sizeof(float)), *v = calloc(n * ROW + 1, sizeof(float));
  fill_rows(k, v, tag, layer, pos, n, ROW);
  ASSERT_OK(kvc_append(p, id, layer, pos, n, k, v, KVC_DTYPE_F32));
  free(k);
  free(v);
}

/* Sequence 99 fills the whole pool with non-zero rows and is freed: every
 * block now holds its bytes. */
static void leave_old_bytes(kvc_pool *p) {
  const uint64_t n = (uint64_t)BLOCKS / LAYERS * BS;
  ASSERT_OK(kvc_seq_create(p, 99));
  for (uint64_t pos = 0; pos < n; pos += BS) { /* a block at a time: staging pools age as they go */
    ASSERT_OK(kvc_seq_reserve(p, 99, BS, NULL));
    for (uint32_t l = 0; l < LAYERS; ++l) write_rows(p, 99, 7, l, pos, BS);
  }
  ASSERT_OK(kvc_seq_free(p, 99));
}

/* Gathers tokens [0, n) of a layer; asserts token t is zero when
 * written[t] is 0 and equals fill_rows(tag) otherwise. */
static void expect_rows(kvc_pool *p, uint64_t id, uint32_t layer, uint64_t n, const int *written, uint32_t tag,
                        float tol) {
  float *k = calloc(n * ROW + 1, sizeof(float)), *v = calloc(n * ROW + 1, sizeof(float));
  float *ek = calloc(n * ROW + 1, sizeof(float)), *ev = calloc(n * ROW + 1, sizeof(float));
  memset(k, 0xff, n * ROW * sizeof(float)); /* NaN: a row left unwritten by gather shows */
  memset(v, 0xff, n * ROW * sizeof(float));
  ASSERT_OK(kvc_gather(p, id, layer, 0, n, k, v, KVC_DTYPE_F32, NULL));
  fill_rows(ek, ev, tag, layer, 0, n, ROW);
  for (uint64_t t = 0; t < n; ++t)
    for (uint32_t e = 0; e < ROW; ++e) {
      const float wk = written[t] ? ek[t * ROW + e] : 0.0f, wv = written[t] ? ev[t * ROW + e] : 0.0f;
      if (!(fabsf(k[t * ROW + e] - wk) <= tol * fabsf(wk) + 1e-6f) ||
          !(fabsf(v[t * ROW + e] - wv) <= tol * fabsf(wv) + 1e-6f)) {
        print_error("layer %u token %llu element %u: k %g v %g, expected %g %g\n", layer, (unsigned long long)t,
                    e, k[t * ROW + e], v[t * ROW + e], wk, wv);
        fail();
      }
    }
  free(k), free(v), free(ek), free(ev);
}

static void run_gather_case(kvc_pool *p, float tol) {
  leave_old_bytes(p);
  ASSERT_OK(kvc_seq_create(p, 1));
  ASSERT_OK(kvc_seq_reserve(p, 1, 6, NULL));
  int none[6] = {0, 0, 0, 0, 0, 0};
  for (uint32_t l = 0; l < LAYERS; ++l) expect_rows(p, 1, l, 6, none, 1, tol);
  /* Positions 1 and 4 written in layer 0 only. */
  write_rows(p, 1, 1, 0, 1, 1);
  write_rows(p, 1, 1, 0, 4, 1);
  int some[6] = {0, 1, 0, 0, 1, 0};
  expect_rows(p, 1, 0, 6, some, 1, tol);
  expect_rows(p, 1, 1, 6, none, 1, tol);
  /* The rest written: everything reads back. */
  write_rows(p, 1, 1, 0, 0, 6);
  write_rows(p, 1, 1, 1, 0, 6);
  int all[6] = {1, 1, 1, 1, 1, 1};
  for (uint32_t l = 0; l < LAYERS; ++l) expect_rows(p, 1, l, 6, all, 1, tol);
}

static void test_gather_plain(void **state) {
  (void)state;
  kvc_pool *p = make_pool(LAYERS, HEADS, HD, BS, BLOCKS);
  run_gather_case(p, 0.0f);
  kvc_pool_destroy(p);
}

static void test_gather_hnd_f16(void **state) {
  (void)state;
  kvc_pool_config c = test_config(LAYERS, HEADS, HD, BS, BLOCKS);
  c.k_dtype = c.v_dtype = KVC_DTYPE_F16;
  c.layout = KVC_LAYOUT_HND;
  kvc_pool *p = NULL;
  ASSERT_OK(kvc_pool_create(&c, &p));
  run_gather_case(p, 1e-3f);
  kvc_pool_destroy(p);
}

static void test_gather_int8(void **state) {
  (void)state;
  kvc_pool_config c = test_config(LAYERS, HEADS, HD, BS, BLOCKS);
  kvc_pool *p = quantized_pool(c, KVC_DTYPE_INT8);
  run_gather_case(p, 2e-2f);
  kvc_pool_destroy(p);
}

static void test_gather_residual(void **state) {
  (void)state;
  kvc_pool_config c = test_config(LAYERS, HEADS, HD, BS, BLOCKS);
  c.residual_window = 8;
  kvc_pool *p = quantized_pool(c, KVC_DTYPE_INT4);
  run_gather_case(p, 1e-3f); /* all six stay in the f16 residual */
  kvc_pool_destroy(p);
}

/* A copy on write copies the parent's whole block: the slots the child did
 * not write (beyond the fork's length) read as zeros. */
static void test_fork_copy_on_write(void **state) {
  (void)state;
  kvc_pool *p = make_pool(LAYERS, HEADS, HD, BS, BLOCKS);
  ASSERT_OK(kvc_seq_create(p, 1));
  ASSERT_OK(kvc_seq_reserve(p, 1, 3, NULL));
  for (uint32_t l = 0; l < LAYERS; ++l) write_rows(p, 1, 1, l, 0, 3);
  ASSERT_OK(kvc_seq_fork(p, 1, 2));
  ASSERT_OK(kvc_seq_truncate(p, 2, 1));
  ASSERT_OK(kvc_seq_reserve(p, 2, 2, NULL)); /* copies the shared block */
  int w[3] = {1, 0, 0};
  for (uint32_t l = 0; l < LAYERS; ++l) expect_rows(p, 2, l, 3, w, 1, 0.0f);
  int parent[3] = {1, 1, 1};
  expect_rows(p, 1, 0, 3, parent, 1, 0.0f);
  kvc_pool_destroy(p);
}

/* A sequence truncated and grown again does not read what it wrote before. */
static void test_truncate_then_reserve(void **state) {
  (void)state;
  kvc_pool *p = make_pool(LAYERS, HEADS, HD, BS, BLOCKS);
  ASSERT_OK(kvc_seq_create(p, 1));
  ASSERT_OK(kvc_seq_reserve(p, 1, 7, NULL));
  for (uint32_t l = 0; l < LAYERS; ++l) write_rows(p, 1, 1, l, 0, 7);
  ASSERT_OK(kvc_seq_truncate(p, 1, 2));
  ASSERT_OK(kvc_seq_reserve(p, 1, 5, NULL));
  int w[7] = {1, 1, 0, 0, 0, 0, 0};
  for (uint32_t l = 0; l < LAYERS; ++l) expect_rows(p, 1, l, 7, w, 1, 0.0f);
  kvc_pool_destroy(p);
}

/* Decode attention over unwritten slots equals attention over zero rows. */
static void test_attention_decode(void **state) {
  (void)state;
  kvc_pool *p = make_pool(LAYERS, HEADS, HD, BS, BLOCKS);
  kvc_pool *ref = make_pool(LAYERS, HEADS, HD, BS, BLOCKS);
  leave_old_bytes(p);
  float zeros[2 * ROW] = {0};
  for (int i = 0; i < 2; ++i) {
    kvc_pool *q = i ? ref : p;
    ASSERT_OK(kvc_seq_create(q, 1));
    ASSERT_OK(kvc_seq_reserve(q, 1, 5, NULL));
    write_rows(q, 1, 1, 0, 0, 3); /* tokens 3 and 4 unwritten in p, zeros in ref */
    if (q == ref) ASSERT_OK(kvc_append(ref, 1, 0, 3, 2, zeros, zeros, KVC_DTYPE_F32));
  }
  float query[2 * HEADS * HD], out_p[2 * HEADS * HD], out_r[2 * HEADS * HD];
  for (int i = 0; i < 2 * HEADS * HD; ++i) query[i] = (float)((i * 7) % 11) / 11.0f - 0.4f;
  kvc_attention_params ap;
  kvc_attention_params_init(&ap);
  ap.num_q_heads = 2 * HEADS;
  const uint64_t id = 1;
  ASSERT_OK(kvc_attention_decode(p, 0, &id, 1, query, out_p, NULL, &ap));
  ASSERT_OK(kvc_attention_decode(ref, 0, &id, 1, query, out_r, NULL, &ap));
  assert_memory_equal(out_p, out_r, sizeof out_p);
  kvc_pool_destroy(p);
  kvc_pool_destroy(ref);
}

/* Records carry zeros, not the earlier owner's bytes, in the slots the
 * sequence does not hold or never wrote, and the restored sequence reads its
 * unwritten positions as zeros until it writes them. */
static void test_records(void **state) {
  (void)state;
  kvc_pool *p = make_pool(LAYERS, HEADS, HD, BS, BLOCKS);
  leave_old_bytes(p);
  ASSERT_OK(kvc_seq_create(p, 1));
  ASSERT_OK(kvc_seq_reserve(p, 1, 5, NULL));
  for (uint32_t l = 0; l < LAYERS; ++l) write_rows(p, 1, 1, l, 0, 4);
  size_t size = 0;
  ASSERT_STATUS(KVC_ERR_BUFFER_TOO_SMALL, kvc_seq_save(p, 1, NULL, 0, &size));
  uint8_t *rec = malloc(size);
  ASSERT_OK(kvc_seq_save(p, 1, rec, size, &size));
  /* Sequence 99's values (7000 + layer * 100 + pos + e / 64, +0.5 for V)
   * filled every block: none may appear in the record (position 4 is not
   * written, slots 5..7 of each layer's second block not held). */
  for (size_t i = 0; i + 4 <= size; i += 4) {
    float x;
    memcpy(&x, rec + i, 4);
    assert_false(x >= 7000.0f && x < 7000.0f + LAYERS * 100.0f);
  }
  uint32_t format;
  memcpy(&format, rec + 4, 4);
  assert_int_equal(format, 2); /* lists the unwritten positions */
  /* The record restores exactly, position 4 still unwritten. */
  ASSERT_OK(kvc_seq_restore(p, 2, rec, size));
  int w[5] = {1, 1, 1, 1, 0};
  for (uint32_t l = 0; l < LAYERS; ++l) expect_rows(p, 2, l, 5, w, 1, 0.0f);
  for (uint32_t l = 0; l < LAYERS; ++l) write_rows(p, 2, 1, l, 4, 1);
  int all[5] = {1, 1, 1, 1, 1};
  for (uint32_t l = 0; l < LAYERS; ++l) expect_rows(p, 2, l, 5, all, 1, 0.0f);
  /* Once written, the record is format 1 again. */
  ASSERT_OK(kvc_seq_save(p, 2, rec, size, &size));
  memcpy(&format, rec + 4, 4);
  assert_int_equal(format, 1);
  free(rec);
  kvc_pool_destroy(p);
}

/* A swap out and back in (kvc_pool_copy_blocks to the host and from it)
 * carries zeros for the slots no one wrote: they never become readable as an
 * earlier owner's bytes, nor registrable. */
static void test_copy_blocks_swap(void **state) {
  (void)state;
  kvc_pool *p = make_pool(LAYERS, HEADS, HD, BS, BLOCKS);
  leave_old_bytes(p);
  ASSERT_OK(kvc_seq_create(p, 1));
  ASSERT_OK(kvc_seq_reserve(p, 1, 3, NULL)); /* slot 3 of the block never reserved */
  for (uint32_t l = 0; l < LAYERS; ++l) write_rows(p, 1, 1, l, 0, 2); /* position 2 unwritten */
  kvc_stats st = get_stats(p);
  int32_t blocks[LAYERS];
  for (uint32_t l = 0; l < LAYERS; ++l) {
    size_t n = 0;
    ASSERT_OK(kvc_seq_block_table(p, 1, l, &blocks[l], 1, &n));
    assert_int_equal(n, 1);
  }
  uint8_t *host = malloc(LAYERS * st.bytes_per_block);
  ASSERT_OK(kvc_pool_copy_blocks(p, blocks, LAYERS, host, KVC_COPY_TO_HOST));
  for (size_t i = 0; i + 4 <= LAYERS * st.bytes_per_block; i += 4) {
    float x;
    memcpy(&x, host + i, 4);
    assert_false(x >= 7000.0f && x < 7000.0f + LAYERS * 100.0f); /* sequence 99's values */
  }
  ASSERT_OK(kvc_pool_copy_blocks(p, blocks, LAYERS, host, KVC_COPY_FROM_HOST));
  int w[3] = {1, 1, 0};
  for (uint32_t l = 0; l < LAYERS; ++l) expect_rows(p, 1, l, 3, w, 1, 0.0f);
  free(host);
  kvc_pool_destroy(p);
}

/* Records of pools with attention sinks: a sink copy not made yet (its token
 * unwritten, or still staged) is zero in the record. */
static void test_records_sinks(void **state) {
  (void)state;
  kvc_pool_config c = test_config(LAYERS, HEADS, HD, BS, BLOCKS);
  c.residual_sinks = 2;
  kvc_pool *p = quantized_pool(c, KVC_DTYPE_INT8);
  leave_old_bytes(p);
  ASSERT_OK(kvc_seq_create(p, 1));
  ASSERT_OK(kvc_seq_reserve(p, 1, 3, NULL));
  for (uint32_t l = 0; l < LAYERS; ++l) write_rows(p, 1, 1, l, 1, 2); /* position 0 unwritten */
  size_t size = 0;
  ASSERT_STATUS(KVC_ERR_BUFFER_TOO_SMALL, kvc_seq_save(p, 1, NULL, 0, &size));
  uint8_t *rec = malloc(size);
  ASSERT_OK(kvc_seq_save(p, 1, rec, size, &size));
  /* Sequence 99's rows are ~7000 (f16 in the residual and sink blocks). */
  for (size_t i = 0; i + 2 <= size; i += 2) {
    uint16_t h;
    memcpy(&h, rec + i, 2);
    assert_false(h >= 0x6ed0 && h <= 0x6f80); /* f16 ~6990 .. 7680 */
  }
  free(rec);
  kvc_pool_destroy(p);
}

int main(int argc, char **argv) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_gather_plain),       cmocka_unit_test(test_gather_hnd_f16),
      cmocka_unit_test(test_gather_int8),        cmocka_unit_test(test_gather_residual),
      cmocka_unit_test(test_fork_copy_on_write), cmocka_unit_test(test_truncate_then_reserve),
      cmocka_unit_test(test_attention_decode),   cmocka_unit_test(test_records),
      cmocka_unit_test(test_copy_blocks_swap),   cmocka_unit_test(test_records_sinks),
  };
  return run_named_tests("core_unwritten_read", tests, sizeof tests / sizeof tests[0], argc, argv);
}
