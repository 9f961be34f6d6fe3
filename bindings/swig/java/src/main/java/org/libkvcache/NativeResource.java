package org.libkvcache;

import java.lang.ref.Cleaner;
import java.util.concurrent.atomic.AtomicLong;
import java.util.function.LongConsumer;

/**
 * The native memory one proxy object owns (a Pool, a PoolConfig, a Stats...):
 * freed by the object's delete() / close(), or by a {@link Cleaner} once the
 * object is unreachable, whichever comes first, and never twice.
 *
 * <p>Used by the SWIG proxy classes (javabody typemap in kvcache_java.i) in
 * place of finalize(), deprecated since Java 9. The cleaning action holds the
 * address and the free function only, never the proxy object.
 */
final class NativeResource implements Runnable {
  private static final Cleaner CLEANER = Cleaner.create();
  /** Native objects freed so far (by delete() or the Cleaner), for the tests. */
  static final AtomicLong FREED = new AtomicLong();

  private final LongConsumer free;
  private long ptr;
  private Cleaner.Cleanable cleanable;

  private NativeResource(long ptr, LongConsumer free) {
    this.ptr = ptr;
    this.free = free;
  }

  /** Frees {@code ptr} with {@code free} when {@code owner} becomes unreachable, unless freed or released before. */
  static NativeResource register(Object owner, long ptr, LongConsumer free) {
    NativeResource r = new NativeResource(ptr, free);
    r.cleanable = CLEANER.register(owner, r);
    return r;
  }

  /** The cleaning action: frees the memory at most once. */
  @Override
  public void run() {
    long p;
    synchronized (this) {
      p = ptr;
      ptr = 0;
    }
    if (p != 0) {
      free.accept(p);
      FREED.incrementAndGet();
    }
  }

  /** Frees the memory now (delete(), close()). */
  void free() {
    cleanable.clean();
  }

  /** Gives the memory away without freeing it (ownership moved to C++). */
  void release() {
    synchronized (this) {
      ptr = 0;
    }
    cleanable.clean();
  }
}
