/* codec_codebook_*: codebooks (kvc_pool_set_codebook) through the C API: what
 * a pool reads back is the analytic rule (nearest level of x / e, the
 * group's norm kept) computed here; refused calls change nothing; records
 * carry the levels; attention reads the same values; the built-in Gaussian
 * levels (kvc_codebook_gaussian). */
#include "../blackbox.h"

#include <float.h>
#include <math.h>

enum { LAYERS = 2, HEADS = 2, HD = 16, ROW = HEADS * HD, N = 24 };

static uint32_t lcg = 4242;
static float frand(void) { /* uniform in [-1, 1) */
  lcg = lcg * 1664525u + 1013904223u;
  return (float)(lcg >> 8) / (float)(1u << 23) - 1.0f;
}
static float gauss(void) { /* Box-Muller */
  const float u = 0.5f * (frand() + 1.0f) + 1e-7f, v = frand();
  return sqrtf(-2.0f * logf(u)) * cosf(3.14159265f * v);
}

static void rows(float *x, uint64_t n) {
  for (uint64_t i = 0; i < n; ++i) x[i] = gauss() * (i % 7 == 0 ? 4.0f : 1.0f);
}

/* Levels of layer l for b bits: ascending in [-1, 1], different per layer. */
static void levels_of(uint32_t bits, float *lv /* [LAYERS][1 << bits] */) {
  const uint32_t n = 1u << bits;
  for (uint32_t l = 0; l < LAYERS; ++l)
    for (uint32_t i = 0; i < n; ++i) {
      const float t = -1.0f + 2.0f * (float)i / (float)(n - 1); /* -1 .. 1 */
      lv[l * n + i] = t * fabsf(t) * (l ? 0.9f : 1.0f);        /* denser near 0 */
    }
}

static kvc_codec int_codec(kvc_dtype dt, kvc_granularity g, uint32_t group) {
  kvc_codec c;
  kvc_codec_init(&c);
  c.dtype = dt;
  c.granularity = g;
  c.group_size = group;
  c.scale_dtype = KVC_DTYPE_F32;
  return c;
}

static kvc_pool *pool_of(const kvc_codec *k, const kvc_codec *v, uint32_t flags) {
  kvc_pool_config c = test_config(LAYERS, HEADS, HD, 8, 64);
  c.k_codec = k;
  c.v_codec = v;
  c.flags = flags;
  kvc_pool *p = NULL;
  ASSERT_OK(kvc_pool_create(&c, &p));
  return p;
}

static void fill(kvc_pool *p, uint64_t seq, float k[LAYERS][N * ROW], float v[LAYERS][N * ROW]) {
  ASSERT_OK(kvc_seq_create(p, seq));
  ASSERT_OK(kvc_seq_reserve(p, seq, N, NULL));
  for (uint32_t l = 0; l < LAYERS; ++l) ASSERT_OK(kvc_append(p, seq, l, 0, N, k[l], v[l], KVC_DTYPE_F32));
}

/* The rule of kvc_pool_set_codebook() for one group of g values: decoded into out. */
static void expect_group(const float *x, uint32_t g, const float *lv, uint32_t bits, float *out) {
  const uint32_t n = 1u << bits;
  float e = 0.0f, a = 0.0f, mid[15];
  for (uint32_t j = 0; j < g; ++j)
    if (fabsf(x[j]) > a) a = fabsf(x[j]), e = x[j];
  for (uint32_t i = 0; i + 1 < n; ++i) mid[i] = (lv[i] + lv[i + 1]) * 0.5f;
  const float inv = e != 0.0f ? 1.0f / e : 0.0f;
  uint32_t code[64];
  double xx = 0.0, cc = 0.0;
  for (uint32_t j = 0; j < g; ++j) {
    const float y = x[j] * inv;
    uint32_t c = 0;
    for (uint32_t i = 0; i + 1 < n; ++i) c += y > mid[i];
    code[j] = c;
    xx += (double)x[j] * x[j];
    cc += (double)lv[c] * lv[c];
  }
  float sc = cc > 0.0 ? (float)sqrt(xx / cc) : 0.0f;
  if (e < 0.0f) sc = -sc;
  for (uint32_t j = 0; j < g; ++j) out[j] = lv[code[j]] * sc;
}

/* Pools of int2 / int3 / int4 codes per token and per group read back
 * exactly the rule's values, per layer's levels; without the codebook the
 * same pool reads back the uniform codes (different values). */
static void test_round_trip(void **state) {
  (void)state;
  static float k[LAYERS][N * ROW], v[LAYERS][N * ROW], got_k[N * ROW], got_v[N * ROW], want[N * ROW];
  const struct {
    kvc_dtype dt;
    uint32_t bits;
    kvc_granularity gran;
    uint32_t group;
  } cases[] = {{KVC_DTYPE_INT4, 4, KVC_SCALE_PER_TOKEN, 0},
               {KVC_DTYPE_INT3, 3, KVC_SCALE_PER_TOKEN, 0},
               {KVC_DTYPE_INT2, 2, KVC_SCALE_PER_TOKEN, 0},
               {KVC_DTYPE_INT3, 3, KVC_SCALE_PER_GROUP, 8},
               {KVC_DTYPE_INT4, 4, KVC_SCALE_PER_GROUP, 32}};
  for (size_t ci = 0; ci < sizeof cases / sizeof cases[0]; ++ci) {
    for (uint32_t l = 0; l < LAYERS; ++l) rows(k[l], N * ROW), rows(v[l], N * ROW);
    const kvc_codec c = int_codec(cases[ci].dt, cases[ci].gran, cases[ci].group);
    const uint32_t bits = cases[ci].bits, nl = 1u << bits;
    const uint32_t g = cases[ci].gran == KVC_SCALE_PER_TOKEN ? HD : cases[ci].group;
    float lv[LAYERS * 16], lv2[LAYERS * 16];
    levels_of(bits, lv);
    for (uint32_t i = 0; i < LAYERS * nl; ++i) lv2[i] = -lv[LAYERS * nl - 1 - i]; /* mirrored */
    kvc_pool *p = pool_of(&c, &c, 0), *plain = pool_of(&c, &c, 0);
    ASSERT_OK(kvc_pool_set_codebook(p, 0, lv, LAYERS * nl));
    ASSERT_OK(kvc_pool_set_codebook(p, 1, lv2, LAYERS * nl));
    fill(p, 1, k, v);
    fill(plain, 1, k, v);
    for (uint32_t l = 0; l < LAYERS; ++l) {
      ASSERT_OK(kvc_gather(p, 1, l, 0, N, got_k, got_v, KVC_DTYPE_F32, NULL));
      for (uint32_t i = 0; i < N * ROW; i += g) expect_group(k[l] + i, g, lv + l * nl, bits, want + i);
      assert_memory_equal(got_k, want, sizeof want);
      for (uint32_t i = 0; i < N * ROW; i += g) expect_group(v[l] + i, g, lv2 + l * nl, bits, want + i);
      assert_memory_equal(got_v, want, sizeof want);
      ASSERT_OK(kvc_gather(plain, 1, l, 0, N, got_k, NULL, KVC_DTYPE_F32, NULL));
      for (uint32_t i = 0; i < N * ROW; i += g) expect_group(k[l] + i, g, lv + l * nl, bits, want + i);
      assert_true(memcmp(got_k, want, sizeof want) != 0);
    }
    kvc_pool_destroy(p);
    kvc_pool_destroy(plain);
  }
}

/* A Hadamard rotation is applied before the codes and undone after; the
 * codebook keeps each rotated group's norm, so a token's row keeps its norm
 * (up to rounding). */
static void test_rotation_keeps_norms(void **state) {
  (void)state;
  static float k[LAYERS][N * ROW], v[LAYERS][N * ROW], got[N * ROW];
  for (uint32_t l = 0; l < LAYERS; ++l) rows(k[l], N * ROW), rows(v[l], N * ROW);
  kvc_codec c = int_codec(KVC_DTYPE_INT3, KVC_SCALE_PER_TOKEN, 0);
  c.rotation = KVC_ROTATION_HADAMARD;
  float lv[LAYERS * 8];
  for (uint32_t l = 0; l < LAYERS; ++l) ASSERT_OK(kvc_codebook_gaussian(3, HD, lv + l * 8));
  kvc_pool *p = pool_of(&c, &c, 0);
  ASSERT_OK(kvc_pool_set_codebook(p, 1, lv, LAYERS * 8));
  fill(p, 1, k, v);
  ASSERT_OK(kvc_gather(p, 1, 1, 0, N, NULL, got, KVC_DTYPE_F32, NULL));
  for (uint32_t t = 0; t < N * HEADS; ++t) {
    double a = 0.0, b = 0.0;
    for (uint32_t e = 0; e < HD; ++e) a += (double)v[1][t * HD + e] * v[1][t * HD + e], b += (double)got[t * HD + e] * got[t * HD + e];
    assert_true(fabs(sqrt(a) - sqrt(b)) <= 1e-5 * sqrt(a));
  }
  kvc_pool_destroy(p);
}

/* Every refusal names its reason and leaves the pool as it was. */
static void test_refusals(void **state) {
  (void)state;
  static float k[LAYERS][N * ROW], v[LAYERS][N * ROW], a[N * ROW], b[N * ROW];
  for (uint32_t l = 0; l < LAYERS; ++l) rows(k[l], N * ROW), rows(v[l], N * ROW);
  const kvc_codec c = int_codec(KVC_DTYPE_INT4, KVC_SCALE_PER_TOKEN, 0);
  float lv[LAYERS * 16], bad[LAYERS * 16];
  levels_of(4, lv);
  kvc_pool *p = pool_of(&c, &c, 0), *ref = pool_of(&c, &c, 0);
  ASSERT_OK(kvc_pool_set_codebook(p, 0, lv, LAYERS * 16));
  ASSERT_OK(kvc_pool_set_codebook(ref, 0, lv, LAYERS * 16));
  ASSERT_STATUS(KVC_ERR_NULL_POINTER, kvc_pool_set_codebook(NULL, 0, lv, LAYERS * 16));
  ASSERT_STATUS(KVC_ERR_NULL_POINTER, kvc_pool_set_codebook(p, 0, NULL, LAYERS * 16));
  ASSERT_STATUS(KVC_ERR_INVALID_ARGUMENT, kvc_pool_set_codebook(p, 2, lv, LAYERS * 16));
  ASSERT_STATUS(KVC_ERR_INVALID_ARGUMENT, kvc_pool_set_codebook(p, 0, lv, LAYERS * 16 - 1));
  ASSERT_STATUS(KVC_ERR_INVALID_ARGUMENT, kvc_pool_set_codebook(p, 0, lv, LAYERS * 8));
  memcpy(bad, lv, sizeof lv);
  bad[16 + 5] = bad[16 + 4]; /* not strictly ascending, layer 1 */
  ASSERT_STATUS(KVC_ERR_INVALID_ARGUMENT, kvc_pool_set_codebook(p, 0, bad, LAYERS * 16));
  assert_non_null(strstr(kvc_last_error_message(), "layer 1, level 5"));
  memcpy(bad, lv, sizeof lv);
  bad[15] = 1.0001f;
  ASSERT_STATUS(KVC_ERR_INVALID_ARGUMENT, kvc_pool_set_codebook(p, 0, bad, LAYERS * 16));
  bad[15] = NAN;
  ASSERT_STATUS(KVC_ERR_INVALID_ARGUMENT, kvc_pool_set_codebook(p, 0, bad, LAYERS * 16));
  bad[15] = 1.0f, bad[0] = -INFINITY;
  ASSERT_STATUS(KVC_ERR_INVALID_ARGUMENT, kvc_pool_set_codebook(p, 0, bad, LAYERS * 16));
  /* Codecs that do not take a codebook. */
  const kvc_codec f16 = {0};
  kvc_codec asym = c, full = c, outl = c, i8 = c, chan = c, tens = c, g12 = c, g64 = c;
  asym.asymmetric = 1;
  full.full_range = 1;
  outl.outliers = 1;
  i8.dtype = KVC_DTYPE_INT8;
  chan.granularity = KVC_SCALE_PER_CHANNEL;
  chan.group_size = 8;
  chan.asymmetric = 1;
  tens.granularity = KVC_SCALE_PER_TENSOR;
  /* Groups that do not tile a token's row of ROW = 32 values (a codebook encodes whole groups). */
  g12.granularity = g64.granularity = KVC_SCALE_PER_GROUP;
  g12.group_size = 12;
  g64.group_size = 64;
  const kvc_codec *no[] = {&asym, &full, &outl, &i8, &chan, &tens, &g12, &g64};
  for (size_t i = 0; i < sizeof no / sizeof no[0]; ++i) {
    kvc_pool *q = pool_of(no[i], no[i], 0);
    ASSERT_STATUS(KVC_ERR_INVALID_ARGUMENT, kvc_pool_set_codebook(q, 1, lv, LAYERS * (no[i] == &i8 ? 256 : 16)));
    kvc_pool_destroy(q);
  }
  (void)f16;
  kvc_pool *plainv = pool_of(&c, NULL, 0); /* values in f16 */
  ASSERT_STATUS(KVC_ERR_INVALID_ARGUMENT, kvc_pool_set_codebook(plainv, 1, lv, LAYERS * 16));
  ASSERT_OK(kvc_pool_set_codebook(plainv, 0, lv, LAYERS * 16));
  kvc_pool_destroy(plainv);
  kvc_pool *hw = pool_of(&c, &c, KVC_POOL_HEADWISE);
  ASSERT_STATUS(KVC_ERR_UNSUPPORTED, kvc_pool_set_codebook(hw, 0, lv, LAYERS * 16));
  kvc_pool_destroy(hw);
  /* The pool kept its first codebook through the refusals. */
  fill(p, 1, k, v);
  fill(ref, 1, k, v);
  ASSERT_OK(kvc_gather(p, 1, 1, 0, N, a, NULL, KVC_DTYPE_F32, NULL));
  ASSERT_OK(kvc_gather(ref, 1, 1, 0, N, b, NULL, KVC_DTYPE_F32, NULL));
  assert_memory_equal(a, b, sizeof a);
  /* Not once it holds a sequence, nor with a prefix cache. */
  ASSERT_STATUS(KVC_ERR_INVALID_ARGUMENT, kvc_pool_set_codebook(p, 0, NULL, 0));
  assert_non_null(strstr(kvc_last_error_message(), "sequences"));
  kvc_pool *pc = pool_of(&c, &c, 0);
  kvc_prefix_config pcfg;
  kvc_prefix_config_init(&pcfg);
  ASSERT_OK(kvc_pool_enable_prefix_cache(pc, &pcfg));
  ASSERT_STATUS(KVC_ERR_INVALID_ARGUMENT, kvc_pool_set_codebook(pc, 0, lv, LAYERS * 16));
  kvc_pool_destroy(pc);
  /* Removed (NULL, 0): the uniform codes again, as a pool that never had one. */
  kvc_pool *r = pool_of(&c, &c, 0), *never = pool_of(&c, &c, 0);
  ASSERT_OK(kvc_pool_set_codebook(r, 0, lv, LAYERS * 16));
  ASSERT_OK(kvc_pool_set_codebook(r, 0, NULL, 0));
  fill(r, 1, k, v);
  fill(never, 1, k, v);
  ASSERT_OK(kvc_gather(r, 1, 0, 0, N, a, NULL, KVC_DTYPE_F32, NULL));
  ASSERT_OK(kvc_gather(never, 1, 0, 0, N, b, NULL, KVC_DTYPE_F32, NULL));
  assert_memory_equal(a, b, sizeof a);
  kvc_pool_destroy(r);
  kvc_pool_destroy(never);
  kvc_pool_destroy(p);
  kvc_pool_destroy(ref);
}

/* Records restore only into pools with the same levels (the fingerprint). */
static void test_records(void **state) {
  (void)state;
  static float k[LAYERS][N * ROW], v[LAYERS][N * ROW], a[N * ROW], b[N * ROW];
  for (uint32_t l = 0; l < LAYERS; ++l) rows(k[l], N * ROW), rows(v[l], N * ROW);
  const kvc_codec c = int_codec(KVC_DTYPE_INT3, KVC_SCALE_PER_TOKEN, 0);
  float lv[LAYERS * 8], other[LAYERS * 8];
  levels_of(3, lv);
  memcpy(other, lv, sizeof lv);
  other[8 + 3] = nextafterf(other[8 + 3], 0.0f); /* one level, one ulp */
  kvc_pool *p = pool_of(&c, &c, 0), *same = pool_of(&c, &c, 0), *diff = pool_of(&c, &c, 0),
           *none = pool_of(&c, &c, 0), *onk = pool_of(&c, &c, 0);
  ASSERT_OK(kvc_pool_set_codebook(p, 1, lv, LAYERS * 8));
  ASSERT_OK(kvc_pool_set_codebook(same, 1, lv, LAYERS * 8));
  ASSERT_OK(kvc_pool_set_codebook(diff, 1, other, LAYERS * 8));
  ASSERT_OK(kvc_pool_set_codebook(onk, 0, lv, LAYERS * 8)); /* the same levels on the keys */
  fill(p, 1, k, v);
  size_t size = 0;
  ASSERT_STATUS(KVC_ERR_BUFFER_TOO_SMALL, kvc_seq_save(p, 1, NULL, 0, &size));
  void *rec = malloc(size);
  ASSERT_OK(kvc_seq_save(p, 1, rec, size, &size));
  ASSERT_STATUS(KVC_ERR_INCOMPATIBLE, kvc_seq_restore(diff, 1, rec, size));
  assert_non_null(strstr(kvc_last_error_message(), "codebooks")); /* the message names them */
  ASSERT_STATUS(KVC_ERR_INCOMPATIBLE, kvc_seq_restore(none, 1, rec, size));
  ASSERT_STATUS(KVC_ERR_INCOMPATIBLE, kvc_seq_restore(onk, 1, rec, size));
  ASSERT_OK(kvc_seq_restore(same, 1, rec, size));
  for (uint32_t l = 0; l < LAYERS; ++l) {
    ASSERT_OK(kvc_gather(p, 1, l, 0, N, NULL, a, KVC_DTYPE_F32, NULL));
    ASSERT_OK(kvc_gather(same, 1, l, 0, N, NULL, b, KVC_DTYPE_F32, NULL));
    assert_memory_equal(a, b, sizeof a);
  }
  /* Forks and truncations move whole slots. */
  ASSERT_OK(kvc_seq_fork(same, 1, 2));
  ASSERT_OK(kvc_seq_truncate(same, 2, 5));
  ASSERT_OK(kvc_gather(same, 2, 1, 0, 5, NULL, b, KVC_DTYPE_F32, NULL));
  assert_memory_equal(a, b, 5 * ROW * sizeof(float));
  free(rec);
  kvc_pool_destroy(p);
  kvc_pool_destroy(same);
  kvc_pool_destroy(diff);
  kvc_pool_destroy(none);
  kvc_pool_destroy(onk);
}

/* Decode attention over codebook keys and values (f16 scales, a rotation)
 * equals a softmax over the gathered rows. */
static void test_attention(void **state) {
  (void)state;
  static float k[LAYERS][N * ROW], v[LAYERS][N * ROW];
  for (uint32_t l = 0; l < LAYERS; ++l) {
    rows(k[l], N * ROW), rows(v[l], N * ROW);
    for (uint32_t i = 0; i < N * ROW; ++i) k[l][i] *= 0.1f;
  }
  kvc_codec c = int_codec(KVC_DTYPE_INT4, KVC_SCALE_PER_TOKEN, 0), vc = c;
  c.scale_dtype = KVC_DTYPE_F16;
  vc.rotation = KVC_ROTATION_HADAMARD;
  float lk[LAYERS * 16], lv[LAYERS * 16];
  levels_of(4, lk);
  for (uint32_t l = 0; l < LAYERS; ++l) ASSERT_OK(kvc_codebook_gaussian(4, HD, lv + l * 16));
  kvc_pool *p = pool_of(&c, &vc, 0);
  ASSERT_OK(kvc_pool_set_codebook(p, 0, lk, LAYERS * 16));
  ASSERT_OK(kvc_pool_set_codebook(p, 1, lv, LAYERS * 16));
  fill(p, 1, k, v);
  float q[2 * HEADS * HD];
  for (int i = 0; i < 2 * HEADS * HD; ++i) q[i] = frand();
  for (uint32_t l = 0; l < LAYERS; ++l) assert_decode_matches_gather_rows(p, 1, l, N, HEADS, HD, q, 1e-5, 1e-5);
  kvc_pool_destroy(p);
}

/* A group whose extreme is subnormal (1 / e overflows f32) gets the codes of
 * the same group scaled into the normal range: its zeros read back near zero
 * (not as the lowest level x the scale) and its values keep their order. */
static void test_subnormal_groups(void **state) {
  (void)state;
  enum { T = 4 };
  static float k[LAYERS][T * ROW], v[LAYERS][T * ROW], tiny[T * ROW], big[T * ROW];
  for (uint32_t l = 0; l < LAYERS; ++l)
    for (uint32_t i = 0; i < T * ROW; ++i) {
      const float x = i % 5 == 0 ? 0.0f : (float)((int)(i % 11) - 5) * 0.125f; /* zeros, ties */
      v[l][i] = x * 0x1p-130f; /* subnormal: |v| <= 5/8 x 2^-130 < 1 / FLT_MAX */
      k[l][i] = x;             /* the same ratios, normal */
    }
  for (uint32_t bits = 2; bits <= 4; ++bits) {
    const kvc_dtype dt = bits == 4 ? KVC_DTYPE_INT4 : bits == 3 ? KVC_DTYPE_INT3 : KVC_DTYPE_INT2;
    const kvc_codec c = int_codec(dt, KVC_SCALE_PER_GROUP, 8);
    float lv[LAYERS * 16];
    levels_of(bits, lv);
    kvc_pool_config cfg = test_config(LAYERS, HEADS, HD, 8, 64);
    cfg.k_codec = &c;
    cfg.v_codec = &c;
    kvc_pool *p = NULL;
    ASSERT_OK(kvc_pool_create(&cfg, &p));
    ASSERT_OK(kvc_pool_set_codebook(p, 0, lv, LAYERS << bits));
    ASSERT_OK(kvc_pool_set_codebook(p, 1, lv, LAYERS << bits));
    ASSERT_OK(kvc_seq_create(p, 1));
    ASSERT_OK(kvc_seq_reserve(p, 1, T, NULL));
    for (uint32_t l = 0; l < LAYERS; ++l) ASSERT_OK(kvc_append(p, 1, l, 0, T, k[l], v[l], KVC_DTYPE_F32));
    for (uint32_t l = 0; l < LAYERS; ++l) {
      ASSERT_OK(kvc_gather(p, 1, l, 0, T, big, tiny, KVC_DTYPE_F32, NULL));
      for (uint32_t i = 0; i < T * ROW; ++i) /* the same codes: tiny x 2^130 = big up to subnormal rounding */
        assert_true(fabs((double)tiny[i] * 0x1p130 - big[i]) <= 1e-4 * 0.625);
    }
    kvc_pool_destroy(p);
  }
}

/* Levels one ulp apart (at +-1): each value equal to a level gets that
 * level's code (the f32 midpoint of 1 - 2^-24 and 1 rounds to 1). */
static void test_ulp_levels(void **state) {
  (void)state;
  static float k[LAYERS][ROW], v[LAYERS][ROW], got[ROW];
  const float top = nextafterf(1.0f, 0.0f), bot = nextafterf(-1.0f, 0.0f);
  const float lv[LAYERS * 4] = {-1.0f, bot, top, 1.0f, -1.0f, -0.5f, top, 1.0f};
  for (uint32_t l = 0; l < LAYERS; ++l)
    for (uint32_t i = 0; i < ROW; ++i) k[l][i] = v[l][i] = i % HD == 0 ? 1.0f : i % HD == 1 ? top : -1.0f;
  const kvc_codec c = int_codec(KVC_DTYPE_INT2, KVC_SCALE_PER_TOKEN, 0);
  kvc_pool *p = pool_of(&c, &c, 0);
  ASSERT_OK(kvc_pool_set_codebook(p, 1, lv, LAYERS * 4));
  ASSERT_OK(kvc_seq_create(p, 1));
  ASSERT_OK(kvc_seq_reserve(p, 1, 1, NULL));
  for (uint32_t l = 0; l < LAYERS; ++l) ASSERT_OK(kvc_append(p, 1, l, 0, 1, k[l], v[l], KVC_DTYPE_F32));
  for (uint32_t l = 0; l < LAYERS; ++l) {
    ASSERT_OK(kvc_gather(p, 1, l, 0, 1, NULL, got, KVC_DTYPE_F32, NULL));
    /* Every value is a level: the codes are exact and the scale is 1. */
    for (uint32_t i = 0; i < ROW; ++i) assert_true(got[i] == v[l][i]);
  }
  kvc_pool_destroy(p);
}

/* The built-in levels: ascending in [-1, 1], the nearest power-of-two table,
 * refusals; on Gaussian rows they lose less than the uniform symmetric codes
 * of the same bits. */
static void test_gaussian(void **state) {
  (void)state;
  float a[16], b[16];
  for (uint32_t bits = 2; bits <= 4; ++bits) {
    ASSERT_OK(kvc_codebook_gaussian(bits, 64, a));
    for (uint32_t i = 0; i < (1u << bits); ++i) {
      assert_true(a[i] >= -1.0f && a[i] <= 1.0f);
      if (i) assert_true(a[i] > a[i - 1]);
    }
    ASSERT_OK(kvc_codebook_gaussian(bits, 88, b)); /* nearer 64 than 128 by the logarithm */
    assert_memory_equal(a, b, sizeof(float) << bits);
    ASSERT_OK(kvc_codebook_gaussian(bits, 96, b)); /* nearer 128 */
    assert_true(memcmp(a, b, sizeof(float) << bits) != 0);
    ASSERT_OK(kvc_codebook_gaussian(bits, 1, a));
    ASSERT_OK(kvc_codebook_gaussian(bits, 8, b));
    assert_memory_equal(a, b, sizeof(float) << bits);
    ASSERT_OK(kvc_codebook_gaussian(bits, UINT64_MAX, a));
    ASSERT_OK(kvc_codebook_gaussian(bits, 1024, b));
    assert_memory_equal(a, b, sizeof(float) << bits);
  }
  ASSERT_STATUS(KVC_ERR_NULL_POINTER, kvc_codebook_gaussian(3, 64, NULL));
  ASSERT_STATUS(KVC_ERR_INVALID_ARGUMENT, kvc_codebook_gaussian(1, 64, a));
  ASSERT_STATUS(KVC_ERR_INVALID_ARGUMENT, kvc_codebook_gaussian(5, 64, a));
  ASSERT_STATUS(KVC_ERR_INVALID_ARGUMENT, kvc_codebook_gaussian(3, 0, a));
  /* Gaussian rows: the codebook's squared error under the uniform codes'. */
  static float k[LAYERS][N * ROW], v[LAYERS][N * ROW], gc[N * ROW], gu[N * ROW];
  for (uint32_t bits = 2; bits <= 4; ++bits) {
    for (uint32_t l = 0; l < LAYERS; ++l)
      for (uint32_t i = 0; i < N * ROW; ++i) k[l][i] = gauss(), v[l][i] = gauss();
    const kvc_codec c = int_codec(bits == 4 ? KVC_DTYPE_INT4 : bits == 3 ? KVC_DTYPE_INT3 : KVC_DTYPE_INT2,
                                  KVC_SCALE_PER_TOKEN, 0);
    float lv[LAYERS * 16];
    for (uint32_t l = 0; l < LAYERS; ++l) ASSERT_OK(kvc_codebook_gaussian(bits, HD, lv + l * (1u << bits)));
    kvc_pool *p = pool_of(&c, &c, 0), *u = pool_of(&c, &c, 0);
    ASSERT_OK(kvc_pool_set_codebook(p, 1, lv, LAYERS << bits));
    fill(p, 1, k, v);
    fill(u, 1, k, v);
    double ec = 0.0, eu = 0.0;
    for (uint32_t l = 0; l < LAYERS; ++l) {
      ASSERT_OK(kvc_gather(p, 1, l, 0, N, NULL, gc, KVC_DTYPE_F32, NULL));
      ASSERT_OK(kvc_gather(u, 1, l, 0, N, NULL, gu, KVC_DTYPE_F32, NULL));
      for (uint32_t i = 0; i < N * ROW; ++i)
        ec += (gc[i] - v[l][i]) * (double)(gc[i] - v[l][i]), eu += (gu[i] - v[l][i]) * (double)(gu[i] - v[l][i]);
    }
    assert_true(ec < 0.9 * eu);
    kvc_pool_destroy(p);
    kvc_pool_destroy(u);
  }
}

int main(int argc, char **argv) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_round_trip),   cmocka_unit_test(test_rotation_keeps_norms),
      cmocka_unit_test(test_refusals),     cmocka_unit_test(test_records),
      cmocka_unit_test(test_attention),    cmocka_unit_test(test_gaussian),
      cmocka_unit_test(test_subnormal_groups),
      cmocka_unit_test(test_ulp_levels),
  };
  return run_named_tests("codec_codebook", tests, sizeof tests / sizeof tests[0], argc, argv);
}
