#include "common/scratch.h"

#include <algorithm>
#include <atomic>

namespace kvc {
namespace {

struct Entry {
  void *buffer;
  void (*trim)(void *, size_t);
  size_t (*bytes)(const void *);
};

// Function-local, so it is made by the first buffer's constructor and
// therefore destroyed after every buffer of the thread.
std::vector<Entry> &entries() {
  thread_local std::vector<Entry> e;
  return e;
}

std::atomic<size_t> g_keep{size_t(64) << 20};

}  // namespace

void register_scratch(void *buffer, void (*trim)(void *, size_t), size_t (*bytes)(const void *)) {
  entries().push_back({buffer, trim, bytes});
}

void unregister_scratch(void *buffer) noexcept {
  auto &e = entries();
  e.erase(std::remove_if(e.begin(), e.end(), [&](const Entry &x) { return x.buffer == buffer; }),
          e.end());
}

void trim_thread_scratch_slow() noexcept {
  t_scratch_large = false;
  const size_t keep = g_keep.load(std::memory_order_relaxed);
  for (const Entry &x : entries()) x.trim(x.buffer, keep);
}

size_t thread_scratch_bytes() noexcept {
  size_t n = 0;
  for (const Entry &x : entries()) n += x.bytes(x.buffer);
  return n;
}

size_t scratch_keep_bytes() noexcept {
  return g_keep.load(std::memory_order_relaxed);
}
void set_scratch_keep_bytes(size_t bytes) noexcept {
  g_keep.store(bytes, std::memory_order_relaxed);
}

}  // namespace kvc
