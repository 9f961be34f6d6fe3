package org.libkvcache;

import static org.junit.Assert.assertArrayEquals;
import static org.junit.Assert.assertEquals;
import static org.junit.Assert.assertFalse;
import static org.junit.Assert.assertNull;
import static org.junit.Assert.assertThrows;
import static org.junit.Assert.assertTrue;

import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.nio.file.Paths;
import org.junit.Test;

/** Stores (kvc_store_*, docs/engines.md) and llama.cpp sequence state blobs through the binding. */
public class StoreTest {
  static byte[] b(String s) {
    return s.getBytes(StandardCharsets.UTF_8);
  }

  static Store host(long capacity, String scope) {
    return new Store(Kvc.TIER_HOST, capacity, "", "", 0, 1000, 0, b(scope));
  }

  @Test
  public void roundTrip() {
    Store s = host(1 << 20, "java-test");
    try {
      byte[] big = new byte[10000];
      for (int i = 0; i < big.length; ++i) big[i] = (byte) (i * 7);
      s.put(b("page-1"), b("hello"));
      s.put(b("page-2"), big);
      assertArrayEquals(b("hello"), s.get(b("page-1")));
      assertArrayEquals(big, s.get(b("page-2")));
      assertNull(s.get(b("absent")));
      boolean[] has = s.contains(new byte[][] {b("page-2"), b("x"), b("page-1")});
      assertEquals(3, has.length);
      assertTrue(has[0]);
      assertFalse(has[1]);
      assertTrue(has[2]);
      assertTrue(s.pin(b("page-1")));
      assertTrue(s.unpin(b("page-1")));
      assertTrue(s.remove(b("page-1")));
      assertFalse(s.remove(b("page-1")));
      TierStats st = s.stats();
      try {
        assertEquals(1, st.getEntries());
      } finally {
        st.delete();
      }
    } finally {
      s.close();
    }
    KvcException e = assertThrows(KvcException.class, () -> s.put(b("k"), b("v")));
    assertEquals(Kvc.ERR_NULL_POINTER, e.status());
  }

  @Test
  public void badInput() {
    Store s = host(1 << 16, "");
    try {
      KvcException e = assertThrows(KvcException.class, () -> s.put(new byte[Kvc.STORE_KEY_MAX + 1], b("v")));
      assertEquals(Kvc.ERR_INVALID_ARGUMENT, e.status());
      assertThrows(KvcException.class, () -> s.put(b("k"), new byte[1 << 17]));
      e = assertThrows(KvcException.class, () -> s.contains(new byte[][] {b("a"), null}));
      assertEquals(Kvc.ERR_NULL_POINTER, e.status());
    } finally {
      s.close();
    }
    KvcException e = assertThrows(KvcException.class, () -> host(0, "x"));
    assertEquals(Kvc.ERR_INVALID_ARGUMENT, e.status());
  }

  @Test
  public void llamaState() throws Exception {
    String src = System.getenv("KVC_SOURCE_DIR");
    assertTrue("KVC_SOURCE_DIR (set by ctest)", src != null);
    byte[] blob = Files.readAllBytes(Paths.get(src, "tests", "fixtures", "smollm2", "llama-state-f16.bin"));
    PoolConfig c = new PoolConfig();
    c.setNumLayers(30);
    c.setNumQHeads(9);
    c.setNumKvHeads(3);
    c.setHeadDim(64);
    c.setBlockSize(16);
    c.setNumBlocks(64);
    c.setKDtype(Kvc.DTYPE_F16);
    c.setVDtype(Kvc.DTYPE_F16);
    Pool pool = new Pool(c);
    try {
      assertEquals(8, pool.importLlama(1, blob, 0));
      assertArrayEquals(blob, pool.exportLlama(1, 0, Kvc.LLAMA_F16, Kvc.LLAMA_F16, 0));
      byte[] cut = java.util.Arrays.copyOf(blob, blob.length - 1);
      KvcException e = assertThrows(KvcException.class, () -> pool.importLlama(2, cut, 0));
      assertEquals(Kvc.ERR_CORRUPT, e.status());
      e = assertThrows(KvcException.class, () -> pool.seqLength(2));
      assertEquals(Kvc.ERR_SEQ_NOT_FOUND, e.status());
    } finally {
      pool.close();
    }
  }
}
