// Sequence records (docs/tiers.md, "Sequence records") into a caller's
// buffer or a file (core/state.cpp; Pool::seq_save streams them).
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>

#include "core/types.h"

namespace kvc::core {

class Pool;

// A record written straight into the caller's buffer (begin() refuses one
// that does not fit: the caller learns the size).
class BufferSink final : public RecordSink {
 public:
  BufferSink(uint8_t *buf, size_t capacity) : buf_(buf), cap_(capacity) {}
  bool begin(uint64_t total) override { return buf_ && total <= cap_; }
  void write(const uint8_t *p, uint64_t n) override;
  void finish(uint64_t checksum) override;

 private:
  uint8_t *buf_;
  size_t cap_, at_ = 0;
};

// kvc_seq_save_file: the record written atomically (temporary file, fsync,
// rename, fsync of the folder), streamed through a 1 MiB buffer. Throws
// Error(Io) and whatever seq_save throws; the file is unchanged then.
void save_file(const Pool &pool, uint64_t id, const std::string &path);
// kvc_seq_restore_file: reads the whole file and restores it.
void restore_file(Pool &pool, uint64_t id, const std::string &path);

}  // namespace kvc::core
