// The host and disk tiers (src/tier): capacity and LRU, fingerprints, damaged
// records, restart persistence, a writer killed mid-write, concurrent readers
// and writers of one key, I/O errors.
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstring>
#include <dirent.h>
#include <fstream>
#include <thread>

#include "../temp_dir.h"
#include "../whitebox.h"
#include "tier/checksum.h"
#include "tier/tier.h"

#include <xxhash.h>

using kvc::BlockKey;
using kvc::tier::Tier;

namespace {

BlockKey key(int i) {
  BlockKey k;
  for (size_t j = 0; j < 32; ++j) k.b[j] = static_cast<uint8_t>((i * 131 + j * 7 + (i >> 8)) & 0xff);
  k.b[0] = static_cast<uint8_t>(i), k.b[1] = static_cast<uint8_t>(i >> 8);
  return k;
}

std::vector<uint8_t> payload(int i, size_t n) {
  std::vector<uint8_t> p(n);
  for (size_t j = 0; j < n; ++j) p[j] = static_cast<uint8_t>(i * 17 + j * 3);
  return p;
}

const std::vector<uint8_t> kFp = {1, 2, 3, 4, 5, 6, 7, 8};
const std::vector<uint8_t> kOtherFp = {1, 2, 3, 4, 5, 6, 7, 9};

std::string temp_dir() {
  return kvtest::temp_dir("kvc_tier");
}
using kvtest::remove_dir;

int count_files(const std::string &d, const char *suffix) {
  int n = 0;
  DIR *dp = opendir(d.c_str());
  for (dirent *e; (e = readdir(dp)) != nullptr;) {
    const std::string s = e->d_name;
    n += s.size() > std::strlen(suffix) && s.find(suffix) != std::string::npos;
  }
  closedir(dp);
  return n;
}

// Put / get / LRU behaviour both tiers share.
void lru_and_fingerprints(Tier &t, uint64_t per_entry) {
  std::vector<uint8_t> out;
  CHECK(!t.get(key(1), kFp, out));
  for (int i = 0; i < 4; ++i) CHECK(t.put(key(i), kFp, payload(i, 1000).data(), 1000));
  CHECK(t.stats().entries == 4 && t.stats().bytes == 4 * per_entry);
  CHECK(t.get(key(0), kFp, out) && out == payload(0, 1000));  // 0 is now the most recent
  CHECK(t.put(key(4), kFp, payload(4, 1000).data(), 1000));   // evicts 1, the least recent
  CHECK(!t.contains(key(1)) && t.contains(key(0)) && t.contains(key(4)));
  CHECK(t.stats().evictions == 1);
  CHECK(!t.get(key(2), kOtherFp, out));  // another pool's configuration: a miss
  CHECK(t.put(key(2), kFp, payload(9, 1000).data(), 1000));  // replaces
  CHECK(t.get(key(2), kFp, out) && out == payload(9, 1000));
  CHECK(t.erase(key(2)) && !t.contains(key(2)) && !t.erase(key(2)));
  std::vector<uint8_t> big(5000);
  CHECK(!t.put(key(7), kFp, big.data(), big.size()));  // larger than the tier: refused, counted
  CHECK(!t.last_error().empty());
  const auto s = t.stats();
  CHECK(s.errors >= 1 && s.hits == 2 && s.entries == 3);
}

}  // namespace

KVTEST(host_lru_capacity) {
  auto t = kvc::tier::make_host_tier(4 * (1000 + kFp.size()));
  lru_and_fingerprints(*t, 1000 + kFp.size());
}

KVTEST(host_threads) {
  auto t = kvc::tier::make_host_tier(64 * 1024);
  std::vector<std::thread> th;
  std::atomic<int> bad{0};
  for (int w = 0; w < 4; ++w)
    th.emplace_back([&, w] {
      std::vector<uint8_t> out;
      for (int i = 0; i < 2000; ++i) {
        const int k = (i * 7 + w) % 40;
        if (i % 3 == 0) t->put(key(k), kFp, payload(k, 700).data(), 700);
        else if (t->get(key(k), kFp, out) && out != payload(k, 700)) ++bad;
      }
    });
  for (auto &x : th) x.join();
  CHECK(bad == 0);
  CHECK(t->stats().bytes <= 64 * 1024);
}

KVTEST(disk_lru_capacity) {
  const std::string d = temp_dir();
  std::string err;
  auto t = kvc::tier::make_disk_tier(d, 4 * (32 + 1000 + kFp.size()), false, &err);
  CHECK(t != nullptr);
  if (!t) return;
  lru_and_fingerprints(*t, 32 + 1000 + kFp.size());
  CHECK(count_files(d, ".kvct") == 3);
  t.reset();
  remove_dir(d);
}

KVTEST(disk_restart_persistence) {
  const std::string d = temp_dir();
  std::string err;
  {
    auto t = kvc::tier::make_disk_tier(d, 1 << 20, true, &err);
    for (int i = 0; i < 10; ++i) CHECK(t->put(key(i), kFp, payload(i, 3000).data(), 3000));
  }
  // A new process (here: a new tier object) opening the same directory finds every block.
  auto t = kvc::tier::make_disk_tier(d, 1 << 20, false, &err);
  CHECK(t->stats().entries == 10);
  std::vector<uint8_t> out;
  for (int i = 0; i < 10; ++i) {
    CHECK(t->get(key(i), kFp, out) && out == payload(i, 3000));
    usleep(10000);  // file times tick with the kernel's clock (a few ms): keep the accesses apart
  }
  // Reopened with a smaller capacity, the least recently used go first.
  t.reset();
  auto small = kvc::tier::make_disk_tier(d, 4 * (32 + 3000 + kFp.size()), false, &err);
  CHECK(small->stats().entries == 4);
  CHECK(small->contains(key(9)) && !small->contains(key(0)));
  small.reset();
  remove_dir(d);
}

KVTEST(disk_damaged_records_removed) {
  const std::string d = temp_dir();
  std::string err;
  auto t = kvc::tier::make_disk_tier(d, 1 << 20, false, &err);
  for (int i = 0; i < 3; ++i) CHECK(t->put(key(i), kFp, payload(i, 2000).data(), 2000));
  // A flipped byte in the payload of block 0, a truncated block 1, another fingerprint for 2.
  {
    std::fstream f(d + "/" + key(0).hex() + ".kvct", std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(1500);
    f.put('\x5a');
  }
  CHECK(truncate((d + "/" + key(1).hex() + ".kvct").c_str(), 1000) == 0);
  std::vector<uint8_t> out;
  CHECK(!t->get(key(0), kFp, out) && !t->contains(key(0)));  // refused and removed
  CHECK(t->last_error().find("checksum") != std::string::npos);
  CHECK(!t->get(key(1), kFp, out) && !t->contains(key(1)));
  CHECK(!t->get(key(2), kOtherFp, out) && !t->contains(key(2)));
  CHECK(t->stats().errors == 3 && t->stats().entries == 0);
  t.reset();
  remove_dir(d);
}

// A writer killed (SIGKILL) while writing loses at most its record in flight:
// every record that was renamed into place reads back whole, and the
// temporary files it left are removed at the next open.
KVTEST(disk_writer_killed_mid_write) {
  const std::string d = temp_dir();
  const pid_t pid = fork();
  if (pid == 0) {
    std::string err;
    auto t = kvc::tier::make_disk_tier(d, 1ull << 32, false, &err);
    for (int i = 0;; ++i) t->put(key(i % 500), kFp, payload(i % 500, 200000).data(), 200000);
  }
  usleep(300000);
  kill(pid, SIGKILL);
  int status = 0;
  waitpid(pid, &status, 0);
  CHECK(WIFSIGNALED(status));
  std::string err;
  auto t = kvc::tier::make_disk_tier(d, 1ull << 32, false, &err);
  CHECK(count_files(d, ".tmp.") == 0);
  const uint64_t n = t->stats().entries;
  CHECK(n > 0);
  std::vector<uint8_t> out;
  uint64_t whole = 0;
  for (int i = 0; i < 500; ++i)
    if (t->contains(key(i))) whole += t->get(key(i), kFp, out) && out == payload(i, 200000);
  CHECK(whole == n);
  CHECK(t->stats().errors == 0);
  t.reset();
  remove_dir(d);
}

// Readers racing writers of the same key get a miss or a whole payload, never a torn one.
KVTEST(disk_readers_and_writers_race) {
  const std::string d = temp_dir();
  std::string err;
  auto w1 = kvc::tier::make_disk_tier(d, 1 << 24, false, &err);
  auto w2 = kvc::tier::make_disk_tier(d, 1 << 24, false, &err);  // another "process" on the directory
  std::atomic<bool> stop{false};
  std::atomic<int> torn{0}, hits{0};
  std::thread a([&] {
    for (int i = 0; i < 300; ++i) w1->put(key(1), kFp, payload(1, 50000).data(), 50000);
  });
  std::thread b([&] {
    for (int i = 0; i < 300; ++i) w2->put(key(1), kFp, payload(2, 50000).data(), 50000);
  });
  std::thread r([&] {
    auto rd = kvc::tier::make_disk_tier(d, 1 << 24, false, &err);
    std::vector<uint8_t> out;
    while (!stop)
      if (rd->get(key(1), kFp, out)) {
        ++hits;
        torn += out != payload(1, 50000) && out != payload(2, 50000);
      }
  });
  a.join();
  b.join();
  stop = true;
  r.join();
  CHECK(torn == 0);
  CHECK(hits > 0);
  std::vector<uint8_t> out;
  CHECK(w1->get(key(1), kFp, out) && (out == payload(1, 50000) || out == payload(2, 50000)));
  w1.reset();
  w2.reset();
  remove_dir(d);
}

KVTEST(disk_io_errors) {
  const std::string d = temp_dir();
  std::string err;
  // The directory path is a regular file: the tier cannot open, and says why.
  const std::string file = d + "/plain";
  { std::ofstream(file) << "x"; }
  CHECK(kvc::tier::make_disk_tier(file, 1 << 20, false, &err) == nullptr);
  CHECK(err.find("plain") != std::string::npos);
  // The directory disappears under an open tier: puts fail and count, gets miss.
  const std::string sub = d + "/sub";
  auto t = kvc::tier::make_disk_tier(sub, 1 << 20, false, &err);
  CHECK(t != nullptr);
  CHECK(t->put(key(1), kFp, payload(1, 100).data(), 100));
  unlink((sub + "/" + key(1).hex() + ".kvct").c_str());
  CHECK(rmdir(sub.c_str()) == 0);
  CHECK(!t->put(key(2), kFp, payload(2, 100).data(), 100));
  CHECK(t->last_error().find("No such file") != std::string::npos);
  std::vector<uint8_t> out;
  CHECK(!t->get(key(1), kFp, out));
  CHECK(t->stats().errors == 1);
  t.reset();
  unlink(file.c_str());
  rmdir(d.c_str());
}

// The records' checksum (an AVX2 build of XXH3 where the CPU has it) equals
// xxHash's XXH3-64 of the two ranges' concatenation, for every size class of
// XXH3 (0-16, 17-128, 129-240, long inputs, stripes and blocks).
KVTEST(host_checksum_matches_xxhash) {
  std::vector<uint8_t> all(3 << 20);
  for (size_t i = 0; i < all.size(); ++i) all[i] = static_cast<uint8_t>(i * 131 + (i >> 7));
  for (size_t n : {0, 1, 3, 16, 17, 128, 129, 240, 241, 1024, 1025, 65536, 1048583, 3145728}) {
    const uint64_t want = XXH3_64bits(all.data(), n);
    CHECK(kvc::tier::xxh3(all.data(), n) == want);
    for (size_t split : {size_t(0), n / 3, n})
      CHECK(kvc::tier::xxh3_pair(all.data(), split, all.data() + split, n - split) == want);
  }
}

int main(int argc, char **argv) { return kvtest_main(argc, argv); }
