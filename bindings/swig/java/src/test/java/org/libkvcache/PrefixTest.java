package org.libkvcache;

import static org.junit.Assert.assertArrayEquals;
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
      // Only written blocks register.
      assertThrows(KvcException.class, () -> pool.prefixInsert(1, prompt));
      for (int l = 0; l < LAYERS; ++l) pool.append(1, l, 0, random(33 * ROW, l), random(33 * ROW, 10 + l));
      assertEquals(2, pool.prefixInsert(1, prompt));
      assertEquals(32, pool.prefixLookup(prompt, Kvc.PREFIX_PARTIAL).getHitTokens());
    }
  }

  /** Strings reach C++ as their UTF-8 bytes, NULs included (not modified UTF-8: C0 80, CESU-8 surrogates). */
  @Test
  public void stringsAreUtf8Bytes() {
    byte[] out = new byte[16];
    assertEquals(3, Kvc.stringBytes("a\u0000b", out));
    assertArrayEquals(new byte[] {'a', 0, 'b'}, java.util.Arrays.copyOf(out, 3));
    assertEquals(5, Kvc.stringBytes("x\uD83D\uDE00", out)); // U+1F600: F0 9F 98 80
    assertArrayEquals(new byte[] {'x', (byte) 0xF0, (byte) 0x9F, (byte) 0x98, (byte) 0x80}, java.util.Arrays.copyOf(out, 5));
    assertEquals(2, Kvc.stringBytes("\u00e9", out));
    assertArrayEquals(new byte[] {(byte) 0xC3, (byte) 0xA9}, java.util.Arrays.copyOf(out, 2));
    assertEquals(0, Kvc.stringBytes("", null));
    assertThrows(NullPointerException.class, () -> Kvc.stringBytes(null, out));
  }

  /** A salt with a NUL or an emoji hits only itself. */
  @Test
  public void saltsWithNulAndEmoji() {
    final int n = 40; // 2 full blocks of 16
    int[] prompt = tokens(n, 4);
    String[][] cases = {
        {"a\u0000b", "a", "ab", "a\u0000c", "a\u0000", "a\u0000b\u0000", ""},
        {"x\uD83D\uDE00", "x", "x\uD83D", "x?", "x\uD83D\uDE01", "x\uD83D\uDE00\u0000", ""},
    };
    for (String[] c : cases) {
      try (Pool pool = new Pool(config())) {
        pool.enablePrefixCache(new PrefixConfig(), "model\uD83D\uDE00", "tok");
        pool.seqCreate(1);
        pool.reserve(1, n);
        for (int l = 0; l < LAYERS; ++l) pool.append(1, l, 0, random(n * ROW, l), random(n * ROW, 10 + l));
        assertEquals(2, pool.prefixInsert(1, prompt, c[0]));
        assertEquals(32, pool.prefixLookup(prompt, 0, c[0]).getHitTokens());
        assertEquals(32, pool.prefixLookup(prompt, 0, new String(c[0].toCharArray())).getHitTokens());
        for (int i = 1; i < c.length; ++i)
          assertEquals("salt " + i + " of " + c[0], 0, pool.prefixLookup(prompt, 0, c[i]).getHitTokens());
        assertThrows(NullPointerException.class, () -> pool.prefixLookup(prompt, 0, null));
      }
    }
  }

  /** A NUL in the model or tokenizer id is refused (the C side takes them as C strings). */
  @Test
  public void nulInIdsIsRefused() {
    try (Pool pool = new Pool(config())) {
      KvcException e = assertThrows(KvcException.class, () -> pool.enablePrefixCache(new PrefixConfig(), "m\u0000x", "t"));
      assertEquals(Kvc.ERR_INVALID_ARGUMENT, e.status());
      assertTrue(e.detail(), e.detail().contains("model_id"));
      e = assertThrows(KvcException.class, () -> pool.enablePrefixCache(new PrefixConfig(), "m", "\u0000"));
      assertEquals(Kvc.ERR_INVALID_ARGUMENT, e.status());
      assertTrue(e.detail(), e.detail().contains("tokenizer_id"));
      pool.enablePrefixCache(new PrefixConfig(), "m", "t"); // nothing was enabled
    }
  }

  /** setSeed takes a byte[] of exactly 32 bytes (no float[8], no ByteBuffer: the type is byte[]). */
  @Test
  public void seedIsExactly32Bytes() {
    PrefixConfig pc = new PrefixConfig();
    for (byte[] bad : new byte[][] {null, new byte[0], new byte[31], new byte[33]}) {
      KvcException e = assertThrows(KvcException.class, () -> pc.setSeed(bad));
      assertEquals(Kvc.ERR_INVALID_ARGUMENT, e.status());
    }
    assertEquals(0, pc.getSeedSet());
    pc.setSeed(new byte[32]);
    assertEquals(1, pc.getSeedSet());
  }
}
