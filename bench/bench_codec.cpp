// Codec throughput (issue "Codecs"): quantize and dequantize GB/s for every
// codec family at head_dim 128 with 8 KV heads, 16 and 4096 tokens per call,
// beside memcpy of the same input bytes measured in the same run. Quantize is
// counted in input bytes consumed (f16 rows), dequantize in output bytes
// written (f16 rows).
#include <benchmark/benchmark.h>
#include <kvcache/kvcache.h>

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

namespace {

constexpr uint64_t kHeads = 8, kHeadDim = 128, kRow = kHeads * kHeadDim;

struct CodecCase {
  const char *name;
  kvc_dtype dtype;
  kvc_granularity gran;
  uint32_t group;
  int asym;
  int hadamard;
  int full_range;
};

const CodecCase kCases[] = {
    {"int8_per_token", KVC_DTYPE_INT8, KVC_SCALE_PER_TOKEN, 0, 0, 0, 0},
    {"int4_group32", KVC_DTYPE_INT4, KVC_SCALE_PER_GROUP, 32, 0, 0, 0},
    {"int4_group32_hadamard", KVC_DTYPE_INT4, KVC_SCALE_PER_GROUP, 32, 0, 1, 0},
    {"int3_group32", KVC_DTYPE_INT3, KVC_SCALE_PER_GROUP, 32, 0, 0, 0},
    {"int2_group32_asym", KVC_DTYPE_INT2, KVC_SCALE_PER_GROUP, 32, 1, 0, 0},
    {"fp8_e4m3_per_token", KVC_DTYPE_FP8_E4M3, KVC_SCALE_PER_TOKEN, 0, 0, 0, 0},
    {"fp8_e5m2_per_token", KVC_DTYPE_FP8_E5M2, KVC_SCALE_PER_TOKEN, 0, 0, 0, 0},
    // the default strategy list's int4:group=32:full-range:hadamard
    {"int4_group32_full_range_hadamard", KVC_DTYPE_INT4, KVC_SCALE_PER_GROUP, 32, 0, 1, 1},
};

// Per token and KV head (per-token codecs quantize rows of head_dim), or per
// token row of [kv_heads * head_dim] (group codecs).
void shape(const CodecCase &c, uint64_t tokens, uint64_t *n, uint64_t *d) {
  if (c.gran == KVC_SCALE_PER_TOKEN) {
    *n = tokens * kHeads;
    *d = kHeadDim;
  } else {
    *n = tokens;
    *d = kRow;
  }
}

struct Buffers {
  kvc_codec codec;
  uint64_t n, d;
  std::vector<uint16_t> src, dst;
  std::vector<uint8_t> codes, scales, zeros;
  Buffers(const CodecCase &c, uint64_t tokens) {
    kvc_codec_init(&codec);
    codec.dtype = c.dtype;
    codec.granularity = c.gran;
    codec.group_size = c.group ? c.group : 32;
    codec.asymmetric = static_cast<uint32_t>(c.asym);
    codec.full_range = static_cast<uint32_t>(c.full_range);
    codec.rotation = c.hadamard ? KVC_ROTATION_HADAMARD : KVC_ROTATION_NONE;
    codec.rotation_block = c.hadamard ? static_cast<uint32_t>(kHeadDim) : 0;  // per head, as a pool rotates
    shape(c, tokens, &n, &d);
    std::mt19937 rng(7);
    std::normal_distribution<float> g(0.0f, 1.0f);
    std::vector<float> f(n * d);
    for (float &x : f) x = g(rng);
    src.resize(n * d);
    dst.resize(n * d);
    kvc_convert(f.data(), KVC_DTYPE_F32, src.data(), KVC_DTYPE_F16, n * d);
    kvc_quant_sizes qs;
    kvc_quant_sizes_init(&qs);
    kvc_quantize_sizes(&codec, n, d, &qs);
    codes.resize(qs.codes_bytes);
    scales.resize(qs.scales_bytes + 1);
    zeros.resize(qs.zeros_bytes + 1);
  }
};

void BM_Quantize(benchmark::State &state) {
  const CodecCase &c = kCases[state.range(0)];
  Buffers b(c, static_cast<uint64_t>(state.range(1)));
  for (auto _ : state) {
    if (kvc_quantize(&b.codec, b.src.data(), KVC_DTYPE_F16, b.n, b.d, b.codes.data(), b.scales.data(),
                     b.zeros.data()) != KVC_OK)
      state.SkipWithError(kvc_last_error_message());
    benchmark::DoNotOptimize(b.codes.data());
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * b.n * b.d * 2));
  state.SetLabel(c.name);
}

void BM_Dequantize(benchmark::State &state) {
  const CodecCase &c = kCases[state.range(0)];
  Buffers b(c, static_cast<uint64_t>(state.range(1)));
  kvc_quantize(&b.codec, b.src.data(), KVC_DTYPE_F16, b.n, b.d, b.codes.data(), b.scales.data(),
               b.zeros.data());
  for (auto _ : state) {
    if (kvc_dequantize(&b.codec, b.codes.data(), b.scales.data(), b.zeros.data(), b.n, b.d,
                       b.dst.data(), KVC_DTYPE_F16) != KVC_OK)
      state.SkipWithError(kvc_last_error_message());
    benchmark::DoNotOptimize(b.dst.data());
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * b.n * b.d * 2));
  state.SetLabel(c.name);
}

// The baseline: memcpy of the same f16 bytes.
void BM_CodecMemcpy(benchmark::State &state) {
  const uint64_t bytes = static_cast<uint64_t>(state.range(0)) * kRow * 2;
  // Source and destination 2 KiB + 64 apart modulo 4 KiB: no 4K aliasing
  // between the load and store streams (which would slow memcpy down and
  // flatter the codecs).
  std::vector<uint8_t> a(bytes + 8192, 1), b(bytes + 8192);
  uint8_t *dst = b.data() + 2048 + 64;
  for (auto _ : state) {
    std::memcpy(dst, a.data(), bytes);
    benchmark::DoNotOptimize(dst);
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * bytes));
}

void codec_args(benchmark::internal::Benchmark *b) {
  for (int64_t c = 0; c < static_cast<int64_t>(sizeof kCases / sizeof kCases[0]); ++c)
    for (int64_t tokens : {16, 4096}) b->Args({c, tokens});
}

}  // namespace

BENCHMARK(BM_Quantize)->Apply(codec_args);
BENCHMARK(BM_Dequantize)->Apply(codec_args);
BENCHMARK(BM_CodecMemcpy)->Arg(16)->Arg(4096);
BENCHMARK_MAIN();
