#include "core/pool.h"

#include <sys/mman.h>

#include <algorithm>
#include <cstring>
#include <limits>
#include <mutex>
#include <shared_mutex>
#include <new>

#include "core/error.h"

namespace kvc::core {

namespace {

constexpr uint64_t kMaxBlocks = static_cast<uint64_t>(std::numeric_limits<int32_t>::max());
constexpr uint64_t kMaxLength = static_cast<uint64_t>(std::numeric_limits<int32_t>::max());

bool mul_overflows(uint64_t a, uint64_t b, uint64_t *out) { return __builtin_mul_overflow(a, b, out); }

std::string u64s(uint64_t v) { return std::to_string(v); }

void check_range(const char *name, uint64_t v, uint64_t lo, uint64_t hi) {
  if (v < lo || v > hi)
    fail(Errc::InvalidArgument,
         std::string(name) + " " + u64s(v) + ": must be " + u64s(lo) + ".." + u64s(hi));
}

}  // namespace

void Pool::validate(PoolConfig &c) {
  check_range("num_layers", c.num_layers, 1, 4096);
  check_range("num_q_heads", c.num_q_heads, 1, 65536);
  check_range("num_kv_heads", c.num_kv_heads, 1, 65536);
  check_range("head_dim", c.head_dim, 1, 1024);
  check_range("block_size", c.block_size, 1, 4096);
  if (c.num_q_heads % c.num_kv_heads != 0)
    fail(Errc::InvalidArgument, "num_q_heads " + u64s(c.num_q_heads) +
                                    " is not a multiple of num_kv_heads " + u64s(c.num_kv_heads));
  if (c.flags & ~kFlagZeroOnFree)
    fail(Errc::InvalidArgument, "flags 0x" + [&] {
      char b[16];
      std::snprintf(b, sizeof b, "%x", c.flags);
      return std::string(b);
    }() + ": unknown bits (known: KVC_POOL_ZERO_ON_FREE)");
  if (!dtype_valid(static_cast<int32_t>(c.k_dtype)))
    fail(Errc::InvalidArgument, "k_dtype " + std::to_string(static_cast<int32_t>(c.k_dtype)) +
                                    ": unknown storage dtype");
  if (!dtype_valid(static_cast<int32_t>(c.v_dtype)))
    fail(Errc::InvalidArgument, "v_dtype " + std::to_string(static_cast<int32_t>(c.v_dtype)) +
                                    ": unknown storage dtype");
  if (c.layout != Layout::NHD && c.layout != Layout::HND)
    fail(Errc::InvalidArgument,
         "layout " + std::to_string(static_cast<int32_t>(c.layout)) + ": must be NHD or HND");
  if (c.device == Device::CUDA)
    fail(Errc::DeviceUnavailable, "device CUDA: this build of libkvcache has no CUDA backend");
  if (c.device != Device::CPU)
    fail(Errc::InvalidArgument,
         "device " + std::to_string(static_cast<int32_t>(c.device)) + ": unknown device");
  if (c.device_index != 0)
    fail(Errc::InvalidArgument, "device_index " + std::to_string(c.device_index) +
                                    ": must be 0 for the CPU");
  // Bytes of one block: block_size * kv_heads * head_dim * (k_elem + v_elem).
  uint64_t row = 0, kb = 0, vb = 0, stride = 0;
  if (mul_overflows(static_cast<uint64_t>(c.num_kv_heads) * c.head_dim, c.block_size, &row) ||
      mul_overflows(row, dtype_bytes(c.k_dtype), &kb) ||
      mul_overflows(row, dtype_bytes(c.v_dtype), &vb) || __builtin_add_overflow(kb, vb, &stride))
    fail(Errc::Overflow, "block size in bytes overflows 64 bits");
  if (c.num_blocks == 0 && c.capacity_bytes == 0)
    fail(Errc::InvalidArgument, "no capacity: set num_blocks or capacity_bytes");
  if (c.num_blocks != 0 && c.capacity_bytes != 0)
    fail(Errc::InvalidArgument, "both num_blocks and capacity_bytes are set: give one");
  if (c.num_blocks == 0) {
    c.num_blocks = c.capacity_bytes / stride;
    if (c.num_blocks == 0)
      fail(Errc::InvalidArgument, "capacity_bytes " + u64s(c.capacity_bytes) +
                                      " holds no block of " + u64s(stride) + " bytes");
    c.num_blocks = std::min(c.num_blocks, kMaxBlocks);
    c.capacity_bytes = 0;
  }
  if (c.num_blocks > kMaxBlocks)
    fail(Errc::InvalidArgument,
         "num_blocks " + u64s(c.num_blocks) + ": must be 1.." + u64s(kMaxBlocks));
  uint64_t total = 0;
  if (mul_overflows(c.num_blocks, stride, &total) ||
      total > static_cast<uint64_t>(std::numeric_limits<std::ptrdiff_t>::max()))
    fail(Errc::Overflow, "num_blocks " + u64s(c.num_blocks) + " x " + u64s(stride) +
                             " bytes per block overflows the address space");
}

Pool::Pool(const PoolConfig &cfg)
    : cfg_([&] {
        PoolConfig c = cfg;
        validate(c);
        return c;
      }()),
      alloc_(static_cast<uint32_t>(cfg_.num_blocks)) {
  const uint64_t hd = cfg_.head_dim, h = cfg_.num_kv_heads, bs = cfg_.block_size;
  const uint64_t ek = dtype_bytes(cfg_.k_dtype), ev = dtype_bytes(cfg_.v_dtype);
  k_bytes_ = bs * h * hd * ek;
  v_bytes_ = bs * h * hd * ev;
  block_stride_ = k_bytes_ + v_bytes_;
  if (cfg_.layout == Layout::NHD) {
    k_token_stride_ = h * hd * ek;
    k_head_stride_ = hd * ek;
    v_token_stride_ = h * hd * ev;
    v_head_stride_ = hd * ev;
  } else {
    k_token_stride_ = hd * ek;
    k_head_stride_ = bs * hd * ek;
    v_token_stride_ = hd * ev;
    v_head_stride_ = bs * hd * ev;
  }
  arena_bytes_ = cfg_.num_blocks * block_stride_;
  // Anonymous mapping: page-aligned and zero-filled; pages are touched lazily.
  void *p = mmap(nullptr, arena_bytes_, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED)
    fail(Errc::OutOfMemory, "cannot map " + u64s(arena_bytes_) + " bytes of block memory");
  arena_ = static_cast<uint8_t *>(p);
}

Pool::~Pool() {
  if (arena_) munmap(arena_, arena_bytes_);
}

Sequence &Pool::find(uint64_t id) {
  Sequence *s = seqs_.find(id);
  if (!s) fail(Errc::SeqNotFound, "sequence " + u64s(id) + " does not exist");
  return *s;
}
const Sequence &Pool::find(uint64_t id) const { return const_cast<Pool *>(this)->find(id); }

void Pool::check_layer(uint32_t layer) const {
  if (layer >= cfg_.num_layers)
    fail(Errc::OutOfRange,
         "layer " + u64s(layer) + ": the pool has " + u64s(cfg_.num_layers) + " layers");
}

void Pool::note_usage() {
  const uint64_t in_use = static_cast<uint64_t>(alloc_.num_used()) + alloc_.num_cached();
  if (in_use > peak_blocks_) peak_blocks_ = in_use;
}

int32_t Pool::take_block() {
  int32_t reclaimed;
  const int32_t b = alloc_.allocate(&reclaimed);
  if (b < 0) fail(Errc::Internal, "block allocator empty after an availability check");
  // `reclaimed` >= 0 would be a cached block leaving the prefix index; the
  // prefix cache hooks in here.
  return b;
}

void Pool::release_block(int32_t b) {
  if (alloc_.release(b, /*keep_cached=*/false) && (cfg_.flags & kFlagZeroOnFree))
    std::memset(block_ptr(b), 0, block_stride_);
}

int32_t Pool::cow_copy(int32_t b) {
  const int32_t nb = take_block();
  std::memcpy(block_ptr(nb), block_ptr(b), block_stride_);
  release_block(b);
  return nb;
}

PoolStats Pool::stats() const {
  std::shared_lock lk(mu_);
  PoolStats s{};
  s.blocks_total = alloc_.num_blocks();
  s.blocks_free = alloc_.num_free();
  s.blocks_cached = alloc_.num_cached();
  s.blocks_used = alloc_.num_used();
  s.blocks_shared = alloc_.num_shared();
  s.bytes_per_block = block_stride_;
  s.bytes_per_token = block_stride_ / cfg_.block_size * cfg_.num_layers;
  s.bytes_total = arena_bytes_;
  s.bytes_in_use = (s.blocks_used + s.blocks_cached) * block_stride_;
  s.peak_bytes_in_use = peak_blocks_ * block_stride_;
  s.num_sequences = seqs_.size();
  return s;
}

PoolLayout Pool::layout() const {
  PoolLayout l{};
  l.base = arena_;
  l.num_blocks = cfg_.num_blocks;
  l.block_stride = block_stride_;
  l.k_offset = 0;
  l.k_token_stride = k_token_stride_;
  l.k_head_stride = k_head_stride_;
  l.k_bytes = k_bytes_;
  l.v_offset = k_bytes_;
  l.v_token_stride = v_token_stride_;
  l.v_head_stride = v_head_stride_;
  l.v_bytes = v_bytes_;
  return l;
}

void Pool::reset_peak() {
  std::unique_lock lk(mu_);
  peak_blocks_ = static_cast<uint64_t>(alloc_.num_used()) + alloc_.num_cached();
}

void Pool::seq_create(uint64_t id) {
  std::unique_lock lk(mu_);
  if (seqs_.find(id)) fail(Errc::SeqExists, "sequence " + u64s(id) + " already exists");
  auto s = std::make_unique<Sequence>();
  s->layers.resize(cfg_.num_layers);
  seqs_.insert(id, std::move(s));
}

void Pool::seq_fork(uint64_t parent, uint64_t child) {
  std::unique_lock lk(mu_);
  const Sequence &p = find(parent);
  if (seqs_.find(child)) fail(Errc::SeqExists, "sequence " + u64s(child) + " already exists");
  auto c = std::make_unique<Sequence>(p);  // may throw: nothing changed yet
  Sequence *cp = seqs_.insert(child, std::move(c));  // may throw: nothing changed yet
  for (const LayerTable &l : cp->layers)
    for (int32_t b : l.blocks) alloc_.ref(b);
}

void Pool::seq_truncate(uint64_t id, uint64_t new_length) {
  std::unique_lock lk(mu_);
  Sequence &s = find(id);
  if (new_length >= s.length) return;
  const uint64_t bs = cfg_.block_size;
  for (LayerTable &l : s.layers) {
    uint64_t keep;
    if (new_length >= l.tail_pos) {
      keep = std::min(l.n_tokens, l.tail_index + (new_length - l.tail_pos));
    } else {
      keep = static_cast<uint64_t>(
          std::lower_bound(l.positions.begin(), l.positions.end(), static_cast<int64_t>(new_length)) -
          l.positions.begin());
      l.positions.resize(keep);
      l.tail_index = keep;
      l.tail_pos = new_length;
    }
    const size_t keep_blocks = static_cast<size_t>((keep + bs - 1) / bs);
    while (l.blocks.size() > keep_blocks) {
      release_block(l.blocks.back());
      l.blocks.pop_back();
    }
    l.n_tokens = keep;
  }
  s.length = new_length;
}

void Pool::seq_free(uint64_t id) {
  std::unique_lock lk(mu_);
  Sequence *s = seqs_.find(id);
  if (!s) fail(Errc::SeqNotFound, "sequence " + u64s(id) + " does not exist (freed twice?)");
  for (const LayerTable &l : s->layers)
    for (int32_t b : l.blocks) release_block(b);
  seqs_.erase(id);
}

uint64_t Pool::seq_length(uint64_t id) const {
  std::shared_lock lk(mu_);
  return find(id).length;
}

uint64_t Pool::seq_layer_tokens(uint64_t id, uint32_t layer) const {
  std::shared_lock lk(mu_);
  const Sequence &s = find(id);
  check_layer(layer);
  return s.layers[layer].n_tokens;
}

void Pool::seq_reserve(uint64_t id, uint64_t n_new, int64_t *slot_mapping) {
  std::unique_lock lk(mu_);
  Sequence &s = find(id);
  if (n_new == 0) fail(Errc::InvalidArgument, "n_new 0: reserve at least one token");
  if (n_new > kMaxLength - s.length)
    fail(Errc::Overflow, "length " + u64s(s.length) + " + " + u64s(n_new) +
                             " tokens exceeds the maximum of " + u64s(kMaxLength));
  const uint64_t bs = cfg_.block_size;
  uint64_t needed = 0;
  for (const LayerTable &l : s.layers) {
    needed += (l.n_tokens + n_new + bs - 1) / bs - l.blocks.size();
    if (l.n_tokens % bs != 0 && alloc_.refcount(l.blocks.back()) > 1) ++needed;  // copy-on-write
  }
  if (needed > alloc_.available())
    fail(Errc::PoolExhausted, "pool exhausted: reserving " + u64s(n_new) + " tokens needs " +
                                  u64s(needed) + " blocks, " + u64s(alloc_.available()) +
                                  " available");
  for (LayerTable &l : s.layers) {  // may throw bad_alloc: nothing changed yet
    const size_t target = static_cast<size_t>((l.n_tokens + n_new + bs - 1) / bs);
    if (l.blocks.capacity() < target) l.blocks.reserve(std::max(target, 2 * l.blocks.capacity()));
  }
  // From here on nothing throws.
  for (uint32_t li = 0; li < cfg_.num_layers; ++li) {
    LayerTable &l = s.layers[li];
    if (l.n_tokens % bs != 0 && alloc_.refcount(l.blocks.back()) > 1)
      l.blocks.back() = cow_copy(l.blocks.back());
    const uint64_t target = (l.n_tokens + n_new + bs - 1) / bs;
    while (l.blocks.size() < target) l.blocks.push_back(take_block());
    if (slot_mapping) {
      int64_t *out = slot_mapping + static_cast<uint64_t>(li) * n_new;
      for (uint64_t i = 0; i < n_new; ++i) {
        const uint64_t idx = l.n_tokens + i;
        out[i] = static_cast<int64_t>(l.blocks[idx / bs]) * static_cast<int64_t>(bs) +
                 static_cast<int64_t>(idx % bs);
      }
    }
    l.n_tokens += n_new;
  }
  s.length += n_new;
  note_usage();
}

void Pool::write_rows(uint8_t *dst_base, uint64_t token_stride, uint64_t head_stride, DType dst,
                      const uint8_t *src, DType src_type, uint32_t slot, uint64_t count) const {
  const uint64_t hd = cfg_.head_dim, h = cfg_.num_kv_heads;
  const uint64_t src_row = h * hd * dtype_bytes(src_type);
  if (cfg_.layout == Layout::NHD) {
    // count tokens are contiguous in the block: one conversion of the run.
    convert(src, src_type, dst_base + slot * token_stride, dst, count * h * hd);
    return;
  }
  for (uint64_t t = 0; t < count; ++t)
    for (uint64_t hh = 0; hh < h; ++hh)
      convert(src + t * src_row + hh * hd * dtype_bytes(src_type), src_type,
              dst_base + hh * head_stride + (slot + t) * token_stride, dst, hd);
}

void Pool::append(uint64_t id, uint32_t layer, uint64_t pos, uint64_t n, const void *k,
                  const void *v, DType src) {
  const uint64_t bs = cfg_.block_size;
  auto locate = [&](Sequence &s) -> uint64_t {
    check_layer(layer);
    if (n == 0) fail(Errc::InvalidArgument, "n_tokens 0: append at least one token");
    if (n > s.length || pos > s.length - n)
      fail(Errc::NotReserved, "positions " + u64s(pos) + ".." + u64s(pos + n - 1) +
                                  " are not reserved: sequence " + u64s(id) + " has length " +
                                  u64s(s.length) + " (call kvc_seq_reserve first)");
    const LayerTable &l = s.layers[layer];
    if (pos < l.tail_pos)
      fail(Errc::NotReserved, "position " + u64s(pos) + " of layer " + u64s(layer) +
                                  " was compacted by eviction; only positions >= " +
                                  u64s(l.tail_pos) + " can be written");
    return l.tail_index + (pos - l.tail_pos);
  };
  auto shared_blocks = [&](const LayerTable &l, uint64_t idx0) {
    uint64_t cnt = 0;
    for (uint64_t b = idx0 / bs; b <= (idx0 + n - 1) / bs; ++b)
      if (alloc_.refcount(l.blocks[b]) > 1) ++cnt;
    return cnt;
  };
  auto write = [&](LayerTable &l, uint64_t idx0) {
    const uint8_t *ks = static_cast<const uint8_t *>(k);
    const uint8_t *vs = static_cast<const uint8_t *>(v);
    const uint64_t row = static_cast<uint64_t>(cfg_.num_kv_heads) * cfg_.head_dim * dtype_bytes(src);
    uint64_t done = 0;
    while (done < n) {
      const uint64_t idx = idx0 + done;
      const uint32_t slot = static_cast<uint32_t>(idx % bs);
      const uint64_t run = std::min<uint64_t>(n - done, bs - slot);
      uint8_t *blk = block_ptr(l.blocks[idx / bs]);
      write_rows(blk, k_token_stride_, k_head_stride_, cfg_.k_dtype, ks + done * row, src, slot, run);
      write_rows(blk + k_bytes_, v_token_stride_, v_head_stride_, cfg_.v_dtype, vs + done * row, src,
                 slot, run);
      done += run;
    }
  };
  {
    std::shared_lock lk(mu_);
    Sequence &s = find(id);
    const uint64_t idx0 = locate(s);
    LayerTable &l = s.layers[layer];
    if (shared_blocks(l, idx0) == 0) {
      write(l, idx0);
      return;
    }
  }
  // Copy-on-write needed: redo under the exclusive lock (the state may have changed).
  std::unique_lock lk(mu_);
  Sequence &s = find(id);
  const uint64_t idx0 = locate(s);
  LayerTable &l = s.layers[layer];
  const uint64_t need = shared_blocks(l, idx0);
  if (need > alloc_.available())
    fail(Errc::PoolExhausted, "pool exhausted: copy-on-write of " + u64s(need) +
                                  " shared blocks needs free blocks, " +
                                  u64s(alloc_.available()) + " available");
  for (uint64_t b = idx0 / bs; b <= (idx0 + n - 1) / bs; ++b)
    if (alloc_.refcount(l.blocks[b]) > 1) l.blocks[b] = cow_copy(l.blocks[b]);
  note_usage();
  write(l, idx0);
}

void Pool::gather(uint64_t id, uint32_t layer, uint64_t first, uint64_t n, void *k_out,
                  void *v_out, DType dst, int32_t *positions_out) const {
  std::shared_lock lk(mu_);
  const Sequence &s = find(id);
  check_layer(layer);
  const LayerTable &l = s.layers[layer];
  if (first > l.n_tokens || n > l.n_tokens - first)
    fail(Errc::OutOfRange, "tokens " + u64s(first) + ".." + u64s(first + n) + " (end excluded)" +
                               " are beyond the " + u64s(l.n_tokens) + " tokens of layer " +
                               u64s(layer));
  const uint64_t bs = cfg_.block_size, hd = cfg_.head_dim, h = cfg_.num_kv_heads;
  const uint64_t row = h * hd * dtype_bytes(dst);
  uint64_t done = 0;
  while (done < n) {
    const uint64_t idx = first + done;
    const uint32_t slot = static_cast<uint32_t>(idx % bs);
    const uint64_t run = std::min<uint64_t>(n - done, bs - slot);
    const uint8_t *blk = block_ptr(l.blocks[idx / bs]);
    for (int kv = 0; kv < 2; ++kv) {
      uint8_t *out = static_cast<uint8_t *>(kv == 0 ? k_out : v_out);
      if (!out) continue;
      const uint8_t *base = blk + (kv == 0 ? 0 : k_bytes_);
      const uint64_t ts = kv == 0 ? k_token_stride_ : v_token_stride_;
      const uint64_t hs = kv == 0 ? k_head_stride_ : v_head_stride_;
      const DType st = kv == 0 ? cfg_.k_dtype : cfg_.v_dtype;
      if (cfg_.layout == Layout::NHD) {
        convert(base + slot * ts, st, out + done * row, dst, run * h * hd);
      } else {
        for (uint64_t t = 0; t < run; ++t)
          for (uint64_t hh = 0; hh < h; ++hh)
            convert(base + hh * hs + (slot + t) * ts, st,
                    out + (done + t) * row + hh * hd * dtype_bytes(dst), dst, hd);
      }
    }
    done += run;
  }
  if (positions_out)
    for (uint64_t i = 0; i < n; ++i) positions_out[i] = static_cast<int32_t>(l.position_of(first + i));
}

size_t Pool::block_table(uint64_t id, uint32_t layer, int32_t *out, size_t capacity) const {
  std::shared_lock lk(mu_);
  const Sequence &s = find(id);
  check_layer(layer);
  const auto &b = s.layers[layer].blocks;
  if (out && b.size() <= capacity) std::copy(b.begin(), b.end(), out);
  return b.size();
}

size_t Pool::export_page_table(uint32_t layer, const uint64_t *seq_ids, size_t n_seqs,
                               int32_t *indptr, int32_t *indices, size_t capacity,
                               int32_t *last_page_len) const {
  std::shared_lock lk(mu_);
  check_layer(layer);
  uint64_t total = 0;
  for (size_t i = 0; i < n_seqs; ++i) total += find(seq_ids[i]).layers[layer].blocks.size();
  if (total > static_cast<uint64_t>(std::numeric_limits<int32_t>::max()))
    fail(Errc::Overflow, "page table of " + u64s(total) + " indices exceeds int32");
  if (total > capacity) return static_cast<size_t>(total);
  const uint64_t bs = cfg_.block_size;
  int32_t off = 0;
  indptr[0] = 0;
  for (size_t i = 0; i < n_seqs; ++i) {
    const LayerTable &l = find(seq_ids[i]).layers[layer];
    for (int32_t b : l.blocks) indices[off++] = b;
    indptr[i + 1] = off;
    last_page_len[i] =
        l.n_tokens == 0 ? 0 : static_cast<int32_t>(l.n_tokens - (l.blocks.size() - 1) * bs);
  }
  return static_cast<size_t>(total);
}

std::string Pool::check_sequence(uint64_t id, const Sequence &s, std::vector<uint64_t> &refs) const {
  const uint64_t bs = cfg_.block_size;
  if (s.layers.size() != cfg_.num_layers) return "sequence " + u64s(id) + " has wrong layer count";
  for (const LayerTable &l : s.layers) {
    if (l.blocks.size() != (l.n_tokens + bs - 1) / bs)
      return "sequence " + u64s(id) + ": block table size disagrees with token count";
    if (l.positions.size() != l.tail_index || l.tail_pos > s.length ||
        l.n_tokens != l.tail_index + (s.length - l.tail_pos))
      return "sequence " + u64s(id) + ": position bookkeeping inconsistent";
    for (size_t i = 0; i < l.positions.size(); ++i)
      if (l.positions[i] < 0 || static_cast<uint64_t>(l.positions[i]) >= l.tail_pos ||
          (i && l.positions[i] <= l.positions[i - 1]))
        return "sequence " + u64s(id) + ": positions not increasing";
    for (int32_t b : l.blocks) {
      if (b < 0 || static_cast<uint64_t>(b) >= refs.size())
        return "sequence " + u64s(id) + ": invalid block id";
      ++refs[b];
    }
  }
  return {};
}

std::string Pool::check_invariants() const {
  std::shared_lock lk(mu_);
  std::string err = alloc_.check();
  if (!err.empty()) return err;
  std::vector<uint64_t> refs(alloc_.num_blocks(), 0);
  seqs_.for_each([&](uint64_t id, const Sequence &s) {
    if (err.empty()) err = check_sequence(id, s, refs);
  });
  if (!err.empty()) return err;
  for (size_t b = 0; b < refs.size(); ++b) {
    const auto st = alloc_.state(static_cast<int32_t>(b));
    if (refs[b] != alloc_.refcount(static_cast<int32_t>(b)))
      return "block " + u64s(b) + ": reference count " +
             u64s(alloc_.refcount(static_cast<int32_t>(b))) + " but held by " + u64s(refs[b]) +
             " block tables";
    if (refs[b] > 0 && st != BlockAllocator::State::Used)
      return "block " + u64s(b) + " held by a block table but not used";
  }
  return {};
}

}  // namespace kvc::core
