// Decoding tables of the fp8 formats (common/fp8.h).
#include "common/fp8.h"

#include <cmath>
#include <limits>
#include <vector>

namespace kvc {

namespace {
template <int kMant, int kBias, bool kHasInf>
std::vector<float> make_table() {
  std::vector<float> t(256);
  for (int c = 0; c < 256; ++c) {
    const int sign = c >> 7, e = (c >> kMant) & ((1 << (7 - kMant)) - 1),
              m = c & ((1 << kMant) - 1);
    const int emax = (1 << (7 - kMant)) - 1;
    float v;
    if (e == 0) {
      v = std::ldexp(static_cast<float>(m), 1 - kBias - kMant);
    } else if (kHasInf && e == emax) {
      v = m == 0 ? std::numeric_limits<float>::infinity() : std::numeric_limits<float>::quiet_NaN();
    } else if (!kHasInf && e == emax && m == (1 << kMant) - 1) {
      v = std::numeric_limits<float>::quiet_NaN();
    } else {
      v = std::ldexp(1.0f + static_cast<float>(m) / static_cast<float>(1 << kMant), e - kBias);
    }
    t[c] = sign ? -v : v;
  }
  return t;
}
}  // namespace

const float *fp8_e4m3_table() {
  static const std::vector<float> t = make_table<3, 7, false>();
  return t.data();
}
const float *fp8_e5m2_table() {
  static const std::vector<float> t = make_table<2, 15, true>();
  return t.data();
}

}  // namespace kvc
