// The disk tier: one file per block, `<key hex>.kvct`, in a directory.
// Record: "KVCT", u32 version 1, u32 fingerprint bytes F, u32 0, u64 payload
// bytes P, u64 XXH3-64 of the F + P bytes that follow, the fingerprint, the
// payload (little-endian). Written to `<key hex>.tmp.<pid>.<n>` and renamed.
#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <iterator>

#include "tier/tier.h"

namespace kvc::tier {

namespace {

constexpr char kMagic[4] = {'K', 'V', 'C', 'T'};
constexpr uint32_t kVersion = 1;
constexpr size_t kHeader = 32;
constexpr const char *kExt = ".kvct";

bool parse_hex_key(const std::string &name, Key &k) {
  if (name.size() != 64 + std::strlen(kExt) || name.compare(64, std::string::npos, kExt) != 0) return false;
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

bool write_all(int fd, const uint8_t *p, size_t n) {
  while (n) {
    const ssize_t w = write(fd, p, n);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) {
      if (w == 0) errno = ENOSPC;
      return false;
    }
    p += w, n -= static_cast<size_t>(w);
  }
  return true;
}

class DiskTier final : public Tier {
 public:
  DiskTier(std::string dir, uint64_t cap, bool fsync_each) : dir_(std::move(dir)), cap_(cap), fsync_(fsync_each) {}
  const char *name() const override { return "disk"; }

  // Scans the directory (see tier.h). False with a reason when it cannot be used.
  bool open_dir(std::string *error) {
    if (mkdir(dir_.c_str(), 0755) != 0 && errno != EEXIST) return fail_open(error, "cannot create");
    DIR *d = opendir(dir_.c_str());
    if (!d) return fail_open(error, "cannot open");
    struct Found {
      Key k;
      uint64_t bytes;
      timespec mtime;
    };
    std::vector<Found> found;
    for (dirent *e; (e = readdir(d)) != nullptr;) {
      const std::string n = e->d_name;
      if (n.size() > 64 && n.compare(64, 5, ".tmp.") == 0) {  // a writer that died before its rename
        unlinkat(dirfd(d), n.c_str(), 0);
        continue;
      }
      Key k;
      struct stat st;
      if (parse_hex_key(n, k) && fstatat(dirfd(d), n.c_str(), &st, 0) == 0 && S_ISREG(st.st_mode))
        found.push_back({k, static_cast<uint64_t>(st.st_size), st.st_mtim});
    }
    closedir(d);
    std::sort(found.begin(), found.end(), [](const Found &a, const Found &b) {
      return a.mtime.tv_sec != b.mtime.tv_sec ? a.mtime.tv_sec < b.mtime.tv_sec : a.mtime.tv_nsec < b.mtime.tv_nsec;
    });
    std::unique_lock lk(mu_);
    for (const Found &f : found) index(f.k, f.bytes);  // oldest first: newest ends at the front
    while (st_.bytes > cap_ && !lru_.empty()) {
      remove_file(lru_.back());
      ++st_.evictions;
    }
    return true;
  }

  bool put(const Key &key, const std::vector<uint8_t> &fp, const uint8_t *payload, size_t n) override {
    const uint64_t total = kHeader + fp.size() + n;
    std::unique_lock lk(mu_);
    if (total > cap_) return error("a block record of " + std::to_string(total) + " bytes is larger than the tier (" +
                                   std::to_string(cap_) + ")");
    auto old = map_.find(key);
    const uint32_t pins = old == map_.end() ? 0 : old->second.pins;
    const uint64_t pinned_other = pinned_bytes_ - (pins ? old->second.bytes : 0);
    if (total > cap_ - pinned_other)  // checked first: a refused put changes nothing
      return error("no room for a block record of " + std::to_string(total) + " bytes: " +
                   std::to_string(pinned_other) + " of the tier's " + std::to_string(cap_) + " bytes are pinned");
    uint8_t h[kHeader] = {};
    std::memcpy(h, kMagic, 4);
    const uint32_t v = kVersion, f = static_cast<uint32_t>(fp.size());
    const uint64_t p = n;
    std::memcpy(h + 4, &v, 4);
    std::memcpy(h + 8, &f, 4);
    std::memcpy(h + 16, &p, 8);
    XXH3_state_t *xs = XXH3_createState();
    if (!xs) return error("out of memory");
    XXH3_64bits_reset(xs);
    XXH3_64bits_update(xs, fp.data(), fp.size());
    XXH3_64bits_update(xs, payload, n);
    const uint64_t sum = XXH3_64bits_digest(xs);
    XXH3_freeState(xs);
    std::memcpy(h + 24, &sum, 8);

    const std::string tmp = dir_ + "/" + key.hex() + ".tmp." + std::to_string(getpid()) + "." + std::to_string(seq_++);
    const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
    if (fd < 0) return error("cannot create " + tmp + ": " + std::strerror(errno));
    bool ok = write_all(fd, h, kHeader) && write_all(fd, fp.data(), fp.size()) && write_all(fd, payload, n) &&
              (!fsync_ || fsync(fd) == 0);
    const int werr = errno;
    if (::close(fd) != 0 && ok) ok = false;
    const std::string path = path_of(key);
    if (!ok || rename(tmp.c_str(), path.c_str()) != 0) {
      const int e = ok ? errno : werr;
      unlink(tmp.c_str());
      return error("cannot write " + path + ": " + std::strerror(e));
    }
    unindex(key);
    index(key, total);
    if (pins) {  // a rewrite keeps its pins
      map_[key].pins = pins;
      pinned_bytes_ += total;
    }
    ++st_.puts;
    while (st_.bytes > cap_) {  // cannot run out: unpinned bytes suffice
      auto victim = std::prev(lru_.end());
      while (map_.at(*victim).pins || *victim == key) --victim;
      remove_file(*victim);
      ++st_.evictions;
    }
    return true;
  }

  bool get(const Key &key, const std::vector<uint8_t> &fp, std::vector<uint8_t> &out) override {
    std::unique_lock lk(mu_);
    const std::string path = path_of(key);
    const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) {  // absent (perhaps removed by another process)
      unindex(key);
      ++st_.misses;
      return false;
    }
    std::vector<uint8_t> rec;
    struct stat st;
    bool ok = fstat(fd, &st) == 0 && st.st_size >= static_cast<off_t>(kHeader);
    if (ok) {
      rec.resize(static_cast<size_t>(st.st_size));
      size_t done = 0;
      while (ok && done < rec.size()) {
        const ssize_t r = read(fd, rec.data() + done, rec.size() - done);
        if (r < 0 && errno == EINTR) continue;
        ok = r > 0;
        if (ok) done += static_cast<size_t>(r);
      }
    }
    ::close(fd);
    std::string why = ok ? check(rec, fp) : "cannot be read";
    if (!why.empty()) {  // refused and removed, never served
      remove_file(key);
      ++st_.misses;
      ++st_.errors;
      err_ = "block record " + path + " " + why + ": removed";
      return false;
    }
    uint32_t f;
    std::memcpy(&f, rec.data() + 8, 4);
    out.assign(rec.begin() + static_cast<std::ptrdiff_t>(kHeader + f), rec.end());
    if (!map_.count(key)) index(key, rec.size());  // written by another process
    else lru_.splice(lru_.begin(), lru_, map_[key].pos);
    utimensat(AT_FDCWD, path.c_str(), nullptr, 0);  // recency survives a restart
    ++st_.hits;
    return true;
  }

  bool contains(const Key &key) override {
    std::unique_lock lk(mu_);
    return access(path_of(key).c_str(), F_OK) == 0;
  }
  bool erase(const Key &key) override {
    std::unique_lock lk(mu_);
    const bool had = access(path_of(key).c_str(), F_OK) == 0;
    remove_file(key);
    return had;
  }
  // Pins hold in this process (another process sharing the directory may
  // still remove the file; a load then misses).
  bool pin(const Key &key) override {
    std::unique_lock lk(mu_);
    auto it = map_.find(key);
    if (it == map_.end()) return false;
    if (it->second.pins++ == 0) pinned_bytes_ += it->second.bytes;
    return true;
  }
  bool unpin(const Key &key) override {
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
    std::list<Key>::iterator pos;
    uint32_t pins = 0;
  };
  std::string path_of(const Key &k) const { return dir_ + "/" + k.hex() + kExt; }
  bool fail_open(std::string *error, const char *what) {
    if (error) *error = std::string(what) + " the disk tier directory " + dir_ + ": " + std::strerror(errno);
    return false;
  }
  bool error(const std::string &why) {
    ++st_.errors;
    err_ = why;
    return false;
  }
  // "" when the record is whole, of this format and written with fingerprint fp.
  static std::string check(const std::vector<uint8_t> &rec, const std::vector<uint8_t> &fp) {
    if (std::memcmp(rec.data(), kMagic, 4) != 0) return "is not a block record";
    uint32_t v, f;
    uint64_t p, sum;
    std::memcpy(&v, rec.data() + 4, 4);
    std::memcpy(&f, rec.data() + 8, 4);
    std::memcpy(&p, rec.data() + 16, 8);
    std::memcpy(&sum, rec.data() + 24, 8);
    if (v != kVersion) return "has format version " + std::to_string(v);
    if (kHeader + static_cast<uint64_t>(f) + p != rec.size()) return "has the wrong size (truncated?)";
    if (XXH3_64bits(rec.data() + kHeader, rec.size() - kHeader) != sum) return "fails its checksum";
    if (f != fp.size() || std::memcmp(rec.data() + kHeader, fp.data(), f) != 0)
      return "was written by a pool of another configuration (fingerprint)";
    return "";
  }
  void index(const Key &k, uint64_t bytes) {
    lru_.push_front(k);
    map_[k] = Entry{bytes, lru_.begin(), 0};
    st_.bytes += bytes;
    ++st_.entries;
  }
  void unindex(const Key &k) {
    auto it = map_.find(k);
    if (it == map_.end()) return;
    st_.bytes -= it->second.bytes;
    if (it->second.pins) pinned_bytes_ -= it->second.bytes;
    --st_.entries;
    lru_.erase(it->second.pos);
    map_.erase(it);
  }
  void remove_file(const Key &k) {
    const Key copy = k;  // k may refer into lru_
    unlink(path_of(copy).c_str());
    unindex(copy);
  }

  const std::string dir_;
  const uint64_t cap_;
  const bool fsync_;
  mutable std::mutex mu_;
  std::unordered_map<Key, Entry, KeyHash> map_;
  std::list<Key> lru_;
  Stats st_;
  uint64_t pinned_bytes_ = 0;  // bytes of entries with pins > 0
  std::string err_;
  uint64_t seq_ = 0;
};

}  // namespace

std::unique_ptr<Tier> make_disk_tier(const std::string &dir, uint64_t capacity_bytes, bool fsync_each,
                                     std::string *error) {
  auto t = std::make_unique<DiskTier>(dir, capacity_bytes, fsync_each);
  if (!t->open_dir(error)) return nullptr;
  return t;
}

}  // namespace kvc::tier
