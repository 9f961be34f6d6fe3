// RoPE rotations at absolute positions, for pools that quantize keys in
// their pre-RoPE space (KVC_POOL_PRE_ROPE_KEYS; KVQuant, arXiv 2401.18079,
// section 3.2: per-channel key statistics are stable before the rotation,
// which mixes each pair of channels differently at every position).
//
// The cosine and sine of pos x freq_i come from four tables of 256 angles
// each (pos split into bytes: angle(pos) = sum of angle(byte_k x 256^k)),
// combined in double. The result depends only on the position, never on how
// a caller splits a run of tokens, so a key reads back the same bits through
// kvc_gather() and attention.
#pragma once
#include <cmath>
#include <cstdint>
#include <vector>

namespace kvc::core {

class RopeTable {
 public:
  // dims: rotated dimensions per head (even, <= head_dim); interleaved pairs
  // (2i, 2i+1) or NeoX pairs (i, i + dims/2), frequency theta^(-2i/dims).
  RopeTable(uint32_t head_dim, uint32_t dims, bool interleaved, double theta)
      : hd_(head_dim),
        half_(dims / 2),
        interleaved_(interleaved),
        cs_(size_t(4) * 256 * half_ * 2) {
    for (uint32_t i = 0; i < half_; ++i) {
      const double f = std::pow(theta, -2.0 * i / dims);
      for (int level = 0; level < 4; ++level)
        for (int b = 0; b < 256; ++b) {
          const double a = static_cast<double>(static_cast<uint64_t>(b) << (8 * level)) * f;
          double *e = entry(level, b, i);
          e[0] = std::cos(a);
          e[1] = std::sin(a);
        }
    }
  }

  // Rotates the `heads` head rows of x (heads x head_dim values) by the
  // angles of position pos (0 <= pos < 2^32), forwards (sign +1: what the
  // engine applied) or backwards (sign -1: undoes it).
  void rotate(float *x, uint32_t heads, uint64_t pos, int sign) const {
    thread_local std::vector<double> cs;
    if (cs.size() < 2 * size_t(half_)) cs.resize(2 * size_t(half_));
    for (uint32_t i = 0; i < half_; ++i) {
      double c = 1.0, s = 0.0;
      for (int level = 0; level < 4; ++level) {
        const uint32_t b = static_cast<uint32_t>(pos >> (8 * level)) & 0xffu;
        if (!b) continue;
        const double *e = entry(level, static_cast<int>(b), i);
        const double nc = c * e[0] - s * e[1], ns = c * e[1] + s * e[0];
        c = nc;
        s = ns;
      }
      cs[2 * i] = c;
      cs[2 * i + 1] = sign < 0 ? -s : s;
    }
    for (uint32_t hh = 0; hh < heads; ++hh) {
      float *y = x + static_cast<uint64_t>(hh) * hd_;
      for (uint32_t i = 0; i < half_; ++i) {
        const uint32_t i0 = interleaved_ ? 2 * i : i, i1 = interleaved_ ? 2 * i + 1 : i + half_;
        const double x0 = y[i0], x1 = y[i1], c = cs[2 * i], s = cs[2 * i + 1];
        y[i0] = static_cast<float>(x0 * c - x1 * s);
        y[i1] = static_cast<float>(x0 * s + x1 * c);
      }
    }
  }

 private:
  double *entry(int level, int b, uint32_t i) {
    return cs_.data() + ((size_t(level) * 256 + b) * half_ + i) * 2;
  }
  const double *entry(int level, int b, uint32_t i) const {
    return cs_.data() + ((size_t(level) * 256 + b) * half_ + i) * 2;
  }

  uint32_t hd_, half_;
  bool interleaved_;
  std::vector<double> cs_;  // [level][byte][pair] (cos, sin)
};

}  // namespace kvc::core
