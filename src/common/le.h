// Little-endian fields of the byte formats that leave the process (block
// keys' hash input, fingerprints, tier payloads; docs/prefix-cache.md,
// docs/tiers.md): written and read byte by byte, so the bytes are the same
// on every host.
#pragma once
#include <cstdint>
#include <cstring>
#include <vector>

namespace kvc {

inline void put_le32(uint8_t *p, uint32_t v) {
  for (int i = 0; i < 4; ++i) p[i] = static_cast<uint8_t>(v >> (8 * i));
}
inline void put_le64(uint8_t *p, uint64_t v) {
  for (int i = 0; i < 8; ++i) p[i] = static_cast<uint8_t>(v >> (8 * i));
}
inline uint32_t get_le32(const uint8_t *p) {
  uint32_t v = 0;
  for (int i = 0; i < 4; ++i) v |= static_cast<uint32_t>(p[i]) << (8 * i);
  return v;
}
inline uint64_t get_le64(const uint8_t *p) {
  uint64_t v = 0;
  for (int i = 0; i < 8; ++i) v |= static_cast<uint64_t>(p[i]) << (8 * i);
  return v;
}
// Appended to a byte vector.
inline void append_le32(std::vector<uint8_t> &b, uint32_t v) {
  for (int i = 0; i < 4; ++i) b.push_back(static_cast<uint8_t>(v >> (8 * i)));
}
inline void append_le64(std::vector<uint8_t> &b, uint64_t v) {
  for (int i = 0; i < 8; ++i) b.push_back(static_cast<uint8_t>(v >> (8 * i)));
}
// A double by its IEEE-754 bits.
inline void append_le_f64(std::vector<uint8_t> &b, double d) {
  uint64_t v;
  std::memcpy(&v, &d, 8);
  append_le64(b, v);
}

}  // namespace kvc
