// The scalar reference run kernels of the integer codes: a contiguous run of
// values sharing one Params (the AVX2 kernels of kernels_avx2.h compute the
// same float operations in the same order and fall back on these for the
// elements they leave). fp8 runs use common/fp8.h's encoder and tables.
#pragma once
#include <cmath>
#include <cstdint>

#include "codec/kernels.h"

namespace kvc::codec {
namespace {

// ---- run kernels: a contiguous run of values sharing one Params ----------
// Scalar reference and AVX2 versions compute the same float operations in
// the same order (multiply by the reciprocal, clamp, round half to even), so
// their results are identical bit for bit (tests/codec checks it).

inline int32_t quant_int(float x, const Params &p, bool asym, float lo, float hi) {
  float y = asym ? (x - p.zero) * p.inv : x * p.inv;
  y = y < lo ? lo : y > hi ? hi : y;
  return static_cast<int32_t>(std::nearbyint(y));  // default rounding mode: half to even
}

// Stores code c of element j of a row (int4 / int3 / int2 rows are zeroed
// first). int3: code j holds bits 3j .. 3j + 2 of the row read as one
// little-endian bit string (8 codes in 3 bytes; a code may straddle two bytes).
inline void put_code(uint8_t *out, int bits, uint64_t j, uint32_t c) {
  if (bits == 8)
    out[j] = static_cast<uint8_t>(c);
  else if (bits == 4)
    out[j >> 1] |= static_cast<uint8_t>(c << ((j & 1) * 4));
  else if (bits == 3) {
    const uint64_t b = 3 * j;
    const unsigned sh = static_cast<unsigned>(b & 7);
    out[b >> 3] |= static_cast<uint8_t>(c << sh);
    if (sh > 5) out[(b >> 3) + 1] |= static_cast<uint8_t>(c >> (8 - sh));
  } else
    out[j >> 2] |= static_cast<uint8_t>(c << ((j & 3) * 2));
}
inline int32_t get_code(const uint8_t *in, int bits, uint64_t j) {
  if (bits == 8) return in[j];
  if (bits == 4) return (in[j >> 1] >> ((j & 1) * 4)) & 0xf;
  if (bits == 3) {
    const uint64_t b = 3 * j;
    const unsigned sh = static_cast<unsigned>(b & 7);
    uint32_t w = in[b >> 3];
    if (sh > 5) w |= static_cast<uint32_t>(in[(b >> 3) + 1]) << 8;
    return static_cast<int32_t>((w >> sh) & 0x7);
  }
  return (in[j >> 2] >> ((j & 3) * 2)) & 0x3;
}
// Elements per whole number of code bytes: a vector kernel starts at a
// multiple of it (int3: 8 codes = 3 bytes).
inline uint64_t code_unit(int bits) {
  return bits == 3 ? 8 : static_cast<uint64_t>(8 / bits);
}

[[maybe_unused]] void encode_int_run_scalar(const IntFormat &f, bool asym, const float *x,
                                            uint64_t j0, uint64_t j1, const Params &p,
                                            uint8_t *out) {
  for (uint64_t j = j0; j < j1; ++j)
    put_code(out, f.bits, j,
             static_cast<uint32_t>(quant_int(x[j], p, asym, f.lo, f.hi) + f.off) &
                 ((1u << f.bits) - 1u));
}

[[maybe_unused]] void decode_int_run_scalar(const IntFormat &f, bool asym, const uint8_t *in,
                                            uint64_t j0, uint64_t j1, const Params &p, float *x) {
  for (uint64_t j = j0; j < j1; ++j) {
    int32_t c = get_code(in, f.bits, j);
    if (f.bits == 8 && !asym) c = static_cast<int8_t>(c);
    const float q = static_cast<float>(c - (f.bits == 8 ? 0 : f.off));
    x[j] = asym ? q * p.scale + p.zero : q * p.scale;
  }
}

}  // namespace
}  // namespace kvc::codec
