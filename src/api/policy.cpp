// Eviction policies and scorer plugins.
#include <cstddef>
#include <cstring>
#include <string>
#include <vector>

#include "api/api_int.h"

using namespace kvc::api;

namespace {

constexpr size_t kPolicyConfigMin = offsetof(kvc_policy_config, plugin) + sizeof(void *);

void policy_defaults(kvc_policy_config *c) {
  std::memset(c, 0, sizeof *c);
  c->struct_size = sizeof *c;
  c->kind = KVC_POLICY_NONE;
  c->sink_tokens = 4;
  c->window = 32;
  c->recent_fraction = 0.5;
  c->kernel_size = 7;
  c->pooling = KVC_POOLING_MAX;
  c->schedule = KVC_PYRAMID_PAPER;
  c->beta = 20.0;
  c->future_positions = 512;
  c->head_budget = KVC_HEAD_BUDGET_UNIFORM;
  c->head_floor = 0.2;
  c->gate_threshold = 0.5f;
}

}  // namespace

extern "C" {

KVC_API kvc_status(kvc_policy_config_init)(kvc_policy_config *config) {
  return kvc_policy_config_init_sized(config, kvc::api::size_0_3<kvc_policy_config>);
}

KVC_API kvc_status kvc_policy_config_init_sized(kvc_policy_config *config, size_t struct_size) {
  return guard([&] {
    need(config, "config");
    kvc_policy_config d;
    policy_defaults(&d);
    kvc::api::init_sized(config, struct_size, kPolicyConfigMin, d);
  });
}

KVC_API kvc_status kvc_policy_create(const kvc_policy_config *config, kvc_policy **out) {
  return guard([&] {
    need(config, "config");
    need(out, "out");
    kvc_policy_config c;
    policy_defaults(&c);
    kvc::api::read_input_struct(config, kPolicyConfigMin, "kvc_policy_config", &c);
    auto sp = std::make_shared<kvc::core::PolicySpec>();
    sp->kind = static_cast<kvc::core::PolicyKind>(c.kind);
    sp->budget_tokens = c.budget_tokens;
    sp->compression_ratio = c.compression_ratio;
    sp->sink_tokens = c.sink_tokens;
    sp->recent_tokens = c.recent_tokens;
    sp->recent_fraction = c.recent_fraction;
    sp->window = c.window;
    sp->kernel_size = c.kernel_size;
    sp->pooling = static_cast<kvc::core::Pooling>(c.pooling);
    sp->schedule = static_cast<kvc::core::Schedule>(c.schedule);
    sp->beta = c.beta;
    sp->shift_positions = c.shift_positions != 0;
    sp->auto_evict = c.auto_evict != 0;
    if (c.plugin) sp->plugin = c.plugin->core;
    sp->future_positions = c.future_positions;
    sp->head_budget = static_cast<kvc::core::HeadBudget>(c.head_budget);
    sp->head_floor = c.head_floor;
    if (c.num_head_gates > (1u << 20))
      fail(Errc::InvalidArgument, "num_head_gates " + std::to_string(c.num_head_gates) +
                                      " above 1048576 (layers x KV heads)");
    if (c.num_head_gates) {
      need(c.head_gates, "head_gates");
      sp->head_gates.assign(c.head_gates, c.head_gates + c.num_head_gates);
    }
    sp->gate_threshold = c.gate_threshold;
    sp->validate();
    auto *pol = new kvc_policy;
    pol->spec = std::move(sp);
    *out = pol;
  });
}

KVC_API void kvc_policy_destroy(kvc_policy *policy) {
  delete policy;
}

KVC_API kvc_status kvc_seq_set_policy(kvc_pool *pool, uint64_t seq_id, const kvc_policy *policy) {
  return guard([&] {
    auto &p = core_of(pool);
    p.set_policy(seq_id, policy ? policy->spec : nullptr);
  });
}

KVC_API kvc_status kvc_pool_set_policy(kvc_pool *pool, const kvc_policy *policy) {
  return guard([&] {
    auto &p = core_of(pool);
    p.set_policy(std::nullopt, policy ? policy->spec : nullptr);
  });
}

KVC_API kvc_status kvc_evict(kvc_pool *pool, uint64_t seq_id, const kvc_policy *policy,
                             uint64_t *dropped) {
  return guard([&] {
    auto &p = core_of(pool);
    p.evict(seq_id, policy ? policy->spec.get() : nullptr, dropped);
  });
}

KVC_API kvc_status kvc_seq_keep(kvc_pool *pool, uint64_t seq_id, uint32_t layer,
                                const uint64_t *keep, uint64_t n_keep, uint64_t *dropped) {
  return guard([&] {
    auto &p = core_of(pool);
    if (n_keep > 0) need(keep, "keep");
    uint64_t d = 0;
    p.keep_tokens(seq_id, layer, keep, n_keep, &d);
    if (dropped) *dropped = d;
  });
}

KVC_API kvc_status kvc_seq_keep_head(kvc_pool *pool, uint64_t seq_id, uint32_t layer, uint32_t head,
                                     const uint64_t *keep, uint64_t n_keep, uint64_t *dropped) {
  return guard([&] {
    auto &p = core_of(pool);
    if (n_keep > 0) need(keep, "keep");
    uint64_t d = 0;
    p.keep_tokens(seq_id, layer, keep, n_keep, &d, head);
    if (dropped) *dropped = d;
  });
}

KVC_API kvc_status kvc_plugin_load(const char *path, kvc_plugin **out) {
  return guard([&] {
    need(path, "path");
    need(out, "out");
    auto core = kvc::core::Plugin::load(path);
    auto *pl = new kvc_plugin;
    pl->core = std::move(core);
    *out = pl;
  });
}

KVC_API void kvc_plugin_unload(kvc_plugin *plugin) {
  delete plugin;
}

KVC_API const char *kvc_plugin_name(const kvc_plugin *plugin) {
  return plugin ? plugin->core->name() : nullptr;
}

}  // extern "C"
