// Codecs: how K and V values are stored, and the quantize / dequantize
// routines that the pool and the standalone kvc_quantize() API share.
//
// Methods and their sources:
// - symmetric int8 / int4 / int3 / int2 with scale = absmax / qmax (per tensor,
//   per token, per group): the standard absmax quantizer (LLM.int8, vLLM's
//   int8 KV, llama.cpp's q8_0 / q4_0 use per-group scales of 32);
// - asymmetric (min/max with a zero point): KIVI (arXiv 2402.02750);
// - per channel over a group of G tokens (keys in KIVI);
// - fp8 e4m3 / e5m2 with a scale (vLLM, TensorRT-LLM k_scale / v_scale);
// - a Hadamard rotation before quantizing (QuaRot arXiv 2404.00456,
//   TurboQuant arXiv 2504.19874).
// Byte layouts are in docs/codecs.md; everything that leaves the process is
// little-endian.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>

#include "common/convert.h"
#include "common/dtype.h"

namespace kvc::codec {

// Values equal the public kvc_granularity.
enum class Gran : int32_t { None = 0, Tensor = 1, Token = 2, Group = 3, Channel = 4 };

struct Spec {
  DType dtype = DType::F16;
  Gran gran = Gran::None;
  uint32_t group = 0;       // Group: values per group; Channel: tokens per group
  bool asym = false;        // zero point (integer dtypes only)
  bool full_range = false;  // symmetric integers: all 2^b codes, scale = signed extreme / -2^(b-1)
  DType scale_dtype = DType::F32;  // F32 or F16
  double static_scale = 0.0;       // > 0: fixed scale (Tensor granularity), 0: dynamic
  uint32_t rotation_block = 0;     // 0: none; else a Hadamard block (power of two)
  // Outliers per scale group (Token / Group granularity, symmetric integer
  // codes): the values of largest magnitude are stored apart as (index, int8
  // code) pairs and the group's scale covers the others (codec/outliers.cpp).
  uint32_t outliers = 0;
};

// Storage dtypes and their facts (bits, is_float, sym_max, ...): common/dtype.h.

// Bytes of codes for one row of d values.
inline uint64_t row_bytes(DType dt, uint64_t d) {
  return (d * static_cast<uint64_t>(bits_of(dt)) + 7) / 8;
}

// Number of scales (and of zero points when asymmetric) for an [n][d] array.
uint64_t num_scales(const Spec &s, uint64_t n, uint64_t d);
inline uint64_t scale_bytes(const Spec &s) {
  return s.scale_dtype == DType::F16 ? 2 : 4;
}

// Checks a spec for rows of length d (throws Error: InvalidArgument,
// InvalidScale).
void validate(const Spec &s, uint64_t d);

// Largest power of two dividing d (capped at 1024): the default Hadamard block.
uint32_t default_rotation_block(uint64_t d);

// Normalized fast Walsh-Hadamard transform of each block of `block` values of
// x[0..d) (block divides d, power of two). Orthogonal and its own inverse.
void hadamard(float *x, uint64_t d, uint32_t block);
// How the checks below name element i of an input `what` in their messages:
// with row == 0 "what element i"; else by its indices in the input's shape,
// "what[r][c]" for rows of `row` values, or "what[t][h][d]" where the rows
// are heads of head_dim values (a pool's [n_tokens][num_kv_heads][head_dim]).
std::string element_name(const char *what, uint64_t i, uint64_t row = 0, uint64_t head_dim = 0);
// While one lives on this thread, element_name() reads inputs of one head per
// row (row == head_dim) as the head-major copy [heads][tokens][head_dim] of
// the caller's [tokens][heads][head_dim] rows, and names the caller's indices
// (a head-wise pool's append checks such a copy).
class HeadMajorNames {
 public:
  HeadMajorNames(uint64_t tokens, uint64_t heads);
  ~HeadMajorNames();
  HeadMajorNames(const HeadMajorNames &) = delete;
  HeadMajorNames &operator=(const HeadMajorNames &) = delete;

 private:
  uint64_t saved_[2];
};

// Throws NonFinite when some |x| >= FLT_MAX / block (the butterfly could
// overflow), naming the element (element_name).
void check_rotatable(const float *x, uint64_t n, uint32_t block, const char *what = "input",
                     uint64_t row = 0, uint64_t head_dim = 0);

// Throws NonFinite when any of the n values is NaN or Inf, naming the first
// (element_name).
void check_finite(const float *x, uint64_t n, const char *what, uint64_t row = 0,
                  uint64_t head_dim = 0);
// The same for n values of type t (f32, f16 or bf16: the exponent field all
// ones), without converting them.
void check_finite_raw(const void *src, DType t, uint64_t n, const char *what = "input",
                      uint64_t row = 0, uint64_t head_dim = 0);

// Quantize x[n][d] (f32, row stride d). codes: [n][row_bytes(d)];
// scales/zeros: num_scales() entries of scale_dtype (zeros only if asym).
// Rotation, if any, must already be applied by the caller (see quantize()).
void encode(const Spec &s, const float *x, uint64_t n, uint64_t d, uint8_t *codes, uint8_t *scales,
            uint8_t *zeros);
// Inverse of encode (no rotation).
void decode(const Spec &s, const uint8_t *codes, const uint8_t *scales, const uint8_t *zeros,
            uint64_t n, uint64_t d, float *out);

// ---- outliers (Spec::outliers > 0; codec/outliers.cpp, docs/codecs.md) ----
// Largest outliers per group and the most values a group may have with them.
constexpr uint32_t kMaxOutliers = 16;
constexpr uint64_t kMaxOutlierGroup = 256;
// Values per scale group of a row of d values (Token: d, Group: group).
inline uint64_t outlier_group(const Spec &s, uint64_t d) {
  return s.gran == Gran::Group ? s.group : d;
}
// Bytes of the outlier pairs of an [n][d] array: n x (d / group) x outliers x 2.
inline uint64_t outlier_bytes(const Spec &s, uint64_t n, uint64_t d) {
  return s.outliers ? n * (d / outlier_group(s, d)) * s.outliers * 2 : 0;
}
// encode() with outliers: for each group the `outliers` values of largest
// magnitude (ties: the lower index) are taken out, the group is encoded from
// the others (its scale at least the largest outlier's magnitude / 127), and
// each outlier becomes the pair (its index in the group, round(x / scale)
// clamped to [-128, 127]), pairs in the order found. `outl`: [n][groups][k][2].
// Needs `scales` (the pairs use the stored scale).
void encode_outliers(const Spec &s, const float *x, uint64_t n, uint64_t d, uint8_t *codes,
                     uint8_t *scales, uint8_t *outl);
// Writes the outliers of an [n][d] array over its decoded values (before any
// inverse rotation): out[group + index] = code x the group's stored scale.
void apply_outliers(const Spec &s, const uint8_t *scales, const uint8_t *outl, uint64_t n,
                    uint64_t d, float *out);

// ---- codebooks (codec/codebook.cpp, docs/codecs.md) ----------------------
// Symmetric integer codes of 2..4 bits (Token or Group granularity) that
// index `levels` (2^b ascending values in [-1, 1]) instead of the uniform
// grid: with e a group's signed extreme (the value of largest magnitude,
// ties: the first), a value x gets the code of the level nearest to
// x * (1 / e) (ties: the lower); the group's stored scale is
// sign(e) x |x| / |levels[codes]| (norms of the group, computed in double;
// saturated to +-65504 for f16 scales), so the decoded group levels[code] x
// scale keeps the group's norm. Scalar and AVX2 give the same bytes.
void encode_codebook(const Spec &s, const float *levels, const float *x, uint64_t n, uint64_t d,
                     uint8_t *codes, uint8_t *scales);
void decode_codebook(const Spec &s, const float *levels, const uint8_t *codes,
                     const uint8_t *scales, uint64_t n, uint64_t d, float *out);
// The built-in Lloyd-Max levels of Gaussian groups normalized by their signed
// extreme (2^bits values), for the nearest power-of-two group size in
// [8, 1024]; null for bits outside 2..4 or group 0.
const float *gaussian_levels(uint32_t bits, uint64_t group);

// The standalone array API: converts `src` from src_type, rotates, checks
// finiteness, encodes; decode + inverse rotation + conversion. Allocates
// scratch memory.
//
// keys (f16 rows only; null: computed here): the group keys f16_keys() gave
// for these rows, where f16_keys_apply(s, d) holds. (The checks f16_keys made
// are then not repeated: the caller has refused rows it reported non-finite.)
struct F16Keys;
void quantize(const Spec &s, const void *src, DType src_type, uint64_t n, uint64_t d,
              uint8_t *codes, uint8_t *scales, uint8_t *zeros, const F16Keys *keys = nullptr);

// quantize()'s direct path for f16 rows (dynamic per-token or per-group
// scales, no rotation, on an AVX2 CPU) first reads every group's extremes off
// the f16 bits: the "keys", one 16-bit word per group (symmetric codes: the
// group's largest |x| bits in hi; asymmetric and full-range codes: the
// ordered keys of its minimum and maximum in lo and hi). A caller that checks
// its rows before writing anything and quantizes them in pieces (kvc_append:
// one call per block run) computes the keys once, ahead, as that check:
//   f16_keys_apply(s, d)   whether quantize(s, f16 rows of d values) takes
//                          the direct path here (the keys are then used)
//   f16_keys_count(s, n, d)  entries f16_keys writes to lo and to hi: one per
//                          group of the n x d values, and 4 of padding
//   f16_keys(...)          the keys of x [n][d] (f16); false, when a value is
//                          NaN or Inf (every value read; lo, hi then
//                          undefined)
// The keys of the groups of rows r .. of x are at lo + r x (d / g), hi +
// r x (d / g) (g = s.group for per-group scales, d per token).
struct F16Keys {
  const uint16_t *lo = nullptr;  // null for symmetric codes
  const uint16_t *hi = nullptr;
};
bool f16_keys_apply(const Spec &s, uint64_t d);
uint64_t f16_keys_count(const Spec &s, uint64_t n, uint64_t d);
bool f16_keys(const Spec &s, const uint16_t *x, uint64_t n, uint64_t d, uint16_t *lo, uint16_t *hi);
void dequantize(const Spec &s, const uint8_t *codes, const uint8_t *scales, const uint8_t *zeros,
                uint64_t n, uint64_t d, void *dst, DType dst_type);

// Testing: force the scalar reference kernels (true) or allow AVX2 (false).
void set_force_scalar(bool on);
bool simd_active();
// Testing: the widest kernels allowed, 0 scalar, 1 AVX2, 2 also AVX-512
// (the default); returns the level in effect on this CPU.
int set_simd_level(int level);

// Scale helpers (little-endian f32 or f16 in memory).
float load_scale(const uint8_t *p, DType sd);
void store_scale(uint8_t *p, DType sd, float v);
// The dynamic scale of a group whose values span [lo, hi] (as the encoder
// computes it: negative for a full-range group whose extreme is positive).
float dynamic_scale(const Spec &s, float lo, float hi);
// Rounds a scale up (or a zero point down) to the nearest value of sd.
float round_scale_up(float v, DType sd);
float round_zero_down(float v, DType sd);

}  // namespace kvc::codec
