// Scorer plugins: the sample key-norm plugin loads and drives eviction;
// wrong ABI versions, missing symbols, incomplete tables and failing or
// non-finite scorers are refused with a clear status and change nothing.
#include <cstring>
#include <string>
#include <vector>

#include "../whitebox.h"
#include "api/internal.h"

namespace {

kvc_pool *make_pool() {
  kvc_pool_config c;
  kvc_pool_config_init(&c);
  c.num_layers = 2;
  c.num_q_heads = 2;
  c.num_kv_heads = 2;
  c.head_dim = 4;
  c.block_size = 4;
  c.num_blocks = 64;
  c.k_dtype = c.v_dtype = KVC_DTYPE_F32;
  kvc_pool *p = nullptr;
  CHECK_OK(kvc_pool_create(&c, &p));
  return p;
}

// 12 tokens; token t's key has norm |t - 6| + 1 on each head (the smallest
// norms are around token 6).
void fill(kvc_pool *p) {
  CHECK_OK(kvc_seq_create(p, 1));
  CHECK_OK(kvc_seq_reserve(p, 1, 12, nullptr));
  std::vector<float> k(12 * 8, 0.0f), v(12 * 8, 1.0f);
  for (int t = 0; t < 12; ++t) {
    const float norm = static_cast<float>(t > 6 ? t - 6 : 6 - t) + 1.0f;
    k[t * 8 + 0] = norm;
    k[t * 8 + 4 + 3] = -norm;
  }
  for (uint32_t l = 0; l < 2; ++l) CHECK_OK(kvc_append(p, 1, l, 0, 12, k.data(), v.data(), KVC_DTYPE_F32));
}

std::vector<int32_t> positions(kvc_pool *p, uint32_t layer) {
  uint64_t n = 0;
  CHECK_OK(kvc_seq_layer_tokens(p, 1, layer, &n));
  std::vector<int32_t> pos(n);
  CHECK_OK(kvc_gather(p, 1, layer, 0, n, nullptr, nullptr, KVC_DTYPE_F32, pos.data()));
  return pos;
}

kvc_policy *plugin_policy(kvc_plugin *pl, uint64_t budget, uint32_t recent) {
  kvc_policy_config c;
  kvc_policy_config_init(&c);
  c.kind = KVC_POLICY_PLUGIN;
  c.plugin = pl;
  c.budget_tokens = budget;
  c.recent_tokens = recent;
  kvc_policy *pol = nullptr;
  CHECK_OK(kvc_policy_create(&c, &pol));
  return pol;
}

}  // namespace

// The sample loads, names itself, and keeps the lowest key norms plus the
// protected newest tokens; it stays loaded while a policy uses it.
KVTEST(sample_keynorm_evicts) {
  kvc_plugin *pl = nullptr;
  CHECK_OK(kvc_plugin_load(KVC_SAMPLE_PLUGIN, &pl));
  CHECK(pl != nullptr);
  if (!pl) return;
  CHECK(std::string(kvc_plugin_name(pl)) == "keynorm");
  CHECK(kvc_plugin_name(nullptr) == nullptr);
  kvc_policy *pol = plugin_policy(pl, 5, 2);
  kvc_plugin_unload(pl);  // the policy keeps it loaded
  kvc_pool *p = make_pool();
  fill(p);
  uint64_t dropped[2];
  CHECK_OK(kvc_evict(p, 1, pol, dropped));
  CHECK(dropped[0] == 7 && dropped[1] == 7);
  // Recent: 10, 11. Lowest norms among 0..9: 6 (1), 5 and 7 (2).
  CHECK(positions(p, 0) == std::vector<int32_t>({5, 6, 7, 10, 11}));
  CHECK(positions(p, 1) == std::vector<int32_t>({5, 6, 7, 10, 11}));
  CHECK(kvc::api::core_pool(p).check_invariants().empty());
  kvc_policy_destroy(pol);
  kvc_pool_destroy(p);
}

// Broken plugins are refused at load, with the right status.
KVTEST(refused_at_load) {
  struct Case {
    const char *path;
    kvc_status want;
  };
  const Case cases[] = {
      {KVC_BAD1, KVC_ERR_VERSION},           // speaks only ABI 99
      {KVC_BAD2, KVC_ERR_VERSION},           // table claims version 7
      {KVC_BAD3, KVC_ERR_INVALID_ARGUMENT},  // no score function
      {KVC_NO_ENTRY, KVC_ERR_INVALID_ARGUMENT},
      {"/nonexistent/kvc_plugin.so", KVC_ERR_INVALID_ARGUMENT},
  };
  for (const Case &c : cases) {
    kvc_plugin *pl = reinterpret_cast<kvc_plugin *>(0x1);
    CHECK_STATUS(kvc_plugin_load(c.path, &pl), c.want);
    CHECK(pl == reinterpret_cast<kvc_plugin *>(0x1));
    CHECK(std::strlen(kvc_last_error_message()) > 10);
  }
  kvc_plugin *pl = nullptr;
  CHECK_STATUS(kvc_plugin_load(nullptr, &pl), KVC_ERR_NULL_POINTER);
  CHECK_STATUS(kvc_plugin_load(KVC_SAMPLE_PLUGIN, nullptr), KVC_ERR_NULL_POINTER);
  kvc_plugin_unload(nullptr);
}

// A scorer that fails or returns NaN makes the eviction fail; nothing changes.
KVTEST(failing_scorer_changes_nothing) {
  for (const char *path : {KVC_BAD4, KVC_BAD5}) {
    kvc_plugin *pl = nullptr;
    CHECK_OK(kvc_plugin_load(path, &pl));
    if (!pl) continue;
    kvc_policy *pol = plugin_policy(pl, 5, 2);
    kvc_pool *p = make_pool();
    fill(p);
    uint64_t dropped[2] = {9, 9};
    CHECK_STATUS(kvc_evict(p, 1, pol, dropped),
                 path == std::string(KVC_BAD4) ? KVC_ERR_NON_FINITE : KVC_ERR_INVALID_ARGUMENT);
    CHECK(dropped[0] == 9 && dropped[1] == 9);
    CHECK(positions(p, 0).size() == 12 && positions(p, 1).size() == 12);
    CHECK(kvc::api::core_pool(p).check_invariants().empty());
    kvc_policy_destroy(pol);
    kvc_plugin_unload(pl);
    kvc_pool_destroy(p);
  }
  // A plugin set on another kind of policy is refused.
  kvc_plugin *pl = nullptr;
  CHECK_OK(kvc_plugin_load(KVC_SAMPLE_PLUGIN, &pl));
  kvc_policy_config c;
  kvc_policy_config_init(&c);
  c.kind = KVC_POLICY_H2O;
  c.plugin = pl;
  kvc_policy *pol = nullptr;
  CHECK_STATUS(kvc_policy_create(&c, &pol), KVC_ERR_INVALID_ARGUMENT);
  kvc_plugin_unload(pl);
}

int main(int argc, char **argv) { return kvtest_main(argc, argv); }
