// kvc_attention_decode / kvc_attention_prefill: the checks every store
// shares; the store runs it (store_cpu.cpp: the attention module over tiles
// of the blocks; store_cuda.cpp: the paged kernels).
#include <algorithm>
#include <cmath>
#include <cstring>
#include <mutex>
#include <shared_mutex>
#include <vector>

#include "common/error.h"
#include "core/pool.h"

namespace kvc::core {

void Pool::attention(uint32_t layer, const uint64_t *ids, size_t n_seqs, const void *q,
                     uint64_t n_q, bool prefill, void *out, float *lse, const AttnParams &p) {
  const uint64_t hd = cfg_.head_dim;
  // The caller's heads (a head-wise pool stores a layer's KV heads as tables
  // of one KV head and its group of query heads).
  const uint32_t H = heads(), kv_heads = H > 1 ? H : cfg_.num_kv_heads,
                 q_heads = cfg_.num_q_heads * H;
  if (p.num_q_heads == 0 || p.num_q_heads % kv_heads != 0)
    fail(Errc::InvalidArgument, "num_q_heads " + u64s(p.num_q_heads) +
                                    " must be a non-zero multiple of num_kv_heads " +
                                    u64s(kv_heads));
  if (p.num_q_heads != q_heads)
    fail(Errc::InvalidArgument,
         "num_q_heads " + u64s(p.num_q_heads) + " differs from the pool's " + u64s(q_heads));
  // A head-wise pool's tables are layer x H + h: the caller's layer first.
  if (H > 1) check_caller_layer(layer);
  if (!(p.scale >= 0.0f) || !std::isfinite(p.scale))
    fail(Errc::InvalidArgument, "scale must be finite and >= 0 (0: 1/sqrt(head_dim))");
  if (p.observe > 4) fail(Errc::InvalidArgument, "unknown observe mode " + u64s(p.observe));
  const bool queries = p.observe == 3;  // KVC_OBSERVE_QUERIES: statistics, not scores
  if (queries && cfg_.device == Device::CUDA)
    fail(Errc::Unsupported,
         "KVC_OBSERVE_QUERIES reads the queries on the host: on a CUDA pool pass host copies to "
         "kvc_seq_observe_queries()");
  if (p.num_threads > 256)
    fail(Errc::InvalidArgument, "num_threads " + u64s(p.num_threads) + ": at most 256");
  if (prefill && n_seqs != 1) fail(Errc::InvalidArgument, "prefill attention takes one sequence");
  const uint64_t per_seq = n_q * p.num_q_heads * hd;
  if (n_q > (uint64_t(1) << 31) || (n_seqs && per_seq > (uint64_t(1) << 40) / n_seqs))
    fail(Errc::Overflow, "query shape too large");
  const float scale = p.scale > 0.0f ? p.scale : 1.0f / std::sqrt(static_cast<float>(hd));
  if (prefill) {  // the range before any allocation sized by n_q
    std::shared_lock lk(mu_);
    check_caller_layer(layer);
    const Sequence &s = find(ids[0]);
    for (uint32_t h = 0; h < H; ++h) {
      const LayerTable &l = s.layers[static_cast<size_t>(layer) * H + h];
      if (n_q > l.n_tokens)
        fail(Errc::OutOfRange, u64s(n_q) + " prefill queries but layer " + u64s(layer) +
                                   " of sequence " + u64s(ids[0]) + " holds " + u64s(l.n_tokens) +
                                   " tokens (append the chunk's K/V first)");
    }
  }
  if (!queries) {
    store_->attention(layer, ids, n_seqs, q, n_q, prefill, out, lse, p, scale);
    return;
  }
  // The RoPE positions of the observed rows: prefill row i is the table's
  // token n - n_q + i; a decode query is its sequence's newest token. Each
  // table (a head-wise pool's heads) gets the statistics of its query heads.
  check_caller_layer(layer);
  std::vector<std::vector<int32_t>> pos(n_seqs * H);
  {
    std::shared_lock lk(mu_);
    for (size_t i = 0; i < n_seqs; ++i)
      for (uint32_t h = 0; h < H; ++h) {
        const LayerTable &l = find(ids[i]).layers[static_cast<size_t>(layer) * H + h];
        if (l.n_tokens == 0 || (prefill && n_q > l.n_tokens))
          fail(Errc::OutOfRange, "layer " + u64s(layer) + " of sequence " + u64s(ids[i]) +
                                     " holds " + u64s(l.n_tokens) + " tokens for " + u64s(n_q) +
                                     " query rows");
        const uint64_t first = prefill ? std::min(p.observe_from, n_q) : 0,
                       rows = prefill ? n_q : 1;
        for (uint64_t r = first; r < rows; ++r)
          pos[i * H + h].push_back(static_cast<int32_t>(
              l.rope_position_of(prefill ? l.n_tokens - n_q + r : l.n_tokens - 1)));
      }
  }
  // The rows' statistics first (their checks fail before anything runs),
  // merged into every sequence at once after the attention.
  const uint64_t eb = static_cast<uint64_t>(bits_of(p.q_dtype)) / 8;
  const uint64_t row_bytes = p.num_q_heads * hd * eb, group = cfg_.num_q_heads;
  std::vector<policy::QueryStats> stats(n_seqs * H);
  std::vector<uint8_t> part;  // one head's query heads of the rows (head-wise pools)
  for (size_t i = 0; i < n_seqs; ++i)
    for (uint32_t h = 0; h < H; ++h) {
      const std::vector<int32_t> &ps = pos[i * H + h];
      const uint64_t first = prefill ? n_q - ps.size() : 0;
      const auto *rows = static_cast<const uint8_t *>(q) + (i * n_q + first) * row_bytes;
      if (H > 1) {
        const uint64_t gb = group * hd * eb;
        part.resize(ps.size() * gb);
        for (uint64_t r = 0; r < ps.size(); ++r)
          std::memcpy(&part[r * gb], rows + r * row_bytes + h * gb, gb);
        rows = part.data();
      }
      stats[i * H + h] =
          query_stats(rows, p.q_dtype, ps.size(), static_cast<uint32_t>(group), ps.data());
    }
  AttnParams plain = p;
  plain.observe = 0;
  store_->attention(layer, ids, n_seqs, q, n_q, prefill, out, lse, plain, scale);
  std::vector<policy::QueryStats> one(n_seqs);
  for (uint32_t h = 0; h < H; ++h) {
    for (size_t i = 0; i < n_seqs; ++i) one[i] = std::move(stats[i * H + h]);
    merge_query_stats(layer * H + h, ids, one.data(), n_seqs);
  }
}

}  // namespace kvc::core
