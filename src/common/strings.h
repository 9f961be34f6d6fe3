// Numbers in error messages: the one way every module writes them.
#pragma once
#include <cstdint>
#include <cstdio>
#include <string>

namespace kvc {

// An unsigned count or size in decimal.
inline std::string u64s(uint64_t v) {
  return std::to_string(v);
}

// A double as printf's %g writes it (scales, fractions).
inline std::string fmt_g(double v) {
  char b[32];
  std::snprintf(b, sizeof b, "%g", v);
  return b;
}

}  // namespace kvc
