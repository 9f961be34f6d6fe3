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
