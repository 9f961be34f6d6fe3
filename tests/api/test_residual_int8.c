/* kvc_pool_config.residual_dtype = KVC_DTYPE_INT8: residual rows stored as
 * int8 codes with one f16 scale per token and KV head (docs/codecs.md,
 * "Int8 residual rows"). What the window holds is checked against
 * kvc_quantize() / kvc_dequantize() of the same rows with the int8 per-token
 * f16-scale codec, byte for byte; aging, attention sinks, attention, fork,
 * save / restore, the layout and bad input (NaN, unsupported dtypes). */
#include "../blackbox.h"

enum { kHeads = 2, kDim = 16, kRow = kHeads * kDim, kBlock = 4 };

static float val(uint64_t pos, int e, int kv) {
  /* One channel larger than the rest (as attention sinks' keys are), so an
   * int8 row's scale differs from head to head and token to token. */
  const float big = (e % kDim == 3) ? 6.0f + 0.5f * (float)(pos % 5) : 1.0f;
  return big * sinf(0.37f * (float)pos + 0.91f * (float)e + (kv ? 0.5f : 0.0f));
}

static void row_of(uint64_t pos, int kv, float *out) {
  for (int e = 0; e < kRow; ++e) out[e] = val(pos, e, kv);
}

/* The rows the int8 residual stores: kvc_quantize's int8 per-token codec
 * (f16 scales), one scale per KV head, decoded. */
static void int8_rows(const float *in, float *out) {
  kvc_codec c;
  kvc_codec_init(&c);
  c.dtype = KVC_DTYPE_INT8;
  c.granularity = KVC_SCALE_PER_TOKEN;
  c.scale_dtype = KVC_DTYPE_F16;
  int8_t codes[kRow];
  uint16_t scales[kHeads];
  ASSERT_OK(kvc_quantize(&c, in, KVC_DTYPE_F32, kHeads, kDim, codes, scales, NULL));
  ASSERT_OK(kvc_dequantize(&c, codes, scales, NULL, kHeads, kDim, out, KVC_DTYPE_F32));
}

static kvc_pool *int8_pool(const kvc_codec *k, const kvc_codec *v, uint32_t window,
                           uint32_t sinks, kvc_dtype residual) {
  kvc_pool_config c = test_config(2, kHeads, kDim, kBlock, 64);
  c.k_codec = k;
  c.v_codec = v;
  c.residual_window = window;
  c.residual_sinks = sinks;
  c.residual_dtype = residual;
  kvc_pool *p = NULL;
  ASSERT_OK(kvc_pool_create(&c, &p));
  return p;
}

static void append_tokens(kvc_pool *p, uint64_t seq, uint64_t from, uint64_t to) {
  float k[kRow], v[kRow];
  for (uint64_t pos = from; pos < to; ++pos) {
    row_of(pos, 0, k);
    row_of(pos, 1, v);
    ASSERT_OK(kvc_seq_reserve(p, seq, 1, NULL));
    for (uint32_t l = 0; l < 2; ++l) ASSERT_OK(kvc_append(p, seq, l, pos, 1, k, v, KVC_DTYPE_F32));
  }
}

static kvc_codec int4_token(void) {
  kvc_codec c;
  kvc_codec_init(&c);
  c.dtype = KVC_DTYPE_INT4;
  c.granularity = KVC_SCALE_PER_TOKEN;
  return c;
}

/* The window's rows are exactly the int8 codec's rows; older tokens are the
 * int4 codes of those (within an int4 step of the input); the layout and
 * the residual block's bytes. */
static void test_window_rows(void **state) {
  (void)state;
  kvc_codec c4 = int4_token();
  kvc_pool *p = int8_pool(&c4, &c4, 5, 0, KVC_DTYPE_INT8);
  kvc_pool_layout lay;
  kvc_pool_layout_init(&lay);
  ASSERT_OK(kvc_pool_get_layout(p, &lay));
  assert_int_equal(lay.residual_dtype, KVC_DTYPE_INT8);
  /* Each part: [4][2][16] codes + [4][2] f16 scales = 128 + 16 bytes. */
  assert_int_equal(lay.residual_block_stride, 2 * (kBlock * kRow + kBlock * kHeads * 2));
  ASSERT_OK(kvc_seq_create(p, 1));
  append_tokens(p, 1, 0, 13);
  float kg[13 * kRow], vg[13 * kRow], want[kRow], in[kRow];
  for (uint32_t l = 0; l < 2; ++l) {
    ASSERT_OK(kvc_gather(p, 1, l, 0, 13, kg, vg, KVC_DTYPE_F32, NULL));
    for (uint64_t t = 0; t < 13; ++t)
      for (int kv = 0; kv < 2; ++kv) {
        const float *got = (kv ? vg : kg) + t * kRow;
        row_of(t, kv, in);
        if (t >= 8) { /* the newest 5: int8 rows, bit for bit */
          int8_rows(in, want);
          assert_memory_equal(got, want, sizeof want);
          int differs = 0; /* and not the input itself (the rows are not exact) */
          for (int e = 0; e < kRow; ++e) differs |= got[e] != in[e];
          assert_true(differs);
        } else { /* aged: int4 per token (step = max / 7) */
          for (int h = 0; h < kHeads; ++h) {
            float mx = 0.0f;
            for (int e = 0; e < kDim; ++e) mx = fmaxf(mx, fabsf(in[h * kDim + e]));
            for (int e = 0; e < kDim; ++e)
              assert_true(fabsf(got[h * kDim + e] - in[h * kDim + e]) <= 0.6f * mx / 7.0f + 1e-6f);
          }
        }
      }
  }
  /* A residual block holds 4 int8 tokens: bytes_per_token of codec blocks
   * is unchanged, and the stats count the residual blocks at their stride. */
  kvc_stats s;
  kvc_stats_init(&s);
  ASSERT_OK(kvc_pool_stats(p, &s));
  assert_int_equal(s.residual_bytes_per_block, lay.residual_block_stride);
  assert_true(s.residual_blocks_used >= 2 * 2 && s.residual_blocks_used <= 2 * 3);
  kvc_pool_destroy(p);
}

/* Attention sinks are int8 copies too, laid over their codes once encoded;
 * decode attention reads the same rows kvc_gather() returns. */
static void test_sinks_and_attention(void **state) {
  (void)state;
  kvc_codec c4 = int4_token();
  kvc_pool *p = int8_pool(&c4, &c4, 2, 1, KVC_DTYPE_INT8);
  ASSERT_OK(kvc_seq_create(p, 1));
  append_tokens(p, 1, 0, 11);
  float kg[11 * kRow], vg[11 * kRow], in[kRow], want[kRow];
  ASSERT_OK(kvc_gather(p, 1, 1, 0, 11, kg, vg, KVC_DTYPE_F32, NULL));
  row_of(0, 0, in);
  int8_rows(in, want);
  assert_memory_equal(kg, want, sizeof want);
  row_of(0, 1, in);
  int8_rows(in, want);
  assert_memory_equal(vg, want, sizeof want);
  /* Decode: softmax over the gathered rows (f64 reference). */
  kvc_attention_params ap;
  kvc_attention_params_init(&ap);
  ap.num_q_heads = 2 * kHeads;
  float q[2 * kRow], out[2 * kRow];
  for (int i = 0; i < 2 * kRow; ++i) q[i] = 0.2f * (float)((i * 5) % 9) - 0.8f;
  const uint64_t seq = 1;
  ASSERT_OK(kvc_attention_decode(p, 1, &seq, 1, q, out, NULL, &ap));
  const double scale = 1.0 / sqrt((double)kDim);
  for (int h = 0; h < 2 * kHeads; ++h) {
    const int g = h / 2;
    double sc[11], mx = -1e300, sum = 0.0;
    for (int t = 0; t < 11; ++t) {
      double d = 0.0;
      for (int e = 0; e < kDim; ++e) d += (double)q[h * kDim + e] * kg[t * kRow + g * kDim + e];
      sc[t] = d * scale;
      mx = fmax(mx, sc[t]);
    }
    for (int t = 0; t < 11; ++t) sum += (sc[t] = exp(sc[t] - mx));
    for (int e = 0; e < kDim; ++e) {
      double o = 0.0;
      for (int t = 0; t < 11; ++t) o += sc[t] / sum * vg[t * kRow + g * kDim + e];
      assert_true(fabs(o - out[h * kDim + e]) < 2e-4);
    }
  }
  kvc_pool_destroy(p);
}

/* Fork and save / restore keep the int8 rows byte for byte; a pool with f16
 * residual rows refuses the record. */
static void test_fork_save_restore(void **state) {
  (void)state;
  kvc_codec c4 = int4_token();
  kvc_pool *p = int8_pool(&c4, &c4, 6, 1, KVC_DTYPE_INT8);
  kvc_pool *q = int8_pool(&c4, &c4, 6, 1, KVC_DTYPE_F16);
  ASSERT_OK(kvc_seq_create(p, 1));
  append_tokens(p, 1, 0, 9);
  ASSERT_OK(kvc_seq_fork(p, 1, 2));
  append_tokens(p, 2, 9, 12);
  size_t need = 0;
  assert_int_equal(kvc_seq_save(p, 1, NULL, 0, &need), KVC_ERR_BUFFER_TOO_SMALL);
  uint8_t *rec = malloc(need);
  assert_non_null(rec);
  ASSERT_OK(kvc_seq_save(p, 1, rec, need, &need));
  ASSERT_OK(kvc_seq_restore(p, 3, rec, need));
  assert_int_equal(kvc_seq_restore(q, 3, rec, need), KVC_ERR_INCOMPATIBLE);
  free(rec);
  float a[12 * kRow], b[12 * kRow], av[12 * kRow], bv[12 * kRow];
  for (uint32_t l = 0; l < 2; ++l) {
    ASSERT_OK(kvc_gather(p, 1, l, 0, 9, a, av, KVC_DTYPE_F32, NULL));
    ASSERT_OK(kvc_gather(p, 3, l, 0, 9, b, bv, KVC_DTYPE_F32, NULL));
    assert_memory_equal(a, b, 9 * kRow * sizeof(float));
    assert_memory_equal(av, bv, 9 * kRow * sizeof(float));
    /* The fork's tokens encoded before it: shared. (Its appends aged 3..5 into int4 codes.) */
    ASSERT_OK(kvc_gather(p, 2, l, 0, 12, b, bv, KVC_DTYPE_F32, NULL));
    assert_memory_equal(a, b, 3 * kRow * sizeof(float));
    float in[kRow], want[kRow];
    for (uint64_t t = 6; t < 12; ++t) { /* its window: int8 rows of its own appends */
      row_of(t, 1, in);
      int8_rows(in, want);
      assert_memory_equal(bv + t * kRow, want, sizeof want);
    }
  }
  /* f16 and bf16 reads of int8 rows are the f32 rows rounded. */
  uint16_t h16[9 * kRow];
  float back[9 * kRow];
  ASSERT_OK(kvc_gather(p, 1, 0, 0, 9, h16, NULL, KVC_DTYPE_F16, NULL));
  ASSERT_OK(kvc_gather(p, 1, 0, 0, 9, a, NULL, KVC_DTYPE_F32, NULL));
  ASSERT_OK(kvc_convert(h16, KVC_DTYPE_F16, back, KVC_DTYPE_F32, 9 * kRow));
  for (int i = 0; i < 9 * kRow; ++i) assert_true(fabsf(back[i] - a[i]) <= 1e-3f * fabsf(a[i]) + 1e-6f);
  kvc_pool_destroy(q);
  kvc_pool_destroy(p);
}

/* NaN / Inf: refused with nothing written, for a part stored plainly once
 * encoded too (whose f16 residual accepts them); other dtypes refused. */
static void test_bad_input(void **state) {
  (void)state;
  kvc_codec c4 = int4_token();
  kvc_pool *p = int8_pool(NULL, &c4, 4, 0, KVC_DTYPE_INT8); /* keys f32, values int4 */
  kvc_pool *f = int8_pool(NULL, &c4, 4, 0, KVC_DTYPE_F16);
  ASSERT_OK(kvc_seq_create(p, 1));
  ASSERT_OK(kvc_seq_create(f, 1));
  append_tokens(p, 1, 0, 3);
  float before[3 * kRow], after[3 * kRow], k[kRow], v[kRow];
  ASSERT_OK(kvc_gather(p, 1, 0, 0, 3, before, NULL, KVC_DTYPE_F32, NULL));
  row_of(3, 0, k);
  row_of(3, 1, v);
  k[kDim + 5] = NAN; /* token 0 of the call, head 1, dim 5 */
  ASSERT_OK(kvc_seq_reserve(p, 1, 1, NULL));
  ASSERT_STATUS(KVC_ERR_NON_FINITE, kvc_append(p, 1, 0, 3, 1, k, v, KVC_DTYPE_F32));
  assert_non_null(strstr(kvc_last_error_message(), "k[0][1][5] is NaN"));
  k[kDim + 5] = INFINITY;
  ASSERT_STATUS(KVC_ERR_NON_FINITE, kvc_append(p, 1, 0, 3, 1, k, v, KVC_DTYPE_F32));
  ASSERT_OK(kvc_gather(p, 1, 0, 0, 3, after, NULL, KVC_DTYPE_F32, NULL));
  assert_memory_equal(before, after, sizeof before);
  float k4[4 * kRow];
  ASSERT_OK(kvc_gather(p, 1, 0, 0, 4, k4, NULL, KVC_DTYPE_F32, NULL));
  for (int e = 0; e < kRow; ++e) /* the refused append wrote nothing: an unwritten slot reads 0 */
    assert_true(k4[3 * kRow + e] == 0.0f);
  ASSERT_OK(kvc_seq_reserve(f, 1, 1, NULL));
  ASSERT_OK(kvc_append(f, 1, 0, 0, 1, k, v, KVC_DTYPE_F32)); /* f16 rows keep Inf */
  k[kDim + 5] = 0.5f;
  ASSERT_OK(kvc_append(p, 1, 0, 3, 1, k, v, KVC_DTYPE_F32));
  kvc_pool_destroy(f);
  kvc_pool_destroy(p);

  kvc_pool_config c = test_config(1, kHeads, kDim, kBlock, 16);
  c.v_codec = &c4;
  c.residual_window = 4;
  const kvc_dtype bad[] = {KVC_DTYPE_INT4, KVC_DTYPE_INT2, KVC_DTYPE_INT3, KVC_DTYPE_FP8_E4M3,
                           (kvc_dtype)99};
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; ++i) {
    c.residual_dtype = bad[i];
    kvc_pool *x = NULL;
    ASSERT_STATUS(KVC_ERR_INVALID_ARGUMENT, kvc_pool_create(&c, &x));
    assert_null(x);
  }
}

/* KIVI per-channel keys with int8 staging and truncation into a group: the
 * cut group's tokens go back to the int8 residual and read as its rows. */
static void test_channel_truncate(void **state) {
  (void)state;
  kvc_codec kc;
  kvc_codec_init(&kc);
  kc.dtype = KVC_DTYPE_INT4;
  kc.granularity = KVC_SCALE_PER_CHANNEL;
  kc.group_size = 4;
  kc.asymmetric = 1;
  kvc_codec c4 = int4_token();
  kvc_pool *p = int8_pool(&kc, &c4, 2, 0, KVC_DTYPE_INT8);
  ASSERT_OK(kvc_seq_create(p, 1));
  append_tokens(p, 1, 0, 14);
  float before[14 * kRow], after[14 * kRow], again[kRow];
  ASSERT_OK(kvc_gather(p, 1, 0, 0, 14, before, NULL, KVC_DTYPE_F32, NULL));
  ASSERT_OK(kvc_seq_truncate(p, 1, 6)); /* group [4, 8) cut: tokens 4, 5 re-staged */
  ASSERT_OK(kvc_gather(p, 1, 0, 0, 6, after, NULL, KVC_DTYPE_F32, NULL));
  assert_memory_equal(before, after, 4 * kRow * sizeof(float)); /* group [0, 4) kept */
  for (int t = 4; t < 6; ++t) { /* the decoded codes, stored again as int8 rows */
    int8_rows(before + t * kRow, again);
    assert_memory_equal(after + t * kRow, again, sizeof again);
  }
  append_tokens(p, 1, 6, 12);
  uint64_t len = 0;
  ASSERT_OK(kvc_seq_length(p, 1, &len));
  assert_int_equal(len, 12);
  kvc_pool_destroy(p);
}

/* head_dim up to 1024 (a row's buffer once held 256 values: head_dim 512
 * overran it on append and on f16 gathers). */
static void test_large_head_dim(void **state) {
  (void)state;
  enum { D = 512 };
  kvc_codec c4 = int4_token();
  kvc_pool_config c = test_config(1, 1, D, 4, 16);
  c.k_codec = c.v_codec = &c4;
  c.residual_window = 2;
  c.residual_dtype = KVC_DTYPE_INT8;
  kvc_pool *p = NULL;
  ASSERT_OK(kvc_pool_create(&c, &p));
  ASSERT_OK(kvc_seq_create(p, 1));
  static float k[3][D], got[3][D], want[D];
  static uint16_t half[3][D];
  for (int t = 0; t < 3; ++t) {
    for (int e = 0; e < D; ++e) k[t][e] = sinf(0.3f * (float)t + 0.011f * (float)e) * (e == 7 ? 9.0f : 1.0f);
    ASSERT_OK(kvc_seq_reserve(p, 1, 1, NULL));
    ASSERT_OK(kvc_append(p, 1, 0, (uint64_t)t, 1, k[t], k[t], KVC_DTYPE_F32));
  }
  kvc_codec i8;
  kvc_codec_init(&i8);
  i8.dtype = KVC_DTYPE_INT8;
  i8.granularity = KVC_SCALE_PER_TOKEN;
  i8.scale_dtype = KVC_DTYPE_F16;
  static int8_t codes[D];
  uint16_t scale;
  ASSERT_OK(kvc_gather(p, 1, 0, 0, 3, got, NULL, KVC_DTYPE_F32, NULL));
  ASSERT_OK(kvc_gather(p, 1, 0, 0, 3, half, NULL, KVC_DTYPE_F16, NULL));
  for (int t = 1; t < 3; ++t) { /* the window */
    ASSERT_OK(kvc_quantize(&i8, k[t], KVC_DTYPE_F32, 1, D, codes, &scale, NULL));
    ASSERT_OK(kvc_dequantize(&i8, codes, &scale, NULL, 1, D, want, KVC_DTYPE_F32));
    assert_memory_equal(got[t], want, sizeof want);
    static float back[D];
    ASSERT_OK(kvc_convert(half[t], KVC_DTYPE_F16, back, KVC_DTYPE_F32, D));
    for (int e = 0; e < D; ++e) assert_true(fabsf(back[e] - want[e]) <= 1e-3f * fabsf(want[e]) + 1e-7f);
  }
  kvc_pool_destroy(p);
}

/* A sink that passes through the window keeps its stored int8 row when it
 * ages: rows of small values (f16 scales below 2^-14, subnormal) re-encoded
 * from their decoded values could take another scale. 300 sequences of such
 * rows, each sink read back as kvc_quantize's row of its input. */
static void test_sinks_of_small_rows(void **state) {
  (void)state;
  kvc_codec c4 = int4_token();
  kvc_pool *p = int8_pool(&c4, &c4, 2, 1, KVC_DTYPE_INT8);
  uint32_t rng = 12345;
  float k[kRow], v[kRow], got[kRow], want[kRow];
  for (uint64_t seq = 1; seq <= 300; ++seq) {
    ASSERT_OK(kvc_seq_create(p, seq));
    for (uint64_t pos = 0; pos < 4; ++pos) {
      const float mag = pos == 0 ? 2e-5f + 2e-3f * (float)(seq % 97) / 97.0f : 1.0f;
      for (int e = 0; e < kRow; ++e) {
        rng = rng * 1664525u + 1013904223u;
        k[e] = mag * ((float)(rng >> 8) / 16777216.0f - 0.5f);
        v[e] = -k[e];
      }
      if (pos == 0) int8_rows(k, want);
      ASSERT_OK(kvc_seq_reserve(p, seq, 1, NULL));
      for (uint32_t l = 0; l < 2; ++l) ASSERT_OK(kvc_append(p, seq, l, pos, 1, k, v, KVC_DTYPE_F32));
    }
    ASSERT_OK(kvc_gather(p, seq, 1, 0, 1, got, NULL, KVC_DTYPE_F32, NULL));
    assert_memory_equal(got, want, sizeof want);
    ASSERT_OK(kvc_seq_free(p, seq));
  }
  kvc_pool_destroy(p);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_window_rows),       cmocka_unit_test(test_sinks_and_attention),
      cmocka_unit_test(test_fork_save_restore), cmocka_unit_test(test_bad_input),
      cmocka_unit_test(test_channel_truncate),  cmocka_unit_test(test_large_head_dim),
      cmocka_unit_test(test_sinks_of_small_rows),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
