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
 * The raw kvc_* functions are not wrapped: the methods call them and
 * check every status. Enum constants lose their KVC_ prefix (DTYPE_F16,
 * POLICY_STREAMING, ERR_SEQ_NOT_FOUND...).
 *
 * This file holds what is wrapped (renames, ignores, buffer typemaps, the
 * header) and the free functions; the support code and the classes' methods
 * are in common/, by area:
 *   common/support.i       C++ support code: errors, checks, handles, locks
 *   common/structs.i       config and result structs (defaults, init_sized)
 *   common/policy_store.i  Policy and Store
 *   common/pool.i          Pool: creation, sequences, K/V, block tables, eviction
 *   common/pool_records.i  Pool: save / restore, llama.cpp state blobs
 *   common/pool_prefix.i   Pool: prefix cache, offload tiers
 */

%include "common/support.i"


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


%include "common/structs.i"
%include "common/policy_store.i"
%include "common/pool.i"
%include "common/pool_records.i"
%include "common/pool_prefix.i"

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
