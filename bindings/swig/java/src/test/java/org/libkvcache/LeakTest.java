package org.libkvcache;

import static org.junit.Assert.assertTrue;
import static org.libkvcache.TestData.*;

import org.junit.Assume;
import org.junit.Test;

public class LeakTest {
  /** One pool created, written (so its block memory is touched) and closed. */
  private static void cycle(PoolConfig cfg, float[] row) {
    try (Pool pool = new Pool(cfg)) {
      pool.seqCreate(1);
      pool.reserve(1, 1);
      pool.append(1, 0, 0, row, row);
    }
  }

  /** 10,000 pools created and closed leave VmRSS flat (8 MiB slack). */
  @Test
  public void tenThousandPoolsLeaveMemoryFlat() throws InterruptedException {
    Assume.assumeTrue("no /proc/self/status", vmRssKiB() > 0);
    PoolConfig cfg = config();
    float[] row = random(ROW, 1);
    for (int i = 0; i < 2000; ++i) cycle(cfg, row); // warm-up: JIT, allocator, Cleaner thread
    System.gc();
    Thread.sleep(200);
    long before = vmRssKiB();
    for (int i = 0; i < 10000; ++i) cycle(cfg, row);
    System.gc();
    Thread.sleep(200);
    long after = vmRssKiB();
    System.out.println("VmRSS before " + before + " KiB, after " + after + " KiB");
    assertTrue("VmRSS grew by " + (after - before) + " KiB", after - before < 8 * 1024);
  }

  /** Pools never closed are freed by the Cleaner once unreachable. */
  @Test
  public void unclosedPoolsAreCleaned() throws InterruptedException {
    PoolConfig cfg = config();
    long start = NativeResource.FREED.get();
    final int pools = 1000;
    for (int i = 0; i < pools; ++i) new Pool(cfg).seqCreate(1);
    for (int round = 0; round < 100 && NativeResource.FREED.get() - start < pools; ++round) {
      System.gc();
      Thread.sleep(20);
    }
    assertTrue("freed " + (NativeResource.FREED.get() - start) + " of " + pools,
        NativeResource.FREED.get() - start >= pools);
  }
}
