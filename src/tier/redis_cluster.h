// The Redis tier's cluster helpers (docs/tiers.md, "Redis"): the key-to-slot
// function of the Redis Cluster specification, and the redirect counters of a
// Redis tier (internal: for tests and diagnostics).
#pragma once
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "tier/tier.h"

namespace kvc::tier::redis {

constexpr uint32_t kSlots = 16384;

// CRC16-XMODEM (polynomial 0x1021, initial value 0, no reflection): the
// checksum Redis Cluster hashes keys with; crc16("123456789") == 0x31C3.
uint16_t crc16(const void *data, size_t n);

// The cluster slot of `key`: CRC16 mod 16384 of the hash tag when the key has
// one (the bytes between its first '{' and the first '}' after it, if not
// empty), else of the whole key.
uint16_t key_slot(std::string_view key);

// What a Redis tier's client did beyond plain commands.
struct Redirects {
  uint64_t moved = 0;          // MOVED redirects followed
  uint64_t ask = 0;            // ASK redirects followed
  uint64_t map_refreshes = 0;  // slot maps read (CLUSTER SLOTS), the first one included
  uint64_t reconnects = 0;     // connections opened after the first one to the same node
  uint64_t round_trips = 0;    // commands or pipelines sent to a node and answered (or not)
};

// The counters of `t` when it is a Redis tier (else false).
bool redirects_of(const Tier &t, Redirects *out);

}  // namespace kvc::tier::redis
