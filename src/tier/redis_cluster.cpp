// Key slots of the Redis Cluster specification (no hiredis needed).
#include "tier/redis_cluster.h"

namespace kvc::tier::redis {

namespace {

// The table of CRC16-XMODEM remainders of every byte value, built at compile time.
struct Crc16Table {
  uint16_t v[256];
  constexpr Crc16Table() : v() {
    for (uint32_t b = 0; b < 256; ++b) {
      uint32_t r = b << 8;
      for (int i = 0; i < 8; ++i) r = (r & 0x8000) ? (r << 1) ^ 0x1021 : r << 1;
      v[b] = static_cast<uint16_t>(r);
    }
  }
};
constexpr Crc16Table kCrc;

}  // namespace

uint16_t crc16(const void *data, size_t n) {
  const auto *p = static_cast<const uint8_t *>(data);
  uint16_t crc = 0;
  for (size_t i = 0; i < n; ++i)
    crc = static_cast<uint16_t>((crc << 8) ^ kCrc.v[((crc >> 8) ^ p[i]) & 0xff]);
  return crc;
}

uint16_t key_slot(std::string_view key) {
  const size_t open = key.find('{');
  if (open != std::string_view::npos) {
    const size_t close = key.find('}', open + 1);
    if (close != std::string_view::npos && close > open + 1)
      key = key.substr(open + 1, close - open - 1);
  }
  return static_cast<uint16_t>(crc16(key.data(), key.size()) % kSlots);
}

}  // namespace kvc::tier::redis
