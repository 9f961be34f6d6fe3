// Codec internals shared by the files of src/codec (the module's interface is
// codec.h). The files, one concern each, as faiss's scalar_quantizer/ keeps
// its codecs around one dispatch header:
//   kernels.h          this header: Params, the integer formats, make_params,
//                      the inline scale helpers, the run-time AVX2 switch
//   scalar.h           the scalar reference run kernels (integer codes)
//   kernels_avx2.h     AVX2 integer run kernels and their vector helpers,
//                      min / max, finiteness checks
//   fp8_avx2.h         AVX2 fp8 run kernels
//   hadamard_avx2.h    the rotation's butterflies in AVX2 registers (blocks
//                      of 64 and 128 whole), shared by hadamard.cpp and the
//                      fused quantize / dequantize paths
//   encode.cpp         encode() / decode(): run dispatch, rows, granularities
//   scales.cpp         validate(), num_scales(), the scale helpers of codec.h,
//                      set_force_scalar(), set_simd_level()
//   hadamard.cpp       the Hadamard rotation (scalar and AVX2)
//   quantize.cpp       the standalone array API: quantize() / dequantize()
//   params_avx2.h/.cpp  make_params() of many groups at once in vector lanes
//                      (the same bits), for the AVX2 quantize paths
//   quantize_avx2.cpp  quantize()'s fused and one-pass f16 paths
//   quantize_avx512.cpp  the one-pass f16 path's first pass and int8 / int4
//                      encoders with 512-bit vectors (AVX-512 F + BW + VL)
//   dequantize_avx2.cpp  dequantize()'s one-pass and fused paths
//
// Scalar and AVX2 paths compute the same float operations in the same order,
// so their results are identical bit for bit (tests/codec checks it); every
// AVX2 function carries its own target attribute (no file is compiled with
// -mavx2), and the run-time switch picks the path.
//
// Functions defined in these headers sit in an unnamed namespace: each file
// compiles its own copy, so the compiler sees and inlines them as it did when
// the codec was one file. The scale helpers of codec.h have inline copies
// here (kvc::codec::inl) for the same reason.
#pragma once
#if defined(__x86_64__)
#define KVC_CODEC_X86 1
#endif

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <string>

#include "codec/codec.h"
#include "common/convert.h"
#include "common/fp8.h"
#include "common/strings.h"

namespace kvc::codec {

struct Params {
  float scale = 0.0f;  // stored value
  float inv = 0.0f;    // 1 / scale (0 when scale is 0)
  float zero = 0.0f;   // stored zero point (asymmetric)
};

struct IntFormat {
  int bits;
  int32_t off;  // stored code = q + off
  float lo, hi;
};

// Messages (scales.cpp).

// set_force_scalar(true): the scalar reference kernels only (scales.cpp).
// Hidden, so the kernels read it directly (no GOT load), as in one file.
extern bool g_force_scalar __attribute__((visibility("hidden")));
// set_simd_level(1): AVX2 kernels only, no 512-bit ones (scales.cpp).
extern bool g_no_avx512 __attribute__((visibility("hidden")));

// The scale helpers of codec.h, inline for the kernels (codec.h's
// load_scale, store_scale, round_scale_up and round_zero_down call these).
namespace inl {

inline float load_scale(const uint8_t *p, DType sd) {
  if (sd == DType::F16) return f16_to_f32_scalar(static_cast<uint16_t>(p[0] | (p[1] << 8)));
  const uint32_t u = static_cast<uint32_t>(p[0]) | static_cast<uint32_t>(p[1]) << 8 |
                     static_cast<uint32_t>(p[2]) << 16 | static_cast<uint32_t>(p[3]) << 24;
  return bits_f32(u);
}

inline void store_scale(uint8_t *p, DType sd, float v) {
  if (sd == DType::F16) {
    const uint16_t h = f32_to_f16_scalar(v);
    p[0] = static_cast<uint8_t>(h);
    p[1] = static_cast<uint8_t>(h >> 8);
    return;
  }
  const uint32_t u = f32_bits(v);
  p[0] = static_cast<uint8_t>(u);
  p[1] = static_cast<uint8_t>(u >> 8);
  p[2] = static_cast<uint8_t>(u >> 16);
  p[3] = static_cast<uint8_t>(u >> 24);
}

inline float round_scale_up(float v, DType sd) {
  if (sd != DType::F16) return v;
  const float big = 65504.0f;
  if (v >= big) return big;
  uint16_t h = f32_to_f16_scalar(v);
  if (f16_to_f32_scalar(h) < v) ++h;  // next f16 up (v > 0)
  return f16_to_f32_scalar(h);
}

// Not inlined (a call, as when the codec was one file): inlined, it made the
// symmetric paths of encode() around it measurably slower.
__attribute__((noinline)) inline float round_zero_down(float v, DType sd) {
  if (sd != DType::F16) return v;
  if (v <= -65504.0f) return -65504.0f;
  if (v >= 65504.0f) return 65504.0f;
  uint16_t h = f32_to_f16_scalar(v);
  if (f16_to_f32_scalar(h) > v) {
    // one step towards -inf
    if (h == 0x0000)
      h = 0x8001;
    else if (h & 0x8000)
      ++h;
    else
      --h;
  }
  return f16_to_f32_scalar(h);
}

}  // namespace inl

#ifdef KVC_CODEC_X86
// The standalone API's AVX2 paths (quantize_avx2.cpp, dequantize_avx2.cpp),
// taken by quantize() and dequantize() on the shapes they check.
// f16 rows, dynamic per-token or per-group scales, no rotation: returns false,
// having written nothing, when the input holds a NaN or Inf.
// keys: the groups' keys f16_keys_avx2 gave (null: computed here, the
// check). f16_keys_avx2: those keys (lo written only for asymmetric and
// full-range codes), false when a value is NaN or Inf.
bool quantize_f16_direct_avx2(const Spec &s, const uint16_t *src, uint64_t n, uint64_t d,
                              uint8_t *codes, uint8_t *scales, uint8_t *zeros,
                              const F16Keys *keys = nullptr);
bool f16_keys_avx2(const Spec &s, const uint16_t *src, uint64_t n, uint64_t d, uint16_t *lo,
                   uint16_t *hi);
// f16 (half) or f32 rows through an L1 buffer of quantize_fast_scratch() floats.
// nonfinite: null (the input was checked), or set to true, and the call
// stopped part way, when a row holds a NaN or Inf (checked before the rows
// are rotated; the output must then be a staging copy the caller drops).
void quantize_fast_avx2(const Spec &s, const void *src, bool half, uint64_t n, uint64_t d,
                        uint8_t *codes, uint8_t *scales, uint8_t *zeros, float *buf,
                        bool *nonfinite = nullptr);
uint64_t quantize_fast_scratch(const Spec &s, uint64_t d);
// Integer and fp8 codes, no rotation, straight to f16 (half) or f32: returns
// false (nothing written) for a dtype it does not take.
bool dequantize_direct_avx2(const Spec &s, bool half, const uint8_t *codes, const uint8_t *scales,
                            const uint8_t *zeros, uint64_t n, uint64_t d, void *dst);
// With or without the rotation, through an L1 row buffer of d floats.
void dequantize_fast_avx2(const Spec &s, bool half, const uint8_t *codes, const uint8_t *scales,
                          const uint8_t *zeros, uint64_t n, uint64_t d, void *dst, float *buf);
#endif

namespace {

inline int qmax_sym(DType d) {
  return d == DType::INT8 ? 127 : d == DType::INT4 ? 7 : d == DType::INT3 ? 3 : 1;
}
inline int qmax_asym(DType d) {
  return d == DType::INT8 ? 255 : d == DType::INT4 ? 15 : d == DType::INT3 ? 7 : 3;
}
inline float fp8_max(DType d) {
  return d == DType::FP8_E4M3 ? kFp8E4m3Max : kFp8E5m2Max;
}

// Scales are computed in double (so max - min cannot overflow), never below
// the smallest normal float (so 1 / scale stays finite: a group of tiny
// values still quantizes within half a step instead of giving 0 * Inf), and
// rounded up to the scale dtype (so no value of the group is clipped by it).
__attribute__((always_inline)) inline Params make_params(const Spec &s, float lo, float hi) {
  Params p;
  if (s.static_scale != 0.0) {
    // The scale as stored (rounded to the scale dtype), so encoding and
    // decoding use the same value. (Negative only for a pool's per-tensor
    // full-range scale, calibrated by dynamic_scale(); callers' static scales
    // are validated positive.)
    p.scale = s.scale_dtype == DType::F16
                  ? f16_to_f32_scalar(f32_to_f16_scalar(static_cast<float>(s.static_scale)))
                  : static_cast<float>(s.static_scale);
    p.inv = 1.0f / p.scale;
    return p;
  }
  lo += 0.0f;  // -0 -> +0: every path (any min/max order) gets the same zero point
  hi += 0.0f;
  double raw;
  if (is_int(s.dtype) && s.asym) {
    // q * scale + zero must stay finite: asymmetric codes cover at most
    // [-1e38, 1e38] (values beyond saturate).
    lo = std::max(lo, -1e38f);
    hi = std::min(hi, 1e38f);
    p.zero = inl::round_zero_down(lo, s.scale_dtype);
    raw = (static_cast<double>(hi) - p.zero) / qmax_asym(s.dtype);
  } else if (is_int(s.dtype) && s.full_range) {
    // Full range (llama.cpp q4_0's rule): the value of largest magnitude (the
    // larger one on a tie) maps to the code -2^(b-1), so the scale is negative
    // when that value is positive, and all 2^b codes are used; values of the
    // other sign beyond (2^(b-1) - 1) steps clamp. Magnitudes capped as below.
    // The sign is chosen on the values as given (capping first would make a
    // tie of -2e38 and 1.5e38, and pick the positive one).
    const bool positive = static_cast<double>(hi) >= -static_cast<double>(lo);
    const double mag =
        std::min(1e38, positive ? static_cast<double>(hi) : -static_cast<double>(lo)) /
        (qmax_sym(s.dtype) + 1);
    if (mag > 0.0) {
      const float f = std::max(static_cast<float>(mag), std::numeric_limits<float>::min());
      const float up = static_cast<double>(f) < mag ? bits_f32(f32_bits(f) + 1) : f;
      const float m = inl::round_scale_up(up, s.scale_dtype);
      p.scale = positive ? -m : m;
      p.inv = positive ? -(1.0f / m) : 1.0f / m;
    }
    return p;
  } else {
    // Symmetric integer codes cover at most [-1e38, 1e38] too (q x scale must
    // stay finite; values beyond saturate).
    const double cap = is_int(s.dtype) ? 1e38 : std::numeric_limits<double>::infinity();
    const double absmax = std::min(
        cap, std::max(std::fabs(static_cast<double>(lo)), std::fabs(static_cast<double>(hi))));
    raw = absmax / (is_fp8(s.dtype) ? fp8_max(s.dtype) : qmax_sym(s.dtype));
  }
  if (raw > 0.0) {
    const float f = std::max(static_cast<float>(raw), std::numeric_limits<float>::min());
    // Round up to a float: the next float above f when f fell short (f > 0,
    // finite: a positive float's successor is its bit pattern plus one).
    const float up = static_cast<double>(f) < raw ? bits_f32(f32_bits(f) + 1) : f;
    p.scale = inl::round_scale_up(up, s.scale_dtype);
  }
  p.inv = p.scale > 0.0f ? 1.0f / p.scale : 0.0f;
  return p;
}

inline IntFormat int_format(DType d, bool asym, bool full_range = false) {
  if (full_range && !asym) {  // codes -2^(b-1) .. 2^(b-1) - 1
    switch (d) {
      case DType::INT8:
        return IntFormat{8, 0, -128, 127};
      case DType::INT4:
        return IntFormat{4, 8, -8, 7};
      case DType::INT3:
        return IntFormat{3, 4, -4, 3};
      default:
        return IntFormat{2, 2, -2, 1};
    }
  }
  switch (d) {
    case DType::INT8:
      return asym ? IntFormat{8, 0, 0, 255} : IntFormat{8, 0, -127, 127};
    case DType::INT4:
      return asym ? IntFormat{4, 0, 0, 15} : IntFormat{4, 8, -7, 7};
    case DType::INT3:
      return asym ? IntFormat{3, 0, 0, 7} : IntFormat{3, 4, -3, 3};
    default:
      return asym ? IntFormat{2, 0, 0, 3} : IntFormat{2, 2, -1, 1};
  }
}

#ifdef KVC_CODEC_X86
inline bool detect_avx2() {
  __builtin_cpu_init();
  // The AVX2 kernels also use FMA (scales, the rotation's butterflies).
  return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
}
#endif

inline bool use_avx2() {
#ifdef KVC_CODEC_X86
  static const bool has = detect_avx2();
  return has && !g_force_scalar;
#else
  return false;
#endif
}

#ifdef KVC_CODEC_X86
// AVX-512 F + BW + VL (__builtin_cpu_supports reports them only where the OS
// saves the 512-bit state), beside AVX2 + FMA.
inline bool detect_avx512() {
  __builtin_cpu_init();
  // (BMI2 too: quantize_avx512.cpp's shifts; every AVX-512 CPU has it.)
  return detect_avx2() && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
         __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("bmi2");
}
#endif

// The 512-bit kernels (quantize_avx512.cpp), where use_avx2() holds too.
inline bool use_avx512() {
#ifdef KVC_CODEC_X86
  static const bool has = detect_avx512();
  return has && !g_force_scalar && !g_no_avx512;
#else
  return false;
#endif
}

inline bool has_scales(const Spec &s) {
  return !is_float(s.dtype);
}

}  // namespace

#ifdef KVC_CODEC_X86
// quantize_avx512.cpp. The first pass of the one-pass f16 path
// (quantize_avx2.cpp's f16_group_keys) for g a multiple of 32: false when
// any value is NaN or Inf.
bool f16_group_keys_avx512(bool is_signed, const uint16_t *h, uint64_t groups, uint64_t g,
                           uint16_t *lo_keys, uint16_t *hi_keys);
// True when no 16-bit float of h [n] (any n) has its exponent field all
// ones (mask 0x7c00: f16, 0x7f80: bf16): check_finite_raw's test, 64 bytes a
// load into four independent maxima.
bool all_finite_16_avx512(const uint16_t *h, uint64_t n, uint16_t mask);
// Its int8 (bits 8) or int4 (bits 4) codes of m groups of g values (g a
// multiple of 32), mode 0 symmetric, 1 asymmetric, 2 full range; stream
// (int8 only): non-temporal stores, out 64-byte aligned.
void encode_groups_f16_avx512(int bits, int mode, bool stream, const uint16_t *x, uint64_t m,
                              uint64_t g, const float *iv, const float *zp, const IntFormat &f,
                              uint8_t *out);
// The same codes from f32 rows (quantize_avx2.cpp's encode_groups32: every
// mode clamped), without streaming; group k's parameters ps[k x ps_step]
// (ps_step 0: one Params for every group).
void encode_groups_f32_avx512(int bits, int mode, const float *x, uint64_t m, uint64_t g,
                              const Params *ps, uint64_t ps_step, const IntFormat &f, uint8_t *out);
// fp8 codes (e4m3 when e4m3, else e5m2) of m groups of g values (g a
// multiple of 32) from f16 (half) or f32 rows, group k scaled by iv[k]:
// quantize_avx2.cpp's encode_fp8_groups (the scalar encoder's codes, bit for
// bit) 64 values a step; ahead (elements, 0: none): each step prefetches the
// lines of its values that far ahead (the next chunk of rows).
void encode_fp8_groups_avx512(bool e4m3, bool half, const void *x, uint64_t m, uint64_t g,
                              const float *iv, uint8_t *out, uint64_t ahead = 0);
// The normalized Hadamard transform (hadamard_avx2.h's register path: the
// same bits) of a row of d values (f16 when half, else f32) in blocks of
// 64 or 128, into x [d] f32; norm = 1 / sqrt(block) as hadamard() rounds it.
void rotate_row_avx512(const void *row, bool half, float *x, uint64_t d, uint32_t block,
                       float norm);
// rotate_row_avx512 that also writes each group's min and max from the
// registers (groups of g values, g % 16 == 0; g = d: one per row):
// lohi[2k], lohi[2k + 1] = min, max of group k (what asymmetric and
// full-range codes' parameters need, as quantize_avx2.cpp's min / max pass
// writes them); false when a rotated value is NaN or Inf (every pair written
// all the same).
bool rotate_row_minmax_avx512(const void *row, bool half, float *x, uint64_t d, uint32_t block,
                              float norm, uint64_t g, float *lohi);
// The same transform of an f32 row x [d] (the inverse rotation: the
// transform is its own inverse) into out [d] (f16, rounded to nearest even,
// when half; else f32).
void unrotate_row_avx512(const float *x, bool half, void *out, uint64_t d, uint32_t block,
                         float norm);
// One row of int8 or int4 codes (bits; groups of g values, g % 16 == 0;
// sc / zr: its groups' stored scales and zero points, f16 when f16_scales
// else f32, zr read only when asym; off the int4 offset) decoded and rotated
// back in registers into out [d] (f16 when half, else f32):
// dequantize_avx2.cpp's decode then unrotate_row_avx512, the same bits, with
// no f32 row between them.
void decode_unrotate_row_avx512(int bits, bool asym, int32_t off, const uint8_t *in,
                                const uint8_t *sc, const uint8_t *zr, bool f16_scales, uint64_t g,
                                uint64_t d, uint32_t block, float norm, bool half, void *out);
#endif

}  // namespace kvc::codec
