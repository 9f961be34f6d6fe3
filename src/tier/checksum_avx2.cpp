// XXH3 compiled from xxHash's header for AVX2 (this file only is built with
// -mavx2; tier/checksum.cpp calls it when the CPU has AVX2).
#define XXH_INLINE_ALL
#include <xxhash.h>

#include <cstddef>
#include <cstdint>
#include <new>

namespace kvc::tier {

uint64_t xxh3_avx2(const void *a, size_t na) {
  return XXH3_64bits(a, na);
}

void *xxh3_avx2_new() {
  auto *s = new (std::nothrow) XXH3_state_t;  // XXH3_state_t is 64-byte aligned: aligned new
  if (s) XXH3_INITSTATE(s);
  return s;
}
void xxh3_avx2_free(void *s) {
  delete static_cast<XXH3_state_t *>(s);
}
void xxh3_avx2_reset(void *s) {
  XXH3_64bits_reset(static_cast<XXH3_state_t *>(s));
}
void xxh3_avx2_update(void *s, const void *p, size_t n) {
  XXH3_64bits_update(static_cast<XXH3_state_t *>(s), p, n);
}
uint64_t xxh3_avx2_digest(const void *s) {
  return XXH3_64bits_digest(static_cast<const XXH3_state_t *>(s));
}

}  // namespace kvc::tier
