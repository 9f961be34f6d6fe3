// Per-thread scratch buffers. A buffer grows on demand, so calls of a steady
// size allocate nothing; when a C API call returns, every buffer of its
// thread above scratch_keep_bytes() (64 MiB) is released, so one large call
// (a long prefill, a big kvc_quantize) does not pin its scratch to the
// thread for the thread's life.
#pragma once
#include <cstddef>
#include <cstdint>
#include <vector>

namespace kvc {

// Registry of the calling thread's buffers (internal to ScratchBuffer).
void register_scratch(void *buffer, void (*trim)(void *buffer, size_t keep),
                      size_t (*bytes)(const void *buffer));
void unregister_scratch(void *buffer) noexcept;

// Set when a buffer of the thread grows above scratch_keep_bytes().
inline thread_local bool t_scratch_large = false;
void trim_thread_scratch_slow() noexcept;
// Releases every buffer of the calling thread holding more than
// scratch_keep_bytes(). Called as each C API call returns (a flag test
// unless a buffer grew that large). Never throws.
inline void trim_thread_scratch() noexcept {
  if (t_scratch_large) trim_thread_scratch_slow();
}
// Bytes the calling thread's buffers hold (capacity).
size_t thread_scratch_bytes() noexcept;
// The size above which a buffer is released; tests lower it.
size_t scratch_keep_bytes() noexcept;
void set_scratch_keep_bytes(size_t bytes) noexcept;

// A thread_local vector of T that registers itself with its thread.
template <typename T>
class ScratchBuffer {
 public:
  ScratchBuffer() { register_scratch(this, &trim_fn, &bytes_fn); }
  ~ScratchBuffer() { unregister_scratch(this); }
  ScratchBuffer(const ScratchBuffer &) = delete;
  ScratchBuffer &operator=(const ScratchBuffer &) = delete;

  // At least n elements (contents of a grown buffer are not kept). May throw bad_alloc.
  T *get(uint64_t n) {
    if (v_.size() < n) {
      v_.resize(static_cast<size_t>(n));
      if (v_.capacity() * sizeof(T) > scratch_keep_bytes()) t_scratch_large = true;
    }
    return v_.data();
  }
  // A held buffer is in use across calls that may return through the C API
  // meanwhile (core::InputScratch): trim_thread_scratch() leaves it (and
  // keeps the thread's flag set, so the call that holds it releases it).
  void hold(bool on) { held_ = on; }
  bool held() const { return held_; }

 private:
  static void trim_fn(void *self, size_t keep) {
    auto *b = static_cast<ScratchBuffer *>(self);
    if (b->v_.capacity() * sizeof(T) <= keep) return;
    if (b->held_) {
      t_scratch_large = true;
      return;
    }
    std::vector<T>().swap(b->v_);
  }
  static size_t bytes_fn(const void *self) {
    return static_cast<const ScratchBuffer *>(self)->v_.capacity() * sizeof(T);
  }
  std::vector<T> v_;
  bool held_ = false;
};

}  // namespace kvc
