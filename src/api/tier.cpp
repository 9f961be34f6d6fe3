// Offload tiers: add, configure, statistics, offload, prefetch, load, pins.
#include <cstddef>
#include <cstring>
#include <string>
#include <vector>

#include "api/api_int.h"

using namespace kvc::api;

namespace {
constexpr size_t kTierConfigMin = offsetof(kvc_tier_config, ttl_seconds) + sizeof(uint64_t);
// The whole 0.3 struct (not sizeof: the minimum stays when the struct grows).
constexpr size_t kTierStatsMin = kvc::api::size_0_3<kvc_tier_stats>;

kvc_tier_config tier_defaults() {
  kvc_tier_config c;
  std::memset(&c, 0, sizeof c);
  c.struct_size = sizeof c;
  c.kind = KVC_TIER_HOST;
  c.timeout_ms = 1000;
  return c;
}

}  // namespace

kvc::core::TierSpec kvc::api::tier_spec(const kvc_tier_config *config) {
  need(config, "config");
  kvc_tier_config c = tier_defaults();
  kvc::api::read_input_struct(config, kTierConfigMin, "kvc_tier_config", &c);
  if (c.reserved != 0) fail(Errc::Unsupported, "kvc_tier_config.reserved must be 0");
  if (c.kind != KVC_TIER_HOST && c.kind != KVC_TIER_DISK && c.kind != KVC_TIER_REDIS)
    fail(Errc::InvalidArgument,
         "kind " + std::to_string(static_cast<int32_t>(c.kind)) + ": unknown");
  const uint32_t known = c.kind == KVC_TIER_DISK    ? KVC_TIER_FSYNC
                         : c.kind == KVC_TIER_REDIS ? KVC_TIER_REDIS_CLUSTER
                                                    : 0u;
  if (c.flags & ~known)
    fail(Errc::InvalidArgument, c.kind == KVC_TIER_REDIS ? "unknown flags for a Redis tier"
                                                         : "unknown flags for this tier kind");
  kvc::core::TierSpec ts;
  ts.kind = static_cast<kvc::core::TierKind>(c.kind);
  ts.capacity_bytes = c.capacity_bytes;
  ts.path = c.path ? c.path : "";
  ts.fsync = (c.flags & KVC_TIER_FSYNC) != 0;
  ts.address = c.address ? c.address : "";
  ts.cluster = (c.flags & KVC_TIER_REDIS_CLUSTER) != 0;
  ts.timeout_ms = c.timeout_ms;
  ts.ttl_seconds = c.ttl_seconds;
  return ts;
}

void kvc::api::write_tier_stats(const kvc::core::TierCounts &c, kvc_tier_stats *stats) {
  need(stats, "stats");
  kvc::api::check_output_struct(stats, kTierStatsMin, "kvc_tier_stats");
  kvc_tier_stats full;
  std::memset(&full, 0, sizeof full);
  full.struct_size = sizeof full;
  full.kind = static_cast<kvc_tier_kind>(c.kind);
  full.bytes = c.bytes;
  full.entries = c.entries;
  full.hits = c.hits;
  full.misses = c.misses;
  full.demotions = c.demotions;
  full.promotions = c.promotions;
  full.drops = c.drops;
  full.evictions = c.evictions;
  full.errors = c.errors;
  full.pinned = c.pinned;
  std::snprintf(full.last_error, sizeof full.last_error, "%s", c.last_error.c_str());
  kvc::api::write_output_struct(full, stats);
}

namespace {
void poll_status(kvc::core::LoadState s, uint64_t ticket) {
  if (s == kvc::core::LoadState::Pending)
    fail(Errc::Pending, "load " + std::to_string(ticket) + " is still reading from the tiers");
  if (s == kvc::core::LoadState::TimedOut)
    fail(Errc::Timeout, "load " + std::to_string(ticket) +
                            ": the tiers did not answer within the load timeout; its reserved "
                            "blocks are back in the pool");
}
}  // namespace

extern "C" {

KVC_API kvc_status(kvc_tier_config_init)(kvc_tier_config *config, kvc_tier_kind kind) {
  return kvc_tier_config_init_sized(config, kind, kvc::api::size_0_3<kvc_tier_config>);
}

KVC_API kvc_status kvc_tier_config_init_sized(kvc_tier_config *config, kvc_tier_kind kind,
                                              size_t struct_size) {
  return guard([&] {
    need(config, "config");
    if (kind != KVC_TIER_HOST && kind != KVC_TIER_DISK && kind != KVC_TIER_REDIS)
      fail(Errc::InvalidArgument, "kind " + std::to_string(static_cast<int32_t>(kind)) +
                                      ": unknown (KVC_TIER_HOST, KVC_TIER_DISK or KVC_TIER_REDIS)");
    kvc_tier_config d = tier_defaults();
    d.kind = kind;
    kvc::api::init_sized(config, struct_size, kTierConfigMin, d);
  });
}

KVC_API kvc_status kvc_pool_add_tier(kvc_pool *pool, const kvc_tier_config *config,
                                     uint32_t *tier_index) {
  return guard([&] {
    auto &p = core_of(pool);
    const kvc::core::TierSpec ts = kvc::api::tier_spec(config);
    // Everything checked first; the tier is made by the pool once it can take it.
    const uint32_t i = p.prefix().tiers().add_tier(ts);
    if (tier_index) *tier_index = i;
  });
}

KVC_API kvc_status kvc_pool_set_offload(kvc_pool *pool, uint32_t queue_blocks,
                                        uint32_t load_timeout_ms) {
  return guard([&] { core_of(pool).prefix().tiers().set_offload(queue_blocks, load_timeout_ms); });
}

KVC_API kvc_status(kvc_tier_stats_init)(kvc_tier_stats *stats) {
  return kvc_tier_stats_init_sized(stats, kvc::api::size_0_3<kvc_tier_stats>);
}

KVC_API kvc_status kvc_tier_stats_init_sized(kvc_tier_stats *stats, size_t struct_size) {
  return guard([&] {
    need(stats, "stats");
    kvc::api::init_sized(stats, struct_size, kTierStatsMin, zeroed_struct<kvc_tier_stats>());
  });
}

KVC_API kvc_status kvc_pool_tier_stats(kvc_pool *pool, uint32_t tier_index, kvc_tier_stats *stats) {
  return guard([&] {
    auto &p = core_of(pool);
    need(stats, "stats");
    kvc::api::check_output_struct(stats, kTierStatsMin, "kvc_tier_stats");
    write_tier_stats(p.prefix().tiers().counts(tier_index), stats);
  });
}

KVC_API kvc_status kvc_prefix_offload(kvc_pool *pool, const int32_t *tokens, uint64_t n_tokens,
                                      const kvc_prefix_extra *extras, uint32_t n_extras,
                                      uint64_t *n_queued) {
  return guard([&] {
    auto &p = core_of(pool);
    const auto ex = prefix_args(tokens, n_tokens, extras, n_extras);
    const uint64_t q =
        p.prefix().tiers().offload(tokens, n_tokens, p.prefix().extra_keys(ex.data(), n_extras));
    if (n_queued) *n_queued = q;
  });
}

KVC_API kvc_status kvc_pool_flush_tiers(kvc_pool *pool) {
  return guard([&] { core_of(pool).prefix().tiers().flush(); });
}

KVC_API kvc_status kvc_prefix_prefetch(kvc_pool *pool, const int32_t *tokens, uint64_t n_tokens,
                                       const kvc_prefix_extra *extras, uint32_t n_extras,
                                       uint64_t *ticket) {
  return guard([&] {
    auto &p = core_of(pool);
    need(ticket, "ticket");
    const auto ex = prefix_args(tokens, n_tokens, extras, n_extras);
    *ticket =
        p.prefix().tiers().prefetch(tokens, n_tokens, p.prefix().extra_keys(ex.data(), n_extras));
  });
}

KVC_API kvc_status kvc_prefix_load(kvc_pool *pool, const int32_t *tokens, uint64_t n_tokens,
                                   const kvc_prefix_extra *extras, uint32_t n_extras,
                                   uint64_t *loaded_tokens) {
  return guard([&] {
    auto &p = core_of(pool);
    const auto ex = prefix_args(tokens, n_tokens, extras, n_extras);
    if (loaded_tokens) *loaded_tokens = 0;
    const uint64_t t =
        p.prefix().tiers().prefetch(tokens, n_tokens, p.prefix().extra_keys(ex.data(), n_extras),
                                    /*sync=*/true);
    uint64_t loaded = 0;
    poll_status(p.prefix().tiers().poll(t, /*wait=*/true, &loaded), t);
    if (loaded_tokens) *loaded_tokens = loaded;
  });
}

KVC_API kvc_status kvc_prefix_poll(kvc_pool *pool, uint64_t ticket, uint64_t *loaded_tokens) {
  return guard([&] {
    auto &p = core_of(pool);
    if (loaded_tokens) *loaded_tokens = 0;
    uint64_t loaded = 0;
    poll_status(p.prefix().tiers().poll(ticket, /*wait=*/false, &loaded), ticket);
    if (loaded_tokens) *loaded_tokens = loaded;
  });
}

KVC_API kvc_status kvc_prefix_unpin(kvc_pool *pool, uint64_t pin) {
  return guard([&] { core_of(pool).prefix().tiers().unpin(pin); });
}

}  // extern "C"
