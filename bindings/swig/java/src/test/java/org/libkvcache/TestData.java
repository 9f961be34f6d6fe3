package org.libkvcache;

import static org.junit.Assert.assertEquals;
import static org.junit.Assert.assertTrue;

import java.io.IOException;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Paths;
import java.util.SplittableRandom;

/** Shared shapes, deterministic data and checks of the Java tests. */
final class TestData {
  static final int LAYERS = 2;
  static final int Q_HEADS = 4;
  static final int KV_HEADS = 2;
  static final int HEAD_DIM = 64;
  static final int BLOCK = 16;
  static final int NUM_BLOCKS = 64;
  /** Elements of one token's K (or V) row: [KV_HEADS][HEAD_DIM]. */
  static final int ROW = KV_HEADS * HEAD_DIM;

  private TestData() {}

  /** 2 layers, 4 query heads, 2 KV heads, head_dim 64, blocks of 16 tokens, f16 storage, 64 blocks. */
  static PoolConfig config() {
    PoolConfig c = new PoolConfig();
    c.setNumLayers(LAYERS);
    c.setNumQHeads(Q_HEADS);
    c.setNumKvHeads(KV_HEADS);
    c.setHeadDim(HEAD_DIM);
    c.setBlockSize(BLOCK);
    c.setNumBlocks(NUM_BLOCKS);
    c.setKDtype(Kvc.DTYPE_F16);
    c.setVDtype(Kvc.DTYPE_F16);
    return c;
  }

  /** What Pool.evict() returns when every layer dropped n tokens. */
  static long[] perLayer(long n) {
    long[] out = new long[LAYERS];
    java.util.Arrays.fill(out, n);
    return out;
  }

  /** n values uniform in [-1, 1), the same for the same seed. */
  static float[] random(int n, long seed) {
    SplittableRandom r = new SplittableRandom(seed);
    float[] out = new float[n];
    for (int i = 0; i < n; ++i) out[i] = (float) (r.nextDouble() * 2.0 - 1.0);
    return out;
  }

  /** Token ids 0..n-1 scrambled deterministically. */
  static int[] tokens(int n, int seed) {
    int[] t = new int[n];
    for (int i = 0; i < n; ++i) t[i] = (i * 7919 + seed * 104729) % 32000;
    return t;
  }

  /** Each got[i] equals want[i] within f16 rounding (relative 1e-3). */
  static void assertF16Close(float[] want, int wantOffset, float[] got, int gotOffset, int n) {
    for (int i = 0; i < n; ++i) {
      float w = want[wantOffset + i], g = got[gotOffset + i];
      assertTrue("element " + i + ": want " + w + ", got " + g, Math.abs(w - g) <= 1e-3f * Math.abs(w) + 1e-7f);
    }
  }

  static void assertF16Close(float[] want, float[] got) {
    assertEquals(want.length, got.length);
    assertF16Close(want, 0, got, 0, want.length);
  }

  /** IEEE half bits to float (Float.float16ToFloat is Java 20). */
  static float halfToFloat(short h) {
    int bits = h & 0xffff;
    int sign = (bits >>> 15) << 31;
    int exp = (bits >>> 10) & 0x1f;
    int mant = bits & 0x3ff;
    if (exp == 0x1f) return Float.intBitsToFloat(sign | 0x7f800000 | (mant << 13));
    if (exp == 0) {
      float f = mant * 0x1p-24f;
      return sign != 0 ? -f : f;
    }
    return Float.intBitsToFloat(sign | ((exp - 15 + 127) << 23) | (mant << 13));
  }

  /** VmRSS of this process in KiB (Linux), -1 elsewhere. */
  static long vmRssKiB() {
    try {
      for (String line : Files.readAllLines(Paths.get("/proc/self/status"), StandardCharsets.US_ASCII)) {
        if (line.startsWith("VmRSS:")) return Long.parseLong(line.replaceAll("[^0-9]", ""));
      }
    } catch (IOException e) {
      return -1;
    }
    return -1;
  }
}
