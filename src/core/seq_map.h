// Map from the caller's 64-bit sequence id to its Sequence: open addressing
// with linear probing over a power-of-two table (a mask instead of the
// division std::unordered_map pays per lookup), backward-shift deletion (no
// tombstones), and a splitmix64 hash so adversarial or sequential ids spread.
#pragma once
#include <cstdint>
#include <memory>
#include <vector>

namespace kvc::core {

template <typename V>
class SeqMap {
 public:
  SeqMap() : slots_(16) {}

  size_t size() const { return size_; }

  V *find(uint64_t key) const {
    const size_t mask = slots_.size() - 1;
    for (size_t i = hash(key) & mask;; i = (i + 1) & mask) {
      const Slot &s = slots_[i];
      if (!s.value) return nullptr;
      if (s.key == key) return s.value.get();
    }
  }

  // Inserts a new key (the caller checked it is absent) and gives the value
  // a new stamp (V::stamp). May throw bad_alloc before anything changes.
  V *insert(uint64_t key, std::unique_ptr<V> value) {
    if ((size_ + 1) * 4 > slots_.size() * 3) grow();
    V *raw = value.get();
    raw->stamp = new_stamp();
    place(slots_, key, std::move(value));
    ++size_;
    return raw;
  }

  // A value never given before: stamps tell a value apart from one that
  // replaced it (or that it became) under the same key.
  uint64_t new_stamp() { return ++stamps_; }

  // Removes a key; returns false when absent.
  bool erase(uint64_t key) { return take(key) != nullptr; }

  // Removes a key and hands its value back (null when absent).
  std::unique_ptr<V> take(uint64_t key) {
    const size_t mask = slots_.size() - 1;
    size_t i = hash(key) & mask;
    for (;; i = (i + 1) & mask) {
      if (!slots_[i].value) return nullptr;
      if (slots_[i].key == key) break;
    }
    std::unique_ptr<V> gone = std::move(slots_[i].value);
    // Backward-shift the following cluster so lookups never stop early.
    for (size_t j = (i + 1) & mask; slots_[j].value; j = (j + 1) & mask) {
      const size_t home = hash(slots_[j].key) & mask;
      // Move slot j into the hole i when its home is not in (i, j].
      if (((j - home) & mask) >= ((j - i) & mask)) {
        slots_[i] = std::move(slots_[j]);
        i = j;
      }
    }
    --size_;
    return gone;
  }

  template <typename F>
  void for_each(F &&f) const {
    for (const Slot &s : slots_)
      if (s.value) f(s.key, *s.value);
  }

 private:
  struct Slot {
    uint64_t key = 0;
    std::unique_ptr<V> value;
  };

  static uint64_t hash(uint64_t x) {
    x += 0x9e3779b97f4a7c15ull;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
  }

  static void place(std::vector<Slot> &t, uint64_t key, std::unique_ptr<V> value) {
    const size_t mask = t.size() - 1;
    size_t i = hash(key) & mask;
    while (t[i].value) i = (i + 1) & mask;
    t[i].key = key;
    t[i].value = std::move(value);
  }

  void grow() {
    std::vector<Slot> bigger(slots_.size() * 2);  // may throw: nothing changed
    for (Slot &s : slots_)
      if (s.value) place(bigger, s.key, std::move(s.value));
    slots_.swap(bigger);
  }

  std::vector<Slot> slots_;
  size_t size_ = 0;
  uint64_t stamps_ = 0;
};

}  // namespace kvc::core
