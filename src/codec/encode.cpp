// encode() and decode(): arrays of [n][d] values at each scale granularity,
// row by row through the run kernels (the scalar reference, or AVX2 when the
// CPU has it and set_force_scalar() is off), and check_finite().
#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "codec/codec.h"
#include "codec/fp8_avx2.h"
#include "codec/kernels.h"
#include "codec/kernels_avx2.h"
#include "codec/scalar.h"
#include "common/convert.h"
#include "common/error.h"
#include "common/fp8.h"
#include "common/scratch.h"

namespace kvc::codec {

namespace {

void encode_int_run(const IntFormat &f, bool asym, const float *x, uint64_t j0, uint64_t j1,
                    const Params &p, uint8_t *out) {
#ifdef KVC_CODEC_X86
  if (use_avx2() && j1 - j0 >= 32)
    return asym ? encode_int_run_avx2<true>(f, x, j0, j1, p, out)
                : encode_int_run_avx2<false>(f, x, j0, j1, p, out);
#endif
  encode_int_run_scalar(f, asym, x, j0, j1, p, out);
}

void decode_int_run(const IntFormat &f, bool asym, const uint8_t *in, uint64_t j0, uint64_t j1,
                    const Params &p, float *x) {
#ifdef KVC_CODEC_X86
  if (use_avx2() && j1 - j0 >= 8) return decode_int_run_avx2(f, asym, in, j0, j1, p, x);
#endif
  decode_int_run_scalar(f, asym, in, j0, j1, p, x);
}

void encode_fp8_run(DType dt, const float *x, uint64_t j0, uint64_t j1, float inv, uint8_t *out) {
#ifdef KVC_CODEC_X86
  if (use_avx2() && j1 - j0 >= 32) {
    if (dt == DType::FP8_E4M3) return encode_fp8_run_avx2<3, 7, 0x7eu>(x, j0, j1, inv, out);
    return encode_fp8_run_avx2<2, 15, 0x7bu>(x, j0, j1, inv, out);
  }
#endif
  if (dt == DType::FP8_E4M3)
    for (uint64_t j = j0; j < j1; ++j) out[j] = fp8_e4m3_encode(x[j] * inv);
  else
    for (uint64_t j = j0; j < j1; ++j) out[j] = fp8_e5m2_encode(x[j] * inv);
}

void decode_fp8_run(DType dt, const uint8_t *in, uint64_t j0, uint64_t j1, float scale, float *x) {
  const float *t = dt == DType::FP8_E4M3 ? fp8_e4m3_table() : fp8_e5m2_table();
#ifdef KVC_CODEC_X86
  if (use_avx2() && j1 - j0 >= 8)
    return dt == DType::FP8_E4M3 ? decode_fp8_run_avx2<3, 7>(t, in, j0, j1, scale, x)
                                 : decode_fp8_run_avx2<2, 15>(t, in, j0, j1, scale, x);
#endif
  for (uint64_t j = j0; j < j1; ++j) x[j] = t[in[j]] * scale;
}

// Encodes one row of d values; element j uses params[j / col_group].
void encode_row(const Spec &s, const float *x, uint64_t d, const Params *params, uint64_t col_group,
                uint8_t *out) {
  if (is_int(s.dtype)) {
    const IntFormat f = int_format(s.dtype, s.asym, s.full_range);
    if (f.bits < 8) std::memset(out, 0, row_bytes(s.dtype, d));
    for (uint64_t j0 = 0, g = 0; j0 < d; j0 += col_group, ++g)
      encode_int_run(f, s.asym, x, j0, std::min(d, j0 + col_group), params[g], out);
    return;
  }
  switch (s.dtype) {
    case DType::FP8_E4M3:
    case DType::FP8_E5M2:
      for (uint64_t j0 = 0, g = 0; j0 < d; j0 += col_group, ++g)
        encode_fp8_run(s.dtype, x, j0, std::min(d, j0 + col_group), params[g].inv, out);
      break;
    default:
      convert(x, DType::F32, out, static_cast<DType>(s.dtype), d);
      break;
  }
}

void decode_row(const Spec &s, const uint8_t *in, uint64_t d, const Params *params,
                uint64_t col_group, float *x) {
  if (is_int(s.dtype)) {
    const IntFormat f = int_format(s.dtype, s.asym, s.full_range);
    for (uint64_t j0 = 0, g = 0; j0 < d; j0 += col_group, ++g)
      decode_int_run(f, s.asym, in, j0, std::min(d, j0 + col_group), params[g], x);
    return;
  }
  switch (s.dtype) {
    case DType::FP8_E4M3:
    case DType::FP8_E5M2:
      for (uint64_t j0 = 0, g = 0; j0 < d; j0 += col_group, ++g)
        decode_fp8_run(s.dtype, in, j0, std::min(d, j0 + col_group), params[g].scale, x);
      break;
    default:
      convert(in, static_cast<DType>(s.dtype), x, DType::F32, d);
      break;
  }
}

// Min and max of n values x[0], x[stride], ... (exact in any order).
void min_max(const float *x, uint64_t n, uint64_t stride, float *lo, float *hi) {
#ifdef KVC_CODEC_X86
  if (stride == 1 && n >= 16 && use_avx2()) return min_max_avx2(x, n, lo, hi);
#endif
  float a = x[0], b = x[0];
  for (uint64_t i = 1; i < n; ++i) {
    const float v = x[i * stride];
    a = v < a ? v : a;
    b = v > b ? v : b;
  }
  *lo = a;
  *hi = b;
}

}  // namespace

namespace {
thread_local uint64_t t_major_tokens = 0, t_major_heads = 0;  // HeadMajorNames
}  // namespace

HeadMajorNames::HeadMajorNames(uint64_t tokens, uint64_t heads)
    : saved_{t_major_tokens, t_major_heads} {
  t_major_tokens = tokens;
  t_major_heads = heads;
}
HeadMajorNames::~HeadMajorNames() {
  t_major_tokens = saved_[0];
  t_major_heads = saved_[1];
}

std::string element_name(const char *what, uint64_t i, uint64_t row, uint64_t head_dim) {
  if (row == 0) return std::string(what) + " element " + u64s(i);
  if (t_major_tokens && row == head_dim) {  // [heads][tokens][head_dim]
    const uint64_t r = i / row, t = r % t_major_tokens, h = r / t_major_tokens;
    if (h < t_major_heads)
      return std::string(what) + "[" + u64s(t) + "][" + u64s(h) + "][" + u64s(i % row) + "]";
  }
  const uint64_t r = i / row, c = i % row;
  if (head_dim == 0 || row % head_dim != 0)
    return std::string(what) + "[" + u64s(r) + "][" + u64s(c) + "]";
  return std::string(what) + "[" + u64s(r) + "][" + u64s(c / head_dim) + "][" + u64s(c % head_dim) +
         "]";
}

void check_finite(const float *x, uint64_t n, const char *what, uint64_t row, uint64_t head_dim) {
#ifdef KVC_CODEC_X86
  if (use_avx2() && all_finite_avx2(x, n)) return;
#endif
  for (uint64_t i = 0; i < n; ++i)
    if (!std::isfinite(x[i]))
      fail(Errc::NonFinite, element_name(what, i, row, head_dim) + " is " +
                                (std::isnan(x[i]) ? "NaN" : "Inf") + ": nothing was written");
}

void encode(const Spec &s, const float *x, uint64_t n, uint64_t d, uint8_t *codes, uint8_t *scales,
            uint8_t *zeros) {
  const uint64_t rb = row_bytes(s.dtype, d);
#ifdef KVC_CODEC_X86
  // Integer or fp8 codes with dynamic scales per token or per whole group:
  // quantize()'s fused path (quantize_avx2.cpp: the same codes, scales and
  // zero points as the loops below) on the rows as given (x is already
  // rotated where the spec rotates). A pool's append encodes through here,
  // a decode step's rows at a time. A NaN or Inf stops it part way: the
  // loops below then write every output again.
  if (use_avx2() && convert_has_simd() && d % 8 == 0 && d > 0 && n > 0 && scales &&
      (!s.asym || zeros) && s.static_scale == 0.0 && !s.outliers &&
      (is_int(s.dtype) || is_fp8(s.dtype)) &&
      (s.gran == Gran::Token || (s.gran == Gran::Group && s.group % 8 == 0 && d % s.group == 0))) {
    Spec t = s;
    t.rotation_block = 0;
    thread_local ScratchBuffer<float> buf;  // (not quantize()'s: it may be the caller's x)
    bool bad = false;
    quantize_fast_avx2(t, x, false, n, d, codes, scales, zeros,
                       buf.get(quantize_fast_scratch(t, d)), &bad);
    if (!bad) return;
  }
#endif
  if (!has_scales(s)) {
    for (uint64_t r = 0; r < n; ++r) encode_row(s, x + r * d, d, nullptr, d, codes + r * rb);
    return;
  }
  const uint64_t sb = scale_bytes(s);
  auto put = [&](uint64_t idx, const Params &p) {
    if (scales) inl::store_scale(scales + idx * sb, s.scale_dtype, p.scale);
    if (s.asym && zeros) inl::store_scale(zeros + idx * sb, s.scale_dtype, p.zero);
  };
  switch (s.gran) {
    case Gran::None:
      break;
    case Gran::Tensor: {
      float lo = 0, hi = 0;
      if (n > 0 && d > 0) min_max(x, n * d, 1, &lo, &hi);
      const Params p = make_params(s, lo, hi);
      put(0, p);
      for (uint64_t r = 0; r < n; ++r) encode_row(s, x + r * d, d, &p, d ? d : 1, codes + r * rb);
      break;
    }
    case Gran::Token: {
      for (uint64_t r = 0; r < n; ++r) {
        float lo = 0, hi = 0;
        if (d) min_max(x + r * d, d, 1, &lo, &hi);
        const Params p = make_params(s, lo, hi);
        put(r, p);
        encode_row(s, x + r * d, d, &p, d ? d : 1, codes + r * rb);
      }
      break;
    }
    case Gran::Group: {
      const uint64_t ng = (d + s.group - 1) / s.group;
      std::vector<Params> ps(ng);
      for (uint64_t r = 0; r < n; ++r) {
        for (uint64_t g = 0; g < ng; ++g) {
          const uint64_t b = g * s.group, len = std::min<uint64_t>(s.group, d - b);
          float lo, hi;
          min_max(x + r * d + b, len, 1, &lo, &hi);  // real values only: no padding
          ps[g] = make_params(s, lo, hi);
          put(r * ng + g, ps[g]);
        }
        encode_row(s, x + r * d, d, ps.data(), s.group, codes + r * rb);
      }
      break;
    }
    case Gran::Channel: {
      std::vector<Params> ps(d);
      for (uint64_t r0 = 0; r0 < n; r0 += s.group) {
        const uint64_t rows = std::min<uint64_t>(s.group, n - r0);
        for (uint64_t c = 0; c < d; ++c) {
          float lo, hi;
          min_max(x + r0 * d + c, rows, d, &lo, &hi);
          ps[c] = make_params(s, lo, hi);
          put((r0 / s.group) * d + c, ps[c]);
        }
        for (uint64_t r = r0; r < r0 + rows; ++r)
          encode_row(s, x + r * d, d, ps.data(), 1, codes + r * rb);
      }
      break;
    }
  }
}

void decode(const Spec &s, const uint8_t *codes, const uint8_t *scales, const uint8_t *zeros,
            uint64_t n, uint64_t d, float *out) {
  const uint64_t rb = row_bytes(s.dtype, d);
  if (!has_scales(s)) {
    for (uint64_t r = 0; r < n; ++r) decode_row(s, codes + r * rb, d, nullptr, d, out + r * d);
    return;
  }
  const uint64_t sb = scale_bytes(s);
  auto get = [&](uint64_t idx) {
    Params p;
    p.scale = inl::load_scale(scales + idx * sb, s.scale_dtype);
    if (s.asym) p.zero = inl::load_scale(zeros + idx * sb, s.scale_dtype);
    return p;
  };
  switch (s.gran) {
    case Gran::None:
      break;
    case Gran::Tensor: {
      const Params p = get(0);
      for (uint64_t r = 0; r < n; ++r) decode_row(s, codes + r * rb, d, &p, d ? d : 1, out + r * d);
      break;
    }
    case Gran::Token:
      for (uint64_t r = 0; r < n; ++r) {
        const Params p = get(r);
        decode_row(s, codes + r * rb, d, &p, d ? d : 1, out + r * d);
      }
      break;
    case Gran::Group: {
      const uint64_t ng = (d + s.group - 1) / s.group;
      std::vector<Params> ps(ng);
      for (uint64_t r = 0; r < n; ++r) {
        for (uint64_t g = 0; g < ng; ++g) ps[g] = get(r * ng + g);
        decode_row(s, codes + r * rb, d, ps.data(), s.group, out + r * d);
      }
      break;
    }
    case Gran::Channel: {
#ifdef KVC_CODEC_X86
      // Integer codes: one vector pass per row with the group's scales and
      // zero points as arrays (a run per column costs a call per value).
      if (is_int(s.dtype) && d >= 8 && use_avx2()) {
        const IntFormat f = int_format(s.dtype, s.asym, s.full_range);
        thread_local ScratchBuffer<float> buf;  // scales then zero points, [2][d]
        float *sz = buf.get(2 * d);
        for (uint64_t r = 0; r < n; ++r) {
          if (r % s.group == 0)
            for (uint64_t c = 0; c < d; ++c) {
              const Params p = get((r / s.group) * d + c);
              sz[c] = p.scale;
              sz[d + c] = p.zero;
            }
          decode_int_row_channel_avx2(f, s.asym, codes + r * rb, d, sz, sz + d, out + r * d);
        }
        break;
      }
#endif
      std::vector<Params> ps(d);
      for (uint64_t r = 0; r < n; ++r) {
        if (r % s.group == 0)
          for (uint64_t c = 0; c < d; ++c) ps[c] = get((r / s.group) * d + c);
        decode_row(s, codes + r * rb, d, ps.data(), 1, out + r * d);
      }
      break;
    }
  }
}

}  // namespace kvc::codec
