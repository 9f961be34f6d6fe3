// Saving and restoring one sequence (kvc_seq_save / kvc_seq_restore and their
// file forms): its
// block tables, positions, scores and the raw bytes of its blocks as the pool
// stores them (codes, scales and zero points), so a restore is exact: no
// re-quantization. Record format: docs/tiers.md ("Sequence records").
#include <xxhash.h>

#include <cstring>
#include <mutex>
#include <shared_mutex>

#include "common/error.h"
#include "common/atomic_file.h"
#include "core/pool.h"
#include "core/state.h"

namespace kvc::core {

namespace {

constexpr char kMagic[4] = {'K', 'V', 'C', 'S'};
// Format 1; format 2 adds the ranges of reserved tokens no append wrote
// (written only when a sequence has some, so other records stay format 1).
constexpr uint32_t kFormat = 1, kFormatUnwritten = 2;
constexpr uint64_t kHeader = 24;  // magic, format, total size, checksum

class Writer {
 public:
  explicit Writer(std::vector<uint8_t> &b) : b_(b) {}
  void u32(uint32_t v) { put(&v, 4); }
  void u64(uint64_t v) { put(&v, 8); }
  void put(const void *p, size_t n) {
    if (n == 0) return;  // p may be NULL (an empty vector's data)
    const size_t at = b_.size();
    // (insert() of a range makes GCC 12 -O3 warn: -Wstringop-overflow, a false positive)
    b_.resize(at + n);
    std::memcpy(b_.data() + at, p, n);
  }

 private:
  std::vector<uint8_t> &b_;  // little-endian hosts only (as the rest of the pool's formats)
};

class Reader {
 public:
  Reader(const uint8_t *p, size_t n) : p_(p), n_(n) {}
  uint32_t u32() {
    uint32_t v;
    get(&v, 4);
    return v;
  }
  uint64_t u64() {
    uint64_t v;
    get(&v, 8);
    return v;
  }
  const uint8_t *take(uint64_t n) {
    if (n > n_ - off_) corrupt("ends early");
    const uint8_t *p = p_ + off_;
    off_ += n;
    return p;
  }
  void get(void *dst, size_t n) {
    const uint8_t *src = take(n);
    if (n) std::memcpy(dst, src, n);  // dst may be NULL for n == 0 (an empty vector)
  }
  size_t left() const { return n_ - off_; }
  [[noreturn]] static void corrupt(const std::string &what) {
    fail(Errc::Corrupt, "the sequence record " + what + "; nothing restored");
  }

 private:
  const uint8_t *p_;
  size_t n_, off_ = 0;
};

// What a restore needs to match: the geometry and storage (the prefix cache's
// fingerprint) plus the RoPE settings (positions of re-rotated keys).
std::vector<uint8_t> state_fingerprint(const PoolConfig &c) {
  std::vector<uint8_t> b = pool_fingerprint(c);
  Writer w(b);
  w.u32(static_cast<uint32_t>(c.rope_style));
  w.u32(c.rope_dims ? c.rope_dims : c.head_dim);
  double theta = c.rope_theta;
  w.put(&theta, 8);
  if (c.residual_sinks) w.u32(c.residual_sinks);  // (absent when 0: older records still match)
  return b;
}

// The first fields of a fingerprint, for a message saying what differs.
std::string describe_difference(const std::vector<uint8_t> &mine, const uint8_t *theirs,
                                uint64_t n) {
  static const char *const names[] = {"num_layers", "num_q_heads", "num_kv_heads", "head_dim",
                                      "block_size", "k_dtype",     "v_dtype",      "layout"};
  std::string diff;
  for (size_t i = 0; i < 8 && (i + 1) * 4 <= n && (i + 1) * 4 <= mine.size(); ++i) {
    uint32_t a, b;
    std::memcpy(&a, mine.data() + 4 * i, 4);
    std::memcpy(&b, theirs + 4 * i, 4);
    if (a != b)
      diff += std::string(diff.empty() ? "" : ", ") + names[i] + " " + u64s(b) +
              " (this pool: " + u64s(a) + ")";
  }
  return diff.empty() ? "head-wise storage, codecs (outliers included; per-layer codecs), scales, "
                        "residual window or residual_dtype, attention sinks, RoPE settings, key "
                        "smoothing or "
                        "codebooks differ"
                      : diff;
}

// Streams a record to a RecordSink: the header first (checksum 0), the rest
// hashed as it goes.
class Emitter {
 public:
  explicit Emitter(RecordSink &out) : out_(out), st_(XXH3_createState()) {
    if (!st_) throw std::bad_alloc();
    XXH3_64bits_reset(st_);
  }
  ~Emitter() { XXH3_freeState(st_); }
  Emitter(const Emitter &) = delete;
  Emitter &operator=(const Emitter &) = delete;
  void u32(uint32_t v) { put(&v, 4); }
  void u64(uint64_t v) { put(&v, 8); }
  void put(const void *p, size_t n) {
    if (n == 0) return;
    if (at_ >= kHeader) XXH3_64bits_update(st_, p, n);
    out_.write(static_cast<const uint8_t *>(p), n);
    at_ += n;
  }
  uint64_t digest() const { return XXH3_64bits_digest(st_); }

 private:
  RecordSink &out_;
  XXH3_state_t *st_;
  uint64_t at_ = 0;
};

}  // namespace

uint64_t Pool::seq_save(uint64_t id, RecordSink &out) const {
  std::shared_lock lk(mu_);
  const Sequence &s = find(id);
  // Appends to this sequence wait while it is read: the record is the
  // sequence at one instant (other sequences go on).
  std::unique_lock wl(s.writers.mu);
  const uint64_t bs = cfg_.block_size;
  // Tokens reserved but not written, per layer as [first, first + count)
  // index ranges: the record says so (format 2), and their bytes are zero.
  std::vector<std::vector<std::pair<uint64_t, uint64_t>>> unwritten(cfg_.num_layers);
  bool any_unwritten = false;
  for (uint32_t li = 0; li < cfg_.num_layers; ++li) {
    const LayerTable &l = s.layers[li];
    for (uint64_t from = 0; from < l.n_tokens;) {
      const uint64_t u = first_unwritten(l, from, l.n_tokens - from);
      if (u == UINT64_MAX) break;
      uint64_t e = u + 1;
      while (e < l.n_tokens && first_unwritten(l, e, 1) == e) ++e;
      unwritten[li].emplace_back(u, e - u);
      any_unwritten = true;
      from = e;
    }
  }
  const std::vector<uint8_t> fp = state_fingerprint(cfg_);
  uint64_t total = kHeader + 4 + fp.size() + 8 + 4 + 4;
  for (uint32_t li = 0; li < cfg_.num_layers; ++li) {
    const LayerTable &l = s.layers[li];
    total += 4 * 8 + 6 * 4 + 8 + l.positions.size() * sizeof(int32_t) + 8 +
             l.scores.size() * sizeof(float);
    total += l.blocks.size() * fmt_.stride(li) + l.res_blocks.size() * stage_.stride;
  }
  if (cfg_.residual_sinks) total += 4 + s.sink_blocks.size() * stage_.stride;
  if (any_unwritten)
    for (const auto &r : unwritten) total += 4 + 16 * r.size();
  if (!out.begin(total)) return total;
  Emitter w(out);
  w.put(kMagic, 4);
  w.u32(any_unwritten ? kFormatUnwritten : kFormat);
  w.u64(total);
  w.u64(0);  // checksum: RecordSink::finish
  w.u32(static_cast<uint32_t>(fp.size()));
  w.put(fp.data(), fp.size());
  w.u64(s.length);
  w.u32(cfg_.num_layers);
  w.u32(s.track_scores ? 1u : 0u);
  for (uint32_t li = 0; li < cfg_.num_layers; ++li) {
    const LayerTable &l = s.layers[li];
    w.u64(l.n_tokens);
    w.u64(l.n_lp);
    w.u64(l.tail_pos);
    w.u64(l.tail_index);
    w.u32(l.res_off);
    w.u32(l.rope_by_index ? 1u : 0u);
    w.u32(static_cast<uint32_t>(l.blocks.size()));
    w.u32(static_cast<uint32_t>(l.res_blocks.size()));
    for (int kv = 0; kv < 2; ++kv) {
      const bool per_tensor = fmt_.per_tensor(kv, li);
      w.u32(per_tensor ? fmt_.scale[kv][li].load(std::memory_order_acquire) : 0u);
    }
    w.u64(l.positions.size());
    w.put(l.positions.data(), l.positions.size() * sizeof(int32_t));
    w.u64(l.scores.size());
    w.put(l.scores.data(), l.scores.size() * sizeof(float));
  }
  // Pools with attention sinks: the count of sink blocks (their bytes end the record).
  if (cfg_.residual_sinks) w.u32(static_cast<uint32_t>(s.sink_blocks.size()));
  if (any_unwritten)  // format 2: per layer u32 R, then R x (u64 first index, u64 count)
    for (const auto &r : unwritten) {
      w.u32(static_cast<uint32_t>(r.size()));
      for (const auto &[first, count] : r) w.u64(first), w.u64(count);
    }
  // The blocks' bytes, layer by layer: the main arena, then the residual.
  // Blocks the layer holds whole and written go straight from the arena to
  // the sink; slots it does not hold (the end of its last block, the
  // residual's start and end) or never wrote are zeroed in a copy, so a
  // record never carries bytes of a slot's earlier owner.
  std::vector<uint8_t> tmp(std::max(fmt_.max_stride(), stage_.stride));
  for (uint32_t li = 0; li < cfg_.num_layers; ++li) {
    const LayerTable &l = s.layers[li];
    const uint32_t cl = fmt_.class_of_layer(li);  // the layer's block format
    for (size_t i = 0; i < l.blocks.size(); ++i) {
      const uint64_t first = i * bs, held = std::min<uint64_t>(bs, l.n_lp - first);
      const bool clean = held == bs && written_.all(l.blocks[i], 0, bs);
      const uint8_t *src = clean ? store_->host_block(l.blocks[i]) : nullptr;
      if (!src) {
        store_->to_host(&l.blocks[i], 1, tmp.data());
        src = tmp.data();
        if (held < bs) fmt_.zero_slots(cl, tmp.data(), static_cast<uint32_t>(held), bs - held);
        if (!clean)
          for (uint64_t t = 0; t < held; ++t)
            if (!written_.test(l.blocks[i], static_cast<uint32_t>(t)))
              fmt_.zero_slots(cl, tmp.data(), static_cast<uint32_t>(t), 1);
      }
      w.put(src, fmt_.cls[cl].stride);
    }
    const uint64_t hp = l.n_tokens - l.n_lp;
    for (size_t i = 0; i < l.res_blocks.size(); ++i) {
      const uint64_t b0 = i * bs, lo = l.res_off,
                     hi = l.res_off + hp;  // held residual slots [lo, hi)
      const uint64_t from = std::max(b0, lo) - b0, to = std::min(b0 + bs, hi) - b0;
      if (from == 0 && to == bs && stage_.written.all(l.res_blocks[i], 0, bs)) {
        w.put(stage_.ptr(l.res_blocks[i]), stage_.stride);
        continue;
      }
      std::memcpy(tmp.data(), stage_.ptr(l.res_blocks[i]), stage_.stride);
      stage_.zero_slots(tmp.data(), 0, static_cast<uint32_t>(from));
      stage_.zero_slots(tmp.data(), static_cast<uint32_t>(to), bs - to);
      for (uint64_t t = from; t < to; ++t)
        if (!stage_.written.test(l.res_blocks[i], static_cast<uint32_t>(t)))
          stage_.zero_slots(tmp.data(), static_cast<uint32_t>(t), 1);
      w.put(tmp.data(), stage_.stride);
    }
  }
  // Sink blocks: each layer's copies of the tokens it holds; the rest zeroed.
  const uint64_t per = stage_.layers_per_sink_block();
  for (size_t i = 0; i < s.sink_blocks.size(); ++i) {
    std::memcpy(tmp.data(), stage_.ptr(s.sink_blocks[i]), stage_.stride);
    std::vector<uint8_t> keep(bs, 0);
    for (uint32_t li = 0; li < cfg_.num_layers; ++li)
      if (li / per == i) {
        // A copy exists once its token is encoded (index < n_lp) and was written.
        const LayerTable &l = s.layers[li];
        const uint64_t held = std::min<uint64_t>(l.n_lp, cfg_.residual_sinks);
        for (uint64_t t = 0; t < held; ++t)
          if (written_.test(l.blocks[t / bs], static_cast<uint32_t>(t % bs)))
            keep[stage_.sink_slot(li) + t] = 1;
      }
    for (uint32_t t = 0; t < bs; ++t)
      if (!keep[t]) stage_.zero_slots(tmp.data(), t, 1);
    w.put(tmp.data(), stage_.stride);
  }
  out.finish(w.digest());
  return total;
}

void Pool::seq_restore(uint64_t id, const uint8_t *data, size_t size) {
  // Parse and check everything before the pool is touched.
  if (size < kHeader) Reader::corrupt("is " + u64s(size) + " bytes, shorter than its header");
  if (std::memcmp(data, kMagic, 4) != 0)
    Reader::corrupt("does not start with \"KVCS\" (not a sequence record)");
  Reader r(data, size);
  r.take(4);
  const uint32_t format = r.u32();
  if (format != kFormat && format != kFormatUnwritten)
    fail(Errc::Incompatible, "sequence record format " + u64s(format) +
                                 ": this library reads formats " + u64s(kFormat) + " and " +
                                 u64s(kFormatUnwritten) + "; nothing restored");
  const uint64_t total = r.u64();
  if (total != size)
    Reader::corrupt("says it is " + u64s(total) + " bytes, " + u64s(size) + " were given");
  const uint64_t sum = r.u64();
  if (XXH3_64bits(data + kHeader, size - kHeader) != sum)
    Reader::corrupt("fails its checksum (damaged)");
  const uint32_t fp_n = r.u32();
  const uint8_t *fp = r.take(fp_n);
  const std::vector<uint8_t> mine = state_fingerprint(cfg_);
  if (fp_n != mine.size() || std::memcmp(fp, mine.data(), fp_n) != 0)
    fail(Errc::Incompatible,
         "the sequence record was saved from a pool of another configuration: " +
             describe_difference(mine, fp, fp_n) + "; nothing restored");
  const uint64_t length = r.u64();
  const uint32_t layers = r.u32();
  const bool track = (r.u32() & 1u) != 0;
  if (layers != cfg_.num_layers)
    Reader::corrupt("has " + u64s(layers) + " block tables, this pool " + u64s(cfg_.num_layers) +
                    (headwise() ? " (layers x KV heads)" : " (one per layer)"));
  const uint64_t bs = cfg_.block_size, heads = cfg_.num_kv_heads;
  if (length > (uint64_t(1) << 31) - 1) Reader::corrupt("has length " + u64s(length));

  struct Saved {
    LayerTable t;
    uint32_t n_blocks = 0, n_res = 0;
    uint32_t scale[2] = {0, 0};
  };
  std::vector<Saved> saved(layers);  // may throw bad_alloc: nothing changed
  uint64_t need_blocks = 0, need_res = 0;
  for (uint32_t li = 0; li < layers; ++li) {
    Saved &sv = saved[li];
    LayerTable &l = sv.t;
    l.n_tokens = r.u64();
    l.n_lp = r.u64();
    l.reserved_at = l.n_tokens;  // restored tokens were written
    l.tail_pos = r.u64();
    l.tail_index = r.u64();
    l.res_off = r.u32();
    l.rope_by_index = (r.u32() & 1u) != 0;
    sv.n_blocks = r.u32();
    sv.n_res = r.u32();
    sv.scale[0] = r.u32();
    sv.scale[1] = r.u32();
    if (!BlockFormat::valid_scale_bits(sv.scale[0]) || !BlockFormat::valid_scale_bits(sv.scale[1]))
      Reader::corrupt("has a per-tensor scale that is not a finite normal number (" +
                      table_name(li) + ")");
    const uint64_t n_pos = r.u64();
    if (n_pos > r.left() / 4) Reader::corrupt("ends early");
    l.positions.resize(n_pos);
    r.get(l.positions.data(), n_pos * 4);
    const uint64_t n_sc = r.u64();
    if (n_sc > r.left() / 4) Reader::corrupt("ends early");
    l.scores.resize(n_sc);
    r.get(l.scores.data(), n_sc * 4);
    // The table must describe a sequence this pool could have built.
    const std::string at = " (" + table_name(li) + ")";
    if (l.n_lp > l.n_tokens || l.n_tokens > length || l.tail_index > l.n_tokens ||
        n_pos != l.tail_index || l.tail_pos > length ||
        l.n_tokens - l.tail_index != length - l.tail_pos)
      Reader::corrupt("has inconsistent token counts" + at);
    // Codec tokens come in whole aging units (per-channel groups).
    if (l.n_lp % stage_.unit != 0)
      Reader::corrupt("has a per-channel group cut in its codec blocks" + at);
    for (uint64_t i = 0; i < n_pos; ++i)
      if (l.positions[i] < 0 || static_cast<uint64_t>(l.positions[i]) >= l.tail_pos ||
          (i && l.positions[i] <= l.positions[i - 1]))
        Reader::corrupt("has positions out of order" + at);
    if (sv.n_blocks != (l.n_lp + bs - 1) / bs)
      Reader::corrupt("has " + u64s(sv.n_blocks) + " blocks for " + u64s(l.n_lp) + " tokens" + at);
    const uint64_t res_tokens = l.n_tokens - l.n_lp;
    if (!stage_.active ? (sv.n_res != 0 || res_tokens != 0 || l.res_off != 0)
                       : (l.res_off >= bs || (res_tokens == 0 && l.res_off != 0) ||
                          sv.n_res != (res_tokens ? (l.res_off + res_tokens + bs - 1) / bs : 0)))
      Reader::corrupt("has a residual that does not match its token counts" + at);
    if (n_sc != (track ? l.n_tokens * heads : 0))
      Reader::corrupt("has scores of the wrong size" + at);
    for (int kv = 0; kv < 2; ++kv) {
      const bool per_tensor = fmt_.per_tensor(kv, li);
      if (!per_tensor && sv.scale[kv] != 0)
        Reader::corrupt("has a per-tensor scale for a part without one" + at);
    }
    need_blocks += sv.n_blocks;
    need_res += sv.n_res;
  }
  uint64_t n_sinks = 0;
  if (cfg_.residual_sinks) {
    n_sinks = r.u32();
    bool any = false;
    for (const Saved &sv : saved) any = any || sv.t.n_tokens > 0;
    // The copies come with the first reserve (and stay through truncation).
    if (n_sinks != 0 && n_sinks != stage_.sink_blocks_needed())
      Reader::corrupt("has " + u64s(n_sinks) + " attention-sink blocks (" +
                      u64s(stage_.sink_blocks_needed()) + " or 0 expected)");
    if (any && n_sinks == 0) Reader::corrupt("has tokens but no attention-sink blocks");
    need_res += n_sinks;
  }
  std::vector<std::vector<std::pair<uint64_t, uint64_t>>> unwritten(layers);
  if (format == kFormatUnwritten)
    for (uint32_t li = 0; li < layers; ++li) {
      const uint32_t n_ranges = r.u32();
      if (n_ranges > r.left() / 16) Reader::corrupt("ends early");
      uint64_t end = 0;
      for (uint32_t i = 0; i < n_ranges; ++i) {
        const uint64_t first = r.u64(), count = r.u64();
        if (count == 0 || first < end || first >= saved[li].t.n_tokens ||
            count > saved[li].t.n_tokens - first)
          Reader::corrupt("has unwritten ranges out of order or beyond the layer's tokens (" +
                          table_name(li) + ")");
        unwritten[li].emplace_back(first, count);
        end = first + count;
      }
    }
  const uint8_t *bytes = r.take(r.left());
  uint64_t expect = n_sinks * stage_.stride;
  for (uint32_t li = 0; li < layers; ++li)
    expect += saved[li].n_blocks * fmt_.stride(li) + saved[li].n_res * stage_.stride;
  if (expect != static_cast<uint64_t>(size - (bytes - data)))
    Reader::corrupt("holds " + u64s(size - (bytes - data)) + " bytes of blocks, " + u64s(expect) +
                    " expected");

  std::unique_lock lk(mu_);
  if (seqs_.find(id))
    fail(Errc::SeqExists, "sequence " + u64s(id) + " already exists; nothing restored");
  // Per-tensor scales: an uncalibrated layer takes the record's; a calibrated
  // one must already have it (the codes are relative to it).
  for (uint32_t li = 0; li < layers; ++li)
    for (int kv = 0; kv < 2; ++kv) {
      const uint32_t want = saved[li].scale[kv];
      if (!want) continue;
      const uint32_t have = fmt_.scale[kv][li].load(std::memory_order_acquire);
      if (have && have != want)
        fail(Errc::Incompatible, table_name(li) + "'s per-tensor " + (kv ? "V" : "K") +
                                     " scale is " + std::to_string(bits_f32(have)) +
                                     " in this pool and " + std::to_string(bits_f32(want)) +
                                     " in the record; nothing restored");
    }
  Need need(*this);
  for (uint32_t li = 0; li < layers; ++li) need.add(li, saved[li].n_blocks);
  if (!ever_fits(need) || need_res > stage_.alloc.num_blocks())
    fail(Errc::ExceedsCapacity,
         "exceeds the pool's capacity: restoring needs " + u64s(need_blocks) +
             " blocks (the pool has " + u64s(alloc_.num_blocks()) + ") and " + u64s(need_res) +
             " residual blocks (the pool has " + u64s(stage_.alloc.num_blocks()) + ")" +
             class_detail(need, true) + "; nothing restored");
  if (!fits(need) || need_res > stage_.alloc.available())
    fail(Errc::PoolExhausted, "pool exhausted: restoring needs " + u64s(need_blocks) + " blocks (" +
                                  u64s(alloc_.available()) + " available) and " + u64s(need_res) +
                                  " residual blocks (" + u64s(stage_.alloc.available()) +
                                  " available)" + class_detail(need, false) + "; nothing restored");
  auto s = std::make_unique<Sequence>();  // allocations first: may throw, nothing changed
  s->length = length;
  s->track_scores = track;
  s->layers.resize(layers);
  s->sink_blocks.reserve(n_sinks);
  for (uint32_t li = 0; li < layers; ++li) {
    s->layers[li] = std::move(saved[li].t);
    s->layers[li].blocks.reserve(saved[li].n_blocks);
    s->layers[li].res_blocks.reserve(saved[li].n_res);
  }
  Sequence *sp = seqs_.insert(id, std::move(s));  // may throw: nothing changed yet
  // From here on nothing throws (device copies excepted: CUDA errors are internal).
  const uint8_t *p = bytes;
  for (uint32_t li = 0; li < layers; ++li) {
    LayerTable &l = sp->layers[li];
    for (uint32_t i = 0; i < saved[li].n_blocks; ++i) l.blocks.push_back(take_layer_block(li));
    store_->from_host(l.blocks.data(), l.blocks.size(), p);
    p += l.blocks.size() * fmt_.stride(li);
    for (uint32_t i = 0; i < saved[li].n_res; ++i) {
      l.res_blocks.push_back(stage_.take());
      std::memcpy(stage_.ptr(l.res_blocks.back()), p, stage_.stride);
      p += stage_.stride;
    }
    for (int kv = 0; kv < 2; ++kv) {
      uint32_t expected = 0;
      if (saved[li].scale[kv])
        fmt_.scale[kv][li].compare_exchange_strong(expected, saved[li].scale[kv],
                                                   std::memory_order_acq_rel);
    }
    mark_written(l, 0, l.n_tokens, true);  // as the record says: all but its unwritten ranges
    for (const auto &[first, count] : unwritten[li]) mark_written(l, first, count, false);
    tokens_stored_ += l.n_tokens;
  }
  for (uint64_t i = 0; i < n_sinks; ++i) {
    sp->sink_blocks.push_back(stage_.take());
    std::memcpy(stage_.ptr(sp->sink_blocks.back()), p, stage_.stride);
    p += stage_.stride;
  }
  if (n_sinks) stage_.assign_sinks(*sp);
  note_usage();
}

namespace {
// A sequence record streamed into a file through a 1 MiB buffer.
class FileSink final : public RecordSink {
 public:
  explicit FileSink(AtomicFile &f) : f_(f) {}
  bool begin(uint64_t) override {
    buf_.reserve(kChunk);
    return true;
  }
  void write(const uint8_t *p, uint64_t n) override {
    if (n >= kChunk) {
      flush();
      f_.write_all(p, n);
      return;
    }
    if (buf_.size() + n > kChunk) flush();
    buf_.insert(buf_.end(), p, p + n);
  }
  void finish(uint64_t checksum) override {
    flush();
    f_.write_at(16, reinterpret_cast<const uint8_t *>(&checksum), 8);
  }

 private:
  static constexpr size_t kChunk = size_t(1) << 20;
  void flush() {
    if (!buf_.empty()) f_.write_all(buf_.data(), buf_.size());
    buf_.clear();
  }
  AtomicFile &f_;
  std::vector<uint8_t> buf_;
};
}  // namespace

void BufferSink::write(const uint8_t *p, uint64_t n) {
  std::memcpy(buf_ + at_, p, n);
  at_ += n;
}
void BufferSink::finish(uint64_t checksum) {
  std::memcpy(buf_ + 16, &checksum, 8);
}

void save_file(const Pool &pool, uint64_t id, const std::string &path) {
  AtomicFile file(path, AtomicFile::Options{});
  FileSink sink(file);
  pool.seq_save(id, sink);  // streamed: no copy of the whole record in memory
  file.commit();
}

void restore_file(Pool &pool, uint64_t id, const std::string &path) {
  const std::vector<uint8_t> rec = read_whole_file(path);
  pool.seq_restore(id, rec.data(), rec.size());
}

}  // namespace kvc::core
