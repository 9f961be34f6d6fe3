// The pool's side of kvc_attention_decode / kvc_attention_prefill: argument
// checks, queries to f32, locking, score tracking, and the tiles the
// attention module (attention/attention.h) reads: a layer's blocks,
// dequantized through the codec path (read_part), residual tokens from their
// arena, attention-sink copies laid over, unwritten slots as zeros.
#include <algorithm>
#include <cmath>
#include <mutex>
#include <shared_mutex>
#include <vector>

#include "attention/attention.h"
#include "common/error.h"
#include "common/scratch.h"
#include "core/pool.h"

namespace kvc::core {

namespace {

std::string u64s(uint64_t v) { return std::to_string(v); }

// Per-thread buffers of the queries and outputs in f32.
struct QueryScratch {
  ScratchBuffer<float> q, out;
};
QueryScratch &scratch() {
  thread_local QueryScratch s;
  return s;
}

}  // namespace

// A layer of one sequence as attention tiles: one block (or the rest of one)
// per read.
class Pool::LayerTiles final : public attention::TileSource {
 public:
  LayerTiles(const Pool &p, uint32_t layer, const LayerTable &l) : p_(p), layer_(layer), l_(l) {}
  uint64_t read(uint64_t t0, uint64_t max_count, float *kt, float *vt) const override {
    const LayerTable &l = l_;
    const uint64_t bs = p_.cfg_.block_size, row = uint64_t(p_.cfg_.num_kv_heads) * p_.cfg_.head_dim;
    uint8_t *k8 = reinterpret_cast<uint8_t *>(kt), *v8 = reinterpret_cast<uint8_t *>(vt);
    if (t0 < l.n_lp) {
      const uint32_t slot = static_cast<uint32_t>(t0 % bs);
      const uint64_t cnt = std::min({bs - slot, l.n_lp - t0, max_count});
      const uint8_t *blk = p_.block_ptr(l.blocks[t0 / bs]);
      p_.read_part(0, layer_, blk, slot, cnt, k8, DType::F32, l, t0);
      p_.read_part(1, layer_, blk, slot, cnt, v8, DType::F32, l, t0);
      p_.overlay_sinks(layer_, l, t0, cnt, k8, v8, DType::F32);
      p_.zero_unwritten_rows(false, l.blocks[t0 / bs], slot, cnt, k8, v8, row * sizeof(float));
      return cnt;
    }
    const uint64_t r = l.res_off + (t0 - l.n_lp);
    const uint32_t slot = static_cast<uint32_t>(r % bs);
    const uint64_t cnt = std::min(bs - slot, max_count);
    p_.read_residual(p_.res_ptr(l.res_blocks[r / bs]), slot, cnt, k8, v8, DType::F32);
    p_.zero_unwritten_rows(true, l.res_blocks[r / bs], slot, cnt, k8, v8, row * sizeof(float));
    return cnt;
  }

 private:
  const Pool &p_;
  uint32_t layer_;
  const LayerTable &l_;
};

void Pool::attention(uint32_t layer, const uint64_t *ids, size_t n_seqs, const void *q, uint64_t n_q,
                     bool prefill, void *out, float *lse, const AttnParams &p) {
  const uint64_t hd = cfg_.head_dim;
  if (p.num_q_heads == 0 || p.num_q_heads % cfg_.num_kv_heads != 0)
    fail(Errc::InvalidArgument, "num_q_heads " + u64s(p.num_q_heads) + " must be a non-zero multiple of num_kv_heads " +
                                    u64s(cfg_.num_kv_heads));
  if (p.num_q_heads != cfg_.num_q_heads)
    fail(Errc::InvalidArgument, "num_q_heads " + u64s(p.num_q_heads) + " differs from the pool's " +
                                    u64s(cfg_.num_q_heads));
  if (!(p.scale >= 0.0f) || !std::isfinite(p.scale))
    fail(Errc::InvalidArgument, "scale must be finite and >= 0 (0: 1/sqrt(head_dim))");
  if (p.observe > 2) fail(Errc::InvalidArgument, "unknown observe mode " + u64s(p.observe));
  if (p.num_threads > 256) fail(Errc::InvalidArgument, "num_threads " + u64s(p.num_threads) + ": at most 256");
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
      fail(Errc::OutOfRange, u64s(n_q) + " prefill queries but layer " + u64s(layer) + " of sequence " +
                                 u64s(ids[0]) + " holds " + u64s(l.n_tokens) + " tokens (append the chunk's K/V first)");
  }
  if (dev_) return attention_device(layer, ids, n_seqs, q, n_q, prefill, out, lse, p, scale);
  // Queries to f32, checked finite, scaled (before any output is written).
  QueryScratch &sc = scratch();
  float *qf = sc.q.get(per_seq * n_seqs);
  convert(q, p.q_dtype, qf, DType::F32, per_seq * n_seqs);
  for (uint64_t i = 0; i < per_seq * n_seqs; ++i) {
    if (!std::isfinite(qf[i]))
      fail(Errc::NonFinite, "query element " + u64s(i) + " is NaN or Inf: nothing was written");
    qf[i] *= scale;
    if (!std::isfinite(qf[i]))
      fail(Errc::NonFinite, "query element " + u64s(i) + " times the scale overflows f32: nothing was written");
  }
  float *of = sc.out.get(per_seq * n_seqs);
  std::vector<float> lse_local;
  float *lf = lse;
  if (!lf) {
    lse_local.resize(n_seqs * n_q * p.num_q_heads);
    lf = lse_local.data();
  }
  // Every observed sequence must track scores: enabling takes the pool lock
  // exclusively; the state is checked again under the shared lock (a
  // sequence may have been freed and created again in between).
  std::shared_lock lk(mu_, std::defer_lock);
  for (;;) {
    lk.lock();
    bool need = false;
    if (p.observe)
      for (size_t i = 0; i < n_seqs; ++i) need = need || !find(ids[i]).track_scores;
    if (!need) break;
    lk.unlock();
    std::unique_lock ex(mu_);
    for (size_t i = 0; i < n_seqs; ++i) enable_scores(find(ids[i]));
  }
  check_layer(layer);
  for (size_t i = 0; i < n_seqs; ++i) {
    const Sequence &s = find(ids[i]);
    const LayerTable &l = s.layers[layer];
    if (prefill && n_q > l.n_tokens)
      fail(Errc::OutOfRange, u64s(n_q) + " prefill queries but layer " + u64s(layer) + " of sequence " +
                                 u64s(ids[i]) + " holds " + u64s(l.n_tokens) +
                                 " tokens (append the chunk's K/V first)");
  }
  const attention::Shape shape{p.num_q_heads, cfg_.num_kv_heads, cfg_.head_dim, cfg_.block_size};
  if (p.num_threads > 1 && !prefill && !p.observe) {
    std::vector<LayerTiles> tiles;
    tiles.reserve(n_seqs);
    std::vector<const attention::TileSource *> src(n_seqs);
    std::vector<uint64_t> ns(n_seqs);
    for (size_t i = 0; i < n_seqs; ++i) {
      const LayerTable &l = find(ids[i]).layers[layer];
      tiles.emplace_back(*this, layer, l);
      src[i] = &tiles.back();
      ns[i] = l.n_tokens;
    }
    attention::attend_threads(shape, src, ns, qf, of, lf, p.num_threads);
    convert(of, DType::F32, out, p.out_dtype, per_seq * n_seqs);
    return;
  }
  if (p.observe == 2) {  // replace: clear every observed sequence first (an id may repeat in the batch)
    std::lock_guard<std::mutex> g(scores_mu_);
    for (size_t i = 0; i < n_seqs; ++i) {
      LayerTable &l = const_cast<Sequence &>(find(ids[i])).layers[layer];
      std::fill(l.scores.begin(), l.scores.end(), 0.0f);
    }
  }
  for (size_t i = 0; i < n_seqs; ++i) {
    Sequence &s = const_cast<Sequence &>(find(ids[i]));
    LayerTable &l = s.layers[layer];
    attention::attend(shape, LayerTiles(*this, layer, l), l.n_tokens, qf + i * per_seq, n_q, prefill,
                      of + i * per_seq, lf + i * n_q * p.num_q_heads, p.observe ? l.scores.data() : nullptr,
                      p.observe_from, &scores_mu_);
  }
  convert(of, DType::F32, out, p.out_dtype, per_seq * n_seqs);
}

// CUDA pools: the block tables go to the device with the call; q, out and
// lse may be device or host memory (cuda/kernels.cu). Queries are not
// checked for NaN / Inf on the device (documented in kvcache.h).
void Pool::attention_device(uint32_t layer, const uint64_t *ids, size_t n_seqs, const void *q, uint64_t n_q,
                            bool prefill, void *out, float *lse, const AttnParams &p, float scale) {
  if (p.observe)
    fail(Errc::Unsupported, "device CUDA: observing attention (H2O, TOVA, SnapKV scores) is CPU-only in this "
                            "version; feed scores with kvc_seq_observe_scores()");
  std::shared_lock lk(mu_);
  check_layer(layer);
  std::vector<int32_t> blocks;
  std::vector<uint64_t> start, count, row;
  const uint64_t bs = cfg_.block_size;
  for (size_t i = 0; i < n_seqs; ++i) {
    const LayerTable &l = find(ids[i]).layers[layer];
    if (prefill && n_q > l.n_tokens)
      fail(Errc::OutOfRange, u64s(n_q) + " prefill queries but layer " + u64s(layer) + " of sequence " +
                                 u64s(ids[i]) + " holds " + u64s(l.n_tokens) + " tokens (append the chunk's K/V first)");
    const uint64_t b0 = blocks.size();
    const uint64_t nb = (l.n_tokens + bs - 1) / bs;
    blocks.insert(blocks.end(), l.blocks.begin(), l.blocks.begin() + static_cast<std::ptrdiff_t>(nb));
    for (uint64_t r = 0; r < n_q; ++r) {
      start.push_back(b0);
      count.push_back(prefill ? l.n_tokens - n_q + r + 1 : l.n_tokens);
      row.push_back(i * n_q + r);
    }
  }
  cuda::Device::AttnBatch b;
  b.block_ids = blocks.data();
  b.block_start = start.data();
  b.n_tokens = count.data();
  b.q_row = row.data();
  b.n_items = start.size();
  b.n_blocks = blocks.size();
  b.n_rows = n_seqs * n_q;
  const float ts[2] = {part_[0].quantized ? tensor_scale(0, layer) : 0.0f,
                       part_[1].quantized ? tensor_scale(1, layer) : 0.0f};
  dev_->attention(b, p.num_q_heads, scale, q, static_cast<int32_t>(p.q_dtype), out, static_cast<int32_t>(p.out_dtype),
                  lse, ts);
}

}  // namespace kvc::core
