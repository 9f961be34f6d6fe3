// DuoAttention (KVC_POLICY_DUO_ATTENTION, arXiv 2410.10819) on head-wise
// pools: retrieval heads keep every token, streaming heads their sinks and
// newest window, freeing their blocks; under auto_evict at every reserve, with
// chunks larger than the window keeping the sinks; bad gate patterns refused
// without change.
#include <numeric>
#include <vector>

#include "headwise_util.h"

using namespace headwise_util;
using evict_util::Geo;

namespace {
kvc_policy *duo_policy(const std::vector<float> &gates, uint32_t sinks, uint32_t recent,
                       bool auto_evict = false, kvc_status want = KVC_OK) {
  kvc_policy_config c;
  kvc_policy_config_init(&c);
  c.kind = KVC_POLICY_DUO_ATTENTION;
  c.head_gates = gates.data();
  c.num_head_gates = static_cast<uint32_t>(gates.size());
  c.sink_tokens = sinks;
  c.recent_tokens = recent;
  c.auto_evict = auto_evict ? 1 : 0;
  kvc_policy *pol = nullptr;
  CHECK_STATUS(kvc_policy_create(&c, &pol), want);
  return pol;
}
std::vector<int32_t> sinks_and_recent(uint64_t n, uint32_t sinks, uint32_t recent) {
  std::vector<int32_t> k;
  for (uint64_t t = 0; t < n; ++t)
    if (t < sinks || t + recent >= n) k.push_back(static_cast<int32_t>(t));
  return k;
}
}  // namespace

// DuoAttention: heads whose gate is below the threshold keep the sinks and
// the newest window, the others every token; the streaming heads' blocks are
// freed (their count is ceil((S + W) / block_size)).
KVTEST(duo_exact_kept_sets) {
  Geo g;
  g.layers = 2, g.hq = 4, g.hkv = 2, g.hd = 8, g.bs = 4;
  kvc_pool *p = make(g, true);
  const uint64_t n = 30;
  fill(p, g, 1, n);
  const std::vector<float> gates = {0.9f, 0.1f, 0.2f, 0.5f};  // (0,0) (0,1) (1,0) (1,1)
  kvc_policy *pol = duo_policy(gates, 2, 5);
  std::vector<uint64_t> dropped(g.layers);
  CHECK_OK(kvc_evict(p, 1, pol, dropped.data()));
  std::vector<int32_t> all(n);
  std::iota(all.begin(), all.end(), 0);
  const std::vector<int32_t> stream = sinks_and_recent(n, 2, 5);
  CHECK(head_positions(p, 1, 0, 0) == all);
  CHECK(head_positions(p, 1, 0, 1) == stream);
  CHECK(head_positions(p, 1, 1, 0) == stream);
  CHECK(head_positions(p, 1, 1, 1) == all);  // 0.5 is not below the threshold
  CHECK(dropped[0] == n - 7 && dropped[1] == n - 7);
  size_t nb = 0;
  CHECK_OK(kvc_seq_head_block_table(p, 1, 0, 1, nullptr, 0, &nb));
  CHECK(nb == 2);
  kvc_policy_destroy(pol);
  kvc_pool_destroy(p);
}

// Attached with auto_evict, decoding token by token: every reserve trims the
// streaming heads to sinks + window and leaves the retrieval heads whole;
// decode attention equals a float64 softmax over each head's own tokens.
KVTEST(duo_auto_evict_decode) {
  Geo g;
  g.layers = 1, g.hq = 4, g.hkv = 2, g.hd = 8, g.bs = 4;
  kvc_pool *p = make(g, true, nullptr, 64);
  const std::vector<float> gates = {1.0f, 0.0f};
  kvc_policy *pol = duo_policy(gates, 3, 6, true);
  CHECK_OK(kvc_seq_create(p, 1));
  CHECK_OK(kvc_seq_set_policy(p, 1, pol));
  Data d{evict_util::randn(g_rng, 50 * g.hkv * g.hd), evict_util::randn(g_rng, 50 * g.hkv * g.hd)};
  kvc_attention_params a;
  kvc_attention_params_init(&a);
  a.num_q_heads = g.hq;
  const uint64_t id = 1;
  for (uint64_t t = 0; t < 50; ++t) {
    CHECK_OK(kvc_seq_reserve(p, 1, 1, nullptr));
    CHECK_OK(kvc_append(p, 1, 0, t, 1, &d.k[t * g.hkv * g.hd], &d.v[t * g.hkv * g.hd],
                        KVC_DTYPE_F32));
    std::vector<int32_t> all(t + 1);
    std::iota(all.begin(), all.end(), 0);
    const std::vector<int32_t> stream = sinks_and_recent(t + 1, 3, 6);
    CHECKF(head_positions(p, 1, 0, 0) == all, "token %llu", (unsigned long long)t);
    CHECKF(head_positions(p, 1, 0, 1) == stream, "token %llu", (unsigned long long)t);
    if (t % 7 == 6) {
      const std::vector<float> q = evict_util::randn(g_rng, g.hq * g.hd);
      std::vector<float> out(g.hq * g.hd);
      CHECK_OK(kvc_attention_decode(p, 0, &id, 1, q.data(), out.data(), nullptr, &a));
      const std::vector<double> want = masked_attention(g, q, d, {all, stream});
      double worst = 0.0;
      for (size_t i = 0; i < out.size(); ++i) worst = std::max(worst, std::fabs(out[i] - want[i]));
      CHECKF(worst < 1e-5, "token %llu: largest difference %g", (unsigned long long)t, worst);
    }
  }
  kvc_policy_destroy(pol);
  kvc_pool_destroy(p);
}

// A reservation of more tokens than a streaming head's sinks + window (a
// prompt chunk after some decoding): the head keeps its attention sinks, then
// the chunk; the retrieval head keeps everything. Token-wise StreamingLLM
// under auto_evict keeps its sinks the same way.
KVTEST(duo_chunk_larger_than_window_keeps_sinks) {
  Geo g;
  g.layers = 1, g.hq = 4, g.hkv = 2, g.hd = 8, g.bs = 4;
  kvc_pool *p = make(g, true, nullptr, 64);
  kvc_policy *pol = duo_policy({1.0f, 0.0f}, 2, 4, true);
  CHECK_OK(kvc_seq_create(p, 1));
  CHECK_OK(kvc_seq_set_policy(p, 1, pol));
  const Data d{evict_util::randn(g_rng, 20 * g.hkv * g.hd),
               evict_util::randn(g_rng, 20 * g.hkv * g.hd)};
  CHECK_OK(kvc_seq_reserve(p, 1, 10, nullptr));  // 10 > 2 + 4 at once: nothing to trim yet
  CHECK_OK(kvc_append(p, 1, 0, 0, 10, d.k.data(), d.v.data(), KVC_DTYPE_F32));
  CHECK_OK(kvc_seq_reserve(p, 1, 8, nullptr));  // a chunk of 8 >= the window
  CHECK_OK(kvc_append(p, 1, 0, 10, 8, &d.k[10 * g.hkv * g.hd], &d.v[10 * g.hkv * g.hd],
                      KVC_DTYPE_F32));
  std::vector<int32_t> all(18), stream = {0, 1};
  std::iota(all.begin(), all.end(), 0);
  for (int32_t t = 10; t < 18; ++t) stream.push_back(t);
  CHECK(head_positions(p, 1, 0, 0) == all);
  CHECK(head_positions(p, 1, 0, 1) == stream);
  CHECK_OK(kvc_seq_reserve(p, 1, 1, nullptr));  // then one token: sinks + the newest 3 + it
  CHECK(head_positions(p, 1, 0, 1) == std::vector<int32_t>({0, 1, 15, 16, 17, 18}));
  kvc_policy_destroy(pol);
  kvc_pool_destroy(p);

  kvc_pool *tw = make(g, false, nullptr, 64);  // token-wise StreamingLLM, cap 6 with 2 sinks
  kvc_policy_config c;
  kvc_policy_config_init(&c);
  c.kind = KVC_POLICY_STREAMING;
  c.sink_tokens = 2;
  c.budget_tokens = 6;
  c.auto_evict = 1;
  kvc_policy *st = nullptr;
  CHECK_OK(kvc_policy_create(&c, &st));
  CHECK_OK(kvc_seq_create(tw, 1));
  CHECK_OK(kvc_seq_set_policy(tw, 1, st));
  CHECK_OK(kvc_seq_reserve(tw, 1, 5, nullptr));
  CHECK_OK(kvc_append(tw, 1, 0, 0, 5, d.k.data(), d.v.data(), KVC_DTYPE_F32));
  CHECK_OK(kvc_seq_reserve(tw, 1, 7, nullptr));  // 7 > the cap of 6
  uint64_t held = 0;
  CHECK_OK(kvc_seq_layer_tokens(tw, 1, 0, &held));
  CHECK(held == 9);  // the 2 sinks and the 7 reserved
  const std::vector<int32_t> pos = head_positions(tw, 1, 0, 0);
  CHECK(pos.size() == 9 && pos[0] == 0 && pos[1] == 1 && pos[2] == 5);
  kvc_policy_destroy(st);
  kvc_pool_destroy(tw);
}

// Bad patterns are refused, with nothing changed: a gate count that is not
// layers x KV heads (attach and evict), gates outside [0, 1] or NaN, no window,
// gates on another kind, a NULL array, a token-wise pool of several KV heads.
KVTEST(duo_bad_patterns) {
  Geo g;
  g.layers = 2, g.hq = 4, g.hkv = 2, g.hd = 8, g.bs = 4;
  kvc_pool *p = make(g, true);
  fill(p, g, 1, 12);
  const uint64_t before = in_use(p);
  const std::vector<float> three = {0.0f, 1.0f, 0.0f};
  kvc_policy *pol = duo_policy(three, 2, 2);
  CHECK_STATUS(kvc_seq_set_policy(p, 1, pol), KVC_ERR_INVALID_ARGUMENT);
  CHECK_STATUS(kvc_evict(p, 1, pol, nullptr), KVC_ERR_INVALID_ARGUMENT);
  kvc_policy_destroy(pol);
  for (uint32_t l = 0; l < g.layers; ++l)
    for (uint32_t h = 0; h < g.hkv; ++h) CHECK(head_positions(p, 1, l, h).size() == 12);
  CHECK(in_use(p) == before);
  const std::vector<float> four = {0.0f, 1.0f, 0.0f, 1.0f};
  for (float bad : {-0.1f, 1.5f, std::nanf("")}) {
    std::vector<float> gb = four;
    gb[2] = bad;
    CHECK(duo_policy(gb, 2, 2, false, KVC_ERR_INVALID_ARGUMENT) == nullptr);
  }
  CHECK(duo_policy(four, 2, 0, false, KVC_ERR_INVALID_ARGUMENT) == nullptr);  // no window
  kvc_policy_config c;
  kvc_policy_config_init(&c);
  c.kind = KVC_POLICY_DUO_ATTENTION;
  c.recent_tokens = 4;
  kvc_policy *none = nullptr;
  CHECK_STATUS(kvc_policy_create(&c, &none), KVC_ERR_INVALID_ARGUMENT);  // no gates
  c.num_head_gates = 4;
  CHECK_STATUS(kvc_policy_create(&c, &none), KVC_ERR_NULL_POINTER);
  c.kind = KVC_POLICY_TOVA;
  c.head_gates = four.data();
  c.budget_tokens = 4;
  CHECK_STATUS(kvc_policy_create(&c, &none), KVC_ERR_INVALID_ARGUMENT);  // gates on TOVA
  c.kind = KVC_POLICY_DUO_ATTENTION;
  c.gate_threshold = 2.0f;
  CHECK_STATUS(kvc_policy_create(&c, &none), KVC_ERR_INVALID_ARGUMENT);
  CHECK(none == nullptr);
  kvc_pool *tw = make(g, false);
  fill(tw, g, 1, 12);
  kvc_policy *ok4 = duo_policy(four, 2, 2);
  CHECK_STATUS(kvc_seq_set_policy(tw, 1, ok4), KVC_ERR_UNSUPPORTED);
  CHECK_STATUS(kvc_evict(tw, 1, ok4, nullptr), KVC_ERR_UNSUPPORTED);
  uint64_t n = 0;
  CHECK_OK(kvc_seq_layer_tokens(tw, 1, 0, &n));
  CHECK(n == 12);
  CHECK_OK(kvc_evict(p, 1, ok4, nullptr));  // the same policy fits the head-wise pool
  CHECK(head_positions(p, 1, 0, 0).size() == 4 && head_positions(p, 1, 0, 1).size() == 12);
  kvc_policy_destroy(ok4);
  kvc_pool_destroy(tw);
  kvc_pool_destroy(p);
}


int main(int argc, char **argv) {
  return kvtest_main(argc, argv);
}
