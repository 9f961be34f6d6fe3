// The disk tier: one file per block, `<key hex>.kvct`, in a directory.
// Record: "KVCT", u32 version 1, u32 fingerprint bytes F, u32 0, u64 payload
// bytes P, u64 XXH3-64 of the F + P bytes that follow, the fingerprint, the
// payload (little-endian). Written to `<key hex>.tmp.<pid>.<n>` and renamed.
#include <dirent.h>
#include <signal.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <unistd.h>
#include <xxhash.h>

#include <algorithm>
#include <chrono>
#include <cerrno>
#include <cstdlib>
#include <ctime>
#include <cstring>
#include <iterator>
#include <memory>

#include "common/atomic_file.h"
#include "common/error.h"
#include "tier/checksum.h"
#include "tier/tier.h"

namespace kvc::tier {

namespace {

constexpr char kMagic[4] = {'K', 'V', 'C', 'T'};
constexpr uint32_t kVersion = 1;
constexpr size_t kHeader = 32;
constexpr const char *kExt = ".kvct";

bool parse_hex_key(const std::string &name, BlockKey &k) {
  if (name.size() != 64 + std::strlen(kExt) || name.compare(64, std::string::npos, kExt) != 0)
    return false;
  for (size_t i = 0; i < 32; ++i) {
    int v = 0;
    for (int j = 0; j < 2; ++j) {
      const char c = name[2 * i + j];
      const int d = c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : -1;
      if (d < 0) return false;
      v = v * 16 + d;
    }
    k.b[i] = static_cast<uint8_t>(v);
  }
  return true;
}

bool read_all(int fd, uint8_t *p, size_t n) {
  while (n) {
    const ssize_t r = read(fd, p, n);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) return false;
    p += r, n -= static_cast<size_t>(r);
  }
  return true;
}

// Writes header, fingerprint and payload with as few system calls as the
// kernel allows (writev, continued after a short write).
// A temporary record "<key>.tmp.<pid>.<n>" belongs to a live writer when its
// process exists and the file is recent (a pid can be reused: a file older
// than ten minutes is left over whatever the pid says).
bool writer_alive(const std::string &name, int dfd) {
  const long pid = std::strtol(name.c_str() + 69, nullptr, 10);
  struct stat st;
  if (pid <= 0 || fstatat(dfd, name.c_str(), &st, 0) != 0) return false;
  if (time(nullptr) - st.st_mtime > 600) return false;
  return kill(static_cast<pid_t>(pid), 0) == 0 || errno == EPERM;
}

class DiskTier final : public Tier {
 public:
  DiskTier(std::string dir, uint64_t cap, bool fsync_each, bool nonblocking_open)
      : dir_(std::move(dir)), cap_(cap), fsync_(fsync_each), nonblock_(nonblocking_open) {}
  const char *name() const override { return "disk"; }

  // Scans the directory (see tier.h). False with a reason when it cannot be used.
  bool open_dir(std::string *error) {
    if (mkdir(dir_.c_str(), 0755) != 0 && errno != EEXIST) return fail_open(error, "cannot create");
    DIR *d = opendir(dir_.c_str());
    if (!d) return fail_open(error, "cannot open");
    struct Found {
      BlockKey k;
      uint64_t bytes;
      timespec mtime;
    };
    std::vector<Found> found;
    for (dirent *e; (e = readdir(d)) != nullptr;) {
      const std::string n = e->d_name;
      if (n.size() > 64 && n.compare(64, 5, ".tmp.") == 0) {  // a writer's record before its rename
        if (!writer_alive(n, dirfd(d))) unlinkat(dirfd(d), n.c_str(), 0);
        continue;
      }
      BlockKey k;
      struct stat st;
      if (parse_hex_key(n, k) && fstatat(dirfd(d), n.c_str(), &st, 0) == 0 && S_ISREG(st.st_mode))
        found.push_back({k, static_cast<uint64_t>(st.st_size), st.st_mtim});
    }
    closedir(d);
    std::sort(found.begin(), found.end(), [](const Found &a, const Found &b) {
      return a.mtime.tv_sec != b.mtime.tv_sec ? a.mtime.tv_sec < b.mtime.tv_sec
                                              : a.mtime.tv_nsec < b.mtime.tv_nsec;
    });
    std::unique_lock lk(mu_);
    // Oldest first: the newest ends at the front. Never refreshed by this
    // process yet: the first read sets the file's time.
    for (const Found &f : found) index(f.k, f.bytes, {});
    while (st_.bytes > cap_ && !lru_.empty()) {
      remove_file(lru_.back());
      ++st_.evictions;
    }
    return true;
  }

  bool put(const BlockKey &key, const std::vector<uint8_t> &fp, const uint8_t *payload,
           size_t n) override {
    std::unique_lock lk(mu_);
    // Sizes compared without wrapping (n may be anything a caller passes).
    if (n > cap_ || kHeader + fp.size() > cap_ - n)
      return error("a block record of " + std::to_string(n) + " + " +
                   std::to_string(kHeader + fp.size()) + " bytes is larger than the tier (" +
                   std::to_string(cap_) + ")");
    const uint64_t total = kHeader + fp.size() + n;
    auto old = map_.find(key);
    const uint32_t pins = old == map_.end() ? 0 : old->second.pins;
    const uint64_t pinned_other = pinned_bytes_ - (pins ? old->second.bytes : 0);
    // Records read from other processes may have pushed the pinned bytes past
    // the capacity: no room then. Checked first: a refused put changes nothing.
    if (pinned_other > cap_ || total > cap_ - pinned_other)
      return error("no room for a block record of " + std::to_string(total) +
                   " bytes: " + std::to_string(pinned_other) + " of the tier's " +
                   std::to_string(cap_) + " bytes are pinned");
    uint8_t h[kHeader] = {};
    std::memcpy(h, kMagic, 4);
    const uint32_t v = kVersion, f = static_cast<uint32_t>(fp.size());
    const uint64_t p = n;
    std::memcpy(h + 4, &v, 4);
    std::memcpy(h + 8, &f, 4);
    std::memcpy(h + 16, &p, 8);
    uint64_t sum;
    try {
      sum = xxh3_pair(fp.data(), fp.size(), payload, n);
    } catch (const std::bad_alloc &) {
      return error("out of memory");
    }
    std::memcpy(h + 24, &sum, 8);

    // Written to "<key hex>.tmp.<pid>.<n>" (what the directory scan of another
    // process recognises as a writer's record) and renamed; with FSYNC the record
    // is flushed before the rename and the directory after it (the rename too
    // survives a power loss).
    const std::string path = path_of(key);
    try {
      AtomicFile f(path, AtomicFile::Options{fsync_, fsync_}, dir_ + "/" + key.hex());
      const iovec iv[3] = {{h, kHeader},
                           {const_cast<uint8_t *>(fp.data()), fp.size()},
                           {const_cast<uint8_t *>(payload), n}};
      f.write_vec(iv, 3);
      f.commit();
    } catch (const Error &e) {
      return error(e.what());
    } catch (const std::bad_alloc &) {
      return error("out of memory");
    }
    unindex(key);
    index(key, total, std::chrono::steady_clock::now());  // its time: just written
    if (pins) {                                           // a rewrite keeps its pins
      map_[key].pins = pins;
      pinned_bytes_ += total;
    }
    ++st_.puts;
    while (st_.bytes > cap_) {  // the oldest unpinned record other than this one
      auto victim = lru_.end();
      for (auto it = lru_.end(); it != lru_.begin();) {
        --it;
        if (!map_.at(*it).pins && !(*it == key)) {
          victim = it;
          break;
        }
      }
      if (victim == lru_.end()) break;  // only pinned records (of other processes' sizes) left
      remove_file(*victim);
      ++st_.evictions;
    }
    return true;
  }

  bool get(const BlockKey &key, const std::vector<uint8_t> &fp,
           std::vector<uint8_t> &out) override {
    std::unique_lock lk(mu_);
    const std::string path = path_of(key);
    // A pool's tier opens blocking: a record that does not answer (a FIFO
    // nobody writes, a hung network mount) blocks its loader thread, and the
    // pool's load timeout (kvc_pool_set_offload) answers the caller. A store
    // (no loader, no timeout) opens with O_NONBLOCK: a FIFO opens at once and
    // is refused below as not a regular file (regular files ignore the flag).
    const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | (nonblock_ ? O_NONBLOCK : 0));
    if (fd < 0) {  // absent (perhaps removed by another process)
      unindex(key);
      ++st_.misses;
      return false;
    }
    // The header and a fingerprint of the reader's size in one read, then the
    // payload straight into `out` in pieces, each hashed while still in cache
    // (out's capacity is reused: no second copy, no allocation in steady state).
    std::vector<uint8_t> head;
    struct stat st;
    std::string why;
    uint64_t total = 0, sum = 0;
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode) ||
        static_cast<uint64_t>(st.st_size) < kHeader + fp.size()) {
      why = "cannot be read (not a regular file, or shorter than a header)";
    } else if (static_cast<uint64_t>(st.st_size) >
               cap_) {  // put never writes one: damaged or foreign
      why = "is larger than the tier's capacity";
    } else {
      total = static_cast<uint64_t>(st.st_size);
      try {
        head.resize(kHeader + fp.size());
        if (!hash_) hash_ = std::make_unique<Xxh3Stream>();
      } catch (const std::bad_alloc &) {
        why = "does not fit in memory";
      }
    }
    if (why.empty() && !read_all(fd, head.data(), head.size())) why = "cannot be read";
    if (why.empty()) why = check_header(head.data(), total);
    if (why.empty()) {
      uint32_t f;
      std::memcpy(&f, head.data() + 8, 4);
      std::memcpy(&sum, head.data() + 24, 8);
      if (f != fp.size() || std::memcmp(head.data() + kHeader, fp.data(), fp.size()) != 0)
        why = "was written by a pool of another configuration (fingerprint)";
    }
    // The payload's room only once the header is ours: a large foreign or
    // damaged file costs no memory.
    if (why.empty()) {
      try {
        out.resize(total - kHeader - fp.size());
      } catch (const std::bad_alloc &) {
        why = "does not fit in memory";
      }
    }
    if (why.empty()) {
      hash_->reset();
      hash_->update(head.data() + kHeader, fp.size());
      constexpr size_t kPiece = 256 << 10;
      for (size_t off = 0; why.empty() && off < out.size(); off += kPiece) {
        const size_t n = std::min(kPiece, out.size() - off);
        if (!read_all(fd, out.data() + off, n))
          why = "cannot be read";
        else
          hash_->update(out.data() + off, n);
      }
      if (why.empty() && hash_->digest() != sum) why = "fails its checksum";
    }
    ::close(fd);
    if (!why.empty()) {  // refused and removed, never served
      out.clear();
      remove_file(key);
      ++st_.misses;
      ++st_.errors;
      err_ = "block record " + path + " " + why + ": removed";
      return false;
    }
    auto it = map_.find(key);
    if (it == map_.end()) {   // written by another process: indexed, within the capacity
      index(key, total, {});  // written by another process: its time is refreshed below
      it = map_.find(key);
      while (st_.bytes > cap_) {
        auto victim = std::prev(lru_.end());
        while (victim != lru_.begin() && (map_.at(*victim).pins || *victim == key)) --victim;
        if (map_.at(*victim).pins || *victim == key) break;  // everything else pinned
        remove_file(*victim);
        ++st_.evictions;
      }
      it = map_.find(key);
    } else {
      lru_.splice(lru_.begin(), lru_, it->second.pos);
    }
    // Recency survives a restart through the file's modification time; it is
    // refreshed at most once a second per record (a metadata write each read
    // would cost more than the read), always at its first read in a process.
    const auto now = std::chrono::steady_clock::now();
    if (it->second.touched == std::chrono::steady_clock::time_point{} ||
        now - it->second.touched > std::chrono::seconds(1)) {
      utimensat(AT_FDCWD, path.c_str(), nullptr, 0);
      it->second.touched = now;
    }
    ++st_.hits;
    return true;
  }

  bool contains(const BlockKey &key) override {
    std::unique_lock lk(mu_);
    return access(path_of(key).c_str(), F_OK) == 0;
  }
  bool erase(const BlockKey &key) override {
    std::unique_lock lk(mu_);
    const bool had = access(path_of(key).c_str(), F_OK) == 0;
    remove_file(key);
    return had;
  }
  // Pins hold in this process (another process sharing the directory may
  // still remove the file; a load then misses).
  bool pin(const BlockKey &key) override {
    std::unique_lock lk(mu_);
    auto it = map_.find(key);
    if (it == map_.end()) return false;
    if (it->second.pins++ == 0) pinned_bytes_ += it->second.bytes;
    return true;
  }
  uint32_t pins(const BlockKey &key) const override {
    std::unique_lock lk(mu_);
    auto it = map_.find(key);
    return it == map_.end() ? 0 : it->second.pins;
  }
  bool unpin(const BlockKey &key) override {
    std::unique_lock lk(mu_);
    auto it = map_.find(key);
    if (it == map_.end() || it->second.pins == 0) return false;
    if (--it->second.pins == 0) pinned_bytes_ -= it->second.bytes;
    return true;
  }
  Stats stats() const override {
    std::unique_lock lk(mu_);
    return st_;
  }
  std::string last_error() const override {
    std::unique_lock lk(mu_);
    return err_;
  }

 private:
  struct Entry {
    uint64_t bytes;
    std::list<BlockKey>::iterator pos;
    uint32_t pins = 0;
    std::chrono::steady_clock::time_point touched{};  // last modification-time refresh
  };
  std::string path_of(const BlockKey &k) const { return dir_ + "/" + k.hex() + kExt; }
  bool fail_open(std::string *error, const char *what) {
    if (error)
      *error = std::string(what) + " the disk tier directory " + dir_ + ": " + std::strerror(errno);
    return false;
  }
  bool error(const std::string &why) {
    ++st_.errors;
    err_ = why;
    return false;
  }
  // "" when a header says: this format, and sizes that add up to the file's.
  static std::string check_header(const uint8_t *h, uint64_t file_size) {
    if (std::memcmp(h, kMagic, 4) != 0) return "is not a block record";
    uint32_t v, f;
    uint64_t p;
    std::memcpy(&v, h + 4, 4);
    std::memcpy(&f, h + 8, 4);
    std::memcpy(&p, h + 16, 8);
    if (v != kVersion) return "has format version " + std::to_string(v);
    if (p > file_size || kHeader + static_cast<uint64_t>(f) + p != file_size)
      return "has the wrong size (truncated?)";
    return "";
  }
  void index(const BlockKey &k, uint64_t bytes, std::chrono::steady_clock::time_point touched) {
    lru_.push_front(k);
    map_[k] = Entry{bytes, lru_.begin(), 0, touched};
    st_.bytes += bytes;
    ++st_.entries;
  }
  void unindex(const BlockKey &k) {
    auto it = map_.find(k);
    if (it == map_.end()) return;
    st_.bytes -= it->second.bytes;
    if (it->second.pins) pinned_bytes_ -= it->second.bytes;
    --st_.entries;
    lru_.erase(it->second.pos);
    map_.erase(it);
  }
  void remove_file(const BlockKey &k) {
    const BlockKey copy = k;  // k may refer into lru_
    unlink(path_of(copy).c_str());
    unindex(copy);
  }

  const std::string dir_;
  const uint64_t cap_;
  const bool fsync_;
  const bool nonblock_;  // records opened with O_NONBLOCK (stores: a FIFO never blocks)
  mutable std::mutex mu_;
  std::unordered_map<BlockKey, Entry, BlockKeyHash> map_;
  std::list<BlockKey> lru_;
  Stats st_;
  std::unique_ptr<Xxh3Stream> hash_;  // reads' checksum state (under mu_)
  uint64_t pinned_bytes_ = 0;         // bytes of entries with pins > 0
  std::string err_;
};

}  // namespace

std::unique_ptr<Tier> make_disk_tier(const std::string &dir, uint64_t capacity_bytes,
                                     bool fsync_each, std::string *error, bool nonblocking_open) {
  auto t = std::make_unique<DiskTier>(dir, capacity_bytes, fsync_each, nonblocking_open);
  if (!t->open_dir(error)) return nullptr;
  return t;
}

}  // namespace kvc::tier
