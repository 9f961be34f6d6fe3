/*
 * bindings/swig/kvcache_common.i: the one SWIG interface that Python, Java and
 * Go share. Each language's overlay (python/, java/, go/) %includes this file
 * after it has defined, for its language:
 *
 *   - %exception: clear kvc_swig_err, run $action inside
 *     `try { } catch (const std::exception &e) { kvc_swig_on_exception(e); }`,
 *     and when kvc_swig_err.status is not KVC_OK raise the language's error from it
 *     (Python exception, Java exception, Go error). The status and the message
 *     are both captured inside the wrapper's own native call, so a Go
 *     goroutine that moves between OS threads still gets its own message;
 *   - typemaps for the buffer patterns used below:
 *       (const void *IN_BUF, size_t IN_BYTES)   read-only bytes of K/V or codes
 *       (void *OUT_BUF, size_t OUT_BYTES)       caller-owned output bytes
 *       (const int32_t *TOKENS, size_t N_TOKENS) token ids
 *     A NULL / None / nil buffer arrives as (NULL, 0).
 *
 * The C structs keep their C field names; handles become classes:
 *   kvc_pool -> Pool, kvc_policy -> Policy, kvc_codec -> Codec,
 *   kvc_pool_config -> PoolConfig, kvc_policy_config -> PolicyConfig, ...
 * Constructors fill the defaults (kvc_<thing>_init_sized with the binding's
 * sizeof) and destructors free handles. Each config and result class has a
 * static init_sized(buffer, struct_size) that initialises a caller's buffer
 * as a struct of another header's size (an older or newer caller), through
 * the same library call.
 * The raw kvc_* functions are not wrapped: the methods below call them and
 * check every status. Enum constants lose their KVC_ prefix (DTYPE_F16,
 * POLICY_STREAMING, ERR_SEQ_NOT_FOUND...).
 */

%{
#include <kvcache/kvcache.h>
#include <stdio.h>
#include <string.h>
#include <mutex>
#include <new>
#include <shared_mutex>
#include <stdexcept>
#include <string>
#include <vector>

/* The failure of the current wrapper call: set by kvc_swig_check() inside the
 * method and read by the overlay's %exception in the same native call. */
struct kvc_swig_error {
  kvc_status status;
  std::string message;
};
static thread_local kvc_swig_error kvc_swig_err;

/* Records a failed library call with the library's own message. */
static bool kvc_swig_check(kvc_status status) {
  if (status == KVC_OK) return false;
  kvc_swig_err.status = status;
  kvc_swig_err.message = kvc_last_error_message();
  return true;
}

/* Records a failure found by the binding itself (buffer sizes). */
static void kvc_swig_fail(kvc_status status, const std::string &message) {
  kvc_swig_err.status = status;
  kvc_swig_err.message = message;
}

/* Size of one element of an input or output dtype (f32, f16, bf16), 0 if unknown. */
static size_t kvc_swig_elem(kvc_dtype dtype) {
  size_t bytes = 0;
  if (kvc_dtype_size(dtype, &bytes) != KVC_OK) return 0;
  return bytes;
}

/* A caller buffer that a static init_sized() initialises as a struct of
 * struct_size bytes: present, large enough and aligned for the struct's
 * fields (8 bytes); the library then writes exactly struct_size bytes. */
static bool kvc_swig_struct_buffer(void *dst, size_t dst_bytes, size_t struct_size) {
  if (dst == NULL) {
    kvc_swig_fail(KVC_ERR_NULL_POINTER, "the buffer is empty");
    return false;
  }
  if (dst_bytes < struct_size) {
    kvc_swig_fail(KVC_ERR_BUFFER_TOO_SMALL, "the buffer holds " + std::to_string(dst_bytes) +
                  " bytes; struct_size is " + std::to_string(struct_size));
    return false;
  }
  if ((uintptr_t)dst % 8 != 0) {
    kvc_swig_fail(KVC_ERR_INVALID_ARGUMENT, "the buffer is not 8-byte aligned");
    return false;
  }
  return true;
}

/* Bytes of one token's row of K (or V) of a pool in `dtype`; 0 after a failure. */
static size_t kvc_swig_row_bytes(kvc_pool *pool, kvc_dtype dtype) {
  kvc_pool_config c;
  kvc_pool_config_init_sized(&c, sizeof c);
  if (kvc_swig_check(kvc_pool_get_config(pool, &c))) return 0;
  size_t elem = kvc_swig_elem(dtype);
  if (elem == 0) {
    kvc_swig_fail(KVC_ERR_INVALID_ARGUMENT, "dtype " + std::to_string((int)dtype) + ": K/V data must be f32, f16 or bf16");
    return 0;
  }
  return (size_t)c.num_kv_heads * c.head_dim * elem;
}

/* Token count of one K or V buffer; sets an error and returns false when the
 * byte count is not a whole, non-zero number of rows. */
static bool kvc_swig_tokens(const char *what, size_t bytes, size_t row, uint64_t *n) {
  if (bytes == 0 || bytes % row != 0) {
    kvc_swig_fail(KVC_ERR_INVALID_ARGUMENT, std::string(what) + " holds " + std::to_string(bytes) +
                  " bytes: not a whole, non-zero number of " + std::to_string(row) +
                  "-byte token rows [num_kv_heads][head_dim]");
    return false;
  }
  *n = bytes / row;
  return true;
}

static bool kvc_swig_need(const char *what, size_t have, uint64_t need) {
  if (have < need) {
    kvc_swig_fail(KVC_ERR_BUFFER_TOO_SMALL, std::string(what) + " holds " + std::to_string(have) +
                  " bytes; " + std::to_string(need) + " needed");
    return false;
  }
  return true;
}

static kvc_prefix_extra kvc_swig_salt(const std::string &salt, uint32_t *n_extras) {
  kvc_prefix_extra e;
  e.data = salt.data();
  e.size = salt.size();
  *n_extras = salt.empty() ? 0u : 1u;
  return e;
}

/* Handles as the bindings hold them: close() frees the library object and
 * leaves NULL, so a closed handle gives an error, never a dangling pointer.
 * Methods hold the handle's lock shared for the whole library call (the
 * languages run calls without their global locks), close() holds it
 * exclusively: a close waits for the calls in flight, and two closes free once. */
struct kvc_swig_pool {
  kvc_pool *p;
  std::shared_mutex mu;
  /* The extra-key names the prefix cache declares (enable_prefix_cache),
   * for the languages' by-name calls; written once, under names_mu. */
  std::mutex names_mu;
  std::vector<std::string> names;
};
struct kvc_swig_policy {
  kvc_policy *p;
  std::shared_mutex mu;
};
struct kvc_swig_store {
  kvc_store *p;
  std::shared_mutex mu;
};

static bool kvc_swig_pool_live(const kvc_swig_pool *h) {
  if (h->p == NULL) {
    kvc_swig_fail(KVC_ERR_NULL_POINTER, "the pool is closed");
    return false;
  }
  return true;
}
/* A policy argument: null means none; a closed policy is an error (*ok = false). */
static const kvc_policy *kvc_swig_policy_of(const kvc_swig_policy *h, bool *ok) {
  *ok = true;
  if (h == NULL) return NULL;
  if (h->p == NULL) {
    kvc_swig_fail(KVC_ERR_NULL_POINTER, "the policy is closed");
    *ok = false;
  }
  return h->p;
}

/* In a method: the live pool (pool_) under the handle's shared lock, or
 * return `ret` after recording the error. */
#define KVC_POOL(ret) \
  if (self == NULL) { \
    kvc_swig_fail(KVC_ERR_NULL_POINTER, "the pool was deleted"); \
    return ret; \
  } \
  std::shared_lock<std::shared_mutex> pool_lock_(self->mu); \
  if (!kvc_swig_pool_live(self)) return ret; \
  kvc_pool *pool_ = self->p
/* In a method: the live store (store_) under the handle's shared lock, or
 * return `ret` after recording the error. */
#define KVC_STORE(ret) \
  if (self == NULL) { \
    kvc_swig_fail(KVC_ERR_NULL_POINTER, "the store was deleted"); \
    return ret; \
  } \
  std::shared_lock<std::shared_mutex> store_lock_(self->mu); \
  if (self->p == NULL) { \
    kvc_swig_fail(KVC_ERR_NULL_POINTER, "the store is closed"); \
    return ret; \
  } \
  kvc_store *store_ = self->p
/* In a method: the policy argument `arg` as `var` (null: none) under its
 * shared lock, or return `ret`. */
#define KVC_POLICY(arg, var, ret) \
  std::shared_lock<std::shared_mutex> var##_lock_; \
  if (arg != NULL) var##_lock_ = std::shared_lock<std::shared_mutex>(const_cast<kvc_swig_policy *>(arg)->mu); \
  bool var##_ok; \
  const kvc_policy *var = kvc_swig_policy_of(arg, &var##_ok); \
  if (!var##_ok) return ret

/* For the overlays' %exception, `try { $action } catch (const std::exception &e)
 * { kvc_swig_on_exception(e); }`: a C++ exception escaping a wrapper (an
 * allocation that failed, a vector too long) becomes a status, never an abort. */
static void kvc_swig_on_exception(const std::exception &e) {
  if (dynamic_cast<const std::bad_alloc *>(&e) != NULL)
    kvc_swig_fail(KVC_ERR_OUT_OF_MEMORY, "out of memory in the binding");
  else if (dynamic_cast<const std::length_error *>(&e) != NULL)
    kvc_swig_fail(KVC_ERR_OUT_OF_MEMORY, std::string("too large: ") + e.what());
  else
    kvc_swig_fail(KVC_ERR_INTERNAL, std::string("unexpected C++ exception in the binding: ") + e.what());
}

/* The answer of Pool.prefix_poll(): done with the tokens loaded, or still
 * pending (KVC_ERR_PENDING is this answer, not an error). */
struct kvc_swig_poll {
  bool done;
  uint64_t loaded_tokens;
};

/* Values of a pool's named extra keys as a binding passes them (the
 * language orders them by the declared names): one per name, each as a u32
 * little-endian byte count and its bytes. The extras point into `blob`. */
static bool kvc_swig_values(const void *blob, size_t bytes, std::vector<kvc_prefix_extra> *out) {
  const unsigned char *p = (const unsigned char *)blob;
  size_t at = 0;
  out->clear();
  while (at < bytes) {
    if (bytes - at < 4) {
      kvc_swig_fail(KVC_ERR_INVALID_ARGUMENT, "extra-key values: a truncated size field");
      return false;
    }
    const size_t n = (size_t)p[at] | (size_t)p[at + 1] << 8 | (size_t)p[at + 2] << 16 | (size_t)p[at + 3] << 24;
    at += 4;
    if (n > bytes - at) {
      kvc_swig_fail(KVC_ERR_INVALID_ARGUMENT, "extra-key values: a value runs past the end");
      return false;
    }
    kvc_prefix_extra e;
    e.data = n ? p + at : NULL;
    e.size = n;
    out->push_back(e);
    at += n;
  }
  return true;
}

/* A string argument that is passed to C as a NUL-terminated string. */
static bool kvc_swig_c_string(const char *what, const std::string &s) {
  if (s.find('\0') != std::string::npos) {
    kvc_swig_fail(KVC_ERR_INVALID_ARGUMENT, std::string(what) + " contains a NUL character");
    return false;
  }
  return true;
}
%}

%include <stdint.i>
%include <std_string.i>
%include <std_vector.i>
namespace std {
  %template(Int32Vector) vector<int32_t>;
  /* (SWIG's uint64_t is unsigned long long; the method copies into it.) */
  %template(UInt64Vector) vector<unsigned long long>;
  %template(StringVector) vector<std::string>;
}

/* ---- what the header gives: enums, constants and the plain structs ---- */
#define KVC_API
%rename("%(strip:[KVC_])s", %$isenumitem) "";
%rename("%(strip:[KVC_])s", %$isconstant) "";
/* After the strip rules (the last matching rule wins): the FORCE_ markers are not values. */
%rename("$ignore", %$isenumitem, regextarget=1) "FORCE_";
/* Functions are reached through the methods below, never directly. */
%rename("$ignore", %$isfunction, regextarget=1) "^kvc_";
/* Function tables, callbacks, raw pointers and version-1 layouts: C only. */
%ignore kvc_api;
%ignore kvc_prefix_event;
%ignore kvc_prefix_extra;
%ignore kvc_pool_layout;
%ignore kvc_prefix_event_fn;
%ignore kvc_copy_direction;
%ignore kvc_attention_params; /* attention is not wrapped yet */
/* Pointer fields: set through constructor and method arguments instead. */
%ignore kvc_codec::reserved0;  /* padding made explicit: never read */
%ignore kvc_pool_config::k_codec;
%ignore kvc_pool_config::v_codec;
%ignore kvc_pool_config::layer_k_codecs; /* per-layer codecs: Pool.with_layer_codecs (below) */
%ignore kvc_pool_config::layer_v_codecs;
%ignore kvc_policy_config::plugin;
%ignore kvc_policy_config::head_gates;     /* DuoAttention's gates: Policy.with_head_gates() */
%ignore kvc_policy_config::num_head_gates;
%ignore kvc_prefix_config::model_id;
%ignore kvc_prefix_config::tokenizer_id;
%ignore kvc_prefix_config::seed; /* set_seed() */
%ignore kvc_prefix_config::extra_key_names;   /* Pool.enable_prefix_cache() takes the names */
%ignore kvc_prefix_config::n_extra_key_names;
%ignore kvc_tier_config::path;    /* Pool.add_tier() takes them as strings */
%ignore kvc_tier_config::address;
%immutable kvc_pool_config::struct_size;
%immutable kvc_codec::struct_size;
%immutable kvc_policy_config::struct_size;
%immutable kvc_prefix_config::struct_size;
%immutable kvc_stats::struct_size;
%immutable kvc_prefix_result::struct_size;
%immutable kvc_prefix_stats::struct_size;
%immutable kvc_quant_sizes::struct_size;
%immutable kvc_tier_config::struct_size;
%immutable kvc_tier_stats::struct_size;
/* The char[256] is read as the language's string instead: the %extend
 * member last_error_str below, renamed to last_error (Java: lastError). */
%ignore kvc_tier_stats::last_error;
#ifdef SWIGJAVA
%rename(lastError) kvc_tier_stats::last_error_str;
#else
%rename(last_error) kvc_tier_stats::last_error_str;
#endif

%rename(PoolConfig) kvc_pool_config;
%rename(Codec) kvc_codec;
%rename(PolicyConfig) kvc_policy_config;
%rename(PrefixConfig) kvc_prefix_config;
%rename(Stats) kvc_stats;
%rename(PrefixResult) kvc_prefix_result;
%rename(PrefixStats) kvc_prefix_stats;
%rename(QuantSizes) kvc_quant_sizes;
%rename(TierConfig) kvc_tier_config;
%rename(TierStats) kvc_tier_stats;
%rename(PrefixPoll) kvc_swig_poll;
%rename(Pool) kvc_swig_pool;
%rename(Policy) kvc_swig_policy;
%newobject kvc_swig_policy::with_head_gates;
%newobject kvc_swig_pool::with_layer_codecs;
%rename(Store) kvc_swig_store;

/* ---- buffer arguments (typemaps in each overlay); before the header, whose
 * structs the methods below extend ---- */
%apply (const void *IN_BUF, size_t IN_BYTES) {
  (const void *k, size_t k_bytes), (const void *v, size_t v_bytes),
  (const void *src, size_t src_bytes), (const void *codes, size_t codes_bytes),
  (const void *scales, size_t scales_bytes), (const void *zeros, size_t zeros_bytes),
  (const void *seed, size_t seed_bytes),
  (const void *key, size_t key_bytes), (const void *value, size_t value_bytes),
  (const void *scope, size_t scope_bytes), (const void *keys, size_t keys_bytes),
  (const void *gates, size_t gates_bytes),
  (const void *smooth_scale, size_t smooth_scale_bytes),
  (const void *smooth_offset, size_t smooth_offset_bytes),
  (const void *levels, size_t levels_bytes)
};
%apply (const int32_t *TOKENS, size_t N_TOKENS) { (const int32_t *tokens, size_t n_tokens) };
%apply (void *OUT_BUF, size_t OUT_BYTES) {
  (void *k_out, size_t k_out_bytes), (void *v_out, size_t v_out_bytes),
  (void *codes_out, size_t codes_out_bytes), (void *scales_out, size_t scales_out_bytes),
  (void *zeros_out, size_t zeros_out_bytes), (void *dst, size_t dst_bytes), (void *keys_out, size_t keys_out_bytes),
  (void *value_out, size_t value_out_bytes), (void *levels_out, size_t levels_out_bytes)
};
%apply (const void *IN_BUF, size_t IN_BYTES) { (const void *values, size_t values_bytes) };

%include "kvcache/kvcache.h"

/* Per-layer codec tables (Pool.with_layer_codecs): codecs by value. */
namespace std {
  %template(CodecVector) vector<kvc_codec>;
}


/* ---- defaults on construction ---- */
%extend kvc_pool_config {
  kvc_pool_config() {
    kvc_pool_config *c = new kvc_pool_config;
    kvc_pool_config_init_sized(c, sizeof *c);
    return c;
  }
  ~kvc_pool_config() { delete $self; }
  /** Initialise a caller buffer as a kvc_pool_config of struct_size bytes (another header's size): kvc_pool_config_init_sized. */
  static void init_sized(void *dst, size_t dst_bytes, size_t struct_size) {
    if (kvc_swig_struct_buffer(dst, dst_bytes, struct_size))
      kvc_swig_check(kvc_pool_config_init_sized((kvc_pool_config *)dst, struct_size));
  }
}
%extend kvc_codec {
  kvc_codec() {
    kvc_codec *c = new kvc_codec;
    kvc_codec_init_sized(c, sizeof *c);
    return c;
  }
  ~kvc_codec() { delete $self; }
  /** Initialise a caller buffer as a kvc_codec of struct_size bytes (another header's size): kvc_codec_init_sized. */
  static void init_sized(void *dst, size_t dst_bytes, size_t struct_size) {
    if (kvc_swig_struct_buffer(dst, dst_bytes, struct_size))
      kvc_swig_check(kvc_codec_init_sized((kvc_codec *)dst, struct_size));
  }

  /** Buffer sizes quantize() needs for `[n][d]` values. */
  kvc_quant_sizes sizes(uint64_t n, uint64_t d) {
    const kvc_codec codec = *$self;
    kvc_quant_sizes s;
    kvc_quant_sizes_init_sized(&s, sizeof s);
    kvc_swig_check(kvc_quantize_sizes(&codec, n, d, &s));
    return s;
  }

  /**
   * Quantize `src` (`[n][d]` of src_dtype, n = bytes / (d x element size))
   * into caller buffers of at least sizes(n, d) bytes each (scales and zeros
   * may be empty when the codec has none). Returns n.
   */
  uint64_t quantize(const void *src, size_t src_bytes, kvc_dtype src_dtype, uint64_t d,
                    void *codes_out, size_t codes_out_bytes, void *scales_out, size_t scales_out_bytes,
                    void *zeros_out, size_t zeros_out_bytes) {
    /* One copy of the codec for the size check and the call: another thread
     * may change the object's fields meanwhile. */
    const kvc_codec codec = *$self;
    size_t elem = kvc_swig_elem(src_dtype);
    if (elem == 0) {
      kvc_swig_fail(KVC_ERR_INVALID_ARGUMENT, "src_dtype " + std::to_string((int)src_dtype) + ": must be f32, f16 or bf16");
      return 0;
    }
    if (d == 0 || d > ((uint64_t)1 << 24)) {
      kvc_swig_fail(KVC_ERR_INVALID_ARGUMENT, "d " + std::to_string(d) + ": must be 1..2^24");
      return 0;
    }
    if (src_bytes % (elem * d) != 0) {
      kvc_swig_fail(KVC_ERR_INVALID_ARGUMENT, "src holds " + std::to_string(src_bytes) +
                    " bytes: not whole rows of d = " + std::to_string(d) + " f32/f16/bf16 values");
      return 0;
    }
    uint64_t n = src_bytes / (elem * d);
    kvc_quant_sizes s;
    kvc_quant_sizes_init_sized(&s, sizeof s);
    if (kvc_swig_check(kvc_quantize_sizes(&codec, n, d, &s))) return 0;
    if (!kvc_swig_need("codes", codes_out_bytes, s.codes_bytes) ||
        !kvc_swig_need("scales", scales_out_bytes, s.scales_bytes) ||
        !kvc_swig_need("zeros", zeros_out_bytes, s.zeros_bytes))
      return 0;
    kvc_swig_check(kvc_quantize(&codec, src, src_dtype, n, d, codes_out, scales_out, zeros_out));
    return n;
  }

  /** Dequantize `[n][d]` values into `dst` (at least n x d elements of dst_dtype). */
  void dequantize(const void *codes, size_t codes_bytes, const void *scales, size_t scales_bytes,
                  const void *zeros, size_t zeros_bytes, uint64_t n, uint64_t d,
                  void *dst, size_t dst_bytes, kvc_dtype dst_dtype) {
    const kvc_codec codec = *$self;
    kvc_quant_sizes s;
    kvc_quant_sizes_init_sized(&s, sizeof s);
    if (kvc_swig_check(kvc_quantize_sizes(&codec, n, d, &s))) return;
    size_t elem = kvc_swig_elem(dst_dtype);
    if (elem == 0) {
      kvc_swig_fail(KVC_ERR_INVALID_ARGUMENT, "dst_dtype " + std::to_string((int)dst_dtype) + ": must be f32, f16 or bf16");
      return;
    }
    if (!kvc_swig_need("codes", codes_bytes, s.codes_bytes) ||
        !kvc_swig_need("scales", scales_bytes, s.scales_bytes) ||
        !kvc_swig_need("zeros", zeros_bytes, s.zeros_bytes) ||
        !kvc_swig_need("dst", dst_bytes, n * d * elem))
      return;
    kvc_swig_check(kvc_dequantize(&codec, codes, scales, zeros, n, d, dst, dst_dtype));
  }
}
%extend kvc_policy_config {
  kvc_policy_config() {
    kvc_policy_config *c = new kvc_policy_config;
    kvc_policy_config_init_sized(c, sizeof *c);
    return c;
  }
  ~kvc_policy_config() { delete $self; }
  /** Initialise a caller buffer as a kvc_policy_config of struct_size bytes (another header's size): kvc_policy_config_init_sized. */
  static void init_sized(void *dst, size_t dst_bytes, size_t struct_size) {
    if (kvc_swig_struct_buffer(dst, dst_bytes, struct_size))
      kvc_swig_check(kvc_policy_config_init_sized((kvc_policy_config *)dst, struct_size));
  }
}
%extend kvc_prefix_config {
  kvc_prefix_config() {
    kvc_prefix_config *c = new kvc_prefix_config;
    kvc_prefix_config_init_sized(c, sizeof *c);
    return c;
  }
  ~kvc_prefix_config() { delete $self; }
  /** Initialise a caller buffer as a kvc_prefix_config of struct_size bytes (another header's size): kvc_prefix_config_init_sized. */
  static void init_sized(void *dst, size_t dst_bytes, size_t struct_size) {
    if (kvc_swig_struct_buffer(dst, dst_bytes, struct_size))
      kvc_swig_check(kvc_prefix_config_init_sized((kvc_prefix_config *)dst, struct_size));
  }
  /** Seed the key chain's root with exactly 32 bytes (sets seed_set), so keys match across pools and restarts. */
  void set_seed(const void *seed, size_t seed_bytes) {
    if (seed == NULL || seed_bytes != sizeof $self->seed) {
      kvc_swig_fail(KVC_ERR_INVALID_ARGUMENT, "the seed must be exactly 32 bytes, got " + std::to_string(seed_bytes));
      return;
    }
    memcpy($self->seed, seed, sizeof $self->seed);
    $self->seed_set = 1;
  }
}

/* Result structs: the library's defaults (zeros) on construction too. */
%extend kvc_stats {
  kvc_stats() {
    kvc_stats *s = new kvc_stats;
    kvc_stats_init_sized(s, sizeof *s);
    return s;
  }
  ~kvc_stats() { delete $self; }
  /** Initialise a caller buffer as a kvc_stats of struct_size bytes: kvc_stats_init_sized. */
  static void init_sized(void *dst, size_t dst_bytes, size_t struct_size) {
    if (kvc_swig_struct_buffer(dst, dst_bytes, struct_size))
      kvc_swig_check(kvc_stats_init_sized((kvc_stats *)dst, struct_size));
  }
}
%extend kvc_prefix_stats {
  kvc_prefix_stats() {
    kvc_prefix_stats *s = new kvc_prefix_stats;
    kvc_prefix_stats_init_sized(s, sizeof *s);
    return s;
  }
  ~kvc_prefix_stats() { delete $self; }
  /** Initialise a caller buffer as a kvc_prefix_stats of struct_size bytes: kvc_prefix_stats_init_sized. */
  static void init_sized(void *dst, size_t dst_bytes, size_t struct_size) {
    if (kvc_swig_struct_buffer(dst, dst_bytes, struct_size))
      kvc_swig_check(kvc_prefix_stats_init_sized((kvc_prefix_stats *)dst, struct_size));
  }
}
%extend kvc_quant_sizes {
  kvc_quant_sizes() {
    kvc_quant_sizes *s = new kvc_quant_sizes;
    kvc_quant_sizes_init_sized(s, sizeof *s);
    return s;
  }
  ~kvc_quant_sizes() { delete $self; }
  /** Initialise a caller buffer as a kvc_quant_sizes of struct_size bytes: kvc_quant_sizes_init_sized. */
  static void init_sized(void *dst, size_t dst_bytes, size_t struct_size) {
    if (kvc_swig_struct_buffer(dst, dst_bytes, struct_size))
      kvc_swig_check(kvc_quant_sizes_init_sized((kvc_quant_sizes *)dst, struct_size));
  }
}

%extend kvc_tier_config {
  /** Defaults of kvc_tier_config_init() for `kind` (path and address are arguments of Pool.add_tier()). */
  kvc_tier_config(kvc_tier_kind kind = KVC_TIER_HOST) {
    kvc_tier_config c;
    if (kvc_swig_check(kvc_tier_config_init_sized(&c, kind, sizeof c))) return NULL;
    return new kvc_tier_config(c);
  }
  ~kvc_tier_config() { delete $self; }
  /** Initialise a caller buffer as a kvc_tier_config of struct_size bytes for `kind`: kvc_tier_config_init_sized. */
  static void init_sized(void *dst, size_t dst_bytes, size_t struct_size, kvc_tier_kind kind = KVC_TIER_HOST) {
    if (kvc_swig_struct_buffer(dst, dst_bytes, struct_size))
      kvc_swig_check(kvc_tier_config_init_sized((kvc_tier_config *)dst, kind, struct_size));
  }
}
%extend kvc_tier_stats {
  kvc_tier_stats() {
    kvc_tier_stats *s = new kvc_tier_stats;
    kvc_tier_stats_init_sized(s, sizeof *s);
    return s;
  }
  ~kvc_tier_stats() { delete $self; }
  /** Initialise a caller buffer as a kvc_tier_stats of struct_size bytes: kvc_tier_stats_init_sized. */
  static void init_sized(void *dst, size_t dst_bytes, size_t struct_size) {
    if (kvc_swig_struct_buffer(dst, dst_bytes, struct_size))
      kvc_swig_check(kvc_tier_stats_init_sized((kvc_tier_stats *)dst, struct_size));
  }
  /** The reason of the tier's last error, "" if none (the C field's bytes up to its NUL). */
  %immutable;
  std::string last_error_str;
  %mutable;
}
%{
/* The getter's wrapper takes the address of the result and converts it at
 * once: a per-thread copy, bounded by the array even without a NUL. */
static const std::string &kvc_tier_stats_last_error_str_get(kvc_tier_stats *s) {
  static thread_local std::string out;
  out.assign(s->last_error, strnlen(s->last_error, sizeof s->last_error));
  return out;
}
%}

/* Pool.prefix_poll()'s answer: done (loaded_tokens valid) or pending. */
%immutable kvc_swig_poll::done;
%immutable kvc_swig_poll::loaded_tokens;
struct kvc_swig_poll {
  bool done;
  uint64_t loaded_tokens;
};

/* ---- handles ---- */
struct kvc_swig_policy {};
%extend kvc_swig_policy {
  /** An eviction policy (kvc_policy_create). */
  kvc_swig_policy(const kvc_policy_config *config) {
    kvc_policy *p = NULL;
    if (kvc_swig_check(kvc_policy_create(config, &p))) return NULL;
    kvc_swig_policy *h = new kvc_swig_policy;
    h->p = p;
    return h;
  }
  /**
   * A DuoAttention policy (KVC_POLICY_DUO_ATTENTION) with its per-head gates:
   * `gates` holds num_layers x num_kv_heads float32 values in [0, 1], layer by
   * layer, in native byte order (Python also takes numbers, converted; Java a
   * float[]); copied as kvc_policy_config.head_gates, `config`'s own are not
   * read. The errors of kvc_policy_create, and ERR_INVALID_ARGUMENT when the
   * bytes are not whole float32 values or hold more than 2^20 of them.
   */
  static kvc_swig_policy *with_head_gates(const kvc_policy_config *config, const void *gates, size_t gates_bytes) {
    if (config == NULL) {
      kvc_swig_fail(KVC_ERR_NULL_POINTER, "config is required");
      return NULL;
    }
    if (gates == NULL || gates_bytes == 0 || gates_bytes % sizeof(float) != 0) {
      kvc_swig_fail(KVC_ERR_INVALID_ARGUMENT, "gates must hold one or more float32 values, got " +
                    std::to_string(gates_bytes) + " bytes");
      return NULL;
    }
    if (gates_bytes / sizeof(float) > (1u << 20)) { /* kvc_policy_create's limit, before any copy */
      kvc_swig_fail(KVC_ERR_INVALID_ARGUMENT, "num_head_gates " + std::to_string(gates_bytes / sizeof(float)) +
                    " is above 1048576");
      return NULL;
    }
    std::vector<float> g(gates_bytes / sizeof(float));
    memcpy(g.data(), gates, gates_bytes);
    kvc_policy_config c = *config;
    c.head_gates = g.data();
    c.num_head_gates = (uint32_t)g.size();
    kvc_policy *p = NULL;
    if (kvc_swig_check(kvc_policy_create(&c, &p))) return NULL;
    kvc_swig_policy *h = new kvc_swig_policy;
    h->p = p;
    return h;
  }
  ~kvc_swig_policy() {
    kvc_policy_destroy($self->p);
    delete $self;
  }
  /** Release the policy now (pools and sequences it is attached to keep theirs); waits for calls using it. Idempotent. */
  void close() {
    std::unique_lock<std::shared_mutex> lock($self->mu);
    kvc_policy_destroy($self->p);
    $self->p = NULL;
  }
  bool closed() {
    std::shared_lock<std::shared_mutex> lock($self->mu);
    return $self->p == NULL;
  }
}

struct kvc_swig_store {};
%extend kvc_swig_store {
  /**
   * A store (kvc_store_open, docs/engines.md): one tier by itself, addressed
   * by byte-string keys under `scope`. kind: TIER_HOST / TIER_DISK /
   * TIER_REDIS; capacity_bytes: host and disk; path: disk directory;
   * address: Redis "host:port[,host:port...]"; flags: TIER_FSYNC,
   * TIER_REDIS_CLUSTER or 0.
   */
  kvc_swig_store(kvc_tier_kind kind, uint64_t capacity_bytes, const std::string &path,
                 const std::string &address, uint32_t flags, uint32_t timeout_ms,
                 uint64_t ttl_seconds, const void *scope, size_t scope_bytes) {
    if (!kvc_swig_c_string("path", path) || !kvc_swig_c_string("address", address)) return NULL;
    kvc_tier_config c;
    if (kvc_swig_check(kvc_tier_config_init_sized(&c, kind, sizeof c))) return NULL;
    c.capacity_bytes = capacity_bytes;
    c.path = path.empty() ? NULL : path.c_str();
    c.address = address.empty() ? NULL : address.c_str();
    c.flags = flags;
    c.timeout_ms = timeout_ms;
    c.ttl_seconds = ttl_seconds;
    kvc_store *p = NULL;
    if (kvc_swig_check(kvc_store_open(&c, scope, scope_bytes, &p))) return NULL;
    kvc_swig_store *h = new kvc_swig_store;
    h->p = p;
    return h;
  }
  ~kvc_swig_store() {
    kvc_store_close($self->p);
    delete $self;
  }
  /** Close the store now, after the calls in flight; later calls fail with ERR_NULL_POINTER. Idempotent. */
  void close() {
    std::unique_lock<std::shared_mutex> lock($self->mu);
    kvc_store_close($self->p);
    $self->p = NULL;
  }
  bool closed() {
    std::shared_lock<std::shared_mutex> lock($self->mu);
    return $self->p == NULL;
  }
  /** Store `value` under `key` (kvc_store_put). */
  void put(const void *key, size_t key_bytes, const void *value, size_t value_bytes) {
    KVC_STORE();
    kvc_swig_check(kvc_store_put(store_, key, key_bytes, value, value_bytes));
  }
  /**
   * Read the value of `key` into `value_out` (kvc_store_get): its length on
   * a hit, -1 on a miss. A value longer than value_out is not read: its
   * length is returned (larger than value_out) and value_out is untouched.
   */
  int64_t get_into(const void *key, size_t key_bytes, void *value_out, size_t value_out_bytes) {
    KVC_STORE(-1);
    size_t n = 0;
    int32_t found = 0;
    kvc_status st = kvc_store_get(store_, key, key_bytes, value_out, value_out_bytes, &n, &found);
    if (st == KVC_ERR_BUFFER_TOO_SMALL) return (int64_t)n;
    if (kvc_swig_check(st)) return -1;
    return found ? (int64_t)n : -1;
  }
  /**
   * Which keys the store holds (kvc_store_contains): `keys` is the keys'
   * bytes one after another, `lengths` their lengths; 1 or 0 per key.
   */
  std::vector<int32_t> contains_many(const void *keys, size_t keys_bytes,
                                     const std::vector<unsigned long long> &lengths) {
    std::vector<int32_t> out;
    KVC_STORE(out);
    std::vector<const void *> ptrs(lengths.size());
    std::vector<size_t> lens(lengths.size());
    unsigned long long off = 0;
    for (size_t i = 0; i < lengths.size(); ++i) {
      if (off > keys_bytes || lengths[i] > keys_bytes - off) {
        kvc_swig_fail(KVC_ERR_INVALID_ARGUMENT, "the key lengths add up to more than the " +
                                                    std::to_string(keys_bytes) + " key bytes");
        return out;
      }
      ptrs[i] = (const char *)keys + off;
      lens[i] = (size_t)lengths[i];
      off += lengths[i];
    }
    std::vector<uint8_t> found(lengths.size(), 0);
    if (kvc_swig_check(kvc_store_contains(store_, ptrs.data(), lens.data(), ptrs.size(),
                                          found.data())))
      return out;
    out.assign(found.begin(), found.end());
    return out;
  }
  /** Remove the value of `key` (kvc_store_remove): whether there was one. */
  bool remove(const void *key, size_t key_bytes) {
    KVC_STORE(false);
    int32_t removed = 0;
    kvc_swig_check(kvc_store_remove(store_, key, key_bytes, &removed));
    return removed != 0;
  }
  /** Pin (true) or unpin (false) the value of `key` (kvc_store_pin): whether it was. */
  bool pin(const void *key, size_t key_bytes, bool on = true) {
    KVC_STORE(false);
    int32_t done = 0;
    kvc_swig_check(kvc_store_pin(store_, key, key_bytes, on ? 1 : 0, &done));
    return done != 0;
  }
  /** Counters of the store's tier (kvc_store_stats). */
  kvc_tier_stats stats() {
    kvc_tier_stats s;
    kvc_tier_stats_init_sized(&s, sizeof s);
    KVC_STORE(s);
    kvc_swig_check(kvc_store_stats(store_, &s));
    return s;
  }
}

struct kvc_swig_pool {};
%extend kvc_swig_pool {
  /** A pool (kvc_pool_create); k_codec / v_codec: null or the quantizer of K / V. */
  kvc_swig_pool(const kvc_pool_config *config, const kvc_codec *k_codec = NULL,
                const kvc_codec *v_codec = NULL) {
    if (config == NULL) {
      kvc_swig_fail(KVC_ERR_NULL_POINTER, "config is null");
      return NULL;
    }
    kvc_pool_config c = *config;
    c.k_codec = k_codec;
    c.v_codec = v_codec;
    kvc_pool *p = NULL;
    if (kvc_swig_check(kvc_pool_create(&c, &p))) return NULL;
    kvc_swig_pool *h = new kvc_swig_pool;
    h->p = p;
    return h;
  }
  /**
   * A pool with a codec per layer (kvc_pool_config.layer_k_codecs / layer_v_codecs, mixed
   * precision): layer_k / layer_v empty (every layer: k_codec / v_codec) or num_layers codecs,
   * entry i layer i's (a float dtype with SCALE_NONE: plain storage of that dtype; pass the pool's
   * own codec again for a layer that keeps it). ERR_INVALID_ARGUMENT for a table of another length;
   * otherwise what kvc_pool_create refuses (docs/codecs.md "Mixed precision per layer").
   */
  static kvc_swig_pool *with_layer_codecs(const kvc_pool_config *config, const kvc_codec *k_codec,
                                          const kvc_codec *v_codec,
                                          const std::vector<kvc_codec> &layer_k,
                                          const std::vector<kvc_codec> &layer_v) {
    if (config == NULL) {
      kvc_swig_fail(KVC_ERR_NULL_POINTER, "config is null");
      return NULL;
    }
    kvc_pool_config c = *config;
    c.k_codec = k_codec;
    c.v_codec = v_codec;
    const std::vector<kvc_codec> *in[2] = {&layer_k, &layer_v};
    for (int kv = 0; kv < 2; ++kv)  // the lengths first: a table is never larger than the caller's
      if (!in[kv]->empty() && in[kv]->size() != c.num_layers) {
        kvc_swig_fail(KVC_ERR_INVALID_ARGUMENT,
                      std::string(kv ? "layer_v" : "layer_k") + ": " +
                          std::to_string(in[kv]->size()) + " codecs for " +
                          std::to_string(c.num_layers) + " layers (empty, or one per layer)");
        return NULL;
      }
    std::vector<const kvc_codec *> kt, vt;
    std::vector<const kvc_codec *> *out[2] = {&kt, &vt};
    for (int kv = 0; kv < 2; ++kv)
      for (const kvc_codec &e : *in[kv]) out[kv]->push_back(&e);
    if (!layer_k.empty()) c.layer_k_codecs = kt.data();
    if (!layer_v.empty()) c.layer_v_codecs = vt.data();
    kvc_pool *p = NULL;
    if (kvc_swig_check(kvc_pool_create(&c, &p))) return NULL;
    kvc_swig_pool *h = new kvc_swig_pool;
    h->p = p;
    return h;
  }
  ~kvc_swig_pool() {
    kvc_pool_destroy($self->p);
    delete $self;
  }
  /** Destroy the pool now, after the calls in flight; later calls fail with ERR_NULL_POINTER. Idempotent. */
  void close() {
    std::unique_lock<std::shared_mutex> lock($self->mu);
    kvc_pool_destroy($self->p);
    $self->p = NULL;
  }
  bool closed() {
    std::shared_lock<std::shared_mutex> lock($self->mu);
    return $self->p == NULL;
  }

  kvc_pool_config config() {
    kvc_pool_config c;
    kvc_pool_config_init_sized(&c, sizeof c);
    KVC_POOL(c);
    kvc_swig_check(kvc_pool_get_config(pool_, &c));
    c.k_codec = NULL;
    c.v_codec = NULL;
    return c;
  }
  kvc_stats stats() {
    kvc_stats s;
    kvc_stats_init_sized(&s, sizeof s);
    KVC_POOL(s);
    kvc_swig_check(kvc_pool_stats(pool_, &s));
    return s;
  }

  void seq_create(uint64_t seq_id) {
    KVC_POOL();
    kvc_swig_check(kvc_seq_create(pool_, seq_id));
  }
  void seq_fork(uint64_t parent_id, uint64_t child_id) {
    KVC_POOL();
    kvc_swig_check(kvc_seq_fork(pool_, parent_id, child_id));
  }
  void seq_truncate(uint64_t seq_id, uint64_t new_length) {
    KVC_POOL();
    kvc_swig_check(kvc_seq_truncate(pool_, seq_id, new_length));
  }
  void seq_free(uint64_t seq_id) {
    KVC_POOL();
    kvc_swig_check(kvc_seq_free(pool_, seq_id));
  }
  uint64_t seq_length(uint64_t seq_id) {
    uint64_t n = 0;
    KVC_POOL(0);
    kvc_swig_check(kvc_seq_length(pool_, seq_id, &n));
    return n;
  }
  uint64_t layer_tokens(uint64_t seq_id, uint32_t layer) {
    uint64_t n = 0;
    KVC_POOL(0);
    kvc_swig_check(kvc_seq_layer_tokens(pool_, seq_id, layer, &n));
    return n;
  }
  /** Reserve n_new positions in every layer (all or nothing). */
  void reserve(uint64_t seq_id, uint64_t n_new) {
    KVC_POOL();
    kvc_swig_check(kvc_seq_reserve(pool_, seq_id, n_new, NULL));
  }

  /**
   * Write K and V of n tokens at positions [pos, pos + n) of one layer:
   * each `[n][num_kv_heads][head_dim]` of dtype (f32, f16 or bf16),
   * n = bytes / row bytes. Returns n.
   */
  uint64_t append(uint64_t seq_id, uint32_t layer, uint64_t pos, const void *k, size_t k_bytes,
                  const void *v, size_t v_bytes, kvc_dtype dtype = KVC_DTYPE_F32) {
    KVC_POOL(0);
    size_t row = kvc_swig_row_bytes(pool_, dtype);
    uint64_t n = 0;
    if (row == 0 || !kvc_swig_tokens("k", k_bytes, row, &n)) return 0;
    if (v_bytes != k_bytes) {
      kvc_swig_fail(KVC_ERR_INVALID_ARGUMENT, "v holds " + std::to_string(v_bytes) + " bytes, k " +
                    std::to_string(k_bytes) + ": K and V must have the same shape");
      return 0;
    }
    kvc_swig_check(kvc_append(pool_, seq_id, layer, pos, n, k, v, dtype));
    return n;
  }

  /**
   * Read K and/or V of the layer's tokens [first, first + n) into caller
   * buffers of `[n][num_kv_heads][head_dim]` dtype each (either may be
   * empty; n from the buffer sizes). Returns n.
   */
  uint64_t gather(uint64_t seq_id, uint32_t layer, uint64_t first, void *k_out, size_t k_out_bytes,
                  void *v_out, size_t v_out_bytes, kvc_dtype dtype = KVC_DTYPE_F32) {
    KVC_POOL(0);
    size_t row = kvc_swig_row_bytes(pool_, dtype);
    if (row == 0) return 0;
    if (k_out == NULL && v_out == NULL) {
      kvc_swig_fail(KVC_ERR_NULL_POINTER, "k_out and v_out are both empty");
      return 0;
    }
    uint64_t nk = 0, nv = 0;
    if (k_out != NULL && !kvc_swig_tokens("k_out", k_out_bytes, row, &nk)) return 0;
    if (v_out != NULL && !kvc_swig_tokens("v_out", v_out_bytes, row, &nv)) return 0;
    if (k_out != NULL && v_out != NULL && nk != nv) {
      kvc_swig_fail(KVC_ERR_INVALID_ARGUMENT, "k_out and v_out hold different token counts");
      return 0;
    }
    uint64_t n = k_out != NULL ? nk : nv;
    kvc_swig_check(kvc_gather(pool_, seq_id, layer, first, n, k_out, v_out, dtype, NULL));
    return n;
  }

  /** Positions of the layer's tokens [first, first + n). */
  std::vector<int32_t> positions(uint64_t seq_id, uint32_t layer, uint64_t first, uint64_t n) {
    std::vector<int32_t> out;
    KVC_POOL(out);
    uint64_t held = 0;
    if (kvc_swig_check(kvc_seq_layer_tokens(pool_, seq_id, layer, &held))) return out;
    if (first > held || n > held - first) {
      kvc_swig_fail(KVC_ERR_OUT_OF_RANGE, "tokens [" + std::to_string(first) + ", " + std::to_string(first) + " + " +
                    std::to_string(n) + ") are beyond the " + std::to_string(held) + " the layer holds");
      return out;
    }
    out.resize(n);
    if (n == 0) return out;
    if (kvc_swig_check(kvc_gather(pool_, seq_id, layer, first, n, NULL, NULL, KVC_DTYPE_F32, out.data())))
      out.clear();
    return out;
  }

  /** Block ids of one layer of a sequence, in order. */
  std::vector<int32_t> block_table(uint64_t seq_id, uint32_t layer) {
    std::vector<int32_t> out;
    KVC_POOL(out);
    /* Another thread may grow or shrink the table between two calls: size
     * to what the last call reported until one fits. */
    for (;;) {
      size_t n = 0;
      const kvc_status st = kvc_seq_block_table(pool_, seq_id, layer, out.empty() ? NULL : out.data(), out.size(), &n);
      if (st == KVC_OK && n <= out.size()) {  /* (a NULL buffer only counts) */
        out.resize(n);
        return out;
      }
      if (st != KVC_OK && st != KVC_ERR_BUFFER_TOO_SMALL) {
        kvc_swig_check(st);
        out.clear();
        return out;
      }
      out.resize(n);
    }
  }

  /** Tokens one KV head of a layer holds (kvc_seq_head_tokens; head-wise pools differ per head). */
  uint64_t head_tokens(uint64_t seq_id, uint32_t layer, uint32_t head) {
    uint64_t n = 0;
    KVC_POOL(0);
    kvc_swig_check(kvc_seq_head_tokens(pool_, seq_id, layer, head, &n));
    return n;
  }
  /** Positions of one KV head's tokens, in cache order (kvc_gather_head). */
  std::vector<int32_t> head_positions(uint64_t seq_id, uint32_t layer, uint32_t head) {
    std::vector<int32_t> out;
    KVC_POOL(out);
    uint64_t n = 0;
    if (kvc_swig_check(kvc_seq_head_tokens(pool_, seq_id, layer, head, &n))) return out;
    out.resize(n);
    if (n && kvc_swig_check(kvc_gather_head(pool_, seq_id, layer, head, 0, n, NULL, NULL,
                                            KVC_DTYPE_F32, out.data())))
      out.clear();
    return out;
  }
  /** Block ids of one KV head of a layer (kvc_seq_head_block_table). */
  std::vector<int32_t> head_block_table(uint64_t seq_id, uint32_t layer, uint32_t head) {
    std::vector<int32_t> out;
    KVC_POOL(out);
    for (;;) {
      size_t n = 0;
      const kvc_status st = kvc_seq_head_block_table(pool_, seq_id, layer, head,
                                                     out.empty() ? NULL : out.data(), out.size(), &n);
      if (st == KVC_OK && n <= out.size()) {
        out.resize(n);
        return out;
      }
      if (st != KVC_OK && st != KVC_ERR_BUFFER_TOO_SMALL) {
        kvc_swig_check(st);
        out.clear();
        return out;
      }
      out.resize(n);
    }
  }

  /**
   * Per-channel key smoothing (kvc_pool_set_key_smoothing): keys are stored
   * as codes of (k - offset) / scale per channel. `smooth_scale` and
   * `smooth_offset` hold num_layers x num_kv_heads x head_dim float32 values
   * in native byte order (Python also takes numbers, converted; Java float[];
   * Go []float32); an empty offset means zeros, both empty remove the
   * smoothing. On a pool with no sequence and no prefix cache. The errors of
   * kvc_pool_set_key_smoothing, and ERR_INVALID_ARGUMENT when the bytes are
   * not whole float32 values or the two differ in size.
   */
  void set_key_smoothing(const void *smooth_scale, size_t smooth_scale_bytes,
                         const void *smooth_offset, size_t smooth_offset_bytes) {
    KVC_POOL();
    if (smooth_scale_bytes % sizeof(float) != 0 || smooth_offset_bytes % sizeof(float) != 0 ||
        (smooth_offset_bytes != 0 && smooth_offset_bytes != smooth_scale_bytes)) {
      kvc_swig_fail(KVC_ERR_INVALID_ARGUMENT,
                    "scale (" + std::to_string(smooth_scale_bytes) + " bytes) and offset (" +
                        std::to_string(smooth_offset_bytes) +
                        " bytes) must be float32 values, the offset as many as the scale or none");
      return;
    }
    /* Aligned copies: a caller's bytes may start anywhere. */
    std::vector<float> sc(smooth_scale_bytes / sizeof(float)), off(smooth_offset_bytes / sizeof(float));
    if (!sc.empty()) memcpy(sc.data(), smooth_scale, smooth_scale_bytes);
    if (!off.empty()) memcpy(off.data(), smooth_offset, smooth_offset_bytes);
    kvc_swig_check(kvc_pool_set_key_smoothing(pool_, sc.empty() ? NULL : sc.data(),
                                              off.empty() ? NULL : off.data(), sc.size()));
  }

  /**
   * A codebook of the pool's keys (part 0) or values (part 1)
   * (kvc_pool_set_codebook): the part's int2/int3/int4 codes index
   * non-uniform levels instead of the evenly spaced integers. `levels` holds
   * num_layers x 2^bits float32 values in native byte order, layer by layer,
   * each in [-1, 1] and strictly ascending within a layer (Python also takes
   * numbers, converted; Java float[]; Go []float32); empty removes the part's
   * codebook. On a pool with no sequence and no prefix cache. The errors of
   * kvc_pool_set_codebook, and ERR_INVALID_ARGUMENT when the bytes are not
   * whole float32 values.
   */
  void set_codebook(uint32_t part, const void *levels, size_t levels_bytes) {
    KVC_POOL();
    if (levels_bytes % sizeof(float) != 0) {
      kvc_swig_fail(KVC_ERR_INVALID_ARGUMENT, "levels (" + std::to_string(levels_bytes) +
                                                  " bytes) must be float32 values");
      return;
    }
    /* An aligned copy: a caller's bytes may start anywhere. */
    std::vector<float> lv(levels_bytes / sizeof(float));
    if (!lv.empty()) memcpy(lv.data(), levels, levels_bytes);
    kvc_swig_check(kvc_pool_set_codebook(pool_, part, lv.empty() ? NULL : lv.data(), lv.size()));
  }

  /** Set the pool's default eviction policy (null: none). */
  void set_policy(const kvc_swig_policy *policy) {
    KVC_POOL();
    KVC_POLICY(policy, p, );
    kvc_swig_check(kvc_pool_set_policy(pool_, p));
  }
  /** Attach a policy to one sequence (null: the pool's default). */
  void seq_set_policy(uint64_t seq_id, const kvc_swig_policy *policy) {
    KVC_POOL();
    KVC_POLICY(policy, p, );
    kvc_swig_check(kvc_seq_set_policy(pool_, seq_id, p));
  }
  /**
   * Evict with `policy` (null: the sequence's or the pool's); returns the
   * tokens each layer dropped, `[num_layers]`, as kvc_evict() does (empty
   * after a failure).
   */
  std::vector<unsigned long long> evict(uint64_t seq_id, const kvc_swig_policy *policy = NULL) {
    std::vector<unsigned long long> out;
    KVC_POOL(out);
    KVC_POLICY(policy, p, out);
    kvc_pool_config c;
    kvc_pool_config_init_sized(&c, sizeof c);
    if (kvc_swig_check(kvc_pool_get_config(pool_, &c))) return out;
    std::vector<uint64_t> dropped(c.num_layers, 0);
    if (kvc_swig_check(kvc_evict(pool_, seq_id, p, dropped.data()))) return out;
    out.assign(dropped.begin(), dropped.end());
    return out;
  }

  /**
   * Turn on the prefix cache (config null: defaults). extra_key_names: the
   * names of the extra keys (docs/prefix-cache.md), empty for positional
   * extra keys; the languages' prefix calls then take the values by name.
   */
  void enable_prefix_cache(const kvc_prefix_config *config = NULL, const std::string &model_id = std::string(),
                           const std::string &tokenizer_id = std::string(),
                           const std::vector<std::string> &extra_key_names = std::vector<std::string>()) {
    KVC_POOL();
    if (!kvc_swig_c_string("model_id", model_id) || !kvc_swig_c_string("tokenizer_id", tokenizer_id)) return;
    std::vector<const char *> names;
    for (size_t i = 0; i < extra_key_names.size(); ++i) {
      if (!kvc_swig_c_string("extra_key_names", extra_key_names[i])) return;
      names.push_back(extra_key_names[i].c_str());
    }
    kvc_prefix_config c;
    kvc_prefix_config_init_sized(&c, sizeof c);
    if (config != NULL) c = *config;
    c.model_id = model_id.c_str();
    c.tokenizer_id = tokenizer_id.c_str();
    c.extra_key_names = names.empty() ? NULL : names.data();
    c.n_extra_key_names = names.size() > 0xffffffffu ? 0xffffffffu : (uint32_t)names.size(); /* over 64: refused */
    std::lock_guard<std::mutex> g(self->names_mu);
    if (kvc_swig_check(kvc_pool_enable_prefix_cache(pool_, &c))) return;
    self->names = extra_key_names;
  }
  /** The extra-key names the prefix cache declares, in order (empty: positional or not enabled). */
  std::vector<std::string> extra_key_names() {
    std::vector<std::string> out;
    KVC_POOL(out);
    std::lock_guard<std::mutex> g(self->names_mu);
    out = self->names;
    return out;
  }
  /** Cached leading tokens of a prompt (salt: the tenant's extra key, empty for none). */
  kvc_prefix_result prefix_lookup(const int32_t *tokens, size_t n_tokens, uint32_t flags = 0,
                                  const std::string &salt = std::string()) {
    kvc_prefix_result r;
    memset(&r, 0, sizeof r);
    r.struct_size = sizeof r;
    KVC_POOL(r);
    uint32_t n_extras = 0;
    kvc_prefix_extra e = kvc_swig_salt(salt, &n_extras);
    kvc_swig_check(kvc_prefix_lookup(pool_, tokens, n_tokens, &e, n_extras, flags, &r));
    return r;
  }
  /** Create seq_id holding the cached prefix of the prompt. */
  kvc_prefix_result prefix_attach(uint64_t seq_id, const int32_t *tokens, size_t n_tokens, uint32_t flags = 0,
                                  const std::string &salt = std::string()) {
    kvc_prefix_result r;
    memset(&r, 0, sizeof r);
    r.struct_size = sizeof r;
    KVC_POOL(r);
    uint32_t n_extras = 0;
    kvc_prefix_extra e = kvc_swig_salt(salt, &n_extras);
    kvc_swig_check(kvc_prefix_attach(pool_, seq_id, tokens, n_tokens, &e, n_extras, flags, &r));
    return r;
  }
  /** Register the full blocks of a sequence's prompt; returns the blocks newly registered. */
  uint64_t prefix_insert(uint64_t seq_id, const int32_t *tokens, size_t n_tokens,
                         const std::string &salt = std::string()) {
    uint64_t n = 0;
    KVC_POOL(0);
    uint32_t n_extras = 0;
    kvc_prefix_extra e = kvc_swig_salt(salt, &n_extras);
    kvc_swig_check(kvc_prefix_insert(pool_, seq_id, tokens, n_tokens, &e, n_extras, &n));
    return n;
  }
  /*
   * The same calls with the extra keys as `values`: one value per declared
   * name, in the pool's order, each as a u32 little-endian size and its
   * bytes (the languages' by-name methods build it; positional pools take
   * any number). prefix_keys_values writes [blocks][key size] bytes into
   * keys_out and returns the key size.
   */
  kvc_prefix_result prefix_lookup_values(const int32_t *tokens, size_t n_tokens, uint32_t flags,
                                         const void *values, size_t values_bytes) {
    kvc_prefix_result r;
    memset(&r, 0, sizeof r);
    r.struct_size = sizeof r;
    KVC_POOL(r);
    std::vector<kvc_prefix_extra> ex;
    if (!kvc_swig_values(values, values_bytes, &ex)) return r;
    kvc_swig_check(kvc_prefix_lookup(pool_, tokens, n_tokens, ex.data(), (uint32_t)ex.size(), flags, &r));
    return r;
  }
  kvc_prefix_result prefix_attach_values(uint64_t seq_id, const int32_t *tokens, size_t n_tokens, uint32_t flags,
                                         const void *values, size_t values_bytes) {
    kvc_prefix_result r;
    memset(&r, 0, sizeof r);
    r.struct_size = sizeof r;
    KVC_POOL(r);
    std::vector<kvc_prefix_extra> ex;
    if (!kvc_swig_values(values, values_bytes, &ex)) return r;
    kvc_swig_check(kvc_prefix_attach(pool_, seq_id, tokens, n_tokens, ex.data(), (uint32_t)ex.size(), flags, &r));
    return r;
  }
  uint64_t prefix_insert_values(uint64_t seq_id, const int32_t *tokens, size_t n_tokens, const void *values,
                                size_t values_bytes) {
    uint64_t n = 0;
    KVC_POOL(0);
    std::vector<kvc_prefix_extra> ex;
    if (!kvc_swig_values(values, values_bytes, &ex)) return 0;
    kvc_swig_check(kvc_prefix_insert(pool_, seq_id, tokens, n_tokens, ex.data(), (uint32_t)ex.size(), &n));
    return n;
  }
  uint64_t prefix_keys_values(const int32_t *tokens, size_t n_tokens, const void *values, size_t values_bytes,
                              void *keys_out, size_t keys_out_bytes) {
    size_t ks = 0;
    KVC_POOL(0);
    std::vector<kvc_prefix_extra> ex;
    if (!kvc_swig_values(values, values_bytes, &ex)) return 0;
    kvc_swig_check(kvc_prefix_keys(pool_, tokens, n_tokens, ex.data(), (uint32_t)ex.size(), (uint8_t *)keys_out,
                                   keys_out_bytes, &ks));
    return ks;
  }
  uint64_t prefix_offload_values(const int32_t *tokens, size_t n_tokens, const void *values, size_t values_bytes) {
    uint64_t n = 0;
    KVC_POOL(0);
    std::vector<kvc_prefix_extra> ex;
    if (!kvc_swig_values(values, values_bytes, &ex)) return 0;
    kvc_swig_check(kvc_prefix_offload(pool_, tokens, n_tokens, ex.data(), (uint32_t)ex.size(), &n));
    return n;
  }
  uint64_t prefix_load_values(const int32_t *tokens, size_t n_tokens, const void *values, size_t values_bytes) {
    uint64_t n = 0;
    KVC_POOL(0);
    std::vector<kvc_prefix_extra> ex;
    if (!kvc_swig_values(values, values_bytes, &ex)) return 0;
    kvc_swig_check(kvc_prefix_load(pool_, tokens, n_tokens, ex.data(), (uint32_t)ex.size(), &n));
    return n;
  }
  uint64_t prefix_prefetch_values(const int32_t *tokens, size_t n_tokens, const void *values, size_t values_bytes) {
    uint64_t ticket = 0;
    KVC_POOL(0);
    std::vector<kvc_prefix_extra> ex;
    if (!kvc_swig_values(values, values_bytes, &ex)) return 0;
    kvc_swig_check(kvc_prefix_prefetch(pool_, tokens, n_tokens, ex.data(), (uint32_t)ex.size(), &ticket));
    return ticket;
  }
  /** Bytes of the sequence's record (save_into needs this much). */
  uint64_t save_size(uint64_t seq_id) {
    size_t n = 0;
    KVC_POOL(0);
    const kvc_status st = kvc_seq_save(pool_, seq_id, NULL, 0, &n);
    if (st != KVC_ERR_BUFFER_TOO_SMALL) kvc_swig_check(st);
    return n;
  }
  /** Save the sequence's record (kvc_seq_save) into a caller buffer; returns its size. */
  uint64_t save_into(uint64_t seq_id, void *dst, size_t dst_bytes) {
    size_t n = 0;
    KVC_POOL(0);
    kvc_swig_check(kvc_seq_save(pool_, seq_id, dst, dst_bytes, &n));
    return n;
  }
  /** Create seq_id from a record of save_into (kvc_seq_restore). */
  void restore(uint64_t seq_id, const void *src, size_t src_bytes) {
    KVC_POOL();
    kvc_swig_check(kvc_seq_restore(pool_, seq_id, src, src_bytes));
  }
  /** Create seq_id from a llama.cpp sequence state blob (kvc_seq_import_llama); returns the
   * tokens imported. flags: LLAMA_ATTN_ROT or 0. */
  uint64_t import_llama(uint64_t seq_id, const void *src, size_t src_bytes, uint32_t flags = 0) {
    uint64_t n = 0;
    KVC_POOL(0);
    kvc_swig_check(kvc_seq_import_llama(pool_, seq_id, src, src_bytes, flags, &n));
    return n;
  }
  /** Bytes of the sequence as a llama.cpp sequence state blob (kvc_seq_export_llama). */
  uint64_t export_llama_size(uint64_t seq_id, int32_t llama_seq_id, int32_t k_type, int32_t v_type,
                             uint32_t flags) {
    size_t n = 0;
    KVC_POOL(0);
    const kvc_status st = kvc_seq_export_llama(pool_, seq_id, llama_seq_id, (kvc_llama_type)k_type,
                                               (kvc_llama_type)v_type, flags, NULL, 0, &n);
    if (st != KVC_ERR_BUFFER_TOO_SMALL) kvc_swig_check(st);
    return n;
  }
  /** Write the sequence as a llama.cpp sequence state blob into a caller buffer; returns its size.
   * k_type / v_type: LLAMA_F32, LLAMA_F16, LLAMA_Q8_0; flags: LLAMA_ATTN_ROT, LLAMA_V_TRANS. */
  uint64_t export_llama_into(uint64_t seq_id, int32_t llama_seq_id, int32_t k_type, int32_t v_type,
                             uint32_t flags, void *dst, size_t dst_bytes) {
    size_t n = 0;
    KVC_POOL(0);
    kvc_swig_check(kvc_seq_export_llama(pool_, seq_id, llama_seq_id, (kvc_llama_type)k_type,
                                        (kvc_llama_type)v_type, flags, dst, dst_bytes, &n));
    return n;
  }
  /** Save the sequence into a file, atomically (kvc_seq_save_file). */
  void save_file(uint64_t seq_id, const std::string &path) {
    KVC_POOL();
    if (!kvc_swig_c_string("path", path)) return;
    kvc_swig_check(kvc_seq_save_file(pool_, seq_id, path.c_str()));
  }
  /** Create seq_id from a file written by save_file (kvc_seq_restore_file). */
  void restore_file(uint64_t seq_id, const std::string &path) {
    KVC_POOL();
    if (!kvc_swig_c_string("path", path)) return;
    kvc_swig_check(kvc_seq_restore_file(pool_, seq_id, path.c_str()));
  }

  /**
   * Add an offload tier below the pool (kvc_pool_add_tier, docs/tiers.md);
   * returns its index (0 for the first). path: the disk tier's directory,
   * address: Redis "host:port[,host:port...]" (empty: none); flags:
   * TIER_FSYNC, TIER_REDIS_CLUSTER or 0.
   */
  uint32_t add_tier(kvc_tier_kind kind, uint64_t capacity_bytes, const std::string &path = std::string(),
                    const std::string &address = std::string(), uint32_t flags = 0, uint32_t timeout_ms = 1000,
                    uint64_t ttl_seconds = 0) {
    uint32_t index = 0;
    KVC_POOL(0);
    if (!kvc_swig_c_string("path", path) || !kvc_swig_c_string("address", address)) return 0;
    kvc_tier_config c;
    if (kvc_swig_check(kvc_tier_config_init_sized(&c, kind, sizeof c))) return 0;
    c.capacity_bytes = capacity_bytes;
    c.path = path.empty() ? NULL : path.c_str();
    c.address = address.empty() ? NULL : address.c_str();
    c.flags = flags;
    c.timeout_ms = timeout_ms;
    c.ttl_seconds = ttl_seconds;
    kvc_swig_check(kvc_pool_add_tier(pool_, &c, &index));
    return index;
  }
  /** The offload writer's queue (blocks) and the load timeout (ms) (kvc_pool_set_offload). */
  void set_offload(uint32_t queue_blocks, uint32_t load_timeout_ms) {
    KVC_POOL();
    kvc_swig_check(kvc_pool_set_offload(pool_, queue_blocks, load_timeout_ms));
  }
  /** Counters of tier `index` (kvc_pool_tier_stats). */
  kvc_tier_stats tier_stats(uint32_t index) {
    kvc_tier_stats s;
    kvc_tier_stats_init_sized(&s, sizeof s);
    KVC_POOL(s);
    kvc_swig_check(kvc_pool_tier_stats(pool_, index, &s));
    return s;
  }
  /** Queue the prompt's registered blocks for writing to every tier; returns the blocks queued. */
  uint64_t prefix_offload(const int32_t *tokens, size_t n_tokens, const std::string &salt = std::string()) {
    uint64_t n = 0;
    KVC_POOL(0);
    uint32_t n_extras = 0;
    kvc_prefix_extra e = kvc_swig_salt(salt, &n_extras);
    kvc_swig_check(kvc_prefix_offload(pool_, tokens, n_tokens, &e, n_extras, &n));
    return n;
  }
  /** Wait until the offload writer has written every queued block. */
  void flush_tiers() {
    KVC_POOL();
    kvc_swig_check(kvc_pool_flush_tiers(pool_));
  }
  /** Load the tier blocks after the pool's hit of a prompt and wait; returns the tokens loaded (ERR_TIMEOUT: none). */
  uint64_t prefix_load(const int32_t *tokens, size_t n_tokens, const std::string &salt = std::string()) {
    uint64_t n = 0;
    KVC_POOL(0);
    uint32_t n_extras = 0;
    kvc_prefix_extra e = kvc_swig_salt(salt, &n_extras);
    kvc_swig_check(kvc_prefix_load(pool_, tokens, n_tokens, &e, n_extras, &n));
    return n;
  }
  /** Start loading as prefix_load() does, in the background; returns the ticket for prefix_poll(). */
  uint64_t prefix_prefetch(const int32_t *tokens, size_t n_tokens, const std::string &salt = std::string()) {
    uint64_t ticket = 0;
    KVC_POOL(0);
    uint32_t n_extras = 0;
    kvc_prefix_extra e = kvc_swig_salt(salt, &n_extras);
    kvc_swig_check(kvc_prefix_prefetch(pool_, tokens, n_tokens, &e, n_extras, &ticket));
    return ticket;
  }
  /**
   * The state of a prefetch: done (loaded_tokens set; the ticket is then
   * forgotten) or not yet (done false: poll again). A load that timed out
   * is an error (ERR_TIMEOUT), an unknown or already reported ticket too
   * (ERR_INVALID_ARGUMENT).
   */
  kvc_swig_poll prefix_poll(uint64_t ticket) {
    kvc_swig_poll r;
    r.done = false;
    r.loaded_tokens = 0;
    KVC_POOL(r);
    uint64_t n = 0;
    const kvc_status st = kvc_prefix_poll(pool_, ticket, &n);
    if (st == KVC_ERR_PENDING) return r;
    if (kvc_swig_check(st)) return r;
    r.done = true;
    r.loaded_tokens = n;
    return r;
  }
  /** Release the pins of a prefix_lookup() with PREFIX_PIN (its result's pin). */
  void prefix_unpin(uint64_t pin) {
    KVC_POOL();
    kvc_swig_check(kvc_prefix_unpin(pool_, pin));
  }

  kvc_prefix_stats prefix_stats() {
    kvc_prefix_stats s;
    kvc_prefix_stats_init_sized(&s, sizeof s);
    KVC_POOL(s);
    kvc_swig_check(kvc_prefix_get_stats(pool_, &s));
    return s;
  }
}

/* ---- free functions ---- */
%inline %{
/** The library's version, e.g. "0.3.0". */
static const char *version() { return kvc_version_string(); }
/** Name of a status code, e.g. "KVC_ERR_POOL_EXHAUSTED". */
static const char *status_name(int status) { return kvc_status_string((kvc_status)status); }
/** Bytes of one element of f32, f16 or bf16. */
static size_t dtype_size(kvc_dtype dtype) {
  size_t n = 0;
  kvc_swig_check(kvc_dtype_size(dtype, &n));
  return n;
}
/**
 * The built-in codebook for rotated values (kvc_codebook_gaussian): the
 * 2^bits ascending float32 levels (bits 2, 3 or 4) of groups of group_size
 * values, written into levels_out (native byte order; 16 float32 values hold
 * every table); returns 2^bits. Nothing is written on failure. The
 * languages' codebook_gaussian(bits, group_size) return the levels as a list
 * (Python), float[] (Java), []float32 (Go).
 */
static uint32_t codebook_gaussian(uint32_t bits, uint64_t group_size, void *levels_out,
                                  size_t levels_out_bytes) {
  /* The library writes 2^bits values (bits at most 4); a bits it refuses is
   * refused before writing, so a table of 2^8 holds every answer. */
  float lv[256];
  if (bits > 8) {
    kvc_swig_fail(KVC_ERR_INVALID_ARGUMENT, "bits " + std::to_string(bits) + " is not 2, 3 or 4");
    return 0;
  }
  if (kvc_swig_check(kvc_codebook_gaussian(bits, group_size, lv))) return 0;
  const uint32_t n = 1u << bits;
  if (!kvc_swig_need("levels_out", levels_out_bytes, (uint64_t)n * sizeof(float))) return 0;
  memcpy(levels_out, lv, n * sizeof(float));
  return n;
}
%}
