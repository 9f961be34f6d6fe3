// A quantized pool's append (core/store_cpu.cpp, core/format.cpp) stores,
// for every input dtype, exactly the codes, scales and zero points that
// kvc_quantize gives the token's rows converted to f32 (and rotated by the
// codec's Hadamard blocks): f16 rows go straight to the codec, f32 rows are
// encoded in place, bf16 rows and transformed keys through an f32 copy, a
// decode step's tokens in one call where their codes lie back to back.
// Appends straddle block boundaries; a NaN or Inf is refused with nothing
// written.
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "kvcache/kvcache.h"
#include "../whitebox.h"

namespace {

#define OK(x) CHECK_OK(x)

constexpr uint32_t kHeads = 2, kDim = 64, kBlock = 16, kRow = kHeads * kDim;

struct Case {
  const char *name;
  kvc_dtype dtype;
  kvc_granularity gran;
  uint32_t group;
  int asym, full_range, hadamard;
  kvc_dtype scale_dtype;
};

const Case kCases[] = {
    {"int8 per token", KVC_DTYPE_INT8, KVC_SCALE_PER_TOKEN, 0, 0, 0, 0, KVC_DTYPE_F32},
    {"int8 per token asym f16 scales", KVC_DTYPE_INT8, KVC_SCALE_PER_TOKEN, 0, 1, 0, 0,
     KVC_DTYPE_F16},
    {"int4 group 32", KVC_DTYPE_INT4, KVC_SCALE_PER_GROUP, 32, 0, 0, 0, KVC_DTYPE_F16},
    {"int4 group 32 asym", KVC_DTYPE_INT4, KVC_SCALE_PER_GROUP, 32, 1, 0, 0, KVC_DTYPE_F16},
    {"int4 group 32 full range Hadamard", KVC_DTYPE_INT4, KVC_SCALE_PER_GROUP, 32, 0, 1, 1,
     KVC_DTYPE_F16},
    {"int4 per token Hadamard", KVC_DTYPE_INT4, KVC_SCALE_PER_TOKEN, 0, 1, 0, 1, KVC_DTYPE_F32},
    {"int4 group 16 f32 scales", KVC_DTYPE_INT4, KVC_SCALE_PER_GROUP, 16, 0, 0, 0, KVC_DTYPE_F32},
    {"int3 group 32", KVC_DTYPE_INT3, KVC_SCALE_PER_GROUP, 32, 0, 0, 0, KVC_DTYPE_F16},
    {"int2 group 32 asym Hadamard", KVC_DTYPE_INT2, KVC_SCALE_PER_GROUP, 32, 1, 0, 1,
     KVC_DTYPE_F16},
    {"int8 group 128 (the whole row)", KVC_DTYPE_INT8, KVC_SCALE_PER_GROUP, 128, 0, 0, 0,
     KVC_DTYPE_F32},
    {"fp8 e4m3 per token", KVC_DTYPE_FP8_E4M3, KVC_SCALE_PER_TOKEN, 0, 0, 0, 0, KVC_DTYPE_F32},
    {"fp8 e5m2 group 32 Hadamard", KVC_DTYPE_FP8_E5M2, KVC_SCALE_PER_GROUP, 32, 0, 0, 1,
     KVC_DTYPE_F16},
};

kvc_codec codec_of(const Case &c) {
  kvc_codec k;
  kvc_codec_init(&k);
  k.dtype = c.dtype;
  k.granularity = c.gran;
  k.group_size = c.group ? c.group : 32;
  k.asymmetric = static_cast<uint32_t>(c.asym);
  k.full_range = static_cast<uint32_t>(c.full_range);
  k.scale_dtype = c.scale_dtype;
  if (c.hadamard) {
    k.rotation = KVC_ROTATION_HADAMARD;
    k.rotation_block = kDim;  // one block per head, as the pool rotates
  }
  return k;
}

// Bytes of one token's codes, scales and zero points of a part in a pool.
struct TokenBytes {
  std::vector<uint8_t> codes, scales, zeros;
};

TokenBytes stored(const kvc_pool_layout &lo, int kv, int32_t block, uint32_t slot, uint64_t codes_len,
                  uint64_t scales_len) {
  const uint8_t *b = static_cast<const uint8_t *>(lo.base) + uint64_t(block) * lo.block_stride;
  const uint64_t off = kv ? lo.v_offset : lo.k_offset;
  const uint64_t ts = kv ? lo.v_token_stride : lo.k_token_stride;
  const uint64_t so = kv ? lo.v_scale_offset : lo.k_scale_offset;
  const uint64_t zo = kv ? lo.v_zero_offset : lo.k_zero_offset;
  TokenBytes t;
  t.codes.assign(b + off + slot * ts, b + off + slot * ts + codes_len);
  t.scales.assign(b + so + slot * scales_len, b + so + (slot + 1) * scales_len);
  if (zo) t.zeros.assign(b + zo + slot * scales_len, b + zo + (slot + 1) * scales_len);
  return t;
}

void run_case(const Case &c, kvc_dtype in) {
  const kvc_codec codec = codec_of(c);
  kvc_pool_config cfg;
  kvc_pool_config_init(&cfg);
  cfg.num_layers = 1;
  cfg.num_kv_heads = kHeads;
  cfg.num_q_heads = kHeads;
  cfg.head_dim = kDim;
  cfg.block_size = kBlock;
  cfg.num_blocks = 8;
  cfg.k_codec = &codec;
  cfg.v_codec = &codec;
  kvc_pool *p = nullptr;
  if (kvc_pool_create(&cfg, &p) != KVC_OK) {
    std::fprintf(stderr, "%s: pool refused: %s\n", c.name, kvc_last_error_message());
    ++g_kvtest_fail;
    return;
  }
  constexpr uint64_t kTokens = 45;
  OK(kvc_seq_create(p, 1));
  OK(kvc_seq_reserve(p, 1, kTokens, nullptr));
  // Gaussian rows, one token's much larger, one's much smaller, one's zero;
  // ties of the codes' rounding (quarters) here and there.
  std::mt19937 rng(static_cast<uint32_t>(c.dtype) * 131u + static_cast<uint32_t>(in));
  std::normal_distribution<float> g(0.0f, 1.0f);
  std::vector<float> kf(kTokens * kRow), vf(kTokens * kRow);
  for (uint64_t i = 0; i < kf.size(); ++i) {
    const uint64_t t = i / kRow;
    const float mag = t == 7 ? 3000.0f : t == 20 ? 1.0f / 1024.0f : t == 33 ? 0.0f : 2.0f;
    kf[i] = g(rng) * mag;
    vf[i] = (g(rng) + 0.25f) * mag;
    if (i % 11 == 0) kf[i] = std::nearbyint(kf[i] * 4.0f) / 4.0f;
  }
  // The input in its dtype, and the f32 rows it holds (the conversion back
  // is exact): the values the expected bytes are computed from.
  const uint64_t esz = in == KVC_DTYPE_F32 ? 4 : 2;
  std::vector<uint8_t> kin(kf.size() * esz), vin(vf.size() * esz);
  OK(kvc_convert(kf.data(), KVC_DTYPE_F32, kin.data(), in, kf.size()));
  OK(kvc_convert(vf.data(), KVC_DTYPE_F32, vin.data(), in, vf.size()));
  OK(kvc_convert(kin.data(), in, kf.data(), KVC_DTYPE_F32, kf.size()));
  OK(kvc_convert(vin.data(), in, vf.data(), KVC_DTYPE_F32, vf.size()));
  // Appends of 5, 16 (a decode step of a batch), 1 and 23 tokens: across blocks.
  uint64_t pos = 0;
  for (uint64_t n : {5ull, 16ull, 1ull, 23ull}) {
    OK(kvc_append(p, 1, 0, pos, n, kin.data() + pos * kRow * esz, vin.data() + pos * kRow * esz,
                  in));
    pos += n;
  }
  kvc_pool_layout lo;
  kvc_pool_layout_init(&lo);
  OK(kvc_pool_get_layout(p, &lo));
  std::vector<int32_t> blocks(kTokens / kBlock + 1);
  size_t nb = 0;
  OK(kvc_seq_block_table(p, 1, 0, blocks.data(), blocks.size(), &nb));
  // The expected bytes of each token: kvc_quantize of its f32 rows (per-token
  // scales: one row per head; per-group: the token's whole row).
  const bool token = c.gran == KVC_SCALE_PER_TOKEN;
  const uint64_t qn = token ? kHeads : 1, qd = token ? kDim : kRow;
  kvc_quant_sizes qs;
  kvc_quant_sizes_init(&qs);
  OK(kvc_quantize_sizes(&codec, qn, qd, &qs));
  int mismatched = 0;
  for (uint64_t t = 0; t < kTokens; ++t)
    for (int kv = 0; kv < 2; ++kv) {
      TokenBytes want;
      want.codes.resize(qs.codes_bytes);
      want.scales.resize(qs.scales_bytes);
      want.zeros.resize(qs.zeros_bytes);
      OK(kvc_quantize(&codec, (kv ? vf : kf).data() + t * kRow, KVC_DTYPE_F32, qn, qd,
                      want.codes.data(), want.scales.data(),
                      qs.zeros_bytes ? want.zeros.data() : nullptr));
      const TokenBytes got = stored(lo, kv, blocks[t / kBlock], static_cast<uint32_t>(t % kBlock),
                                    qs.codes_bytes, qs.scales_bytes);
      if (got.codes != want.codes || got.scales != want.scales ||
          (qs.zeros_bytes && got.zeros != want.zeros))
        ++mismatched;
    }
  if (mismatched)
    std::fprintf(stderr, "%s, input dtype %d: %d token parts differ from kvc_quantize\n", c.name,
                 static_cast<int>(in), mismatched);
  CHECK(mismatched == 0);

  // A NaN or Inf in the next append: refused, naming the part and the
  // element's indices in [n_tokens][num_kv_heads][head_dim], nothing written.
  OK(kvc_seq_reserve(p, 1, 3, nullptr));
  const std::vector<uint8_t> before(static_cast<const uint8_t *>(lo.base),
                                    static_cast<const uint8_t *>(lo.base) +
                                        lo.num_blocks * lo.block_stride);
  std::vector<float> bad(3 * kRow, 1.0f);
  bad[2 * kRow + kDim + 5] = in == KVC_DTYPE_F32 ? NAN : INFINITY;  // token 2, head 1, dim 5
  std::vector<uint8_t> badin(bad.size() * esz), good(bad.size() * esz);
  OK(kvc_convert(bad.data(), KVC_DTYPE_F32, badin.data(), in, bad.size()));
  std::vector<float> ones(3 * kRow, 1.0f);
  OK(kvc_convert(ones.data(), KVC_DTYPE_F32, good.data(), in, ones.size()));
  CHECK(kvc_append(p, 1, 0, kTokens, 3, good.data(), badin.data(), in) == KVC_ERR_NON_FINITE);
  const std::string what = in == KVC_DTYPE_F32 ? "[2][1][5] is NaN" : "[2][1][5] is Inf";
  CHECK(std::string(kvc_last_error_message()).find("v" + what) != std::string::npos);
  CHECK(kvc_append(p, 1, 0, kTokens, 3, badin.data(), good.data(), in) == KVC_ERR_NON_FINITE);
  CHECK(std::string(kvc_last_error_message()).find("k" + what) != std::string::npos);
  CHECK(std::memcmp(before.data(), lo.base, before.size()) == 0);
  kvc_pool_destroy(p);
}

}  // namespace

int main() {
  for (const Case &c : kCases)
    for (kvc_dtype in : {KVC_DTYPE_F16, KVC_DTYPE_F32, KVC_DTYPE_BF16}) run_case(c, in);
  if (g_kvtest_fail) {
    std::fprintf(stderr, "%d check(s) failed\n", g_kvtest_fail);
    return 1;
  }
  std::printf("append codes match kvc_quantize: %zu codecs x 3 input dtypes\n",
              sizeof kCases / sizeof kCases[0]);
  return 0;
}
