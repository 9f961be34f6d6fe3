/*
 * Java overlay of bindings/swig/kvcache_common.i: builds the Java package
 * org.libkvcache (swig -java -package org.libkvcache) and its JNI library
 * libkvcache_jni.so, loaded with System.loadLibrary("kvcache_jni") (found
 * through java.library.path).
 *
 * Names: Java style (lowerCamelCase methods and field accessors: seqCreate,
 * setNumLayers...); enum constants are int constants of the module class Kvc
 * (Kvc.DTYPE_F16, Kvc.ERR_SEQ_NOT_FOUND...); uint64_t is a Java long (values
 * above 2^63 read as negative: Long.toUnsignedString shows them).
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
 *
 * Lifetime: Pool and Policy are AutoCloseable; close() frees the library
 * object once the calls in flight are done (idempotent; later calls throw
 * KvcException ERR_NULL_POINTER "the pool is closed"). Every proxy object
 * that owns native memory (Pool and Policy handles, PoolConfig, Stats...) is
 * registered with a java.lang.ref.Cleaner, which frees it once unreachable
 * unless delete() did: finalize() is deprecated since Java 9 (SWIG's default
 * javafinalize is replaced by an empty one). A Pool never closed is destroyed
 * by the Cleaner. After delete(), calls throw KvcException (check typemaps).
 */
%module(jniclassname="KvcJNI") Kvc

%include <enumsimple.swg>
%javaconst(1);
/* Enum items and #defines become compile-time constants (usable in switch).
 * A #define whose C value Java cannot compile (a macro, a u suffix) needs a
 * literal here, or javac fails on KvcConstants.java. */
%javaconstvalue(3) KVC_API_VERSION;
%javaconstvalue(1) KVC_POOL_ZERO_ON_FREE;
%javaconstvalue(1) KVC_PREFIX_PARTIAL;
%javaconst(0) KVC_VERSION_NUMBER;

/* The enums' FORCE_32BIT / FORCE_SIGNED markers are not values. The common
 * file's regex %rename("$ignore") "FORCE_" loses to its later
 * %rename(strip:[KVC_]) of all enum items (the last matching %rename wins),
 * so they are ignored here by name (INT32_MIN is no Java constant). */
%ignore KVC_COPY_DIRECTION_FORCE_32BIT; %ignore KVC_COPY_DIRECTION_FORCE_SIGNED;
%ignore KVC_DEVICE_FORCE_32BIT; %ignore KVC_DEVICE_FORCE_SIGNED;
%ignore KVC_DTYPE_FORCE_32BIT; %ignore KVC_DTYPE_FORCE_SIGNED;
%ignore KVC_GRANULARITY_FORCE_32BIT; %ignore KVC_GRANULARITY_FORCE_SIGNED;
%ignore KVC_LAYOUT_FORCE_32BIT; %ignore KVC_LAYOUT_FORCE_SIGNED;
%ignore KVC_OBSERVE_FORCE_32BIT; %ignore KVC_OBSERVE_FORCE_SIGNED;
%ignore KVC_POLICY_FORCE_32BIT; %ignore KVC_POLICY_FORCE_SIGNED;
%ignore KVC_POOLING_FORCE_32BIT; %ignore KVC_POOLING_FORCE_SIGNED;
%ignore KVC_PREFIX_EVENT_FORCE_32BIT; %ignore KVC_PREFIX_HASH_FORCE_32BIT;
%ignore KVC_PREFIX_HASH_FORCE_SIGNED; %ignore KVC_PYRAMID_FORCE_32BIT;
%ignore KVC_PYRAMID_FORCE_SIGNED; %ignore KVC_ROPE_FORCE_32BIT;
%ignore KVC_ROPE_FORCE_SIGNED; %ignore KVC_ROTATION_FORCE_32BIT;
%ignore KVC_ROTATION_FORCE_SIGNED; %ignore KVC_STATUS_FORCE_32BIT;

/* Java naming: lowerCamelCase methods and field accessors. */
%rename("%(lowercamelcase)s", %$isfunction, %$not %$isconstructor, %$not %$isdestructor) "";
%rename("%(lowercamelcase)s", %$isvariable) "";

/* uint64_t as long (sequence ids, positions, counts), not BigInteger. */
%apply long long { uint64_t };
%apply const long long & { const uint64_t & };

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

/* A Pool or Policy whose handle delete() freed (swigCPtr 0): an exception,
 * not a NULL dereference (the common methods lock self->mu first). */
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

/* Pool and Policy: AutoCloseable. close() is the common close(): it frees the
 * library object now and keeps the small handle, so later calls (and passing a
 * closed Policy) throw KvcException ERR_NULL_POINTER; the handle itself is
 * freed by delete() or the Cleaner. The Java close()/closed() guard against a
 * handle already freed by delete(), which the common ones would dereference. */
%rename(closeNative) kvc_swig_pool::close;
%rename(closedNative) kvc_swig_pool::closed;
%rename(closeNative) kvc_swig_policy::close;
%rename(closedNative) kvc_swig_policy::closed;
%javamethodmodifiers kvc_swig_pool::close "private";
%javamethodmodifiers kvc_swig_pool::closed "private";
%javamethodmodifiers kvc_swig_policy::close "private";
%javamethodmodifiers kvc_swig_policy::closed "private";
%typemap(javainterfaces) kvc_swig_pool, kvc_swig_policy "AutoCloseable"
%typemap(javacode) kvc_swig_pool, kvc_swig_policy %{
  /** Frees the library object now; idempotent. Later calls throw KvcException (ERR_NULL_POINTER). */
  @Override
  public synchronized void close() {
    if (swigCPtr != 0) closeNative();
  }

  /** Whether close() (or delete()) was called. */
  public synchronized boolean closed() {
    return swigCPtr == 0 || closedNative();
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
