/*
 * abi_init_*: the init functions never write past the caller's struct
 * (docs/abi-policy.md, "Structs that grow").
 *
 * An "older caller" is a struct of an earlier header: this header's struct
 * cut at a field boundary (the sizes of 0.1 and 0.2, the minimum, every
 * boundary up to the full struct), followed by guard bytes. It is
 * initialised through each exported kvc_<thing>_init_sized() and through the
 * kvc_api table; the guard bytes must stay as they were and struct_size must
 * equal the caller's size. The 0.3 symbols (kvc_<thing>_init, which the
 * header's macros of the same names replace in source) fill exactly the 0.3
 * size. Sizes that end inside a field are refused wherever a struct is read
 * or written.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>

#include <kvcache/kvcache.h>

#define ASSERT_STATUS(expected, call)                                            \
  do {                                                                           \
    kvc_status st_ = (call);                                                     \
    if (st_ != (expected))                                                       \
      print_error("%s -> %s (%s), expected %s\n", #call, kvc_status_string(st_), \
                  kvc_last_error_message(), kvc_status_string(expected));        \
    assert_int_equal(st_, (expected));                                           \
  } while (0)
#define ASSERT_OK(call) ASSERT_STATUS(KVC_OK, call)

enum { GUARD = 64, GUARD_BYTE = 0xa5 };

typedef struct {
  size_t offset, size;
  const char *name;
} field;
#define F(T, f) \
  { offsetof(T, f), sizeof(((T *)0)->f), #f }

/* The fields of each struct, restated from the header (independently of the
 * library's own table). */
static const field codec_fields[] = {
    F(kvc_codec, struct_size), F(kvc_codec, dtype),          F(kvc_codec, granularity),
    F(kvc_codec, group_size),  F(kvc_codec, asymmetric),     F(kvc_codec, scale_dtype),
    F(kvc_codec, rotation),    F(kvc_codec, rotation_block), F(kvc_codec, static_scale),
    F(kvc_codec, scale),       F(kvc_codec, full_range),     F(kvc_codec, reserved0),
    F(kvc_codec, outliers)};
static const field pool_config_fields[] = {F(kvc_pool_config, struct_size),
                                           F(kvc_pool_config, num_layers),
                                           F(kvc_pool_config, num_q_heads),
                                           F(kvc_pool_config, num_kv_heads),
                                           F(kvc_pool_config, head_dim),
                                           F(kvc_pool_config, block_size),
                                           F(kvc_pool_config, flags),
                                           F(kvc_pool_config, num_blocks),
                                           F(kvc_pool_config, capacity_bytes),
                                           F(kvc_pool_config, k_dtype),
                                           F(kvc_pool_config, v_dtype),
                                           F(kvc_pool_config, layout),
                                           F(kvc_pool_config, device),
                                           F(kvc_pool_config, device_index),
                                           F(kvc_pool_config, k_codec),
                                           F(kvc_pool_config, v_codec),
                                           F(kvc_pool_config, residual_window),
                                           F(kvc_pool_config, residual_dtype),
                                           F(kvc_pool_config, residual_fraction),
                                           F(kvc_pool_config, num_residual_blocks),
                                           F(kvc_pool_config, rope_style),
                                           F(kvc_pool_config, rope_dims),
                                           F(kvc_pool_config, rope_theta),
                                           F(kvc_pool_config, residual_sinks),
                                           F(kvc_pool_config, layer_k_codecs),
                                           F(kvc_pool_config, layer_v_codecs)};
static const field stats_fields[] = {F(kvc_stats, struct_size),
                                     F(kvc_stats, blocks_total),
                                     F(kvc_stats, blocks_free),
                                     F(kvc_stats, blocks_cached),
                                     F(kvc_stats, blocks_used),
                                     F(kvc_stats, blocks_shared),
                                     F(kvc_stats, bytes_per_block),
                                     F(kvc_stats, bytes_per_token),
                                     F(kvc_stats, bytes_total),
                                     F(kvc_stats, bytes_in_use),
                                     F(kvc_stats, peak_bytes_in_use),
                                     F(kvc_stats, num_sequences),
                                     F(kvc_stats, residual_blocks_total),
                                     F(kvc_stats, residual_blocks_used),
                                     F(kvc_stats, residual_bytes_per_block),
                                     F(kvc_stats, tokens_stored)};
static const field pool_layout_fields[] = {F(kvc_pool_layout, struct_size),
                                           F(kvc_pool_layout, base),
                                           F(kvc_pool_layout, num_blocks),
                                           F(kvc_pool_layout, block_stride),
                                           F(kvc_pool_layout, block_size),
                                           F(kvc_pool_layout, num_kv_heads),
                                           F(kvc_pool_layout, head_dim),
                                           F(kvc_pool_layout, layout),
                                           F(kvc_pool_layout, k_dtype),
                                           F(kvc_pool_layout, v_dtype),
                                           F(kvc_pool_layout, k_offset),
                                           F(kvc_pool_layout, k_token_stride),
                                           F(kvc_pool_layout, k_head_stride),
                                           F(kvc_pool_layout, k_bytes),
                                           F(kvc_pool_layout, v_offset),
                                           F(kvc_pool_layout, v_token_stride),
                                           F(kvc_pool_layout, v_head_stride),
                                           F(kvc_pool_layout, v_bytes),
                                           F(kvc_pool_layout, device),
                                           F(kvc_pool_layout, device_index),
                                           F(kvc_pool_layout, k_codes_bytes),
                                           F(kvc_pool_layout, k_scale_offset),
                                           F(kvc_pool_layout, k_zero_offset),
                                           F(kvc_pool_layout, k_scales_per_token),
                                           F(kvc_pool_layout, k_scale_dtype),
                                           F(kvc_pool_layout, v_codes_bytes),
                                           F(kvc_pool_layout, v_scale_offset),
                                           F(kvc_pool_layout, v_zero_offset),
                                           F(kvc_pool_layout, v_scales_per_token),
                                           F(kvc_pool_layout, v_scale_dtype),
                                           F(kvc_pool_layout, k_granularity),
                                           F(kvc_pool_layout, k_group_size),
                                           F(kvc_pool_layout, v_granularity),
                                           F(kvc_pool_layout, v_group_size),
                                           F(kvc_pool_layout, residual_base),
                                           F(kvc_pool_layout, residual_num_blocks),
                                           F(kvc_pool_layout, residual_block_stride),
                                           F(kvc_pool_layout, residual_dtype),
                                           F(kvc_pool_layout, reserved0)};
static const field quant_sizes_fields[] = {
    F(kvc_quant_sizes, struct_size), F(kvc_quant_sizes, codes_bytes),
    F(kvc_quant_sizes, scales_bytes), F(kvc_quant_sizes, zeros_bytes),
    F(kvc_quant_sizes, num_scales)};
static const field attention_params_fields[] = {
    F(kvc_attention_params, struct_size), F(kvc_attention_params, num_q_heads),
    F(kvc_attention_params, scale),       F(kvc_attention_params, q_dtype),
    F(kvc_attention_params, out_dtype),   F(kvc_attention_params, observe),
    F(kvc_attention_params, num_threads), F(kvc_attention_params, observe_from),
    F(kvc_attention_params, query_quant)};
static const field policy_config_fields[] = {F(kvc_policy_config, struct_size),
                                             F(kvc_policy_config, kind),
                                             F(kvc_policy_config, sink_tokens),
                                             F(kvc_policy_config, budget_tokens),
                                             F(kvc_policy_config, compression_ratio),
                                             F(kvc_policy_config, recent_tokens),
                                             F(kvc_policy_config, window),
                                             F(kvc_policy_config, recent_fraction),
                                             F(kvc_policy_config, kernel_size),
                                             F(kvc_policy_config, pooling),
                                             F(kvc_policy_config, schedule),
                                             F(kvc_policy_config, beta),
                                             F(kvc_policy_config, shift_positions),
                                             F(kvc_policy_config, auto_evict),
                                             F(kvc_policy_config, plugin),
                                             F(kvc_policy_config, future_positions),
                                             F(kvc_policy_config, head_budget),
                                             F(kvc_policy_config, head_floor),
                                             F(kvc_policy_config, head_gates),
                                             F(kvc_policy_config, num_head_gates),
                                             F(kvc_policy_config, gate_threshold)};
static const field prefix_config_fields[] = {
    F(kvc_prefix_config, struct_size),   F(kvc_prefix_config, hash),
    F(kvc_prefix_config, verify_tokens), F(kvc_prefix_config, seed_set),
    F(kvc_prefix_config, seed),          F(kvc_prefix_config, model_id),
    F(kvc_prefix_config, tokenizer_id), F(kvc_prefix_config, extra_key_names),
    F(kvc_prefix_config, n_extra_key_names)};
static const field prefix_stats_fields[] = {
    F(kvc_prefix_stats, struct_size),       F(kvc_prefix_stats, queried_tokens),
    F(kvc_prefix_stats, hit_tokens),        F(kvc_prefix_stats, partial_tokens),
    F(kvc_prefix_stats, registered_blocks), F(kvc_prefix_stats, reclaimable_blocks),
    F(kvc_prefix_stats, referenced_blocks), F(kvc_prefix_stats, stored_total),
    F(kvc_prefix_stats, removed_total),     F(kvc_prefix_stats, reclaimed_total)};
static const field tier_config_fields[] = {
    F(kvc_tier_config, struct_size), F(kvc_tier_config, kind),
    F(kvc_tier_config, flags),       F(kvc_tier_config, capacity_bytes),
    F(kvc_tier_config, path),        F(kvc_tier_config, address),
    F(kvc_tier_config, timeout_ms),  F(kvc_tier_config, reserved),
    F(kvc_tier_config, ttl_seconds)};
static const field tier_stats_fields[] = {
    F(kvc_tier_stats, struct_size), F(kvc_tier_stats, kind),      F(kvc_tier_stats, reserved),
    F(kvc_tier_stats, bytes),       F(kvc_tier_stats, entries),   F(kvc_tier_stats, hits),
    F(kvc_tier_stats, misses),      F(kvc_tier_stats, demotions), F(kvc_tier_stats, promotions),
    F(kvc_tier_stats, drops),       F(kvc_tier_stats, evictions), F(kvc_tier_stats, errors),
    F(kvc_tier_stats, pinned),      F(kvc_tier_stats, last_error)};

/* Each struct's entry points as untyped calls: the sized export, the 0.3
 * export (parenthesized: the function, not the header's macro) and the two
 * members of a kvc_api table. The tier config is initialised for a disk tier. */
#define WRAP(thing, T)                                                         \
  static kvc_status thing##_sized(void *p, size_t n) {                         \
    return kvc_##thing##_init_sized((T *)p, n);                                \
  }                                                                            \
  static kvc_status thing##_old(void *p) {                                     \
    return (kvc_##thing##_init)((T *)p);                                       \
  }                                                                            \
  static kvc_status thing##_table_sized(const kvc_api *a, void *p, size_t n) { \
    return a->thing##_init_sized((T *)p, n);                                   \
  }                                                                            \
  static kvc_status thing##_table_old(const kvc_api *a, void *p) {             \
    return a->thing##_init((T *)p);                                            \
  }
WRAP(codec, kvc_codec)
WRAP(pool_config, kvc_pool_config)
WRAP(stats, kvc_stats)
WRAP(pool_layout, kvc_pool_layout)
WRAP(quant_sizes, kvc_quant_sizes)
WRAP(attention_params, kvc_attention_params)
WRAP(policy_config, kvc_policy_config)
WRAP(prefix_config, kvc_prefix_config)
WRAP(prefix_stats, kvc_prefix_stats)
WRAP(tier_stats, kvc_tier_stats)
static kvc_status tier_config_sized(void *p, size_t n) {
  return kvc_tier_config_init_sized((kvc_tier_config *)p, KVC_TIER_DISK, n);
}
static kvc_status tier_config_old(void *p) {
  return (kvc_tier_config_init)((kvc_tier_config *)p, KVC_TIER_DISK);
}
static kvc_status tier_config_table_sized(const kvc_api *a, void *p, size_t n) {
  return a->tier_config_init_sized((kvc_tier_config *)p, KVC_TIER_DISK, n);
}
static kvc_status tier_config_table_old(const kvc_api *a, void *p) {
  return a->tier_config_init((kvc_tier_config *)p, KVC_TIER_DISK);
}

typedef struct {
  const char *name;
  size_t size;          /* sizeof in this header */
  size_t size_0_3;      /* sizeof in 0.3: what the 0.3 symbol fills, forever */
  size_t min_size;      /* the smallest struct_size accepted (docs/abi-policy.md) */
  size_t older[3];      /* sizes of earlier releases (0: none) */
  uint32_t table_since; /* the kvc_api version whose table has the 0.3 member */
  const field *fields;
  size_t n_fields;
  kvc_status (*sized)(void *, size_t);
  kvc_status (*old)(void *);
  kvc_status (*table_sized)(const kvc_api *, void *, size_t);
  kvc_status (*table_old)(const kvc_api *, void *);
} struct_case;

#define CASE(thing, T, since, s03, min, o1, o2, o3)                                  \
  {                                                                                  \
#T, sizeof(T), s03, min,                                                         \
        {o1, o2, o3 }, since, thing##_fields, sizeof thing##_fields / sizeof(field), \
         thing##_sized, thing##_old, thing##_table_sized, thing##_table_old          \
  }
static const struct_case cases[] = {
    /* 0.2's codec had no full_range (48 bytes); 0.1's pool config ended at
     * device_index (72 with padding), 0.2's at num_residual_blocks (112). */
    CASE(codec, kvc_codec, 2, 56, 48, 48, 0, 0),
    CASE(pool_config, kvc_pool_config, 1, 136, 48, 72, 112, 0),
    CASE(stats, kvc_stats, 1, 128, 48, 96, 0, 0),
    CASE(pool_layout, kvc_pool_layout, 1, 240, 120, 128, 0, 0),
    CASE(quant_sizes, kvc_quant_sizes, 2, 40, 40, 0, 0, 0),
    CASE(attention_params, kvc_attention_params, 3, 40, 40, 0, 0, 0),
    CASE(policy_config, kvc_policy_config, 3, 88, 88, 0, 0, 0),
    CASE(prefix_config, kvc_prefix_config, 3, 72, 72, 0, 0, 0),
    CASE(prefix_stats, kvc_prefix_stats, 3, 80, 80, 0, 0, 0),
    CASE(tier_config, kvc_tier_config, 3, 56, 56, 0, 0, 0),
    CASE(tier_stats, kvc_tier_stats, 3, 352, 352, 0, 0, 0),
};
#define N_CASES (sizeof cases / sizeof cases[0])

/* Room for any struct + its guard bytes, aligned for every field. */
typedef union {
  uint64_t align; /* every field of these structs is at most 8-byte aligned */
  unsigned char b[512 + GUARD];
} buffer;

static void fill_guard(buffer *b) {
  memset(b->b, GUARD_BYTE, sizeof b->b);
}

static size_t struct_size_of(const buffer *b) {
  size_t s;
  memcpy(&s, b->b, sizeof s);
  return s;
}

/* The first field straddling a size, or NULL. */
static const field *cut_field(const struct_case *c, size_t sz) {
  for (size_t i = 0; i < c->n_fields; ++i)
    if (sz > c->fields[i].offset && sz < c->fields[i].offset + c->fields[i].size)
      return &c->fields[i];
  return NULL;
}

/* Every size the library must accept below the full struct: the minimum,
 * every field boundary after it, the older releases' sizes. */
static int is_older_size(const struct_case *c, size_t sz) {
  return sz >= c->min_size && sz <= c->size && cut_field(c, sz) == NULL;
}

/* The guard bytes after `sz` are intact and struct_size is `sz`; the first
 * sz bytes are those of the full struct's defaults. */
static void check_filled(const struct_case *c, const buffer *b, size_t sz, const buffer *full) {
  if (struct_size_of(b) != sz)
    print_error("%s: struct_size %zu after an init of %zu bytes\n", c->name, struct_size_of(b), sz);
  assert_int_equal(struct_size_of(b), sz);
  for (size_t i = sz; i < sz + GUARD; ++i) {
    if (b->b[i] != GUARD_BYTE)
      print_error("%s: init of %zu bytes wrote byte %zu (a guard byte)\n", c->name, sz, i);
    assert_int_equal(b->b[i], GUARD_BYTE);
  }
  assert_memory_equal(b->b + sizeof(size_t), full->b + sizeof(size_t), sz - sizeof(size_t));
}

static const kvc_api *table(uint32_t version) {
  const kvc_api *a = kvc_get_api(version);
  assert_non_null(a);
  return a;
}

/* The full struct as this header's caller gets it (kvc_<thing>_init(&s)). */
static void full_defaults(const struct_case *c, buffer *full) {
  fill_guard(full);
  ASSERT_OK(c->sized(full->b, c->size));
}

/* --------------------------------------------------------------------- */

/* The header's macros pass the caller's sizeof; the defaults are those
 * documented. */
static void check_macros_fill_caller_sizeof(void) {
  kvc_pool_config pc;
  memset(&pc, GUARD_BYTE, sizeof pc);
  ASSERT_OK(kvc_pool_config_init(&pc));
  assert_int_equal(pc.struct_size, sizeof pc);
  assert_int_equal(pc.block_size, 16);
  assert_int_equal(pc.k_dtype, KVC_DTYPE_F16);
  assert_int_equal(pc.num_layers, 0);
  assert_true(pc.rope_theta == 10000.0);
  kvc_codec cd;
  ASSERT_OK(kvc_codec_init(&cd));
  assert_int_equal(cd.struct_size, sizeof cd);
  assert_int_equal(cd.dtype, KVC_DTYPE_INT8);
  assert_int_equal(cd.group_size, 32);
  kvc_policy_config po;
  ASSERT_OK(kvc_policy_config_init(&po));
  assert_int_equal(po.struct_size, sizeof po);
  assert_int_equal(po.sink_tokens, 4);
  assert_int_equal(po.kernel_size, 7);
  kvc_prefix_config pr;
  ASSERT_OK(kvc_prefix_config_init(&pr));
  assert_int_equal(pr.struct_size, sizeof pr);
  assert_int_equal(pr.verify_tokens, 1);
  kvc_tier_config tc;
  ASSERT_OK(kvc_tier_config_init(&tc, KVC_TIER_REDIS));
  assert_int_equal(tc.struct_size, sizeof tc);
  assert_int_equal(tc.kind, KVC_TIER_REDIS);
  assert_int_equal(tc.timeout_ms, 1000);
  kvc_tier_stats ts;
  memset(&ts, GUARD_BYTE, sizeof ts);
  ASSERT_OK(kvc_tier_stats_init(&ts));
  assert_int_equal(ts.struct_size, sizeof ts);
  assert_int_equal(ts.last_error[255], 0);
}

/* An older caller's struct, followed by guard bytes, through every sized
 * export and the version-4 table (and this header's own, through the
 * macros). */
static void test_older_caller_guard_bytes(void **state) {
  (void)state;
  check_macros_fill_caller_sizeof();
  /* The field lists above are complete: the last field ends the struct
   * (a field appended to the header must be added here). */
  for (size_t i = 0; i < N_CASES; ++i) {
    const field *last = &cases[i].fields[cases[i].n_fields - 1];
    assert_int_equal((last->offset + last->size + 7) / 8 * 8, cases[i].size);
  }
  const kvc_api *api = table(4);
  for (size_t i = 0; i < N_CASES; ++i) {
    const struct_case *c = &cases[i];
    buffer full, b;
    full_defaults(c, &full);
    size_t checked = 0;
    for (size_t sz = 0; sz <= c->size; ++sz) {
      if (!is_older_size(c, sz)) continue;
      fill_guard(&b);
      ASSERT_OK(c->sized(b.b, sz));
      check_filled(c, &b, sz, &full);
      fill_guard(&b);
      ASSERT_OK(c->table_sized(api, b.b, sz));
      check_filled(c, &b, sz, &full);
      ++checked;
    }
    /* The minimum and the older releases' sizes are among them. */
    assert_true(is_older_size(c, c->min_size));
    for (size_t k = 0; k < 3; ++k)
      if (c->older[k]) assert_true(is_older_size(c, c->older[k]));
    assert_true(checked >= 1);
  }
}

/* The 0.3 symbols (direct and in the tables of versions 1..4) fill exactly
 * the 0.3 size: every byte of it, not one after. */
static void test_old_symbols_fill_0_3_size(void **state) {
  (void)state;
  for (size_t i = 0; i < N_CASES; ++i) {
    const struct_case *c = &cases[i];
    assert_true(c->size_0_3 <= c->size);
    buffer full, b;
    full_defaults(c, &full);
    for (uint32_t v = 0; v <= 4; ++v) {
      fill_guard(&b);
      if (v == 0) {
        ASSERT_OK(c->old(b.b));
      } else {
        if (v < c->table_since) continue; /* a host of version v does not have the member */
        ASSERT_OK(c->table_old(table(v), b.b));
      }
      check_filled(c, &b, c->size_0_3, &full);
      for (size_t k = 0; k < c->size_0_3; ++k) assert_int_not_equal(b.b[k], GUARD_BYTE);
    }
  }
}

/* A size inside a field, below the minimum or above KVC_STRUCT_SIZE_MAX is
 * refused and nothing is written; every other size is accepted. */
static void test_mid_field_sizes_refused(void **state) {
  (void)state;
  const kvc_api *api = table(4);
  for (size_t i = 0; i < N_CASES; ++i) {
    const struct_case *c = &cases[i];
    for (size_t sz = 0; sz <= c->size + 16; ++sz) {
      const field *cut = cut_field(c, sz);
      const int ok = sz >= c->min_size && cut == NULL;
      buffer b;
      for (int via_table = 0; via_table < 2; ++via_table) {
        fill_guard(&b);
        const kvc_status st = via_table ? c->table_sized(api, b.b, sz) : c->sized(b.b, sz);
        if ((st == KVC_OK) != ok)
          print_error("%s: struct_size %zu -> %s (%s)\n", c->name, sz, kvc_status_string(st),
                      kvc_last_error_message());
        assert_int_equal(st, ok ? KVC_OK : KVC_ERR_STRUCT_SIZE);
        if (ok) continue;
        for (size_t k = 0; k < sizeof b.b; ++k) assert_int_equal(b.b[k], GUARD_BYTE);
        if (cut != NULL && sz >= c->min_size) {
          assert_non_null(strstr(kvc_last_error_message(), cut->name));
          assert_non_null(strstr(kvc_last_error_message(), "inside"));
        }
      }
    }
    ASSERT_STATUS(KVC_ERR_NULL_POINTER, c->sized(NULL, c->size));
  }
  /* The upper bound: KVC_STRUCT_SIZE_MAX is accepted, one field more is not. */
  static union {
    uint64_t align; /* every field of these structs is at most 8-byte aligned */
    unsigned char b[KVC_STRUCT_SIZE_MAX + GUARD];
  } big;
  memset(big.b, GUARD_BYTE, sizeof big.b);
  ASSERT_STATUS(KVC_ERR_STRUCT_SIZE,
                kvc_stats_init_sized((kvc_stats *)big.b, KVC_STRUCT_SIZE_MAX + 8));
  assert_non_null(strstr(kvc_last_error_message(), "KVC_STRUCT_SIZE_MAX"));
  assert_int_equal(big.b[0], GUARD_BYTE);
  ASSERT_OK(kvc_stats_init_sized((kvc_stats *)big.b, KVC_STRUCT_SIZE_MAX));
  for (size_t k = sizeof(kvc_stats); k < KVC_STRUCT_SIZE_MAX; ++k) assert_int_equal(big.b[k], 0);
  for (size_t k = KVC_STRUCT_SIZE_MAX; k < sizeof big.b; ++k)
    assert_int_equal(big.b[k], GUARD_BYTE);
  /* An unknown tier kind writes nothing either. */
  buffer b;
  fill_guard(&b);
  ASSERT_STATUS(KVC_ERR_INVALID_ARGUMENT,
                kvc_tier_config_init_sized((kvc_tier_config *)b.b, (kvc_tier_kind)9,
                                           sizeof(kvc_tier_config)));
  assert_int_equal(b.b[0], GUARD_BYTE);
}

/* A newer caller's struct (larger than this library's): the known fields are
 * filled, the unknown tail zeroed, nothing after it written; the reading
 * functions accept it (its unknown bytes are zero). */
static void test_newer_caller_tail_zeroed(void **state) {
  (void)state;
  for (size_t i = 0; i < N_CASES; ++i) {
    const struct_case *c = &cases[i];
    buffer full, b;
    full_defaults(c, &full);
    const size_t sz = c->size + 24;
    fill_guard(&b);
    ASSERT_OK(c->sized(b.b, sz));
    assert_int_equal(struct_size_of(&b), sz);
    assert_memory_equal(b.b + sizeof(size_t), full.b + sizeof(size_t), c->size - sizeof(size_t));
    for (size_t k = c->size; k < sz; ++k) assert_int_equal(b.b[k], 0);
    for (size_t k = sz; k < sz + GUARD; ++k) assert_int_equal(b.b[k], GUARD_BYTE);
  }
  struct {
    kvc_pool_config c;
    uint64_t future[3];
  } newer;
  ASSERT_OK(kvc_pool_config_init_sized(&newer.c, sizeof newer));
  newer.c.num_layers = 1;
  newer.c.num_q_heads = newer.c.num_kv_heads = 1;
  newer.c.head_dim = 8;
  newer.c.num_blocks = 2;
  kvc_pool *p = NULL;
  ASSERT_OK(kvc_pool_create(&newer.c, &p));
  kvc_pool_destroy(p);
}

/* Everywhere a caller's struct is read or written, a size ending inside a
 * field is refused (naming it) and a size ending in padding is not. */
static void test_mid_field_refused_on_use(void **state) {
  (void)state;
  kvc_codec codec;
  kvc_codec_init(&codec);
  kvc_quant_sizes qs;
  for (size_t sz = 48; sz <= sizeof codec; ++sz) {
    codec.struct_size = sz;
    kvc_quant_sizes_init(&qs);
    /* full_range is bytes 48..51, reserved0 52..55 (0.4), outliers 56..59 */
    const int inside = (sz > 48 && sz < 52) || (sz > 52 && sz < 56) || (sz > 56 && sz < 60);
    ASSERT_STATUS(inside ? KVC_ERR_STRUCT_SIZE : KVC_OK, kvc_quantize_sizes(&codec, 4, 64, &qs));
    if (inside)
      assert_non_null(strstr(kvc_last_error_message(),
                             sz < 52 ? "full_range" : sz < 56 ? "reserved0" : "outliers"));
  }
  codec.struct_size = sizeof codec;

  kvc_pool_config cfg;
  kvc_pool_config_init(&cfg);
  cfg.num_layers = 1;
  cfg.num_q_heads = cfg.num_kv_heads = 2;
  cfg.head_dim = 8;
  cfg.num_blocks = 8;
  cfg.block_size = 4;
  cfg.k_codec = &codec;
  kvc_pool *p = (kvc_pool *)(uintptr_t)0x1234;
  cfg.struct_size = offsetof(kvc_pool_config, k_codec) + 4;
  ASSERT_STATUS(KVC_ERR_STRUCT_SIZE, kvc_pool_create(&cfg, &p));
  assert_non_null(strstr(kvc_last_error_message(), "k_codec"));
  assert_ptr_equal(p, (kvc_pool *)(uintptr_t)0x1234);
  cfg.struct_size =
      offsetof(kvc_pool_config, device_index) + 4 + 2; /* in the padding before k_codec */
  ASSERT_OK(kvc_pool_create(&cfg, &p));
  kvc_pool_destroy(p);
  cfg.struct_size = sizeof cfg;
  ASSERT_OK(kvc_pool_create(&cfg, &p));
  kvc_prefix_config pc;
  kvc_prefix_config_init(&pc);
  ASSERT_OK(kvc_pool_enable_prefix_cache(p, &pc));

  /* Outputs: refused sizes write nothing, accepted ones only their bytes. */
  union {
    kvc_stats s;
    unsigned char b[sizeof(kvc_stats) + GUARD];
  } st;
  memset(st.b, GUARD_BYTE, sizeof st.b);
  st.s.struct_size = offsetof(kvc_stats, bytes_per_block) + 4;
  ASSERT_STATUS(KVC_ERR_STRUCT_SIZE, kvc_pool_stats(p, &st.s));
  assert_non_null(strstr(kvc_last_error_message(), "bytes_per_block"));
  for (size_t k = sizeof(size_t); k < sizeof st.b; ++k) assert_int_equal(st.b[k], GUARD_BYTE);
  st.s.struct_size = offsetof(kvc_stats, bytes_per_block) + 8;
  ASSERT_OK(kvc_pool_stats(p, &st.s));
  assert_int_equal(st.s.blocks_total, 8);
  for (size_t k = st.s.struct_size; k < sizeof st.b; ++k) assert_int_equal(st.b[k], GUARD_BYTE);

  kvc_pool_layout l;
  kvc_pool_layout_init(&l);
  l.struct_size = offsetof(kvc_pool_layout, device) + 2;
  ASSERT_STATUS(KVC_ERR_STRUCT_SIZE, kvc_pool_get_layout(p, &l));
  assert_non_null(strstr(kvc_last_error_message(), "device"));
  kvc_pool_config got;
  kvc_pool_config_init(&got);
  got.v_dtype = (kvc_dtype)(KVC_DTYPE_F16 + 0x7f);
  got.struct_size = offsetof(kvc_pool_config, k_dtype) + 2;
  ASSERT_STATUS(KVC_ERR_STRUCT_SIZE, kvc_pool_get_config(p, &got));
  assert_non_null(strstr(kvc_last_error_message(), "k_dtype"));
  got.struct_size = offsetof(kvc_pool_config, k_dtype) + 4;
  ASSERT_OK(kvc_pool_get_config(p, &got));
  assert_int_equal(got.num_blocks, 8);
  assert_int_equal(got.v_dtype, KVC_DTYPE_F16 + 0x7f); /* not covered: not written */

  const int32_t tokens[9] = {1, 2, 3, 4, 5, 6, 7, 8, 9};
  kvc_prefix_result r;
  memset(&r, 0, sizeof r);
  r.struct_size = offsetof(kvc_prefix_result, tier_tokens) + 4;
  ASSERT_STATUS(KVC_ERR_STRUCT_SIZE, kvc_prefix_lookup(p, tokens, 9, NULL, 0, 0, &r));
  assert_non_null(strstr(kvc_last_error_message(), "tier_tokens"));
  r.struct_size = offsetof(kvc_prefix_result, tier_tokens);
  ASSERT_OK(kvc_prefix_lookup(p, tokens, 9, NULL, 0, 0, &r));
  assert_int_equal(r.hit_tokens, 0);

  kvc_policy_config po;
  kvc_policy_config_init(&po);
  po.kind = KVC_POLICY_STREAMING;
  po.recent_tokens = 4;
  kvc_policy *pol = NULL;
  po.struct_size = sizeof po + 4; /* a newer header's field of 4 zero bytes */
  union {
    kvc_policy_config c;
    unsigned char b[sizeof(kvc_policy_config) + 8];
  } newer;
  memset(newer.b, 0, sizeof newer.b);
  memcpy(newer.b, &po, sizeof po);
  ASSERT_OK(kvc_policy_create(&newer.c, &pol));
  kvc_policy_destroy(pol);
  kvc_pool_destroy(p);
}

/* Table version 4 has the sized functions, each the direct export; the 0.3
 * members are still the 0.3 functions. */
static void test_table_version_4(void **state) {
  (void)state;
  const kvc_api *api = table(4);
  assert_true(api->api_version >= 4);
  assert_true(api->struct_size >=
              offsetof(kvc_api, tier_stats_init_sized) + sizeof api->tier_stats_init_sized);
  assert_true(api->pool_config_init_sized == &kvc_pool_config_init_sized);
  assert_true(api->stats_init_sized == &kvc_stats_init_sized);
  assert_true(api->pool_layout_init_sized == &kvc_pool_layout_init_sized);
  assert_true(api->codec_init_sized == &kvc_codec_init_sized);
  assert_true(api->quant_sizes_init_sized == &kvc_quant_sizes_init_sized);
  assert_true(api->attention_params_init_sized == &kvc_attention_params_init_sized);
  assert_true(api->policy_config_init_sized == &kvc_policy_config_init_sized);
  assert_true(api->prefix_config_init_sized == &kvc_prefix_config_init_sized);
  assert_true(api->prefix_stats_init_sized == &kvc_prefix_stats_init_sized);
  assert_true(api->tier_config_init_sized == &kvc_tier_config_init_sized);
  assert_true(api->tier_stats_init_sized == &kvc_tier_stats_init_sized);
  assert_true(api->pool_config_init == &kvc_pool_config_init);
  assert_true(api->tier_config_init == &kvc_tier_config_init);
  assert_true(api->tier_stats_init == &kvc_tier_stats_init);
  assert_null(kvc_get_api(KVC_API_VERSION + 1));
}

int main(int argc, char **argv) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_older_caller_guard_bytes),
      cmocka_unit_test(test_old_symbols_fill_0_3_size),
      cmocka_unit_test(test_mid_field_sizes_refused),
      cmocka_unit_test(test_newer_caller_tail_zeroed),
      cmocka_unit_test(test_mid_field_refused_on_use),
      cmocka_unit_test(test_table_version_4),
  };
  if (argc > 1) { /* one ctest per test function: the name must exist */
    int found = 0;
    for (size_t i = 0; i < sizeof tests / sizeof tests[0]; ++i)
      found |= strcmp(tests[i].name, argv[1]) == 0;
    if (!found) {
      fprintf(stderr, "no test named %s\n", argv[1]);
      return 1;
    }
    cmocka_set_test_filter(argv[1]);
  }
  return cmocka_run_group_tests_name("abi_init", tests, NULL, NULL);
}
