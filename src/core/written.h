// Which token slots of a block arena hold bytes an append wrote (issue:
// "registration only of what was written", "readers never see another
// sequence's old bytes"). One bit per slot, block_size bits per block.
//
// kvc_seq_reserve() clears the bits of the slots it hands out (exclusive pool
// lock); kvc_append() sets them as it writes (shared pool lock: several
// appends of one sequence run at once on different layers, which are
// different blocks, and two appends of the same slots give unspecified data
// but never a crash, so the words are atomics). Copies of a block (copy on
// write, eviction's compaction, aging, restore, tier loads) carry the bits of
// what they copy. Readers (kvc_gather, attention, records) return zeros for
// a slot whose bit is clear.
#pragma once
#include <algorithm>
#include <atomic>
#include <cstdint>
#include <memory>

namespace kvc::core {

class SlotBits {
 public:
  SlotBits() = default;
  SlotBits(uint64_t num_blocks, uint32_t block_size)
      : words_((block_size + 63) / 64), bits_(new std::atomic<uint64_t>[num_blocks * words_]()) {}

  bool test(int32_t b, uint32_t slot) const {
    return (word(b, slot).load(std::memory_order_relaxed) >> (slot % 64)) & 1u;
  }
  // Whether every slot of [slot, slot + n) is written (n >= 1, one block).
  bool all(int32_t b, uint32_t slot, uint64_t n) const {
    for (uint64_t i = 0; i < n;) {
      const uint32_t s = static_cast<uint32_t>(slot + i), bit = s % 64;
      const uint64_t take = std::min<uint64_t>(64 - bit, n - i);
      const uint64_t mask = take == 64 ? ~uint64_t(0) : ((uint64_t(1) << take) - 1) << bit;
      if ((word(b, s).load(std::memory_order_relaxed) & mask) != mask) return false;
      i += take;
    }
    return true;
  }
  void set(int32_t b, uint32_t slot, uint64_t n) { apply(b, slot, n, true); }
  void clear(int32_t b, uint32_t slot, uint64_t n) { apply(b, slot, n, false); }
  // clear() where no other thread can touch block b's bits meanwhile (the
  // exclusive pool lock, or a block no sequence holds yet): a load and a
  // store per word, no locked read-modify-write (each block's bits lie in
  // words of its own, so other blocks' appends are not affected).
  void clear_owned(int32_t b, uint32_t slot, uint64_t n) {
    for (uint64_t i = 0; i < n;) {
      const uint32_t s = static_cast<uint32_t>(slot + i), bit = s % 64;
      const uint64_t take = std::min<uint64_t>(64 - bit, n - i);
      const uint64_t mask = take == 64 ? ~uint64_t(0) : ((uint64_t(1) << take) - 1) << bit;
      std::atomic<uint64_t> &w = word(b, s);
      w.store(w.load(std::memory_order_relaxed) & ~mask, std::memory_order_relaxed);
      i += take;
    }
  }
  void put(int32_t b, uint32_t slot, bool on) { apply(b, slot, 1, on); }
  void copy_block(int32_t dst, int32_t src) {
    for (uint64_t w = 0; w < words_; ++w)
      bits_[dst * words_ + w].store(bits_[src * words_ + w].load(std::memory_order_relaxed),
                                    std::memory_order_relaxed);
  }

 private:
  std::atomic<uint64_t> &word(int32_t b, uint32_t slot) const {
    return bits_[static_cast<uint64_t>(b) * words_ + slot / 64];
  }
  void apply(int32_t b, uint32_t slot, uint64_t n, bool on) {
    for (uint64_t i = 0; i < n;) {
      const uint32_t s = static_cast<uint32_t>(slot + i), bit = s % 64;
      const uint64_t take = std::min<uint64_t>(64 - bit, n - i);
      const uint64_t mask = take == 64 ? ~uint64_t(0) : ((uint64_t(1) << take) - 1) << bit;
      if (on)
        word(b, s).fetch_or(mask, std::memory_order_relaxed);
      else
        word(b, s).fetch_and(~mask, std::memory_order_relaxed);
      i += take;
    }
  }

  uint64_t words_ = 0;
  std::unique_ptr<std::atomic<uint64_t>[]> bits_;
};

}  // namespace kvc::core
