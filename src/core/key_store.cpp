// kvc_store's logic (key_store.h): keys, fingerprints, capacity checks.
#include "core/key_store.h"

#include <xxhash.h>

#include <cstring>

#include "common/error.h"

namespace kvc::core {

namespace {
constexpr char kTag[] = "kvc-store/1";  // with its NUL: 12 bytes
constexpr size_t kRecordHeader = 32;    // the disk tier's record header (disk_tier.cpp)
}  // namespace

void KeyStore::check_key(const void *key, size_t key_bytes, const char *name) {
  if (key_bytes == 0 || key_bytes > kKeyMax)
    fail(Errc::InvalidArgument, std::string(name) + " has " + std::to_string(key_bytes) +
                                    " bytes: a key has 1 to " + std::to_string(kKeyMax));
  if (!key) fail(Errc::NullPointer, std::string(name) + " is NULL");
}

KeyStore::KeyStore(const tier::Spec &spec, const void *scope, size_t scope_bytes) : spec_(spec) {
  if (scope_bytes > kKeyMax)
    fail(Errc::InvalidArgument, "scope has " + std::to_string(scope_bytes) + " bytes (at most " +
                                    std::to_string(kKeyMax) + ")");
  if (scope_bytes && !scope) fail(Errc::NullPointer, "scope is NULL");
  if (scope_bytes) scope_.assign(static_cast<const char *>(scope), scope_bytes);
  // Checks the spec (InvalidArgument, Unsupported), then opens (Io).
  tier_ = tier::tier_maker(spec_)();
  if (!tier_) fail(Errc::Internal, "the tier could not be opened");
}

const std::vector<uint8_t> &KeyStore::fingerprint(const void *key, size_t key_bytes) const {
  thread_local std::vector<uint8_t> fp;
  const uint32_t ns = static_cast<uint32_t>(scope_.size());
  fp.resize(sizeof kTag + sizeof ns + scope_.size() + key_bytes);
  uint8_t *p = fp.data();
  std::memcpy(p, kTag, sizeof kTag);
  p += sizeof kTag;
  std::memcpy(p, &ns, sizeof ns);
  p += sizeof ns;
  if (ns) std::memcpy(p, scope_.data(), ns);
  p += ns;
  std::memcpy(p, key, key_bytes);
  return fp;
}

BlockKey KeyStore::key_of(const void *key, size_t key_bytes) const {
  const std::vector<uint8_t> &fp = fingerprint(key, key_bytes);
  const XXH128_hash_t h = XXH3_128bits(fp.data(), fp.size());
  BlockKey k;
  std::memcpy(k.b.data(), &h.high64, 8);
  std::memcpy(k.b.data() + 8, &h.low64, 8);
  return k;
}

void KeyStore::put(const void *key, size_t key_bytes, const void *value, size_t n) {
  check_key(key, key_bytes, "key");
  if (n && !value) fail(Errc::NullPointer, "value is NULL");
  const BlockKey k = key_of(key, key_bytes);
  const std::vector<uint8_t> &fp = fingerprint(key, key_bytes);
  if (spec_.kind != tier::Kind::Redis) {
    const uint64_t record =
        static_cast<uint64_t>(n) + fp.size() + (spec_.kind == tier::Kind::Disk ? kRecordHeader : 0);
    if (record > spec_.capacity_bytes)
      fail(Errc::ExceedsCapacity, "a value of " + std::to_string(n) + " bytes (a record of " +
                                      std::to_string(record) +
                                      " bytes with its key) is larger than the tier (" +
                                      std::to_string(spec_.capacity_bytes) + " bytes)");
  }
  static const uint8_t kEmpty = 0;
  if (!tier_->put(k, fp, n ? static_cast<const uint8_t *>(value) : &kEmpty, n))
    fail(Errc::Io, "the " + std::string(tier_->name()) +
                       " tier did not store the value: " + tier_->last_error());
}

bool KeyStore::get(const void *key, size_t key_bytes, std::vector<uint8_t> &out) {
  check_key(key, key_bytes, "key");
  const BlockKey k = key_of(key, key_bytes);
  return tier_->get(k, fingerprint(key, key_bytes), out);
}

void KeyStore::contains(const void *const *keys, const size_t *key_bytes, size_t n,
                        uint8_t *found) {
  if (n == 0) return;
  if (!keys) fail(Errc::NullPointer, "keys is NULL");
  if (!key_bytes) fail(Errc::NullPointer, "key_bytes is NULL");
  if (!found) fail(Errc::NullPointer, "found is NULL");
  std::vector<BlockKey> ks(n);
  for (size_t i = 0; i < n; ++i) {
    const std::string name = "keys[" + std::to_string(i) + "]";
    check_key(keys[i], key_bytes[i], name.c_str());
    ks[i] = key_of(keys[i], key_bytes[i]);
  }
  std::vector<char> f;
  tier_->contains_many(ks.data(), n, f);
  for (size_t i = 0; i < n; ++i) found[i] = f[i] ? 1 : 0;
}

bool KeyStore::remove(const void *key, size_t key_bytes) {
  check_key(key, key_bytes, "key");
  const BlockKey k = key_of(key, key_bytes);
  std::lock_guard<std::mutex> lk(pin_mu_);  // a removed value's pins go with it
  const bool had = tier_->erase(k);
  pins_.erase(k);
  return had;
}

bool KeyStore::pin(const void *key, size_t key_bytes, bool on) {
  check_key(key, key_bytes, "key");
  if (spec_.kind == tier::Kind::Redis)
    fail(Errc::Unsupported, "a Redis store cannot pin: Redis evicts by its maxmemory rules");
  const BlockKey k = key_of(key, key_bytes);
  std::lock_guard<std::mutex> lk(pin_mu_);
  const bool done = on ? tier_->pin(k) : tier_->unpin(k);
  if (done) {
    if (on) {
      ++pins_[k];
    } else {
      auto it = pins_.find(k);
      if (it != pins_.end() && --it->second == 0) pins_.erase(it);
    }
  }
  return done;
}

TierCounts KeyStore::counts() const {
  const tier::Stats st = tier_->stats();
  TierCounts c;
  c.kind = static_cast<int32_t>(spec_.kind);
  c.bytes = st.bytes;
  c.entries = st.entries;
  c.hits = st.hits;
  c.misses = st.misses;
  c.demotions = st.puts;
  c.promotions = st.hits;
  c.evictions = st.evictions;
  c.errors = st.errors;
  {
    std::lock_guard<std::mutex> lk(pin_mu_);
    c.pinned = pins_.size();
  }
  c.last_error = tier_->last_error();
  return c;
}

}  // namespace kvc::core
