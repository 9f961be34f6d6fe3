package org.libkvcache;

import static org.junit.Assert.assertEquals;
import static org.junit.Assert.assertFalse;
import static org.junit.Assert.assertThrows;
import static org.junit.Assert.assertTrue;
import static org.libkvcache.TestData.*;

import java.nio.ByteBuffer;
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
      // 64 blocks of 16 tokens over 2 layers hold 512 tokens of one sequence.
      assertFailure(Kvc.ERR_POOL_EXHAUSTED, assertThrows(KvcException.class, () -> pool.reserve(1, 513)));
      assertEquals(0, pool.seqLength(1)); // nothing changed
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
    // delete() frees the handles too; close() and closed() stay safe after it.
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
}
