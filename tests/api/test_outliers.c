/* codec_outlier_*: codec outliers (kvc_codec.outliers, dense-and-sparse codes)
 * through the C API: the stored pairs and scales against the documented rule,
 * every value within half a step of its group's scale, refusals, records,
 * attention over outlier codes. */
#include "../blackbox.h"

#include <float.h>
#include <math.h>

enum { HEADS = 2, HD = 16, ROW = HEADS * HD, N = 12, BS = 4 };

static uint32_t lcg = 4242;
static float frand(void) { /* uniform in [-1, 1) */
  lcg = lcg * 1664525u + 1013904223u;
  return (float)(lcg >> 8) / (float)(1u << 23) - 1.0f;
}

static kvc_codec int4_outliers(uint32_t k) {
  kvc_codec c;
  kvc_codec_init(&c); /* f32 scales */
  c.dtype = KVC_DTYPE_INT4;
  c.granularity = KVC_SCALE_PER_TOKEN;
  c.outliers = k;
  return c;
}

static kvc_pool *pool_with(const kvc_codec *k, kvc_status expect) {
  kvc_pool_config c = test_config(1, HEADS, HD, BS, 16);
  c.k_codec = k;
  kvc_pool *p = NULL;
  ASSERT_STATUS(expect, kvc_pool_create(&c, &p));
  return p;
}

/* Token t, head h: values in [-1, 1) with two outliers at positions that move
 * with t; tokens t % 3 == 0 have huge outliers (beyond 127 steps of the rest). */
static void rows(float *k) {
  for (uint32_t t = 0; t < N; ++t)
    for (uint32_t h = 0; h < HEADS; ++h) {
      float *r = k + t * ROW + h * HD;
      for (uint32_t e = 0; e < HD; ++e) r[e] = frand();
      const float big = t % 3 == 0 ? 60.0f : 9.0f;
      r[(t + h) % HD] = big;
      r[(t + 7 * h + 5) % HD] = -0.75f * big;
    }
}

static void fill(kvc_pool *p, uint64_t seq, const float *k) {
  ASSERT_OK(kvc_seq_create(p, seq));
  ASSERT_OK(kvc_seq_reserve(p, seq, N, NULL));
  ASSERT_OK(kvc_append(p, seq, 0, 0, N, k, k, KVC_DTYPE_F32));
}

/* The stored bytes follow docs/codecs.md: per (token, head) an f32 scale that
 * is the larger of the other values' absmax / 7 and the largest outlier's
 * magnitude / 127, and two (index, int8 code) pairs at k_zero_offset, largest
 * first, code = round(x / scale); every gathered value is within half a step;
 * without outliers the other values lose several times more. */
static void test_pool_round_trip(void **state) {
  (void)state;
  static float k[N * ROW], got[N * ROW], plain[N * ROW];
  rows(k);
  const kvc_codec c2 = int4_outliers(2), c0 = int4_outliers(0);
  kvc_pool *p = pool_with(&c2, KVC_OK), *q = pool_with(&c0, KVC_OK);
  fill(p, 1, k);
  fill(q, 1, k);
  ASSERT_OK(kvc_gather(p, 1, 0, 0, N, got, NULL, KVC_DTYPE_F32, NULL));
  ASSERT_OK(kvc_gather(q, 1, 0, 0, N, plain, NULL, KVC_DTYPE_F32, NULL));
  kvc_pool_layout l;
  kvc_pool_layout_init(&l);
  ASSERT_OK(kvc_pool_get_layout(p, &l));
  /* Block bytes: codes 4 x 2 x 8, scales 4 x 2 x 4, pairs 4 x 2 x 2 x 2. */
  assert_int_equal(l.k_bytes, BS * HEADS * (HD / 2) + BS * HEADS * 4 + BS * HEADS * 2 * 2);
  int32_t table[8];
  size_t nb = 0;
  ASSERT_OK(kvc_seq_block_table(p, 1, 0, table, 8, &nb));
  assert_int_equal(nb, N / BS);
  double se_rest = 0.0, se_plain = 0.0;
  for (uint32_t t = 0; t < N; ++t) {
    const uint8_t *blk = (const uint8_t *)l.base + (uint64_t)table[t / BS] * l.block_stride;
    for (uint32_t h = 0; h < HEADS; ++h) {
      const float *x = k + t * ROW + h * HD;
      /* the two outliers by the rule (largest magnitude, ties: lower index) */
      uint32_t o0 = 0, o1 = 0;
      for (uint32_t e = 0; e < HD; ++e)
        if (fabsf(x[e]) > fabsf(x[o0])) o0 = e;
      o1 = o0 == 0 ? 1 : 0;
      for (uint32_t e = 0; e < HD; ++e)
        if (e != o0 && fabsf(x[e]) > fabsf(x[o1])) o1 = e;
      float rest = 0.0f;
      for (uint32_t e = 0; e < HD; ++e)
        if (e != o0 && e != o1 && fabsf(x[e]) > rest) rest = fabsf(x[e]);
      const double want_scale = fmax(rest / 7.0, fabs(x[o0]) * 7.0 / 127.0 / 7.0);
      float scale;
      memcpy(&scale, blk + l.k_scale_offset + ((t % BS) * HEADS + h) * 4, 4);
      assert_true(fabs(scale - want_scale) <= 1e-6 * want_scale);
      const uint8_t *pairs = blk + l.k_zero_offset + ((t % BS) * HEADS + h) * 4;
      assert_int_equal(pairs[0], o0);
      assert_int_equal(pairs[2], o1);
      assert_int_equal((int8_t)pairs[1], (int)nearbyint(x[o0] / scale));
      assert_int_equal((int8_t)pairs[3], (int)nearbyint(x[o1] / scale));
      for (uint32_t e = 0; e < HD; ++e) {
        const double err = fabs((double)got[t * ROW + h * HD + e] - x[e]);
        assert_true(err <= scale / 2 * (1 + 1e-6));
        if (e != o0 && e != o1) {
          const double ep = (double)plain[t * ROW + h * HD + e] - x[e];
          se_rest += err * err;
          se_plain += ep * ep;
        }
      }
    }
  }
  /* The other values: without outliers they round to 0 (a step of 60 / 7 or 9 / 7); with
   * them, steps of 1 / 7 (or 60 / 127): about 7x less RMS error. */
  assert_true(se_plain > 16.0 * se_rest);
  kvc_pool_destroy(p);
  kvc_pool_destroy(q);
}

/* What outliers need, refused with the reason named; a refused pool is not made. */
static void test_refusals(void **state) {
  (void)state;
  kvc_codec c = int4_outliers(2);
  c.asymmetric = 1;
  pool_with(&c, KVC_ERR_INVALID_ARGUMENT);
  assert_non_null(strstr(kvc_last_error_message(), "symmetric integer codecs"));
  c = int4_outliers(2);
  c.granularity = KVC_SCALE_PER_CHANNEL;
  c.group_size = 4;
  pool_with(&c, KVC_ERR_INVALID_ARGUMENT);
  c = int4_outliers(2);
  c.granularity = KVC_SCALE_PER_TENSOR;
  pool_with(&c, KVC_ERR_INVALID_ARGUMENT);
  c = int4_outliers(2);
  c.dtype = KVC_DTYPE_FP8_E4M3;
  pool_with(&c, KVC_ERR_INVALID_ARGUMENT);
  c = int4_outliers(17);
  pool_with(&c, KVC_ERR_INVALID_ARGUMENT);
  assert_non_null(strstr(kvc_last_error_message(), "at most 16"));
  c = int4_outliers(5); /* 5 x 4 > 16 values per head */
  pool_with(&c, KVC_ERR_INVALID_ARGUMENT);
  assert_non_null(strstr(kvc_last_error_message(), "at least 4 per outlier"));
  c = int4_outliers(1);
  c.granularity = KVC_SCALE_PER_GROUP;
  c.group_size = 12; /* does not divide head_dim 16 */
  pool_with(&c, KVC_ERR_INVALID_ARGUMENT);
  /* A float codec with outliers: refused, not silently plain storage. */
  c = int4_outliers(2);
  c.dtype = KVC_DTYPE_F16;
  c.granularity = KVC_SCALE_NONE;
  pool_with(&c, KVC_ERR_INVALID_ARGUMENT);
  assert_non_null(strstr(kvc_last_error_message(), "integer dtypes only"));
  /* The standalone quantizer has no buffer for the pairs. */
  c = int4_outliers(2);
  kvc_quant_sizes qs;
  kvc_quant_sizes_init(&qs);
  ASSERT_STATUS(KVC_ERR_UNSUPPORTED, kvc_quantize_sizes(&c, 4, 16, &qs));
  float x[64] = {0};
  uint8_t codes[32], scales[16];
  ASSERT_STATUS(KVC_ERR_UNSUPPORTED, kvc_quantize(&c, x, KVC_DTYPE_F32, 4, 16, codes, scales, NULL));
  /* A caller of the 0.3 struct size never sets outliers: its codec works as before. */
  c = int4_outliers(3);
  c.struct_size = 56;
  kvc_pool *p = pool_with(&c, KVC_OK);
  kvc_pool_layout l;
  kvc_pool_layout_init(&l);
  ASSERT_OK(kvc_pool_get_layout(p, &l));
  assert_int_equal(l.k_bytes, BS * HEADS * (HD / 2) + BS * HEADS * 4);
  kvc_pool_destroy(p);
}

/* Records carry the outlier pairs (bit-exact keys after a restore) and the
 * outlier count in the pool fingerprint (a pool with another count refuses). */
static void test_records(void **state) {
  (void)state;
  static float k[N * ROW], a[N * ROW], b[N * ROW];
  rows(k);
  const kvc_codec c2 = int4_outliers(2), c1 = int4_outliers(1);
  kvc_pool *p = pool_with(&c2, KVC_OK), *same = pool_with(&c2, KVC_OK), *other = pool_with(&c1, KVC_OK);
  fill(p, 1, k);
  size_t size = 0;
  ASSERT_STATUS(KVC_ERR_BUFFER_TOO_SMALL, kvc_seq_save(p, 1, NULL, 0, &size));
  void *rec = malloc(size);
  ASSERT_OK(kvc_seq_save(p, 1, rec, size, &size));
  ASSERT_STATUS(KVC_ERR_INCOMPATIBLE, kvc_seq_restore(other, 1, rec, size));
  ASSERT_OK(kvc_seq_restore(same, 1, rec, size));
  ASSERT_OK(kvc_gather(p, 1, 0, 0, N, a, NULL, KVC_DTYPE_F32, NULL));
  ASSERT_OK(kvc_gather(same, 1, 0, 0, N, b, NULL, KVC_DTYPE_F32, NULL));
  assert_memory_equal(a, b, sizeof a);
  /* A fork and a truncation move whole slots, pairs included. */
  ASSERT_OK(kvc_seq_fork(same, 1, 2));
  ASSERT_OK(kvc_seq_truncate(same, 2, 7));
  ASSERT_OK(kvc_gather(same, 2, 0, 0, 7, b, NULL, KVC_DTYPE_F32, NULL));
  assert_memory_equal(a, b, 7 * ROW * sizeof(float));
  free(rec);
  kvc_pool_destroy(p);
  kvc_pool_destroy(same);
  kvc_pool_destroy(other);
}

/* Decode attention over outlier codes equals a softmax over the gathered keys. */
static void test_attention(void **state) {
  (void)state;
  static float k[N * ROW];
  rows(k);
  for (uint32_t i = 0; i < N * ROW; ++i) k[i] *= 0.05f;
  kvc_codec c = int4_outliers(2);
  c.full_range = 1;
  c.rotation = KVC_ROTATION_HADAMARD;
  kvc_pool_config cfg = test_config(1, HEADS, HD, BS, 16);
  cfg.k_codec = &c;
  cfg.v_codec = &c;
  kvc_pool *p = NULL;
  ASSERT_OK(kvc_pool_create(&cfg, &p));
  fill(p, 1, k);
  float q[2 * HEADS * HD];
  for (int i = 0; i < 2 * HEADS * HD; ++i) q[i] = frand();
  assert_decode_matches_gather_rows(p, 1, 0, N, HEADS, HD, q, 1e-5, 0.0);
  kvc_pool_destroy(p);
}

/* int3 full range per group of 8 values with 2 outliers each (f16 scales):
 * every value within one step of its group's stored scale (full range clamps
 * values of the sign opposite to the extreme beyond 3 steps within one). */
static void test_int3_groups(void **state) {
  (void)state;
  static float k[N * ROW], got[N * ROW];
  rows(k);
  kvc_codec c = int4_outliers(2);
  c.dtype = KVC_DTYPE_INT3;
  c.granularity = KVC_SCALE_PER_GROUP;
  c.group_size = 8;
  c.full_range = 1;
  c.scale_dtype = KVC_DTYPE_F16;
  kvc_pool *p = pool_with(&c, KVC_OK);
  fill(p, 1, k);
  ASSERT_OK(kvc_gather(p, 1, 0, 0, N, got, NULL, KVC_DTYPE_F32, NULL));
  for (uint32_t t = 0; t < N; ++t)
    for (uint32_t g = 0; g < ROW / 8; ++g) {
      const float *x = k + t * ROW + g * 8;
      /* the step: the larger of the third-largest magnitude / 4 and the largest / 127 */
      float m[8];
      for (int e = 0; e < 8; ++e) m[e] = fabsf(x[e]);
      for (int i = 0; i < 8; ++i)
        for (int j = i + 1; j < 8; ++j)
          if (m[j] > m[i]) {
            const float s = m[i];
            m[i] = m[j];
            m[j] = s;
          }
      const double step = fmax(m[2] / 4.0, m[0] / 127.0) * 1.001; /* f16 rounds up */
      for (int e = 0; e < 8; ++e) assert_true(fabs((double)got[t * ROW + g * 8 + e] - x[e]) <= step);
    }
  kvc_pool_destroy(p);
}

/* Full range with a group whose other values are all negative and tiny
 * against a positive outlier: the stand-in takes their sign, so they keep
 * half a step (a positive stand-in would clamp -7.9 steps to -7). Values near
 * FLT_MAX and NaN-free extremes read back finite. */
static void test_full_range_signs_and_extremes(void **state) {
  (void)state;
  kvc_codec c = int4_outliers(1);
  c.full_range = 1;
  kvc_pool *p = pool_with(&c, KVC_OK);
  static float k[N * ROW], got[N * ROW];
  for (uint32_t t = 0; t < N; ++t)
    for (uint32_t e = 0; e < ROW; ++e) /* head 0: -5.5 .. -6.1, just below 100 x 8 / 127 */
      k[t * ROW + e] = e < HD ? -5.5f - 0.1f * (float)((e + t) % 7) : -0.001f * (float)(1 + e % 7);
  for (uint32_t t = 0; t < N; ++t) k[t * ROW + 3] = 100.0f, k[t * ROW + HD + 9] = 3e38f;
  fill(p, 1, k);
  ASSERT_OK(kvc_gather(p, 1, 0, 0, N, got, NULL, KVC_DTYPE_F32, NULL));
  for (uint32_t t = 0; t < N; ++t)
    for (uint32_t h = 0; h < HEADS; ++h) {
      const float *x = k + t * ROW + h * HD;
      float top = 0.0f;
      for (uint32_t e = 0; e < HD; ++e) top = fmaxf(top, fminf(fabsf(x[e]), 1e38f));
      const double step = top / 127.0 * (1 + 1e-6);
      for (uint32_t e = 0; e < HD; ++e) {
        const float g = got[t * ROW + h * HD + e];
        assert_true(isfinite(g));
        assert_true(fabs((double)g - fmin(x[e], 1e38)) <= step / 2 + 1e-30);
      }
    }
  kvc_pool_destroy(p);
}

int main(int argc, char **argv) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_pool_round_trip),
      cmocka_unit_test(test_refusals),
      cmocka_unit_test(test_records),
      cmocka_unit_test(test_attention),
      cmocka_unit_test(test_int3_groups),
      cmocka_unit_test(test_full_range_signs_and_extremes),
  };
  return run_named_tests("codec_outlier", tests, sizeof tests / sizeof tests[0], argc, argv);
}
