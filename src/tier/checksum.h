// The tiers' record checksum: XXH3-64 (seed 0), equal to xxHash's XXH3_64bits.
// With AVX2 (checked at run time) an AVX2 build of xxHash's XXH3 runs
// (Debian's libxxhash is built for SSE2: about half the speed, and the
// checksum is a large part of a disk read).
#pragma once
#include <cstddef>
#include <cstdint>

namespace kvc::tier {

// XXH3-64 of one range (never throws).
uint64_t xxh3(const void *a, size_t na);
// XXH3-64 of two ranges one after the other (their concatenation). Throws
// std::bad_alloc when a hash state cannot be allocated.
uint64_t xxh3_pair(const void *a, size_t na, const void *b, size_t nb);

// Streaming form (for reading and hashing a record in pieces while they are
// still in cache). The constructor throws std::bad_alloc.
class Xxh3Stream {
 public:
  Xxh3Stream();
  ~Xxh3Stream();
  Xxh3Stream(const Xxh3Stream &) = delete;
  Xxh3Stream &operator=(const Xxh3Stream &) = delete;
  void reset();
  void update(const void *p, size_t n);
  uint64_t digest() const;

 private:
  void *s_;
  bool avx2_;
};

}  // namespace kvc::tier
