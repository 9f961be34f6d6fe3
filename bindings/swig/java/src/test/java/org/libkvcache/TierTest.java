package org.libkvcache;

import static org.junit.Assert.assertArrayEquals;
import static org.junit.Assert.assertEquals;
import static org.junit.Assert.assertNotEquals;
import static org.junit.Assert.assertThrows;
import static org.junit.Assert.assertTrue;

import java.io.File;
import java.io.IOException;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.ArrayList;
import java.util.List;
import org.junit.Test;

/** Offload tiers (docs/tiers.md): host and disk tiers, loads compared exactly, prefetch, pins, counters, timeout, bad input. */
public class TierTest {
  static final int LAYERS = 2, KV_HEADS = 2, HEAD_DIM = 8, BLOCK = 16, ROW = KV_HEADS * HEAD_DIM;

  /** 2 layers, 2 KV heads of 8, blocks of 16, f32 storage (exact), 16 blocks; prefix cache with a fixed seed. */
  static Pool tierPool() {
    PoolConfig c = new PoolConfig();
    c.setNumLayers(LAYERS);
    c.setNumQHeads(4);
    c.setNumKvHeads(KV_HEADS);
    c.setHeadDim(HEAD_DIM);
    c.setBlockSize(BLOCK);
    c.setNumBlocks(16);
    c.setKDtype(Kvc.DTYPE_F32);
    c.setVDtype(Kvc.DTYPE_F32);
    Pool pool = new Pool(c);
    PrefixConfig pc = new PrefixConfig();
    byte[] seed = new byte[32];
    for (int i = 0; i < 32; ++i) seed[i] = (byte) (7 + i);
    pc.setSeed(seed);
    pool.enablePrefixCache(pc, "tier-model");
    return pool;
  }

  static int[] prompt(int n) {
    int[] t = new int[n];
    for (int i = 0; i < n; ++i) t[i] = (i * 7919 + 11) % 32000;
    return t;
  }

  /** Creates seq with random K/V for prompt and registers it; returns {k, v} per layer. */
  static float[][][] write(Pool pool, long seq, int[] prompt, long seed) {
    int n = prompt.length;
    pool.seqCreate(seq);
    pool.reserve(seq, n);
    float[][][] kv = new float[LAYERS][][];
    for (int l = 0; l < LAYERS; ++l) {
      kv[l] = new float[][] {TestData.random(n * ROW, seed + l), TestData.random(n * ROW, seed + 100 + l)};
      assertEquals(n, pool.append(seq, l, 0, kv[l][0], kv[l][1]));
    }
    assertEquals(n / BLOCK, pool.prefixInsert(seq, prompt));
    return kv;
  }

  /** Fills every free and reclaimable block with other sequences (ids from first); returns the next id. */
  static long squeeze(Pool pool, long first) {
    float[] garbage = new float[BLOCK * ROW];
    java.util.Arrays.fill(garbage, -1f);
    long id = first;
    for (;;) {
      Stats s = pool.stats();
      if (s.getBlocksFree() + s.getBlocksCached() < LAYERS) return id;
      pool.seqCreate(id);
      pool.reserve(id, BLOCK);
      for (int l = 0; l < LAYERS; ++l) pool.append(id, l, 0, garbage, garbage);
      ++id;
    }
  }

  static void freeRange(Pool pool, long first, long end) {
    for (long id = first; id < end; ++id) pool.seqFree(id);
  }

  /** The first n tokens of seq are exactly the K/V written. */
  static void assertHolds(Pool pool, long seq, float[][][] kv, int n) {
    assertEquals(n, pool.seqLength(seq));
    for (int l = 0; l < LAYERS; ++l) {
      float[] k = new float[n * ROW], v = new float[n * ROW];
      assertEquals(n, pool.gather(seq, l, 0, k, v));
      assertArrayEquals(java.util.Arrays.copyOf(kv[l][0], n * ROW), k, 0f);
      assertArrayEquals(java.util.Arrays.copyOf(kv[l][1], n * ROW), v, 0f);
    }
  }

  static int status(Runnable r) {
    return assertThrows(KvcException.class, r::run).status();
  }

  @Test
  public void constants() {
    assertEquals(0, Kvc.TIER_HOST);
    assertEquals(1, Kvc.TIER_DISK);
    assertEquals(2, Kvc.TIER_REDIS);
    assertEquals(1L, Kvc.TIER_FSYNC);
    assertEquals(2L, Kvc.TIER_REDIS_CLUSTER);
    assertEquals(2L, Kvc.PREFIX_PIN);
    assertEquals(21, Kvc.ERR_PENDING);
    assertEquals(22, Kvc.ERR_TIMEOUT);
    assertEquals("KVC_ERR_TIMEOUT", Kvc.statusName(Kvc.ERR_TIMEOUT));
    TierConfig c = new TierConfig(Kvc.TIER_DISK);
    assertEquals(Kvc.TIER_DISK, c.getKind());
    assertEquals(0, c.getCapacityBytes());
    assertEquals(1000, c.getTimeoutMs());
    assertEquals(Kvc.ERR_INVALID_ARGUMENT, status(() -> new TierConfig(9)));
  }

  @Test
  public void offloadLoadPrefetchPin() throws IOException {
    Path dir = Files.createTempDirectory("kvc-tier-java");
    int[] p = prompt(3 * BLOCK + 1); // 3 whole blocks usable
    float[][][] kv;
    try (Pool pool = tierPool()) {
      assertEquals(0, pool.addTier(Kvc.TIER_HOST, 1 << 20));
      assertEquals(1, pool.addTier(Kvc.TIER_DISK, 1 << 24, dir.toString()));
      pool.setOffload(64, 10000);
      kv = write(pool, 1, p, 1234);

      // Offloaded while still in the pool: write-through to both tiers.
      assertEquals(3, pool.prefixOffload(p));
      pool.flushTiers();
      for (int i = 0; i < 2; ++i) {
        TierStats s = pool.tierStats(i);
        assertEquals(i == 0 ? Kvc.TIER_HOST : Kvc.TIER_DISK, s.getKind());
        assertEquals(3, s.getDemotions());
        assertEquals(3, s.getEntries());
        assertEquals(0, s.getHits());
        assertEquals(0, s.getErrors());
        assertEquals("", s.getLastError());
      }
      assertEquals(3, dir.toFile().list().length);

      // The pool's copy reclaimed.
      pool.seqFree(1);
      long end = squeeze(pool, 100);
      pool.flushTiers();
      assertEquals(0, pool.prefixStats().getRegisteredBlocks());
      freeRange(pool, 100, end);

      PrefixResult r = pool.prefixLookup(p);
      assertEquals(0, r.getHitTokens());
      assertEquals(48, r.getTierTokens());
      assertEquals(0, r.getPin());
      assertEquals(48, pool.prefixLoad(p));
      assertEquals(48, pool.prefixAttach(2, p).getHitTokens());
      assertHolds(pool, 2, kv, 48);
      TierStats s0 = pool.tierStats(0), s1 = pool.tierStats(1);
      assertEquals(3, s0.getHits());
      assertEquals(3, s0.getPromotions());
      assertEquals(0, s0.getMisses());
      assertEquals(0, s1.getHits());
      assertEquals(0, s1.getPromotions());

      // Again by prefetch + poll.
      pool.seqFree(2);
      end = squeeze(pool, 200);
      pool.flushTiers();
      freeRange(pool, 200, end);
      long ticket = pool.prefixPrefetch(p);
      assertNotEquals(0, ticket);
      long deadline = System.nanoTime() + 10_000_000_000L;
      PrefixPoll poll;
      while (!(poll = pool.prefixPoll(ticket)).getDone()) {
        assertEquals(0, poll.getLoadedTokens());
        assertTrue("still pending after 10 s", System.nanoTime() < deadline);
        Thread.yield();
      }
      assertEquals(48, poll.getLoadedTokens());
      assertEquals(Kvc.ERR_INVALID_ARGUMENT, status(() -> pool.prefixPoll(ticket))); // reported once
      assertEquals(48, pool.prefixAttach(3, p).getHitTokens());
      assertHolds(pool, 3, kv, 48);
      assertEquals(6, pool.tierStats(0).getHits());
      assertEquals(6, pool.tierStats(0).getPromotions());

      // Pins, released once.
      pool.seqFree(3);
      end = squeeze(pool, 300);
      pool.flushTiers();
      PrefixResult pinned = pool.prefixLookup(p, Kvc.PREFIX_PIN);
      assertEquals(48, pinned.getTierTokens());
      assertNotEquals(0, pinned.getPin());
      assertEquals(3, pool.tierStats(0).getPinned());
      pool.prefixUnpin(pinned.getPin());
      assertEquals(0, pool.tierStats(0).getPinned());
      assertEquals(Kvc.ERR_INVALID_ARGUMENT, status(() -> pool.prefixUnpin(pinned.getPin())));
      assertEquals(Kvc.ERR_INVALID_ARGUMENT, status(() -> pool.prefixUnpin(0)));
      freeRange(pool, 300, end);
    }
    // A new pool with the same seed and model finds the blocks on disk.
    try (Pool pool = tierPool()) {
      assertEquals(0, pool.addTier(Kvc.TIER_DISK, 1 << 24, dir.toString()));
      assertEquals(48, pool.prefixLookup(p).getTierTokens());
      assertEquals(48, pool.prefixLoad(p));
      pool.prefixAttach(1, p);
      assertHolds(pool, 1, kv, 48);
      TierStats s = pool.tierStats(0);
      assertEquals(3, s.getHits());
      assertEquals(3, s.getPromotions());
      assertEquals(0, s.getDemotions());
      assertEquals(3, s.getEntries());
    } finally {
      for (File f : dir.toFile().listFiles()) f.delete();
      dir.toFile().delete();
    }
  }

  /** A disk record that never answers (a FIFO nobody writes): poll throws ERR_TIMEOUT; released, the record is refused. */
  @Test
  public void prefetchTimeout() throws Exception {
    Path dir = Files.createTempDirectory("kvc-tier-java");
    int[] p = prompt(2 * BLOCK + 1);
    try {
      try (Pool pool = tierPool()) {
        pool.addTier(Kvc.TIER_DISK, 1 << 24, dir.toString());
        write(pool, 1, p, 5);
        assertEquals(2, pool.prefixOffload(p));
        pool.flushTiers();
      }
      String[] names = dir.toFile().list();
      assertEquals(2, names.length);
      try (Pool pool = tierPool()) {
        pool.addTier(Kvc.TIER_DISK, 1 << 24, dir.toString());
        pool.setOffload(16, 200);
        List<String> fifos = new ArrayList<>();
        for (String n : names) {
          File f = new File(dir.toFile(), n);
          assertTrue(f.delete());
          Process mk = new ProcessBuilder("mkfifo", f.getPath()).inheritIO().start();
          assertEquals(0, mk.waitFor());
          fifos.add(f.getPath());
        }
        assertEquals(32, pool.prefixLookup(p).getTierTokens());
        long ticket = pool.prefixPrefetch(p);
        int released = 0;
        try {
          Thread.sleep(500);
          KvcException e = assertThrows(KvcException.class, () -> pool.prefixPoll(ticket));
          assertEquals(Kvc.ERR_TIMEOUT, e.status());
          assertEquals("KVC_ERR_TIMEOUT", e.statusName());
        } finally {
          released = release(fifos);
        }
        assertEquals(1, released);
        long deadline = System.nanoTime() + 10_000_000_000L;
        while (pool.tierStats(0).getErrors() == 0 && System.nanoTime() < deadline) Thread.sleep(10);
        TierStats s = pool.tierStats(0);
        assertEquals(1, s.getErrors());
        assertEquals(0, s.getHits());
        assertEquals(0, s.getPromotions());
        assertTrue(s.getLastError(), s.getLastError().contains("cannot be read"));
        assertEquals(0, pool.stats().getBlocksUsed());
      }
    } finally {
      for (File f : dir.toFile().listFiles()) f.delete();
      dir.toFile().delete();
    }
  }

  /**
   * The loader is blocked opening one FIFO for reading: a writer that opens
   * and closes it gives EOF. Java cannot open a FIFO without blocking, so a
   * shell does it with a timeout (a FIFO no reader waits on stays blocked
   * until `timeout` ends it, which counts as not released).
   */
  static int release(List<String> fifos) throws Exception {
    int released = 0;
    long deadline = System.nanoTime() + 10_000_000_000L;
    while (released == 0 && System.nanoTime() < deadline) {
      for (String f : fifos) {
        Process w = new ProcessBuilder("timeout", "0.2", "sh", "-c", ": > \"$0\"", f).start();
        if (w.waitFor() == 0) ++released;
      }
    }
    return released;
  }

  @Test
  public void badInput() {
    Pool pool = tierPool();
    assertEquals(Kvc.ERR_INVALID_ARGUMENT, status(() -> pool.addTier(Kvc.TIER_HOST, 0))); // capacity 0
    assertEquals(Kvc.ERR_INVALID_ARGUMENT, status(() -> pool.addTier(7, 1 << 20))); // unknown kind
    assertEquals(Kvc.ERR_INVALID_ARGUMENT, status(() -> pool.addTier(Kvc.TIER_DISK, 1 << 20))); // no path
    KvcException e = assertThrows(KvcException.class, () -> pool.addTier(Kvc.TIER_DISK, 1 << 20, "a\u0000b"));
    assertEquals(Kvc.ERR_INVALID_ARGUMENT, e.status());
    assertTrue(e.detail(), e.detail().contains("path"));
    assertThrows(IllegalArgumentException.class, () -> pool.addTier(Kvc.TIER_HOST, 1 << 20, "", "", 1L << 32));
    assertEquals(Kvc.ERR_INVALID_ARGUMENT, status(() -> pool.setOffload(4, 100))); // no tier yet
    assertEquals(Kvc.ERR_OUT_OF_RANGE, status(() -> pool.tierStats(0)));
    assertEquals(Kvc.ERR_INVALID_ARGUMENT, status(() -> pool.prefixLoad(new int[] {1, 2, 3, 4, 5})));
    assertEquals(0, pool.addTier(Kvc.TIER_HOST, 1 << 20));
    assertEquals(Kvc.ERR_INVALID_ARGUMENT, status(() -> pool.setOffload(0, 100)));
    assertEquals(Kvc.ERR_INVALID_ARGUMENT, status(() -> pool.setOffload(4, 0)));
    assertEquals(Kvc.ERR_INVALID_ARGUMENT, status(() -> pool.prefixPoll(12345)));
    long ticket = pool.prefixPrefetch(new int[] {1, 2, 3, 4, 5}); // nothing to load: done at once
    PrefixPoll poll = pool.prefixPoll(ticket);
    assertTrue(poll.getDone());
    assertEquals(0, poll.getLoadedTokens());
    assertEquals(Kvc.ERR_OUT_OF_RANGE, status(() -> pool.tierStats(1)));
    pool.close();
    assertEquals(Kvc.ERR_NULL_POINTER, status(() -> pool.flushTiers()));
    assertTrue(pool.closed());
  }

  /** Named extra keys through a disk tier: a pool declaring the names in another order loads the blocks; other assignments miss. */
  @Test
  public void namedKeysDiskTier() throws IOException {
    Path dir = Files.createTempDirectory("kvc-java-named");
    int[] p = prompt(3 * BLOCK + 1);
    java.util.Map<String, byte[]> values = PrefixTest.values("salt", "tenant-1", "adapter", "lora-7");
    float[][][] kv;
    try (Pool w = namedTierPool("salt", "adapter")) {
      w.addTier(Kvc.TIER_DISK, 1L << 24, dir.toString());
      w.seqCreate(1);
      w.reserve(1, p.length);
      kv = new float[LAYERS][][];
      for (int l = 0; l < LAYERS; ++l) {
        kv[l] = new float[][] {TestData.random(p.length * ROW, 60 + l), TestData.random(p.length * ROW, 70 + l)};
        w.append(1, l, 0, kv[l][0], kv[l][1]);
      }
      assertEquals(3, w.prefixInsert(1, p, values));
      assertEquals(3, w.prefixOffload(p, values));
      w.flushTiers();
    }
    try (Pool r = namedTierPool("media", "adapter", "salt")) {
      r.addTier(Kvc.TIER_DISK, 1L << 24, dir.toString());
      assertEquals(0, r.prefixLookup(p, 0, PrefixTest.values("salt", "lora-7", "adapter", "tenant-1")).getTierTokens());
      assertEquals(0, r.prefixLookup(p, 0, PrefixTest.values("salt", "tenant-1")).getTierTokens());
      assertEquals(48, r.prefixLookup(p, 0, values).getTierTokens());
      long ticket = r.prefixPrefetch(p, values);
      PrefixPoll poll;
      while (!(poll = r.prefixPoll(ticket)).getDone()) Thread.yield();
      assertEquals(48, poll.getLoadedTokens());
      assertEquals(0, r.prefixLoad(p, values)); // already in the pool
      assertEquals(48, r.prefixAttach(2, p, 0, values).getHitTokens());
      for (int l = 0; l < LAYERS; ++l) {
        float[] k = new float[48 * ROW], v = new float[48 * ROW];
        r.gather(2, l, 0, k, v);
        assertArrayEquals(java.util.Arrays.copyOf(kv[l][0], 48 * ROW), k, 0f);
        assertArrayEquals(java.util.Arrays.copyOf(kv[l][1], 48 * ROW), v, 0f);
      }
    } finally {
      try (java.util.stream.Stream<Path> files = Files.list(dir)) {
        for (Path f : (Iterable<Path>) files::iterator) Files.delete(f);
      }
      Files.delete(dir);
    }
  }

  static Pool namedTierPool(String... names) {
    PoolConfig c = new PoolConfig();
    c.setNumLayers(LAYERS);
    c.setNumQHeads(4);
    c.setNumKvHeads(KV_HEADS);
    c.setHeadDim(HEAD_DIM);
    c.setBlockSize(BLOCK);
    c.setNumBlocks(16);
    c.setKDtype(Kvc.DTYPE_F32);
    c.setVDtype(Kvc.DTYPE_F32);
    Pool pool = new Pool(c);
    PrefixConfig pc = new PrefixConfig();
    byte[] seed = new byte[32];
    for (int i = 0; i < 32; ++i) seed[i] = (byte) (7 + i);
    pc.setSeed(seed);
    pool.enablePrefixCache(pc, "named-tier-model", "", java.util.List.of(names));
    return pool;
  }
}
