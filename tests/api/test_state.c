/* Saving and restoring sequences (kvc_seq_save / kvc_seq_restore and the file
 * variants): exact round trips for plain and quantized storage, after eviction
 * and with a residual window; refusals (another configuration, damaged or
 * truncated records, a full pool, files that cannot be written) that change
 * nothing. */
#include <dirent.h>
#include <stdio.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>

#include "../blackbox.h"

enum { LAYERS = 2, HEADS = 2, HD = 16, ROW = HEADS * HD, BS = 8 };

static kvc_pool *pool_with(const kvc_pool_config *c) {
  kvc_pool *p = NULL;
  ASSERT_OK(kvc_pool_create(c, &p));
  return p;
}

/* Writes n tokens of deterministic K/V into every layer of a new sequence. */
static void write_seq(kvc_pool *p, uint64_t id, uint32_t tag, uint64_t n) {
  float *k = malloc(n * ROW * sizeof(float)), *v = malloc(n * ROW * sizeof(float));
  ASSERT_OK(kvc_seq_create(p, id));
  ASSERT_OK(kvc_seq_reserve(p, id, n, NULL));
  for (uint32_t l = 0; l < LAYERS; ++l) {
    fill_rows(k, v, tag, l, 0, n, ROW);
    for (uint64_t i = 0; i < n * ROW; ++i) k[i] = (k[i] - 1000.0f * tag) / 37.0f, v[i] = -v[i] / 53.0f;
    ASSERT_OK(kvc_append(p, id, l, 0, n, k, v, KVC_DTYPE_F32));
  }
  free(k);
  free(v);
}

/* Asserts two sequences (maybe in two pools) read back the same, bit for bit. */
static void assert_same(kvc_pool *pa, uint64_t a, kvc_pool *pb, uint64_t b) {
  uint64_t la, lb;
  ASSERT_OK(kvc_seq_length(pa, a, &la));
  ASSERT_OK(kvc_seq_length(pb, b, &lb));
  assert_int_equal(la, lb);
  for (uint32_t l = 0; l < LAYERS; ++l) {
    uint64_t na, nb;
    ASSERT_OK(kvc_seq_layer_tokens(pa, a, l, &na));
    ASSERT_OK(kvc_seq_layer_tokens(pb, b, l, &nb));
    assert_int_equal(na, nb);
    float *ka = calloc(na * ROW + 1, 4), *va = calloc(na * ROW + 1, 4), *kb = calloc(na * ROW + 1, 4),
          *vb = calloc(na * ROW + 1, 4);
    int32_t *pa_pos = calloc(na + 1, 4), *pb_pos = calloc(na + 1, 4);
    ASSERT_OK(kvc_gather(pa, a, l, 0, na, ka, va, KVC_DTYPE_F32, pa_pos));
    ASSERT_OK(kvc_gather(pb, b, l, 0, na, kb, vb, KVC_DTYPE_F32, pb_pos));
    assert_memory_equal(ka, kb, na * ROW * 4);
    assert_memory_equal(va, vb, na * ROW * 4);
    assert_memory_equal(pa_pos, pb_pos, na * 4);
    free(ka), free(va), free(kb), free(vb), free(pa_pos), free(pb_pos);
  }
}

static uint8_t *save(kvc_pool *p, uint64_t id, size_t *size) {
  ASSERT_STATUS(KVC_ERR_BUFFER_TOO_SMALL, kvc_seq_save(p, id, NULL, 0, size));
  assert_true(*size > 0);
  uint8_t *buf = malloc(*size);
  size_t again = 0;
  ASSERT_STATUS(KVC_ERR_BUFFER_TOO_SMALL, kvc_seq_save(p, id, buf, *size - 1, &again));
  assert_int_equal(again, *size);
  ASSERT_OK(kvc_seq_save(p, id, buf, *size, &again));
  assert_int_equal(again, *size);
  return buf;
}

static uint64_t blocks_used(kvc_pool *p) {
  kvc_stats s;
  kvc_stats_init(&s);
  ASSERT_OK(kvc_pool_stats(p, &s));
  return s.blocks_used;
}

static void test_roundtrip_f32_and_f16(void **state) {
  (void)state;
  for (int f16 = 0; f16 < 2; ++f16) {
    kvc_pool_config c = test_config(LAYERS, HEADS, HD, BS, 64);
    if (f16) c.k_dtype = c.v_dtype = KVC_DTYPE_F16;
    kvc_pool *p = pool_with(&c), *q = pool_with(&c);
    write_seq(p, 1, 3, 37); /* a partly filled last block */
    size_t size = 0;
    uint8_t *rec = save(p, 1, &size);
    assert_memory_equal(rec, "KVCS", 4);
    ASSERT_OK(kvc_seq_restore(p, 2, rec, size)); /* the same pool */
    ASSERT_OK(kvc_seq_restore(q, 7, rec, size)); /* another pool */
    assert_same(p, 1, p, 2);
    assert_same(p, 1, q, 7);
    assert_int_equal(blocks_used(p), 2 * LAYERS * 5); /* private copies: 5 blocks per layer each */
    /* The restored sequence is a normal one: it grows and frees. */
    ASSERT_OK(kvc_seq_reserve(q, 7, 3, NULL));
    ASSERT_OK(kvc_seq_free(q, 7));
    assert_int_equal(blocks_used(q), 0);
    free(rec);
    kvc_pool_destroy(p);
    kvc_pool_destroy(q);
  }
}

static void test_roundtrip_codecs_and_tensor_scales(void **state) {
  (void)state;
  kvc_codec k4, k8;
  kvc_codec_init(&k4);
  k4.dtype = KVC_DTYPE_INT4;
  k4.granularity = KVC_SCALE_PER_GROUP;
  k4.group_size = 8;
  k4.asymmetric = 1;
  kvc_codec_init(&k8);
  k8.granularity = KVC_SCALE_PER_TENSOR; /* dynamic: fixed by the first write */
  kvc_pool_config c = test_config(LAYERS, HEADS, HD, BS, 64);
  c.k_codec = &k4;
  c.v_codec = &k8;
  kvc_pool *p = pool_with(&c), *q = pool_with(&c), *other = pool_with(&c);
  write_seq(p, 1, 5, 29);
  size_t size = 0;
  uint8_t *rec = save(p, 1, &size);
  ASSERT_OK(kvc_seq_restore(q, 1, rec, size)); /* q takes p's per-tensor V scales */
  assert_same(p, 1, q, 1);
  for (uint32_t l = 0; l < LAYERS; ++l) {
    float pk, pv, qk, qv;
    ASSERT_OK(kvc_pool_tensor_scales(p, l, &pk, &pv));
    ASSERT_OK(kvc_pool_tensor_scales(q, l, &qk, &qv));
    assert_true(pv > 0.0f);
    assert_true(pv == qv);
  }
  /* A pool whose V scale was calibrated by other data refuses the record. */
  write_seq(other, 9, 40, 4);
  const uint64_t used = blocks_used(other);
  ASSERT_STATUS(KVC_ERR_INCOMPATIBLE, kvc_seq_restore(other, 1, rec, size));
  assert_non_null(strstr(kvc_last_error_message(), "per-tensor V scale"));
  assert_int_equal(blocks_used(other), used);
  uint64_t len;
  ASSERT_STATUS(KVC_ERR_SEQ_NOT_FOUND, kvc_seq_length(other, 1, &len));
  free(rec);
  kvc_pool_destroy(p);
  kvc_pool_destroy(q);
  kvc_pool_destroy(other);
}

static void test_roundtrip_after_eviction(void **state) {
  (void)state;
  kvc_pool_config c = test_config(LAYERS, HEADS, HD, BS, 64);
  kvc_pool *p = pool_with(&c), *q = pool_with(&c);
  write_seq(p, 1, 2, 40);
  kvc_policy_config pc;
  kvc_policy_config_init(&pc);
  pc.kind = KVC_POLICY_STREAMING;
  pc.sink_tokens = 4;
  pc.recent_tokens = 10;
  kvc_policy *pol = NULL;
  ASSERT_OK(kvc_policy_create(&pc, &pol));
  uint64_t dropped[LAYERS];
  ASSERT_OK(kvc_evict(p, 1, pol, dropped));
  assert_int_equal(dropped[0], 26);
  size_t size = 0;
  uint8_t *rec = save(p, 1, &size);
  ASSERT_OK(kvc_seq_restore(q, 1, rec, size));
  assert_same(p, 1, q, 1); /* positions 0..3, 30..39 */
  int32_t pos[14];
  ASSERT_OK(kvc_gather(q, 1, 1, 0, 14, NULL, NULL, KVC_DTYPE_F32, pos));
  assert_int_equal(pos[3], 3);
  assert_int_equal(pos[4], 30);
  /* Writing continues at the saved length. */
  ASSERT_OK(kvc_seq_reserve(q, 1, 1, NULL));
  uint64_t len;
  ASSERT_OK(kvc_seq_length(q, 1, &len));
  assert_int_equal(len, 41);
  free(rec);
  kvc_policy_destroy(pol);
  kvc_pool_destroy(p);
  kvc_pool_destroy(q);
}

static void test_roundtrip_residual_window(void **state) {
  (void)state;
  kvc_codec k4;
  kvc_codec_init(&k4);
  k4.dtype = KVC_DTYPE_INT4;
  k4.granularity = KVC_SCALE_PER_GROUP;
  k4.group_size = 16;
  kvc_pool_config c = test_config(LAYERS, HEADS, HD, BS, 64);
  c.k_codec = &k4;
  c.v_codec = &k4;
  c.residual_window = 12;
  kvc_pool *p = pool_with(&c), *q = pool_with(&c);
  write_seq(p, 1, 7, 30);
  ASSERT_OK(kvc_seq_reserve(p, 1, 5, NULL)); /* ages tokens into the codec blocks */
  size_t size = 0;
  uint8_t *rec = save(p, 1, &size);
  ASSERT_OK(kvc_seq_restore(q, 1, rec, size));
  assert_same(p, 1, q, 1);
  kvc_stats a, b;
  kvc_stats_init(&a);
  kvc_stats_init(&b);
  ASSERT_OK(kvc_pool_stats(p, &a));
  ASSERT_OK(kvc_pool_stats(q, &b));
  assert_int_equal(a.residual_blocks_used, b.residual_blocks_used);
  assert_int_equal(a.blocks_used, b.blocks_used);
  free(rec);
  kvc_pool_destroy(p);
  kvc_pool_destroy(q);
}

static void test_other_configuration_refused(void **state) {
  (void)state;
  kvc_pool_config c = test_config(LAYERS, HEADS, HD, BS, 64);
  kvc_pool *p = pool_with(&c);
  write_seq(p, 1, 1, 20);
  size_t size = 0;
  uint8_t *rec = save(p, 1, &size);
  struct {
    const char *field;
    kvc_pool_config c;
  } cases[6];
  for (int i = 0; i < 6; ++i) cases[i].c = c;
  cases[0].field = "head_dim", cases[0].c.head_dim = HD * 2;
  cases[1].field = "block_size", cases[1].c.block_size = BS * 2;
  cases[2].field = "k_dtype", cases[2].c.k_dtype = KVC_DTYPE_F16;
  cases[3].field = "layout", cases[3].c.layout = KVC_LAYOUT_HND;
  cases[4].field = "RoPE", cases[4].c.rope_style = KVC_ROPE_NEOX;
  kvc_codec k8;
  kvc_codec_init(&k8);
  cases[5].field = "codecs", cases[5].c.k_codec = &k8;
  for (int i = 0; i < 6; ++i) {
    kvc_pool *q = pool_with(&cases[i].c);
    ASSERT_STATUS(KVC_ERR_INCOMPATIBLE, kvc_seq_restore(q, 1, rec, size));
    if (i < 4) assert_non_null(strstr(kvc_last_error_message(), cases[i].field));
    assert_int_equal(blocks_used(q), 0);
    uint64_t len;
    ASSERT_STATUS(KVC_ERR_SEQ_NOT_FOUND, kvc_seq_length(q, 1, &len));
    kvc_pool_destroy(q);
  }
  /* A record of another format version (1 and 2 are read). */
  rec[4] = 3;
  ASSERT_STATUS(KVC_ERR_INCOMPATIBLE, kvc_seq_restore(p, 2, rec, size));
  free(rec);
  kvc_pool_destroy(p);
}

static void test_damaged_records_refused(void **state) {
  (void)state;
  kvc_pool_config c = test_config(LAYERS, HEADS, HD, BS, 64);
  kvc_pool *p = pool_with(&c);
  write_seq(p, 1, 4, 20);
  size_t size = 0;
  uint8_t *rec = save(p, 1, &size);
  const uint64_t used = blocks_used(p);
  /* Every single flipped byte past the magic and format is caught. */
  for (size_t i = 8; i < size; i += (i < 200 ? 1 : 61)) {
    rec[i] ^= 0x40;
    ASSERT_STATUS(KVC_ERR_CORRUPT, kvc_seq_restore(p, 2, rec, size));
    rec[i] ^= 0x40;
  }
  ASSERT_STATUS(KVC_ERR_CORRUPT, kvc_seq_restore(p, 2, rec, size - 1)); /* truncated */
  ASSERT_STATUS(KVC_ERR_CORRUPT, kvc_seq_restore(p, 2, rec, 10));
  ASSERT_STATUS(KVC_ERR_CORRUPT, kvc_seq_restore(p, 2, "not a record at all, just bytes", 31));
  rec[0] = 'X';
  ASSERT_STATUS(KVC_ERR_CORRUPT, kvc_seq_restore(p, 2, rec, size));
  rec[0] = 'K';
  assert_int_equal(blocks_used(p), used);
  ASSERT_OK(kvc_seq_restore(p, 2, rec, size)); /* the intact record still works */
  assert_same(p, 1, p, 2);
  free(rec);
  kvc_pool_destroy(p);
}

static void test_errors_change_nothing(void **state) {
  (void)state;
  kvc_pool_config c = test_config(LAYERS, HEADS, HD, BS, 12);
  kvc_pool *p = pool_with(&c);
  write_seq(p, 1, 1, 40); /* 5 blocks per layer: 10 of 12 */
  size_t size = 0;
  uint8_t *rec = save(p, 1, &size);
  ASSERT_STATUS(KVC_ERR_POOL_EXHAUSTED, kvc_seq_restore(p, 2, rec, size));
  assert_int_equal(blocks_used(p), 10);
  ASSERT_STATUS(KVC_ERR_SEQ_EXISTS, kvc_seq_restore(p, 1, rec, size));
  ASSERT_STATUS(KVC_ERR_NULL_POINTER, kvc_seq_restore(p, 2, NULL, size));
  ASSERT_STATUS(KVC_ERR_NULL_POINTER, kvc_seq_restore(NULL, 2, rec, size));
  ASSERT_STATUS(KVC_ERR_NULL_POINTER, kvc_seq_save(p, 1, rec, size, NULL));
  ASSERT_STATUS(KVC_ERR_SEQ_NOT_FOUND, kvc_seq_save(p, 99, rec, size, &size));
  ASSERT_OK(kvc_seq_free(p, 1));
  ASSERT_OK(kvc_seq_restore(p, 2, rec, size)); /* fits once sequence 1 is gone */
  assert_int_equal(blocks_used(p), 10);
  free(rec);
  kvc_pool_destroy(p);
}

static int count_entries(const char *dir) {
  DIR *d = opendir(dir);
  int n = 0;
  for (struct dirent *e; (e = readdir(d)) != NULL;) n += e->d_name[0] != '.';
  closedir(d);
  return n;
}

static void test_files(void **state) {
  (void)state;
  char dir[] = "/tmp/kvc_state_XXXXXX";
  assert_non_null(mkdtemp(dir));
  char path[256], bad[256];
  snprintf(path, sizeof path, "%s/seq.kvcs", dir);
  kvc_pool_config c = test_config(LAYERS, HEADS, HD, BS, 64);
  kvc_pool *p = pool_with(&c), *q = pool_with(&c);
  write_seq(p, 1, 6, 21);
  write_seq(p, 2, 8, 9);
  ASSERT_OK(kvc_seq_save_file(p, 2, path));
  ASSERT_OK(kvc_seq_save_file(p, 1, path)); /* replaces it */
  assert_int_equal(count_entries(dir), 1);   /* no temporary file left */
  ASSERT_OK(kvc_seq_restore_file(q, 5, path));
  assert_same(p, 1, q, 5);
  /* The file holds exactly kvc_seq_save()'s record. */
  size_t size = 0;
  uint8_t *rec = save(p, 1, &size);
  struct stat st;
  assert_int_equal(stat(path, &st), 0);
  assert_int_equal((size_t)st.st_size, size);
  free(rec);

  snprintf(bad, sizeof bad, "%s/no/such/folder/seq.kvcs", dir);
  ASSERT_STATUS(KVC_ERR_IO, kvc_seq_save_file(p, 1, bad));
  assert_non_null(strstr(kvc_last_error_message(), "No such file"));
  ASSERT_STATUS(KVC_ERR_IO, kvc_seq_restore_file(q, 6, bad));
  ASSERT_STATUS(KVC_ERR_IO, kvc_seq_restore_file(q, 6, dir)); /* a folder */
  ASSERT_STATUS(KVC_ERR_SEQ_NOT_FOUND, kvc_seq_save_file(p, 77, path));
  ASSERT_STATUS(KVC_ERR_NULL_POINTER, kvc_seq_save_file(p, 1, NULL));
  /* A damaged file is refused. */
  FILE *f = fopen(path, "r+b");
  fseek(f, 100, SEEK_SET);
  fputc(0x5a, f);
  fclose(f);
  ASSERT_STATUS(KVC_ERR_CORRUPT, kvc_seq_restore_file(q, 6, path));
  unlink(path);
  /* A FIFO where the record should be: refused at once, not waited on. */
  char fifo[256];
  snprintf(fifo, sizeof fifo, "%s/fifo.kvcs", dir);
  assert_int_equal(mkfifo(fifo, 0600), 0);
  ASSERT_STATUS(KVC_ERR_IO, kvc_seq_restore_file(q, 6, fifo));
  unlink(fifo);
  rmdir(dir);
  kvc_pool_destroy(p);
  kvc_pool_destroy(q);
}

/* A record whose per-tensor scale is not a finite normal number (NaN, Inf,
 * a denormal) is refused, with a recomputed checksum: the layer's scale
 * would serve every later sequence. */
static void test_invalid_tensor_scale_refused(void **state) {
  (void)state;
  kvc_codec cod;
  kvc_codec_init(&cod);
  cod.granularity = KVC_SCALE_PER_TENSOR;
  kvc_pool_config c = test_config(1, HEADS, HD, BS, 32);
  c.k_codec = &cod;
  c.v_codec = &cod;
  kvc_pool *p = pool_with(&c);
  float k[5 * ROW], v[5 * ROW];
  ASSERT_OK(kvc_seq_create(p, 1));
  ASSERT_OK(kvc_seq_reserve(p, 1, 5, NULL));
  fill_rows(k, v, 3, 0, 0, 5, ROW);
  ASSERT_OK(kvc_append(p, 1, 0, 0, 5, k, v, KVC_DTYPE_F32));
  size_t size = 0;
  uint8_t *rec = save(p, 1, &size);
  /* Header (24), fingerprint size and bytes, length, layers, track flag, then
   * layer 0: 4 x u64 counts, 4 x u32, then the K and V scale bits. */
  uint32_t fp_n;
  memcpy(&fp_n, rec + 24, 4);
  const size_t scale_k = 28 + fp_n + 8 + 4 + 4 + 4 * 8 + 4 * 4;
  float good;
  memcpy(&good, rec + scale_k, 4);
  assert_true(good > 0.0f);
  const uint32_t bad[] = {0x7fc00000u, 0x7f800000u, 0x00000001u};
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; ++i) {
    uint8_t *r = malloc(size);
    memcpy(r, rec, size);
    memcpy(r + scale_k, &bad[i], 4);
    const uint64_t sum = XXH3_64bits(r + 24, size - 24);
    memcpy(r + 16, &sum, 8);
    kvc_pool *q = pool_with(&c);
    ASSERT_STATUS(KVC_ERR_CORRUPT, kvc_seq_restore(q, 1, r, size));
    assert_non_null(strstr(kvc_last_error_message(), "per-tensor scale"));
    float ks = -1.0f, vs = -1.0f;
    ASSERT_OK(kvc_pool_tensor_scales(q, 0, &ks, &vs));
    assert_true(ks == 0.0f && vs == 0.0f); /* nothing adopted */
    kvc_pool_destroy(q);
    free(r);
  }
  free(rec);
  kvc_pool_destroy(p);
}

int main(int argc, char **argv) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_roundtrip_f32_and_f16),
      cmocka_unit_test(test_roundtrip_codecs_and_tensor_scales),
      cmocka_unit_test(test_roundtrip_after_eviction),
      cmocka_unit_test(test_roundtrip_residual_window),
      cmocka_unit_test(test_other_configuration_refused),
      cmocka_unit_test(test_damaged_records_refused),
      cmocka_unit_test(test_errors_change_nothing),
      cmocka_unit_test(test_files),
      cmocka_unit_test(test_invalid_tensor_scale_refused),
  };
  if (argc > 1) {
    int found = 0;
    for (size_t i = 0; i < sizeof tests / sizeof tests[0]; ++i) found |= strcmp(tests[i].name, argv[1]) == 0;
    if (!found) {
      fprintf(stderr, "no test named %s\n", argv[1]);
      return 1;
    }
    cmocka_set_test_filter(argv[1]);
  }
  return cmocka_run_group_tests_name("core_state", tests, NULL, NULL);
}
