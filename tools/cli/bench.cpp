// SPDX-License-Identifier: Apache-2.0
#include "bench.h"

#include <kvcache/kvcache.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <random>
#include <unordered_map>
#include <tuple>
#include <vector>

#include "../runner/error.h"
#include "../runner/kv_cache.h"
#include "../runner/runner.h"
#include "../runner/transformer.h"

namespace kvc_cli {
using namespace kvc_runner;

namespace {

using Clock = std::chrono::steady_clock;

double now_seconds() {
  return std::chrono::duration<double>(Clock::now().time_since_epoch()).count();
}

// Keeps results alive so the compiler cannot drop the work.
volatile std::uint64_t g_sink = 0;

/// Rounds per case: --rounds, else 5 (--quick: 3).
int bench_rounds(const BenchOptions &o) {
  return o.rounds > 0 ? o.rounds : o.quick ? 3 : 5;
}

/// Something timed: `run` once per operation, `setup` (not timed) before each when set.
struct Timed {
  std::function<void()> setup;
  std::function<void()> run;
};

/// Seconds per operation over `reps` operations.
double time_reps(const Timed &t, int reps) {
  if (!t.setup) {
    const double t0 = now_seconds();
    for (int i = 0; i < reps; ++i) t.run();
    return (now_seconds() - t0) / reps;
  }
  double total = 0;
  for (int i = 0; i < reps; ++i) {
    t.setup();
    const double t0 = now_seconds();
    t.run();
    total += now_seconds() - t0;
  }
  return total / reps;
}

class Bench {
 public:
  explicit Bench(const BenchOptions &o) : o_(o) {
    rounds_ = bench_rounds(o);
    round_seconds_ = o.quick ? 0.02 : 0.1;
  }

  bool wanted(const std::string &group, const std::string &name) const {
    return o_.filter.empty() || (group + "/" + name).find(o_.filter) != std::string::npos;
  }

  /// Times `op` and `base` in alternating rounds (so a burst of load hits both
  /// alike); the fastest round of each counts.
  void pair(const std::string &group, const std::string &name, const std::string &baseline,
            const Timed &op, const Timed &base, double bytes, double items,
            const std::string &unit) {
    auto calibrate = [&](const Timed &t) {
      time_reps(t, 1);  // warm caches and lazy allocations
      const double one = std::max(time_reps(t, 1), 1e-8);
      return static_cast<int>(std::clamp(round_seconds_ / one, 1.0, 1e6));
    };
    const int op_reps = calibrate(op), base_reps = calibrate(base);
    double best_op = 1e300, best_base = 1e300;
    for (int r = 0; r < rounds_; ++r) {
      best_op = std::min(best_op, time_reps(op, op_reps));
      best_base = std::min(best_base, time_reps(base, base_reps));
    }
    BenchResult res;
    res.group = group;
    res.name = name;
    res.baseline = baseline;
    res.seconds = best_op;
    res.baseline_seconds = best_base;
    res.bytes = bytes;
    res.items = items;
    res.item_unit = unit;
    results_.push_back(res);
  }

  std::vector<BenchResult> &results() { return results_; }

 private:
  const BenchOptions &o_;
  int rounds_;
  double round_seconds_;
  std::vector<BenchResult> results_;
};

void ok(kvc_status s, const char *what) {
  check_kvc(s, what);
}

// The geometry of the library cases: one layer of a Llama-3-8B-like model
// (32 query heads, 8 KV heads, head_dim 128), blocks of 16 tokens.
constexpr std::uint32_t kQHeads = 32, kKvHeads = 8, kHeadDim = 128, kBlock = 16;
constexpr std::uint32_t kRow = kKvHeads * kHeadDim;  // values per token of K (or V)

struct PoolHandle {
  kvc_pool *p = nullptr;
  ~PoolHandle() { kvc_pool_destroy(p); }
};

std::unique_ptr<PoolHandle> make_pool(std::uint64_t tokens, kvc_dtype dtype,
                                      const kvc_codec *codec = nullptr, bool prefix = false,
                                      kvc_prefix_hash hash = KVC_PREFIX_HASH_SHA256,
                                      std::uint32_t head_dim = kHeadDim,
                                      std::uint32_t kv_heads = kKvHeads, bool headwise = false) {
  kvc_pool_config c;
  ok(kvc_pool_config_init(&c), "kvc_pool_config_init");
  c.num_layers = 1;
  c.num_q_heads = kQHeads;
  c.num_kv_heads = kv_heads;
  c.head_dim = head_dim;
  c.block_size = kBlock;
  c.num_blocks = 2 * ((tokens + kBlock - 1) / kBlock) * (headwise ? kv_heads : 1) + 8;
  if (headwise) c.flags |= KVC_POOL_HEADWISE;             // a block holds one KV head
  c.k_dtype = c.v_dtype = codec ? KVC_DTYPE_F16 : dtype;  // a codec describes its own storage
  c.k_codec = c.v_codec = codec;
  auto h = std::make_unique<PoolHandle>();
  ok(kvc_pool_create(&c, &h->p), "kvc_pool_create");
  if (prefix) {
    kvc_prefix_config pc;
    ok(kvc_prefix_config_init(&pc), "kvc_prefix_config_init");
    pc.hash = hash;
    ok(kvc_pool_enable_prefix_cache(h->p, &pc), "kvc_pool_enable_prefix_cache");
  }
  return h;
}

std::vector<float> random_floats(std::size_t n, unsigned seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  std::vector<float> v(n);
  for (float &x : v) x = dist(rng);
  return v;
}

/// The textbook attention an engine without the library runs: contiguous
/// f32 K/V `[tokens][kv_heads][head_dim]`, scores, softmax, weighted sum.
void dense_attention(const float *k, const float *v, const float *q, float *out,
                     std::uint32_t tokens, std::vector<float> &scores) {
  const std::uint32_t group = kQHeads / kKvHeads;
  const float scale = 1.0f / std::sqrt(float(kHeadDim));
  scores.resize(tokens);
  for (std::uint32_t h = 0; h < kQHeads; ++h) {
    const std::uint32_t g = h / group;
    const float *qh = q + std::size_t(h) * kHeadDim;
    float mx = -INFINITY;
    for (std::uint32_t t = 0; t < tokens; ++t) {
      const float *kr = k + std::size_t(t) * kRow + g * kHeadDim;
      float s = 0;
      for (std::uint32_t i = 0; i < kHeadDim; ++i) s += qh[i] * kr[i];
      scores[t] = s * scale;
      mx = std::max(mx, scores[t]);
    }
    float sum = 0;
    for (std::uint32_t t = 0; t < tokens; ++t) sum += (scores[t] = std::exp(scores[t] - mx));
    float *o = out + std::size_t(h) * kHeadDim;
    std::fill(o, o + kHeadDim, 0.0f);
    for (std::uint32_t t = 0; t < tokens; ++t) {
      const float w = scores[t] / sum;
      const float *vr = v + std::size_t(t) * kRow + g * kHeadDim;
      for (std::uint32_t i = 0; i < kHeadDim; ++i) o[i] += w * vr[i];
    }
  }
}

void pool_cases(Bench &b) {
  const std::string G = "pool";
  const std::uint64_t tokens = 4096;
  const std::vector<float> kv = random_floats(std::size_t(tokens) * kRow, 1);
  std::vector<std::uint16_t> kv16(kv.size());
  ok(kvc_convert(kv.data(), KVC_DTYPE_F32, kv16.data(), KVC_DTYPE_F16, kv.size()), "kvc_convert");
  const double block_bytes = 2.0 * kBlock * kRow * 2;  // K and V of one f16 block
  if (b.wanted(G, "reserve + free 1 block")) {
    auto pool = make_pool(tokens, KVC_DTYPE_F16);
    std::uint64_t id = 0;
    Timed op{nullptr, [&] {
               ok(kvc_seq_create(pool->p, ++id), "kvc_seq_create");
               ok(kvc_seq_reserve(pool->p, id, kBlock, nullptr), "kvc_seq_reserve");
               ok(kvc_seq_free(pool->p, id), "kvc_seq_free");
             }};
    Timed base{nullptr, [&] {
                 void *m = std::malloc(static_cast<std::size_t>(block_bytes));
                 if (m == nullptr) throw RunnerError("out of memory");
                 static_cast<volatile char *>(m)[0] = 1;
                 std::free(m);
               }};
    b.pair(G,
           "reserve + free 1 block: kvc_seq_create + kvc_seq_reserve + kvc_seq_free (a "
           "sequence's whole life)",
           "malloc + free of the block's 64 KiB", op, base, 0, 1, "block");
  }
  // The path of Google Benchmark's BM_ReserveFreeOneBlock: one block taken
  // and given back by a sequence that stays.
  if (b.wanted(G, "reserve + truncate 1 block")) {
    auto pool = make_pool(tokens, KVC_DTYPE_F16);
    ok(kvc_seq_create(pool->p, 1), "kvc_seq_create");
    Timed op{nullptr, [&] {
               ok(kvc_seq_reserve(pool->p, 1, kBlock, nullptr), "kvc_seq_reserve");
               ok(kvc_seq_truncate(pool->p, 1, 0), "kvc_seq_truncate");
             }};
    Timed base{nullptr, [&] {
                 void *m = std::malloc(static_cast<std::size_t>(block_bytes));
                 if (m == nullptr) throw RunnerError("out of memory");
                 static_cast<volatile char *>(m)[0] = 1;
                 std::free(m);
               }};
    b.pair(G,
           "reserve + truncate 1 block of a live sequence (bench_pool's BM_ReserveFreeOneBlock "
           "path)",
           "malloc + free of the block's 64 KiB", op, base, 0, 1, "block");
  }
  if (b.wanted(G, "append 16 tokens")) {
    auto pool = make_pool(tokens, KVC_DTYPE_F16);
    ok(kvc_seq_create(pool->p, 1), "kvc_seq_create");
    ok(kvc_seq_reserve(pool->p, 1, tokens, nullptr), "kvc_seq_reserve");
    std::uint64_t pos = 0;
    Timed op{nullptr, [&] {
               ok(kvc_append(pool->p, 1, 0, pos, kBlock, kv16.data() + pos * kRow,
                             kv16.data() + pos * kRow, KVC_DTYPE_F16),
                  "kvc_append");
               pos = (pos + kBlock) % tokens;
             }};
    std::vector<std::uint16_t> dst(kv16.size() * 2);
    std::uint64_t bpos = 0;
    Timed base{nullptr, [&] {
                 const std::size_t n = std::size_t(kBlock) * kRow;
                 std::memcpy(dst.data() + 2 * bpos * kRow, kv16.data() + bpos * kRow, n * 2);
                 std::memcpy(dst.data() + 2 * bpos * kRow + n, kv16.data() + bpos * kRow, n * 2);
                 bpos = (bpos + kBlock) % tokens;
               }};
    b.pair(G, "append 16 tokens (f16, 8 KV heads x 128)", "memcpy of the same K and V bytes", op,
           base, block_bytes, kBlock, "token");
  }
  if (b.wanted(G, "gather")) {
    const std::uint64_t n = 1024;
    auto pool = make_pool(n, KVC_DTYPE_F16);
    ok(kvc_seq_create(pool->p, 1), "kvc_seq_create");
    ok(kvc_seq_reserve(pool->p, 1, n, nullptr), "kvc_seq_reserve");
    ok(kvc_append(pool->p, 1, 0, 0, n, kv16.data(), kv16.data(), KVC_DTYPE_F16), "kvc_append");
    std::vector<std::uint16_t> k_out(n * kRow), v_out(n * kRow);
    Timed op{
        nullptr, [&] {
          ok(kvc_gather(pool->p, 1, 0, 0, n, k_out.data(), v_out.data(), KVC_DTYPE_F16, nullptr),
             "kvc_gather");
        }};
    std::vector<std::uint16_t> src2(kv16.begin(), kv16.begin() + n * kRow);
    Timed base{nullptr, [&] {
                 std::memcpy(k_out.data(), kv16.data(), n * kRow * 2);
                 std::memcpy(v_out.data(), src2.data(), n * kRow * 2);
               }};
    b.pair(G, "gather 1024 tokens (f16 blocks to contiguous f16)", "memcpy of the same bytes", op,
           base, 2.0 * n * kRow * 2, double(n), "token");
  }
  if (b.wanted(G, "fork")) {
    auto pool = make_pool(tokens, KVC_DTYPE_F16);
    ok(kvc_seq_create(pool->p, 1), "kvc_seq_create");
    ok(kvc_seq_reserve(pool->p, 1, tokens, nullptr), "kvc_seq_reserve");
    ok(kvc_append(pool->p, 1, 0, 0, tokens, kv16.data(), kv16.data(), KVC_DTYPE_F16), "kvc_append");
    Timed op{nullptr, [&] {
               ok(kvc_seq_fork(pool->p, 1, 2), "kvc_seq_fork");
               ok(kvc_seq_free(pool->p, 2), "kvc_seq_free");
             }};
    std::vector<std::uint16_t> dst(kv16.size() * 2);
    Timed base{nullptr, [&] {
                 std::memcpy(dst.data(), kv16.data(), kv16.size() * 2);
                 std::memcpy(dst.data() + kv16.size(), kv16.data(), kv16.size() * 2);
               }};
    b.pair(G, "fork + free a 4096-token sequence (copy-on-write)",
           "memcpy of its K and V bytes (a deep copy)", op, base, 0, double(tokens), "token");
  }
}

void codec_cases(Bench &b) {
  const std::string G = "codec";
  const std::uint64_t n = 4096, d = kRow;
  const std::vector<float> src = random_floats(n * d, 2);
  struct Spec {
    const char *name;
    kvc_dtype dtype;
    kvc_granularity gran;
    std::uint32_t group;
  };
  const Spec specs[] = {{"int8 per-token", KVC_DTYPE_INT8, KVC_SCALE_PER_TOKEN, 0},
                        {"int4 group=32", KVC_DTYPE_INT4, KVC_SCALE_PER_GROUP, 32},
                        {"fp8_e4m3 per-token", KVC_DTYPE_FP8_E4M3, KVC_SCALE_PER_TOKEN, 0}};
  std::vector<float> out(n * d);
  for (const Spec &s : specs) {
    const std::string qname = std::string("quantize ") + s.name + " [4096][1024] f32";
    const std::string dname = std::string("dequantize ") + s.name + " [4096][1024] to f32";
    if (!b.wanted(G, qname) && !b.wanted(G, dname)) continue;
    kvc_codec c;
    ok(kvc_codec_init(&c), "kvc_codec_init");
    c.dtype = s.dtype;
    c.granularity = s.gran;
    c.group_size = s.group;
    kvc_quant_sizes sz;
    ok(kvc_quant_sizes_init(&sz), "kvc_quant_sizes_init");
    ok(kvc_quantize_sizes(&c, n, d, &sz), "kvc_quantize_sizes");
    std::vector<std::uint8_t> codes(sz.codes_bytes), scales(sz.scales_bytes + 1),
        zeros(sz.zeros_bytes + 1);
    auto quantize = [&] {
      ok(kvc_quantize(&c, src.data(), KVC_DTYPE_F32, n, d, codes.data(), scales.data(),
                      zeros.data()),
         "kvc_quantize");
    };
    quantize();
    Timed copy{nullptr, [&] { std::memcpy(out.data(), src.data(), n * d * sizeof(float)); }};
    if (b.wanted(G, qname))
      b.pair(G, qname, "memcpy of the f32 input", Timed{nullptr, quantize}, copy, double(n * d * 4),
             double(n), "row");
    if (b.wanted(G, dname)) {
      Timed deq{nullptr, [&] {
                  ok(kvc_dequantize(&c, codes.data(), scales.data(), zeros.data(), n, d, out.data(),
                                    KVC_DTYPE_F32),
                     "kvc_dequantize");
                }};
      b.pair(G, dname, "memcpy of the f32 output", deq, copy, double(n * d * 4), double(n), "row");
    }
  }
}

void attention_cases(Bench &b) {
  const std::string G = "attention";
  const std::uint64_t tokens = 4096;
  const std::vector<float> kv = random_floats(std::size_t(tokens) * kRow, 3);
  const std::vector<float> q = random_floats(std::size_t(kQHeads) * kHeadDim, 4);
  std::vector<float> out(std::size_t(kQHeads) * kHeadDim);
  auto filled_pool = [&](kvc_dtype dtype, const kvc_codec *codec) {
    auto pool = make_pool(tokens, dtype, codec);
    ok(kvc_seq_create(pool->p, 1), "kvc_seq_create");
    ok(kvc_seq_reserve(pool->p, 1, tokens, nullptr), "kvc_seq_reserve");
    ok(kvc_append(pool->p, 1, 0, 0, tokens, kv.data(), kv.data(), KVC_DTYPE_F32), "kvc_append");
    return pool;
  };
  auto decode = [&](kvc_pool *p, std::uint32_t threads,
                    kvc_query_quant query_quant = KVC_QUERY_EXACT) {
    kvc_attention_params ap;
    ok(kvc_attention_params_init(&ap), "kvc_attention_params_init");
    ap.num_q_heads = kQHeads;
    ap.num_threads = threads;
    ap.query_quant = query_quant;
    const std::uint64_t id = 1;
    return Timed{nullptr, [p, ap, id, &q, &out] {
                   ok(kvc_attention_decode(p, 0, &id, 1, q.data(), out.data(), nullptr, &ap),
                      "kvc_attention_decode");
                 }};
  };
  const double f16_bytes = 2.0 * tokens * kRow * 2;
  auto f16 = filled_pool(KVC_DTYPE_F16, nullptr);
  std::vector<float> scores;
  if (b.wanted(G, "decode f16 vs dense")) {
    Timed dense{nullptr, [&] {
                  dense_attention(kv.data(), kv.data(), q.data(), out.data(), tokens, scores);
                }};
    b.pair(G,
           "decode f16 vs dense: 1 sequence of 4096 tokens, 32/8 heads x 128, paged f16, 1 thread",
           "the textbook loop over contiguous f32 K/V", decode(f16->p, 1), dense, f16_bytes,
           double(tokens), "token");
  }
  std::vector<std::uint16_t> copy_dst(std::size_t(tokens) * kRow * 2), copy_src(copy_dst.size());
  Timed memcpy_kv{nullptr,
                  [&] { std::memcpy(copy_dst.data(), copy_src.data(), copy_src.size() * 2); }};
  if (b.wanted(G, "decode f16 vs memcpy"))
    b.pair(G, "decode f16 vs memcpy: the same call", "memcpy of the f16 K and V bytes it reads",
           decode(f16->p, 1), memcpy_kv, f16_bytes, double(tokens), "token");
  if (b.wanted(G, "decode f16 2 threads"))
    b.pair(G, "decode f16 2 threads (split by token ranges, merged by log-sum-exp)",
           "the same call on 1 thread", decode(f16->p, 2), decode(f16->p, 1), f16_bytes,
           double(tokens), "token");
  for (const auto &[label, dtype] :
       {std::pair<const char *, kvc_dtype>{"int8 per-token", KVC_DTYPE_INT8},
        std::pair<const char *, kvc_dtype>{"int4 per-token", KVC_DTYPE_INT4}}) {
    const std::string name = std::string("decode ") + label + " (dequantized on the fly), 1 thread";
    // The same keys scored against an int8 query (KVC_QUERY_INT8: AVX-512 VNNI where the CPU
    // has it, else the same exact path as above).
    const std::string iq =
        std::string("decode ") + label + ", int8 query (KVC_QUERY_INT8), 1 thread";
    // And the symmetric int8 / int4 values summed in integers too (KVC_QUERY_INT8_VALUES).
    const std::string iv = std::string("decode ") + label +
                           ", int8 query and values (KVC_QUERY_INT8_VALUES), 1 thread";
    if (!b.wanted(G, name) && !b.wanted(G, iq) && !b.wanted(G, iv)) continue;
    kvc_codec c;
    ok(kvc_codec_init(&c), "kvc_codec_init");
    c.dtype = dtype;
    c.granularity = KVC_SCALE_PER_TOKEN;
    auto qpool = filled_pool(dtype, &c);
    if (b.wanted(G, name))
      b.pair(G, name, "f16 decode of the same tokens", decode(qpool->p, 1), decode(f16->p, 1), 0,
             double(tokens), "token");
    if (b.wanted(G, iq))
      b.pair(G, iq, "f16 decode of the same tokens", decode(qpool->p, 1, KVC_QUERY_INT8),
             decode(f16->p, 1), 0, double(tokens), "token");
    if (b.wanted(G, iv))
      b.pair(G, iv, "f16 decode of the same tokens", decode(qpool->p, 1, KVC_QUERY_INT8_VALUES),
             decode(f16->p, 1), 0, double(tokens), "token");
  }
  // Per-group scales (groups of 32 values within each head, llama.cpp's q4_0
  // block size): read in place, the codes dequantized in registers; and fp8
  // e4m3 codes with per-token scales (vLLM's and TensorRT-LLM's fp8 caches),
  // converted in registers through f16 bits.
  for (const auto &[label, dtype, gran] :
       {std::tuple<const char *, kvc_dtype, kvc_granularity>{
            "decode int4 group=32 (dequantized in registers, exact query), 1 thread",
            KVC_DTYPE_INT4, KVC_SCALE_PER_GROUP},
        std::tuple<const char *, kvc_dtype, kvc_granularity>{
            "decode fp8_e4m3 per-token (converted in registers), 1 thread", KVC_DTYPE_FP8_E4M3,
            KVC_SCALE_PER_TOKEN}}) {
    if (!b.wanted(G, label)) continue;
    kvc_codec c;
    ok(kvc_codec_init(&c), "kvc_codec_init");
    c.dtype = dtype;
    c.granularity = gran;
    c.group_size = gran == KVC_SCALE_PER_GROUP ? 32 : 0;
    auto gpool = filled_pool(dtype, &c);
    b.pair(G, label, "f16 decode of the same tokens", decode(gpool->p, 1), decode(f16->p, 1), 0,
           double(tokens), "token");
  }
  // Head-wise pools (KVC_POOL_HEADWISE): the 8 KV heads keep 20..80 % of the
  // 4096 tokens each (kvc_seq_keep_head), 50 % in all, against a token-wise
  // pool holding 2048 tokens in every head: the same held bytes.
  const std::string hw =
      "decode head-wise: 8 KV heads keeping 20..80 % of 4096 tokens (50 % held), f16, 1 thread";
  if (b.wanted(G, hw)) {
    auto hpool = make_pool(tokens, KVC_DTYPE_F16, nullptr, false, KVC_PREFIX_HASH_SHA256, kHeadDim,
                           kKvHeads, true);
    ok(kvc_seq_create(hpool->p, 1), "kvc_seq_create");
    ok(kvc_seq_reserve(hpool->p, 1, tokens, nullptr), "kvc_seq_reserve");
    ok(kvc_append(hpool->p, 1, 0, 0, tokens, kv.data(), kv.data(), KVC_DTYPE_F32), "kvc_append");
    constexpr std::uint64_t kTenths[kKvHeads] = {2, 3, 4, 5, 5, 6, 7, 8};  // 50 % on average
    for (std::uint32_t h = 0; h < kKvHeads; ++h) {
      const std::uint64_t keep_n = tokens * kTenths[h] / 10;
      std::vector<std::uint64_t> keep(keep_n);
      for (std::uint64_t i = 0; i < keep_n; ++i) keep[i] = i * tokens / keep_n;
      ok(kvc_seq_keep_head(hpool->p, 1, 0, h, keep.data(), keep_n, nullptr), "kvc_seq_keep_head");
    }
    auto tpool = make_pool(tokens / 2, KVC_DTYPE_F16);
    ok(kvc_seq_create(tpool->p, 1), "kvc_seq_create");
    ok(kvc_seq_reserve(tpool->p, 1, tokens / 2, nullptr), "kvc_seq_reserve");
    ok(kvc_append(tpool->p, 1, 0, 0, tokens / 2, kv.data(), kv.data(), KVC_DTYPE_F32),
       "kvc_append");
    kvc_stats hs, ts;
    ok(kvc_stats_init(&hs), "kvc_stats_init");
    ok(kvc_stats_init(&ts), "kvc_stats_init");
    ok(kvc_pool_stats(hpool->p, &hs), "kvc_pool_stats");
    ok(kvc_pool_stats(tpool->p, &ts), "kvc_pool_stats");
    const double ratio = double(hs.bytes_in_use) / double(ts.bytes_in_use);
    if (ratio < 0.95 || ratio > 1.05)
      throw RunnerError("decode head-wise: the pools hold " + std::to_string(hs.bytes_in_use) +
                        " and " + std::to_string(ts.bytes_in_use) + " bytes, not the same");
    b.pair(G, hw, "token-wise decode of the same held bytes (2048 tokens in every head)",
           decode(hpool->p, 1), decode(tpool->p, 1), f16_bytes / 2, double(tokens / 2), "token");
  }
}

void evict_cases(Bench &b) {
  const std::string G = "evict";
  const std::string name = "evict half of 4096 tokens (StreamingLLM, 4 sinks) and compact";
  if (!b.wanted(G, name)) return;
  const std::uint64_t tokens = 4096, keep = 2048;
  const std::vector<float> kv = random_floats(std::size_t(tokens) * kRow, 5);
  auto pool = make_pool(tokens, KVC_DTYPE_F16);
  kvc_policy_config pc;
  ok(kvc_policy_config_init(&pc), "kvc_policy_config_init");
  pc.kind = KVC_POLICY_STREAMING;
  pc.sink_tokens = 4;
  pc.budget_tokens = keep;
  kvc_policy *policy = nullptr;
  ok(kvc_policy_create(&pc, &policy), "kvc_policy_create");
  std::unique_ptr<kvc_policy, void (*)(kvc_policy *)> hold(policy, kvc_policy_destroy);
  bool live = false;
  Timed op{[&] {
             if (live) ok(kvc_seq_free(pool->p, 1), "kvc_seq_free");
             ok(kvc_seq_create(pool->p, 1), "kvc_seq_create");
             live = true;
             ok(kvc_seq_reserve(pool->p, 1, tokens, nullptr), "kvc_seq_reserve");
             ok(kvc_append(pool->p, 1, 0, 0, tokens, kv.data(), kv.data(), KVC_DTYPE_F32),
                "kvc_append");
           },
           [&] {
             std::uint64_t dropped = 0;
             ok(kvc_evict(pool->p, 1, policy, &dropped), "kvc_evict");
             g_sink = g_sink + dropped;
           }};
  std::vector<std::uint16_t> dst(std::size_t(keep) * kRow * 2), src(dst.size());
  Timed base{nullptr, [&] { std::memcpy(dst.data(), src.data(), dst.size() * 2); }};
  b.pair(G, name, "memcpy of the kept K and V bytes", op, base, 2.0 * keep * kRow * 2,
         double(tokens), "token");
}

void prefix_cases(Bench &b) {
  const std::string G = "prefix";
  const std::uint64_t blocks = 256, tokens = blocks * kBlock;
  std::vector<std::int32_t> toks(tokens + 1);
  for (std::size_t i = 0; i < toks.size(); ++i)
    toks[i] = static_cast<std::int32_t>((i * 2654435761u) % 50000);
  // Baseline: what an engine keeps without the library, a hash map keyed by
  // std::hash of (parent key, the block's token bytes), chained block by block.
  std::unordered_map<std::size_t, std::int32_t> map;
  auto chain = [&](bool insert) {
    std::size_t parent = 0x9e3779b97f4a7c15ull, hits = 0;
    for (std::uint64_t blk = 0; blk < blocks; ++blk) {
      std::string bytes(reinterpret_cast<const char *>(&parent), sizeof parent);
      bytes.append(reinterpret_cast<const char *>(toks.data() + blk * kBlock),
                   kBlock * sizeof(std::int32_t));
      parent = std::hash<std::string>{}(bytes);
      if (insert)
        map[parent] = static_cast<std::int32_t>(blk);
      else if (map.find(parent) != map.end())
        ++hits;
      else
        break;
    }
    return hits;
  };
  chain(true);
  Timed base{nullptr, [&] { g_sink = g_sink + chain(false); }};
  for (const auto &[label, hash] :
       {std::pair<const char *, kvc_prefix_hash>{"SHA-256", KVC_PREFIX_HASH_SHA256},
        std::pair<const char *, kvc_prefix_hash>{"XXH3-128", KVC_PREFIX_HASH_XXH3_128}}) {
    const std::string name =
        std::string("lookup of a 4096-token cached prompt, ") + label + " keys, token-verified";
    if (!b.wanted(G, name)) continue;
    auto pool = make_pool(tokens, KVC_DTYPE_F16, nullptr, true, hash, 8, 1);
    ok(kvc_seq_create(pool->p, 1), "kvc_seq_create");
    ok(kvc_seq_reserve(pool->p, 1, tokens, nullptr), "kvc_seq_reserve");
    {  // only written blocks register: write the prompt's K/V (zeros)
      kvc_pool_config pc;
      kvc_pool_config_init(&pc);
      ok(kvc_pool_get_config(pool->p, &pc), "kvc_pool_get_config");
      const std::vector<float> zeros(static_cast<size_t>(tokens) * pc.num_kv_heads * pc.head_dim,
                                     0.0f);
      for (uint32_t l = 0; l < pc.num_layers; ++l)
        ok(kvc_append(pool->p, 1, l, 0, tokens, zeros.data(), zeros.data(), KVC_DTYPE_F32),
           "kvc_append");
    }
    ok(kvc_prefix_insert(pool->p, 1, toks.data(), tokens, nullptr, 0, nullptr),
       "kvc_prefix_insert");
    kvc_prefix_result r;
    std::memset(&r, 0, sizeof r);
    r.struct_size = sizeof r;
    Timed op{nullptr, [&] {
               ok(kvc_prefix_lookup(pool->p, toks.data(), toks.size(), nullptr, 0, 0, &r),
                  "kvc_prefix_lookup");
               if (r.hit_tokens != tokens)
                 throw RunnerError("bench: the cached prompt did not hit");
             }};
    b.pair(G, name, "std::unordered_map of chained std::hash block keys (unverified)", op, base, 0,
           double(tokens), "token");
  }
}

void model_cases(Bench &b, const BenchOptions &o) {
  const std::string G = "model";
  const std::string name = "forward pass of " + o.model + ", kvc_pool f32 (zero copy)";
  if (!b.wanted(G, name)) return;
  const Model model = Model::load(resolve_model_path(o.model));
  const ModelConfig &c = model.config();
  Transformer transformer(model);
  const int n = std::min(o.tokens, c.seq_len);
  KvPool pool(c, KVC_DTYPE_F32, KVC_DTYPE_F32, static_cast<std::uint32_t>(c.seq_len));
  std::uint64_t seq_id = 0;
  auto window = [&](auto &cache) {
    std::uint32_t state = 12345;
    for (int pos = 0; pos < n; ++pos) {
      state = state * 1664525u + 1013904223u;
      const int token = pos == 0 ? kBosToken : static_cast<int>(state >> 8) % c.vocab_size;
      transformer.forward(cache, token, pos);
    }
  };
  Timed op{nullptr, [&] {
             PoolSequence seq(pool, seq_id++, c.n_layers);
             window(seq);
           }};
  Timed base{nullptr, [&] {
               ArrayCache cache(c);
               window(cache);
             }};
  b.pair(G, name, "the same pass on a plain array cache (llama2.c)", op, base, 0, double(n),
         "token");
}

std::string human_time(double s) {
  char buf[32];
  if (s >= 1.0)
    std::snprintf(buf, sizeof buf, "%.3f s", s);
  else if (s >= 1e-3)
    std::snprintf(buf, sizeof buf, "%.3f ms", s * 1e3);
  else if (s >= 1e-6)
    std::snprintf(buf, sizeof buf, "%.3f us", s * 1e6);
  else
    std::snprintf(buf, sizeof buf, "%.1f ns", s * 1e9);
  return buf;
}

}  // namespace

std::vector<BenchResult> run_bench(const BenchOptions &o) {
  if (o.tokens < 0) throw RunnerError("--tokens must be >= 1");
  if (o.rounds < 0 || o.rounds > 1000)
    throw RunnerError("--rounds must be in 1..1000 (0: the default)");
  BenchOptions opt = o;
  if (opt.tokens == 0) opt.tokens = o.quick ? 256 : 1 << 30;  // capped at the model's seq_len
  Bench b(opt);
  pool_cases(b);
  codec_cases(b);
  attention_cases(b);
  evict_cases(b);
  prefix_cases(b);
  model_cases(b, opt);
  if (b.results().empty()) throw RunnerError("--filter '" + o.filter + "' matches no benchmark");
  return b.results();
}

namespace {
// The speed goals the CPU hot paths aim at (the case names' prefixes): a
// minimum speed against the case's baseline, or a maximum time per item.
struct Goal {
  const char *prefix;
  double min_speed;     // 0: none
  double max_per_item;  // seconds; 0: none
};
constexpr Goal kGoals[] = {
    {"decode f16 vs memcpy", 0.8, 0},
    {"decode int8 per-token", 1.6, 0},
    {"decode int4 per-token", 2.5, 0},
    {"decode int8 per-token, int8 query", 1.6, 0},
    {"decode int4 per-token, int8 query", 2.5, 0},
    {"decode int8 per-token, int8 query and values", 1.6, 0},
    {"decode int4 per-token, int8 query and values", 2.5, 0},
    {"decode head-wise", 1.0 / 1.2, 0},  // issue 28: no slower than 1.2x token-wise
    {"quantize int8 per-token", 1.3, 0},
    {"quantize int4 group=32", 0.9, 0},
    {"quantize fp8_e4m3 per-token", 1.2, 0},
    {"lookup of a 4096-token cached prompt, XXH3-128", 0, 1.5e-9},
};
struct GoalResult {
  const Goal *goal;
  const BenchResult *result;
  bool met;
};
std::vector<GoalResult> goal_results(const std::vector<BenchResult> &results) {
  std::vector<GoalResult> out;
  for (const Goal &g : kGoals)
    for (const BenchResult &r : results)
      if (r.name.rfind(g.prefix, 0) == 0) {
        const double speed = r.baseline_seconds / r.seconds;
        const double per = r.items > 0 ? r.seconds / r.items : 0;
        const bool met = g.min_speed > 0 ? speed >= g.min_speed : per > 0 && per < g.max_per_item;
        out.push_back({&g, &r, met});
        break;
      }
  return out;
}
}  // namespace

void print_bench(const BenchOptions &o, const std::vector<BenchResult> &results) {
  std::printf(
      "kvcache bench%s (libkvcache %s): wall time per operation, the fastest of %d rounds; each "
      "case "
      "beside its baseline,\ntimed in alternating rounds of the same run. speed = baseline time / "
      "time (> 1: faster than the baseline).\n\n",
      o.quick ? " --quick" : "", kvc_version_string(), bench_rounds(o));
  std::string group;
  for (const BenchResult &r : results) {
    if (r.group != group) {
      group = r.group;
      std::printf("%s\n", group.c_str());
    }
    const double speed = r.baseline_seconds / r.seconds;
    std::printf("  %s\n    %-12s", r.name.c_str(), human_time(r.seconds).c_str());
    if (r.items > 0)
      std::printf("  %10s/%s", human_time(r.seconds / r.items).c_str(), r.item_unit.c_str());
    if (r.bytes > 0) std::printf("  %7.2f GB/s", r.bytes / r.seconds / 1e9);
    std::printf("\n    baseline: %s: %s   speed %.3fx\n", r.baseline.c_str(),
                human_time(r.baseline_seconds).c_str(), speed);
  }
  const std::vector<GoalResult> goals = goal_results(results);
  if (goals.empty()) return;
  std::printf("\ngoals (CPU hot paths; ratios of this run, noisy on a shared machine)\n");
  for (const GoalResult &g : goals) {
    const BenchResult &r = *g.result;
    if (g.goal->min_speed > 0)
      std::printf("  %-48s speed %.3fx   goal >= %.2fx   %s\n", g.goal->prefix,
                  r.baseline_seconds / r.seconds, g.goal->min_speed,
                  g.met ? "meets target" : "below target");
    else
      std::printf("  %-48s %s/%s   goal < %s   %s\n", g.goal->prefix,
                  human_time(r.seconds / r.items).c_str(), r.item_unit.c_str(),
                  human_time(g.goal->max_per_item).c_str(),
                  g.met ? "meets target" : "below target");
  }
}

std::string bench_json(const BenchOptions &o, const std::vector<BenchResult> &results) {
  nlohmann::ordered_json j;
  j["version"] = kvc_version_string();
  j["quick"] = o.quick;
  j["rounds"] = bench_rounds(o);
  nlohmann::ordered_json arr = nlohmann::ordered_json::array();
  for (const BenchResult &r : results) {
    nlohmann::ordered_json x;
    x["group"] = r.group;
    x["name"] = r.name;
    x["seconds"] = r.seconds;
    x["baseline"] = r.baseline;
    x["baseline_seconds"] = r.baseline_seconds;
    x["speed_vs_baseline"] = r.baseline_seconds / r.seconds;
    if (r.items > 0) {
      x["items"] = r.items;
      x["item_unit"] = r.item_unit;
      x["seconds_per_item"] = r.seconds / r.items;
    }
    if (r.bytes > 0) x["bytes_per_second"] = r.bytes / r.seconds;
    arr.push_back(x);
  }
  j["results"] = arr;
  nlohmann::ordered_json goals = nlohmann::ordered_json::array();
  for (const GoalResult &g : goal_results(results)) {
    nlohmann::ordered_json x;
    x["case"] = g.result->name;
    if (g.goal->min_speed > 0) x["min_speed_vs_baseline"] = g.goal->min_speed;
    if (g.goal->max_per_item > 0) x["max_seconds_per_item"] = g.goal->max_per_item;
    x["met"] = g.met;
    goals.push_back(x);
  }
  j["goals"] = goals;
  return j.dump(2);
}

}  // namespace kvc_cli
