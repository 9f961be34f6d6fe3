/*
 * bindings/swig/common/support.i: the C++ support code every wrapper compiles in: the
 * per-thread error record, buffer and size checks, the handle structs with
 * their locks and the KVC_POOL / KVC_STORE / KVC_POLICY method preludes,
 * the exception-to-status bridge, extra-key values.
 * %included by bindings/swig/kvcache_common.i (see there for the overlays'
 * contract); no language's overlay includes it directly.
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
