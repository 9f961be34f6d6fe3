package org.libkvcache;

import static org.junit.Assert.assertEquals;
import static org.junit.Assert.assertNotEquals;
import static org.junit.Assert.assertThrows;
import static org.junit.Assert.assertTrue;

import java.nio.ByteBuffer;
import java.nio.ByteOrder;
import org.junit.Test;

/**
 * ctest abi_init_java: the binding initialises structs with
 * kvc_&lt;thing&gt;_init_sized, never past the caller's struct
 * (docs/abi-policy.md). Each config and result class has a static
 * initSized(buffer, structSize), the call its constructor makes with the
 * binding's own size; a caller buffer of an older header's size, followed by
 * guard bytes, keeps its guard bytes and gets struct_size = its size.
 */
public class InitSizedTest {
  static final int GUARD = 64;
  static final byte G = (byte) 0xa5;

  /** One struct: its initSized, its 0.3 size, older callers' sizes, a size inside a field (0: none), a default. */
  static final class Case {
    final String name;
    final Init init;
    final long size03;
    final long[] older;
    final long inside;
    final int defaultOffset;
    final int defaultValue;

    Case(String name, Init init, long size03, long[] older, long inside, int defaultOffset, int defaultValue) {
      this.name = name;
      this.init = init;
      this.size03 = size03;
      this.older = older;
      this.inside = inside;
      this.defaultOffset = defaultOffset;
      this.defaultValue = defaultValue;
    }
  }

  interface Init {
    void run(Object buffer, long structSize);
  }

  static final Case[] CASES = {
    new Case("PoolConfig", PoolConfig::initSized, 136, new long[] {48, 72, 112, 136}, 76, 24, 16),
    new Case("Codec", Codec::initSized, 56, new long[] {48, 52, 56}, 50, 16, 32),
    new Case("PolicyConfig", PolicyConfig::initSized, 88, new long[] {88}, 0, 12, 4),
    new Case("PrefixConfig", PrefixConfig::initSized, 72, new long[] {72}, 0, 12, 1),
    new Case("Stats", Stats::initSized, 128, new long[] {48, 96, 128}, 52, -1, 0),
    new Case("PrefixStats", PrefixStats::initSized, 80, new long[] {80}, 0, -1, 0),
    new Case("QuantSizes", QuantSizes::initSized, 40, new long[] {40}, 0, -1, 0),
    new Case("TierConfig", TierConfig::initSized, 56, new long[] {56}, 0, 40, 1000),
    new Case("TierStats", TierStats::initSized, 352, new long[] {352}, 0, -1, 0),
  };

  private static ByteBuffer guarded(long n) {
    ByteBuffer b = ByteBuffer.allocateDirect((int) n).order(ByteOrder.nativeOrder());
    for (int i = 0; i < n; ++i) b.put(i, G);
    return b;
  }

  /** Older callers' sizes through a direct ByteBuffer and a byte[]: guard bytes intact, struct_size theirs. */
  @Test
  public void olderCallerGuardBytes() {
    assertEquals(152, new PoolConfig().getStructSize()); // the constructor: this binding's sizeof (0.4: per-layer codecs)
    assertEquals(56, new TierConfig(Kvc.TIER_DISK).getStructSize());
    for (Case c : CASES) {
      for (long size : c.older) {
        ByteBuffer b = guarded(size + GUARD);
        c.init.run(b, size);
        assertEquals(c.name, size, b.getLong(0));
        for (int i = (int) size; i < size + GUARD; ++i)
          assertEquals(c.name + ": init of " + size + " bytes wrote byte " + i, G, b.get(i));
        for (int i = 8; i < size; ++i) assertNotEquals(c.name + " byte " + i, G, b.get(i));
        if (c.defaultOffset >= 0 && c.defaultOffset + 4 <= size)
          assertEquals(c.name, c.defaultValue, b.getInt(c.defaultOffset));

        byte[] a = new byte[(int) (size + GUARD)];
        java.util.Arrays.fill(a, G);
        c.init.run(a, size);
        assertEquals(c.name, size, ByteBuffer.wrap(a).order(ByteOrder.nativeOrder()).getLong(0));
        for (int i = (int) size; i < a.length; ++i) assertEquals(c.name + " byte[] " + i, G, a[i]);
      }
    }
  }

  /** Sizes inside a field, below the oldest struct or beyond the buffer are refused and write nothing. */
  @Test
  public void refusedSizesWriteNothing() {
    for (Case c : CASES) {
      long[] sizes = c.inside > 0 ? new long[] {0, 8, c.older[0] - 8, c.inside} : new long[] {0, 8, c.older[0] - 8};
      for (long size : sizes) {
        ByteBuffer b = guarded(c.size03 + GUARD);
        KvcException e = assertThrows(KvcException.class, () -> c.init.run(b, size));
        assertEquals(c.name + " " + size, Kvc.ERR_STRUCT_SIZE, e.status());
        if (c.inside > 0 && size == c.inside) assertTrue(e.detail(), e.detail().contains("inside field"));
        for (int i = 0; i < c.size03 + GUARD; ++i) assertEquals(G, b.get(i));
      }
      ByteBuffer small = guarded(c.size03 - 8);
      assertEquals(Kvc.ERR_BUFFER_TOO_SMALL,
                   assertThrows(KvcException.class, () -> c.init.run(small, c.size03)).status());
      assertEquals(Kvc.ERR_NULL_POINTER, assertThrows(KvcException.class, () -> c.init.run(null, c.size03)).status());
    }
  }

  /** A newer caller's struct: the library's fields filled, the unknown tail zeroed, nothing after it. */
  @Test
  public void newerCallerTailZeroed() {
    for (Case c : CASES) {
      long size = c.size03 + 40;
      ByteBuffer b = guarded(size + GUARD);
      c.init.run(b, size);
      assertEquals(size, b.getLong(0));
      // Structs that grew after 0.3: kvc_prefix_config (88, zero defaults), kvc_policy_config
      // (120: future_positions, default 512, at offset 88; head_budget 0 at 92; head_floor 0.2
      // at 96; head_gates NULL at 104, num_head_gates 0 at 112, gate_threshold 0.5 at 116).
      long known =
          c.name.equals("PolicyConfig")
              ? 120
              : c.name.equals("PrefixConfig") ? 88 : c.name.equals("Codec") ? 64 : c.size03;
      if (c.name.equals("PolicyConfig")) {
        assertEquals(512, b.getInt(88));
        assertEquals(0.2, b.getDouble(96), 0.0);
        assertEquals(0.5f, b.getFloat(116), 0.0f);
      }
      for (int i = (int) known; i < size; ++i) assertEquals(c.name, 0, b.get(i));
      for (int i = (int) size; i < size + GUARD; ++i) assertEquals(c.name, G, b.get(i));
    }
    ByteBuffer b = guarded(56 + GUARD);
    TierConfig.initSized(b, 56, Kvc.TIER_REDIS);
    assertEquals(Kvc.TIER_REDIS, b.getInt(8));
  }
}
