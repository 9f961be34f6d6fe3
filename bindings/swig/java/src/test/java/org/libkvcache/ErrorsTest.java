package org.libkvcache;

import static org.junit.Assert.assertArrayEquals;
import static org.junit.Assert.assertEquals;
import static org.junit.Assert.assertFalse;
import static org.junit.Assert.assertThrows;
import static org.junit.Assert.assertTrue;
import static org.libkvcache.TestData.*;

import java.lang.reflect.InvocationTargetException;
import java.lang.reflect.Method;
import java.lang.reflect.Modifier;
import java.nio.ByteBuffer;
import java.util.ArrayList;
import java.util.List;
import java.util.concurrent.CountDownLatch;
import java.util.concurrent.atomic.AtomicBoolean;
import java.util.concurrent.atomic.AtomicLong;
import java.util.concurrent.atomic.AtomicReference;
import org.junit.Test;

public class ErrorsTest {
  private static void assertFailure(int status, KvcException e) {
    assertEquals(e.getMessage(), status, e.status());
    assertEquals(Kvc.statusName(status), e.statusName());
    assertFalse("empty message", e.detail().isEmpty());
    assertTrue(e.getMessage(), e.getMessage().startsWith(Kvc.statusName(status) + ": "));
  }

  @Test
  public void badDimensions() {
    PoolConfig c = config();
    c.setNumKvHeads(3); // 4 query heads are not a multiple of 3
    assertFailure(Kvc.ERR_INVALID_ARGUMENT, assertThrows(KvcException.class, () -> new Pool(c)));
    c.setNumKvHeads(KV_HEADS);
    c.setHeadDim(0);
    assertFailure(Kvc.ERR_INVALID_ARGUMENT, assertThrows(KvcException.class, () -> new Pool(c)));
  }

  @Test
  public void unknownSequence() {
    try (Pool pool = new Pool(config())) {
      assertFailure(Kvc.ERR_SEQ_NOT_FOUND, assertThrows(KvcException.class, () -> pool.seqLength(99)));
      assertFailure(Kvc.ERR_SEQ_NOT_FOUND, assertThrows(KvcException.class, () -> pool.seqFork(99, 100)));
      pool.seqCreate(1);
      assertFailure(Kvc.ERR_SEQ_EXISTS, assertThrows(KvcException.class, () -> pool.seqCreate(1)));
    }
  }

  @Test
  public void exhaustedPool() {
    try (Pool pool = new Pool(config())) {
      pool.seqCreate(1);
      // 64 blocks of 16 tokens over 2 layers hold 512 tokens of one sequence:
      // 513 never fit.
      assertFailure(Kvc.ERR_EXCEEDS_CAPACITY, assertThrows(KvcException.class, () -> pool.reserve(1, 513)));
      assertEquals(0, pool.seqLength(1)); // nothing changed
      // Room another sequence holds: not now.
      pool.seqCreate(2);
      pool.reserve(2, 16);
      assertFailure(Kvc.ERR_POOL_EXHAUSTED, assertThrows(KvcException.class, () -> pool.reserve(1, 512)));
      pool.seqFree(2);
      pool.reserve(1, 512);
      assertEquals(0, pool.stats().getBlocksFree());
    }
  }

  @Test
  public void badBuffers() {
    try (Pool pool = new Pool(config())) {
      pool.seqCreate(1);
      pool.reserve(1, 2);
      float[] row = random(ROW, 1);
      // Not a whole number of rows: the binding's own check.
      assertFailure(Kvc.ERR_INVALID_ARGUMENT,
          assertThrows(KvcException.class, () -> pool.append(1, 0, 0, new float[ROW + 1], new float[ROW + 1])));
      // K and V of different sizes.
      assertFailure(Kvc.ERR_INVALID_ARGUMENT,
          assertThrows(KvcException.class, () -> pool.append(1, 0, 0, row, new float[2 * ROW])));
      // Beyond the reserved length.
      assertFailure(Kvc.ERR_NOT_RESERVED, assertThrows(KvcException.class, () -> pool.append(1, 0, 2, row, row)));
      // Neither output.
      assertFailure(Kvc.ERR_NULL_POINTER, assertThrows(KvcException.class, () -> pool.gather(1, 0, 0, null, null)));
      // Types the binding does not take.
      IllegalArgumentException e =
          assertThrows(IllegalArgumentException.class, () -> pool.append(1, 0, 0, "k", row));
      assertTrue(e.getMessage(), e.getMessage().startsWith("k: "));
      assertThrows(IllegalArgumentException.class, () -> pool.append(1, 0, 0, row, new double[ROW]));
      assertThrows(IllegalArgumentException.class, () -> pool.gather(1, 0, 0, ByteBuffer.allocate(ROW * 4), null));
      assertThrows(IllegalArgumentException.class,
          () -> pool.gather(1, 0, 0, ByteBuffer.allocateDirect(ROW * 4).asReadOnlyBuffer(), null));
      // The pool still works.
      assertEquals(1, pool.append(1, 0, 0, row, row));
    }
  }

  @Test
  public void closeTwiceAndUseAfterClose() {
    Pool pool = new Pool(config());
    Policy policy;
    {
      PolicyConfig pc = new PolicyConfig();
      pc.setKind(Kvc.POLICY_STREAMING);
      pc.setRecentTokens(8);
      policy = new Policy(pc);
    }
    pool.seqCreate(1);
    assertFalse(pool.closed());
    pool.close();
    pool.close(); // harmless
    assertTrue(pool.closed());
    KvcException e = assertThrows(KvcException.class, () -> pool.seqLength(1));
    assertFailure(Kvc.ERR_NULL_POINTER, e);
    assertTrue(e.detail(), e.detail().contains("closed"));
    assertFailure(Kvc.ERR_NULL_POINTER, assertThrows(KvcException.class, pool::stats));
    assertFailure(Kvc.ERR_NULL_POINTER,
        assertThrows(KvcException.class, () -> pool.append(1, 0, 0, new float[ROW], new float[ROW])));

    policy.close();
    policy.close();
    assertTrue(policy.closed());
    try (Pool other = new Pool(config())) {
      other.seqCreate(1);
      assertFailure(Kvc.ERR_NULL_POINTER, assertThrows(KvcException.class, () -> other.setPolicy(policy)));
      assertFailure(Kvc.ERR_NULL_POINTER, assertThrows(KvcException.class, () -> other.evict(1, policy)));
    }
    // delete() is close() (the handle stays until the Cleaner frees it): safe after close() and before it.
    pool.delete();
    policy.delete();
    pool.close();
    assertTrue(pool.closed());
    assertTrue(policy.closed());
    assertFailure(Kvc.ERR_NULL_POINTER, assertThrows(KvcException.class, () -> pool.seqLength(1)));
  }

  /** Threads failing at the same time each get their own call's message. */
  @Test
  public void concurrentMessages() throws Exception {
    try (Pool pool = new Pool(config())) {
      pool.seqCreate(1);
      java.util.concurrent.ExecutorService ex = java.util.concurrent.Executors.newFixedThreadPool(8);
      java.util.List<java.util.concurrent.Future<?>> futures = new java.util.ArrayList<>();
      for (int w = 0; w < 8; ++w) {
        final long seq = 1000 + w;
        futures.add(ex.submit(() -> {
          for (int i = 0; i < 2000; ++i) {
            KvcException e = assertThrows(KvcException.class, () -> pool.seqLength(seq));
            assertEquals(Kvc.ERR_SEQ_NOT_FOUND, e.status());
            assertTrue(e.detail(), e.detail().contains(Long.toString(seq)));
            assertEquals(0, pool.seqLength(1));
          }
          return null;
        }));
      }
      for (java.util.concurrent.Future<?> f : futures) f.get();
      ex.shutdown();
    }
  }

  /**
   * delete() of a Pool while other threads are inside calls on it: it waits
   * for them (it is close()), the handle stays until the Cleaner frees it, and
   * every later call throws ERR_NULL_POINTER. It used to free the pool and the
   * handle under the running calls (a JVM crash).
   */
  @Test
  public void deletePoolWhileCallsRun() throws Exception {
    final int threads = 4, rounds = 12;
    final int n = 64; // tokens per gather: long enough calls to overlap with delete()
    float[] data = random(n * ROW, 7);
    for (int round = 0; round < rounds; ++round) {
      Pool pool = new Pool(config());
      pool.seqCreate(1);
      pool.reserve(1, n);
      pool.append(1, 0, 0, data, data);
      AtomicReference<Throwable> failure = new AtomicReference<>();
      AtomicLong calls = new AtomicLong();
      CountDownLatch started = new CountDownLatch(threads);
      List<Thread> workers = new ArrayList<>();
      for (int t = 0; t < threads; ++t) {
        final int id = t;
        Thread w = new Thread(() -> {
          float[] out = new float[n * ROW];
          started.countDown();
          try {
            while (true) {
              switch (id % 3) {
                case 0: pool.gather(1, 0, 0, out, out); break;
                case 1: pool.append(1, 1, 0, data, data); break;
                default: pool.stats(); pool.seqLength(1); break;
              }
              calls.incrementAndGet();
            }
          } catch (KvcException e) {
            if (e.status() != Kvc.ERR_NULL_POINTER || !e.detail().contains("closed")) failure.set(e);
          } catch (Throwable e) {
            failure.set(e);
          }
        });
        w.start();
        workers.add(w);
      }
      started.await();
      while (calls.get() < 2 * threads) Thread.yield();
      pool.delete(); // waits for the calls in flight
      assertTrue("delete() freed the handle", Pool.getCPtr(pool) != 0); // the Cleaner's job
      for (Thread w : workers) w.join(30000);
      if (failure.get() != null) throw new AssertionError("round " + round, failure.get());
      assertTrue(pool.closed());
      KvcException e = assertThrows(KvcException.class, () -> pool.seqLength(1));
      assertFailure(Kvc.ERR_NULL_POINTER, e);
      assertTrue(e.detail(), e.detail().contains("closed"));
      pool.delete(); // again: nothing
      pool.close();
    }
  }

  /** The same for a Policy deleted while other threads evict with it or attach it. */
  @Test
  public void deletePolicyWhileCallsRun() throws Exception {
    PolicyConfig pc = new PolicyConfig();
    pc.setKind(Kvc.POLICY_STREAMING);
    pc.setSinkTokens(2);
    pc.setRecentTokens(4);
    for (int round = 0; round < 12; ++round) {
      try (Pool pool = new Pool(config())) {
        Policy policy = new Policy(pc);
        AtomicReference<Throwable> failure = new AtomicReference<>();
        AtomicLong calls = new AtomicLong();
        List<Thread> workers = new ArrayList<>();
        for (int t = 0; t < 3; ++t) {
          final long seq = 10 + t;
          pool.seqCreate(seq);
          Thread w = new Thread(() -> {
            try {
              while (true) {
                pool.seqSetPolicy(seq, policy);
                pool.evict(seq, policy);
                calls.incrementAndGet();
              }
            } catch (KvcException e) {
              if (e.status() != Kvc.ERR_NULL_POINTER) failure.set(e);
            } catch (Throwable e) {
              failure.set(e);
            }
          });
          w.start();
          workers.add(w);
        }
        while (calls.get() < 6) Thread.yield();
        policy.delete();
        assertTrue("delete() freed the handle", Policy.getCPtr(policy) != 0); // the Cleaner's job
        for (Thread w : workers) w.join(30000);
        if (failure.get() != null) throw new AssertionError("round " + round, failure.get());
        assertTrue(policy.closed());
        assertFailure(Kvc.ERR_NULL_POINTER, assertThrows(KvcException.class, () -> pool.setPolicy(policy)));
        assertArrayEquals(perLayer(0), pool.evict(10)); // the sequence keeps its own reference
      }
    }
  }

  /** A value for each parameter type of the proxies' methods. */
  private static Object argumentFor(Class<?> type) {
    if (type == long.class) return 0L;
    if (type == int.class) return 0;
    if (type == double.class) return 0.0;
    if (type == float.class) return 0f;
    if (type == boolean.class) return false;
    if (type == Integer.class) return 0;
    return null;
  }

  /**
   * Every public method of every struct and vector proxy, getters and setters
   * included, throws KvcException ERR_NULL_POINTER after delete(): no NULL
   * dereference (a JVM crash before the check typemap on self).
   */
  @Test
  public void deletedObjectsThrow() throws Exception {
    Object[] objects = {new PoolConfig(), new PolicyConfig(), new PrefixConfig(), new Codec(), new Stats(),
                        new PrefixResult(), new PrefixStats(), new QuantSizes(), new Int32Vector(new int[] {1, 2})};
    int checked = 0;
    List<String> failures = new ArrayList<>();
    for (Object o : objects) {
      o.getClass().getMethod("delete").invoke(o);
      o.getClass().getMethod("delete").invoke(o); // twice: nothing
      for (Method m : o.getClass().getDeclaredMethods()) {
        if (!Modifier.isPublic(m.getModifiers()) || Modifier.isStatic(m.getModifiers()) || m.isBridge()
            || m.getName().equals("delete"))
          continue;
        Object[] args = new Object[m.getParameterCount()];
        for (int i = 0; i < args.length; ++i) args[i] = argumentFor(m.getParameterTypes()[i]);
        String name = o.getClass().getSimpleName() + "." + m.getName();
        try {
          m.invoke(o, args);
          failures.add(name + ": no exception");
        } catch (InvocationTargetException e) {
          Throwable c = e.getCause();
          if (!(c instanceof KvcException) || ((KvcException) c).status() != Kvc.ERR_NULL_POINTER
              || !((KvcException) c).detail().contains("deleted"))
            failures.add(name + ": " + c);
        }
        ++checked;
      }
    }
    assertTrue(failures.toString(), failures.isEmpty());
    assertTrue("only " + checked + " methods", checked > 100);
  }

  /**
   * A deleted object passed as an argument is an error, not null ("none"):
   * no unquantized pool for a deleted codec, no detached policy, no default
   * prefix settings.
   */
  @Test
  public void deletedArgumentsThrow() {
    PoolConfig cfg = config();
    cfg.delete();
    KvcException e = assertThrows(KvcException.class, () -> new Pool(cfg));
    assertFailure(Kvc.ERR_NULL_POINTER, e);
    assertTrue(e.detail(), e.detail().contains("config: the PoolConfig was deleted"));

    Codec codec = new Codec();
    codec.delete();
    e = assertThrows(KvcException.class, () -> new Pool(config(), codec, null));
    assertTrue(e.detail(), e.detail().contains("k_codec: the Codec was deleted"));
    assertFailure(Kvc.ERR_NULL_POINTER, assertThrows(KvcException.class, () -> new Pool(config(), null, codec)));

    PolicyConfig pc = new PolicyConfig();
    pc.setKind(Kvc.POLICY_STREAMING);
    pc.setRecentTokens(16);
    PolicyConfig deletedPc = new PolicyConfig();
    deletedPc.delete();
    assertFailure(Kvc.ERR_NULL_POINTER, assertThrows(KvcException.class, () -> new Policy(deletedPc)));

    try (Pool pool = new Pool(config()); Policy live = new Policy(pc)) {
      Policy gone = new Policy(pc);
      gone.delete();
      pool.seqCreate(1);
      pool.reserve(1, 40);
      for (int l = 0; l < LAYERS; ++l) pool.append(1, l, 0, random(40 * ROW, l), random(40 * ROW, 9 + l));
      pool.setPolicy(live);
      assertFailure(Kvc.ERR_NULL_POINTER, assertThrows(KvcException.class, () -> pool.setPolicy(gone)));
      assertFailure(Kvc.ERR_NULL_POINTER, assertThrows(KvcException.class, () -> pool.seqSetPolicy(1, gone)));
      assertFailure(Kvc.ERR_NULL_POINTER, assertThrows(KvcException.class, () -> pool.evict(1, gone)));
      assertArrayEquals(perLayer(40 - 4 - 16), pool.evict(1)); // the pool's policy is still the live one

      PrefixConfig prefix = new PrefixConfig();
      prefix.delete();
      e = assertThrows(KvcException.class, () -> pool.enablePrefixCache(prefix, "m", "t"));
      assertFailure(Kvc.ERR_NULL_POINTER, e);
      assertTrue(e.detail(), e.detail().contains("config: the PrefixConfig was deleted"));
      pool.enablePrefixCache(); // not enabled by the failed call
    }
    Int32Vector v = new Int32Vector(new int[] {1});
    v.delete();
    e = assertThrows(KvcException.class, () -> new Int32Vector(v)); // a reference argument
    assertTrue(e.detail(), e.detail().contains("other: the Int32Vector was deleted"));
  }

  /** uint32_t arguments and fields are range-checked, never truncated; uint64_t takes negative longs. */
  @Test
  public void uint32Range() {
    PoolConfig c = config();
    IllegalArgumentException e = assertThrows(IllegalArgumentException.class, () -> c.setNumLayers((1L << 32) + 2));
    assertTrue(e.getMessage(), e.getMessage().contains("4294967298"));
    assertEquals(LAYERS, c.getNumLayers());
    assertThrows(IllegalArgumentException.class, () -> c.setNumLayers(-1));
    assertThrows(IllegalArgumentException.class, () -> c.setHeadDim(Long.MIN_VALUE));
    c.setFlags(0xFFFFFFFFL); // the largest uint32_t
    assertEquals(0xFFFFFFFFL, c.getFlags());
    c.setFlags(0);
    try (Pool pool = new Pool(c)) {
      pool.seqCreate(1);
      pool.reserve(1, 1);
      float[] row = random(ROW, 3), other = random(ROW, 4);
      pool.append(1, 0, 0, row, row);
      assertThrows(IllegalArgumentException.class, () -> pool.append(1, 1L << 32, 0, other, other));
      assertThrows(IllegalArgumentException.class, () -> pool.gather(1, -1, 0, new float[ROW], null));
      assertThrows(IllegalArgumentException.class, () -> pool.layerTokens(1, 1L << 32));
      assertThrows(IllegalArgumentException.class, () -> pool.blockTable(1, (1L << 32) + 1));
      assertThrows(IllegalArgumentException.class, () -> pool.prefixLookup(new int[] {1}, 1L << 32));
      float[] out = new float[ROW];
      pool.gather(1, 0, 0, out, null);
      assertF16Close(row, out); // layer 0 was not overwritten
      // uint64_t: a negative long is the value 2^64 + it.
      long max = Long.parseUnsignedLong("18446744073709551615");
      assertEquals(-1L, max);
      pool.seqCreate(max);
      pool.reserve(max, 3);
      assertEquals(3, pool.seqLength(-1L));
      assertEquals("18446744073709551615", Long.toUnsignedString(-1L));
    }
  }
}
