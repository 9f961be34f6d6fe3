/* codec_api_*: quantized pools and the standalone quantizer through the C API,
 * including the cases reported against other KV systems. */
#include "../blackbox.h"

#include <math.h>
#include <stdio.h>

static kvc_codec codec_of(kvc_dtype dt, kvc_granularity g, uint32_t group, int asym) {
  kvc_codec c;
  kvc_codec_init(&c);
  c.dtype = dt;
  c.granularity = g;
  c.group_size = group;
  c.asymmetric = (uint32_t)asym;
  return c;
}

static kvc_pool *codec_pool(uint32_t layers, uint32_t heads, uint32_t hd, uint32_t bs,
                            uint64_t blocks, const kvc_codec *k, const kvc_codec *v,
                            kvc_status expect) {
  kvc_pool_config c = test_config(layers, heads, hd, bs, blocks);
  c.k_codec = k;
  c.v_codec = v;
  kvc_pool *p = NULL;
  ASSERT_STATUS(expect, kvc_pool_create(&c, &p));
  return p;
}

static uint32_t lcg = 12345;
static float frand(void) { /* uniform in [-1, 1) */
  lcg = lcg * 1664525u + 1013904223u;
  return (float)(lcg >> 8) / (float)(1u << 23) - 1.0f;
}

/* int8 with an fp32 scale per (token, KV head), block_size 16, one KV head:
 * 16 x (256 + 4) = 4160 bytes of K per block at head_dim 256 and 8256 at 512,
 * as the layout query reports; distinct data reads back exactly; payload and
 * scale regions of neighbouring blocks never overlap. */
static void test_int8_block_bytes(void **state) {
  (void)state;
  const uint32_t dims[2] = {256, 512};
  const uint64_t expect[2] = {4160, 8256};
  for (int i = 0; i < 2; ++i) {
    const uint32_t hd = dims[i];
    kvc_codec k = codec_of(KVC_DTYPE_INT8, KVC_SCALE_PER_TOKEN, 0, 0);
    kvc_pool *p = codec_pool(1, 1, hd, 16, 4, &k, &k, KVC_OK);
    kvc_pool_layout l;
    kvc_pool_layout_init(&l);
    ASSERT_OK(kvc_pool_get_layout(p, &l));
    assert_int_equal(l.k_bytes, expect[i]);
    assert_int_equal(l.v_bytes, expect[i]);
    assert_int_equal(l.k_codes_bytes, 16 * hd);
    assert_int_equal(l.k_scales_per_token, 1);
    assert_int_equal(l.k_scale_dtype, KVC_DTYPE_F32);
    assert_int_equal(l.k_dtype, KVC_DTYPE_INT8);
    /* Regions: [K codes][K scales][V codes][V scales], none overlapping,
     * and the block stride covers both parts. */
    assert_int_equal(l.k_offset, 0);
    assert_int_equal(l.k_scale_offset, l.k_codes_bytes);
    assert_true(l.k_scale_offset + 16 * 4 <= l.v_offset);
    assert_int_equal(l.v_scale_offset, l.v_offset + l.v_codes_bytes);
    assert_true(l.v_scale_offset + 16 * 4 <= l.block_stride);
    assert_int_equal(l.block_stride, 2 * expect[i]);
    kvc_stats s = get_stats(p);
    assert_int_equal(s.bytes_per_block, 2 * expect[i]);
    assert_int_equal(s.bytes_per_token, 2 * expect[i] / 16);
    /* Three blocks of distinct integer data (scale 1 per row: exact). */
    ASSERT_OK(kvc_seq_create(p, 1));
    const uint64_t n = 40;
    ASSERT_OK(kvc_seq_reserve(p, 1, n, NULL));
    float *kin = malloc(sizeof(float) * n * hd), *vin = malloc(sizeof(float) * n * hd);
    float *kout = malloc(sizeof(float) * n * hd), *vout = malloc(sizeof(float) * n * hd);
    for (uint64_t t = 0; t < n; ++t)
      for (uint32_t e = 0; e < hd; ++e) {
        kin[t * hd + e] = (float)((int)((t * 7 + e * 3) % 255) - 127);
        vin[t * hd + e] = (float)((int)((t * 5 + e * 11) % 255) - 127);
      }
    for (uint64_t t = 0; t < n; ++t) kin[t * hd] = vin[t * hd] = 127.0f; /* absmax 127 */
    ASSERT_OK(kvc_append(p, 1, 0, 0, n, kin, vin, KVC_DTYPE_F32));
    ASSERT_OK(kvc_gather(p, 1, 0, 0, n, kout, vout, KVC_DTYPE_F32, NULL));
    assert_memory_equal(kin, kout, sizeof(float) * n * hd);
    assert_memory_equal(vin, vout, sizeof(float) * n * hd);
    free(kin);
    free(vin);
    free(kout);
    free(vout);
    kvc_pool_destroy(p);
  }
}

/* int3: eight codes in three bytes. Symmetric per-token f32 scales, block
 * size 16, two KV heads of 64: 16 x (2 x 24 + 2 x 4) = 896 bytes per part;
 * head_dim 12 (36 bits) is refused, head_dim 8 and 96 work; integer data
 * within [-3, 3] per head (scale 1) reads back exactly; CUDA pools refuse
 * int3 (or CUDA is absent). */
static void test_int3_pool(void **state) {
  (void)state;
  kvc_codec k = codec_of(KVC_DTYPE_INT3, KVC_SCALE_PER_TOKEN, 0, 0);
  kvc_pool *p = codec_pool(1, 2, 64, 16, 4, &k, &k, KVC_OK);
  kvc_pool_layout l;
  kvc_pool_layout_init(&l);
  ASSERT_OK(kvc_pool_get_layout(p, &l));
  assert_int_equal(l.k_dtype, KVC_DTYPE_INT3);
  assert_int_equal(l.k_codes_bytes, 16 * 2 * 24);
  assert_int_equal(l.k_bytes, 16 * (2 * 24 + 2 * 4));
  assert_int_equal(l.v_bytes, 16 * (2 * 24 + 2 * 4));
  kvc_stats st = get_stats(p);
  assert_int_equal(st.bytes_per_block, 2 * 896);
  ASSERT_OK(kvc_seq_create(p, 1));
  const uint64_t n = 37, row = 128;
  ASSERT_OK(kvc_seq_reserve(p, 1, n, NULL));
  float *kin = malloc(sizeof(float) * n * row), *vin = malloc(sizeof(float) * n * row);
  float *kout = malloc(sizeof(float) * n * row), *vout = malloc(sizeof(float) * n * row);
  for (uint64_t t = 0; t < n; ++t)
    for (uint64_t e = 0; e < row; ++e) {
      kin[t * row + e] = (float)((int)((t * 7 + e * 3) % 7) - 3);
      vin[t * row + e] = (float)((int)((t * 5 + e * 11) % 7) - 3);
    }
  for (uint64_t t = 0; t < n; ++t) kin[t * row] = kin[t * row + 64] = vin[t * row] = vin[t * row + 64] = 3.0f;
  ASSERT_OK(kvc_append(p, 1, 0, 0, n, kin, vin, KVC_DTYPE_F32));
  ASSERT_OK(kvc_gather(p, 1, 0, 0, n, kout, vout, KVC_DTYPE_F32, NULL));
  assert_memory_equal(kin, kout, sizeof(float) * n * row);
  assert_memory_equal(vin, vout, sizeof(float) * n * row);
  free(kin);
  free(vin);
  free(kout);
  free(vout);
  kvc_pool_destroy(p);
  assert_null(codec_pool(1, 2, 12, 16, 4, &k, &k, KVC_ERR_INVALID_ARGUMENT)); /* 12 x 3 bits */
  assert_non_null(strstr(kvc_last_error_message(), "k_codec"));
  for (int i = 0; i < 2; ++i) {
    p = codec_pool(1, 2, i ? 96 : 8, 16, 4, &k, &k, KVC_OK);
    kvc_pool_destroy(p);
  }
  kvc_pool_config c = test_config(1, 2, 64, 16, 4);
  c.k_codec = &k;
  c.device = KVC_DEVICE_CUDA;
  kvc_pool *cp = NULL;
  const kvc_status cs = kvc_pool_create(&c, &cp);
  assert_true(cs == KVC_ERR_UNSUPPORTED || cs == KVC_ERR_DEVICE_UNAVAILABLE);
  assert_null(cp);
  if (cs == KVC_ERR_UNSUPPORTED) assert_non_null(strstr(kvc_last_error_message(), "int3"));
}

/* Static scales of 1e-50, 1e300, NaN, 0 or -1 are refused with an
 * invalid-scale status (pool and standalone); 0.5 is accepted and round-trips
 * within half a step. */
static void test_static_scales(void **state) {
  (void)state;
  const double bad[5] = {1e-50, 1e300, NAN, 0.0, -1.0};
  const kvc_dtype dts[3] = {KVC_DTYPE_INT8, KVC_DTYPE_FP8_E4M3, KVC_DTYPE_FP8_E5M2};
  for (int d = 0; d < 3; ++d) {
    kvc_codec k = codec_of(dts[d], KVC_SCALE_PER_TENSOR, 0, 0);
    k.static_scale = 1;
    for (int i = 0; i < 5; ++i) {
      k.scale = bad[i];
      kvc_pool *p = codec_pool(1, 2, 8, 4, 4, &k, NULL, KVC_ERR_INVALID_SCALE);
      assert_null(p);
      kvc_quant_sizes qs;
      kvc_quant_sizes_init(&qs);
      ASSERT_STATUS(KVC_ERR_INVALID_SCALE, kvc_quantize_sizes(&k, 4, 8, &qs));
      float x[8] = {0};
      uint8_t codes[8];
      ASSERT_STATUS(KVC_ERR_INVALID_SCALE, kvc_quantize(&k, x, KVC_DTYPE_F32, 1, 8, codes, NULL, NULL));
    }
    k.scale = 0.5;
    kvc_pool *p = codec_pool(1, 2, 8, 4, 4, &k, &k, KVC_OK);
    ASSERT_OK(kvc_seq_create(p, 1));
    ASSERT_OK(kvc_seq_reserve(p, 1, 3, NULL));
    float in[3 * 16], out[3 * 16];
    for (int i = 0; i < 48; ++i) in[i] = 20.0f * frand();
    ASSERT_OK(kvc_append(p, 1, 0, 0, 3, in, in, KVC_DTYPE_F32));
    ASSERT_OK(kvc_gather(p, 1, 0, 0, 3, out, NULL, KVC_DTYPE_F32, NULL));
    for (int i = 0; i < 48; ++i) {
      if (dts[d] == KVC_DTYPE_INT8) assert_true(fabsf(out[i] - in[i]) <= 0.25f);
      else assert_true(fabsf(out[i] - in[i]) <= fabsf(in[i]) * 0.125f + 0.5f * 0.002f);
    }
    float ks = 0, vs = 0;
    ASSERT_OK(kvc_pool_tensor_scales(p, 0, &ks, &vs));
    assert_float_equal(ks, 0.5f, 0.0f);
    kvc_pool_destroy(p);
  }
}

/* fp8 e4m3 with scale 1: 500 and -1000 are stored as +448 and -448, never
 * NaN or Inf. */
static void test_fp8_saturates(void **state) {
  (void)state;
  kvc_codec k = codec_of(KVC_DTYPE_FP8_E4M3, KVC_SCALE_PER_TENSOR, 0, 0);
  k.static_scale = 1;
  k.scale = 1.0;
  kvc_pool *p = codec_pool(1, 1, 4, 4, 4, &k, &k, KVC_OK);
  ASSERT_OK(kvc_seq_create(p, 1));
  ASSERT_OK(kvc_seq_reserve(p, 1, 1, NULL));
  const float in[4] = {500.0f, -1000.0f, 1.0f, 0.0f};
  float out[4];
  ASSERT_OK(kvc_append(p, 1, 0, 0, 1, in, in, KVC_DTYPE_F32));
  ASSERT_OK(kvc_gather(p, 1, 0, 0, 1, out, NULL, KVC_DTYPE_F32, NULL));
  assert_float_equal(out[0], 448.0f, 0.0f);
  assert_float_equal(out[1], -448.0f, 0.0f);
  assert_float_equal(out[2], 1.0f, 0.0f);
  assert_float_equal(out[3], 0.0f, 0.0f);
  kvc_pool_destroy(p);
}

/* int8 with dynamic per-token scales: an all-zero token reads back as zeros. */
static void test_int8_zero_token(void **state) {
  (void)state;
  kvc_codec k = codec_of(KVC_DTYPE_INT8, KVC_SCALE_PER_TOKEN, 0, 0);
  kvc_pool *p = codec_pool(1, 2, 8, 4, 4, &k, &k, KVC_OK);
  ASSERT_OK(kvc_seq_create(p, 1));
  ASSERT_OK(kvc_seq_reserve(p, 1, 3, NULL));
  float in[3 * 16], out[3 * 16];
  for (int i = 0; i < 48; ++i) in[i] = i >= 16 && i < 32 ? 0.0f : frand();
  ASSERT_OK(kvc_append(p, 1, 0, 0, 3, in, in, KVC_DTYPE_F32));
  ASSERT_OK(kvc_gather(p, 1, 0, 0, 3, out, NULL, KVC_DTYPE_F32, NULL));
  for (int i = 16; i < 32; ++i) assert_true(out[i] == 0.0f && !signbit(out[i]) == !signbit(in[i]));
  for (int i = 0; i < 48; ++i) assert_true(isfinite(out[i]));
  kvc_pool_destroy(p);
}

/* int4 at head_dim 96 with group scales: values all in [5, 6] come back
 * within (6 - 5) / 15 / 2, the group range taken over real values only. */
static void test_int4_hd96_groups(void **state) {
  (void)state;
  const uint32_t groups[3] = {32, 64, 96};
  for (int g = 0; g < 3; ++g) {
    kvc_codec k = codec_of(KVC_DTYPE_INT4, KVC_SCALE_PER_GROUP, groups[g], 1);
    kvc_pool *p = codec_pool(1, 1, 96, 16, 4, &k, &k, KVC_OK);
    ASSERT_OK(kvc_seq_create(p, 1));
    ASSERT_OK(kvc_seq_reserve(p, 1, 5, NULL));
    float in[5 * 96], out[5 * 96];
    for (int i = 0; i < 5 * 96; ++i) in[i] = 5.5f + 0.5f * frand();
    in[0] = 5.0f;
    in[1] = 6.0f;
    ASSERT_OK(kvc_append(p, 1, 0, 0, 5, in, in, KVC_DTYPE_F32));
    ASSERT_OK(kvc_gather(p, 1, 0, 0, 5, out, NULL, KVC_DTYPE_F32, NULL));
    for (int i = 0; i < 5 * 96; ++i) assert_true(fabsf(out[i] - in[i]) <= (6.0f - 5.0f) / 15.0f / 2.0f * 1.0001f);
    kvc_pool_destroy(p);
  }
}

/* NaN or Inf in the input is rejected and nothing is written. */
static void test_nonfinite_append(void **state) {
  (void)state;
  kvc_codec k = codec_of(KVC_DTYPE_INT4, KVC_SCALE_PER_GROUP, 8, 0);
  kvc_pool *p = codec_pool(1, 2, 8, 4, 4, &k, &k, KVC_OK);
  ASSERT_OK(kvc_seq_create(p, 1));
  ASSERT_OK(kvc_seq_reserve(p, 1, 4, NULL));
  float in[4 * 16], before[4 * 16], after[4 * 16];
  for (int i = 0; i < 64; ++i) in[i] = frand();
  ASSERT_OK(kvc_append(p, 1, 0, 0, 4, in, in, KVC_DTYPE_F32));
  ASSERT_OK(kvc_gather(p, 1, 0, 0, 4, before, NULL, KVC_DTYPE_F32, NULL));
  float bad[4 * 16];
  for (int i = 0; i < 64; ++i) bad[i] = 3.0f;
  bad[50] = NAN;
  ASSERT_STATUS(KVC_ERR_NON_FINITE, kvc_append(p, 1, 0, 0, 4, in, bad, KVC_DTYPE_F32));
  /* named by its indices in [n_tokens][num_kv_heads][head_dim]: 50 = 3 x 16 + 0 x 8 + 2 */
  assert_non_null(strstr(kvc_last_error_message(), "v[3][0][2] is NaN"));
  bad[50] = INFINITY;
  ASSERT_STATUS(KVC_ERR_NON_FINITE, kvc_append(p, 1, 0, 0, 4, bad, in, KVC_DTYPE_F32));
  assert_non_null(strstr(kvc_last_error_message(), "k[3][0][2] is Inf"));
  ASSERT_OK(kvc_gather(p, 1, 0, 0, 4, after, NULL, KVC_DTYPE_F32, NULL));
  assert_memory_equal(before, after, sizeof before);
  kvc_pool_destroy(p);
}

/* Every codec family at head_dim 8, 64, 96, 128 and 256: append, gather, fork
 * and CoW work; stats report the layout's bytes. */
static void test_all_codecs_roundtrip(void **state) {
  (void)state;
  const uint32_t dims[5] = {8, 64, 96, 128, 256};
  const kvc_dtype dts[6] = {KVC_DTYPE_INT8, KVC_DTYPE_INT4, KVC_DTYPE_INT2, KVC_DTYPE_FP8_E4M3,
                            KVC_DTYPE_FP8_E5M2, KVC_DTYPE_INT3};
  const kvc_granularity grans[3] = {KVC_SCALE_PER_TENSOR, KVC_SCALE_PER_TOKEN, KVC_SCALE_PER_GROUP};
  for (int di = 0; di < 5; ++di)
    for (int ti = 0; ti < 6; ++ti)
      for (int gi = 0; gi < 3; ++gi)
        for (int rot = 0; rot < 2; ++rot) {
          const uint32_t hd = dims[di], H = 2, row = H * hd;
          kvc_codec k = codec_of(dts[ti], grans[gi], 32, dts[ti] == KVC_DTYPE_INT2 && gi != 0);
          k.rotation = rot ? KVC_ROTATION_HADAMARD : KVC_ROTATION_NONE;
          k.scale_dtype = gi == 2 ? KVC_DTYPE_F16 : KVC_DTYPE_F32;
          kvc_pool *p = codec_pool(2, H, hd, 16, 16, &k, &k, KVC_OK);
          kvc_pool_layout l;
          kvc_pool_layout_init(&l);
          ASSERT_OK(kvc_pool_get_layout(p, &l));
          kvc_stats st = get_stats(p);
          assert_int_equal(st.bytes_per_block, l.block_stride);
          ASSERT_OK(kvc_seq_create(p, 1));
          const uint64_t n = 21;
          ASSERT_OK(kvc_seq_reserve(p, 1, n, NULL));
          float *in = malloc(sizeof(float) * n * row), *out = malloc(sizeof(float) * n * row);
          for (uint64_t i = 0; i < n * row; ++i) in[i] = frand();
          for (uint32_t layer = 0; layer < 2; ++layer)
            ASSERT_OK(kvc_append(p, 1, layer, 0, n, in, in, KVC_DTYPE_F32));
          ASSERT_OK(kvc_seq_fork(p, 1, 2));
          ASSERT_OK(kvc_seq_reserve(p, 2, 1, NULL)); /* CoW of the partly filled block */
          ASSERT_OK(kvc_append(p, 2, 1, n, 1, in, in, KVC_DTYPE_F32));
          ASSERT_OK(kvc_gather(p, 2, 1, 0, n, out, NULL, KVC_DTYPE_F32, NULL));
          double err = 0, norm = 0;
          for (uint64_t i = 0; i < n * row; ++i) {
            err += (out[i] - in[i]) * (out[i] - in[i]);
            norm += in[i] * in[i];
          }
          const double rel = sqrt(err / norm);
          const double limit = dts[ti] == KVC_DTYPE_INT2   ? (gi == 0 ? 1.01 : 0.85)
                               : dts[ti] == KVC_DTYPE_INT3 ? (gi == 0 ? 0.5 : 0.4)
                               : dts[ti] == KVC_DTYPE_INT4 ? 0.2
                                                           : 0.08;
          if (!(rel < limit)) {
            print_error("hd %u dtype %d gran %d rot %d: relative error %g\n", hd, dts[ti], grans[gi], rot, rel);
            fail();
          }
          free(in);
          free(out);
          kvc_pool_destroy(p);
        }
}

static void test_standalone_quantizer(void **state) {
  (void)state;
  kvc_codec c = codec_of(KVC_DTYPE_INT4, KVC_SCALE_PER_GROUP, 32, 1);
  c.scale_dtype = KVC_DTYPE_F16;
  kvc_quant_sizes qs;
  kvc_quant_sizes_init(&qs);
  ASSERT_OK(kvc_quantize_sizes(&c, 10, 96, &qs));
  assert_int_equal(qs.codes_bytes, 10 * 48);
  assert_int_equal(qs.num_scales, 10 * 3);
  assert_int_equal(qs.scales_bytes, 10 * 3 * 2);
  assert_int_equal(qs.zeros_bytes, 10 * 3 * 2);
  c.granularity = KVC_SCALE_PER_CHANNEL;
  c.group_size = 4;
  ASSERT_OK(kvc_quantize_sizes(&c, 10, 96, &qs));
  assert_int_equal(qs.num_scales, 3 * 96);
  /* Round trip through f16 input and bf16 output. */
  float x[10 * 96];
  uint16_t xh[10 * 96], yb[10 * 96];
  for (int i = 0; i < 960; ++i) x[i] = 3.0f * frand();
  ASSERT_OK(kvc_convert(x, KVC_DTYPE_F32, xh, KVC_DTYPE_F16, 960));
  uint8_t codes[480], scales[3 * 96 * 2], zeros[3 * 96 * 2];
  ASSERT_OK(kvc_quantize(&c, xh, KVC_DTYPE_F16, 10, 96, codes, scales, zeros));
  ASSERT_OK(kvc_dequantize(&c, codes, scales, zeros, 10, 96, yb, KVC_DTYPE_BF16));
  float y[960];
  ASSERT_OK(kvc_convert(yb, KVC_DTYPE_BF16, y, KVC_DTYPE_F32, 960));
  for (int i = 0; i < 960; ++i) assert_true(fabsf(y[i] - x[i]) < 6.0f / 15.0f);
  /* Errors. */
  ASSERT_STATUS(KVC_ERR_NULL_POINTER, kvc_quantize_sizes(NULL, 1, 8, &qs));
  ASSERT_STATUS(KVC_ERR_NULL_POINTER, kvc_quantize_sizes(&c, 1, 8, NULL));
  ASSERT_STATUS(KVC_ERR_INVALID_ARGUMENT, kvc_quantize_sizes(&c, 1, 0, &qs));
  ASSERT_STATUS(KVC_ERR_NULL_POINTER, kvc_quantize(&c, x, KVC_DTYPE_F32, 10, 96, codes, NULL, zeros));
  ASSERT_STATUS(KVC_ERR_NULL_POINTER, kvc_quantize(&c, x, KVC_DTYPE_F32, 10, 96, codes, scales, NULL));
  ASSERT_STATUS(KVC_ERR_INVALID_ARGUMENT, kvc_quantize(&c, x, KVC_DTYPE_INT8, 10, 96, codes, scales, zeros));
  kvc_codec bad = c;
  bad.dtype = (kvc_dtype)9;
  ASSERT_STATUS(KVC_ERR_INVALID_ARGUMENT, kvc_quantize_sizes(&bad, 1, 8, &qs));
  bad = c;
  bad.granularity = KVC_SCALE_NONE;
  ASSERT_STATUS(KVC_ERR_INVALID_ARGUMENT, kvc_quantize_sizes(&bad, 1, 8, &qs));
  bad = c;
  bad.group_size = 0;
  ASSERT_STATUS(KVC_ERR_INVALID_ARGUMENT, kvc_quantize_sizes(&bad, 1, 8, &qs));
  bad = c;
  bad.rotation = KVC_ROTATION_HADAMARD;
  bad.rotation_block = 64;
  ASSERT_STATUS(KVC_ERR_INVALID_ARGUMENT, kvc_quantize_sizes(&bad, 1, 96, &qs));
  bad.rotation_block = 3;
  ASSERT_STATUS(KVC_ERR_INVALID_ARGUMENT, kvc_quantize_sizes(&bad, 1, 96, &qs));
  bad = c;
  bad.struct_size = 8;
  ASSERT_STATUS(KVC_ERR_STRUCT_SIZE, kvc_quantize_sizes(&bad, 1, 8, &qs));
  x[5] = NAN;
  memset(codes, 0x5a, sizeof codes);
  ASSERT_STATUS(KVC_ERR_NON_FINITE, kvc_quantize(&c, x, KVC_DTYPE_F32, 10, 96, codes, scales, zeros));
  assert_non_null(strstr(kvc_last_error_message(), "input[0][5] is NaN"));
  for (size_t i = 0; i < sizeof codes; ++i) assert_int_equal(codes[i], 0x5a);
  /* Float codecs have no scales. */
  kvc_codec f = codec_of(KVC_DTYPE_F16, KVC_SCALE_NONE, 0, 0);
  ASSERT_OK(kvc_quantize_sizes(&f, 3, 8, &qs));
  assert_int_equal(qs.codes_bytes, 48);
  assert_int_equal(qs.scales_bytes, 0);
}


/* Full range (kvc_codec.full_range, llama.cpp q4_0's rule): the hand-computed
 * int4 codes through kvc_quantize, a pool storing them, the refusals (asym,
 * fp8, static scale, a value of 2, a CUDA pool), and a caller built against
 * 0.2 (struct_size 48, no full_range field) still getting [-7, 7] codes. */
static void test_full_range(void **state) {
  (void)state;
  kvc_codec c = codec_of(KVC_DTYPE_INT4, KVC_SCALE_PER_TOKEN, 0, 0);
  c.full_range = 1;
  const float x[8] = {6.0f, -5.0f, 1.0f, -6.0f, 0.375f, 3.0f, -0.75f, 2.25f};
  uint8_t codes[4];
  float scale = 0, y[8];
  ASSERT_OK(kvc_quantize(&c, x, KVC_DTYPE_F32, 1, 8, codes, &scale, NULL));
  assert_true(scale == -0.75f);
  /* q = {-8, 7, -1, 7, 0, -4, 1, -3}, stored q + 8, low nibble first. */
  assert_int_equal(codes[0], 0 | (15 << 4));
  assert_int_equal(codes[1], 7 | (15 << 4));
  assert_int_equal(codes[2], 8 | (4 << 4));
  assert_int_equal(codes[3], 9 | (5 << 4));
  ASSERT_OK(kvc_dequantize(&c, codes, &scale, NULL, 1, 8, y, KVC_DTYPE_F32));
  assert_true(y[0] == 6.0f && y[1] == -5.25f && y[3] == -5.25f && y[5] == 3.0f);
  /* 0.2's struct: full_range is not read, codes are symmetric [-7, 7]. */
  kvc_codec old = c;
  old.struct_size = offsetof(kvc_codec, full_range);
  ASSERT_OK(kvc_quantize(&old, x, KVC_DTYPE_F32, 1, 8, codes, &scale, NULL));
  assert_true(scale == 6.0f / 7.0f);
  /* A pool stores the same bytes and reads them back. */
  kvc_codec k = codec_of(KVC_DTYPE_INT4, KVC_SCALE_PER_GROUP, 32, 0);
  k.full_range = 1;
  k.rotation = KVC_ROTATION_HADAMARD;
  kvc_pool *p = codec_pool(1, 2, 64, 16, 4, &k, &k, KVC_OK);
  float kv[2 * 64], back[2 * 64];
  for (int i = 0; i < 128; ++i) kv[i] = 2.0f * frand();
  ASSERT_OK(kvc_seq_create(p, 1));
  ASSERT_OK(kvc_seq_reserve(p, 1, 1, NULL));
  ASSERT_OK(kvc_append(p, 1, 0, 0, 1, kv, kv, KVC_DTYPE_F32));
  ASSERT_OK(kvc_gather(p, 1, 0, 0, 1, back, NULL, KVC_DTYPE_F32, NULL));
  float err = 0;
  for (int i = 0; i < 128; ++i) err += (back[i] - kv[i]) * (back[i] - kv[i]);
  /* Rotated groups of 32 with a step of at most max|x| x sqrt(64) / 8 / 8:
   * the squared error of 128 values stays well below 128 x (2 x 8 / 64)^2 / 12 x 4. */
  assert_true(err > 0.0f && err < 128.0f * 0.0625f * 4.0f / 12.0f);
  kvc_pool_destroy(p);
  /* Refusals. */
  kvc_quant_sizes qs;
  kvc_quant_sizes_init(&qs);
  kvc_codec bad = c;
  bad.asymmetric = 1;
  ASSERT_STATUS(KVC_ERR_INVALID_ARGUMENT, kvc_quantize_sizes(&bad, 1, 8, &qs));
  assert_non_null(strstr(kvc_last_error_message(), "full_range"));
  bad = c;
  bad.dtype = KVC_DTYPE_FP8_E4M3;
  ASSERT_STATUS(KVC_ERR_INVALID_ARGUMENT, kvc_quantize_sizes(&bad, 1, 8, &qs));
  bad = c;
  bad.granularity = KVC_SCALE_PER_TENSOR;
  bad.static_scale = 1;
  bad.scale = 0.5;
  ASSERT_STATUS(KVC_ERR_INVALID_ARGUMENT, kvc_quantize_sizes(&bad, 1, 8, &qs));
  bad = c;
  bad.full_range = 2;
  ASSERT_STATUS(KVC_ERR_INVALID_ARGUMENT, kvc_quantize_sizes(&bad, 1, 8, &qs));
  /* A CUDA pool: KVC_ERR_UNSUPPORTED naming full_range, except in a build
   * without the CUDA backend, where every CUDA pool is KVC_ERR_DEVICE_UNAVAILABLE
   * (KVC_DEVICE_CUDA's documentation; a plain CUDA pool shows which build this is). */
  kvc_pool_config cfg = test_config(1, 2, 64, 16, 4);
  cfg.device = KVC_DEVICE_CUDA;
  kvc_pool *none = NULL;
  const kvc_status plain = kvc_pool_create(&cfg, &none);
  const int no_backend = plain == KVC_ERR_DEVICE_UNAVAILABLE && strstr(kvc_last_error_message(), "no CUDA backend");
  if (none) kvc_pool_destroy(none);
  none = NULL;
  cfg.k_codec = &k;
  ASSERT_STATUS(no_backend ? KVC_ERR_DEVICE_UNAVAILABLE : KVC_ERR_UNSUPPORTED, kvc_pool_create(&cfg, &none));
  assert_null(none);
  assert_non_null(strstr(kvc_last_error_message(), no_backend ? "no CUDA backend" : "full_range"));
}

/* Full range with a dynamic per-tensor scale in a pool: the layer's scale,
 * fixed by the first write, follows the full-range rule (-m / 2^(bits-1),
 * m = 6 here: -0.75) like kvc_quantize() on the same values, so the pool
 * reads back what the standalone quantizer gives. (It was calibrated as
 * absmax / 7 = 0.857, the [-7, 7] rule, with the -8 code left unused.) */
static void test_full_range_tensor_pool(void **state) {
  (void)state;
  kvc_codec c = codec_of(KVC_DTYPE_INT4, KVC_SCALE_PER_TENSOR, 0, 0);
  c.full_range = 1;
  kvc_pool *p = codec_pool(1, 1, 8, 16, 4, &c, &c, KVC_OK);
  const float x[8] = {6.0f, -5.0f, 1.0f, -6.0f, 0.375f, 3.0f, -0.75f, 2.25f};
  float y[8], standalone[8], ks = 0, vs = 0, scale = 0;
  ASSERT_OK(kvc_seq_create(p, 1));
  ASSERT_OK(kvc_seq_reserve(p, 1, 2, NULL));
  ASSERT_OK(kvc_append(p, 1, 0, 0, 1, x, x, KVC_DTYPE_F32));
  ASSERT_OK(kvc_pool_tensor_scales(p, 0, &ks, &vs));
  assert_true(ks == -0.75f && vs == -0.75f);
  ASSERT_OK(kvc_gather(p, 1, 0, 0, 1, y, NULL, KVC_DTYPE_F32, NULL));
  uint8_t codes[4];
  ASSERT_OK(kvc_quantize(&c, x, KVC_DTYPE_F32, 1, 8, codes, &scale, NULL));
  assert_true(scale == -0.75f);
  ASSERT_OK(kvc_dequantize(&c, codes, &scale, NULL, 1, 8, standalone, KVC_DTYPE_F32));
  assert_memory_equal(y, standalone, sizeof y);
  assert_true(y[0] == 6.0f && y[1] == -5.25f && y[3] == -5.25f && y[5] == 3.0f);
  /* A later token uses the layer's scale: 7.5 is beyond -8 steps, saturates to 6. */
  const float x2[8] = {7.5f, -1.5f, 0, 0, 0, 0, 0, 0};
  ASSERT_OK(kvc_append(p, 1, 0, 1, 1, x2, x2, KVC_DTYPE_F32));
  ASSERT_OK(kvc_gather(p, 1, 0, 1, 1, y, NULL, KVC_DTYPE_F32, NULL));
  assert_true(y[0] == 6.0f && y[1] == -1.5f);
  /* A sequence record carries the negative scale to a fresh pool of the same configuration. */
  size_t size = 0;
  ASSERT_STATUS(KVC_ERR_BUFFER_TOO_SMALL, kvc_seq_save(p, 1, NULL, 0, &size));
  void *rec = malloc(size);
  ASSERT_OK(kvc_seq_save(p, 1, rec, size, &size));
  kvc_pool *q = codec_pool(1, 1, 8, 16, 4, &c, &c, KVC_OK);
  ASSERT_OK(kvc_seq_restore(q, 1, rec, size));
  ASSERT_OK(kvc_pool_tensor_scales(q, 0, &ks, &vs));
  assert_true(ks == -0.75f && vs == -0.75f);
  ASSERT_OK(kvc_gather(q, 1, 0, 0, 1, y, NULL, KVC_DTYPE_F32, NULL));
  assert_memory_equal(y, standalone, sizeof y);
  /* A pool with [-7, 7] codes refuses it (same per-tensor layout, other decoding rule). */
  kvc_codec plain = c;
  plain.full_range = 0;
  kvc_pool *r = codec_pool(1, 1, 8, 16, 4, &plain, &plain, KVC_OK);
  ASSERT_STATUS(KVC_ERR_INCOMPATIBLE, kvc_seq_restore(r, 1, rec, size));
  uint64_t len = 0;
  ASSERT_STATUS(KVC_ERR_SEQ_NOT_FOUND, kvc_seq_length(r, 1, &len));
  ASSERT_OK(kvc_pool_tensor_scales(r, 0, &ks, &vs));
  assert_true(ks == 0.0f && vs == 0.0f);
  kvc_pool_destroy(r);
  free(rec);
  kvc_pool_destroy(q);
  kvc_pool_destroy(p);
}

static void test_pool_codec_errors(void **state) {
  (void)state;
  kvc_codec k = codec_of(KVC_DTYPE_INT8, KVC_SCALE_PER_CHANNEL, 32, 1); /* group > block_size */
  assert_null(codec_pool(1, 2, 8, 16, 4, &k, NULL, KVC_ERR_INVALID_ARGUMENT));
  assert_non_null(strstr(kvc_last_error_message(), "divide block_size"));
  k = codec_of(KVC_DTYPE_INT8, KVC_SCALE_PER_CHANNEL, 6, 1); /* does not divide 16 */
  assert_null(codec_pool(1, 2, 8, 16, 4, &k, NULL, KVC_ERR_INVALID_ARGUMENT));
  k = codec_of(KVC_DTYPE_INT4, KVC_SCALE_PER_TOKEN, 0, 0);
  assert_null(codec_pool(1, 2, 5, 16, 4, &k, NULL, KVC_ERR_INVALID_ARGUMENT)); /* 5 x 4 bits */
  assert_non_null(strstr(kvc_last_error_message(), "k_codec"));
  k = codec_of(KVC_DTYPE_FP8_E4M3, KVC_SCALE_PER_TOKEN, 0, 1); /* fp8 is symmetric */
  assert_null(codec_pool(1, 2, 8, 16, 4, NULL, &k, KVC_ERR_INVALID_ARGUMENT));
  assert_non_null(strstr(kvc_last_error_message(), "v_codec"));
  k = codec_of(KVC_DTYPE_INT8, KVC_SCALE_NONE, 0, 0);
  assert_null(codec_pool(1, 2, 8, 16, 4, &k, NULL, KVC_ERR_INVALID_ARGUMENT));
  k = codec_of(KVC_DTYPE_INT4, KVC_SCALE_PER_TENSOR, 0, 1);
  assert_null(codec_pool(1, 2, 8, 16, 4, &k, NULL, KVC_ERR_INVALID_ARGUMENT));
  k = codec_of(KVC_DTYPE_INT8, KVC_SCALE_PER_TOKEN, 0, 0);
  k.struct_size = 4;
  assert_null(codec_pool(1, 2, 8, 16, 4, &k, NULL, KVC_ERR_STRUCT_SIZE));
  k = codec_of(KVC_DTYPE_INT8, KVC_SCALE_PER_TOKEN, 0, 0);
  kvc_pool_config c = test_config(1, 2, 8, 16, 4);
  c.k_codec = &k;
  c.layout = KVC_LAYOUT_HND;
  kvc_pool *p = NULL;
  ASSERT_STATUS(KVC_ERR_UNSUPPORTED, kvc_pool_create(&c, &p));
  /* K quantized, V plain bf16. */
  c.layout = KVC_LAYOUT_NHD;
  c.v_dtype = KVC_DTYPE_BF16;
  ASSERT_OK(kvc_pool_create(&c, &p));
  kvc_pool_layout l;
  kvc_pool_layout_init(&l);
  ASSERT_OK(kvc_pool_get_layout(p, &l));
  assert_int_equal(l.k_dtype, KVC_DTYPE_INT8);
  assert_int_equal(l.v_dtype, KVC_DTYPE_BF16);
  assert_int_equal(l.k_bytes, 16 * 2 * 8 + 16 * 2 * 4);
  assert_int_equal(l.v_bytes, 16 * 2 * 8 * 2);
  assert_int_equal(l.v_scales_per_token, 0);
  float ks = -1, vs = -1;
  ASSERT_OK(kvc_pool_tensor_scales(p, 0, &ks, &vs));
  assert_true(ks == 0.0f && vs == 0.0f);
  ASSERT_STATUS(KVC_ERR_OUT_OF_RANGE, kvc_pool_tensor_scales(p, 1, &ks, &vs));
  kvc_pool_destroy(p);
}

/* kvc_attention_decode() of sequence `seq` (40 tokens, 4 query heads over 2
 * KV heads of 8) against a softmax over the rows kvc_gather() returns. */
static void assert_decode_matches_gather(kvc_pool *p, uint64_t seq, uint32_t layer) {
  kvc_attention_params ap;
  kvc_attention_params_init(&ap);
  ap.num_q_heads = 4;
  float q[4 * 8], out[4 * 8], kg[40 * 16], vg[40 * 16];
  for (int i = 0; i < 32; ++i) q[i] = 0.3f * (float)((i * 7) % 11) - 1.5f;
  ASSERT_OK(kvc_attention_decode(p, layer, &seq, 1, q, out, NULL, &ap));
  ASSERT_OK(kvc_gather(p, seq, layer, 0, 40, kg, vg, KVC_DTYPE_F32, NULL));
  for (int h = 0; h < 4; ++h) {
    const int g = h / 2;
    double sc[40], mx = -1e30, sum = 0.0;
    for (int t = 0; t < 40; ++t) {
      double d = 0.0;
      for (int e = 0; e < 8; ++e) d += (double)q[h * 8 + e] * kg[t * 16 + g * 8 + e];
      sc[t] = d / sqrt(8.0);
      if (sc[t] > mx) mx = sc[t];
    }
    for (int t = 0; t < 40; ++t) sum += exp(sc[t] - mx);
    for (int e = 0; e < 8; ++e) {
      double o = 0.0;
      for (int t = 0; t < 40; ++t) o += exp(sc[t] - mx) / sum * vg[t * 16 + g * 8 + e];
      assert_float_equal(out[h * 8 + e], (float)o, 1e-5f);
    }
  }
}

/* ---- pre-RoPE keys (KVQuant) ------------------------------------------ */

/* Key e of head h at position pos: a fixed pre-RoPE row b[h][e] rotated by
 * interleaved RoPE (pairs (2i, 2i+1), theta 10000, head_dim 8), in double. */
static void rope_key(uint64_t pos, float *row /* [2][8] */) {
  for (int h = 0; h < 2; ++h)
    for (int i = 0; i < 4; ++i) {
      const double b0 = 0.5 + 0.37 * (double)(h * 8 + 2 * i) - 0.11 * (double)i * (double)i;
      const double b1 = -1.25 + 0.29 * (double)(h * 8 + 2 * i + 1);
      const double a = (double)pos * pow(10000.0, -2.0 * i / 8.0);
      row[h * 8 + 2 * i] = (float)(b0 * cos(a) - b1 * sin(a));
      row[h * 8 + 2 * i + 1] = (float)(b0 * sin(a) + b1 * cos(a));
    }
}

/* Largest |gathered - appended| key over tokens [t0, t1) of sequence seq. */
static double pre_rope_err(kvc_pool *p, uint64_t seq, uint64_t t0, uint64_t t1) {
  float got[64 * 16], want[16];
  assert_true(t1 <= 64);
  ASSERT_OK(kvc_gather(p, seq, 0, 0, t1, got, NULL, KVC_DTYPE_F32, NULL));
  double worst = 0.0;
  for (uint64_t t = t0; t < t1; ++t) {
    rope_key(t, want);
    for (int e = 0; e < 16; ++e) worst = fmax(worst, fabs((double)got[t * 16 + e] - want[e]));
  }
  return worst;
}

/* Keys that are one constant row before RoPE: per channel over 16 tokens,
 * their pre-RoPE codes are exact (each channel's group is constant; f32
 * staging), so the gathered keys (encoded tokens, and tokens re-staged by a
 * truncation) are the appended ones up to float rounding; without the flag the same keys
 * lose about a step. Attention reads them; fork, save / restore keep them;
 * eviction with shifted positions, the prefix cache (sharing, and keys that
 * depend on the RoPE settings) and the settings it needs are checked. */
static void test_pre_rope_keys(void **state) {
  (void)state;
  kvc_codec k = codec_of(KVC_DTYPE_INT4, KVC_SCALE_PER_CHANNEL, 16, 1);
  kvc_pool_config c = test_config(1, 2, 8, 16, 16);
  c.k_codec = &k;
  c.rope_style = KVC_ROPE_INTERLEAVED;
  c.flags = KVC_POOL_PRE_ROPE_KEYS;
  c.residual_dtype = KVC_DTYPE_F32; /* staging without rounding */
  kvc_pool *p = NULL, *plain = NULL;
  ASSERT_OK(kvc_pool_create(&c, &p));
  kvc_pool_config c0 = c;
  c0.flags = 0;
  ASSERT_OK(kvc_pool_create(&c0, &plain));
  float kr[16], vr[16];
  for (kvc_pool *q = p; q; q = q == p ? plain : NULL) {
    ASSERT_OK(kvc_seq_create(q, 1));
    for (uint64_t pos = 0; pos < 40; ++pos) {
      rope_key(pos, kr);
      for (int e = 0; e < 16; ++e) vr[e] = 0.1f * (float)((pos * 3 + (uint64_t)e) % 7);
      ASSERT_OK(kvc_seq_reserve(q, 1, 1, NULL));
      ASSERT_OK(kvc_append(q, 1, 0, pos, 1, kr, vr, KVC_DTYPE_F32));
    }
  }
  const double err_pre = pre_rope_err(p, 1, 0, 32), err_plain = pre_rope_err(plain, 1, 0, 32);
  if (!(err_pre < 2e-6 && err_plain > 1e-2)) {
    print_error("pre-RoPE max error %g, post-RoPE %g\n", err_pre, err_plain);
    fail();
  }
  assert_true(pre_rope_err(p, 1, 32, 40) == 0.0); /* staged as appended */

  /* Attention: decode against a softmax over the gathered rows. */
  assert_decode_matches_gather(p, 1, 0);

  /* Fork, then truncate the child into its second group: tokens 16..19 go
   * back to the staging (decoded and rotated back), and the rewritten tail
   * is encoded again at its positions. */
  ASSERT_OK(kvc_seq_fork(p, 1, 2));
  ASSERT_OK(kvc_seq_truncate(p, 2, 20));
  assert_true(pre_rope_err(p, 2, 0, 16) < 2e-6);
  assert_true(pre_rope_err(p, 2, 16, 20) < 2e-6);
  for (uint64_t pos = 20; pos < 48; ++pos) {
    rope_key(pos, kr);
    ASSERT_OK(kvc_seq_reserve(p, 2, 1, NULL));
    ASSERT_OK(kvc_append(p, 2, 0, pos, 1, kr, kr, KVC_DTYPE_F32));
  }
  assert_true(pre_rope_err(p, 2, 0, 16) < 2e-6);
  assert_true(pre_rope_err(p, 2, 16, 48) < 2e-6);
  assert_true(pre_rope_err(p, 1, 0, 32) < 2e-6);          /* the parent is untouched */

  /* Save / restore in a pool with the flag; a pool without it refuses. */
  size_t need = 0;
  assert_int_equal(kvc_seq_save(p, 1, NULL, 0, &need), KVC_ERR_BUFFER_TOO_SMALL);
  uint8_t *rec = malloc(need);
  assert_non_null(rec);
  ASSERT_OK(kvc_seq_save(p, 1, rec, need, &need));
  ASSERT_OK(kvc_seq_restore(p, 3, rec, need));
  assert_true(pre_rope_err(p, 3, 0, 32) < 2e-6);
  assert_int_equal(kvc_seq_restore(plain, 3, rec, need), KVC_ERR_INCOMPATIBLE);
  free(rec);
  kvc_pool_destroy(plain);
  kvc_pool_destroy(p);

  /* Per-token keys. StreamingLLM eviction with shifted positions re-encodes
   * nothing: the kept keys are read at their new in-cache positions, and a
   * key appended afterwards at the RoPE position the pool reports is read
   * back at it. Every key here is the same row before RoPE, so the gathered
   * key j is rope_key(j) within int8's error. */
  kvc_codec kt = codec_of(KVC_DTYPE_INT8, KVC_SCALE_PER_TOKEN, 0, 0);
  c.k_codec = &kt;
  ASSERT_OK(kvc_pool_create(&c, &p));
  ASSERT_OK(kvc_seq_create(p, 1));
  for (uint64_t pos = 0; pos < 20; ++pos) {
    rope_key(pos, kr);
    ASSERT_OK(kvc_seq_reserve(p, 1, 1, NULL));
    ASSERT_OK(kvc_append(p, 1, 0, pos, 1, kr, kr, KVC_DTYPE_F32));
  }
  const double err_int8 = pre_rope_err(p, 1, 0, 20);
  assert_true(err_int8 > 0.0 && err_int8 < 0.02); /* int8 per token and head */
  float before[20 * 16];
  ASSERT_OK(kvc_gather(p, 1, 0, 0, 20, before, NULL, KVC_DTYPE_F32, NULL));
  kvc_policy_config pcfg;
  kvc_policy_config_init(&pcfg);
  pcfg.kind = KVC_POLICY_STREAMING;
  pcfg.budget_tokens = 8;
  pcfg.sink_tokens = 2;
  pcfg.shift_positions = 1;
  kvc_policy *pol = NULL;
  ASSERT_OK(kvc_policy_create(&pcfg, &pol));
  uint64_t dropped = 0;
  ASSERT_OK(kvc_evict(p, 1, pol, &dropped));
  kvc_policy_destroy(pol);
  assert_int_equal(dropped, 12);
  uint64_t nt = 0;
  ASSERT_OK(kvc_seq_layer_tokens(p, 1, 0, &nt));
  assert_int_equal(nt, 8);
  assert_true(pre_rope_err(p, 1, 0, 8) <= err_int8 + 1e-6);
  {
    /* Same codes: the sinks' keys read the same bits as before; the kept
     * tokens 14..19 (now 2..7) are their old keys turned by -12 positions. */
    float after[8 * 16], turned[16];
    ASSERT_OK(kvc_gather(p, 1, 0, 0, 8, after, NULL, KVC_DTYPE_F32, NULL));
    assert_memory_equal(after, before, 2 * 16 * sizeof(float));
    for (int j = 2; j < 8; ++j) {
      /* rope_key(j) against the old key's error at 12 + j: equal within float rounding */
      rope_key((uint64_t)j, turned);
      double e_new = 0.0, e_old = 0.0;
      float old_want[16];
      rope_key((uint64_t)(12 + j), old_want);
      for (int e = 0; e < 16; ++e) {
        e_new += ((double)after[j * 16 + e] - turned[e]) * ((double)after[j * 16 + e] - turned[e]);
        e_old += ((double)before[(12 + j) * 16 + e] - old_want[e]) * ((double)before[(12 + j) * 16 + e] - old_want[e]);
      }
      assert_true(fabs(sqrt(e_new) - sqrt(e_old)) < 1e-5); /* a rotation keeps the error's norm */
    }
  }
  int32_t rp = -1;
  ASSERT_OK(kvc_seq_reserve(p, 1, 1, NULL));
  ASSERT_OK(kvc_seq_rope_positions(p, 1, 0, 20, 1, &rp));
  assert_int_equal(rp, 8);
  rope_key((uint64_t)rp, kr);
  ASSERT_OK(kvc_append(p, 1, 0, 20, 1, kr, kr, KVC_DTYPE_F32));
  assert_true(pre_rope_err(p, 1, 0, 9) <= err_int8 + 1e-6);
  kvc_pool_destroy(p);

  /* The prefix cache: a prompt's blocks registered by one sequence are
   * attached by another at the same positions and read back the same bits;
   * a pool with another rope_theta computes other keys. */
  {
    kvc_prefix_config pc;
    kvc_prefix_config_init(&pc);
    pc.seed_set = 1;
    int32_t toks[33]; /* 32 cached, and one to compute */
    for (int i = 0; i < 33; ++i) toks[i] = 100 + i;
    uint8_t keys[2][2 * 32];
    for (int variant = 0; variant < 2; ++variant) {
      kvc_pool_config cp = c;
      if (variant) cp.rope_theta = 500000.0;
      ASSERT_OK(kvc_pool_create(&cp, &p));
      ASSERT_OK(kvc_pool_enable_prefix_cache(p, &pc));
      size_t ks = 0;
      ASSERT_OK(kvc_prefix_keys(p, toks, 32, NULL, 0, keys[variant], sizeof keys[variant], &ks));
      assert_int_equal(ks, 32);
      if (variant) {
        kvc_pool_destroy(p);
        break;
      }
      ASSERT_OK(kvc_seq_create(p, 1));
      ASSERT_OK(kvc_seq_reserve(p, 1, 32, NULL));
      for (uint64_t pos = 0; pos < 32; ++pos) {
        rope_key(pos, kr);
        ASSERT_OK(kvc_append(p, 1, 0, pos, 1, kr, kr, KVC_DTYPE_F32));
      }
      uint64_t reg = 0;
      ASSERT_OK(kvc_prefix_insert(p, 1, toks, 32, NULL, 0, &reg));
      assert_int_equal(reg, 2);
      kvc_prefix_result r;
      memset(&r, 0, sizeof r);
      r.struct_size = sizeof r;
      ASSERT_OK(kvc_prefix_attach(p, 2, toks, 33, NULL, 0, 0, &r));
      assert_int_equal(r.hit_tokens, 32);
      float a1[32 * 16], a2[32 * 16];
      ASSERT_OK(kvc_gather(p, 1, 0, 0, 32, a1, NULL, KVC_DTYPE_F32, NULL));
      ASSERT_OK(kvc_gather(p, 2, 0, 0, 32, a2, NULL, KVC_DTYPE_F32, NULL));
      assert_memory_equal(a1, a2, sizeof a1);
      assert_true(pre_rope_err(p, 2, 0, 32) < 0.02);
      kvc_pool_destroy(p);
    }
    assert_true(memcmp(keys[0], keys[1], sizeof keys[0]) != 0);
  }

  /* Per-tensor key scales can shift positions here (nothing is re-encoded). */
  kvc_codec kten = codec_of(KVC_DTYPE_INT8, KVC_SCALE_PER_TENSOR, 0, 0);
  c.k_codec = &kten;
  ASSERT_OK(kvc_pool_create(&c, &p));
  ASSERT_OK(kvc_seq_create(p, 1));
  for (uint64_t pos = 0; pos < 20; ++pos) {
    rope_key(pos, kr);
    ASSERT_OK(kvc_seq_reserve(p, 1, 1, NULL));
    ASSERT_OK(kvc_append(p, 1, 0, pos, 1, kr, kr, KVC_DTYPE_F32));
  }
  ASSERT_OK(kvc_policy_create(&pcfg, &pol));
  ASSERT_OK(kvc_evict(p, 1, pol, NULL));
  kvc_policy_destroy(pol);
  assert_true(pre_rope_err(p, 1, 0, 8) < 0.05);
  kvc_pool_destroy(p);
  c.k_codec = &kt;

  /* Settings it needs. */
  kvc_pool_config bad = c;
  bad.rope_style = KVC_ROPE_NONE;
  assert_int_equal(kvc_pool_create(&bad, &p), KVC_ERR_INVALID_ARGUMENT);
  assert_non_null(strstr(kvc_last_error_message(), "rope_style"));
  bad = c;
  bad.k_codec = NULL;
  assert_int_equal(kvc_pool_create(&bad, &p), KVC_ERR_INVALID_ARGUMENT);
  assert_non_null(strstr(kvc_last_error_message(), "quantized keys"));
  bad = c;
  bad.flags = 0x8; /* 0x4 is KVC_POOL_HEADWISE since 0.4 */
  assert_int_equal(kvc_pool_create(&bad, &p), KVC_ERR_INVALID_ARGUMENT);
  bad = c;
  bad.device = KVC_DEVICE_CUDA;
  const kvc_status cs = kvc_pool_create(&bad, &p);
  assert_true(cs == KVC_ERR_UNSUPPORTED || cs == KVC_ERR_DEVICE_UNAVAILABLE);
}

/* ---- residual window (KIVI) and hybrid precision ---------------------- */

static kvc_pool *residual_pool(const kvc_codec *k, const kvc_codec *v, uint32_t window,
                               double fraction, uint64_t res_blocks, uint32_t layers) {
  kvc_pool_config c = test_config(layers, 2, 8, 16, 256);
  c.k_codec = k;
  c.v_codec = v;
  c.residual_window = window;
  c.residual_fraction = fraction;
  c.num_residual_blocks = res_blocks;
  kvc_pool *p = NULL;
  ASSERT_OK(kvc_pool_create(&c, &p));
  return p;
}

/* Writes token `pos` (values depend on pos) into every layer. */
static void step(kvc_pool *p, uint64_t seq, uint64_t pos, uint32_t layers, float *k, float *v) {
  ASSERT_OK(kvc_seq_reserve(p, seq, 1, NULL));
  for (int e = 0; e < 16; ++e) {
    k[e] = sinf(0.37f * (float)pos + 0.9f * (float)e) * (1.0f + (float)(e % 4));
    v[e] = cosf(0.21f * (float)pos - 0.5f * (float)e);
  }
  for (uint32_t l = 0; l < layers; ++l) ASSERT_OK(kvc_append(p, seq, l, pos, 1, k, v, KVC_DTYPE_F32));
}

/* KIVI: keys int2 per channel over groups of 16 tokens, values int2 per
 * token, asymmetric, residual window 32. The newest tokens read back as
 * f16; older ones within the codec's bound; the residual stays bounded and
 * the bytes in use fall below an all-f16 cache. */
static void test_kivi_residual(void **state) {
  (void)state;
  kvc_codec k = codec_of(KVC_DTYPE_INT2, KVC_SCALE_PER_CHANNEL, 16, 1);
  kvc_codec v = codec_of(KVC_DTYPE_INT2, KVC_SCALE_PER_GROUP, 8, 1);
  kvc_pool *p = residual_pool(&k, &v, 32, 0.0, 64, 2);
  ASSERT_OK(kvc_seq_create(p, 1));
  const uint64_t n = 150;
  float *kin = malloc(sizeof(float) * n * 16), *vin = malloc(sizeof(float) * n * 16);
  for (uint64_t pos = 0; pos < n; ++pos) {
    step(p, 1, pos, 2, kin + pos * 16, vin + pos * 16);
    kvc_stats st = get_stats(p);
    /* Per layer at most window + group + 1 tokens in the residual: 4 blocks. */
    assert_true(st.residual_blocks_used <= 2 * 4);
    assert_int_equal(st.tokens_stored, 2 * (pos + 1));
  }
  kvc_stats st = get_stats(p);
  assert_true(st.blocks_used >= 2 * 7); /* >= 112 tokens per layer encoded */
  /* Memory: codes + scales + residual, below the f16 cache of the same tokens. */
  const uint64_t f16_bytes = 2 * n * 2 * 16 * 2;
  assert_true(st.bytes_in_use < f16_bytes);
  float out_k[150 * 16], out_v[150 * 16];
  int32_t pos[150];
  ASSERT_OK(kvc_gather(p, 1, 1, 0, n, out_k, out_v, KVC_DTYPE_F32, pos));
  for (uint64_t t = 0; t < n; ++t) {
    assert_int_equal(pos[t], t);
    for (int e = 0; e < 16; ++e) {
      const float x = kin[t * 16 + e], y = out_k[t * 16 + e];
      if (t >= n - 32) {
        uint16_t h;
        float r;
        kvc_convert(&x, KVC_DTYPE_F32, &h, KVC_DTYPE_F16, 1);
        kvc_convert(&h, KVC_DTYPE_F16, &r, KVC_DTYPE_F32, 1);
        assert_float_equal(y, r, 0.0f); /* still in the f16 residual */
      } else {
        /* int2 asymmetric over the channel's group of 16 tokens: half a step
         * of (max - min) / 3, at most (2 * amplitude) / 6. */
        const float amp = 1.0f + (float)(e % 4);
        assert_true(fabsf(y - x) <= 2.0f * amp / 6.0f * 1.001f + 1e-6f);
      }
    }
  }
  /* Fork: the child shares codec and residual blocks; its writes are its own. */
  ASSERT_OK(kvc_seq_fork(p, 1, 2));
  float kx[16], vx[16];
  for (uint64_t q = n; q < n + 20; ++q) step(p, 2, q, 2, kx, vx);
  float again[150 * 16];
  ASSERT_OK(kvc_gather(p, 1, 1, 0, n, again, NULL, KVC_DTYPE_F32, NULL));
  assert_memory_equal(again, out_k, sizeof again);
  ASSERT_OK(kvc_gather(p, 2, 1, 0, n, again, NULL, KVC_DTYPE_F32, NULL));
  /* The child aged some of the shared residual tokens into its own blocks:
   * same values within the codec bound, the parent untouched (checked above). */
  for (uint64_t t = 0; t < n * 16; ++t) assert_true(fabsf(again[t] - out_k[t]) <= 2.0f * 4.0f / 6.0f * 1.001f);
  /* Truncate into the middle of an encoded per-channel group: the cut group's
   * tokens go back to the residual with the values they had. */
  float before[40 * 16], after[40 * 16];
  ASSERT_OK(kvc_gather(p, 1, 0, 0, 40, before, NULL, KVC_DTYPE_F32, NULL));
  ASSERT_OK(kvc_seq_truncate(p, 1, 40));
  uint64_t nt;
  ASSERT_OK(kvc_seq_layer_tokens(p, 1, 0, &nt));
  assert_int_equal(nt, 40);
  ASSERT_OK(kvc_gather(p, 1, 0, 0, 40, after, NULL, KVC_DTYPE_F32, NULL));
  for (int i = 0; i < 40 * 16; ++i) assert_true(fabsf(after[i] - before[i]) <= 1e-2f * (1.0f + fabsf(before[i])));
  for (uint64_t q = 40; q < 80; ++q) step(p, 1, q, 2, kx, vx); /* and it goes on */
  ASSERT_OK(kvc_seq_free(p, 1));
  ASSERT_OK(kvc_seq_free(p, 2));
  st = get_stats(p);
  assert_int_equal(st.blocks_used, 0);
  assert_int_equal(st.residual_blocks_used, 0);
  free(kin);
  free(vin);
  kvc_pool_destroy(p);
}

/* Per-channel keys without a residual window: a group of G tokens leaves its
 * f16 staging in the append that completes it (not at the next reserve), so
 * the bytes in use at a multiple of G are the codec's alone; a partial group
 * stays staged; multi-token appends age whole groups; a forked child ages its
 * own copy and the parent keeps its staged values. */
static void test_kchannel_ages_on_append(void **state) {
  (void)state;
  kvc_codec k = codec_of(KVC_DTYPE_INT4, KVC_SCALE_PER_CHANNEL, 16, 1);
  kvc_codec v = codec_of(KVC_DTYPE_INT4, KVC_SCALE_PER_TOKEN, 0, 0);
  kvc_pool *p = residual_pool(&k, &v, 0, 0.0, 64, 2);
  kvc_pool_layout l;
  kvc_pool_layout_init(&l);
  ASSERT_OK(kvc_pool_get_layout(p, &l));
  ASSERT_OK(kvc_seq_create(p, 1));
  float kin[16], vin[16];
  for (uint64_t pos = 0; pos < 16; ++pos) {
    step(p, 1, pos, 2, kin, vin);
    kvc_stats st = get_stats(p);
    if (pos < 15) {
      assert_int_equal(st.residual_blocks_used, 2); /* one staging block per layer */
      assert_int_equal(st.blocks_used, 0);
    } else {
      assert_int_equal(st.residual_blocks_used, 0); /* the 16th token completed the group */
      assert_int_equal(st.blocks_used, 2);
      assert_int_equal(st.bytes_in_use, 2 * l.block_stride);
    }
  }
  /* 20 tokens in one append per layer: one group of 16 ages, 4 stay staged. */
  float k20[20 * 16], v20[20 * 16];
  for (int i = 0; i < 20 * 16; ++i) {
    k20[i] = sinf(0.1f * (float)i);
    v20[i] = cosf(0.2f * (float)i);
  }
  ASSERT_OK(kvc_seq_reserve(p, 1, 20, NULL));
  for (uint32_t layer = 0; layer < 2; ++layer) ASSERT_OK(kvc_append(p, 1, layer, 16, 20, k20, v20, KVC_DTYPE_F32));
  kvc_stats st = get_stats(p);
  assert_int_equal(st.blocks_used, 4);
  assert_int_equal(st.residual_blocks_used, 2);
  float staged[4 * 16];
  ASSERT_OK(kvc_gather(p, 1, 0, 32, 4, staged, NULL, KVC_DTYPE_F32, NULL));
  for (int i = 0; i < 4 * 16; ++i) { /* still f16 */
    uint16_t h;
    float r;
    kvc_convert(&k20[16 * 16 + i], KVC_DTYPE_F32, &h, KVC_DTYPE_F16, 1);
    kvc_convert(&h, KVC_DTYPE_F16, &r, KVC_DTYPE_F32, 1);
    assert_float_equal(staged[i], r, 0.0f);
  }
  /* Fork, then complete the group in the child only. */
  ASSERT_OK(kvc_seq_fork(p, 1, 2));
  for (uint64_t pos = 36; pos < 48; ++pos) step(p, 2, pos, 2, kin, vin);
  float parent[4 * 16];
  ASSERT_OK(kvc_gather(p, 1, 0, 32, 4, parent, NULL, KVC_DTYPE_F32, NULL));
  assert_memory_equal(parent, staged, sizeof parent);
  uint64_t nt;
  ASSERT_OK(kvc_seq_layer_tokens(p, 2, 1, &nt));
  assert_int_equal(nt, 48);
  float child[4 * 16];
  ASSERT_OK(kvc_gather(p, 2, 0, 32, 4, child, NULL, KVC_DTYPE_F32, NULL));
  /* int4 asymmetric over the channel's 16 tokens (values within [-4, 4]):
   * half a step of (max - min) / 15, and not the staged f16 values any more. */
  int moved = 0;
  for (int i = 0; i < 4 * 16; ++i) {
    assert_true(fabsf(child[i] - staged[i]) <= 8.0f / 15.0f / 2.0f * 1.01f);
    moved += child[i] != staged[i];
  }
  assert_true(moved > 32);
  ASSERT_OK(kvc_seq_free(p, 1));
  ASSERT_OK(kvc_seq_free(p, 2));
  st = get_stats(p);
  assert_int_equal(st.blocks_used, 0);
  assert_int_equal(st.residual_blocks_used, 0);
  kvc_pool_destroy(p);
}

/* Rows of token `pos` of seq-specific values (`salt` changes them). */
static void sink_rows(uint64_t pos, float salt, float *k, float *v) {
  for (int e = 0; e < 16; ++e) {
    k[e] = sinf(0.37f * (float)pos + 0.9f * (float)e + salt) * (1.0f + (float)(e % 4));
    v[e] = cosf(0.21f * (float)pos - 0.5f * (float)e + salt);
  }
}

static float f16_round(float x) {
  uint16_t h;
  float r;
  kvc_convert(&x, KVC_DTYPE_F32, &h, KVC_DTYPE_F16, 1);
  kvc_convert(&h, KVC_DTYPE_F16, &r, KVC_DTYPE_F32, 1);
  return r;
}

/* Gathered rows of tokens [first, first + n) of every layer equal the f16 of
 * sink_rows(salt) exactly. */
static void assert_sinks_exact(kvc_pool *p, uint64_t seq, uint32_t layers, uint64_t first, uint64_t n, float salt) {
  for (uint32_t layer = 0; layer < layers; ++layer) {
    float kg[4 * 16], vg[4 * 16];
    ASSERT_OK(kvc_gather(p, seq, layer, first, n, kg, vg, KVC_DTYPE_F32, NULL));
    for (uint64_t t = 0; t < n; ++t) {
      float k[16], v[16];
      sink_rows(first + t, salt, k, v);
      for (int e = 0; e < 16; ++e) {
        assert_float_equal(kg[t * 16 + e], f16_round(k[e]), 0.0f);
        assert_float_equal(vg[t * 16 + e], f16_round(v[e]), 0.0f);
      }
    }
  }
}

/* Elements of token `pos` that read back different from their f16 value
 * (encoded: int2 moves most of them). */
static int moved_elements(kvc_pool *p, uint64_t seq, uint64_t pos, float salt) {
  float kg[16], vg[16], k[16], v[16];
  ASSERT_OK(kvc_gather(p, seq, 0, pos, 1, kg, vg, KVC_DTYPE_F32, NULL));
  sink_rows(pos, salt, k, v);
  int moved = 0;
  for (int e = 0; e < 16; ++e) moved += (kg[e] != f16_round(k[e])) + (vg[e] != f16_round(v[e]));
  return moved;
}

static void append_rows(kvc_pool *p, uint64_t seq, uint64_t pos, uint32_t layers, float salt) {
  float k[16], v[16];
  ASSERT_OK(kvc_seq_reserve(p, seq, 1, NULL));
  sink_rows(pos, salt, k, v);
  for (uint32_t l = 0; l < layers; ++l) ASSERT_OK(kvc_append(p, seq, l, pos, 1, k, v, KVC_DTYPE_F32));
}

/* Attention sinks (residual_sinks): the first tokens of each layer keep
 * their f16 rows after their per-channel group is encoded (int2 keys per
 * channel over 16 tokens, int2 values per token); gather and attention read
 * them; the copies take one residual block per sequence (3 layers, 2 sinks:
 * 8 layers to a block of 16), follow forks privately, truncation and
 * save / restore; bad settings and a full arena fail with nothing changed. */
static void test_residual_sinks(void **state) {
  (void)state;
  kvc_codec k = codec_of(KVC_DTYPE_INT2, KVC_SCALE_PER_CHANNEL, 16, 1);
  kvc_codec v = codec_of(KVC_DTYPE_INT2, KVC_SCALE_PER_TOKEN, 0, 1);
  const uint32_t layers = 3;
  kvc_pool_config c = test_config(layers, 2, 8, 16, 64);
  c.k_codec = &k;
  c.v_codec = &v;
  c.num_residual_blocks = 16;
  c.residual_sinks = 2;
  kvc_pool *p = NULL;
  ASSERT_OK(kvc_pool_create(&c, &p));
  kvc_pool_config back;
  kvc_pool_config_init(&back);
  ASSERT_OK(kvc_pool_get_config(p, &back));
  assert_int_equal(back.residual_sinks, 2);
  ASSERT_OK(kvc_seq_create(p, 1));
  for (uint64_t pos = 0; pos < 40; ++pos) append_rows(p, 1, pos, layers, 0.0f);
  kvc_stats st = get_stats(p);
  assert_int_equal(st.blocks_used, layers * 2);           /* two groups of 16 encoded per layer */
  assert_int_equal(st.residual_blocks_used, layers + 1);  /* 8 staged tokens per layer + the sink block */
  assert_sinks_exact(p, 1, layers, 0, 2, 0.0f);
  assert_true(moved_elements(p, 1, 2, 0.0f) > 16); /* token 2 is encoded */
  assert_true(moved_elements(p, 1, 17, 0.0f) > 16);

  /* Attention reads the copies: decode against a softmax over the gathered
   * rows (which hold them). */
  assert_decode_matches_gather(p, 1, 1);

  /* Fork: the child takes its own copies; rewriting its token 1 (truncate
   * into the first group, which is re-staged with the sinks exact) leaves
   * the parent's copy alone. */
  ASSERT_OK(kvc_seq_fork(p, 1, 2));
  assert_int_equal(get_stats(p).residual_blocks_used, layers + 2);
  ASSERT_OK(kvc_seq_truncate(p, 2, 1));
  assert_sinks_exact(p, 2, layers, 0, 1, 0.0f);
  for (uint64_t pos = 1; pos < 16; ++pos) append_rows(p, 2, pos, layers, 1.0f);
  assert_int_equal(get_stats(p).blocks_used, layers * 2 + layers); /* the child's group encoded (parent's kept) */
  assert_sinks_exact(p, 2, layers, 1, 1, 1.0f);
  assert_sinks_exact(p, 1, layers, 0, 2, 0.0f);

  /* Save / restore keeps the copies. */
  size_t need = 0;
  assert_int_equal(kvc_seq_save(p, 1, NULL, 0, &need), KVC_ERR_BUFFER_TOO_SMALL);
  uint8_t *rec = malloc(need);
  assert_non_null(rec);
  ASSERT_OK(kvc_seq_save(p, 1, rec, need, &need));
  ASSERT_OK(kvc_seq_restore(p, 3, rec, need));
  assert_sinks_exact(p, 3, layers, 0, 2, 0.0f);
  assert_true(moved_elements(p, 3, 2, 0.0f) > 16);
  ASSERT_OK(kvc_seq_free(p, 3));
  ASSERT_OK(kvc_seq_free(p, 2));
  ASSERT_OK(kvc_seq_free(p, 1));
  st = get_stats(p);
  assert_int_equal(st.blocks_used, 0);
  assert_int_equal(st.residual_blocks_used, 0);

  /* A record of a pool without sinks does not restore here. */
  kvc_pool_config c0 = c;
  c0.residual_sinks = 0;
  kvc_pool *p0 = NULL;
  ASSERT_OK(kvc_pool_create(&c0, &p0));
  ASSERT_OK(kvc_seq_create(p0, 1));
  for (uint64_t pos = 0; pos < 20; ++pos) append_rows(p0, 1, pos, layers, 0.0f);
  size_t need0 = 0;
  assert_int_equal(kvc_seq_save(p0, 1, NULL, 0, &need0), KVC_ERR_BUFFER_TOO_SMALL);
  uint8_t *rec0 = malloc(need0);
  assert_non_null(rec0);
  ASSERT_OK(kvc_seq_save(p0, 1, rec0, need0, &need0));
  assert_int_equal(kvc_seq_restore(p, 4, rec0, need0), KVC_ERR_INCOMPATIBLE);
  assert_int_equal(kvc_seq_restore(p0, 4, rec, need), KVC_ERR_INCOMPATIBLE);
  free(rec0);
  free(rec);
  kvc_pool_destroy(p0);

  kvc_pool_destroy(p);

  /* The first reserve needs the sink block besides one staging block per
   * layer: with 3 residual blocks it fails and nothing changes; with 4 it
   * fits, and a fork (whose copy needs a fifth) fails with no child. */
  for (uint64_t res = 3; res <= 4; ++res) {
    kvc_pool_config small = c;
    small.num_residual_blocks = res;
    ASSERT_OK(kvc_pool_create(&small, &p));
    ASSERT_OK(kvc_seq_create(p, 5));
    if (res == 3) {
      assert_int_equal(kvc_seq_reserve(p, 5, 1, NULL), KVC_ERR_EXCEEDS_CAPACITY); /* never fits */
      uint64_t len = 99;
      ASSERT_OK(kvc_seq_length(p, 5, &len));
      assert_int_equal(len, 0);
      assert_int_equal(get_stats(p).residual_blocks_used, 0);
    } else {
      append_rows(p, 5, 0, layers, 0.0f);
      assert_int_equal(get_stats(p).residual_blocks_used, 4);
      assert_int_equal(kvc_seq_fork(p, 5, 6), KVC_ERR_POOL_EXHAUSTED);
      uint64_t len = 0;
      assert_int_equal(kvc_seq_length(p, 6, &len), KVC_ERR_SEQ_NOT_FOUND);
      assert_int_equal(get_stats(p).residual_blocks_used, 4);
      assert_sinks_exact(p, 5, layers, 0, 1, 0.0f);
    }
    kvc_pool_destroy(p);
  }

  /* Sinks alone (int4 per token, no window): each token is staged and
   * encoded by its append, so only the sink block stays in the residual; a
   * rewrite of an encoded sink updates its copy. */
  kvc_codec k4 = codec_of(KVC_DTYPE_INT4, KVC_SCALE_PER_TOKEN, 0, 0);
  kvc_pool_config ct = test_config(layers, 2, 8, 16, 64);
  ct.k_codec = &k4;
  ct.v_codec = &k4;
  ct.residual_sinks = 1;
  ASSERT_OK(kvc_pool_create(&ct, &p));
  ASSERT_OK(kvc_seq_create(p, 1));
  for (uint64_t pos = 0; pos < 20; ++pos) append_rows(p, 1, pos, layers, 0.0f);
  st = get_stats(p);
  assert_int_equal(st.residual_blocks_used, 1);
  assert_int_equal(st.blocks_used, layers * 2);
  assert_sinks_exact(p, 1, layers, 0, 1, 0.0f);
  assert_true(moved_elements(p, 1, 1, 0.0f) > 8);
  {
    float k0[16], v0[16];
    sink_rows(0, 2.0f, k0, v0);
    for (uint32_t l = 0; l < layers; ++l) ASSERT_OK(kvc_append(p, 1, l, 0, 1, k0, v0, KVC_DTYPE_F32));
  }
  assert_sinks_exact(p, 1, layers, 0, 1, 2.0f);
  /* Eviction and the prefix cache refuse a pool with sinks, nothing changed. */
  kvc_policy_config pcfg;
  kvc_policy_config_init(&pcfg);
  pcfg.kind = KVC_POLICY_STREAMING;
  pcfg.budget_tokens = 8;
  pcfg.sink_tokens = 2;
  kvc_policy *pol = NULL;
  ASSERT_OK(kvc_policy_create(&pcfg, &pol));
  assert_int_equal(kvc_evict(p, 1, pol, NULL), KVC_ERR_UNSUPPORTED);
  assert_non_null(strstr(kvc_last_error_message(), "attention sinks"));
  kvc_policy_destroy(pol);
  uint64_t nt = 0;
  ASSERT_OK(kvc_seq_layer_tokens(p, 1, 0, &nt));
  assert_int_equal(nt, 20);
  kvc_prefix_config pc;
  kvc_prefix_config_init(&pc);
  assert_int_equal(kvc_pool_enable_prefix_cache(p, &pc), KVC_ERR_UNSUPPORTED);
  kvc_pool_destroy(p);

  /* Bad settings. */
  kvc_pool_config bad = c;
  bad.residual_sinks = 17; /* above block_size */
  assert_int_equal(kvc_pool_create(&bad, &p), KVC_ERR_INVALID_ARGUMENT);
  bad = test_config(layers, 2, 8, 16, 64);
  bad.residual_sinks = 1; /* f32 K and V: nothing is encoded */
  assert_int_equal(kvc_pool_create(&bad, &p), KVC_ERR_INVALID_ARGUMENT);
  assert_non_null(strstr(kvc_last_error_message(), "residual_sinks"));
}

/* Scales shared by tokens leave the attention sinks out (they are read from
 * their copies). Per-channel int4 keys over groups of 16 with one sink whose
 * key is 100x the others: the other 15 tokens keep half a step of their own
 * range (without sinks, the sink's range makes them 15 such steps off); per-tensor
 * int8: the first write's scale is the non-sink rows' absmax / 127 (1 / 127,
 * not 50 / 127), unless that write holds the sink alone. */
static float sink_test_key(uint64_t t, int e) {
  if (t == 0) return (e % 2 ? -100.0f : 100.0f) * (1.0f + 0.01f * (float)e);
  return sinf(0.7f * (float)t + 1.3f * (float)e);
}

static void test_sinks_leave_shared_scales(void **state) {
  (void)state;
  kvc_codec k = codec_of(KVC_DTYPE_INT4, KVC_SCALE_PER_CHANNEL, 16, 1);
  kvc_codec v = codec_of(KVC_DTYPE_INT4, KVC_SCALE_PER_TOKEN, 0, 0);
  for (int sinks = 0; sinks <= 1; ++sinks) {
    kvc_pool_config c = test_config(1, 2, 8, 16, 8);
    c.k_codec = &k;
    c.v_codec = &v;
    c.residual_sinks = (uint32_t)sinks;
    kvc_pool *p = NULL;
    ASSERT_OK(kvc_pool_create(&c, &p));
    ASSERT_OK(kvc_seq_create(p, 1));
    float kin[16 * 16], vin[16 * 16], kout[16 * 16], vout[16 * 16];
    for (uint64_t t = 0; t < 16; ++t)
      for (int e = 0; e < 16; ++e) {
        kin[t * 16 + e] = sink_test_key(t, e);
        vin[t * 16 + e] = 0.25f * (float)(e % 5) - 0.5f;
      }
    ASSERT_OK(kvc_seq_reserve(p, 1, 16, NULL));
    ASSERT_OK(kvc_append(p, 1, 0, 0, 16, kin, vin, KVC_DTYPE_F32));
    assert_int_equal(get_stats(p).blocks_used, 1); /* the group is encoded */
    ASSERT_OK(kvc_gather(p, 1, 0, 0, 16, kout, vout, KVC_DTYPE_F32, NULL));
    double worst = 0.0; /* error of tokens 1..15 in steps of their own range */
    for (int e = 0; e < 16; ++e) {
      float lo = kin[16 + e], hi = lo;
      for (uint64_t t = 2; t < 16; ++t) {
        lo = fminf(lo, kin[t * 16 + e]);
        hi = fmaxf(hi, kin[t * 16 + e]);
      }
      const double step = ((double)hi - lo) / 15.0;
      for (uint64_t t = 1; t < 16; ++t) {
        const double err = fabs((double)kout[t * 16 + e] - kin[t * 16 + e]) / step;
        if (err > worst) worst = err;
      }
      if (sinks) assert_float_equal(kout[e], f16_round(kin[e]), 0.0f);
    }
    if (sinks) /* half a step, plus the f16 staging of the rows (2.5e-4 of a value at most) */
      assert_true(worst <= 0.5 + 0.01);
    else
      assert_true(worst > 5.0); /* the sink's range sets the step */
    kvc_pool_destroy(p);
  }

  kvc_codec t8 = codec_of(KVC_DTYPE_INT8, KVC_SCALE_PER_TENSOR, 0, 0);
  for (int pass = 0; pass < 3; ++pass) { /* sinks with a 4-token write, without, with the sink alone */
    kvc_pool_config c = test_config(1, 2, 8, 16, 8);
    c.k_codec = &t8;
    c.v_codec = &t8;
    c.residual_sinks = pass == 1 ? 0 : 1;
    kvc_pool *p = NULL;
    ASSERT_OK(kvc_pool_create(&c, &p));
    ASSERT_OK(kvc_seq_create(p, 1));
    float kin[4 * 16], kout[4 * 16];
    for (uint64_t t = 0; t < 4; ++t)
      for (int e = 0; e < 16; ++e) kin[t * 16 + e] = t == 0 ? -50.0f : (float)((int)(t * 16 + e) % 9 - 4) / 4.0f;
    const uint64_t first = pass == 2 ? 1 : 4;
    ASSERT_OK(kvc_seq_reserve(p, 1, 4, NULL));
    ASSERT_OK(kvc_append(p, 1, 0, 0, first, kin, kin, KVC_DTYPE_F32));
    if (first < 4) ASSERT_OK(kvc_append(p, 1, 0, first, 4 - first, kin + first * 16, kin + first * 16, KVC_DTYPE_F32));
    float ks = 0.0f, vs = 0.0f;
    ASSERT_OK(kvc_pool_tensor_scales(p, 0, &ks, &vs));
    const float want = (pass == 0 ? 1.0f : 50.0f) / 127.0f;
    assert_true(fabsf(ks - want) <= 1e-6f * want);
    assert_true(vs == ks);
    ASSERT_OK(kvc_gather(p, 1, 0, 0, 4, kout, NULL, KVC_DTYPE_F32, NULL));
    for (int i = 0; i < 4 * 16; ++i) assert_true(fabsf(kout[i] - kin[i]) <= 0.5f * ks * 1.0001f);
    kvc_pool_destroy(p);
  }
}

/* A reserve's positions written newest first: the append of the newest
 * positions must not encode (age) the older ones it did not write, which
 * were still legal to write (per-channel keys: once encoded they are refused
 * and their group holds whatever the slots held). They age in the append that
 * covers the whole reserve, or at the next reserve; tokens before the last
 * reserve still age at once. */
static void test_append_out_of_order_no_early_aging(void **state) {
  (void)state;
  kvc_codec k = codec_of(KVC_DTYPE_INT8, KVC_SCALE_PER_CHANNEL, 16, 1);
  kvc_codec v = codec_of(KVC_DTYPE_INT8, KVC_SCALE_PER_TOKEN, 0, 0);
  kvc_pool *p = residual_pool(&k, &v, 0, 0.0, 64, 1);
  ASSERT_OK(kvc_seq_create(p, 1));
  float kin[48 * 16], vin[48 * 16], out[48 * 16];
  for (int i = 0; i < 48 * 16; ++i) {
    kin[i] = sinf(0.13f * (float)i);
    vin[i] = cosf(0.07f * (float)i);
  }
  ASSERT_OK(kvc_seq_reserve(p, 1, 32, NULL));
  ASSERT_OK(kvc_append(p, 1, 0, 16, 16, kin + 16 * 16, vin + 16 * 16, KVC_DTYPE_F32)); /* newest half first */
  kvc_stats st = get_stats(p);
  assert_int_equal(st.blocks_used, 0); /* positions 0..15 not written: nothing aged */
  ASSERT_OK(kvc_append(p, 1, 0, 0, 16, kin, vin, KVC_DTYPE_F32));
  ASSERT_OK(kvc_gather(p, 1, 0, 0, 32, out, NULL, KVC_DTYPE_F32, NULL));
  for (int i = 0; i < 32 * 16; ++i) assert_true(fabsf(out[i] - kin[i]) <= 1e-3f); /* still f16 */
  /* The next reserve ages both groups; a newest-first write of its own
   * positions then ages nothing more, the covering write does. */
  ASSERT_OK(kvc_seq_reserve(p, 1, 16, NULL));
  st = get_stats(p);
  assert_int_equal(st.blocks_used, 2);
  ASSERT_OK(kvc_append(p, 1, 0, 40, 8, kin + 40 * 16, vin + 40 * 16, KVC_DTYPE_F32));
  ASSERT_OK(kvc_append(p, 1, 0, 32, 8, kin + 32 * 16, vin + 32 * 16, KVC_DTYPE_F32));
  st = get_stats(p);
  assert_int_equal(st.residual_blocks_used, 1);
  ASSERT_OK(kvc_append(p, 1, 0, 32, 16, kin + 32 * 16, vin + 32 * 16, KVC_DTYPE_F32));
  st = get_stats(p);
  assert_int_equal(st.residual_blocks_used, 0);
  assert_int_equal(st.blocks_used, 3);
  ASSERT_OK(kvc_gather(p, 1, 0, 0, 48, out, NULL, KVC_DTYPE_F32, NULL));
  for (int i = 0; i < 48 * 16; ++i) assert_true(fabsf(out[i] - kin[i]) <= 2.0f / 255.0f); /* int8 asym, range 2 */
  kvc_pool_destroy(p);
}

/* Hybrid: the newest quarter of the sequence in f16, older tokens in int4;
 * tokens are re-encoded as they age and the bytes follow. */
static void test_hybrid_fraction(void **state) {
  (void)state;
  kvc_codec c = codec_of(KVC_DTYPE_INT4, KVC_SCALE_PER_GROUP, 16, 1);
  kvc_pool *p = residual_pool(&c, &c, 0, 0.25, 128, 1);
  ASSERT_OK(kvc_seq_create(p, 1));
  float k[16], v[16];
  uint64_t prev_lp = 0;
  for (uint64_t pos = 0; pos < 256; ++pos) {
    step(p, 1, pos, 1, k, v);
    /* Codec blocks grow as the sequence does: never more than 3/4 encoded. */
    size_t nb;
    ASSERT_OK(kvc_seq_block_table(p, 1, 0, NULL, 0, &nb));
    assert_true(nb * 16 <= (pos + 1) * 3 / 4 + 16);
    assert_true(nb >= prev_lp);
    prev_lp = nb;
  }
  kvc_stats st = get_stats(p);
  /* 256 tokens: 64 in the f16 residual (4 or 5 blocks), 192 in int4 (12 blocks). */
  assert_true(st.residual_blocks_used >= 4 && st.residual_blocks_used <= 5);
  assert_int_equal(st.blocks_used, 12);
  kvc_pool_layout l;
  kvc_pool_layout_init(&l);
  ASSERT_OK(kvc_pool_get_layout(p, &l));
  assert_non_null(l.residual_base);
  assert_int_equal(l.residual_block_stride, 16 * 16 * 2 * 2);
  assert_int_equal(l.residual_dtype, KVC_DTYPE_F16);
  assert_int_equal(st.bytes_in_use, st.blocks_used * l.block_stride + st.residual_blocks_used * l.residual_block_stride);
  assert_true(st.bytes_in_use < 256 * 16 * 2 * 2);
  kvc_pool_destroy(p);
}

/* A residual arena that runs out: a distinct status and nothing changed. */
static void test_residual_exhausted(void **state) {
  (void)state;
  kvc_codec c = codec_of(KVC_DTYPE_INT8, KVC_SCALE_PER_TOKEN, 0, 0);
  kvc_pool *p = residual_pool(&c, &c, 40, 0.0, 3, 1);
  ASSERT_OK(kvc_seq_create(p, 1));
  ASSERT_OK(kvc_seq_reserve(p, 1, 40, NULL)); /* 3 residual blocks */
  kvc_stats before = get_stats(p);
  /* Aging 10 leaves 40 staged tokens from slot 10 on: 4 residual blocks, of
   * 3 in the pool. Nothing anyone frees changes that: never, not "not now". */
  ASSERT_STATUS(KVC_ERR_EXCEEDS_CAPACITY, kvc_seq_reserve(p, 1, 10, NULL));
  assert_non_null(strstr(kvc_last_error_message(), "residual"));
  kvc_stats after = get_stats(p);
  assert_memory_equal(&before, &after, sizeof before);
  kvc_pool_destroy(p);
  /* Bad residual settings. */
  kvc_pool_config cfg = test_config(1, 2, 8, 16, 8);
  cfg.residual_window = 8; /* no quantized codec */
  p = NULL;
  ASSERT_STATUS(KVC_ERR_INVALID_ARGUMENT, kvc_pool_create(&cfg, &p));
  cfg.k_codec = &c;
  cfg.residual_fraction = 1.0;
  ASSERT_STATUS(KVC_ERR_INVALID_ARGUMENT, kvc_pool_create(&cfg, &p));
  cfg.residual_fraction = NAN;
  ASSERT_STATUS(KVC_ERR_INVALID_ARGUMENT, kvc_pool_create(&cfg, &p));
  cfg.residual_fraction = 0.5;
  cfg.residual_dtype = KVC_DTYPE_INT4; /* int8 rows are a residual dtype (0.4); int4 is not */
  ASSERT_STATUS(KVC_ERR_INVALID_ARGUMENT, kvc_pool_create(&cfg, &p));
  assert_null(p);
}

/* Regressions found by attacking the API with bad input. */
static void test_adversarial_regressions(void **state) {
  (void)state;
  /* Both parts per channel with different groups: refused (not a buffer overrun). */
  kvc_codec kk = codec_of(KVC_DTYPE_INT8, KVC_SCALE_PER_CHANNEL, 4, 0);
  kvc_codec vv = codec_of(KVC_DTYPE_INT8, KVC_SCALE_PER_CHANNEL, 8, 0);
  assert_null(codec_pool(1, 1, 8, 8, 4, &kk, &vv, KVC_ERR_INVALID_ARGUMENT));
  /* struct_size ending inside the k_codec pointer: refused (0.4; it took the
   * field's default before), naming the field; ending before it, the codec
   * is not read. */
  kvc_codec c8 = codec_of(KVC_DTYPE_INT8, KVC_SCALE_PER_TOKEN, 0, 0);
  kvc_pool_config cfg = test_config(1, 2, 8, 16, 4);
  cfg.k_codec = &c8;
  cfg.struct_size = offsetof(kvc_pool_config, k_codec) + 4;
  kvc_pool *p = NULL;
  ASSERT_STATUS(KVC_ERR_STRUCT_SIZE, kvc_pool_create(&cfg, &p));
  assert_non_null(strstr(kvc_last_error_message(), "k_codec"));
  assert_null(p);
  cfg.struct_size = offsetof(kvc_pool_config, k_codec);
  ASSERT_OK(kvc_pool_create(&cfg, &p));
  kvc_pool_layout l;
  kvc_pool_layout_init(&l);
  ASSERT_OK(kvc_pool_get_layout(p, &l));
  assert_int_equal(l.k_dtype, KVC_DTYPE_F32); /* the codec was not read */
  kvc_pool_destroy(p);
  /* A float codec sets the storage dtype. */
  cfg = test_config(1, 2, 8, 16, 4);
  kvc_codec fc = codec_of(KVC_DTYPE_BF16, KVC_SCALE_NONE, 0, 0);
  cfg.k_codec = &fc;
  ASSERT_OK(kvc_pool_create(&cfg, &p));
  ASSERT_OK(kvc_pool_get_layout(p, &l));
  assert_int_equal(l.k_dtype, KVC_DTYPE_BF16);
  kvc_pool_destroy(p);
  /* A finite value beyond f16 in a residual window saturates, never NaN. */
  kvc_codec i8 = codec_of(KVC_DTYPE_INT8, KVC_SCALE_PER_TOKEN, 0, 0);
  p = residual_pool(&i8, &i8, 2, 0.0, 16, 1);
  ASSERT_OK(kvc_seq_create(p, 1));
  float row[16], out[16];
  for (int i = 0; i < 16; ++i) row[i] = 1.0f;
  row[0] = 1e6f;
  for (int t = 0; t < 6; ++t) {
    ASSERT_OK(kvc_seq_reserve(p, 1, 1, NULL));
    ASSERT_OK(kvc_append(p, 1, 0, (uint64_t)t, 1, row, row, KVC_DTYPE_F32));
  }
  ASSERT_OK(kvc_gather(p, 1, 0, 0, 1, out, NULL, KVC_DTYPE_F32, NULL)); /* aged into int8 */
  for (int i = 0; i < 16; ++i) assert_true(isfinite(out[i]));
  assert_true(out[0] > 60000.0f);
  kvc_pool_destroy(p);
  /* Asymmetric range beyond float, tiny values, f16 static scales. */
  kvc_codec a8 = codec_of(KVC_DTYPE_INT8, KVC_SCALE_PER_TOKEN, 0, 1);
  float big[8] = {-3e38f, 3e38f, 1, 2, 3, 4, 5, 6}, tiny[8] = {1e-37f, 0, 0, 0, 0, 0, 0, -2e-38f};
  uint8_t codes[8], sc[8], zr[8];
  float back[8];
  ASSERT_OK(kvc_quantize(&a8, big, KVC_DTYPE_F32, 1, 8, codes, sc, zr));
  ASSERT_OK(kvc_dequantize(&a8, codes, sc, zr, 1, 8, back, KVC_DTYPE_F32));
  for (int i = 0; i < 8; ++i) assert_true(isfinite(back[i]));
  kvc_codec s8 = codec_of(KVC_DTYPE_INT8, KVC_SCALE_PER_TOKEN, 0, 0);
  ASSERT_OK(kvc_quantize(&s8, tiny, KVC_DTYPE_F32, 1, 8, codes, sc, NULL));
  ASSERT_OK(kvc_dequantize(&s8, codes, sc, NULL, 1, 8, back, KVC_DTYPE_F32));
  for (int i = 0; i < 8; ++i) {
    assert_true(isfinite(back[i]));
    assert_true(fabsf(back[i] - tiny[i]) <= 0.5f * 1.17549435e-38f * 1.001f); /* scale floored at FLT_MIN */
  }
  assert_true(back[1] == 0.0f);
  kvc_codec st = codec_of(KVC_DTYPE_INT8, KVC_SCALE_PER_TENSOR, 0, 0);
  st.static_scale = 1;
  st.scale_dtype = KVC_DTYPE_F16;
  st.scale = 1e5;
  ASSERT_STATUS(KVC_ERR_INVALID_SCALE, kvc_quantize(&st, tiny, KVC_DTYPE_F32, 1, 8, codes, sc, NULL));
  st.scale = 0.1; /* not exact in f16: used as stored */
  float x[8] = {0.3f, -0.2f, 0.1f, 12.7f, 0, 0, 0, 0};
  ASSERT_OK(kvc_quantize(&st, x, KVC_DTYPE_F32, 1, 8, codes, sc, NULL));
  ASSERT_OK(kvc_dequantize(&st, codes, sc, NULL, 1, 8, back, KVC_DTYPE_F32));
  for (int i = 0; i < 8; ++i) assert_true(fabsf(back[i] - x[i]) <= 0.05f + 1e-6f);
  /* A static scale with the wrong granularity is an argument error. */
  st = codec_of(KVC_DTYPE_INT8, KVC_SCALE_PER_TOKEN, 0, 0);
  st.static_scale = 1;
  st.scale = 1.0;
  kvc_quant_sizes qs;
  kvc_quant_sizes_init(&qs);
  ASSERT_STATUS(KVC_ERR_INVALID_ARGUMENT, kvc_quantize_sizes(&st, 1, 8, &qs));
  /* Sizes that overflow are refused. */
  ASSERT_STATUS(KVC_ERR_OVERFLOW, kvc_quantize_sizes(&s8, (uint64_t)1 << 40, (uint64_t)1 << 24, &qs));
  kvc_codec g1 = codec_of(KVC_DTYPE_INT4, KVC_SCALE_PER_GROUP, 1, 1);
  ASSERT_STATUS(KVC_ERR_OVERFLOW, kvc_quantize_sizes(&g1, (uint64_t)1 << 40, (uint64_t)1 << 22, &qs));
  /* A per-tensor scale is not fixed by an all-zero first write. */
  kvc_codec pt = codec_of(KVC_DTYPE_INT8, KVC_SCALE_PER_TENSOR, 0, 0);
  p = codec_pool(1, 1, 4, 4, 4, &pt, &pt, KVC_OK);
  ASSERT_OK(kvc_seq_create(p, 1));
  ASSERT_OK(kvc_seq_reserve(p, 1, 2, NULL));
  float zero4[4] = {0, 0, 0, 0}, some[4] = {0.3f, -0.2f, 0.1f, 0.4f}, got[4];
  ASSERT_OK(kvc_append(p, 1, 0, 0, 1, zero4, zero4, KVC_DTYPE_F32));
  ASSERT_OK(kvc_append(p, 1, 0, 1, 1, some, some, KVC_DTYPE_F32));
  ASSERT_OK(kvc_gather(p, 1, 0, 0, 1, got, NULL, KVC_DTYPE_F32, NULL));
  for (int i = 0; i < 4; ++i) assert_true(got[i] == 0.0f);
  ASSERT_OK(kvc_gather(p, 1, 0, 1, 1, got, NULL, KVC_DTYPE_F32, NULL));
  for (int i = 0; i < 4; ++i) assert_true(fabsf(got[i] - some[i]) <= 0.4f / 127.0f);
  kvc_pool_destroy(p);
  /* kvc_dtype_size names the storage formats. */
  size_t b;
  ASSERT_STATUS(KVC_ERR_INVALID_ARGUMENT, kvc_dtype_size(KVC_DTYPE_INT4, &b));
  assert_non_null(strstr(kvc_last_error_message(), "kvc_quantize_sizes"));
}

/* Second adversarial review (fused paths): rotation overflow, bf16 residual
 * saturation, symmetric int8 at +-FLT_MAX, f16-rounded static scales in pools. */
static void test_adversarial_regressions_2(void **state) {
  (void)state;
  /* The Hadamard butterfly of values near FLT_MAX would overflow: refused,
   * nothing written (standalone and append). */
  kvc_codec h = codec_of(KVC_DTYPE_INT8, KVC_SCALE_PER_TOKEN, 0, 0);
  h.rotation = KVC_ROTATION_HADAMARD;
  h.rotation_block = 8;
  float big[8];
  for (int i = 0; i < 8; ++i) big[i] = 1e38f;
  uint8_t codes[8] = {0xa5, 0xa5, 0xa5, 0xa5, 0xa5, 0xa5, 0xa5, 0xa5}, sc[4] = {0xa5, 0xa5, 0xa5, 0xa5};
  ASSERT_STATUS(KVC_ERR_NON_FINITE, kvc_quantize(&h, big, KVC_DTYPE_F32, 1, 8, codes, sc, NULL));
  assert_non_null(strstr(kvc_last_error_message(), "input[0][0] (1e+38) is too large to rotate"));
  for (int i = 0; i < 8; ++i) assert_int_equal(codes[i], 0xa5);
  for (int i = 0; i < 4; ++i) assert_int_equal(sc[i], 0xa5);
  big[0] = 1e36f; /* below FLT_MAX / 8 everywhere: fine, and finite back */
  for (int i = 1; i < 8; ++i) big[i] = -1e36f;
  float back[8];
  ASSERT_OK(kvc_quantize(&h, big, KVC_DTYPE_F32, 1, 8, codes, sc, NULL));
  ASSERT_OK(kvc_dequantize(&h, codes, sc, NULL, 1, 8, back, KVC_DTYPE_F32));
  for (int i = 0; i < 8; ++i) assert_true(isfinite(back[i]));
  for (int i = 0; i < 8; ++i) big[i] = 1e38f;
  kvc_pool *p = codec_pool(1, 1, 8, 4, 4, &h, &h, KVC_OK);
  ASSERT_OK(kvc_seq_create(p, 1));
  ASSERT_OK(kvc_seq_reserve(p, 1, 1, NULL));
  ASSERT_STATUS(KVC_ERR_NON_FINITE, kvc_append(p, 1, 0, 0, 1, big, big, KVC_DTYPE_F32));
  assert_non_null(strstr(kvc_last_error_message(), "k[0][0][0] (1e+38) is too large to rotate"));
  const float fine[8] = {1, 2, 3, 4, 5, 6, 7, 8}; /* K fine: V is named */
  ASSERT_STATUS(KVC_ERR_NON_FINITE, kvc_append(p, 1, 0, 0, 1, fine, big, KVC_DTYPE_F32));
  assert_non_null(strstr(kvc_last_error_message(), "v[0][0][0] (1e+38) is too large to rotate"));
  kvc_pool_destroy(p);
  /* A bf16 residual saturates at the largest finite bf16, never Inf / NaN. */
  kvc_codec i8 = codec_of(KVC_DTYPE_INT8, KVC_SCALE_PER_TOKEN, 0, 0);
  kvc_pool_config c = test_config(1, 2, 8, 16, 64);
  c.k_codec = &i8;
  c.v_codec = &i8;
  c.residual_window = 1;
  c.residual_dtype = KVC_DTYPE_BF16;
  ASSERT_OK(kvc_pool_create(&c, &p));
  ASSERT_OK(kvc_seq_create(p, 1));
  float row[16], out[16];
  for (int i = 0; i < 16; ++i) row[i] = 1.0f;
  row[0] = 3.4028235e38f;
  for (int t = 0; t < 3; ++t) {
    ASSERT_OK(kvc_seq_reserve(p, 1, 1, NULL));
    ASSERT_OK(kvc_append(p, 1, 0, (uint64_t)t, 1, row, row, KVC_DTYPE_F32));
    ASSERT_OK(kvc_gather(p, 1, 0, (uint64_t)t, 1, out, NULL, KVC_DTYPE_F32, NULL)); /* residual */
    for (int i = 0; i < 16; ++i) assert_true(isfinite(out[i]));
  }
  ASSERT_OK(kvc_gather(p, 1, 0, 0, 1, out, NULL, KVC_DTYPE_F32, NULL)); /* aged into int8 */
  for (int i = 0; i < 16; ++i) assert_true(isfinite(out[i]));
  kvc_pool_destroy(p);
  /* Symmetric int8 at +-FLT_MAX: finite codes and values (saturating at 1e38). */
  kvc_codec s8 = codec_of(KVC_DTYPE_INT8, KVC_SCALE_PER_TOKEN, 0, 0);
  float ext[2] = {-3.4028235e38f, 1.0f}, ext_back[2];
  uint8_t c2[2], s2[4];
  ASSERT_OK(kvc_quantize(&s8, ext, KVC_DTYPE_F32, 1, 2, c2, s2, NULL));
  ASSERT_OK(kvc_dequantize(&s8, c2, s2, NULL, 1, 2, ext_back, KVC_DTYPE_F32));
  assert_true(isfinite(ext_back[0]) && ext_back[0] <= -9.9e37f);
  /* A static scale with f16 scale_dtype is the f16 value in a pool too. */
  kvc_codec st = codec_of(KVC_DTYPE_INT8, KVC_SCALE_PER_TENSOR, 0, 0);
  st.static_scale = 1;
  st.scale = 0.1;
  st.scale_dtype = KVC_DTYPE_F16;
  p = codec_pool(1, 1, 8, 4, 4, &st, &st, KVC_OK);
  float ks = 0, vs = 0;
  ASSERT_OK(kvc_pool_tensor_scales(p, 0, &ks, &vs));
  assert_true(ks == 0.0999755859375f && vs == ks);
  ASSERT_OK(kvc_seq_create(p, 1));
  ASSERT_OK(kvc_seq_reserve(p, 1, 1, NULL));
  float x[8] = {1.25f, -0.5f, 0, 0, 0, 0, 0, 0}, from_pool[8], standalone[8];
  ASSERT_OK(kvc_append(p, 1, 0, 0, 1, x, x, KVC_DTYPE_F32));
  ASSERT_OK(kvc_gather(p, 1, 0, 0, 1, from_pool, NULL, KVC_DTYPE_F32, NULL));
  uint8_t q8[8], qs[2];
  ASSERT_OK(kvc_quantize(&st, x, KVC_DTYPE_F32, 1, 8, q8, qs, NULL));
  ASSERT_OK(kvc_dequantize(&st, q8, qs, NULL, 1, 8, standalone, KVC_DTYPE_F32));
  assert_memory_equal(from_pool, standalone, sizeof from_pool);
  kvc_pool_destroy(p);
}

int main(int argc, char **argv) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_adversarial_regressions_2), cmocka_unit_test(test_full_range),
      cmocka_unit_test(test_full_range_tensor_pool),
      cmocka_unit_test(test_int8_block_bytes),     cmocka_unit_test(test_int3_pool),
      cmocka_unit_test(test_pre_rope_keys),
           cmocka_unit_test(test_static_scales),
      cmocka_unit_test(test_fp8_saturates),        cmocka_unit_test(test_int8_zero_token),
      cmocka_unit_test(test_int4_hd96_groups),     cmocka_unit_test(test_nonfinite_append),
      cmocka_unit_test(test_all_codecs_roundtrip), cmocka_unit_test(test_standalone_quantizer),
      cmocka_unit_test(test_pool_codec_errors),    cmocka_unit_test(test_kivi_residual),
      cmocka_unit_test(test_kchannel_ages_on_append),      cmocka_unit_test(test_residual_sinks),
      cmocka_unit_test(test_sinks_leave_shared_scales),
      cmocka_unit_test(test_append_out_of_order_no_early_aging),
      cmocka_unit_test(test_hybrid_fraction),      cmocka_unit_test(test_residual_exhausted),
      cmocka_unit_test(test_adversarial_regressions),
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
  return cmocka_run_group_tests_name("codec_api", tests, NULL, NULL);
}
