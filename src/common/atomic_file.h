// A file written atomically: a temporary file in the same folder, written
// piece by piece, then (optionally) flushed, renamed over the target and the
// folder flushed. Until commit() succeeds the target is unchanged; a failure,
// or a destruction without commit, removes the temporary file. Used by the
// sequence-record files (kvc_seq_save_file) and the disk tier's records.
#pragma once
#include <sys/uio.h>

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace kvc {

class AtomicFile {
 public:
  struct Options {
    bool fsync_file = true;  // fsync before the rename (survives power loss)
    // fsync the folder after the rename (the rename itself reaches the disk)
    bool fsync_dir = true;
  };
  // Creates "<tmp_stem>.tmp.<pid>.<n>" (tmp_stem: `path` when empty; n counts
  // per process), exclusively. Throws Error(Io) "cannot create <tmp>: <why>".
  AtomicFile(std::string path, Options opt, const std::string &tmp_stem = {});
  ~AtomicFile();
  AtomicFile(const AtomicFile &) = delete;
  AtomicFile &operator=(const AtomicFile &) = delete;

  // Appends bytes (continued after a short write). Throws Error(Io).
  void write_all(const uint8_t *data, size_t size);
  // Appends the ranges in order with as few system calls as the kernel allows.
  void write_vec(const iovec *iv, int n);
  // Writes at an absolute offset (e.g. a checksum after the body).
  void write_at(uint64_t off, const uint8_t *data, size_t size);
  // Flushes, closes and renames over the target. Throws Error(Io); the
  // target is unchanged then.
  void commit();

 private:
  std::string path_, tmp_;
  Options opt_;
  int fd_ = -1;
  bool committed_ = false;
};

// The whole content of a regular file. Throws Error(Io) "cannot open|read <path>: <why>".
std::vector<uint8_t> read_whole_file(const std::string &path);

}  // namespace kvc
