// Attention over the cache and the scores it observes.
#include <cstddef>
#include <cstring>
#include <string>
#include <vector>

#include "api/api_int.h"

using namespace kvc::api;

namespace {

constexpr size_t kAttnParamsMin = offsetof(kvc_attention_params, observe_from) + sizeof(uint64_t);

void attn_defaults(kvc_attention_params *p) {
  std::memset(p, 0, sizeof *p);
  p->struct_size = sizeof *p;
  p->q_dtype = KVC_DTYPE_F32;
  p->out_dtype = KVC_DTYPE_F32;
  p->observe = KVC_OBSERVE_NONE;
}

kvc::core::AttnParams to_attn(const kvc_attention_params *in) {
  need(in, "params");
  kvc_attention_params c;
  attn_defaults(&c);
  kvc::api::read_input_struct(in, kAttnParamsMin, "kvc_attention_params", &c);
  kvc::core::AttnParams a;
  a.num_q_heads = c.num_q_heads;
  a.scale = c.scale;
  a.q_dtype = dtype_arg(c.q_dtype, "q_dtype");
  a.out_dtype = dtype_arg(c.out_dtype, "out_dtype");
  const int32_t ob = static_cast<int32_t>(c.observe);
  if (ob < 0 || ob > 4)
    fail(Errc::InvalidArgument,
         "observe " + std::to_string(ob) +
             ": unknown mode (KVC_OBSERVE_NONE, _ACCUMULATE, _REPLACE, _QUERIES, _MAX)");
  if (c.num_threads > 256)
    fail(Errc::InvalidArgument, "num_threads " + std::to_string(c.num_threads) + ": at most 256");
  const int32_t qq = static_cast<int32_t>(c.query_quant);
  if (qq < 0 || qq > 2)
    fail(Errc::InvalidArgument, "query_quant " + std::to_string(qq) +
                                    ": unknown (KVC_QUERY_EXACT, KVC_QUERY_INT8, "
                                    "KVC_QUERY_INT8_VALUES)");
  a.observe = static_cast<uint32_t>(ob);
  a.observe_from = c.observe_from;
  a.num_threads = c.num_threads;
  a.query_int8 = qq == KVC_QUERY_INT8 || qq == KVC_QUERY_INT8_VALUES;
  a.int_values = qq == KVC_QUERY_INT8_VALUES;
  return a;
}

}  // namespace

extern "C" {

KVC_API kvc_status(kvc_attention_params_init)(kvc_attention_params *params) {
  return kvc_attention_params_init_sized(params, kvc::api::size_0_3<kvc_attention_params>);
}

KVC_API kvc_status kvc_attention_params_init_sized(kvc_attention_params *params,
                                                   size_t struct_size) {
  return guard([&] {
    need(params, "params");
    kvc_attention_params d;
    attn_defaults(&d);
    kvc::api::init_sized(params, struct_size, kAttnParamsMin, d);
  });
}

KVC_API kvc_status kvc_attention_decode(kvc_pool *pool, uint32_t layer, const uint64_t *seq_ids,
                                        size_t n_seqs, const void *q, void *out, float *lse,
                                        const kvc_attention_params *params) {
  return guard([&] {
    auto &p = core_of(pool);
    need(seq_ids, "seq_ids");
    need(q, "q");
    need(out, "out");
    const kvc::core::AttnParams a = to_attn(params);
    if (n_seqs == 0) fail(Errc::InvalidArgument, "n_seqs 0: pass at least one sequence");
    p.attention(layer, seq_ids, n_seqs, q, 1, false, out, lse, a);
  });
}

KVC_API kvc_status kvc_attention_prefill(kvc_pool *pool, uint32_t layer, uint64_t seq_id,
                                         const void *q, uint64_t n_q, void *out, float *lse,
                                         const kvc_attention_params *params) {
  return guard([&] {
    auto &p = core_of(pool);
    need(q, "q");
    need(out, "out");
    const kvc::core::AttnParams a = to_attn(params);
    if (n_q == 0) fail(Errc::InvalidArgument, "n_q 0: pass at least one query row");
    p.attention(layer, &seq_id, 1, q, n_q, true, out, lse, a);
  });
}

KVC_API kvc_status kvc_seq_observe_scores(kvc_pool *pool, uint64_t seq_id, uint32_t layer,
                                          const float *scores, uint64_t n_tokens, int accumulate) {
  return guard([&] {
    auto &p = core_of(pool);
    need(scores, "scores");
    p.observe_scores(seq_id, layer, scores, n_tokens, accumulate != 0);
  });
}

KVC_API kvc_status kvc_seq_observe_queries(kvc_pool *pool, uint64_t seq_id, uint32_t layer,
                                           const void *q, kvc_dtype q_dtype, uint64_t n,
                                           uint32_t num_q_heads, const int32_t *positions) {
  return guard([&] {
    auto &p = core_of(pool);
    const DType dt = dtype_arg(q_dtype, "q_dtype");
    if (n == 0) {  // nothing to add; the arguments are still checked
      p.observe_queries(seq_id, layer, nullptr, dt, 0, num_q_heads, nullptr);
      return;
    }
    need(q, "q");
    need(positions, "positions");
    p.observe_queries(seq_id, layer, q, dt, n, num_q_heads, positions);
  });
}

KVC_API kvc_status kvc_seq_scores(kvc_pool *pool, uint64_t seq_id, uint32_t layer, float *out,
                                  uint64_t n_tokens) {
  return guard([&] {
    auto &p = core_of(pool);
    need(out, "out");
    p.read_scores(seq_id, layer, out, n_tokens);
  });
}

KVC_API kvc_status kvc_seq_rope_positions(kvc_pool *pool, uint64_t seq_id, uint32_t layer,
                                          uint64_t pos, uint64_t n, int32_t *out) {
  return guard([&] {
    auto &p = core_of(pool);
    if (n) need(out, "out");
    p.rope_positions(seq_id, layer, pos, n, out);
  });
}

}  // extern "C"
