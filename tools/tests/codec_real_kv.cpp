// codec_real_kv: every codec against its analytic bound on real K/V rows,
// captured from the shared model's forward pass (the runner on an f32 pool),
// through the public quantizer (kvc_quantize / kvc_dequantize):
// - unrotated integer codecs: every element within half a step of its input
//   (its own group's scale, f32 scales so the step is read back exactly);
// - fp8: the relative error of normal values within half an ulp;
// - rotated codecs: each row's L2 error within the bound of the codec in the
//   rotated space.
// It also prints the L2 error of int4 / int2 with and without the Hadamard
// rotation on these keys, and with an outlier channel injected, so the
// rotation's effect is measured, not assumed.
#include <kvcache/kvcache.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <vector>

#include "runner/kv_cache.h"
#include "runner/model.h"
#include "runner/runner.h"
#include "runner/transformer.h"

using namespace kvc_runner;

namespace {
int g_fail = 0;
#define CHECK(c, ...)                                                \
  do {                                                               \
    if (!(c)) {                                                      \
      if (g_fail < 10) {                                             \
        std::fprintf(stderr, "%s:%d: %s: ", __FILE__, __LINE__, #c); \
        std::fprintf(stderr, __VA_ARGS__);                           \
        std::fprintf(stderr, "\n");                                  \
      }                                                              \
      ++g_fail;                                                      \
    }                                                                \
  } while (0)

struct Quant {
  std::vector<uint8_t> codes, scales, zeros;
  std::vector<float> out;
};

Quant roundtrip(const kvc_codec &c, const std::vector<float> &x, uint64_t n, uint64_t d) {
  Quant q;
  kvc_quant_sizes qs;
  kvc_quant_sizes_init(&qs);
  if (kvc_quantize_sizes(&c, n, d, &qs) != KVC_OK) {
    CHECK(false, "sizes: %s", kvc_last_error_message());
    return q;
  }
  q.codes.resize(qs.codes_bytes);
  q.scales.resize(qs.scales_bytes + 4);
  q.zeros.resize(qs.zeros_bytes + 4);
  q.out.resize(n * d);
  CHECK(kvc_quantize(&c, x.data(), KVC_DTYPE_F32, n, d, q.codes.data(), q.scales.data(),
                     q.zeros.data()) == KVC_OK,
        "quantize: %s", kvc_last_error_message());
  CHECK(kvc_dequantize(&c, q.codes.data(), q.scales.data(), q.zeros.data(), n, d, q.out.data(),
                       KVC_DTYPE_F32) == KVC_OK,
        "dequantize: %s", kvc_last_error_message());
  return q;
}

float scale_at(const Quant &q, uint64_t idx) {
  float s;
  std::memcpy(&s, q.scales.data() + idx * 4, 4);  // f32 scales, little-endian hosts
  return s;
}

double l2(const std::vector<float> &a, const std::vector<float> &b, uint64_t from, uint64_t n) {
  double e = 0;
  for (uint64_t i = from; i < from + n; ++i) e += double(a[i] - b[i]) * (a[i] - b[i]);
  return std::sqrt(e);
}
}  // namespace

int main() {
  const Model model = Model::load(resolve_model_path("stories260k"));
  const ModelConfig &c = model.config();
  Transformer tr(model);
  KvPool pool(c, KVC_DTYPE_F32, KVC_DTYPE_F32, 512);
  PoolSequence seq(pool, 1, c.n_layers);
  const int steps = 256;
  int tok = 1;
  for (int pos = 0; pos < steps; ++pos) {
    const float *lg = tr.forward(seq, tok, pos);
    tok = static_cast<int>(std::max_element(lg, lg + c.vocab_size) - lg);
  }
  const uint64_t H = uint64_t(c.n_kv_heads), D = uint64_t(c.head_dim()), row = H * D;
  // Real rows: K and V of every layer, [steps][H * D] each.
  std::vector<std::vector<float>> tensors;
  for (int l = 0; l < c.n_layers; ++l) {
    std::vector<float> k(steps * row), v(steps * row);
    CHECK(kvc_gather(pool.get(), 1, uint32_t(l), 0, steps, k.data(), v.data(), KVC_DTYPE_F32,
                     nullptr) == KVC_OK,
          "gather");
    tensors.push_back(std::move(k));
    tensors.push_back(std::move(v));
  }
  const kvc_dtype ints[4] = {KVC_DTYPE_INT8, KVC_DTYPE_INT4, KVC_DTYPE_INT3, KVC_DTYPE_INT2};
  for (const std::vector<float> &x : tensors) {
    // Integer codecs, per token (rows of head_dim), per group of 16 / 32 values
    // of a token's row, per channel over 16 tokens; symmetric and asymmetric.
    for (kvc_dtype dt : ints)
      for (int gran = 0; gran < 3; ++gran)
        for (int asym = 0; asym < 2; ++asym) {
          kvc_codec cd;
          kvc_codec_init(&cd);
          cd.dtype = dt;
          cd.asymmetric = uint32_t(asym);
          uint64_t n = steps, d = row;
          if (gran == 0) {
            cd.granularity = KVC_SCALE_PER_TOKEN;
            n = steps * H;
            d = D;
          } else if (gran == 1) {
            cd.granularity = KVC_SCALE_PER_GROUP;
            cd.group_size = 16;
          } else {
            cd.granularity = KVC_SCALE_PER_CHANNEL;
            cd.group_size = 16;
          }
          const Quant q = roundtrip(cd, x, n, d);
          for (uint64_t r = 0; r < n; ++r)
            for (uint64_t j = 0; j < d; ++j) {
              const uint64_t idx = gran == 0   ? r
                                   : gran == 1 ? r * ((d + 15) / 16) + j / 16
                                               : (r / 16) * d + j;
              const float step = scale_at(q, idx), xv = x[r * d + j];
              const float err = std::fabs(q.out[r * d + j] - xv);
              CHECK(err <= 0.5f * step * (1 + 1e-5f) + 4e-7f * std::fabs(xv),
                    "dtype %d gran %d asym %d: x %g -> %g, step %g", int(dt), gran, asym, xv,
                    q.out[r * d + j], step);
            }
        }
    // fp8 per token: relative error of normal values within half an ulp.
    for (kvc_dtype dt : {KVC_DTYPE_FP8_E4M3, KVC_DTYPE_FP8_E5M2}) {
      kvc_codec cd;
      kvc_codec_init(&cd);
      cd.dtype = dt;
      cd.granularity = KVC_SCALE_PER_TOKEN;
      const Quant q = roundtrip(cd, x, steps * H, D);
      const float half_ulp = dt == KVC_DTYPE_FP8_E4M3 ? 1.0f / 16 : 1.0f / 8;
      const float min_normal =
          dt == KVC_DTYPE_FP8_E4M3 ? std::ldexp(1.0f, -6) : std::ldexp(1.0f, -14);
      for (uint64_t r = 0; r < steps * H; ++r)
        for (uint64_t j = 0; j < D; ++j) {
          const float xv = x[r * D + j], s = scale_at(q, r);
          if (std::fabs(xv) >= min_normal * s)
            CHECK(std::fabs(q.out[r * D + j] - xv) <= half_ulp * std::fabs(xv) * 1.0001f,
                  "fp8 %g -> %g", xv, q.out[r * D + j]);
        }
    }
    // Rotated int4 / int2 per group: L2 error of each row within the codec's
    // bound in the rotated space (half a step per element).
    for (kvc_dtype dt : {KVC_DTYPE_INT4, KVC_DTYPE_INT2}) {
      kvc_codec cd;
      kvc_codec_init(&cd);
      cd.dtype = dt;
      cd.granularity = KVC_SCALE_PER_GROUP;
      cd.group_size = 16;
      cd.asymmetric = dt == KVC_DTYPE_INT2;
      cd.rotation = KVC_ROTATION_HADAMARD;
      cd.rotation_block = uint32_t(D);  // per head, as in a pool
      const Quant q = roundtrip(cd, x, steps, row);
      for (uint64_t r = 0; r < steps; ++r) {
        double bound2 = 0;
        for (uint64_t g = 0; g < row / 16; ++g) {
          const double st = scale_at(q, r * (row / 16) + g);
          bound2 += 16 * 0.25 * st * st;
        }
        CHECK(l2(q.out, x, r * row, row) <= std::sqrt(bound2) * 1.001 + 1e-5, "rotated row %llu",
              (unsigned long long)r);
      }
    }
  }
  // The rotation's effect, measured on the keys of layer 0 (and with one
  // channel per head scaled by 10, the outlier statistics of large models).
  for (int outlier = 0; outlier < 2; ++outlier) {
    std::vector<float> x = tensors[0];
    if (outlier)
      for (uint64_t t = 0; t < steps; ++t)
        for (uint64_t h = 0; h < H; ++h) x[t * row + h * D + 1] *= 10.0f;
    for (kvc_dtype dt : {KVC_DTYPE_INT4, KVC_DTYPE_INT2}) {
      double err[2];
      for (int rot = 0; rot < 2; ++rot) {
        kvc_codec cd;
        kvc_codec_init(&cd);
        cd.dtype = dt;
        cd.granularity = KVC_SCALE_PER_TOKEN;  // one scale per head: what the rotation helps
        cd.asymmetric = dt == KVC_DTYPE_INT2;
        cd.rotation = rot ? KVC_ROTATION_HADAMARD : KVC_ROTATION_NONE;
        const Quant q = roundtrip(cd, x, steps * H, D);
        err[rot] =
            l2(q.out, x, 0, x.size()) / l2(x, std::vector<float>(x.size(), 0.0f), 0, x.size());
      }
      std::printf(
          "layer-0 keys%s, %s per token and head: relative L2 error %.4f plain, %.4f Hadamard\n",
          outlier ? " with an outlier channel x10" : "",
          dt == KVC_DTYPE_INT4 ? "int4" : "int2 asym", err[0], err[1]);
      if (outlier) CHECK(err[1] < err[0], "the rotation should help against an outlier channel");
    }
  }
  std::printf("%d passed, %d failed\n", g_fail ? 0 : 1, g_fail ? 1 : 0);
  return g_fail ? 1 : 0;
}
