// RoPE rotations: by a shift of positions (RopeShift: eviction re-rotating
// kept keys, StreamingLLM) and at absolute positions (RopeTable: pools that
// quantize keys in their pre-RoPE space, KVC_POOL_PRE_ROPE_KEYS; KVQuant,
// arXiv 2401.18079, section 3.2: per-channel key statistics are stable
// before the rotation, which mixes each pair of channels differently at
// every position).
//
// RopeTable: the cosine and sine of pos x freq_i come from four tables of 256 angles
// each (pos split into bytes: angle(pos) = sum of angle(byte_k x 256^k)),
// combined in double. The result depends only on the position, never on how
// a caller splits a run of tokens, so a key reads back the same bits through
// kvc_gather() and attention.
#pragma once
#include <cmath>
#include <cstdint>
#include <cstddef>
#include <vector>

namespace kvc {

// Turns pair i of each of the `heads` rows of head_dim values at x by the
// angle whose cosine and sine are cs[2i] and cs[2i + 1] (in double):
// interleaved pairs (2i, 2i+1) or NeoX pairs (i, i + half).
inline void rotate_pairs(float *x, uint32_t heads, uint32_t head_dim, uint32_t half,
                         bool interleaved, const double *cs) {
  for (uint32_t hh = 0; hh < heads; ++hh) {
    float *y = x + static_cast<uint64_t>(hh) * head_dim;
    for (uint32_t i = 0; i < half; ++i) {
      const uint32_t i0 = interleaved ? 2 * i : i, i1 = interleaved ? 2 * i + 1 : i + half;
      const double x0 = y[i0], x1 = y[i1], c = cs[2 * i], s = cs[2 * i + 1];
      y[i0] = static_cast<float>(x0 * c - x1 * s);
      y[i1] = static_cast<float>(x0 * s + x1 * c);
    }
  }
}

// Rotates keys by `delta` positions, for eviction's re-rotation (RoPE is a
// rotation per pair: rotating by a then by b is rotating by a + b). The
// cosines and sines are computed once per distinct delta (consecutive tokens
// usually share one).
class RopeShift {
 public:
  RopeShift(uint32_t head_dim, uint32_t dims, bool interleaved, double theta)
      : hd_(head_dim), interleaved_(interleaved), freq_(dims / 2), cs_(dims) {
    for (uint32_t i = 0; i < dims / 2; ++i) freq_[i] = std::pow(theta, -2.0 * i / dims);
  }
  // One head row of head_dim values.
  void rotate(float *x, int64_t delta) {
    if (delta != delta_) {
      for (size_t i = 0; i < freq_.size(); ++i) {
        const double a = static_cast<double>(delta) * freq_[i];
        cs_[2 * i] = std::cos(a);
        cs_[2 * i + 1] = std::sin(a);
      }
      delta_ = delta;
    }
    rotate_pairs(x, 1, hd_, static_cast<uint32_t>(freq_.size()), interleaved_, cs_.data());
  }

 private:
  uint32_t hd_;
  bool interleaved_;
  std::vector<double> freq_, cs_;
  int64_t delta_ = INT64_MIN;
};

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
    rotate_pairs(x, heads, hd_, half_, interleaved_, cs.data());
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

}  // namespace kvc
