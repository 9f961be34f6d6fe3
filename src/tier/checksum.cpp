#include "tier/checksum.h"

#include <xxhash.h>

#include <new>

namespace kvc::tier {

#if defined(__x86_64__) && defined(KVC_TIER_AVX2)
// checksum_avx2.cpp (built with -mavx2; called only when the CPU has AVX2).
uint64_t xxh3_avx2(const void *a, size_t na);
void *xxh3_avx2_new();
void xxh3_avx2_free(void *s);
void xxh3_avx2_reset(void *s);
void xxh3_avx2_update(void *s, const void *p, size_t n);
uint64_t xxh3_avx2_digest(const void *s);
namespace {
bool have_avx2() {
  static const bool yes = __builtin_cpu_supports("avx2");
  return yes;
}
}  // namespace
#else
namespace {
bool have_avx2() {
  return false;
}
}  // namespace
#endif

uint64_t xxh3(const void *a, size_t na) {
#if defined(__x86_64__) && defined(KVC_TIER_AVX2)
  if (have_avx2()) return xxh3_avx2(a, na);
#endif
  return XXH3_64bits(a, na);
}

Xxh3Stream::Xxh3Stream() : s_(nullptr), avx2_(have_avx2()) {
#if defined(__x86_64__) && defined(KVC_TIER_AVX2)
  if (avx2_) s_ = xxh3_avx2_new();
#endif
  if (!avx2_) s_ = XXH3_createState();
  if (!s_) throw std::bad_alloc();
  reset();
}

Xxh3Stream::~Xxh3Stream() {
#if defined(__x86_64__) && defined(KVC_TIER_AVX2)
  if (avx2_) {
    xxh3_avx2_free(s_);
    return;
  }
#endif
  XXH3_freeState(static_cast<XXH3_state_t *>(s_));
}

void Xxh3Stream::reset() {
#if defined(__x86_64__) && defined(KVC_TIER_AVX2)
  if (avx2_) return xxh3_avx2_reset(s_);
#endif
  XXH3_64bits_reset(static_cast<XXH3_state_t *>(s_));
}

void Xxh3Stream::update(const void *p, size_t n) {
#if defined(__x86_64__) && defined(KVC_TIER_AVX2)
  if (avx2_) return xxh3_avx2_update(s_, p, n);
#endif
  XXH3_64bits_update(static_cast<XXH3_state_t *>(s_), p, n);
}

uint64_t Xxh3Stream::digest() const {
#if defined(__x86_64__) && defined(KVC_TIER_AVX2)
  if (avx2_) return xxh3_avx2_digest(s_);
#endif
  return XXH3_64bits_digest(static_cast<const XXH3_state_t *>(s_));
}

uint64_t xxh3_pair(const void *a, size_t na, const void *b, size_t nb) {
  Xxh3Stream s;
  s.update(a, na);
  s.update(b, nb);
  return s.digest();
}

}  // namespace kvc::tier
