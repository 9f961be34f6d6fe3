// Offload tiers (issue 9, docs/tiers.md): stores of blocks' K/V bytes below
// the pool, addressed by the block's prefix-cache key. Internal for now: the
// pool's demotion / promotion and the public API come next.
//
// A key is the prefix cache's chain key (docs/prefix-cache.md): it already
// mixes the pool's seed, fingerprint, model and tokenizer ids and every
// extra key (tenant salt, adapter), so two tenants or models never share one.
// A tier keeps, with each payload, the fingerprint of the pool that wrote it
// (geometry and codecs); a reader with another fingerprint gets a miss.
#pragma once
#include <array>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <list>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "common/block_key.h"

namespace kvc::tier {

// Counters of one tier (monotonic except bytes / entries).
struct Stats {
  uint64_t bytes = 0, entries = 0;   // held now
  uint64_t hits = 0, misses = 0;     // get()
  uint64_t puts = 0, evictions = 0;  // stored; dropped for capacity (LRU)
  uint64_t errors = 0;               // failed writes / reads, refused records
};

class Tier {
 public:
  virtual ~Tier() = default;
  virtual const char *name() const = 0;
  // Stores a copy of `payload` under `key` with the writer's fingerprint,
  // replacing an older one; evicts least recently used entries for room.
  // False (counted as an error, nothing stored) when it cannot: larger than
  // the capacity, an I/O error. Never partly visible.
  virtual bool put(const BlockKey &key, const std::vector<uint8_t> &fingerprint,
                   const uint8_t *payload, size_t n) = 0;
  // The payload of `key` written with `fingerprint`, whole, or false (a miss:
  // absent, another fingerprint, or a damaged record, which is removed).
  virtual bool get(const BlockKey &key, const std::vector<uint8_t> &fingerprint,
                   std::vector<uint8_t> &out) = 0;
  virtual bool contains(const BlockKey &key) = 0;
  // contains() of n keys: found[i] for keys[i] (found is resized to n). A
  // remote tier answers all in one round trip per server (Redis: pipelined
  // EXISTS); the default asks one at a time.
  virtual void contains_many(const BlockKey *keys, size_t n, std::vector<char> &found) {
    found.assign(n, 0);
    for (size_t i = 0; i < n; ++i) found[i] = contains(keys[i]) ? 1 : 0;
  }
  // Whether contains_many() costs about one contains() (a remote tier): a
  // lookup then asks it about all its keys at once.
  virtual bool batched_contains() const { return false; }
  virtual bool erase(const BlockKey &key) = 0;
  // Pins `key`: LRU replacement never evicts a pinned entry (a put that would
  // need its room fails instead). Pins count: each pin needs one unpin.
  // False when the key is absent or the tier cannot pin (Redis).
  virtual bool pin(const BlockKey &) { return false; }
  // False (nothing changes) when the key is not pinned: counts never go negative.
  virtual bool unpin(const BlockKey &) { return false; }
  // How many pins `key` holds now (0: absent or not pinned, or a tier that cannot pin).
  virtual uint32_t pins(const BlockKey &) const { return 0; }
  virtual Stats stats() const = 0;
  // The reason of the last error, "" if none.
  virtual std::string last_error() const = 0;
};

// Host memory with a byte capacity and LRU replacement (thread-safe).
std::unique_ptr<Tier> make_host_tier(uint64_t capacity_bytes);

// A directory of one file per block with a byte capacity and LRU replacement
// (thread-safe within a process; other processes may read and write the same
// directory: records are written to a temporary file and renamed, so a reader
// sees the old record, the new one or none, never a part). Opening scans the
// directory: records left by earlier processes are found (LRU order from
// their modification times), temporary files of killed writers are removed.
// Each record carries a checksum (XXH3-64) and the writer's fingerprint; a
// record failing either is removed, never served. fsync_each: flush every
// record to disk before it is visible (survives power loss, slower).
// nonblocking_open: records are opened with O_NONBLOCK, so a FIFO in a
// record's place is refused at once instead of blocking (stores, which have
// no loader thread and no load timeout; a pool's loader keeps blocking opens).
std::unique_ptr<Tier> make_disk_tier(const std::string &dir, uint64_t capacity_bytes,
                                     bool fsync_each, std::string *error,
                                     bool nonblocking_open = false);

// Redis (hiredis): one server, or a Redis Cluster whose slot map is read from
// the seed nodes (CRC16 key slots with hash tags, MOVED and ASK redirects
// followed). Records are stored as single values (SET is atomic: a reader
// gets the old value, the new one or none), each with a checksum (XXH3-64)
// and the writer's fingerprint; a damaged record is deleted, never served.
struct RedisConfig {
  std::vector<std::pair<std::string, int>> nodes;  // one server, or cluster seed nodes (host, port)
  bool cluster = false;
  uint32_t timeout_ms = 1000;       // connect and command timeout
  uint64_t ttl_seconds = 0;         // 0: records never expire
  std::string key_prefix = "kvc:";  // Redis keys: key_prefix + the key's hex digits
};
// Null with *error set when the library was built without hiredis or the
// config is invalid. A server that is down is not an error here: operations
// fail (misses, counted errors) until it answers again.
std::unique_ptr<Tier> make_redis_tier(const RedisConfig &cfg, std::string *error);

}  // namespace kvc::tier
