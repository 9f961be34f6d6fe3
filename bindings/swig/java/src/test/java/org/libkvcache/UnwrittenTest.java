package org.libkvcache;

import static org.junit.Assert.assertEquals;
import static org.libkvcache.TestData.*;

import java.util.Arrays;
import org.junit.Test;

/** Slots reserved but not written read as zeros, never as a freed sequence's bytes. */
public class UnwrittenTest {
  @Test
  public void unwrittenSlotsReadZeros() {
    PoolConfig c = config();
    c.setKDtype(Kvc.DTYPE_F32);
    c.setVDtype(Kvc.DTYPE_F32);
    try (Pool pool = new Pool(c)) {
      final int all = NUM_BLOCKS / LAYERS * BLOCK;
      pool.seqCreate(9);
      pool.reserve(9, all);
      float[] old = new float[all * ROW];
      Arrays.fill(old, 7.5f);
      for (int l = 0; l < LAYERS; ++l) pool.append(9, l, 0, old, old);
      pool.seqFree(9);
      pool.seqCreate(1);
      pool.reserve(1, 3);
      float[] mine = new float[ROW];
      Arrays.fill(mine, 2f);
      pool.append(1, 0, 1, mine, mine);
      float[] k = new float[3 * ROW], v = new float[3 * ROW];
      assertEquals(3, pool.gather(1, 0, 0, k, v));
      for (int i = 0; i < k.length; ++i) {
        final float want = i / ROW == 1 ? 2f : 0f;
        assertEquals("k[" + i + "]", want, k[i], 0f);
        assertEquals("v[" + i + "]", want, v[i], 0f);
      }
    }
  }
}
