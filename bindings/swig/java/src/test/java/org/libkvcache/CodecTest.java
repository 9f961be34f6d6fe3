package org.libkvcache;

import static org.junit.Assert.assertArrayEquals;
import static org.junit.Assert.assertEquals;
import static org.junit.Assert.assertThrows;
import static org.junit.Assert.assertTrue;
import static org.libkvcache.TestData.*;

import java.nio.ByteBuffer;
import java.nio.ByteOrder;
import org.junit.Test;

public class CodecTest {
  /** int8 per token: quantize, dequantize, every value within half a step (scale / 2) of its input. */
  @Test
  public void int8PerTokenWithinHalfAStep() {
    final int rows = 32, d = HEAD_DIM;
    Codec c = new Codec(); // defaults: int8, per token, f32 scales, symmetric
    assertEquals(Kvc.DTYPE_INT8, c.getDtype());
    assertEquals(Kvc.SCALE_PER_TOKEN, c.getGranularity());
    QuantSizes s = c.sizes(rows, d);
    assertEquals(rows * d, s.getCodesBytes());
    assertEquals(rows * 4, s.getScalesBytes());
    assertEquals(0, s.getZerosBytes());

    float[] src = random(rows * d, 500);
    byte[] codes = new byte[(int) s.getCodesBytes()];
    byte[] scales = new byte[(int) s.getScalesBytes()];
    assertEquals(rows, c.quantize(src, Kvc.DTYPE_F32, d, codes, scales, null));
    float[] dst = new float[rows * d];
    c.dequantize(codes, scales, null, rows, d, dst, Kvc.DTYPE_F32);

    ByteBuffer sb = ByteBuffer.wrap(scales).order(ByteOrder.LITTLE_ENDIAN);
    for (int r = 0; r < rows; ++r) {
      float scale = sb.getFloat(4 * r);
      assertTrue(scale > 0);
      for (int j = 0; j < d; ++j) {
        int i = r * d + j;
        assertTrue("row " + r + " col " + j, Math.abs(dst[i] - src[i]) <= scale / 2 * 1.0001f);
        assertEquals(Math.round(src[i] / scale), codes[i], 1); // code = round(x / scale), +-1 for ties
      }
    }

    // The same bytes through a direct ByteBuffer output.
    ByteBuffer codesBuf = ByteBuffer.allocateDirect(codes.length);
    ByteBuffer scalesBuf = ByteBuffer.allocateDirect(scales.length);
    assertEquals(rows, c.quantize(src, Kvc.DTYPE_F32, d, codesBuf, scalesBuf, null));
    byte[] codes2 = new byte[codes.length], scales2 = new byte[scales.length];
    codesBuf.get(codes2);
    scalesBuf.get(scales2);
    assertArrayEquals(codes, codes2);
    assertArrayEquals(scales, scales2);
  }

  /**
   * A second call path: a pool whose K and V codec is the same int8 codec
   * stores K/V rows ([token][kv head] rows of head_dim) as the standalone
   * quantizer does, so gather() gives what dequantize(quantize()) gives.
   */
  @Test
  public void poolCodecMatchesStandaloneQuantizer() {
    final int n = 16;
    Codec c = new Codec();
    float[] k = random(n * ROW, 600), v = random(n * ROW, 601);
    try (Pool pool = new Pool(config(), c, c)) {
      pool.seqCreate(1);
      pool.reserve(1, n);
      pool.append(1, 0, 0, k, v);
      float[] ko = new float[n * ROW], vo = new float[n * ROW];
      pool.gather(1, 0, 0, ko, vo);

      int rows = n * KV_HEADS;
      QuantSizes s = c.sizes(rows, HEAD_DIM);
      for (float[][] pair : new float[][][] {{k, ko}, {v, vo}}) {
        byte[] codes = new byte[(int) s.getCodesBytes()], scales = new byte[(int) s.getScalesBytes()];
        c.quantize(pair[0], Kvc.DTYPE_F32, HEAD_DIM, codes, scales, null);
        float[] want = new float[n * ROW];
        c.dequantize(codes, scales, null, rows, HEAD_DIM, want, Kvc.DTYPE_F32);
        assertArrayEquals(want, pair[1], 0f);
      }
    }
  }

  /**
   * Per-channel key smoothing (Pool.setKeySmoothing): the pool's keys are the standalone
   * quantizer's codes of (k - offset) / scale, decoded and un-smoothed; a pool holding a sequence
   * refuses a new smoothing.
   */
  @Test
  public void keySmoothingMatchesStandaloneQuantizer() {
    final int n = 16;
    Codec c = new Codec();
    float[] scale = new float[LAYERS * ROW], offset = new float[LAYERS * ROW];
    for (int i = 0; i < scale.length; ++i) {
      scale[i] = 0.5f + i % 7;
      offset[i] = i % 5 - 2;
    }
    float[] k = random(n * ROW, 610), v = random(n * ROW, 611);
    try (Pool pool = new Pool(config(), c, null)) {
      pool.setKeySmoothing(scale, offset);
      pool.seqCreate(1);
      pool.reserve(1, n);
      pool.append(1, 1, 0, k, v);
      float[] ko = new float[n * ROW], vo = new float[n * ROW];
      pool.gather(1, 1, 0, ko, vo);
      float[] y = new float[n * ROW];
      for (int i = 0; i < y.length; ++i) y[i] = (k[i] - offset[ROW + i % ROW]) / scale[ROW + i % ROW];
      int rows = n * KV_HEADS;
      QuantSizes s = c.sizes(rows, HEAD_DIM);
      byte[] codes = new byte[(int) s.getCodesBytes()], scales = new byte[(int) s.getScalesBytes()];
      c.quantize(y, Kvc.DTYPE_F32, HEAD_DIM, codes, scales, null);
      float[] dec = new float[n * ROW];
      c.dequantize(codes, scales, null, rows, HEAD_DIM, dec, Kvc.DTYPE_F32);
      for (int i = 0; i < dec.length; ++i)
        assertEquals("key " + i, dec[i] * scale[ROW + i % ROW] + offset[ROW + i % ROW], ko[i], 1e-5f);
      KvcException e = assertThrows(KvcException.class, () -> pool.setKeySmoothing(scale, null));
      assertEquals(Kvc.ERR_INVALID_ARGUMENT, e.status());
    }
  }

  /** Codec outliers: a spike per head no longer stretches the other values' step in a pool. */
  @Test
  public void outliersKeepTheOtherValuesStep() {
    final int n = 8;
    float[] k = random(n * ROW, 620);
    for (int i = 0; i < n * KV_HEADS; ++i) k[i * HEAD_DIM + 5] = 40f;
    double[] errs = new double[2];
    for (int j = 0; j < 2; ++j) {
      Codec c = new Codec();
      c.setDtype(Kvc.DTYPE_INT4);
      c.setOutliers(j * 2);
      try (Pool pool = new Pool(config(), c, null)) {
        pool.seqCreate(1);
        pool.reserve(1, n);
        pool.append(1, 0, 0, k, k);
        float[] ko = new float[n * ROW], vo = new float[n * ROW];
        pool.gather(1, 0, 0, ko, vo);
        for (int i = 0; i < ko.length; ++i)
          if (i % HEAD_DIM != 5) errs[j] = Math.max(errs[j], Math.abs(ko[i] - k[i]));
      }
    }
    assertTrue(errs[0] + " " + errs[1], errs[1] * 5 < errs[0]);
    Codec c = new Codec();
    c.setDtype(Kvc.DTYPE_INT4);
    c.setOutliers(1);
    KvcException e = assertThrows(KvcException.class, () -> c.sizes(2, 64));
    assertEquals(Kvc.ERR_UNSUPPORTED, e.status());
  }

  /** The codebook rule for one group of g values from off: decoded (level nearest x / e, the norm kept). */
  private static void codebookGroup(float[] x, int off, int g, float[] lv, float[] out) {
    float e = 0f, a = 0f;
    for (int j = 0; j < g; ++j)
      if (Math.abs(x[off + j]) > a) {
        a = Math.abs(x[off + j]);
        e = x[off + j];
      }
    final float inv = e != 0f ? 1.0f / e : 0f;
    int[] code = new int[g];
    double xx = 0.0, cc = 0.0;
    for (int j = 0; j < g; ++j) {
      final float y = x[off + j] * inv;
      int c = 0;
      for (int i = 0; i + 1 < lv.length; ++i) c += y > (lv[i] + lv[i + 1]) * 0.5f ? 1 : 0;
      code[j] = c;
      xx += (double) x[off + j] * x[off + j];
      cc += (double) lv[c] * lv[c];
    }
    float sc = cc > 0.0 ? (float) Math.sqrt(xx / cc) : 0f;
    if (e < 0f) sc = -sc;
    for (int j = 0; j < g; ++j) out[off + j] = lv[code[j]] * sc;
  }

  /**
   * Codebooks (Pool.setCodebook, Kvc.codebookGaussian): the built-in levels ascend in [-1, 1]; an
   * int3 pool with them reads each head's group back as its levels times a scale that keeps the
   * group's L2 norm (f32 scales); refusals throw KvcException; null removes a codebook.
   */
  @Test
  public void codebookKeepsGroupNorms() {
    for (int bits = 2; bits <= 4; ++bits) {
      float[] g = Kvc.codebookGaussian(bits, HEAD_DIM);
      assertEquals(1 << bits, g.length);
      for (int i = 0; i < g.length; ++i) {
        assertTrue(g[i] >= -1f && g[i] <= 1f);
        if (i > 0) assertTrue("bits " + bits + " level " + i, g[i] > g[i - 1]);
      }
      assertArrayEquals(g, Kvc.codebookGaussian(bits, 88), 0f); // nearer 64 than 128
    }
    KvcException e = assertThrows(KvcException.class, () -> Kvc.codebookGaussian(5, HEAD_DIM));
    assertEquals(Kvc.ERR_INVALID_ARGUMENT, e.status());
    e = assertThrows(KvcException.class, () -> Kvc.codebookGaussian(3, 0));
    assertEquals(Kvc.ERR_INVALID_ARGUMENT, e.status());

    final int n = 16;
    float[] lv = Kvc.codebookGaussian(3, HEAD_DIM);
    float[] levels = new float[LAYERS * lv.length];
    for (int l = 0; l < LAYERS; ++l) System.arraycopy(lv, 0, levels, l * lv.length, lv.length);
    Codec c = new Codec(); // int3, per token, f32 scales, symmetric
    c.setDtype(Kvc.DTYPE_INT3);
    float[] k = random(n * ROW, 630), v = random(n * ROW, 631);
    try (Pool pool = new Pool(config(), c, c); Pool plain = new Pool(config(), c, c)) {
      e = assertThrows(KvcException.class, () -> pool.setCodebook(2, levels));
      assertEquals(Kvc.ERR_INVALID_ARGUMENT, e.status());
      e = assertThrows(KvcException.class,
          () -> pool.setCodebook(1, java.util.Arrays.copyOf(levels, levels.length - 1)));
      assertEquals(Kvc.ERR_INVALID_ARGUMENT, e.status());
      float[] bad = levels.clone();
      bad[lv.length + 5] = bad[lv.length + 4];
      e = assertThrows(KvcException.class, () -> pool.setCodebook(1, bad));
      assertTrue(e.detail(), e.detail().contains("layer 1, level 5"));
      pool.setCodebook(1, levels);
      pool.setCodebook(0, levels);
      pool.setCodebook(0, null); // removed: the keys' uniform codes again
      for (Pool p : new Pool[] {pool, plain}) {
        p.seqCreate(1);
        p.reserve(1, n);
        p.append(1, 1, 0, k, v);
      }
      float[] ko = new float[n * ROW], vo = new float[n * ROW], ku = new float[n * ROW], vu = new float[n * ROW];
      pool.gather(1, 1, 0, ko, vo);
      plain.gather(1, 1, 0, ku, vu);
      assertArrayEquals(ku, ko, 0f);
      float[] want = new float[n * ROW];
      for (int i = 0; i < want.length; i += HEAD_DIM) codebookGroup(v, i, HEAD_DIM, lv, want);
      boolean differs = false;
      for (int i = 0; i < want.length; i += HEAD_DIM) {
        double a = 0.0, b = 0.0;
        for (int j = i; j < i + HEAD_DIM; ++j) {
          assertEquals("value " + j, want[j], vo[j], Math.abs(want[j]) * 1e-5f + 1e-6f);
          a += (double) v[j] * v[j];
          b += (double) vo[j] * vo[j];
          differs |= vo[j] != vu[j];
        }
        assertEquals("group " + i / HEAD_DIM + " norm", Math.sqrt(a), Math.sqrt(b), 1e-5 * Math.sqrt(a));
      }
      assertTrue("the codebook's values equal the uniform codes'", differs);
      e = assertThrows(KvcException.class, () -> pool.setCodebook(1, null));
      assertEquals(Kvc.ERR_INVALID_ARGUMENT, e.status());
      assertTrue(e.detail(), e.detail().contains("sequences"));
    }
    Codec asym = new Codec();
    asym.setDtype(Kvc.DTYPE_INT3);
    asym.setAsymmetric(1);
    try (Pool pool = new Pool(config(), asym, asym)) {
      e = assertThrows(KvcException.class, () -> pool.setCodebook(0, levels));
      assertEquals(Kvc.ERR_INVALID_ARGUMENT, e.status());
    }
  }

  /**
   * Per-layer codecs (Pool.withLayerCodecs, kvc_pool_config.layer_k_codecs / layer_v_codecs): a
   * pool with int4 keys in layer 1 and int8 elsewhere reads each layer back as a pool of that
   * layer's codecs alone; an empty values table keeps v_codec in every layer; a table of another
   * length and a quantized layer in a plain pool are refused.
   */
  @Test
  public void layerCodecsMatchUniformPools() {
    final int n = 16;
    Codec i8 = new Codec(), i4 = new Codec();
    i4.setDtype(Kvc.DTYPE_INT4);
    float[] k = random(n * ROW, 640), v = random(n * ROW, 641);
    try (Pool mixed = Pool.withLayerCodecs(config(), i8, i8, new CodecVector(new Codec[] {i8, i4}),
             new CodecVector());
         Pool int8 = new Pool(config(), i8, i8);
         Pool int4k = new Pool(config(), i4, i8)) {
      for (Pool p : new Pool[] {mixed, int8, int4k}) {
        p.seqCreate(1);
        p.reserve(1, n);
        for (int layer = 0; layer < LAYERS; ++layer) p.append(1, layer, 0, k, v);
      }
      for (int layer = 0; layer < LAYERS; ++layer) {
        float[] km = new float[n * ROW], vm = new float[n * ROW];
        float[] ku = new float[n * ROW], vu = new float[n * ROW];
        mixed.gather(1, layer, 0, km, vm);
        (layer == 1 ? int4k : int8).gather(1, layer, 0, ku, vu);
        assertArrayEquals(ku, km, 0f);
        assertArrayEquals(vu, vm, 0f);
      }
      float[] k8 = new float[n * ROW], k4 = new float[n * ROW], vv = new float[n * ROW];
      mixed.gather(1, 0, 0, k8, vv);
      mixed.gather(1, 1, 0, k4, vv);
      assertTrue(!java.util.Arrays.equals(k8, k4)); // layer 1's keys are int4 codes
      // each layer pays its own blocks
      assertEquals(
          (int8.stats().getBytesPerToken() + int4k.stats().getBytesPerToken()) / 2,
          mixed.stats().getBytesPerToken());
    }
    KvcException e = assertThrows(KvcException.class,
        () -> Pool.withLayerCodecs(config(), i8, i8, new CodecVector(new Codec[] {i8}), new CodecVector()));
    assertEquals(Kvc.ERR_INVALID_ARGUMENT, e.status());
    assertTrue(e.detail(), e.detail().contains("1 codecs for 2 layers"));
    Codec f16 = new Codec();
    f16.setDtype(Kvc.DTYPE_F16);
    f16.setGranularity(Kvc.SCALE_NONE);
    e = assertThrows(KvcException.class,
        () -> Pool.withLayerCodecs(config(), null, null, new CodecVector(new Codec[] {f16, i8}), new CodecVector()));
    assertEquals(Kvc.ERR_UNSUPPORTED, e.status());
  }

  @Test
  public void shortBuffersAreRefused() {
    Codec c = new Codec();
    try {
      c.quantize(random(64, 1), Kvc.DTYPE_F32, 64, new byte[63], new byte[4], null);
      throw new AssertionError("no exception");
    } catch (KvcException e) {
      assertEquals(Kvc.ERR_BUFFER_TOO_SMALL, e.status());
      assertTrue(e.detail(), e.detail().contains("codes"));
    }
  }

  /** quantize() / dequantize() refuse an array that does not hold the dtype they are given. */
  @Test
  public void arrayTypeMustMatchDtype() {
    final int rows = 4, d = HEAD_DIM;
    Codec c = new Codec();
    QuantSizes s = c.sizes(rows, d);
    float[] src = random(rows * d, 700);
    short[] half = new short[rows * d];
    byte[] codes = new byte[(int) s.getCodesBytes()], scales = new byte[(int) s.getScalesBytes()];
    IllegalArgumentException e = assertThrows(IllegalArgumentException.class,
        () -> c.quantize(src, Kvc.DTYPE_F16, d, codes, scales, null));
    assertTrue(e.getMessage(), e.getMessage().startsWith("src: float[]"));
    assertThrows(IllegalArgumentException.class, () -> c.quantize(src, Kvc.DTYPE_INT8, d, codes, scales, null));
    assertThrows(IllegalArgumentException.class, () -> c.quantize(half, Kvc.DTYPE_F32, d, codes, scales, null));

    assertEquals(rows, c.quantize(src, Kvc.DTYPE_F32, d, codes, scales, null));
    float[] dst = new float[rows * d];
    c.dequantize(codes, scales, null, rows, d, dst, Kvc.DTYPE_F32);
    e = assertThrows(IllegalArgumentException.class,
        () -> c.dequantize(codes, scales, null, rows, d, half, Kvc.DTYPE_F32));
    assertTrue(e.getMessage(), e.getMessage().startsWith("dst: short[]"));
    assertThrows(IllegalArgumentException.class,
        () -> c.dequantize(codes, scales, null, rows, d, new float[rows * d], Kvc.DTYPE_F16));

    // short[] with f16: the same values, rounded to f16; and quantized back from them.
    c.dequantize(codes, scales, null, rows, d, half, Kvc.DTYPE_F16);
    for (int i = 0; i < dst.length; ++i)
      assertEquals(dst[i], halfToFloat(half[i]), Math.abs(dst[i]) * 1e-3f + 1e-7f);
    byte[] codes2 = new byte[codes.length], scales2 = new byte[scales.length];
    assertEquals(rows, c.quantize(half, Kvc.DTYPE_F16, d, codes2, scales2, null));
  }
}
