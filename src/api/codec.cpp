// Element conversion, codecs and the standalone quantizer.
#include <cstddef>
#include <cstring>
#include <string>
#include <vector>

#include "api/api_int.h"
#include "core/arrays.h"

using namespace kvc::api;

namespace {

void codec_defaults(kvc_codec *c) {
  std::memset(c, 0, sizeof *c);
  c->struct_size = sizeof *c;
  c->dtype = KVC_DTYPE_INT8;
  c->granularity = KVC_SCALE_PER_TOKEN;
  c->group_size = 32;
  c->scale_dtype = KVC_DTYPE_F32;
  c->rotation = KVC_ROTATION_NONE;
}

constexpr size_t kCodecMin = offsetof(kvc_codec, scale) + sizeof(double);
constexpr size_t kQuantSizesMin = offsetof(kvc_quant_sizes, num_scales) + sizeof(uint64_t);

}  // namespace

// Reads a caller's codec into the core's Spec. `rotation_row` is the length
// whose largest power-of-two divisor is the default Hadamard block (the row
// for arrays, head_dim in a pool).
kvc::core::CodecSpec kvc::api::to_spec(const kvc_codec *in, const char *name,
                                       uint64_t rotation_row) {
  kvc_codec c;
  codec_defaults(&c);
  kvc::api::read_input_struct(in, kCodecMin, name, &c);
  const int32_t dt = static_cast<int32_t>(c.dtype);
  if (!kvc::dtype_known(dt))
    fail(Errc::InvalidArgument,
         std::string(name) + ".dtype " + std::to_string(dt) + ": unknown dtype");
  if (c.rotation != KVC_ROTATION_NONE && c.rotation != KVC_ROTATION_HADAMARD)
    fail(Errc::InvalidArgument, std::string(name) + ".rotation " +
                                    std::to_string(static_cast<int32_t>(c.rotation)) + ": unknown");
  if (c.asymmetric > 1)
    fail(Errc::InvalidArgument, std::string(name) + ".asymmetric must be 0 or 1");
  if (c.static_scale > 1)
    fail(Errc::InvalidArgument, std::string(name) + ".static_scale must be 0 or 1");
  if (c.full_range > 1)
    fail(Errc::InvalidArgument, std::string(name) + ".full_range must be 0 or 1");
  if (c.full_range && (dt < static_cast<int32_t>(KVC_DTYPE_INT8) || c.asymmetric || c.static_scale))
    fail(Errc::InvalidArgument,
         std::string(name) +
             ".full_range applies to symmetric integer codecs (int8, int4, int3, int2) with "
             "dynamic scales only");
  if (c.static_scale) {
    const double v = c.scale;
    if (!(v >= 1e-30 && v <= 1e30))  // also false for NaN
      fail(Errc::InvalidScale, std::string(name) + ".scale " + fmt_g(v) +
                                   ": a static scale must be a finite value in [1e-30, 1e30]");
  }
  kvc::core::CodecSpec sp;
  sp.dtype = static_cast<kvc::DType>(c.dtype);
  sp.gran = static_cast<kvc::core::ScaleGranularity>(c.granularity);
  sp.group = c.group_size;
  sp.asym = c.asymmetric != 0;
  sp.full_range = c.full_range != 0;
  sp.scale_dtype = static_cast<kvc::DType>(c.scale_dtype);
  sp.static_scale = c.static_scale ? c.scale : 0.0;
  sp.outliers = c.outliers;
  if (c.rotation == KVC_ROTATION_HADAMARD)
    sp.rotation_block =
        c.rotation_block ? c.rotation_block : kvc::core::default_rotation_block(rotation_row);
  else if (c.rotation_block != 0)
    fail(Errc::InvalidArgument, std::string(name) + ".rotation_block set without a rotation");
  return sp;
}

namespace {
kvc::core::ArrayPlan plan_quant(const kvc_codec *codec, uint64_t n, uint64_t d) {
  need(codec, "codec");
  // (d and n first, as plan_array checks them, then the codec struct.)
  if (d < 1 || d > (1u << 24))
    fail(Errc::InvalidArgument, "d " + std::to_string(d) + ": must be 1..2^24");
  if (n > (uint64_t(1) << 40))
    fail(Errc::InvalidArgument, "n " + std::to_string(n) + ": must be 0..2^40");
  const kvc::core::CodecSpec sp = to_spec(codec, "codec", d);
  if (sp.outliers)
    fail(Errc::Unsupported,
         "codec.outliers: the standalone quantizer has no buffer for outlier pairs in this "
         "version; outliers are a pool codec feature");
  return kvc::core::plan_array(sp, n, d);
}
}  // namespace

extern "C" {

KVC_API kvc_status kvc_convert(const void *src, kvc_dtype src_dtype, void *dst, kvc_dtype dst_dtype,
                               size_t n) {
  return guard([&] {
    const DType s = dtype_arg(src_dtype, "src_dtype");
    const DType d = dtype_arg(dst_dtype, "dst_dtype");
    if (n == 0) return;
    need(src, "src");
    need(dst, "dst");
    if (n > SIZE_MAX / 4) fail(Errc::Overflow, "n elements overflow the address space");
    kvc::convert(src, s, dst, d, n);
  });
}

KVC_API kvc_status kvc_dtype_size(kvc_dtype dtype, size_t *bytes) {
  return guard([&] {
    need(bytes, "bytes");
    const int32_t d = static_cast<int32_t>(dtype);
    if (d >= 3 && d <= 8)
      fail(Errc::InvalidArgument, "dtype " + std::to_string(d) +
                                      " is a quantized storage format whose size depends on its "
                                      "codec: use kvc_quantize_sizes() or kvc_pool_get_layout()");
    *bytes = kvc::dtype_bytes(dtype_arg(dtype, "dtype"));
  });
}

KVC_API kvc_status(kvc_codec_init)(kvc_codec *codec) {
  return kvc_codec_init_sized(codec, kvc::api::size_0_3<kvc_codec>);
}

KVC_API kvc_status kvc_codec_init_sized(kvc_codec *codec, size_t struct_size) {
  return guard([&] {
    need(codec, "codec");
    kvc_codec d;
    codec_defaults(&d);
    kvc::api::init_sized(codec, struct_size, kCodecMin, d);
  });
}

KVC_API kvc_status kvc_pool_tensor_scales(kvc_pool *pool, uint32_t layer, float *k_scale,
                                          float *v_scale) {
  return guard([&] {
    auto &p = core_of(pool);
    const auto ks = p.tensor_scales(layer);
    if (k_scale) *k_scale = ks.first;
    if (v_scale) *v_scale = ks.second;
  });
}

KVC_API kvc_status kvc_pool_set_key_smoothing(kvc_pool *pool, const float *scale,
                                              const float *offset, size_t count) {
  return guard([&] { core_of(pool).set_key_smoothing(scale, offset, count); });
}

KVC_API kvc_status kvc_pool_set_codebook(kvc_pool *pool, uint32_t part, const float *levels,
                                         size_t count) {
  return guard([&] {
    if (part > 1)
      fail(Errc::InvalidArgument,
           "part " + std::to_string(part) + " is not 0 (keys) or 1 (values)");
    core_of(pool).set_codebook(static_cast<int>(part), levels, count);
  });
}

KVC_API kvc_status kvc_codebook_gaussian(uint32_t bits, uint64_t group_size, float *levels) {
  return guard([&] {
    if (!levels) fail(Errc::NullPointer, "levels is NULL");
    if (bits < 2 || bits > 4)
      fail(Errc::InvalidArgument, "bits " + std::to_string(bits) + " is not 2, 3 or 4");
    if (group_size == 0) fail(Errc::InvalidArgument, "group_size is 0");
    const float *t = kvc::core::Pool::gaussian_codebook(bits, group_size);
    std::memcpy(levels, t, sizeof(float) << bits);
  });
}

KVC_API kvc_status(kvc_quant_sizes_init)(kvc_quant_sizes *sizes) {
  return kvc_quant_sizes_init_sized(sizes, kvc::api::size_0_3<kvc_quant_sizes>);
}

KVC_API kvc_status kvc_quant_sizes_init_sized(kvc_quant_sizes *sizes, size_t struct_size) {
  return guard([&] {
    need(sizes, "sizes");
    kvc::api::init_sized(sizes, struct_size, kQuantSizesMin, zeroed_struct<kvc_quant_sizes>());
  });
}

KVC_API kvc_status kvc_quantize_sizes(const kvc_codec *codec, uint64_t n, uint64_t d,
                                      kvc_quant_sizes *sizes) {
  return guard([&] {
    need(sizes, "sizes");
    kvc::api::check_output_struct(sizes, kQuantSizesMin, "kvc_quant_sizes");
    const kvc::core::ArrayPlan q = plan_quant(codec, n, d);
    kvc_quant_sizes full{};
    full.struct_size = sizeof full;
    full.codes_bytes = q.codes;
    full.scales_bytes = q.spec.dtype <= kvc::DType::BF16 ? 0 : q.scales;
    full.zeros_bytes = q.zeros;
    full.num_scales = q.num_scales;
    kvc::api::write_output_struct(full, sizes);
  });
}

KVC_API kvc_status kvc_quantize(const kvc_codec *codec, const void *src, kvc_dtype src_dtype,
                                uint64_t n, uint64_t d, void *codes, void *scales, void *zeros) {
  return guard([&] {
    const kvc::core::ArrayPlan q = plan_quant(codec, n, d);
    const DType st = dtype_arg(src_dtype, "src_dtype");
    if (n == 0) return;
    need(src, "src");
    need(codes, "codes");
    if (q.scales && !scales) fail(Errc::NullPointer, "scales is NULL but the codec has scales");
    if (q.zeros && !zeros) fail(Errc::NullPointer, "zeros is NULL but the codec is asymmetric");
    kvc::core::quantize_array(q, src, st, n, d, static_cast<uint8_t *>(codes),
                              static_cast<uint8_t *>(scales), static_cast<uint8_t *>(zeros));
  });
}

KVC_API kvc_status kvc_dequantize(const kvc_codec *codec, const void *codes, const void *scales,
                                  const void *zeros, uint64_t n, uint64_t d, void *dst,
                                  kvc_dtype dst_dtype) {
  return guard([&] {
    const kvc::core::ArrayPlan q = plan_quant(codec, n, d);
    const DType dt = dtype_arg(dst_dtype, "dst_dtype");
    if (n == 0) return;
    need(codes, "codes");
    need(dst, "dst");
    if (q.scales && !scales) fail(Errc::NullPointer, "scales is NULL but the codec has scales");
    if (q.zeros && !zeros) fail(Errc::NullPointer, "zeros is NULL but the codec is asymmetric");
    kvc::core::dequantize_array(q, static_cast<const uint8_t *>(codes),
                                static_cast<const uint8_t *>(scales),
                                static_cast<const uint8_t *>(zeros), n, d, dst, dt);
  });
}

}  // extern "C"
