// kvc_attention_decode / kvc_attention_prefill: the checks every store
// shares; the store runs it (store_cpu.cpp: the attention module over tiles
// of the blocks; store_cuda.cpp: the paged kernels).
#include <cmath>
#include <mutex>
#include <shared_mutex>

#include "common/error.h"
#include "core/pool.h"

namespace kvc::core {

void Pool::attention(uint32_t layer, const uint64_t *ids, size_t n_seqs, const void *q,
                     uint64_t n_q, bool prefill, void *out, float *lse, const AttnParams &p) {
  const uint64_t hd = cfg_.head_dim;
  if (p.num_q_heads == 0 || p.num_q_heads % cfg_.num_kv_heads != 0)
    fail(Errc::InvalidArgument, "num_q_heads " + u64s(p.num_q_heads) +
                                    " must be a non-zero multiple of num_kv_heads " +
                                    u64s(cfg_.num_kv_heads));
  if (p.num_q_heads != cfg_.num_q_heads)
    fail(Errc::InvalidArgument, "num_q_heads " + u64s(p.num_q_heads) + " differs from the pool's " +
                                    u64s(cfg_.num_q_heads));
  if (!(p.scale >= 0.0f) || !std::isfinite(p.scale))
    fail(Errc::InvalidArgument, "scale must be finite and >= 0 (0: 1/sqrt(head_dim))");
  if (p.observe > 2) fail(Errc::InvalidArgument, "unknown observe mode " + u64s(p.observe));
  if (p.num_threads > 256)
    fail(Errc::InvalidArgument, "num_threads " + u64s(p.num_threads) + ": at most 256");
  if (prefill && n_seqs != 1) fail(Errc::InvalidArgument, "prefill attention takes one sequence");
  const uint64_t per_seq = n_q * p.num_q_heads * hd;
  if (n_q > (uint64_t(1) << 31) || (n_seqs && per_seq > (uint64_t(1) << 40) / n_seqs))
    fail(Errc::Overflow, "query shape too large");
  const float scale = p.scale > 0.0f ? p.scale : 1.0f / std::sqrt(static_cast<float>(hd));
  if (prefill) {  // the range before any allocation sized by n_q
    std::shared_lock lk(mu_);
    check_layer(layer);
    const LayerTable &l = find(ids[0]).layers[layer];
    if (n_q > l.n_tokens)
      fail(Errc::OutOfRange, u64s(n_q) + " prefill queries but layer " + u64s(layer) +
                                 " of sequence " + u64s(ids[0]) + " holds " + u64s(l.n_tokens) +
                                 " tokens (append the chunk's K/V first)");
  }
  store_->attention(layer, ids, n_seqs, q, n_q, prefill, out, lse, p, scale);
}

}  // namespace kvc::core
