package org.libkvcache;

import static org.junit.Assert.assertEquals;
import static org.junit.Assert.assertThrows;
import static org.junit.Assert.assertTrue;

import org.junit.Test;

/** The usage example of README.md, line for line (ctest java_readme_sync checks it). */
public class ReadmeExampleTest {
  @Test
  public void readmeExample() {
    // [readme]
    PoolConfig cfg = new PoolConfig();          // library defaults, then the model's shape
    cfg.setNumLayers(2);
    cfg.setNumQHeads(4);
    cfg.setNumKvHeads(2);
    cfg.setHeadDim(64);
    cfg.setBlockSize(16);
    cfg.setNumBlocks(64);
    cfg.setKDtype(Kvc.DTYPE_F16);               // stored as f16, read and written as f32
    cfg.setVDtype(Kvc.DTYPE_F16);

    try (Pool pool = new Pool(cfg)) {
      pool.seqCreate(1);
      pool.reserve(1, 3);                       // 3 token slots in every layer
      float[] k = new float[3 * 2 * 64];        // [tokens][kv heads][head_dim]
      float[] v = new float[3 * 2 * 64];
      for (int i = 0; i < k.length; ++i) {
        k[i] = i / 1024f;                       // exact in f16
        v[i] = -i / 1024f;
      }
      pool.append(1, 0, 0, k, v);               // layer 0, positions 0..2
      pool.seqFork(1, 2);                       // copy-on-write child

      float[] kOut = new float[k.length];
      pool.gather(2, 0, 0, kOut, null);         // K only (null: no V)
      assertEquals(0.125f, kOut[128], 0f);

      KvcException e = assertThrows(KvcException.class, () -> pool.seqLength(42));
      assertEquals(Kvc.ERR_SEQ_NOT_FOUND, e.status());
      System.out.println(e.getMessage());       // "KVC_ERR_SEQ_NOT_FOUND: ..."
    }                                           // close(): the pool is freed here
    // [/readme]
    assertTrue(cfg.getNumLayers() == 2);
  }
}
