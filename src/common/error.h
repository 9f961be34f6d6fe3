// Errors inside the core. The core never sees kvc_status or C strings: it
// throws kvc::Error with an Errc; src/api turns it into a kvc_status and
// the thread's last error message.
#pragma once
#include <cstdint>
#include <stdexcept>
#include <string>

namespace kvc {

// Values equal the public kvc_status values (checked by static_assert in src/api).
enum class Errc : int32_t {
  InvalidArgument = 1,
  NullPointer = 2,
  StructSize = 3,
  Unsupported = 4,
  Overflow = 5,
  OutOfMemory = 6,
  PoolExhausted = 7,
  SeqNotFound = 8,
  SeqExists = 9,
  OutOfRange = 10,
  NotReserved = 11,
  BufferTooSmall = 12,
  DeviceUnavailable = 13,
  Version = 14,
  InvalidScale = 15,
  NonFinite = 16,
  Internal = 17,
  Incompatible = 18,
  Corrupt = 19,
  Io = 20,
  Pending = 21,
  Timeout = 22,
  ExceedsCapacity = 23,
};

class Error : public std::runtime_error {
 public:
  Error(Errc code, const std::string &what) : std::runtime_error(what), code_(code) {}
  Errc code() const noexcept { return code_; }

 private:
  Errc code_;
};

[[noreturn]] inline void fail(Errc code, const std::string &what) {
  throw Error(code, what);
}

}  // namespace kvc
