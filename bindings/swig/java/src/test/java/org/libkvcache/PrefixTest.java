package org.libkvcache;

import static org.junit.Assert.assertEquals;
import static org.junit.Assert.assertThrows;
import static org.junit.Assert.assertTrue;
import static org.libkvcache.TestData.*;

import org.junit.Test;

public class PrefixTest {
  @Test
  public void insertLookupAttach() {
    final int n = 40;
    int[] prompt = tokens(n, 1);
    try (Pool pool = new Pool(config())) {
      pool.enablePrefixCache(new PrefixConfig(), "test-model", "test-tokenizer");
      pool.seqCreate(1);
      pool.reserve(1, n);
      float[][] k = new float[LAYERS][];
      for (int l = 0; l < LAYERS; ++l) {
        k[l] = random(n * ROW, 200 + l);
        pool.append(1, l, 0, k[l], random(n * ROW, 300 + l));
      }
      assertEquals(n / BLOCK, pool.prefixInsert(1, prompt)); // 2 full blocks
      assertEquals(0, pool.prefixInsert(1, prompt)); // already registered

      PrefixResult r = pool.prefixLookup(prompt);
      assertEquals(0, r.getHitTokens() % BLOCK);
      assertEquals(32, r.getHitTokens());
      assertEquals(2, r.getHitBlocks());

      // Another tenant's salt does not see them; a different prompt start neither.
      assertEquals(0, pool.prefixLookup(prompt, 0, "tenant-b").getHitTokens());
      assertEquals(0, pool.prefixLookup(tokens(n, 2)).getHitTokens());

      // Freed, the blocks stay cached; attach revives them into a new sequence.
      pool.seqFree(1);
      assertEquals(2, pool.prefixStats().getReclaimableBlocks());
      PrefixResult a = pool.prefixAttach(5, prompt);
      assertEquals(32, a.getHitTokens());
      assertEquals(32, pool.seqLength(5));
      float[] ko = new float[32 * ROW];
      assertEquals(32, pool.gather(5, 1, 0, ko, null));
      assertF16Close(k[1], 0, ko, 0, 32 * ROW);

      PrefixStats s = pool.prefixStats();
      assertEquals(2, s.getRegisteredBlocks());
      assertTrue(s.getHitTokens() >= 64);
    }
  }

  @Test
  public void seedAndPartialFlag() {
    int[] prompt = tokens(33, 3);
    PrefixConfig pc = new PrefixConfig();
    byte[] seed = new byte[32];
    for (int i = 0; i < 32; ++i) seed[i] = (byte) (i * 5);
    pc.setSeed(seed); // sets seed_set too
    assertEquals(1, pc.getSeedSet());
    KvcException e = assertThrows(KvcException.class, () -> pc.setSeed(new byte[31]));
    assertEquals(Kvc.ERR_INVALID_ARGUMENT, e.status());
    try (Pool pool = new Pool(config())) {
      pool.enablePrefixCache(pc);
      pool.seqCreate(1);
      pool.reserve(1, 33);
      assertEquals(2, pool.prefixInsert(1, prompt));
      assertEquals(32, pool.prefixLookup(prompt, Kvc.PREFIX_PARTIAL).getHitTokens());
    }
  }
}
