// Reading, writing and initialising structs that grow (docs/abi-policy.md):
// the caller's struct_size says how much of the struct it has.
#pragma once
#include <cstddef>
#include <cstring>
#include <string>

#include "api/struct_fields.h"
#include "common/error.h"

namespace kvc::api {

// Checks a caller's struct_size for a T (`name` names the struct in the
// message): at least `min_size`, at most KVC_STRUCT_SIZE_MAX, and not ending
// inside a field this library knows (padding bytes may be cut: nothing is
// read or written there). Sizes past sizeof(T) belong to a newer header.
template <typename T>
void check_struct_size(size_t sz, size_t min_size, const std::string &name) {
  const std::string what = name + ".struct_size " + std::to_string(sz);
  if (sz < min_size)
    fail(Errc::StructSize, what + ": must be at least " + std::to_string(min_size) +
                               " (set it with sizeof or the _init function)");
  if (sz > KVC_STRUCT_SIZE_MAX)
    fail(Errc::StructSize,
         what + ": above KVC_STRUCT_SIZE_MAX (" + std::to_string(KVC_STRUCT_SIZE_MAX) + ")");
  for (const Field &f : StructInfo<T>::fields)
    if (sz > f.offset && sz < f.offset + f.size)
      fail(Errc::StructSize,
           what + ": ends inside field " + f.name + " (bytes " + std::to_string(f.offset) + ".." +
               std::to_string(f.offset + f.size - 1) + "); a struct_size ends on a field boundary");
}

// Copies the caller's input struct into `out` (which holds the library's
// defaults): bytes up to min(struct_size, sizeof(T)) come from the caller.
// Refuses a struct_size that check_struct_size refuses, and a larger struct
// whose unknown trailing bytes are not all zero.
template <typename T>
void read_input_struct(const T *in, size_t min_size, const char *name, T *out) {
  const size_t sz = in->struct_size;
  check_struct_size<T>(sz, min_size, name);
  if (sz > sizeof(T)) {
    const unsigned char *extra = reinterpret_cast<const unsigned char *>(in) + sizeof(T);
    for (size_t i = 0; i < sz - sizeof(T); ++i)
      if (extra[i] != 0)
        fail(Errc::Unsupported, std::string(name) + ": field at byte offset " +
                                    std::to_string(sizeof(T) + i) +
                                    " is unknown to this library version (" +
                                    std::to_string(sizeof(T)) + "-byte struct) and not zero");
  }
  const size_t n = sz < sizeof(T) ? sz : sizeof(T);
  std::memcpy(reinterpret_cast<unsigned char *>(out) + sizeof(size_t),
              reinterpret_cast<const unsigned char *>(in) + sizeof(size_t), n - sizeof(size_t));
  out->struct_size = sizeof(T);
}

// Checks an output struct's size before anything is computed.
template <typename T>
void check_output_struct(const T *out, size_t min_size, const char *name) {
  check_struct_size<T>(out->struct_size, min_size, name);
}

// Writes `full` into the caller's struct: only the bytes its struct_size
// covers (never past sizeof(T)); struct_size itself is left as the caller set it.
template <typename T>
void write_output_struct(const T &full, T *out) {
  const size_t sz = out->struct_size < sizeof(T) ? out->struct_size : sizeof(T);
  std::memcpy(reinterpret_cast<unsigned char *>(out) + sizeof(size_t),
              reinterpret_cast<const unsigned char *>(&full) + sizeof(size_t), sz - sizeof(size_t));
}

// kvc_<thing>_init_sized: fills exactly `struct_size` bytes of the caller's
// struct from `defaults` (the library's full struct of defaults), with
// struct_size = the caller's size; bytes past sizeof(T) (a newer header's
// fields, zero by design when unset) are zeroed. A refused size writes nothing.
template <typename T>
void init_sized(T *s, size_t struct_size, size_t min_size, const T &defaults) {
  check_struct_size<T>(struct_size, min_size, StructInfo<T>::name);
  T full;
  std::memcpy(&full, &defaults, sizeof(T));
  full.struct_size = struct_size;
  unsigned char *dst = reinterpret_cast<unsigned char *>(s);
  std::memcpy(dst, &full, struct_size < sizeof(T) ? struct_size : sizeof(T));
  if (struct_size > sizeof(T)) std::memset(dst + sizeof(T), 0, struct_size - sizeof(T));
}

// The size the 0.3 kvc_<thing>_init symbols fill, forever.
template <typename T>
constexpr size_t size_0_3 = StructInfo<T>::size_0_3;

}  // namespace kvc::api
