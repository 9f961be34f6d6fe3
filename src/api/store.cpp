// Stores (kvc_store_*): one tier by itself, addressed by an engine's keys.
#include <algorithm>
#include <cstring>
#include <vector>

#include "api/api_int.h"
#include "core/key_store.h"

using namespace kvc::api;

struct kvc_store {
  explicit kvc_store(const kvc::core::TierSpec &s, const void *scope, size_t n)
      : core(s, scope, n) {}
  kvc::core::KeyStore core;
};

namespace {
kvc::core::KeyStore &store_of(kvc_store *s) {
  need(s, "store");
  return s->core;
}
}  // namespace

extern "C" {

KVC_API kvc_status kvc_store_open(const kvc_tier_config *config, const void *scope,
                                  size_t scope_bytes, kvc_store **out) {
  if (out) *out = nullptr;
  return guard([&] {
    need(out, "out");
    const kvc::core::TierSpec ts = tier_spec(config);
    *out = new kvc_store(ts, scope, scope_bytes);
  });
}

KVC_API void kvc_store_close(kvc_store *store) {
  delete store;
}

KVC_API kvc_status kvc_store_put(kvc_store *store, const void *key, size_t key_bytes,
                                 const void *value, size_t value_bytes) {
  return guard([&] { store_of(store).put(key, key_bytes, value, value_bytes); });
}

KVC_API kvc_status kvc_store_get(kvc_store *store, const void *key, size_t key_bytes, void *buf,
                                 size_t buf_bytes, size_t *value_bytes, int32_t *found) {
  if (value_bytes) *value_bytes = 0;
  if (found) *found = 0;
  return guard([&] {
    auto &s = store_of(store);
    need(found, "found");
    if (buf_bytes && !buf) fail(Errc::NullPointer, "buf is NULL");
    thread_local std::vector<uint8_t> v;
    struct Shrink {  // however the call ends: no large idle scratch left in the thread
      ~Shrink() {
        if (v.capacity() > (64u << 20)) std::vector<uint8_t>().swap(v);
      }
    } shrink;
    const bool hit = s.get(key, key_bytes, v);
    if (!hit) return;
    *found = 1;
    if (value_bytes) *value_bytes = v.size();
    if (v.size() > buf_bytes)
      fail(Errc::BufferTooSmall, "the value has " + std::to_string(v.size()) +
                                     " bytes, the buffer " + std::to_string(buf_bytes));
    if (!v.empty()) std::memcpy(buf, v.data(), v.size());
  });
}

KVC_API kvc_status kvc_store_contains(kvc_store *store, const void *const *keys,
                                      const size_t *key_bytes, size_t n, uint8_t *found) {
  return guard([&] { store_of(store).contains(keys, key_bytes, n, found); });
}

KVC_API kvc_status kvc_store_remove(kvc_store *store, const void *key, size_t key_bytes,
                                    int32_t *removed) {
  if (removed) *removed = 0;
  return guard([&] {
    const bool had = store_of(store).remove(key, key_bytes);
    if (removed) *removed = had ? 1 : 0;
  });
}

KVC_API kvc_status kvc_store_pin(kvc_store *store, const void *key, size_t key_bytes, int32_t pin,
                                 int32_t *done) {
  if (done) *done = 0;
  return guard([&] {
    auto &s = store_of(store);
    if (pin != 0 && pin != 1)
      fail(Errc::InvalidArgument, "pin " + std::to_string(pin) + ": 1 (pin) or 0 (unpin)");
    const bool d = s.pin(key, key_bytes, pin == 1);
    if (done) *done = d ? 1 : 0;
  });
}

KVC_API kvc_status kvc_store_stats(kvc_store *store, kvc_tier_stats *stats) {
  return guard([&] { write_tier_stats(store_of(store).counts(), stats); });
}

}  // extern "C"
