// Specs and scales: validate(), num_scales(), the scale helpers of codec.h
// (load / store, dynamic_scale, rounding to the scale dtype) and the switch
// that forces the scalar reference kernels.
#include <cmath>
#include <cstdio>
#include <string>

#include "codec/codec.h"
#include "codec/kernels.h"
#include "common/error.h"

namespace kvc::codec {

bool g_force_scalar = false;
bool g_no_avx512 = false;

void set_force_scalar(bool on) {
  g_force_scalar = on;
}
bool simd_active() {
  return use_avx2();
}
int set_simd_level(int level) {
  g_force_scalar = level <= 0;
  g_no_avx512 = level <= 1;
  return use_avx512() ? 2 : use_avx2() ? 1 : 0;
}

float load_scale(const uint8_t *p, DType sd) {
  return inl::load_scale(p, sd);
}

void store_scale(uint8_t *p, DType sd, float v) {
  inl::store_scale(p, sd, v);
}

float dynamic_scale(const Spec &s, float lo, float hi) {
  Spec d = s;
  d.static_scale = 0.0;
  return make_params(d, lo, hi).scale;
}

float round_scale_up(float v, DType sd) {
  return inl::round_scale_up(v, sd);
}

float round_zero_down(float v, DType sd) {
  return inl::round_zero_down(v, sd);
}

uint64_t num_scales(const Spec &s, uint64_t n, uint64_t d) {
  if (!has_scales(s)) return 0;
  switch (s.gran) {
    case Gran::None:
      return 0;
    case Gran::Tensor:
      return 1;
    case Gran::Token:
      return n;
    case Gran::Group:
      return n * ((d + s.group - 1) / s.group);
    case Gran::Channel:
      return ((n + s.group - 1) / s.group) * d;
  }
  return 0;
}

void validate(const Spec &s, uint64_t d) {
  const int32_t dt = static_cast<int32_t>(s.dtype);
  if (!kvc::dtype_known(dt))
    fail(Errc::InvalidArgument, "dtype " + std::to_string(dt) + ": unknown storage dtype");
  const int32_t g = static_cast<int32_t>(s.gran);
  if (g < 0 || g > 4) fail(Errc::InvalidArgument, "granularity " + std::to_string(g) + ": unknown");
  if (is_float(s.dtype)) {
    if (s.gran != Gran::None)
      fail(Errc::InvalidArgument,
           std::string("dtype ") + dtype_name(s.dtype) +
               " stores values directly: granularity must be KVC_SCALE_NONE");
    if (s.asym) fail(Errc::InvalidArgument, "asymmetric applies to integer dtypes only");
    if (s.static_scale != 0.0)
      fail(Errc::InvalidScale, "a scale applies to fp8 and integer dtypes only");
    if (s.rotation_block)
      fail(Errc::InvalidArgument, "rotation applies to fp8 and integer dtypes only");
    if (s.outliers) fail(Errc::InvalidArgument, "outliers apply to integer dtypes only");
    return;
  }
  if (s.gran == Gran::None)
    fail(Errc::InvalidArgument, std::string("dtype ") + dtype_name(s.dtype) +
                                    " needs a scale granularity (tensor, token, group or channel)");
  if (s.asym && is_fp8(s.dtype)) fail(Errc::InvalidArgument, "fp8 dtypes are symmetric only");
  if (s.scale_dtype != DType::F32 && s.scale_dtype != DType::F16)
    fail(Errc::InvalidArgument, "scale_dtype must be f32 or f16");
  if (s.gran == Gran::Group || s.gran == Gran::Channel) {
    if (s.group < 1 || s.group > 65536)
      fail(Errc::InvalidArgument, "group_size " + u64s(s.group) + ": must be 1..65536");
  }
  if (std::isnan(s.static_scale) || s.static_scale < 0.0 || std::isinf(s.static_scale))
    fail(Errc::InvalidScale,
         "scale " + fmt_g(s.static_scale) + ": must be a finite value > 0 (0 = dynamic)");
  if (s.static_scale != 0.0) {
    if (s.static_scale < 1e-30 || s.static_scale > 1e30)
      fail(Errc::InvalidScale,
           "scale " + fmt_g(s.static_scale) + ": must be in [1e-30, 1e30] (0 = dynamic)");
    if (s.gran != Gran::Tensor)
      fail(Errc::InvalidArgument, "a static scale needs per-tensor granularity");
    if (s.asym) fail(Errc::InvalidArgument, "a static scale is symmetric: asymmetric must be off");
    if (s.scale_dtype == DType::F16 &&
        (s.static_scale < 6.103515625e-05 || s.static_scale > 65504.0))
      fail(Errc::InvalidScale, "scale " + fmt_g(s.static_scale) +
                                   ": with f16 scales a static scale must be in [6.1e-5, 65504]");
  }
  if (s.outliers) {
    if (!is_int(s.dtype) || s.asym || s.static_scale != 0.0 ||
        (s.gran != Gran::Token && s.gran != Gran::Group))
      fail(Errc::InvalidArgument,
           "outliers apply to symmetric integer codecs (int8, int4, int3, int2) with dynamic "
           "per-token or per-group scales");
    if (s.outliers > kMaxOutliers)
      fail(Errc::InvalidArgument,
           "outliers " + u64s(s.outliers) + ": at most " + u64s(kMaxOutliers) + " per group");
    const uint64_t g = outlier_group(s, d);
    if (g > kMaxOutlierGroup || d % g != 0 || uint64_t(s.outliers) * 4 > g)
      fail(Errc::InvalidArgument,
           "outliers " + u64s(s.outliers) + " in groups of " + u64s(g) + " values (a row of " +
               u64s(d) + "): groups must divide the row, hold at most " + u64s(kMaxOutlierGroup) +
               " values and at least 4 per outlier");
  }
  if (s.rotation_block) {
    const uint32_t b = s.rotation_block;
    if ((b & (b - 1)) != 0 || b > 65536)
      fail(Errc::InvalidArgument,
           "rotation block " + u64s(b) + ": must be a power of two, at most 65536");
    if (d % b != 0)
      fail(Errc::InvalidArgument,
           "rotation block " + u64s(b) + " does not divide the row of " + u64s(d));
  }
}

}  // namespace kvc::codec
