/*
 * Java overlay of bindings/swig/kvcache_common.i: builds the Java package
 * org.libkvcache (swig -java -package org.libkvcache) and its JNI library
 * libkvcache_jni.so, loaded with System.loadLibrary("kvcache_jni") (found
 * through java.library.path).
 *
 * Names: Java style (lowerCamelCase methods and field accessors: seqCreate,
 * setNumLayers...); enum constants are int constants of the module class Kvc
 * (Kvc.DTYPE_F16, Kvc.ERR_SEQ_NOT_FOUND...). uint64_t is a Java long: values
 * at or above 2^63 read as negative longs (Long.toUnsignedString shows them)
 * and are passed as negative longs (Long.parseUnsignedLong makes them).
 * uint32_t is a Java long too, checked: a value outside 0..2^32-1 throws
 * IllegalArgumentException (never truncated).
 *
 * Errors: a failed call throws org.libkvcache.KvcException(status, message),
 * both read inside the failing native call (%exception below).
 *
 * Buffers (K/V data, codes, scales): an Object checked at run time:
 *   float[]  f32 data;   short[]  f16 / bf16 bit patterns;   byte[]  codes;
 *   a direct java.nio.ByteBuffer: its bytes [position, limit), zero-copy
 *     (position is not advanced; fill it in ByteOrder.nativeOrder());
 *   null     no buffer.
 * Arrays are read (and written back, for outputs) with Get/Release<T>ArrayElements,
 * which may copy (HotSpot does); use direct ByteBuffers to avoid the copy.
 * Anything else throws IllegalArgumentException. Token ids: int[].
 * The K/V methods (Pool.append / gather, Codec.quantize / dequantize) are
 * Java methods (Buffers.java) over private raw natives: they check the array
 * type against the dtype first (float[]: DTYPE_F32 only; short[]: DTYPE_F16 /
 * DTYPE_BF16 only; byte[] and direct ByteBuffers: raw bytes of any dtype), so
 * data is never reinterpreted as another dtype.
 *
 * Strings: passed as their UTF-8 bytes (String.getBytes(UTF_8) -> byte[] ->
 * std::string of exactly those bytes), NUL characters included, not JNI's
 * modified UTF-8: a salt or model id gives the same key as from Go or Python.
 *
 * Lifetime: Pool and Policy are AutoCloseable; close() and delete() both
 * destroy the library object under the handle's exclusive lock, once the calls
 * in flight are done (idempotent; later calls throw KvcException
 * ERR_NULL_POINTER "the pool is closed"). Their small native handle (the lock
 * and the pointer) is freed only by a java.lang.ref.Cleaner once the proxy is
 * unreachable, when no thread can be inside a call on it. Every other proxy
 * object that owns native memory (PoolConfig, Stats, Codec, Int32Vector...)
 * is freed by delete() or else by the Cleaner; using it after delete() throws
 * KvcException ERR_NULL_POINTER ("the object was deleted", check typemap), and
 * passing it as an argument too (javain typemap): never a NULL dereference,
 * and never "null = none". These smaller objects are not thread-safe: do not
 * delete() one while another thread uses it. finalize() is not used
 * (deprecated since Java 9; SWIG's default javafinalize is replaced by an
 * empty one).
 */
%module(jniclassname="KvcJNI") Kvc

%include <enumsimple.swg>
%javaconst(1);
/* Enum items and #defines become compile-time constants (usable in switch).
 * A #define whose C value Java cannot compile (a macro, a u suffix) needs a
 * literal here, or javac fails on KvcConstants.java. */
%javaconstvalue(4) KVC_API_VERSION;
%javaconstvalue(65536) KVC_STRUCT_SIZE_MAX;
%javaconstvalue(1) KVC_POOL_ZERO_ON_FREE;
%javaconstvalue(2) KVC_POOL_PRE_ROPE_KEYS;
%javaconstvalue(4) KVC_POOL_HEADWISE;
%javaconstvalue(1) KVC_PREFIX_PARTIAL;
%javaconstvalue(2) KVC_PREFIX_PIN;
%javaconstvalue(1) KVC_TIER_FSYNC;
%javaconstvalue(2) KVC_TIER_REDIS_CLUSTER;
%javaconstvalue(1) KVC_LLAMA_ATTN_ROT;
%javaconstvalue(2) KVC_LLAMA_V_TRANS;
%javaconst(0) KVC_VERSION_NUMBER;

/* The enums' FORCE_32BIT / FORCE_SIGNED markers are not values. The common
 * file's regex %rename("$ignore") "FORCE_" loses to its later
 * %rename(strip:[KVC_]) of all enum items (the last matching %rename wins),
 * so they are ignored here by name (INT32_MIN is no Java constant). */
%ignore KVC_COPY_DIRECTION_FORCE_32BIT; %ignore KVC_COPY_DIRECTION_FORCE_SIGNED;
%ignore KVC_DEVICE_FORCE_32BIT; %ignore KVC_DEVICE_FORCE_SIGNED;
%ignore KVC_DTYPE_FORCE_32BIT; %ignore KVC_DTYPE_FORCE_SIGNED;
%ignore KVC_HEAD_BUDGET_FORCE_32BIT; %ignore KVC_HEAD_BUDGET_FORCE_SIGNED;
%ignore KVC_GRANULARITY_FORCE_32BIT; %ignore KVC_GRANULARITY_FORCE_SIGNED;
%ignore KVC_LAYOUT_FORCE_32BIT; %ignore KVC_LAYOUT_FORCE_SIGNED;
%ignore KVC_OBSERVE_FORCE_32BIT; %ignore KVC_OBSERVE_FORCE_SIGNED;
%ignore KVC_POLICY_FORCE_32BIT; %ignore KVC_POLICY_FORCE_SIGNED;
%ignore KVC_POOLING_FORCE_32BIT; %ignore KVC_POOLING_FORCE_SIGNED;
%ignore KVC_PREFIX_EVENT_FORCE_32BIT; %ignore KVC_PREFIX_EVENT_FORCE_SIGNED; %ignore KVC_PREFIX_HASH_FORCE_32BIT;
%ignore KVC_PREFIX_HASH_FORCE_SIGNED; %ignore KVC_PYRAMID_FORCE_32BIT;
%ignore KVC_PYRAMID_FORCE_SIGNED; %ignore KVC_ROPE_FORCE_32BIT;
%ignore KVC_ROPE_FORCE_SIGNED; %ignore KVC_ROTATION_FORCE_32BIT;
%ignore KVC_ROTATION_FORCE_SIGNED; %ignore KVC_STATUS_FORCE_32BIT; %ignore KVC_STATUS_FORCE_SIGNED;
%ignore KVC_TIER_KIND_FORCE_32BIT; %ignore KVC_TIER_KIND_FORCE_SIGNED;

/* Java naming: lowerCamelCase methods and field accessors. */
%rename("%(lowercamelcase)s", %$isfunction, %$not %$isconstructor, %$not %$isdestructor) "";
%rename("%(lowercamelcase)s", %$isvariable) "";

/* uint64_t as long (sequence ids, positions, counts), not BigInteger: a
 * negative long passes a value >= 2^63 (its two's complement bits). */
%apply long long { uint64_t };
%apply const long long & { const uint64_t & };
/* The same for the elements of UInt64Vector (Pool.evict's per-layer counts). */
%apply long long { unsigned long long };
%apply const long long & { const unsigned long long & };

/* uint32_t (layers, flags, config fields) is a Java long, like stdint.i's,
 * but range-checked instead of cast: 1L << 32 must not become layer 0. This
 * is the `in` typemap of arguments and of field setters (memberin assigns
 * the converted value). */
%include <stdint.i>
%typemap(in) uint32_t %{
  if ($input < 0 || $input > (jlong)0xFFFFFFFFLL) {
    kvc_java_throw(jenv, "java/lang/IllegalArgumentException",
                   "$1_name: " + std::to_string((long long)$input) + " is outside the uint32_t range 0..4294967295");
    return $null;
  }
  $1 = ($1_ltype)$input;
%}

%exception {
  kvc_swig_err.status = KVC_OK;
  try {
    $action
  } catch (const std::exception &e) {
    kvc_swig_on_exception(e);
  }
  if (kvc_swig_err.status != KVC_OK) {
    kvc_java_raise(jenv);
    return $null; /* buffer and token arguments are released by their destructors */
  }
}

/* A Pool or Policy whose handle is gone (swigCPtr 0): an exception, not a
 * NULL dereference (the common methods lock self->mu first). delete() no
 * longer frees the handle (javadestruct below), so this is only a guard. */
%typemap(check) kvc_swig_pool *self, const kvc_swig_pool *self %{
  if ($1 == NULL) {
    kvc_swig_fail(KVC_ERR_NULL_POINTER, "the pool is closed (deleted)");
    kvc_java_raise(jenv);
    return $null;
  }
%}
%typemap(check) kvc_swig_policy *self, const kvc_swig_policy *self %{
  if ($1 == NULL) {
    kvc_swig_fail(KVC_ERR_NULL_POINTER, "the policy is closed (deleted)");
    kvc_java_raise(jenv);
    return $null;
  }
%}
/* Every other proxy (PoolConfig, Stats, Codec, Int32Vector...) after
 * delete(): its getters, setters and methods throw KvcException
 * ERR_NULL_POINTER instead of dereferencing NULL. */
%typemap(check) SWIGTYPE *self, const SWIGTYPE *self %{
  if ($1 == NULL) {
    kvc_swig_fail(KVC_ERR_NULL_POINTER, "the object was deleted");
    kvc_java_raise(jenv);
    return $null;
  }
%}
/* A proxy argument: null means none (or is refused by the method), but a
 * deleted object (non-null, pointer 0) throws KvcException ERR_NULL_POINTER
 * ("k_codec: the Codec was deleted") instead of passing as null, which would
 * mean no policy, no codec or the default prefix settings. swigLiveCPtr is
 * in javabody below. */
%typemap(javain) SWIGTYPE *, const SWIGTYPE *, SWIGTYPE & "$javaclassname.swigLiveCPtr($javainput, \"$javainput\")"

/* ---- strings: their exact UTF-8 bytes, not JNI's modified UTF-8 ---- */
%include <std_string.i> /* first: the common file's %include of it then adds nothing after this */
%typemap(jni) const std::string & "jbyteArray"
%typemap(jtype) const std::string & "byte[]"
%typemap(jstype) const std::string & "String"
%typemap(javain) const std::string & "Buffers.utf8($javainput, \"$javainput\")"
%typemap(in) const std::string & ($*1_ltype temp) %{
  if (!kvc_java_string(jenv, $input, &temp)) return $null;
  $1 = &temp;
%}
/* Results (TierStats.getLastError()): the bytes as UTF-8, back into a String. */
%typemap(out) const std::string & %{
  $result = jenv->NewByteArray((jsize)$1->size());
  if ($result != NULL && !$1->empty())
    jenv->SetByteArrayRegion($result, 0, (jsize)$1->size(), (const jbyte *)$1->data());
%}
%typemap(javaout) const std::string & {
    return new String($jnicall, java.nio.charset.StandardCharsets.UTF_8);
  }

/* ---- bytes: float[], short[], byte[], direct ByteBuffer or null ---- */
%typemap(jni) (const void *IN_BUF, size_t IN_BYTES), (void *OUT_BUF, size_t OUT_BYTES) "jobject"
%typemap(jtype) (const void *IN_BUF, size_t IN_BYTES), (void *OUT_BUF, size_t OUT_BYTES) "Object"
%typemap(jstype) (const void *IN_BUF, size_t IN_BYTES), (void *OUT_BUF, size_t OUT_BYTES) "Object"
%typemap(javain) (const void *IN_BUF, size_t IN_BYTES), (void *OUT_BUF, size_t OUT_BYTES) "$javainput"

/* kvc_java_buf releases the array (JNI_ABORT: no copy back) when the wrapper
 * returns, also on an early return after a later argument failed. */
%typemap(in) (const void *IN_BUF, size_t IN_BYTES) (kvc_java_buf buf) {
  if (!buf.acquire(jenv, $input, false, "$1_name")) return $null;
  $1 = ($1_ltype)buf.ptr;
  $2 = ($2_ltype)buf.bytes;
}
/* Outputs: released with mode 0, so a copied array gets the data back. */
%typemap(in) (void *OUT_BUF, size_t OUT_BYTES) (kvc_java_buf buf) {
  if (!buf.acquire(jenv, $input, true, "$1_name")) return $null;
  $1 = ($1_ltype)buf.ptr;
  $2 = ($2_ltype)buf.bytes;
}

/* ---- token ids: int[] or null ---- */
%typemap(jni) (const int32_t *TOKENS, size_t N_TOKENS) "jintArray"
%typemap(jtype) (const int32_t *TOKENS, size_t N_TOKENS) "int[]"
%typemap(jstype) (const int32_t *TOKENS, size_t N_TOKENS) "int[]"
%typemap(javain) (const int32_t *TOKENS, size_t N_TOKENS) "$javainput"
%typemap(in) (const int32_t *TOKENS, size_t N_TOKENS) (kvc_java_ints ints) {
  if (!ints.acquire(jenv, $input)) return $null;
  $1 = ($1_ltype)ints.elems;
  $2 = ints.n;
}

/* Overload resolution (default arguments become overloads; Java picks by
 * declared type, these set SWIG's ordering). */
%typemap(typecheck, precedence=SWIG_TYPECHECK_POINTER) (const void *IN_BUF, size_t IN_BYTES),
    (void *OUT_BUF, size_t OUT_BYTES) ""
%typemap(typecheck, precedence=SWIG_TYPECHECK_INT32_ARRAY) (const int32_t *TOKENS, size_t N_TOKENS) ""

/* ---- lifetime: Cleaner instead of finalize() ---- */
%typemap(javafinalize) SWIGTYPE ""
%typemap(javabody) SWIGTYPE %{
  private transient long swigCPtr;
  protected transient boolean swigCMemOwn;
  private transient NativeResource swigResource;

  protected $javaclassname(long cPtr, boolean cMemoryOwn) {
    swigCMemOwn = cMemoryOwn;
    swigCPtr = cPtr;
    if (cMemoryOwn && cPtr != 0)
      swigResource = NativeResource.register(this, cPtr, $imclassname::delete_$javaclassname);
  }

  protected static long getCPtr($javaclassname obj) {
    return (obj == null) ? 0 : obj.swigCPtr;
  }

  /* An argument (javain typemap): 0 for null, an exception for a deleted object. */
  static long swigLiveCPtr($javaclassname obj, String what) {
    if (obj == null) return 0;
    long ptr = obj.swigCPtr;
    if (ptr == 0) throw new KvcException(Kvc.ERR_NULL_POINTER, what + ": the $javaclassname was deleted");
    return ptr;
  }

  protected static long swigRelease($javaclassname obj) {
    long ptr = 0;
    if (obj != null) {
      synchronized (obj) {
        if (!obj.swigCMemOwn)
          throw new RuntimeException("Cannot release ownership as memory is not owned");
        ptr = obj.swigCPtr;
        obj.swigCMemOwn = false;
        if (obj.swigResource != null) obj.swigResource.release();
        obj.swigCPtr = 0;
      }
    }
    return ptr;
  }
%}
%typemap(javadestruct, methodname="delete", methodmodifiers="public synchronized", parameters="") SWIGTYPE {
    if (swigCPtr != 0) {
      if (swigCMemOwn) {
        swigCMemOwn = false;
        if (swigResource != null) swigResource.free();
      }
      swigCPtr = 0;
    }
  }

/* Pool and Policy: AutoCloseable; delete() is close(). Both run the common
 * close(): it destroys the library object under the handle's exclusive lock,
 * so after the calls other threads have in flight, and keeps the small handle
 * (pointer + lock), so later calls (and passing a closed Policy) throw
 * KvcException ERR_NULL_POINTER. The handle itself is freed only by the
 * Cleaner (the common destructor), once the proxy is unreachable: every call
 * passes the proxy to its native method, so no thread can be inside one then.
 * Freeing the handle in delete() would free the lock and the pointer a
 * running call on another thread uses. */
%typemap(javadestruct, methodname="delete", methodmodifiers="public synchronized", parameters="")
    kvc_swig_pool, kvc_swig_policy {
    close();
  }
%rename(closeNative) kvc_swig_pool::close;
%rename(closedNative) kvc_swig_pool::closed;
%rename(closeNative) kvc_swig_policy::close;
%rename(closedNative) kvc_swig_policy::closed;
%javamethodmodifiers kvc_swig_pool::close "private";
%javamethodmodifiers kvc_swig_pool::closed "private";
%javamethodmodifiers kvc_swig_policy::close "private";
%javamethodmodifiers kvc_swig_policy::closed "private";
%typemap(javainterfaces) kvc_swig_pool, kvc_swig_policy "AutoCloseable"

/* K/V data: the generated natives are private raw methods; the public
 * methods (javacode below) check the array type against the dtype first
 * (Buffers.java). */
%rename(appendRaw) kvc_swig_pool::append;
%rename(gatherRaw) kvc_swig_pool::gather;
%rename(quantizeRaw) kvc_codec::quantize;
%rename(dequantizeRaw) kvc_codec::dequantize;
%rename(setSeedRaw) kvc_prefix_config::set_seed;
%rename(evictRaw) kvc_swig_pool::evict;
%javamethodmodifiers kvc_swig_pool::evict "private";
%javamethodmodifiers kvc_swig_pool::append "private";
%javamethodmodifiers kvc_swig_pool::gather "private";
%javamethodmodifiers kvc_codec::quantize "private";
%javamethodmodifiers kvc_codec::dequantize "private";
%javamethodmodifiers kvc_prefix_config::set_seed "private";
/* The built-in codebook: Kvc.codebookGaussian (modulecode below) returns a
 * float[] of the levels this writes into a buffer. */
%rename(codebookGaussianRaw) codebook_gaussian;
%javamethodmodifiers codebook_gaussian "private";
/* Extra keys by name: the public overloads taking a Map (javacode below)
 * order the values by the pool's declared names and call these. */
%rename(prefixLookupValuesRaw) kvc_swig_pool::prefix_lookup_values;
%rename(prefixAttachValuesRaw) kvc_swig_pool::prefix_attach_values;
%rename(prefixInsertValuesRaw) kvc_swig_pool::prefix_insert_values;
%rename(prefixKeysValuesRaw) kvc_swig_pool::prefix_keys_values;
%rename(prefixOffloadValuesRaw) kvc_swig_pool::prefix_offload_values;
%rename(prefixLoadValuesRaw) kvc_swig_pool::prefix_load_values;
%rename(prefixPrefetchValuesRaw) kvc_swig_pool::prefix_prefetch_values;
%javamethodmodifiers kvc_swig_pool::prefix_lookup_values "private";
%javamethodmodifiers kvc_swig_pool::prefix_attach_values "private";
%javamethodmodifiers kvc_swig_pool::prefix_insert_values "private";
%javamethodmodifiers kvc_swig_pool::prefix_keys_values "private";
%javamethodmodifiers kvc_swig_pool::prefix_offload_values "private";
%javamethodmodifiers kvc_swig_pool::prefix_load_values "private";
%javamethodmodifiers kvc_swig_pool::prefix_prefetch_values "private";

%typemap(javacode) kvc_swig_store %{
  /** The value of key, or null on a miss (kvc_store_get). */
  public byte[] get(byte[] key) {
    byte[] buf = new byte[4096];
    while (true) {
      long n = getInto(key, buf);
      if (n < 0) return null;
      if (n <= buf.length) return java.util.Arrays.copyOf(buf, (int) n);
      if (n > Integer.MAX_VALUE - 8) throw new KvcException(Kvc.ERR_OVERFLOW, "a value of " + n + " bytes");
      buf = new byte[(int) n];  // longer than the buffer: read again at its size
    }
  }

  /** Which keys the store holds (kvc_store_contains: one round trip per Redis server). */
  public boolean[] contains(byte[][] keys) {
    java.io.ByteArrayOutputStream all = new java.io.ByteArrayOutputStream();
    UInt64Vector lengths = new UInt64Vector();
    try {
      for (byte[] k : keys) {
        if (k == null) throw new KvcException(Kvc.ERR_NULL_POINTER, "a key is null");
        all.write(k, 0, k.length);
        lengths.add((long) k.length);
      }
      if (keys.length == 0) return new boolean[0];
      byte[] bytes = all.size() == 0 ? new byte[1] : all.toByteArray();
      Int32Vector found = containsMany(bytes, lengths);
      try {
        boolean[] out = new boolean[found.size()];
        for (int i = 0; i < out.length; ++i) out[i] = found.get(i) != 0;
        return out;
      } finally {
        found.delete();
      }
    } finally {
      lengths.delete();
    }
  }

  /** Undo one pin (kvc_store_pin): whether the value was pinned. */
  public boolean unpin(byte[] key) {
    return pin(key, false);
  }
%}
%typemap(javacode) kvc_swig_policy %{
  /**
   * Releases the policy now, after the calls using it on other threads;
   * idempotent. Pools and sequences it is attached to keep their own
   * reference. Passing it afterwards throws KvcException (ERR_NULL_POINTER).
   */
  @Override
  public synchronized void close() {
    if (swigCPtr != 0) closeNative();
  }

  /** Whether close() (or delete()) was called. */
  public synchronized boolean closed() {
    return swigCPtr == 0 || closedNative();
  }
%}

%typemap(javacode) kvc_swig_pool %{
  /**
   * Destroys the pool now, after the calls in flight on other threads;
   * idempotent. Later calls throw KvcException (ERR_NULL_POINTER, "the pool
   * is closed"). delete() does the same.
   */
  @Override
  public synchronized void close() {
    if (swigCPtr != 0) closeNative();
  }

  /** Whether close() (or delete()) was called. */
  public synchronized boolean closed() {
    return swigCPtr == 0 || closedNative();
  }

  /**
   * Writes K and V of n tokens at positions [pos, pos + n) of one layer, each
   * [n][num_kv_heads][head_dim] of {@code dtype}: float[] for DTYPE_F32,
   * short[] (bit patterns) for DTYPE_F16 / DTYPE_BF16, or byte[] / a direct
   * ByteBuffer holding that dtype's bytes (native order). n = bytes / row
   * bytes. Returns n.
   *
   * @throws IllegalArgumentException an array type that does not hold {@code dtype}
   */
  public long append(long seqId, long layer, long pos, Object k, Object v, int dtype) {
    Buffers.checkData("k", k, dtype);
    Buffers.checkData("v", v, dtype);
    return appendRaw(seqId, layer, pos, k, v, dtype);
  }

  /** {@link #append(long, long, long, Object, Object, int)} of f32 data (float[], or f32 bytes). */
  public long append(long seqId, long layer, long pos, Object k, Object v) {
    Buffers.checkData("k", k, Buffers.NO_DTYPE);
    Buffers.checkData("v", v, Buffers.NO_DTYPE);
    return appendRaw(seqId, layer, pos, k, v, Kvc.DTYPE_F32);
  }

  /**
   * Reads K and/or V of the layer's tokens [first, first + n) into kOut and
   * vOut ([n][num_kv_heads][head_dim] of {@code dtype} each, as in append;
   * either may be null; n from their sizes). Returns n.
   *
   * @throws IllegalArgumentException an array type that does not hold {@code dtype}
   */
  public long gather(long seqId, long layer, long first, Object kOut, Object vOut, int dtype) {
    Buffers.checkData("k_out", kOut, dtype);
    Buffers.checkData("v_out", vOut, dtype);
    return gatherRaw(seqId, layer, first, kOut, vOut, dtype);
  }

  /** {@link #gather(long, long, long, Object, Object, int)} into f32 (float[], or f32 bytes). */
  public long gather(long seqId, long layer, long first, Object kOut, Object vOut) {
    Buffers.checkData("k_out", kOut, Buffers.NO_DTYPE);
    Buffers.checkData("v_out", vOut, Buffers.NO_DTYPE);
    return gatherRaw(seqId, layer, first, kOut, vOut, Kvc.DTYPE_F32);
  }

  /**
   * Evicts with {@code policy} (null: the sequence's, else the pool's);
   * returns the tokens each layer dropped, one entry per layer, as
   * kvc_evict() does.
   */
  public long[] evict(long seqId, Policy policy) {
    return toLongs(evictRaw(seqId, policy));
  }

  /** {@link #evict(long, Policy)} with the sequence's or the pool's policy. */
  public long[] evict(long seqId) {
    return toLongs(evictRaw(seqId));
  }

  private static long[] toLongs(UInt64Vector v) {
    try {
      long[] out = new long[v.size()];
      for (int i = 0; i < out.length; ++i) out[i] = v.get(i);
      return out;
    } finally {
      v.delete();
    }
  }

  /*
   * Extra keys by name (docs/prefix-cache.md). On a pool whose prefix cache
   * declares extra-key names (enablePrefixCache with a list of names), these
   * overloads take the values as a Map from name to bytes (a name left out,
   * a null or an empty value: none) and pass them in the pool's declared
   * order. A name the pool does not declare, or names on a pool without
   * declared names, throws IllegalArgumentException; a null map
   * NullPointerException. The String-salt overloads are the positional form.
   */

  /** Turns on the prefix cache with the given extra-key names (empty: positional extra keys). */
  public void enablePrefixCache(PrefixConfig config, String modelId, String tokenizerId,
                                java.util.List<String> extraKeyNames) {
    StringVector names = new StringVector();
    try {
      for (String n : extraKeyNames) names.add(java.util.Objects.requireNonNull(n, "extraKeyNames: a null name"));
      enablePrefixCache(config, modelId, tokenizerId, names);
    } finally {
      names.delete();
    }
  }

  /** The extra-key names the prefix cache declares, in order (empty: positional, or not enabled). */
  public java.util.List<String> extraKeyNameList() {
    StringVector v = extraKeyNames();
    try {
      return java.util.List.copyOf(v);
    } finally {
      v.delete();
    }
  }

  private byte[] extraValues(java.util.Map<String, byte[]> extras) {
    java.util.Objects.requireNonNull(extras, "extras");
    java.util.List<String> names = extraKeyNameList();
    if (names.isEmpty() && !extras.isEmpty())
      throw new IllegalArgumentException("extra keys by name " + new java.util.TreeSet<>(extras.keySet())
          + " need a pool that declares them (enablePrefixCache with extra-key names); this one takes a salt");
    for (String k : extras.keySet())
      if (!names.contains(k))
        throw new IllegalArgumentException("extra key \"" + k + "\" is not declared by this pool (it declares "
            + String.join(", ", names) + ")");
    java.io.ByteArrayOutputStream out = new java.io.ByteArrayOutputStream();
    for (String n : names) {
      byte[] v = extras.get(n);
      int len = v == null ? 0 : v.length;
      out.write(len);
      out.write(len >>> 8);
      out.write(len >>> 16);
      out.write(len >>> 24);
      if (v != null) out.write(v, 0, v.length);
    }
    return out.toByteArray();
  }

  private static byte[] saltValues(String salt) {
    byte[] s = salt.getBytes(java.nio.charset.StandardCharsets.UTF_8);
    if (s.length == 0) return new byte[0];
    java.nio.ByteBuffer b = java.nio.ByteBuffer.allocate(4 + s.length).order(java.nio.ByteOrder.LITTLE_ENDIAN);
    return b.putInt(s.length).put(s).array();
  }

  /** Cached leading tokens of a prompt, the extra keys by name. */
  public PrefixResult prefixLookup(int[] tokens, long flags, java.util.Map<String, byte[]> extras) {
    return prefixLookupValuesRaw(tokens, flags, extraValues(extras));
  }

  /** Creates seqId holding the cached prefix of the prompt, the extra keys by name. */
  public PrefixResult prefixAttach(long seqId, int[] tokens, long flags, java.util.Map<String, byte[]> extras) {
    return prefixAttachValuesRaw(seqId, tokens, flags, extraValues(extras));
  }

  /** Registers the full blocks of a sequence's prompt, the extra keys by name; returns the blocks newly registered. */
  public long prefixInsert(long seqId, int[] tokens, java.util.Map<String, byte[]> extras) {
    return prefixInsertValuesRaw(seqId, tokens, extraValues(extras));
  }

  /** The chain keys of the prompt's full blocks (docs/prefix-cache.md), one array per block, the extra keys by name. */
  public byte[][] prefixKeys(int[] tokens, java.util.Map<String, byte[]> extras) {
    return prefixKeys(tokens, extraValues(extras));
  }

  /** The chain keys of the prompt's full blocks with the positional salt ("" for none). */
  public byte[][] prefixKeys(int[] tokens, String salt) {
    return prefixKeys(tokens, saltValues(salt));
  }

  private byte[][] prefixKeys(int[] tokens, byte[] values) {
    PoolConfig c = config();
    int blocks;
    try {
      blocks = (int) (tokens.length / c.getBlockSize());
    } finally {
      c.delete();
    }
    byte[] buf = new byte[(blocks + 1) * 32];
    int ks = (int) prefixKeysValuesRaw(tokens, values, buf);
    byte[][] keys = new byte[blocks][];
    for (int i = 0; i < blocks; ++i) keys[i] = java.util.Arrays.copyOfRange(buf, i * ks, (i + 1) * ks);
    return keys;
  }

  /**
   * The sequence as a llama.cpp sequence state blob for llama_state_seq_set_data
   * (kvc_seq_export_llama). kType / vType: Kvc.LLAMA_F32, LLAMA_F16, LLAMA_Q8_0;
   * flags: Kvc.LLAMA_ATTN_ROT, LLAMA_V_TRANS or 0. importLlama takes it back.
   */
  public byte[] exportLlama(long seqId, int llamaSeqId, int kType, int vType, long flags) {
    long size = exportLlamaSize(seqId, llamaSeqId, kType, vType, flags);
    if (size > Integer.MAX_VALUE - 8) throw new KvcException(Kvc.ERR_OVERFLOW, "a blob of " + size + " bytes");
    byte[] buf = new byte[(int) size];
    long n = exportLlamaInto(seqId, llamaSeqId, kType, vType, flags, buf);
    return n == buf.length ? buf : java.util.Arrays.copyOf(buf, (int) n);
  }

  /** Queues the prompt's registered blocks for writing to every tier, the extra keys by name; returns the blocks queued. */
  public long prefixOffload(int[] tokens, java.util.Map<String, byte[]> extras) {
    return prefixOffloadValuesRaw(tokens, extraValues(extras));
  }

  /** Loads the tier blocks after the pool's hit and waits, the extra keys by name; returns the tokens loaded. */
  public long prefixLoad(int[] tokens, java.util.Map<String, byte[]> extras) {
    return prefixLoadValuesRaw(tokens, extraValues(extras));
  }

  /** Starts loading as prefixLoad does, the extra keys by name; returns the ticket for prefixPoll. */
  public long prefixPrefetch(int[] tokens, java.util.Map<String, byte[]> extras) {
    return prefixPrefetchValuesRaw(tokens, extraValues(extras));
  }
%}

%typemap(javacode) kvc_codec %{
  /**
   * Quantizes {@code src} ([n][d] of srcDtype: float[] for DTYPE_F32, short[]
   * for DTYPE_F16 / DTYPE_BF16, or byte[] / a direct ByteBuffer of that
   * dtype's bytes; n = bytes / (d x element size)) into codes, scales and
   * zeros of at least sizes(n, d) bytes each (scales and zeros may be null
   * when the codec has none). Returns n.
   *
   * @throws IllegalArgumentException an array type that does not hold {@code srcDtype}
   */
  public long quantize(Object src, int srcDtype, long d, Object codes, Object scales, Object zeros) {
    Buffers.checkData("src", src, srcDtype);
    return quantizeRaw(src, srcDtype, d, codes, scales, zeros);
  }

  /**
   * Dequantizes [n][d] values into {@code dst} (at least n x d elements of
   * dstDtype: float[] for DTYPE_F32, short[] for DTYPE_F16 / DTYPE_BF16, or
   * byte[] / a direct ByteBuffer).
   *
   * @throws IllegalArgumentException an array type that does not hold {@code dstDtype}
   */
  public void dequantize(Object codes, Object scales, Object zeros, long n, long d, Object dst, int dstDtype) {
    Buffers.checkData("dst", dst, dstDtype);
    dequantizeRaw(codes, scales, zeros, n, d, dst, dstDtype);
  }
%}

%typemap(javacode) kvc_prefix_config %{
  /**
   * Seeds the prefix keys' root with exactly 32 bytes (sets seedSet), so keys
   * match across pools and restarts. Anything but 32 bytes throws
   * KvcException (ERR_INVALID_ARGUMENT).
   */
  public void setSeed(byte[] seed) {
    setSeedRaw(seed);
  }
%}

%pragma(java) modulecode=%{
  /**
   * The built-in codebook for rotated values (kvc_codebook_gaussian): the
   * Lloyd-Max levels of groups of {@code groupSize} Gaussian values
   * normalized by their signed extreme (head_dim for per-token scales),
   * 2^bits ascending floats in [-1, 1] for bits 2, 3 or 4. Pool.setCodebook
   * takes one such array per layer, concatenated.
   *
   * @throws KvcException ERR_INVALID_ARGUMENT: bits outside 2..4, groupSize 0
   */
  public static float[] codebookGaussian(long bits, long groupSize) {
    float[] buf = new float[16];
    int n = (int) codebookGaussianRaw(bits, groupSize, buf);
    return java.util.Arrays.copyOf(buf, n);
  }
%}

%pragma(java) jniclasscode=%{
  static {
    System.loadLibrary("kvcache_jni");
  }
%}

%include "../kvcache_common.i"

%{
/* Throws org.libkvcache.KvcException(status, message bytes) from kvc_swig_err
 * (unless a Java exception is already pending). */
static void kvc_java_raise(JNIEnv *jenv) {
  jint status = (jint)kvc_swig_err.status;
  kvc_swig_err.status = KVC_OK;
  if (jenv->ExceptionCheck()) return;
  jclass cls = jenv->FindClass("org/libkvcache/KvcException");
  if (cls == NULL) return;  /* NoClassDefFoundError pending */
  jmethodID ctor = jenv->GetMethodID(cls, "<init>", "(I[B)V");
  const std::string &m = kvc_swig_err.message;
  jbyteArray bytes = ctor != NULL ? jenv->NewByteArray((jsize)m.size()) : NULL;
  if (bytes != NULL) {
    jenv->SetByteArrayRegion(bytes, 0, (jsize)m.size(), (const jbyte *)m.data());
    jobject ex = jenv->NewObject(cls, ctor, status, bytes);
    if (ex != NULL) jenv->Throw((jthrowable)ex);
    jenv->DeleteLocalRef(ex);
    jenv->DeleteLocalRef(bytes);
  }
  jenv->DeleteLocalRef(cls);
}

static void kvc_java_throw(JNIEnv *jenv, const char *cls_name, const std::string &msg) {
  jclass cls = jenv->FindClass(cls_name);
  if (cls != NULL) jenv->ThrowNew(cls, msg.c_str());
  jenv->DeleteLocalRef(cls);
}

/* A String argument: Buffers.utf8() made its UTF-8 bytes (String.getBytes),
 * copied here into *out as they are, NULs included; false with a Java
 * exception pending (NullPointerException for null). */
static bool kvc_java_string(JNIEnv *jenv, jbyteArray bytes, std::string *out) {
  if (bytes == NULL) {
    kvc_java_throw(jenv, "java/lang/NullPointerException", "null string");
    return false;
  }
  const jsize n = jenv->GetArrayLength(bytes);
  try {
    out->resize((size_t)n);
  } catch (const std::exception &) {
    kvc_java_throw(jenv, "java/lang/OutOfMemoryError", "string argument too large");
    return false;
  }
  if (n > 0) jenv->GetByteArrayRegion(bytes, 0, n, (jbyte *)&(*out)[0]);
  return !jenv->ExceptionCheck();
}

/* A global reference to a class, looked up once. */
static jclass kvc_java_class(JNIEnv *jenv, const char *name) {
  jclass local = jenv->FindClass(name);
  if (local == NULL) return NULL;
  jclass global = (jclass)jenv->NewGlobalRef(local);
  jenv->DeleteLocalRef(local);
  return global;
}

/* Token ids (int[] or null; empty: NULL, 0) for the duration of a wrapper
 * call, released (JNI_ABORT: read only) by the destructor. */
struct kvc_java_ints {
  JNIEnv *env = nullptr;
  jintArray array = nullptr;
  jint *elems = nullptr;
  size_t n = 0;

  kvc_java_ints() = default;
  kvc_java_ints(const kvc_java_ints &) = delete;
  kvc_java_ints &operator=(const kvc_java_ints &) = delete;
  ~kvc_java_ints() {
    if (elems != nullptr) env->ReleaseIntArrayElements(array, elems, JNI_ABORT);
  }
  /* false with a Java exception (OutOfMemoryError) pending. */
  bool acquire(JNIEnv *jenv, jintArray a) {
    env = jenv;
    if (a == NULL) return true;
    jsize len = jenv->GetArrayLength(a);
    if (len == 0) return true;
    elems = jenv->GetIntArrayElements(a, NULL);
    if (elems == nullptr) return false;
    array = a;
    n = (size_t)len;
    return true;
  }
};

/* One buffer argument for the duration of a wrapper call. */
struct kvc_java_buf {
  JNIEnv *env = nullptr;
  jarray array = nullptr;
  void *elems = nullptr;
  char kind = 0;       /* 'F' float[], 'S' short[], 'B' byte[] */
  jint mode = JNI_ABORT;
  void *ptr = nullptr;
  size_t bytes = 0;

  kvc_java_buf() = default;
  kvc_java_buf(const kvc_java_buf &) = delete;
  kvc_java_buf &operator=(const kvc_java_buf &) = delete;
  ~kvc_java_buf() {
    if (elems == nullptr) return;
    switch (kind) {
      case 'F': env->ReleaseFloatArrayElements((jfloatArray)array, (jfloat *)elems, mode); break;
      case 'S': env->ReleaseShortArrayElements((jshortArray)array, (jshort *)elems, mode); break;
      case 'B': env->ReleaseByteArrayElements((jbyteArray)array, (jbyte *)elems, mode); break;
    }
  }

  /* Fills ptr / bytes from obj (null or empty: NULL, 0); false with a Java
   * exception pending when obj is not a supported buffer. */
  bool acquire(JNIEnv *jenv, jobject obj, bool writable, const char *what) {
    static jclass float_array = kvc_java_class(jenv, "[F");
    static jclass short_array = kvc_java_class(jenv, "[S");
    static jclass byte_array = kvc_java_class(jenv, "[B");
    static jclass byte_buffer = kvc_java_class(jenv, "java/nio/ByteBuffer");
    static jmethodID position = byte_buffer ? jenv->GetMethodID(byte_buffer, "position", "()I") : NULL;
    static jmethodID limit = byte_buffer ? jenv->GetMethodID(byte_buffer, "limit", "()I") : NULL;
    static jmethodID read_only = byte_buffer ? jenv->GetMethodID(byte_buffer, "isReadOnly", "()Z") : NULL;
    env = jenv;
    mode = writable ? 0 : JNI_ABORT;
    if (obj == NULL) return true;
    if (float_array == NULL || short_array == NULL || byte_array == NULL || byte_buffer == NULL ||
        position == NULL || limit == NULL || read_only == NULL)
      return false; /* class lookup failed: its exception is pending */
    jsize n = 0;
    size_t elem = 0;
    if (jenv->IsInstanceOf(obj, float_array)) {
      kind = 'F';
      elem = sizeof(jfloat);
    } else if (jenv->IsInstanceOf(obj, short_array)) {
      kind = 'S';
      elem = sizeof(jshort);
    } else if (jenv->IsInstanceOf(obj, byte_array)) {
      kind = 'B';
      elem = 1;
    }
    if (kind != 0) {
      array = (jarray)obj;
      n = jenv->GetArrayLength(array);
      if (n == 0) return true;
      switch (kind) {
        case 'F': elems = jenv->GetFloatArrayElements((jfloatArray)array, NULL); break;
        case 'S': elems = jenv->GetShortArrayElements((jshortArray)array, NULL); break;
        case 'B': elems = jenv->GetByteArrayElements((jbyteArray)array, NULL); break;
      }
      if (elems == nullptr) return false; /* OutOfMemoryError pending */
      ptr = elems;
      bytes = (size_t)n * elem;
      return true;
    }
    if (jenv->IsInstanceOf(obj, byte_buffer)) {
      char *base = (char *)jenv->GetDirectBufferAddress(obj);
      if (base == NULL) {
        kvc_java_throw(jenv, "java/lang/IllegalArgumentException",
                       std::string(what) + ": a heap ByteBuffer has no native address; use ByteBuffer.allocateDirect or an array");
        return false;
      }
      if (writable) {
        jboolean ro = jenv->CallBooleanMethod(obj, read_only);
        if (jenv->ExceptionCheck()) return false;
        if (ro) {
          kvc_java_throw(jenv, "java/lang/IllegalArgumentException", std::string(what) + ": the ByteBuffer is read-only");
          return false;
        }
      }
      jint pos = jenv->CallIntMethod(obj, position);
      if (jenv->ExceptionCheck()) return false;
      jint lim = jenv->CallIntMethod(obj, limit);
      if (jenv->ExceptionCheck()) return false;
      if (lim > pos) {
        ptr = base + pos;
        bytes = (size_t)(lim - pos);
      }
      return true;
    }
    kvc_java_throw(jenv, "java/lang/IllegalArgumentException",
                   std::string(what) + ": expected float[], short[], byte[], a direct ByteBuffer or null");
    return false;
  }
};
%}

/* Test hook, package-private in Java (Kvc.stringBytes(String, byte[])): the
 * bytes a String argument arrives as in C++, copied into probe_out (as many
 * as fit); returns their count. StringsTest checks real UTF-8 with it. */
%apply (void *OUT_BUF, size_t OUT_BYTES) { (void *probe_out, size_t probe_out_bytes) };
%javamethodmodifiers string_bytes "";
%inline %{
static uint64_t string_bytes(const std::string &s, void *probe_out, size_t probe_out_bytes) {
  if (probe_out != NULL) memcpy(probe_out, s.data(), s.size() < probe_out_bytes ? s.size() : probe_out_bytes);
  return s.size();
}
%}
