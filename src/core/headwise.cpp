// Head-wise pools (KVC_POOL_HEADWISE): each (layer, KV head) is a table of
// its own, with its own block table, token count, positions and scores, so a
// head that keeps 20 % of the tokens holds 20 % of the blocks. validate_config
// stores them as num_layers x num_kv_heads layers of one KV head (and its
// group of query heads); everything per table (reserve, eviction, fork,
// copy-on-write, records, the prefix cache, tiers) then works unchanged. This
// unit holds the caller's view: the per-head reads, the per-layer reads that
// apply while a layer's heads agree, and the caller's configuration.
#include <algorithm>
#include <cstring>
#include <limits>
#include <mutex>
#include <shared_mutex>
#include <vector>

#include "common/error.h"
#include "core/pool.h"

namespace kvc::core {

void PoolCore::check_caller_layer(uint32_t layer) const {
  if (layer >= num_layers())
    fail(Errc::OutOfRange,
         "layer " + u64s(layer) + ": the pool has " + u64s(num_layers()) + " layers");
}

std::string PoolCore::table_name(uint32_t t) const {
  if (!headwise()) return "layer " + u64s(t);
  return "layer " + u64s(t / heads()) + " head " + u64s(t % heads());
}

uint32_t PoolCore::head_table(uint32_t layer, uint32_t head) const {
  check_caller_layer(layer);
  const uint32_t kvh = headwise() ? heads() : cfg_.num_kv_heads;
  if (head >= kvh)
    fail(Errc::OutOfRange, "head " + u64s(head) + ": the pool has " + u64s(kvh) + " KV heads");
  return headwise() ? layer * heads() + head : layer;
}

void PoolCore::check_heads_agree(const Sequence &s, uint32_t layer, const char *what) const {
  const uint32_t H = heads();
  const LayerTable &a = s.layers[static_cast<size_t>(layer) * H];
  for (uint32_t h = 1; h < H; ++h) {
    const LayerTable &b = s.layers[static_cast<size_t>(layer) * H + h];
    if (b.n_tokens != a.n_tokens || b.tail_index != a.tail_index || b.tail_pos != a.tail_pos ||
        b.rope_by_index != a.rope_by_index || b.positions != a.positions)
      fail(Errc::Unsupported,
           std::string(what) + ": the KV heads of layer " + u64s(layer) +
               " hold different tokens after a head-wise eviction (head 0: " + u64s(a.n_tokens) +
               ", head " + u64s(h) + ": " + u64s(b.n_tokens) + "); read them one head at a time");
  }
}

PoolConfig Pool::caller_config() const {
  PoolConfig c = cfg_;
  if (!cfg_.headwise_heads) return c;
  c.num_kv_heads = cfg_.headwise_heads;
  c.num_q_heads = cfg_.num_q_heads * cfg_.headwise_heads;
  c.num_layers = cfg_.num_layers / cfg_.headwise_heads;
  c.headwise_heads = 0;
  return c;
}

uint64_t Pool::seq_head_tokens(uint64_t id, uint32_t layer, uint32_t head) const {
  std::shared_lock lk(mu_);
  const Sequence &s = find(id);
  return s.layers[head_table(layer, head)].n_tokens;
}

// A head-wise layer read as [n][H][D] rows: each head's table into a
// temporary, interleaved (the heads agree: same tokens, same positions).
void Pool::gather_heads(const Sequence &s, uint32_t layer, uint64_t first, uint64_t n, void *k_out,
                        void *v_out, DType dst, int32_t *positions_out) const {
  const uint32_t H = heads();
  check_heads_agree(s, layer, "kvc_gather");
  const LayerTable &l0 = s.layers[static_cast<size_t>(layer) * H];
  if (first > l0.n_tokens || n > l0.n_tokens - first)
    fail(Errc::OutOfRange, u64s(n) + " tokens from index " + u64s(first) + " are beyond the " +
                               u64s(l0.n_tokens) + " tokens of layer " + u64s(layer));
  const uint64_t rb = cfg_.head_dim * static_cast<uint64_t>(bits_of(dst)) / 8;  // one head's row
  std::vector<uint8_t> tk(k_out ? n * rb : 0), tv(v_out ? n * rb : 0);
  for (uint32_t h = 0; h < H; ++h) {
    const uint32_t t = layer * H + h;
    store_->read(t, s.layers[t], first, n, k_out ? tk.data() : nullptr, v_out ? tv.data() : nullptr,
                 dst);
    for (uint64_t i = 0; i < n; ++i) {
      if (k_out) std::memcpy(static_cast<uint8_t *>(k_out) + (i * H + h) * rb, &tk[i * rb], rb);
      if (v_out) std::memcpy(static_cast<uint8_t *>(v_out) + (i * H + h) * rb, &tv[i * rb], rb);
    }
  }
  if (positions_out)
    for (uint64_t i = 0; i < n; ++i)
      positions_out[i] = static_cast<int32_t>(l0.position_of(first + i));
}

void Pool::gather_head(uint64_t id, uint32_t layer, uint32_t head, uint64_t first, uint64_t n,
                       void *k_out, void *v_out, DType dst, int32_t *positions_out) const {
  std::shared_lock lk(mu_);
  const Sequence &s = find(id);
  const uint32_t t = head_table(layer, head);
  const LayerTable &l = s.layers[t];
  if (first > l.n_tokens || n > l.n_tokens - first)
    fail(Errc::OutOfRange, u64s(n) + " tokens from index " + u64s(first) + " are beyond the " +
                               u64s(l.n_tokens) + " tokens of layer " + u64s(layer) + " head " +
                               u64s(head));
  if (headwise() || cfg_.num_kv_heads == 1) {  // the table holds this head alone
    store_->read(t, l, first, n, k_out, v_out, dst);
  } else {  // a token-wise layer: its rows, then the head's part of each
    const uint64_t rb = cfg_.head_dim * static_cast<uint64_t>(bits_of(dst)) / 8;
    const uint64_t row = rb * cfg_.num_kv_heads;
    std::vector<uint8_t> tk(k_out ? n * row : 0), tv(v_out ? n * row : 0);
    store_->read(t, l, first, n, k_out ? tk.data() : nullptr, v_out ? tv.data() : nullptr, dst);
    for (uint64_t i = 0; i < n; ++i) {
      if (k_out) std::memcpy(static_cast<uint8_t *>(k_out) + i * rb, &tk[i * row + head * rb], rb);
      if (v_out) std::memcpy(static_cast<uint8_t *>(v_out) + i * rb, &tv[i * row + head * rb], rb);
    }
  }
  if (positions_out)
    for (uint64_t i = 0; i < n; ++i)
      positions_out[i] = static_cast<int32_t>(l.position_of(first + i));
}

size_t Pool::head_block_table(uint64_t id, uint32_t layer, uint32_t head, int32_t *out,
                              size_t capacity) const {
  std::shared_lock lk(mu_);
  const Sequence &s = find(id);
  const auto &b = s.layers[head_table(layer, head)].blocks;
  if (out && b.size() <= capacity) std::copy(b.begin(), b.end(), out);
  return b.size();
}

size_t Pool::export_head_page_table(uint32_t layer, const uint64_t *seq_ids, size_t n_seqs,
                                    int32_t *indptr, int32_t *indices, size_t capacity,
                                    int32_t *last_page_len) const {
  std::shared_lock lk(mu_);
  if (!headwise())
    fail(Errc::Unsupported,
         "kvc_export_head_page_table: a token-wise pool's blocks hold every KV head of a layer "
         "(use kvc_export_page_table, or create the pool with KVC_POOL_HEADWISE)");
  check_caller_layer(layer);
  const uint32_t H = heads();
  if (n_seqs > static_cast<size_t>(std::numeric_limits<int32_t>::max()) / H)
    fail(Errc::Overflow, u64s(n_seqs) + " sequences x " + u64s(H) + " heads exceed int32 rows");
  std::vector<const LayerTable *> rows;
  rows.reserve(n_seqs * H);
  for (size_t i = 0; i < n_seqs; ++i) {
    const Sequence &s = find(seq_ids[i]);
    for (uint32_t h = 0; h < H; ++h) rows.push_back(&s.layers[layer * H + h]);
  }
  return page_table(rows, indptr, indices, capacity, last_page_len);
}

}  // namespace kvc::core
