// kvc_store's logic (key_store.h): keys, fingerprints, capacity checks.
#include "core/key_store.h"

#include <xxhash.h>

#include <cstring>

#include "common/error.h"

namespace kvc::core {

namespace {
constexpr char kTag[] = "kvc-store/1";  // with its NUL: 12 bytes
constexpr size_t kRecordHeader = 32;    // the disk and Redis tiers' record header
constexpr uint64_t kRedisMax = (uint64_t{512} << 20) - kRecordHeader;  // proto-max-bulk-len
}  // namespace

void KeyStore::check_key(const void *key, size_t key_bytes, const char *name) {
  if (!key) fail(Errc::NullPointer, std::string(name) + " is NULL");
  if (key_bytes == 0 || key_bytes > kKeyMax)
    fail(Errc::InvalidArgument, std::string(name) + " has " + std::to_string(key_bytes) +
                                    " bytes: a key has 1 to " + std::to_string(kKeyMax));
}

KeyStore::KeyStore(const tier::Spec &spec, const void *scope, size_t scope_bytes) : spec_(spec) {
  spec_.nonblocking_open = true;  // no loader thread, no load timeout: a FIFO must not block
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

BlockKey KeyStore::key_of(const std::vector<uint8_t> &fp) {
  const XXH128_hash_t h = XXH3_128bits(fp.data(), fp.size());
  BlockKey k;
  std::memcpy(k.b.data(), &h.high64, 8);
  std::memcpy(k.b.data() + 8, &h.low64, 8);
  return k;
}

BlockKey KeyStore::key_of(const void *key, size_t key_bytes) const {
  return key_of(fingerprint(key, key_bytes));
}

void KeyStore::put(const void *key, size_t key_bytes, const void *value, size_t n) {
  check_key(key, key_bytes, "key");
  if (n && !value) fail(Errc::NullPointer, "value is NULL");
  const std::vector<uint8_t> &fp = fingerprint(key, key_bytes);
  const BlockKey k = key_of(fp);
  // The record (value, key and scope, the disk header) against the tier's
  // room, compared without wrapping: n is whatever the caller passed.
  const uint64_t extra = fp.size() + (spec_.kind == tier::Kind::Disk ? kRecordHeader : 0);
  const uint64_t room = spec_.kind == tier::Kind::Redis ? kRedisMax : spec_.capacity_bytes;
  if (n > room || extra > room - n)
    fail(Errc::ExceedsCapacity,
         "a value of " + std::to_string(n) + " bytes (with its key and header " +
             std::to_string(extra) + " more) is larger than " +
             (spec_.kind == tier::Kind::Redis ? std::string("a Redis value (512 MiB)")
                                              : "the tier (" + std::to_string(room) + " bytes)"));
  static const uint8_t kEmpty = 0;
  if (!tier_->put(k, fp, n ? static_cast<const uint8_t *>(value) : &kEmpty, n))
    fail(Errc::Io, "the " + std::string(tier_->name()) +
                       " tier did not store the value: " + tier_->last_error());
}

bool KeyStore::get(const void *key, size_t key_bytes, std::vector<uint8_t> &out) {
  check_key(key, key_bytes, "key");
  const std::vector<uint8_t> &fp = fingerprint(key, key_bytes);
  return tier_->get(key_of(fp), fp, out);
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
  return tier_->erase(key_of(key, key_bytes));  // a removed value's pins go with it
}

bool KeyStore::pin(const void *key, size_t key_bytes, bool on) {
  check_key(key, key_bytes, "key");
  if (spec_.kind == tier::Kind::Redis)
    fail(Errc::Unsupported, "a Redis store cannot pin: Redis evicts by its maxmemory rules");
  const BlockKey k = key_of(key, key_bytes);
  std::lock_guard<std::mutex> lk(pin_mu_);
  const bool done = on ? tier_->pin(k) : tier_->unpin(k);
  if (done && on) pinned_.insert(k);
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
    for (auto it = pinned_.begin(); it != pinned_.end();)
      it = tier_->pins(*it) ? std::next(it) : pinned_.erase(it);
    c.pinned = pinned_.size();
  }
  c.last_error = tier_->last_error();
  return c;
}

}  // namespace kvc::core
