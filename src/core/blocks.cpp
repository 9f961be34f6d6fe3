// A pool's shared state (core/pool_int.h): construction, sequences by id,
// block life (take, release, copy-on-write), usage, written-slot bits.
#include <algorithm>
#include <cstring>

#include "common/error.h"
#include "common/scratch.h"
#include "core/pool_int.h"

namespace kvc::core {

namespace {
// Per-thread scratch rows (common/scratch.h): grown on demand, so steady-state
// appends allocate nothing; large ones are released when the API call returns.
thread_local ScratchBuffer<float> t_scratch_row, t_scratch_input;
}  // namespace

float *scratch_f32(uint64_t n) {
  return t_scratch_row.get(n);
}
float *scratch_input(uint64_t n) {
  return t_scratch_input.get(n);
}

namespace {
// (A plain flag: an append that uses no scratch touches no buffer, so
// registers none with its thread.)
thread_local bool t_append_busy = false;
thread_local ScratchBuffer<float> t_append_f32;
thread_local ScratchBuffer<uint16_t> t_append_keys[2];
}  // namespace

struct InputScratch::Own {
  std::vector<float> f;
  std::vector<uint16_t> keys[2];
};

InputScratch::InputScratch() {
  if (t_append_busy)
    own_ = std::make_unique<Own>();
  else
    t_append_busy = true;
}

InputScratch::~InputScratch() {
  if (own_) return;
  t_append_busy = false;
  if (held_[0]) t_append_f32.hold(false);
  if (held_[1]) t_append_keys[0].hold(false);
  if (held_[2]) t_append_keys[1].hold(false);
}

float *InputScratch::floats(uint64_t n) {
  if (!own_) {
    held_[0] = true;
    t_append_f32.hold(true);
    return t_append_f32.get(n);
  }
  if (own_->f.size() < n) own_->f.resize(static_cast<size_t>(n));
  return own_->f.data();
}

uint16_t *InputScratch::keys(int kv, uint64_t n) {
  if (!own_) {
    held_[1 + kv] = true;
    t_append_keys[kv].hold(true);
    return t_append_keys[kv].get(n);
  }
  if (own_->keys[kv].size() < n) own_->keys[kv].resize(static_cast<size_t>(n));
  return own_->keys[kv].data();
}

PoolCore::PoolCore(const PoolConfig &validated)
    : cfg_(validated),
      fmt_(cfg_),
      block_stride_(fmt_.cls[0].stride),
      arena_bytes_(fmt_.arena_bytes),
      alloc_([this] {
        std::vector<uint32_t> n;
        for (const FormatClass &k : fmt_.cls) n.push_back(k.blocks);
        return n;
      }()),
      written_(cfg_.num_blocks, cfg_.block_size),
      stage_(*this, cfg_) {
  store_ = cfg_.device == Device::CUDA ? make_cuda_store(*this) : make_cpu_store(*this);
  arena_ = store_->arena();
  spare_seqs_.reserve(kSpareSequences);  // (retire_sequence never allocates)
}

PoolCore::~PoolCore() = default;

void PoolCore::zero_block(int32_t b) {
  store_->zero(b);
}

void PoolCore::copy_block(int32_t dst, int32_t src) {
  written_.copy_block(dst, src);
  store_->copy(dst, src);
}

Sequence &PoolCore::find(uint64_t id) {
  Sequence *s = seqs_.find(id);
  if (!s) fail(Errc::SeqNotFound, "sequence " + u64s(id) + " does not exist");
  return *s;
}

const Sequence &PoolCore::find(uint64_t id) const {
  return const_cast<PoolCore *>(this)->find(id);
}

void PoolCore::check_layer(uint32_t layer) const {
  if (layer >= cfg_.num_layers)
    fail(Errc::OutOfRange,
         "layer " + u64s(layer) + ": the pool has " + u64s(cfg_.num_layers) + " layers");
}

uint64_t PoolCore::bytes_in_use() const {
  uint64_t b = static_cast<uint64_t>(stage_.alloc.num_used()) * stage_.stride;
  for (uint32_t c = 0; c < alloc_.num_classes(); ++c)  // used and cached blocks
    b += (static_cast<uint64_t>(alloc_.used(c)) + alloc_.cached(c)) * fmt_.cls[c].stride;
  return b;
}

std::string PoolCore::class_detail(const Need &need, bool total) const {
  if (alloc_.num_classes() == 1) return "";
  std::string m = " (per-layer formats:";
  for (uint32_t c = 0; c < alloc_.num_classes(); ++c)
    m += std::string(c ? "; " : " ") + "format " + u64s(c) + " of " + u64s(fmt_.cls[c].layers) +
         " layers needs " + u64s(need.n[c]) + ", " +
         u64s(total ? alloc_.blocks(c) : alloc_.available(c)) + (total ? " in all" : " available");
  return m + ")";
}

void PoolCore::note_usage() {
  peak_bytes_ = std::max(peak_bytes_, bytes_in_use());
}

int32_t PoolCore::take_block(uint32_t c) {
  int32_t reclaimed;
  const int32_t b = alloc_.allocate(c, &reclaimed);
  if (b < 0) fail(Errc::Internal, "block allocator empty after an availability check");
  if (reclaimed >= 0) {
    if (events_) events_->reclaimed(reclaimed);       // a cached block leaves the prefix index
    if (cfg_.flags & kFlagZeroOnFree) zero_block(b);  // no tenant's K/V lingers
  }
  written_.clear_owned(b, 0, cfg_.block_size);  // a new owner has written nothing yet
  // device kernels and copies read whole blocks: none of an earlier owner's bytes
  store_->taken(b);
  return b;
}

void PoolCore::release_block(int32_t b) {
  const bool reg = registered(b);
  if (alloc_.release(b, /*keep_cached=*/reg) && (cfg_.flags & kFlagZeroOnFree)) zero_block(b);
  if (reg && alloc_.state(b) == BlockAllocator::State::Cached) events_->cached(b);
}

int32_t PoolCore::cow_copy(int32_t b) {
  const int32_t nb = take_block(alloc_.class_of(b));
  copy_block(nb, b);
  release_block(b);
  return nb;
}

void PoolCore::mark_written(const LayerTable &l, uint64_t idx0, uint64_t n, bool written) {
  for_runs(l, idx0, n, [&](bool res, int32_t b, uint32_t slot, uint64_t run, uint64_t) {
    SlotBits &bits = res ? stage_.written : written_;
    if (written)
      bits.set(b, slot, run);
    else
      bits.clear(b, slot, run);
  });
}

uint64_t PoolCore::first_unwritten(const LayerTable &l, uint64_t idx0, uint64_t n) const {
  uint64_t first = UINT64_MAX;
  for_runs(l, idx0, n, [&](bool res, int32_t b, uint32_t slot, uint64_t run, uint64_t done) {
    const SlotBits &bits = res ? stage_.written : written_;
    if (first != UINT64_MAX || bits.all(b, slot, run)) return;
    for (uint64_t i = 0; i < run; ++i)
      if (!bits.test(b, static_cast<uint32_t>(slot + i))) {
        first = idx0 + done + i;
        return;
      }
  });
  return first;
}

void PoolCore::zero_unwritten_rows(bool residual, int32_t b, uint32_t slot, uint64_t run,
                                   uint8_t *k_out, uint8_t *v_out, uint64_t row_bytes) const {
  const SlotBits &bits = residual ? stage_.written : written_;
  if (bits.all(b, slot, run)) return;
  for (uint64_t i = 0; i < run; ++i)
    if (!bits.test(b, static_cast<uint32_t>(slot + i))) {
      if (k_out) std::memset(k_out + i * row_bytes, 0, row_bytes);
      if (v_out) std::memset(v_out + i * row_bytes, 0, row_bytes);
    }
}

}  // namespace kvc::core
