package org.libkvcache;

import static org.junit.Assert.assertArrayEquals;
import static org.junit.Assert.assertEquals;
import static org.junit.Assert.assertThrows;
import static org.libkvcache.TestData.*;

import org.junit.Test;

public class EvictTest {
  static final int N = 40, SINK = 4, RECENT = 16;

  private static Policy streaming() {
    PolicyConfig pc = new PolicyConfig();
    pc.setKind(Kvc.POLICY_STREAMING);
    pc.setSinkTokens(SINK);
    pc.setRecentTokens(RECENT);
    return new Policy(pc);
  }

  private static float[][] fill(Pool pool, long seq) {
    pool.seqCreate(seq);
    pool.reserve(seq, N);
    float[][] k = new float[LAYERS][];
    for (int l = 0; l < LAYERS; ++l) {
      k[l] = random(N * ROW, 100 * seq + l);
      pool.append(seq, l, 0, k[l], random(N * ROW, 100 * seq + 50 + l));
    }
    return k;
  }

  /** StreamingLLM keeps the 4 sinks and the 16 newest tokens of each layer, with their positions. */
  @Test
  public void streamingKeepsSinksAndRecent() {
    try (Pool pool = new Pool(config()); Policy policy = streaming()) {
      float[][] k = fill(pool, 1);
      long before = pool.stats().getBlocksUsed();
      long[] dropped = pool.evict(1, policy);
      assertArrayEquals(perLayer(N - SINK - RECENT), dropped); // per layer, as kvc_evict
      int kept = SINK + RECENT;
      int[] want = new int[kept];
      for (int i = 0; i < SINK; ++i) want[i] = i;
      for (int i = 0; i < RECENT; ++i) want[SINK + i] = N - RECENT + i;
      for (int l = 0; l < LAYERS; ++l) {
        assertEquals(kept, pool.layerTokens(1, l));
        assertArrayEquals(want, pool.positions(1, l, 0, kept).stream().mapToInt(Integer::intValue).toArray());
        float[] ko = new float[kept * ROW];
        assertEquals(kept, pool.gather(1, l, 0, ko, null));
        for (int i = 0; i < kept; ++i) assertF16Close(k[l], want[i] * ROW, ko, i * ROW, ROW);
      }
      assertEquals(N, pool.seqLength(1)); // the next position to write is unchanged
      assertEquals(before - LAYERS * 1, pool.stats().getBlocksUsed()); // 40 -> 20 tokens: 3 -> 2 blocks per layer
      assertArrayEquals(perLayer(0), pool.evict(1, policy)); // nothing left to drop
    }
  }

  /** The sequence's own policy (seqSetPolicy) and the pool's default (setPolicy) apply when evict() gets none. */
  @Test
  public void attachedPolicies() {
    Policy policy = streaming();
    try (Pool pool = new Pool(config())) {
      fill(pool, 1);
      fill(pool, 2);
      fill(pool, 3);
      pool.seqSetPolicy(1, policy);
      assertArrayEquals(perLayer(N - SINK - RECENT), pool.evict(1));
      assertArrayEquals(perLayer(0), pool.evict(2)); // no policy anywhere: nothing dropped
      pool.setPolicy(policy);
      policy.close(); // the pool keeps its own reference
      assertArrayEquals(perLayer(N - SINK - RECENT), pool.evict(3));
      assertEquals(SINK + RECENT, pool.layerTokens(3, 1));
    }
  }

  /** DuoAttention's per-head gates (Policy.withHeadGates) in a head-wise pool: layer 0's heads stream. */
  @Test
  public void duoAttentionGates() {
    PoolConfig c = config();
    c.setFlags(c.getFlags() | Kvc.POOL_HEADWISE);
    PolicyConfig pc = new PolicyConfig();
    pc.setKind(Kvc.POLICY_DUO_ATTENTION);
    pc.setSinkTokens(SINK);
    pc.setRecentTokens(RECENT);
    try (Pool pool = new Pool(c);
        Policy policy = Policy.withHeadGates(pc, new float[] {0.1f, 0.2f, 0.9f, 0.0f})) {
      fill(pool, 1);
      long before = pool.stats().getBlocksUsed();
      pool.evict(1, policy);
      assertEquals(SINK + RECENT, pool.layerTokens(1, 0)); // both heads stream
      assertEquals(N, pool.layerTokens(1, 1)); // head 0 of layer 1 keeps every token
      assertEquals(SINK + RECENT, pool.headTokens(1, 1, 1));
      assertEquals(before - 3, pool.stats().getBlocksUsed()); // three heads: 3 -> 2 blocks each
    }
    KvcException e =
        assertThrows(KvcException.class, () -> Policy.withHeadGates(pc, new float[] {0.1f, Float.NaN}));
    assertEquals(Kvc.ERR_INVALID_ARGUMENT, e.status());
  }
}
