package org.libkvcache;

import static org.junit.Assert.assertArrayEquals;
import static org.junit.Assert.assertEquals;
import static org.junit.Assert.assertThrows;
import static org.junit.Assert.assertTrue;
import static org.libkvcache.TestData.*;

import java.nio.ByteBuffer;
import java.nio.ByteOrder;
import java.nio.FloatBuffer;
import org.junit.Test;

public class PoolTest {
  @Test
  public void versionAndSizes() {
    assertTrue(Kvc.version(), Kvc.version().startsWith(Kvc.VERSION_MAJOR + "." + Kvc.VERSION_MINOR + "."));
    assertEquals("KVC_ERR_POOL_EXHAUSTED", Kvc.statusName(Kvc.ERR_POOL_EXHAUSTED));
    assertEquals(4, Kvc.dtypeSize(Kvc.DTYPE_F32));
    assertEquals(2, Kvc.dtypeSize(Kvc.DTYPE_BF16));
  }

  @Test
  public void configRoundTrips() {
    try (Pool pool = new Pool(config())) {
      PoolConfig c = pool.config();
      assertEquals(LAYERS, c.getNumLayers());
      assertEquals(KV_HEADS, c.getNumKvHeads());
      assertEquals(HEAD_DIM, c.getHeadDim());
      assertEquals(Kvc.DTYPE_F16, c.getKDtype());
      Stats s = pool.stats();
      assertEquals(NUM_BLOCKS, s.getBlocksTotal());
      assertEquals(NUM_BLOCKS, s.getBlocksFree());
    }
  }

  /** A sequence saved into a byte[] and a file comes back byte-identical in another pool. */
  @Test
  public void saveAndRestore() throws Exception {
    final int n = 21;
    try (Pool a = new Pool(config()); Pool b = new Pool(config())) {
      a.seqCreate(1);
      a.reserve(1, n);
      for (int l = 0; l < LAYERS; ++l) a.append(1, l, 0, random(n * ROW, 40 + l), random(n * ROW, 50 + l));
      byte[] rec = new byte[(int) a.saveSize(1)];
      assertEquals(rec.length, a.saveInto(1, rec));
      assertEquals('K', rec[0]);
      b.restore(3, rec);
      java.io.File f = java.io.File.createTempFile("kvc", ".kvcs");
      try {
        a.saveFile(1, f.getPath());
        b.restoreFile(4, f.getPath());
      } finally {
        f.delete();
      }
      for (long seq : new long[] {3, 4})
        for (int l = 0; l < LAYERS; ++l) {
          float[] wk = new float[n * ROW], gk = new float[n * ROW];
          a.gather(1, l, 0, wk, null);
          b.gather(seq, l, 0, gk, null);
          assertArrayEquals(wk, gk, 0f);
        }
      rec[rec.length / 2] ^= 1;
      KvcException e = assertThrows(KvcException.class, () -> b.restore(5, rec));
      assertEquals(Kvc.ERR_CORRUPT, e.status());
    }
  }

  /** Append to two layers, fork, write into the child (copy-on-write), read both back. */
  @Test
  public void appendForkGather() {
    final int n = 40;
    try (Pool pool = new Pool(config())) {
      pool.seqCreate(1);
      pool.reserve(1, n);
      float[][] k = new float[LAYERS][], v = new float[LAYERS][];
      for (int l = 0; l < LAYERS; ++l) {
        k[l] = random(n * ROW, 10 + l);
        v[l] = random(n * ROW, 20 + l);
        assertEquals(n, pool.append(1, l, 0, k[l], v[l]));
      }
      assertEquals(n, pool.seqLength(1));
      assertEquals(n, pool.layerTokens(1, 1));

      pool.seqFork(1, 2);
      assertEquals(n, pool.seqLength(2));
      assertTrue(pool.stats().getBlocksShared() > 0);
      assertEquals(2, pool.stats().getNumSequences());

      // The child rewrites its last token of layer 1: the parent keeps its own.
      float[] k2 = random(ROW, 30), v2 = random(ROW, 31);
      assertEquals(1, pool.append(2, 1, n - 1, k2, v2));

      for (long seq : new long[] {1, 2}) {
        for (int l = 0; l < LAYERS; ++l) {
          float[] ko = new float[n * ROW], vo = new float[n * ROW];
          assertEquals(n, pool.gather(seq, l, 0, ko, vo));
          if (seq == 2 && l == 1) {
            assertF16Close(k[l], 0, ko, 0, (n - 1) * ROW);
            assertF16Close(k2, 0, ko, (n - 1) * ROW, ROW);
            assertF16Close(v2, 0, vo, (n - 1) * ROW, ROW);
          } else {
            assertF16Close(k[l], ko);
            assertF16Close(v[l], vo);
          }
        }
      }
      int[] pos = new int[n];
      for (int i = 0; i < n; ++i) pos[i] = i;
      assertArrayEquals(pos, pool.positions(1, 0, 0, n).stream().mapToInt(Integer::intValue).toArray());
      assertEquals((n + BLOCK - 1) / BLOCK, pool.blockTable(2, 0).size());
    }
  }

  /** Direct ByteBuffers (zero-copy, [position, limit)) and f16 output into short[]. */
  @Test
  public void directBuffersAndHalfOutput() {
    final int n = 20;
    try (Pool pool = new Pool(config())) {
      pool.seqCreate(7);
      pool.reserve(7, n);
      float[] k = random(n * ROW, 40), v = random(n * ROW, 41);
      // K starts 16 bytes into its buffer: only [position, limit) is read.
      ByteBuffer kb = ByteBuffer.allocateDirect(16 + n * ROW * 4).order(ByteOrder.nativeOrder());
      kb.position(16);
      kb.slice().order(ByteOrder.nativeOrder()).asFloatBuffer().put(k);
      ByteBuffer vb = ByteBuffer.allocateDirect(n * ROW * 4).order(ByteOrder.nativeOrder());
      vb.asFloatBuffer().put(v);
      assertEquals(16, kb.position());
      assertEquals(n, pool.append(7, 0, 0, kb, vb));
      assertEquals(16, kb.position()); // not advanced

      ByteBuffer ko = ByteBuffer.allocateDirect(n * ROW * 4).order(ByteOrder.nativeOrder());
      assertEquals(n, pool.gather(7, 0, 0, ko, null));
      float[] got = new float[n * ROW];
      FloatBuffer fb = ko.asFloatBuffer();
      fb.get(got);
      assertF16Close(k, got);

      short[] vh = new short[n * ROW];
      assertEquals(n, pool.gather(7, 0, 0, null, vh, Kvc.DTYPE_F16));
      for (int i = 0; i < vh.length; ++i) got[i] = halfToFloat(vh[i]);
      assertF16Close(v, got);

      // f16 input: the same bits back.
      pool.seqCreate(8);
      pool.reserve(8, n);
      assertEquals(n, pool.append(8, 1, 0, vh, vh, Kvc.DTYPE_F16));
      short[] back = new short[n * ROW];
      assertEquals(n, pool.gather(8, 1, 0, back, null, Kvc.DTYPE_F16));
      assertArrayEquals(vh, back);
    }
  }

  @Test
  public void truncateAndFree() {
    try (Pool pool = new Pool(config())) {
      pool.seqCreate(3);
      pool.reserve(3, 33);
      assertEquals(3 * LAYERS, pool.stats().getBlocksUsed());
      pool.seqTruncate(3, 16);
      assertEquals(16, pool.seqLength(3));
      assertEquals(LAYERS, pool.stats().getBlocksUsed());
      pool.seqFree(3);
      assertEquals(0, pool.stats().getNumSequences());
      assertEquals(NUM_BLOCKS, pool.stats().getBlocksFree());
    }
  }

  /**
   * The array type must hold the dtype it is passed with (float[]: f32,
   * short[]: f16 / bf16, k and v alike): the data used to be reinterpreted.
   * byte[] and direct ByteBuffers are raw bytes of any dtype.
   */
  @Test
  public void arrayTypeMustMatchDtype() {
    final int n = 4;
    try (Pool pool = new Pool(config())) {
      pool.seqCreate(1);
      pool.reserve(1, n);
      float[] f = random(n * ROW, 60);
      short[] h = new short[n * ROW];
      assertEquals(n, pool.append(1, 0, 0, f, f));
      assertEquals(n, pool.gather(1, 0, 0, h, null, Kvc.DTYPE_F16)); // f as f16 bits

      // short[] without a dtype (the default is f32), float[] as f16 / bf16, short[] as f32.
      IllegalArgumentException e = assertThrows(IllegalArgumentException.class, () -> pool.append(1, 1, 0, h, h));
      assertTrue(e.getMessage(), e.getMessage().startsWith("k: short[]"));
      e = assertThrows(IllegalArgumentException.class, () -> pool.append(1, 1, 0, f, f, Kvc.DTYPE_F16));
      assertTrue(e.getMessage(), e.getMessage().startsWith("k: float[] holds f32 values, not DTYPE_F16"));
      assertThrows(IllegalArgumentException.class, () -> pool.append(1, 1, 0, f, f, Kvc.DTYPE_BF16));
      assertThrows(IllegalArgumentException.class, () -> pool.append(1, 1, 0, h, h, Kvc.DTYPE_F32));
      // k and v of different types: one of them does not hold the dtype.
      e = assertThrows(IllegalArgumentException.class, () -> pool.append(1, 1, 0, f, h, Kvc.DTYPE_F32));
      assertTrue(e.getMessage(), e.getMessage().startsWith("v: short[]"));
      e = assertThrows(IllegalArgumentException.class, () -> pool.append(1, 1, 0, f, h, Kvc.DTYPE_F16));
      assertTrue(e.getMessage(), e.getMessage().startsWith("k: float[]"));
      e = assertThrows(IllegalArgumentException.class, () -> pool.append(1, 1, 0, f, h));
      assertTrue(e.getMessage(), e.getMessage().startsWith("v: short[]"));
      // Outputs alike.
      e = assertThrows(IllegalArgumentException.class, () -> pool.gather(1, 0, 0, new short[n * ROW], null));
      assertTrue(e.getMessage(), e.getMessage().startsWith("k_out: short[]"));
      assertThrows(IllegalArgumentException.class, () -> pool.gather(1, 0, 0, null, new float[n * ROW], Kvc.DTYPE_BF16));
      assertThrows(IllegalArgumentException.class,
          () -> pool.gather(1, 0, 0, new float[n * ROW], new short[n * ROW], Kvc.DTYPE_F16));
      assertThrows(IllegalArgumentException.class,
          () -> pool.gather(1, 0, 0, new float[n * ROW], new short[2 * n * ROW], Kvc.DTYPE_F32));

      // Raw bytes: f16 bits in a direct ByteBuffer (native order) and in a byte[].
      ByteBuffer hb = ByteBuffer.allocateDirect(n * ROW * 2).order(ByteOrder.nativeOrder());
      hb.asShortBuffer().put(h);
      byte[] hbytes = new byte[n * ROW * 2];
      hb.duplicate().get(hbytes);
      assertEquals(n, pool.append(1, 1, 0, hb, hbytes, Kvc.DTYPE_F16));
      short[] kBack = new short[n * ROW], vBack = new short[n * ROW];
      assertEquals(n, pool.gather(1, 1, 0, kBack, vBack, Kvc.DTYPE_F16));
      assertArrayEquals(h, kBack);
      assertArrayEquals(h, vBack);
      ByteBuffer out = ByteBuffer.allocateDirect(n * ROW * 2).order(ByteOrder.nativeOrder());
      assertEquals(n, pool.gather(1, 1, 0, out, null, Kvc.DTYPE_BF16)); // any dtype into raw bytes
      float[] back = new float[n * ROW];
      assertEquals(n, pool.gather(1, 1, 0, back, null));
      assertF16Close(f, back);
    }
  }
}
