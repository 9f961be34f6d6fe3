// The prefix cache: enable, lookup, attach, insert, keys, statistics, events.
#include <cstddef>
#include <cstring>
#include <string>
#include <vector>

#include "api/api_int.h"

using namespace kvc::api;

namespace {
constexpr size_t kPrefixConfigMin = offsetof(kvc_prefix_config, tokenizer_id) + sizeof(void *);
constexpr size_t kPrefixResultMin = offsetof(kvc_prefix_result, partial_tokens) + sizeof(uint64_t);
constexpr size_t kPrefixStatsMin = offsetof(kvc_prefix_stats, reclaimed_total) + sizeof(uint64_t);

void prefix_defaults(kvc_prefix_config *c) {
  std::memset(c, 0, sizeof *c);
  c->struct_size = sizeof *c;
  c->hash = KVC_PREFIX_HASH_SHA256;
  c->verify_tokens = 1;
}

struct CallbackBox {
  kvc_prefix_event_fn fn;
  void *user;
};
}  // namespace

// Checks the prompt arguments and converts the extra keys.
std::vector<kvc::core::PrefixExtra> kvc::api::prefix_args(const int32_t *tokens, uint64_t n,
                                                          const kvc_prefix_extra *extras,
                                                          uint32_t n_extras) {
  if (n) need(tokens, "tokens");
  if (n > (uint64_t(1) << 31))
    fail(Errc::Overflow, "n_tokens " + std::to_string(n) + " is above 2^31");
  if (n_extras > 64)
    fail(Errc::InvalidArgument, "n_extras " + std::to_string(n_extras) + ": at most 64");
  if (n_extras) need(extras, "extras");
  std::vector<kvc::core::PrefixExtra> ex(n_extras);
  for (uint32_t i = 0; i < n_extras; ++i) {
    if (extras[i].size > (size_t(1) << 20))
      fail(Errc::InvalidArgument, "extra key " + std::to_string(i) + " is larger than 1 MiB");
    if (extras[i].size && !extras[i].data)
      fail(Errc::NullPointer, "extra key " + std::to_string(i) + " has no data");
    ex[i] = {static_cast<const uint8_t *>(extras[i].data), extras[i].size};
  }
  return ex;
}

void kvc::api::write_result(const kvc::core::PrefixResult &r, kvc_prefix_result *out) {
  kvc_prefix_result full{};
  full.struct_size = sizeof full;
  full.hit_tokens = r.hit_tokens;
  full.hit_blocks = r.hit_blocks;
  full.partial_tokens = r.partial_tokens;
  full.tier_tokens = r.tier_tokens;
  full.pin = r.pin;
  kvc::api::write_output_struct(full, out);
}

extern "C" {

KVC_API kvc_status(kvc_prefix_config_init)(kvc_prefix_config *config) {
  return kvc_prefix_config_init_sized(config, kvc::api::size_0_3<kvc_prefix_config>);
}

KVC_API kvc_status kvc_prefix_config_init_sized(kvc_prefix_config *config, size_t struct_size) {
  return guard([&] {
    need(config, "config");
    kvc_prefix_config d;
    prefix_defaults(&d);
    kvc::api::init_sized(config, struct_size, kPrefixConfigMin, d);
  });
}

KVC_API kvc_status kvc_pool_enable_prefix_cache(kvc_pool *pool, const kvc_prefix_config *config) {
  return guard([&] {
    auto &p = core_of(pool);
    need(config, "config");
    kvc_prefix_config c;
    prefix_defaults(&c);
    kvc::api::read_input_struct(config, kPrefixConfigMin, "kvc_prefix_config", &c);
    const int32_t h = static_cast<int32_t>(c.hash);
    if (h != KVC_PREFIX_HASH_SHA256 && h != KVC_PREFIX_HASH_XXH3_128)
      fail(Errc::InvalidArgument,
           "hash " + std::to_string(h) + ": unknown (KVC_PREFIX_HASH_SHA256 or _XXH3_128)");
    kvc::core::PrefixConfig pc;
    pc.hash = static_cast<kvc::core::PrefixHash>(h);
    pc.verify_tokens = c.verify_tokens != 0;
    pc.seed_set = c.seed_set != 0;
    std::memcpy(pc.seed, c.seed, 32);
    if (c.model_id) pc.model_id = c.model_id;
    if (c.tokenizer_id) pc.tokenizer_id = c.tokenizer_id;
    // Extra-key names (0.4): bounded reads; the core checks them.
    if (c.n_extra_key_names > kvc::core::kMaxExtraKeyNames)
      fail(Errc::InvalidArgument, "n_extra_key_names " + std::to_string(c.n_extra_key_names) +
                                      ": at most " + std::to_string(kvc::core::kMaxExtraKeyNames));
    if (c.n_extra_key_names) need(c.extra_key_names, "extra_key_names");
    for (uint32_t i = 0; i < c.n_extra_key_names; ++i) {
      const char *name = c.extra_key_names[i];
      if (!name) fail(Errc::NullPointer, "extra_key_names[" + std::to_string(i) + "] is NULL");
      pc.extra_key_names.emplace_back(name, strnlen(name, kvc::core::kMaxExtraKeyNameBytes + 1));
    }
    p.prefix().enable(pc);
  });
}

KVC_API kvc_status kvc_prefix_lookup(kvc_pool *pool, const int32_t *tokens, uint64_t n_tokens,
                                     const kvc_prefix_extra *extras, uint32_t n_extras,
                                     uint32_t flags, kvc_prefix_result *result) {
  return guard([&] {
    auto &p = core_of(pool);
    need(result, "result");
    kvc::api::check_output_struct(result, kPrefixResultMin, "kvc_prefix_result");
    if (flags & ~(KVC_PREFIX_PARTIAL | KVC_PREFIX_PIN))
      fail(Errc::InvalidArgument, "unknown flags (known: KVC_PREFIX_PARTIAL, KVC_PREFIX_PIN)");
    const auto ex = prefix_args(tokens, n_tokens, extras, n_extras);
    const bool pin = (flags & KVC_PREFIX_PIN) != 0;
    if (pin && result->struct_size < offsetof(kvc_prefix_result, pin) + sizeof(uint64_t))
      fail(Errc::StructSize, "KVC_PREFIX_PIN needs a kvc_prefix_result with the pin field (0.3)");
    const auto kx = p.prefix().extra_keys(ex.data(), n_extras);
    const auto r =
        p.prefix().tiers().lookup(tokens, n_tokens, kx, (flags & KVC_PREFIX_PARTIAL) != 0, pin);
    write_result(r, result);
  });
}

KVC_API kvc_status kvc_prefix_attach(kvc_pool *pool, uint64_t seq_id, const int32_t *tokens,
                                     uint64_t n_tokens, const kvc_prefix_extra *extras,
                                     uint32_t n_extras, uint32_t flags, kvc_prefix_result *result) {
  return guard([&] {
    auto &p = core_of(pool);
    if (result) kvc::api::check_output_struct(result, kPrefixResultMin, "kvc_prefix_result");
    if (flags & ~KVC_PREFIX_PARTIAL)
      fail(Errc::InvalidArgument, "unknown flags (known: KVC_PREFIX_PARTIAL)");
    const auto ex = prefix_args(tokens, n_tokens, extras, n_extras);
    const auto kx = p.prefix().extra_keys(ex.data(), n_extras);
    const auto r =
        p.prefix().attach(seq_id, tokens, n_tokens, kx, (flags & KVC_PREFIX_PARTIAL) != 0);
    if (result) write_result(r, result);
  });
}

KVC_API kvc_status kvc_prefix_insert(kvc_pool *pool, uint64_t seq_id, const int32_t *tokens,
                                     uint64_t n_tokens, const kvc_prefix_extra *extras,
                                     uint32_t n_extras, uint64_t *n_registered) {
  return guard([&] {
    auto &p = core_of(pool);
    const auto ex = prefix_args(tokens, n_tokens, extras, n_extras);
    const uint64_t n =
        p.prefix().insert(seq_id, tokens, n_tokens, p.prefix().extra_keys(ex.data(), n_extras));
    if (n_registered) *n_registered = n;
  });
}

KVC_API kvc_status kvc_prefix_keys(kvc_pool *pool, const int32_t *tokens, uint64_t n_tokens,
                                   const kvc_prefix_extra *extras, uint32_t n_extras,
                                   uint8_t *keys_out, size_t capacity, size_t *key_size) {
  return guard([&] {
    auto &p = core_of(pool);
    need(key_size, "key_size");
    const auto ex = prefix_args(tokens, n_tokens, extras, n_extras);
    const auto kx = p.prefix().extra_keys(ex.data(), n_extras);
    const uint64_t ks = p.prefix().key_size();
    *key_size = ks;
    const uint64_t blocks = n_tokens / p.config().block_size;
    if (blocks * ks > capacity)
      fail(Errc::BufferTooSmall, std::to_string(blocks) + " keys need " +
                                     std::to_string(blocks * ks) + " bytes, capacity is " +
                                     std::to_string(capacity));
    if (blocks) need(keys_out, "keys_out");
    p.prefix().keys(tokens, n_tokens, kx, keys_out);
  });
}

KVC_API kvc_status(kvc_prefix_stats_init)(kvc_prefix_stats *stats) {
  return kvc_prefix_stats_init_sized(stats, kvc::api::size_0_3<kvc_prefix_stats>);
}

KVC_API kvc_status kvc_prefix_stats_init_sized(kvc_prefix_stats *stats, size_t struct_size) {
  return guard([&] {
    need(stats, "stats");
    kvc::api::init_sized(stats, struct_size, kPrefixStatsMin, zeroed_struct<kvc_prefix_stats>());
  });
}

KVC_API kvc_status kvc_prefix_get_stats(kvc_pool *pool, kvc_prefix_stats *stats) {
  return guard([&] {
    auto &p = core_of(pool);
    need(stats, "stats");
    kvc::api::check_output_struct(stats, kPrefixStatsMin, "kvc_prefix_stats");
    const auto c = p.prefix().counts();
    kvc_prefix_stats full{};
    full.struct_size = sizeof full;
    full.queried_tokens = c.queried_tokens;
    full.hit_tokens = c.hit_tokens;
    full.partial_tokens = c.partial_tokens;
    full.registered_blocks = c.registered;
    full.reclaimable_blocks = c.reclaimable;
    full.referenced_blocks = c.referenced;
    full.stored_total = c.inserted;
    full.removed_total = c.removed;
    full.reclaimed_total = c.reclaimed;
    kvc::api::write_output_struct(full, stats);
  });
}

KVC_API kvc_status kvc_prefix_set_callback(kvc_pool *pool, kvc_prefix_event_fn fn, void *user) {
  return guard([&] {
    auto &p = core_of(pool);
    auto set_box = [&] {
      pool->prefix_callback.fn = fn;
      pool->prefix_callback.user = user;
    };
    if (!fn) {
      p.prefix().set_callback(nullptr, nullptr, set_box);
      return;
    }
    p.prefix().set_callback(
        [](void *u, int kind, const uint8_t *key, const uint8_t *parent, uint32_t ks,
           uint64_t depth) {
          const auto *box = static_cast<const kvc_pool::Callback *>(u);
          kvc_prefix_event ev{};
          ev.struct_size = sizeof ev;
          ev.kind = kind == 0 ? KVC_PREFIX_STORED : KVC_PREFIX_REMOVED;
          ev.key_size = ks;
          ev.key = key;
          ev.parent_key = parent;
          ev.depth = depth;
          box->fn(box->user, &ev);
        },
        &pool->prefix_callback, set_box);
  });
}

}  // extern "C"
