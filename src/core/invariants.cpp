// The pool's invariants, for tests and fuzzing (Pool::check_invariants):
// block states and reference counts against the block tables, token counts,
// residual and sink tables, positions and scores, the prefix index.
#include <mutex>
#include <shared_mutex>

#include "core/offload.h"
#include "core/pool.h"
#include "core/prefix_cache.h"

namespace kvc::core {

namespace {
std::string check_sequence(const PoolCore &c, uint64_t id, const Sequence &s,
                           std::vector<uint64_t> &refs, std::vector<uint64_t> &res_refs) {
  const BlockDiv bs = block_div(c.cfg_.block_size);
  if (s.layers.size() != c.cfg_.num_layers)
    return "sequence " + u64s(id) + " has wrong layer count";
  if (!s.sink_blocks.empty() && s.sink_blocks.size() != c.stage_.sink_blocks_needed())
    return "sequence " + u64s(id) + ": wrong number of attention-sink blocks";
  for (int32_t b : s.sink_blocks) {
    if (b < 0 || static_cast<uint64_t>(b) >= res_refs.size())
      return "sequence " + u64s(id) + ": invalid sink block id";
    ++res_refs[b];
  }
  for (uint32_t li = 0; li < s.layers.size(); ++li) {
    const int32_t want =
        s.sink_blocks.empty() ? -1 : s.sink_blocks[li / c.stage_.layers_per_sink_block()];
    if (s.layers[li].sink_block != want)
      return "sequence " + u64s(id) + ": a layer's sink block is not its sequence's";
  }
  for (uint32_t li = 0; li < s.layers.size(); ++li) {
    const LayerTable &l = s.layers[li];
    if (l.n_lp > l.n_tokens || (!c.stage_.active && l.n_lp != l.n_tokens))
      return "sequence " + u64s(id) + ": codec token count above the layer's tokens";
    if (l.blocks.size() != (l.n_lp + bs - 1) / bs)
      return "sequence " + u64s(id) + ": block table size disagrees with token count";
    const uint64_t hp = l.n_tokens - l.n_lp;
    if (hp == 0 ? (!l.res_blocks.empty() || l.res_off != 0)
                : (l.res_off >= bs || l.res_blocks.size() != (l.res_off + hp + bs - 1) / bs))
      return "sequence " + u64s(id) + ": residual block table disagrees with its token count";
    if (l.n_lp % c.stage_.unit != 0)
      return "sequence " + u64s(id) + ": per-channel groups not whole";
    for (int32_t b : l.res_blocks) {
      if (b < 0 || static_cast<uint64_t>(b) >= res_refs.size())
        return "sequence " + u64s(id) + ": invalid residual block id";
      ++res_refs[b];
    }
    if (l.positions.size() != l.tail_index || l.tail_pos > s.length ||
        l.n_tokens != l.tail_index + (s.length - l.tail_pos))
      return "sequence " + u64s(id) + ": position bookkeeping inconsistent";
    for (size_t i = 0; i < l.positions.size(); ++i)
      if (l.positions[i] < 0 || static_cast<uint64_t>(l.positions[i]) >= l.tail_pos ||
          (i && l.positions[i] <= l.positions[i - 1]))
        return "sequence " + u64s(id) + ": positions not increasing";
    if (s.track_scores ? l.scores.size() != l.n_tokens * c.cfg_.num_kv_heads : !l.scores.empty())
      return "sequence " + u64s(id) + ": score array out of step with the token count";
    for (int32_t b : l.blocks) {
      if (b < 0 || static_cast<uint64_t>(b) >= refs.size())
        return "sequence " + u64s(id) + ": invalid block id";
      if (c.alloc_.class_of(b) != c.fmt_.class_of_layer(li))
        return "sequence " + u64s(id) + ": a block of another layer format in " + c.table_name(li) +
               "'s table";
      ++refs[b];
    }
  }
  return {};
}
}  // namespace

std::string Pool::check_invariants() const {
  std::shared_lock lk(mu_);
  std::string err = alloc_.check();
  if (!err.empty()) return err;
  err = stage_.alloc.check();
  if (!err.empty()) return "residual: " + err;
  std::vector<uint64_t> refs(alloc_.num_blocks(), 0), res_refs(stage_.alloc.num_blocks(), 0);
  uint64_t tokens = 0;
  seqs_.for_each([&](uint64_t id, const Sequence &s) {
    if (err.empty()) err = check_sequence(*this, id, s, refs, res_refs);
    for (const LayerTable &l : s.layers) tokens += l.n_tokens;
  });
  if (!err.empty()) return err;
  // blocks reserved for pending loads hold one reference each
  prefix_->tiers().count_reserved(refs);
  if (tokens != tokens_stored_) return "tokens_stored counter disagrees with the block tables";
  for (size_t b = 0; b < res_refs.size(); ++b)
    if (res_refs[b] != stage_.alloc.refcount(static_cast<int32_t>(b)))
      return "residual block " + u64s(b) + ": reference count disagrees with the block tables";
  for (size_t b = 0; b < refs.size(); ++b) {
    const auto st = alloc_.state(static_cast<int32_t>(b));
    if (refs[b] != alloc_.refcount(static_cast<int32_t>(b)))
      return "block " + u64s(b) + ": reference count " +
             u64s(alloc_.refcount(static_cast<int32_t>(b))) + " but held by " + u64s(refs[b]) +
             " block tables";
    if (refs[b] > 0 && st != BlockAllocator::State::Used)
      return "block " + u64s(b) + " held by a block table but not used";
  }
  if (!prefix_->enabled() && alloc_.num_cached() != 0)
    return "cached blocks without a prefix cache";
  return prefix_->check();
}

}  // namespace kvc::core
