// Reading and writing structs that grow (docs/abi-policy.md): the caller's
// struct_size says how much of the struct it has.
#pragma once
#include <cstddef>
#include <cstring>
#include <string>

#include "core/error.h"

namespace kvc::api {

// Copies the caller's input struct into `out` (which holds the library's
// defaults): bytes up to min(struct_size, sizeof(T)) come from the caller.
// Refuses a struct_size below `min_size`, and a larger struct whose unknown
// trailing bytes are not all zero.
template <typename T>
void read_input_struct(const T *in, size_t min_size, const char *name, T *out) {
  const size_t sz = in->struct_size;
  if (sz < min_size)
    core::fail(core::Errc::StructSize, std::string(name) + ".struct_size " + std::to_string(sz) +
                                           ": must be at least " + std::to_string(min_size) +
                                           " (set it with sizeof or the _init function)");
  if (sz > sizeof(T)) {
    const unsigned char *extra = reinterpret_cast<const unsigned char *>(in) + sizeof(T);
    for (size_t i = 0; i < sz - sizeof(T); ++i)
      if (extra[i] != 0)
        core::fail(core::Errc::Unsupported,
                   std::string(name) + ": field at byte offset " + std::to_string(sizeof(T) + i) +
                       " is unknown to this library version (" + std::to_string(sizeof(T)) +
                       "-byte struct) and not zero");
  }
  const size_t n = sz < sizeof(T) ? sz : sizeof(T);
  std::memcpy(reinterpret_cast<unsigned char *>(out) + sizeof(size_t),
              reinterpret_cast<const unsigned char *>(in) + sizeof(size_t), n - sizeof(size_t));
  out->struct_size = sizeof(T);
}

// Checks an output struct's size before anything is computed.
template <typename T>
void check_output_struct(const T *out, size_t min_size, const char *name) {
  if (out->struct_size < min_size)
    core::fail(core::Errc::StructSize, std::string(name) + ".struct_size " +
                                           std::to_string(out->struct_size) +
                                           ": must be at least " + std::to_string(min_size));
}

// Writes `full` into the caller's struct: only the bytes its struct_size
// covers (never past sizeof(T)); struct_size itself is left as the caller set it.
template <typename T>
void write_output_struct(const T &full, T *out) {
  const size_t sz = out->struct_size < sizeof(T) ? out->struct_size : sizeof(T);
  std::memcpy(reinterpret_cast<unsigned char *>(out) + sizeof(size_t),
              reinterpret_cast<const unsigned char *>(&full) + sizeof(size_t), sz - sizeof(size_t));
}

}  // namespace kvc::api
