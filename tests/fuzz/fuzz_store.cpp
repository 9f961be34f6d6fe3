// SPDX-License-Identifier: Apache-2.0
// libFuzzer target of the stores (kvc_store_*, docs/engines.md): random
// sequences of put / get / contains / remove / pin / unpin / stats / reopen on
// a host store or a disk store (a fresh directory per input), with bad
// arguments among them, checked against a model of what was stored:
// - a hit returns exactly the bytes last put under that key, never another
//   key's or an older value; a removed key misses;
// - a pinned value is never evicted (its get hits);
// - contains agrees with get; a refused call (bad key length, NULL, a value
//   larger than the tier, a buffer too small) returns its documented status
//   and changes nothing: no output written, the stored value unchanged;
// - the counters stay within the capacity, entries never above the keys put.
// Input: 1 byte of set-up (host or disk, capacity), then operations of 4
// bytes (op, key, length, seed). Seeds: tests/fuzz/corpus-store.
#include <kvcache/kvcache.h>
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <string>
#include <vector>

namespace {

[[noreturn]] void die(const char *what, int op) {
  std::fprintf(stderr, "fuzz_store: %s (op %d)\n", what, op);
  std::abort();
}

std::vector<uint8_t> value_of(unsigned len, unsigned seed) {
  std::vector<uint8_t> v(len);
  uint32_t x = 2654435761u * (seed + 1);
  for (auto &b : v) {
    x = x * 1664525u + 1013904223u;
    b = static_cast<uint8_t>(x >> 24);
  }
  return v;
}

std::string key_of(unsigned k) {
  // Eight keys, of lengths 1 to 8; key 0 and key 8 share a prefix with others.
  static const char *const names[] = {"a",    "ab",     "abc",     "b",
                                      "k\0y", "page-5", "page-55", "zzzzzzzz"};
  const unsigned i = k % 8;
  return i == 4 ? std::string("k\0y", 3) : std::string(names[i]);
}

struct Model {
  std::map<std::string, std::vector<uint8_t>> held;  // what may still be stored
  std::map<std::string, int> pins;                   // this store's pins
};

void rm_tree(const std::string &dir) {
  const std::string cmd = "rm -rf '" + dir + "'";
  if (std::system(cmd.c_str()) != 0)
    std::fprintf(stderr, "fuzz_store: could not remove %s\n", dir.c_str());
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (size < 1) return 0;
  const bool disk = data[0] & 1;
  const uint64_t capacity = 256u + 512u * ((data[0] >> 1) & 15);  // 256 .. 7,936 bytes
  char tmpl[] = "/tmp/kvc_fuzz_store_XXXXXX";
  std::string dir;
  if (disk) {
    if (!mkdtemp(tmpl)) return 0;
    dir = tmpl;
  }
  kvc_tier_config cfg;
  if (kvc_tier_config_init(&cfg, disk ? KVC_TIER_DISK : KVC_TIER_HOST) != KVC_OK)
    die("config_init", -1);
  cfg.capacity_bytes = capacity;
  cfg.path = disk ? dir.c_str() : nullptr;
  kvc_store *s = nullptr;
  if (kvc_store_open(&cfg, "fuzz", 4, &s) != KVC_OK || !s) die("open", -1);
  Model m;
  std::vector<uint8_t> buf(8192);

  auto check_get = [&](const std::string &k, int op) {
    std::fill(buf.begin(), buf.end(), 0xee);
    size_t n = 777;
    int32_t found = -1;
    const kvc_status st = kvc_store_get(s, k.data(), k.size(), buf.data(), buf.size(), &n, &found);
    if (st != KVC_OK) die("get failed", op);
    auto it = m.held.find(k);
    if (found == 1) {
      if (it == m.held.end()) die("a hit for a key not stored (or removed)", op);
      if (n != it->second.size() || (n && std::memcmp(buf.data(), it->second.data(), n) != 0))
        die("a hit with other bytes than the last put", op);
    } else {
      if (found != 0 || n != 0) die("a miss with found / length set", op);
      if (m.pins.count(k) && m.pins[k] > 0) die("a pinned value was evicted", op);
      if (it != m.held.end()) m.held.erase(it);  // evicted
    }
    return found == 1;
  };

  for (size_t i = 1; i + 4 <= size; i += 4) {
    const int op = data[i] % 12;
    const std::string k = key_of(data[i + 1]);
    const unsigned len =
        static_cast<unsigned>(data[i + 2]) * 16u + (data[i + 3] & 15u);  // 0 .. 4,095
    const unsigned seed = data[i + 3];
    switch (op) {
      case 0:
      case 1: {  // put
        const std::vector<uint8_t> v = value_of(len, seed);
        const kvc_status st =
            kvc_store_put(s, k.data(), k.size(), v.empty() ? nullptr : v.data(), v.size());
        if (st == KVC_OK) {
          m.held[k] = v;
        } else if (st == KVC_ERR_EXCEEDS_CAPACITY || st == KVC_ERR_IO) {
          // Refused (too large, or the room is pinned): the older value, if any, stays readable.
          if (st == KVC_ERR_EXCEEDS_CAPACITY && v.size() + 64 < capacity / 2)
            die("a small value refused as larger than the tier", op);
          check_get(k, op);
        } else {
          die("put: an undocumented status", op);
        }
        break;
      }
      case 2:
        check_get(k, op);
        break;
      case 3: {  // get into a short buffer: BUFFER_TOO_SMALL, the buffer untouched
        auto it = m.held.find(k);
        if (it == m.held.end() || it->second.empty()) break;
        const size_t small = it->second.size() - 1;
        std::fill(buf.begin(), buf.end(), 0x5a);
        size_t n = 0;
        int32_t found = 0;
        const kvc_status st =
            kvc_store_get(s, k.data(), k.size(), small ? buf.data() : nullptr, small, &n, &found);
        if (st == KVC_OK) {
          if (found) die("a hit into a buffer too small", op);
          m.held.erase(it);  // evicted
          if (m.pins.count(k) && m.pins[k] > 0) die("a pinned value was evicted", op);
        } else if (st == KVC_ERR_BUFFER_TOO_SMALL) {
          if (found != 1 || n != it->second.size()) die("BUFFER_TOO_SMALL without the length", op);
          for (size_t b = 0; b < buf.size(); ++b)
            if (buf[b] != 0x5a) die("a refused get wrote to the buffer", op);
        } else {
          die("get: an undocumented status", op);
        }
        break;
      }
      case 4: {  // contains of every key, then each agrees with get
        std::vector<std::string> ks;
        std::vector<const void *> ptrs;
        std::vector<size_t> lens;
        for (unsigned j = 0; j < 8; ++j) ks.push_back(key_of(j));
        for (auto &x : ks) ptrs.push_back(x.data()), lens.push_back(x.size());
        uint8_t found[8];
        std::memset(found, 9, sizeof found);
        if (kvc_store_contains(s, ptrs.data(), lens.data(), 8, found) != KVC_OK)
          die("contains", op);
        for (unsigned j = 0; j < 8; ++j) {
          if (found[j] > 1) die("contains wrote a value other than 0 or 1", op);
          if (check_get(ks[j], op) != (found[j] == 1)) die("contains and get disagree", op);
        }
        break;
      }
      case 5: {  // contains with one bad key: refused, nothing written
        const void *ptrs[3] = {"a", "", "b"};
        size_t lens[3] = {1, 0, 1};
        if (seed & 1) lens[1] = KVC_STORE_KEY_MAX + 1 + seed;
        uint8_t found[3] = {7, 7, 7};
        if (kvc_store_contains(s, ptrs, lens, 3, found) != KVC_ERR_INVALID_ARGUMENT)
          die("a bad key accepted", op);
        if (found[0] != 7 || found[1] != 7 || found[2] != 7) die("a refused contains wrote", op);
        break;
      }
      case 6: {  // remove
        int32_t removed = -1;
        if (kvc_store_remove(s, k.data(), k.size(), &removed) != KVC_OK) die("remove", op);
        if (removed && !m.held.count(k)) die("removed a key not stored", op);
        m.held.erase(k);
        m.pins.erase(k);
        check_get(k, op);
        break;
      }
      case 7: {  // pin
        int32_t done = -1;
        if (kvc_store_pin(s, k.data(), k.size(), 1, &done) != KVC_OK) die("pin", op);
        if (done) {
          if (!m.held.count(k)) die("pinned a key not stored", op);
          ++m.pins[k];
        } else {
          m.held.erase(k);  // absent: evicted
        }
        break;
      }
      case 8: {  // unpin
        int32_t done = -1;
        if (kvc_store_pin(s, k.data(), k.size(), 0, &done) != KVC_OK) die("unpin", op);
        const bool had = m.pins.count(k) && m.pins[k] > 0;
        if (done != (had ? 1 : 0)) die("unpin disagrees with the pins taken", op);
        if (had) --m.pins[k];
        break;
      }
      case 9: {  // stats
        kvc_tier_stats st;
        if (kvc_tier_stats_init(&st) != KVC_OK || kvc_store_stats(s, &st) != KVC_OK)
          die("stats", op);
        if (st.bytes > capacity) die("more bytes held than the capacity", op);
        if (st.entries > m.held.size() + 0) die("more entries than keys stored", op);
        uint64_t pinned = 0;
        for (auto &p : m.pins) pinned += p.second > 0;
        if (st.pinned != pinned) die("pinned count differs from the pins taken", op);
        break;
      }
      case 10: {  // bad arguments: documented statuses, nothing changed
        const std::vector<uint8_t> v = value_of(8, seed);
        size_t n = 0;
        int32_t found = 0;
        if (kvc_store_put(s, nullptr, 1, v.data(), 8) != KVC_ERR_NULL_POINTER)
          die("put NULL key", op);
        if (kvc_store_put(s, k.data(), 0, v.data(), 8) != KVC_ERR_INVALID_ARGUMENT)
          die("put empty key", op);
        if (kvc_store_put(s, k.data(), k.size(), nullptr, 8) != KVC_ERR_NULL_POINTER)
          die("put NULL value", op);
        if (kvc_store_put(s, k.data(), k.size(), v.data(), SIZE_MAX - seed) !=
            KVC_ERR_EXCEEDS_CAPACITY)
          die("put of a wrapped size", op);
        if (kvc_store_get(s, k.data(), k.size(), buf.data(), buf.size(), &n, nullptr) !=
            KVC_ERR_NULL_POINTER)
          die("get NULL found", op);
        if (kvc_store_pin(s, k.data(), k.size(), 2, nullptr) != KVC_ERR_INVALID_ARGUMENT)
          die("pin 2", op);
        check_get(k, op);
        (void)found;
        break;
      }
      case 11: {  // close and reopen: disk values stay (this store's pins go); a host store is new
        kvc_store_close(s);
        s = nullptr;
        if (kvc_store_open(&cfg, "fuzz", 4, &s) != KVC_OK || !s) die("reopen", op);
        m.pins.clear();
        if (!disk) m.held.clear();
        break;
      }
    }
  }
  kvc_store_close(s);
  if (disk) rm_tree(dir);
  return 0;
}
