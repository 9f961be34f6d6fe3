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
        assertThrows(NullPointerException.class, () -> pool.prefixLookup(prompt, 0, (String) null));
        assertThrows(NullPointerException.class, () -> pool.prefixLookup(prompt, 0, (java.util.Map<String, byte[]>) null));
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

  // ---- named extra keys (docs/prefix-cache.md): values by name, ordered by the pool's declaration ----

  static java.util.Map<String, byte[]> values(String... kv) {
    java.util.Map<String, byte[]> m = new java.util.HashMap<>();
    for (int i = 0; i + 1 < kv.length; i += 2) m.put(kv[i], kv[i + 1].getBytes(java.nio.charset.StandardCharsets.UTF_8));
    return m;
  }

  static String hex(byte[] b) {
    StringBuilder s = new StringBuilder();
    for (byte x : b) s.append(String.format("%02x", x & 0xff));
    return s.toString();
  }

  static Pool namedPool(String... names) {
    Pool pool = new Pool(config());
    PrefixConfig pc = new PrefixConfig();
    byte[] seed = new byte[32];
    for (int i = 0; i < 32; ++i) seed[i] = (byte) (3 + i);
    pc.setSeed(seed);
    pool.enablePrefixCache(pc, "named-model", "", java.util.List.of(names));
    return pool;
  }

  /** The spec's named test vectors (the test-vector pool, names "salt", "adapter"). */
  @Test
  public void namedKeysSpecVectors() {
    PoolConfig c = new PoolConfig();
    c.setNumLayers(1);
    c.setNumQHeads(2);
    c.setNumKvHeads(2);
    c.setHeadDim(4);
    c.setBlockSize(4);
    c.setNumBlocks(16);
    c.setKDtype(Kvc.DTYPE_F32);
    c.setVDtype(Kvc.DTYPE_F32);
    try (Pool pool = new Pool(c)) {
      PrefixConfig pc = new PrefixConfig();
      pc.setSeed(new byte[32]);
      pool.enablePrefixCache(pc, "stories260K", "tok512", java.util.List.of("salt", "adapter"));
      assertEquals(java.util.List.of("salt", "adapter"), pool.extraKeyNameList());
      int[] toks = {10, 11, 12, 13, 14, 15, 16, 17};
      byte[][] k = pool.prefixKeys(toks, values("adapter", "lora-7", "salt", "abc"));
      assertEquals(2, k.length);
      assertEquals("4b39a455995209a14f0fc08fe5a3dded304a1a2290be2ab53f3c347aff3f6843", hex(k[0]));
      assertEquals("7ec33c152d328c65c85f4917878cc9b696ea528441ffde46065b21b4a04e19cb", hex(k[1]));
      assertEquals("a56f4e5afbc3ed88b60f0b1b9a5693035b86800e3f7268c7929332a5cc32effa",
                   hex(pool.prefixKeys(toks, values("adapter", "abc"))[0]));
      assertEquals("fb6ca8a8e2808f267ed596bf3760298379fb27898f5afb246bdda2ac6aa2fa0a",
                   hex(pool.prefixKeys(toks, values())[0]));
    }
  }

  /** Declaration order and names left empty do not change keys; salt=x and adapter=x never share a block. */
  @Test
  public void namedKeysByName() {
    int[] toks = tokens(48, 4);
    try (Pool a = namedPool("salt", "adapter"); Pool b = namedPool("adapter", "media", "salt");
         Pool legacy = namedPool()) {
      byte[][] ka = a.prefixKeys(toks, values("salt", "tenant-1", "adapter", "lora-7"));
      byte[][] kb = b.prefixKeys(toks, values("adapter", "lora-7", "salt", "tenant-1", "media", ""));
      assertEquals(3, ka.length);
      for (int i = 0; i < 3; ++i) assertArrayEquals(ka[i], kb[i]);
      byte[] sx = a.prefixKeys(toks, values("salt", "x"))[0], ax = a.prefixKeys(toks, values("adapter", "x"))[0];
      byte[] lx = legacy.prefixKeys(toks, "x")[0];
      assertTrue(!java.util.Arrays.equals(sx, ax) && !java.util.Arrays.equals(sx, lx) && !java.util.Arrays.equals(ax, lx));
      assertArrayEquals(legacy.prefixKeys(toks, "")[1], a.prefixKeys(toks, values())[1]);

      final int n = 40;
      int[] prompt = tokens(n, 5);
      a.seqCreate(1);
      a.reserve(1, n);
      for (int l = 0; l < LAYERS; ++l) a.append(1, l, 0, random(n * ROW, l), random(n * ROW, 10 + l));
      assertEquals(2, a.prefixInsert(1, prompt, values("salt", "x")));
      assertEquals(32, a.prefixLookup(prompt, 0, values("salt", "x")).getHitTokens());
      assertEquals(0, a.prefixLookup(prompt, Kvc.PREFIX_PARTIAL, values("adapter", "x")).getHitTokens());
      assertEquals(0, a.prefixLookup(prompt, 0, values("salt", "x", "adapter", "y")).getHitTokens());
      assertEquals(0, a.prefixAttach(2, prompt, 0, values("adapter", "x")).getHitTokens());
      assertEquals(32, a.prefixAttach(3, prompt, 0, values("salt", "x")).getHitTokens());
      assertEquals(32, a.seqLength(3));
    }
  }

  /** An undeclared name, or names on a positional pool, is an IllegalArgumentException; bad declarations are refused. */
  @Test
  public void namedKeysUnknownNameAndBadDeclarations() {
    int[] toks = tokens(20, 6);
    try (Pool a = namedPool("salt", "adapter"); Pool legacy = namedPool()) {
      IllegalArgumentException e =
          assertThrows(IllegalArgumentException.class, () -> a.prefixLookup(toks, 0, values("tenant", "x")));
      assertTrue(e.getMessage(), e.getMessage().contains("\"tenant\" is not declared"));
      assertThrows(IllegalArgumentException.class, () -> legacy.prefixKeys(toks, values("salt", "x")));
      assertEquals(0, a.prefixStats().getQueriedTokens());
    }
    try (Pool pool = new Pool(config())) {
      for (java.util.List<String> names : java.util.List.of(java.util.List.of("salt", "salt"), java.util.List.of("salt", ""),
                                                           java.util.List.of("n".repeat(65)))) {
        KvcException e = assertThrows(KvcException.class,
                                      () -> pool.enablePrefixCache(new PrefixConfig(), "m", "t", names));
        assertEquals(Kvc.ERR_INVALID_ARGUMENT, e.status());
      }
      assertTrue(pool.extraKeyNameList().isEmpty());
      assertThrows(KvcException.class, () -> pool.prefixStats()); // still off
    }
  }
}
