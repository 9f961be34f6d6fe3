#include "common/atomic_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <utility>

#include "common/error.h"

namespace kvc {

namespace {
[[noreturn]] void fail_io(const std::string &what, const std::string &path, int err) {
  fail(Errc::Io, what + " " + path + ": " + std::strerror(err));
}
}  // namespace

AtomicFile::AtomicFile(std::string path, Options opt, const std::string &tmp_stem)
    : path_(std::move(path)), opt_(opt) {
  static std::atomic<uint64_t> counter{0};
  tmp_ = (tmp_stem.empty() ? path_ : tmp_stem) + ".tmp." + std::to_string(getpid()) + "." +
         std::to_string(counter++);
  fd_ = open(tmp_.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
  if (fd_ < 0) fail_io("cannot create", tmp_, errno);
}

AtomicFile::~AtomicFile() {
  if (fd_ >= 0) close(fd_);
  if (!committed_) unlink(tmp_.c_str());
}

void AtomicFile::write_all(const uint8_t *data, size_t size) {
  size_t done = 0;
  while (done < size) {
    const ssize_t w = ::write(fd_, data + done, size - done);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) fail_io("cannot write", tmp_, w < 0 ? errno : ENOSPC);
    done += static_cast<size_t>(w);
  }
}

void AtomicFile::write_vec(const iovec *in, int n) {
  std::vector<iovec> iv(in, in + n);
  int first = 0;
  while (first < n) {
    const ssize_t w = writev(fd_, iv.data() + first, n - first);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) fail_io("cannot write", tmp_, w < 0 ? errno : ENOSPC);
    size_t left = static_cast<size_t>(w);
    while (first < n && left >= iv[first].iov_len) left -= iv[first++].iov_len;
    if (first < n) {
      iv[first].iov_base = static_cast<uint8_t *>(iv[first].iov_base) + left;
      iv[first].iov_len -= left;
    }
  }
}

void AtomicFile::write_at(uint64_t off, const uint8_t *data, size_t size) {
  size_t done = 0;
  while (done < size) {
    const ssize_t w = pwrite(fd_, data + done, size - done, static_cast<off_t>(off + done));
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) fail_io("cannot write", tmp_, w < 0 ? errno : ENOSPC);
    done += static_cast<size_t>(w);
  }
}

void AtomicFile::commit() {
  if (opt_.fsync_file && fsync(fd_) != 0) fail_io("cannot flush", tmp_, errno);
  const int fd = fd_;
  fd_ = -1;
  if (close(fd) != 0) fail_io("cannot close", tmp_, errno);
  if (rename(tmp_.c_str(), path_.c_str()) != 0)
    fail_io("cannot rename the record to", path_, errno);
  committed_ = true;
  if (!opt_.fsync_dir) return;
  const size_t slash = path_.find_last_of('/');
  const std::string dir = slash == std::string::npos ? "."
                          : slash == 0               ? "/"
                                                     : path_.substr(0, slash);
  const int dfd = open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dfd >= 0) {
    fsync(dfd);
    close(dfd);
  }
}

std::vector<uint8_t> read_whole_file(const std::string &path) {
  // O_NONBLOCK: opening a FIFO does not wait for a writer (it is refused below).
  const int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) fail_io("cannot open", path, errno);
  struct stat st;
  if (fstat(fd, &st) != 0) {
    const int err = errno;
    close(fd);
    fail_io("cannot read", path, err);
  }
  if (!S_ISREG(st.st_mode)) {
    close(fd);
    fail_io("cannot read", path, S_ISDIR(st.st_mode) ? EISDIR : EINVAL);
  }
  std::vector<uint8_t> b;
  try {
    b.resize(static_cast<size_t>(st.st_size));
  } catch (...) {
    close(fd);
    throw;
  }
  size_t done = 0;
  while (done < b.size()) {
    const ssize_t r = read(fd, b.data() + done, b.size() - done);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) {
      const int err = r < 0 ? errno : EIO;
      close(fd);
      fail_io("cannot read", path, err);
    }
    done += static_cast<size_t>(r);
  }
  close(fd);
  return b;
}

}  // namespace kvc
