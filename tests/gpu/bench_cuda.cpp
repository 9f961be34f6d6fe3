// CUDA benchmark of libkvcache: paged decode attention and quantize-on-write
// append on a pool in GPU memory, against the device's copy bandwidth.
//
// Usage: bench_cuda OUT_DIR [--quick] [--no-check]
//
//   a. copy:    device-to-device cudaMemcpyAsync of a 4 GiB buffer (2 GiB with
//               --quick); GB/s = (bytes read + bytes written) / time.
//   b. decode:  kvc_attention_decode, batch 64, 8192 tokens per sequence,
//               32 query heads, 8 KV heads, head_dim 128, block_size 16, one
//               layer, NHD; storage f16, int8 per token (f32 scales), fp8 e4m3
//               per token (f32 scales), int4 per group of 32 (f16 scales).
//               GB/s = KV bytes the call reads (tokens x bytes_per_token,
//               scales included) / time.
//   c. append:  one kvc_append of 65536 tokens (f16 K and V, 256 MiB of input)
//               into the same storages; GB/s = (input bytes + cache bytes
//               written) / time.
//   d. sdpa:    if OUT_DIR/sdpa.json (tests/gpu/sdpa_baseline.py) exists and
//               has the same shape, the ratio of our f16 decode time to
//               PyTorch's scaled_dot_product_attention.
//
// Every figure is the median of the timed repetitions (CUDA events on one
// stream, set on each pool with kvc_pool_set_stream()) after 3 warm-up runs.
// The wall time of each call (host clock, queueing + completion) is reported
// too: it shows host overhead, and catches work queued on another stream.
// Unless --no-check is given, each decode output is compared with the
// library's CPU backend run on the same data and storage.
//
// --quick: batch 8, 2048 tokens, append 4096 tokens, 3 repetitions (dry run).
// Writes OUT_DIR/bench_cuda.json. Exit status: 0 done, 1 a failure, 77 no
// CUDA device (skipped).
//
// Only the CUDA runtime API is used (no kernels of our own): inputs are
// generated on the host and copied to the device.
#include <cuda_runtime.h>
#include <sys/stat.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "kvcache/kvcache.h"

namespace {

// ---------------------------------------------------------------------------
// Error handling: any failure ends the program with status 1.
// ---------------------------------------------------------------------------

[[noreturn]] void die_kvc(const char *what, kvc_status s, int line) {
  std::fprintf(stderr, "bench_cuda:%d: %s failed: %s: %s\n", line, what, kvc_status_string(s),
               kvc_last_error_message());
  std::exit(1);
}

[[noreturn]] void die_cuda(const char *what, cudaError_t e, int line) {
  std::fprintf(stderr, "bench_cuda:%d: %s failed: %s: %s\n", line, what, cudaGetErrorName(e),
               cudaGetErrorString(e));
  std::exit(1);
}

#define KVC_CHECK(call)                                   \
  do {                                                    \
    const kvc_status s_ = (call);                         \
    if (s_ != KVC_OK) die_kvc(#call, s_, __LINE__);       \
  } while (0)

#define CUDA_CHECK(call)                                  \
  do {                                                    \
    const cudaError_t e_ = (call);                        \
    if (e_ != cudaSuccess) die_cuda(#call, e_, __LINE__); \
  } while (0)

// ---------------------------------------------------------------------------
// Problem sizes
// ---------------------------------------------------------------------------

constexpr uint32_t kQHeads = 32, kKvHeads = 8, kHeadDim = 128, kBlockSize = 16;
constexpr uint64_t kRow = uint64_t(kKvHeads) * kHeadDim;  // elements of one token's K (or V)
constexpr uint64_t kF16 = 2;                              // bytes of an f16
constexpr double kGiB = 1024.0 * 1024.0 * 1024.0, kMiB = 1024.0 * 1024.0;

struct Sizes {
  uint64_t copy_bytes;     // size of the copied buffer (read once, written once)
  uint32_t batch;          // decode sequences
  uint64_t tokens;         // tokens per decode sequence
  uint64_t append_tokens;  // tokens of the one timed kvc_append
  int reps;                // timed repetitions
  int warmup;              // untimed runs first
};

Sizes sizes_for(bool quick) {
  if (quick) return {2ull << 30, 8, 2048, 4096, 3, 3};
  return {4ull << 30, 64, 8192, 65536, 20, 3};
}

// ---------------------------------------------------------------------------
// Storages
// ---------------------------------------------------------------------------

struct Storage {
  const char *name;
  bool quantized;           // false: plain f16, no codec
  kvc_dtype dtype;          // codec storage dtype
  kvc_granularity gran;     // codec scale granularity
  uint32_t group_size;      // codec group size (per-group only)
  kvc_dtype scale_dtype;    // codec scale dtype
};

const Storage kStorages[] = {
    {"f16", false, KVC_DTYPE_F16, KVC_SCALE_NONE, 0, KVC_DTYPE_F32},
    {"int8_per_token", true, KVC_DTYPE_INT8, KVC_SCALE_PER_TOKEN, 32, KVC_DTYPE_F32},
    {"fp8_e4m3_per_token", true, KVC_DTYPE_FP8_E4M3, KVC_SCALE_PER_TOKEN, 32, KVC_DTYPE_F32},
    {"int4_group32", true, KVC_DTYPE_INT4, KVC_SCALE_PER_GROUP, 32, KVC_DTYPE_F16},
};
constexpr size_t kNumStorages = sizeof kStorages / sizeof kStorages[0];

// Create a one-layer pool of the benchmark's geometry with this storage.
// The codec is copied by kvc_pool_create(), so a local one is fine.
kvc_pool *make_pool(const Storage &st, kvc_device device, int device_index, uint64_t num_blocks) {
  kvc_pool_config c;
  KVC_CHECK(kvc_pool_config_init(&c));
  c.num_layers = 1;
  c.num_q_heads = kQHeads;
  c.num_kv_heads = kKvHeads;
  c.head_dim = kHeadDim;
  c.block_size = kBlockSize;
  c.num_blocks = num_blocks;
  c.layout = KVC_LAYOUT_NHD;
  c.device = device;
  c.device_index = device == KVC_DEVICE_CUDA ? device_index : 0;
  c.k_dtype = c.v_dtype = KVC_DTYPE_F16;
  kvc_codec codec;
  KVC_CHECK(kvc_codec_init(&codec));
  if (st.quantized) {
    codec.dtype = st.dtype;
    codec.granularity = st.gran;
    codec.group_size = st.group_size;
    codec.asymmetric = 0;
    codec.scale_dtype = st.scale_dtype;
    c.k_codec = c.v_codec = &codec;
  }
  kvc_pool *pool = nullptr;
  KVC_CHECK(kvc_pool_create(&c, &pool));
  return pool;
}

// Bytes one token takes in the pool's single layer, K and V, scales included.
// kvc_stats::bytes_per_token covers all layers (block bytes x layers /
// block_size), which is one layer here.
uint64_t bytes_per_token(kvc_pool *pool) {
  kvc_stats s;
  KVC_CHECK(kvc_stats_init(&s));
  KVC_CHECK(kvc_pool_stats(pool, &s));
  return s.bytes_per_token;  // num_layers == 1
}

// ---------------------------------------------------------------------------
// Data
// ---------------------------------------------------------------------------

// n values ~ N(0, 1) as f16 (converted by the library, round to nearest even).
std::vector<uint16_t> random_f16(uint64_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> g(0.0f, 1.0f);
  std::vector<float> f(n);
  for (float &x : f) x = g(rng);
  std::vector<uint16_t> h(n);
  KVC_CHECK(kvc_convert(f.data(), KVC_DTYPE_F32, h.data(), KVC_DTYPE_F16, n));
  return h;
}

std::vector<float> f16_to_f32(const std::vector<uint16_t> &h) {
  std::vector<float> f(h.size());
  KVC_CHECK(kvc_convert(h.data(), KVC_DTYPE_F16, f.data(), KVC_DTYPE_F32, h.size()));
  return f;
}

// A device buffer freed at scope exit.
struct DeviceBuffer {
  void *ptr = nullptr;
  uint64_t bytes = 0;
  explicit DeviceBuffer(uint64_t n) : bytes(n) { CUDA_CHECK(cudaMalloc(&ptr, n)); }
  ~DeviceBuffer() { cudaFree(ptr); }
  DeviceBuffer(const DeviceBuffer &) = delete;
  DeviceBuffer &operator=(const DeviceBuffer &) = delete;
};

// Fill `dst` (tokens rows of kRow f16) by repeating the host rows `src`
// (src_tokens rows): random data without generating all of it on the host.
void fill_tiled(DeviceBuffer &dst, uint64_t tokens, const std::vector<uint16_t> &src, uint64_t src_tokens) {
  for (uint64_t t = 0; t < tokens; t += src_tokens) {
    const uint64_t n = std::min(src_tokens, tokens - t);
    CUDA_CHECK(cudaMemcpy(static_cast<char *>(dst.ptr) + t * kRow * kF16, src.data(), n * kRow * kF16,
                          cudaMemcpyHostToDevice));
  }
}

// ---------------------------------------------------------------------------
// Timing
// ---------------------------------------------------------------------------

struct Timing {
  double us;       // median CUDA event time of one call
  double wall_us;  // median host time from before the call to its completion
};

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

// Run f() `warmup` times, then time `reps` runs, each alone on the idle stream.
template <class F>
Timing time_on_stream(cudaStream_t stream, const Sizes &sz, F &&f) {
  cudaEvent_t start, stop;
  CUDA_CHECK(cudaEventCreate(&start));
  CUDA_CHECK(cudaEventCreate(&stop));
  for (int i = 0; i < sz.warmup; ++i) f();
  CUDA_CHECK(cudaStreamSynchronize(stream));
  std::vector<double> ev, wall;
  for (int i = 0; i < sz.reps; ++i) {
    CUDA_CHECK(cudaStreamSynchronize(stream));
    const auto t0 = std::chrono::steady_clock::now();
    CUDA_CHECK(cudaEventRecord(start, stream));
    f();
    CUDA_CHECK(cudaEventRecord(stop, stream));
    CUDA_CHECK(cudaEventSynchronize(stop));
    const auto t1 = std::chrono::steady_clock::now();
    float ms = 0.0f;
    CUDA_CHECK(cudaEventElapsedTime(&ms, start, stop));
    ev.push_back(double(ms) * 1e3);
    wall.push_back(std::chrono::duration<double, std::micro>(t1 - t0).count());
  }
  CUDA_CHECK(cudaEventDestroy(start));
  CUDA_CHECK(cudaEventDestroy(stop));
  return {median(ev), median(wall)};
}

double gbps(double bytes, double us) { return us > 0 ? bytes / (us * 1e-6) / 1e9 : 0.0; }

// ---------------------------------------------------------------------------
// a. Copy bandwidth
// ---------------------------------------------------------------------------

struct CopyResult {
  uint64_t bytes;
  Timing t;
  double gbps;
};

CopyResult bench_copy(cudaStream_t stream, const Sizes &sz) {
  DeviceBuffer src(sz.copy_bytes), dst(sz.copy_bytes);
  CUDA_CHECK(cudaMemset(src.ptr, 0x3c, sz.copy_bytes));
  CUDA_CHECK(cudaMemset(dst.ptr, 0, sz.copy_bytes));
  const Timing t = time_on_stream(stream, sz, [&] {
    CUDA_CHECK(cudaMemcpyAsync(dst.ptr, src.ptr, sz.copy_bytes, cudaMemcpyDeviceToDevice, stream));
  });
  return {sz.copy_bytes, t, gbps(2.0 * double(sz.copy_bytes), t.us)};
}

// ---------------------------------------------------------------------------
// b. Decode attention
// ---------------------------------------------------------------------------

struct DecodeResult {
  const char *name;
  uint64_t bytes_per_token;
  uint64_t kv_bytes;
  Timing t;
  double gbps, fraction, speedup;
  double max_diff_vs_f16;  // max |out - out_f16| over all outputs (data quality of the storage)
  double max_diff_vs_cpu;  // max |out - CPU backend's out| (same storage); -1 when not checked
  double max_abs_ref;      // max |CPU out|, to read the differences against; -1 when not checked
};

// The same attention on the library's CPU backend: one sequence holding the
// shared K/V, listed batch times with the batch's queries (repeats allowed).
std::vector<float> cpu_reference(const Storage &st, const Sizes &sz, const std::vector<uint16_t> &k,
                                 const std::vector<uint16_t> &v, const std::vector<uint16_t> &q) {
  kvc_pool *pool = make_pool(st, KVC_DEVICE_CPU, 0, sz.tokens / kBlockSize + 16);
  KVC_CHECK(kvc_seq_create(pool, 0));
  KVC_CHECK(kvc_seq_reserve(pool, 0, sz.tokens, nullptr));
  KVC_CHECK(kvc_append(pool, 0, 0, 0, sz.tokens, k.data(), v.data(), KVC_DTYPE_F16));
  const std::vector<uint64_t> ids(sz.batch, 0);
  std::vector<float> out(uint64_t(sz.batch) * kQHeads * kHeadDim);
  kvc_attention_params p;
  KVC_CHECK(kvc_attention_params_init(&p));
  p.num_q_heads = kQHeads;
  p.q_dtype = KVC_DTYPE_F16;
  p.out_dtype = KVC_DTYPE_F32;
  p.num_threads = std::max(1u, std::min(16u, std::thread::hardware_concurrency()));
  KVC_CHECK(kvc_attention_decode(pool, 0, ids.data(), ids.size(), q.data(), out.data(), nullptr, &p));
  kvc_pool_destroy(pool);
  return out;
}

double max_abs_diff(const std::vector<float> &a, const std::vector<float> &b) {
  double m = 0.0;
  for (size_t i = 0; i < a.size(); ++i) {
    const double d = std::fabs(double(a[i]) - double(b[i]));
    if (!(d <= m)) m = d;  // NaN propagates as NaN
  }
  return m;
}

DecodeResult bench_decode(const Storage &st, cudaStream_t stream, int dev, const Sizes &sz, bool check,
                          const std::vector<uint16_t> &hk, const std::vector<uint16_t> &hv,
                          const std::vector<uint16_t> &hq, const DeviceBuffer &dk, const DeviceBuffer &dv,
                          const DeviceBuffer &dq, DeviceBuffer &dout, std::vector<float> &out_f16,
                          double copy_gbps, double f16_us) {
  const uint64_t num_blocks = uint64_t(sz.batch) * sz.tokens / kBlockSize + 64;
  kvc_pool *pool = make_pool(st, KVC_DEVICE_CUDA, dev, num_blocks);
  KVC_CHECK(kvc_pool_set_stream(pool, static_cast<void *>(stream)));

  // Every sequence holds the same K/V (one device buffer), with its own query.
  std::vector<uint64_t> ids(sz.batch);
  for (uint32_t b = 0; b < sz.batch; ++b) {
    ids[b] = b;
    KVC_CHECK(kvc_seq_create(pool, b));
    KVC_CHECK(kvc_seq_reserve(pool, b, sz.tokens, nullptr));
    KVC_CHECK(kvc_append(pool, b, 0, 0, sz.tokens, dk.ptr, dv.ptr, KVC_DTYPE_F16));
  }
  KVC_CHECK(kvc_pool_sync(pool));

  kvc_attention_params p;
  KVC_CHECK(kvc_attention_params_init(&p));
  p.num_q_heads = kQHeads;
  p.q_dtype = KVC_DTYPE_F16;
  p.out_dtype = KVC_DTYPE_F16;
  const Timing t = time_on_stream(stream, sz, [&] {
    KVC_CHECK(kvc_attention_decode(pool, 0, ids.data(), ids.size(), dq.ptr, dout.ptr, nullptr, &p));
  });
  KVC_CHECK(kvc_pool_sync(pool));

  DecodeResult r{};
  r.name = st.name;
  r.bytes_per_token = bytes_per_token(pool);
  r.kv_bytes = uint64_t(sz.batch) * sz.tokens * r.bytes_per_token;
  r.t = t;
  r.gbps = gbps(double(r.kv_bytes), t.us);
  r.fraction = copy_gbps > 0 ? r.gbps / copy_gbps : 0.0;
  kvc_pool_destroy(pool);

  // Output checks (outside the timing).
  std::vector<uint16_t> h(uint64_t(sz.batch) * kQHeads * kHeadDim);
  CUDA_CHECK(cudaMemcpy(h.data(), dout.ptr, h.size() * kF16, cudaMemcpyDeviceToHost));
  const std::vector<float> out = f16_to_f32(h);
  if (!st.quantized) out_f16 = out;  // f16 runs first: the reference of the others
  r.speedup = st.quantized ? (t.us > 0 ? f16_us / t.us : 0.0) : 1.0;
  r.max_diff_vs_f16 = max_abs_diff(out, out_f16);
  r.max_diff_vs_cpu = r.max_abs_ref = -1.0;
  if (check) {
    const std::vector<float> ref = cpu_reference(st, sz, hk, hv, hq);
    r.max_diff_vs_cpu = max_abs_diff(out, ref);
    r.max_abs_ref = 0.0;
    for (float x : ref) r.max_abs_ref = std::max(r.max_abs_ref, double(std::fabs(x)));
  }
  return r;
}

// ---------------------------------------------------------------------------
// c. Append with quantize-on-write
// ---------------------------------------------------------------------------

struct AppendResult {
  const char *name;
  uint64_t bytes_per_token;
  uint64_t input_bytes, written_bytes;
  Timing t;
  double gbps, fraction;
};

AppendResult bench_append(const Storage &st, cudaStream_t stream, int dev, const Sizes &sz,
                          const DeviceBuffer &dk, const DeviceBuffer &dv, double copy_gbps) {
  const uint64_t n = sz.append_tokens;
  kvc_pool *pool = make_pool(st, KVC_DEVICE_CUDA, dev, n / kBlockSize + 64);
  KVC_CHECK(kvc_pool_set_stream(pool, static_cast<void *>(stream)));
  KVC_CHECK(kvc_seq_create(pool, 1));
  KVC_CHECK(kvc_seq_reserve(pool, 1, n, nullptr));
  // Each repetition rewrites the same positions (allowed: a write replaces).
  const Timing t = time_on_stream(stream, sz, [&] {
    KVC_CHECK(kvc_append(pool, 1, 0, 0, n, dk.ptr, dv.ptr, KVC_DTYPE_F16));
  });
  KVC_CHECK(kvc_pool_sync(pool));
  AppendResult r{};
  r.name = st.name;
  r.bytes_per_token = bytes_per_token(pool);
  r.input_bytes = n * kRow * kF16 * 2;  // K and V
  r.written_bytes = n * r.bytes_per_token;
  r.t = t;
  r.gbps = gbps(double(r.input_bytes + r.written_bytes), t.us);
  r.fraction = copy_gbps > 0 ? r.gbps / copy_gbps : 0.0;
  kvc_pool_destroy(pool);
  return r;
}

// ---------------------------------------------------------------------------
// d. PyTorch baseline (OUT_DIR/sdpa.json, optional)
// ---------------------------------------------------------------------------

// The number after "key": in a flat JSON object, or NAN when absent.
double json_number(const std::string &text, const char *key) {
  const std::string k = std::string("\"") + key + "\"";
  size_t at = text.find(k);
  if (at == std::string::npos) return NAN;
  at = text.find(':', at + k.size());
  if (at == std::string::npos) return NAN;
  const char *s = text.c_str() + at + 1;
  char *end = nullptr;
  const double v = std::strtod(s, &end);
  return end == s ? NAN : v;
}

// The string after "key": in a flat JSON object ("" when absent).
std::string json_string(const std::string &text, const char *key) {
  const std::string k = std::string("\"") + key + "\"";
  size_t at = text.find(k);
  if (at == std::string::npos) return "";
  at = text.find('"', text.find(':', at + k.size()));
  if (at == std::string::npos) return "";
  const size_t end = text.find('"', at + 1);
  return end == std::string::npos ? "" : text.substr(at + 1, end - at - 1);
}

bool read_file(const std::string &path, std::string &text) {
  FILE *f = std::fopen(path.c_str(), "rb");
  if (!f) return false;
  char buf[4096];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof buf, f)) > 0) text.append(buf, n);
  std::fclose(f);
  return true;
}

struct SdpaResult {
  bool present = false;
  bool matches = false;  // same batch and tokens as our decode
  double sdpa_us = NAN, gbps = NAN, ratio = NAN;
  std::string method;
};

SdpaResult read_sdpa(const std::string &out_dir, const Sizes &sz, double f16_us) {
  SdpaResult r;
  std::string text;
  if (!read_file(out_dir + "/sdpa.json", text)) return r;
  r.present = true;
  r.sdpa_us = json_number(text, "sdpa_us");
  r.gbps = json_number(text, "gbps");
  r.method = json_string(text, "method");
  const double batch = json_number(text, "batch"), tokens = json_number(text, "tokens");
  // Files without the shape fields are assumed to match.
  r.matches = (std::isnan(batch) || batch == sz.batch) && (std::isnan(tokens) || tokens == double(sz.tokens));
  if (r.matches && r.sdpa_us > 0) r.ratio = f16_us / r.sdpa_us;
  return r;
}

// ---------------------------------------------------------------------------
// Output
// ---------------------------------------------------------------------------

std::string json_escape(const char *s) {
  std::string o;
  for (; *s; ++s) {
    const unsigned char c = static_cast<unsigned char>(*s);
    if (c == '"' || c == '\\') {
      o += '\\';
      o += char(c);
    } else if (c < 0x20) {
      char b[8];
      std::snprintf(b, sizeof b, "\\u%04x", c);
      o += b;
    } else {
      o += char(c);
    }
  }
  return o;
}

// A JSON number (null for NaN or Inf, which JSON cannot hold).
std::string jnum(double v) {
  if (!std::isfinite(v)) return "null";
  char b[64];
  std::snprintf(b, sizeof b, "%.6g", v);
  return b;
}

bool write_json(const std::string &path, const char *device_name, const Sizes &sz, bool quick,
                const CopyResult &copy, const std::vector<DecodeResult> &dec,
                const std::vector<AppendResult> &app, const SdpaResult &sdpa) {
  FILE *f = std::fopen(path.c_str(), "w");
  if (!f) return false;
  std::fprintf(f, "{\n  \"device\": \"%s\",\n  \"library_version\": \"%s\",\n  \"quick\": %s,\n",
               json_escape(device_name).c_str(), json_escape(kvc_version_string()).c_str(),
               quick ? "true" : "false");
  std::fprintf(f, "  \"warmup\": %d,\n  \"repetitions\": %d,\n", sz.warmup, sz.reps);
  std::fprintf(f,
               "  \"copy\": {\"buffer_bytes\": %llu, \"us\": %s, \"wall_us\": %s, \"gbps\": %s},\n",
               (unsigned long long)copy.bytes, jnum(copy.t.us).c_str(), jnum(copy.t.wall_us).c_str(),
               jnum(copy.gbps).c_str());
  std::fprintf(f,
               "  \"decode\": {\n    \"batch\": %u, \"tokens\": %llu, \"num_q_heads\": %u, "
               "\"num_kv_heads\": %u, \"head_dim\": %u, \"block_size\": %u, \"layout\": \"NHD\",\n"
               "    \"configs\": [\n",
               sz.batch, (unsigned long long)sz.tokens, kQHeads, kKvHeads, kHeadDim, kBlockSize);
  for (size_t i = 0; i < dec.size(); ++i) {
    const DecodeResult &r = dec[i];
    std::fprintf(f,
                 "      {\"storage\": \"%s\", \"bytes_per_token\": %llu, \"kv_bytes\": %llu, \"us\": %s, "
                 "\"wall_us\": %s, \"gbps\": %s, \"fraction_of_copy\": %s, \"speedup_vs_f16\": %s, "
                 "\"max_abs_diff_vs_f16\": %s, \"max_abs_diff_vs_cpu\": %s, \"max_abs_cpu_out\": %s}%s\n",
                 r.name, (unsigned long long)r.bytes_per_token, (unsigned long long)r.kv_bytes,
                 jnum(r.t.us).c_str(), jnum(r.t.wall_us).c_str(), jnum(r.gbps).c_str(), jnum(r.fraction).c_str(),
                 jnum(r.speedup).c_str(), jnum(r.max_diff_vs_f16).c_str(),
                 r.max_diff_vs_cpu < 0 ? "null" : jnum(r.max_diff_vs_cpu).c_str(),
                 r.max_abs_ref < 0 ? "null" : jnum(r.max_abs_ref).c_str(), i + 1 < dec.size() ? "," : "");
  }
  std::fprintf(f, "    ]\n  },\n");
  std::fprintf(f, "  \"append\": {\n    \"tokens\": %llu,\n    \"configs\": [\n",
               (unsigned long long)sz.append_tokens);
  for (size_t i = 0; i < app.size(); ++i) {
    const AppendResult &r = app[i];
    std::fprintf(f,
                 "      {\"storage\": \"%s\", \"bytes_per_token\": %llu, \"input_bytes\": %llu, "
                 "\"written_bytes\": %llu, \"us\": %s, \"wall_us\": %s, \"gbps\": %s, \"fraction_of_copy\": %s}%s\n",
                 r.name, (unsigned long long)r.bytes_per_token, (unsigned long long)r.input_bytes,
                 (unsigned long long)r.written_bytes, jnum(r.t.us).c_str(), jnum(r.t.wall_us).c_str(),
                 jnum(r.gbps).c_str(), jnum(r.fraction).c_str(), i + 1 < app.size() ? "," : "");
  }
  std::fprintf(f, "    ]\n  },\n");
  if (sdpa.present)
    std::fprintf(f,
                 "  \"sdpa\": {\"sdpa_us\": %s, \"gbps\": %s, \"method\": \"%s\", \"same_shape\": %s, "
                 "\"f16_us_over_sdpa_us\": %s}\n",
                 jnum(sdpa.sdpa_us).c_str(), jnum(sdpa.gbps).c_str(), json_escape(sdpa.method.c_str()).c_str(),
                 sdpa.matches ? "true" : "false", jnum(sdpa.ratio).c_str());
  else
    std::fprintf(f, "  \"sdpa\": null\n");
  std::fprintf(f, "}\n");
  return std::fclose(f) == 0;
}

}  // namespace

int main(int argc, char **argv) {
  std::string out_dir;
  bool quick = false, check = true;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--quick") == 0) {
      quick = true;
    } else if (std::strcmp(argv[i], "--no-check") == 0) {
      check = false;
    } else if (argv[i][0] != '-' && out_dir.empty()) {
      out_dir = argv[i];
    } else {
      out_dir.clear();
      break;
    }
  }
  if (out_dir.empty()) {
    std::fprintf(stderr, "usage: %s OUT_DIR [--quick] [--no-check]\n", argv[0]);
    return 2;
  }

  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess || count == 0) {
    std::printf("no CUDA device: skipped\n");
    return 77;
  }
  if (::mkdir(out_dir.c_str(), 0755) != 0 && errno != EEXIST) {
    std::fprintf(stderr, "cannot create %s: %s\n", out_dir.c_str(), std::strerror(errno));
    return 1;
  }

  const Sizes sz = sizes_for(quick);
  int dev = 0;
  CUDA_CHECK(cudaGetDevice(&dev));
  cudaDeviceProp prop;
  CUDA_CHECK(cudaGetDeviceProperties(&prop, dev));
  cudaStream_t stream;
  CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  std::printf("bench_cuda: libkvcache %s on %s (device %d, %.1f GiB)%s\n", kvc_version_string(), prop.name, dev,
              double(prop.totalGlobalMem) / kGiB, quick ? ", --quick" : "");
  std::printf("median of %d runs after %d warm-up runs; us = CUDA event time, wall = host time to completion\n\n",
              sz.reps, sz.warmup);

  // a. Copy bandwidth.
  const CopyResult copy = bench_copy(stream, sz);
  std::printf("copy D2D %.2f GiB: %.1f us (wall %.1f us), %.1f GB/s (read + write)\n\n",
              double(copy.bytes) / kGiB, copy.t.us, copy.t.wall_us, copy.gbps);

  // Inputs: the K/V rows of one sequence (shared by all) and the queries.
  const uint64_t tile_tokens = sz.tokens;
  const std::vector<uint16_t> hk = random_f16(tile_tokens * kRow, 1);
  const std::vector<uint16_t> hv = random_f16(tile_tokens * kRow, 2);
  const std::vector<uint16_t> hq = random_f16(uint64_t(sz.batch) * kQHeads * kHeadDim, 3);
  const uint64_t kv_tokens = std::max(sz.tokens, sz.append_tokens);  // append rows repeat the tile
  DeviceBuffer dk(kv_tokens * kRow * kF16), dv(kv_tokens * kRow * kF16);
  fill_tiled(dk, kv_tokens, hk, tile_tokens);
  fill_tiled(dv, kv_tokens, hv, tile_tokens);
  DeviceBuffer dq(hq.size() * kF16), dout(hq.size() * kF16);
  CUDA_CHECK(cudaMemcpy(dq.ptr, hq.data(), dq.bytes, cudaMemcpyHostToDevice));
  CUDA_CHECK(cudaMemset(dout.ptr, 0, dout.bytes));

  // b. Decode attention, f16 first (the reference of speed-ups and outputs).
  std::printf("decode attention: batch %u x %llu tokens, %u q heads / %u kv heads, head_dim %u, block %u, NHD\n",
              sz.batch, (unsigned long long)sz.tokens, kQHeads, kKvHeads, kHeadDim, kBlockSize);
  std::printf("%-20s %9s %10s %10s %10s %9s %8s %7s %10s %10s\n", "storage", "B/token", "KV MiB", "us", "wall us",
              "GB/s", "of copy", "vs f16", "d(f16)", "d(cpu)");
  std::vector<DecodeResult> dec;
  std::vector<float> out_f16;
  for (size_t i = 0; i < kNumStorages; ++i) {
    const double f16_us = dec.empty() ? 0.0 : dec[0].t.us;
    const DecodeResult r = bench_decode(kStorages[i], stream, dev, sz, check, hk, hv, hq, dk, dv, dq, dout,
                                        out_f16, copy.gbps, f16_us);
    std::printf("%-20s %9llu %10.1f %10.1f %10.1f %9.1f %8.3f %7.2f %10.3g", r.name,
                (unsigned long long)r.bytes_per_token, double(r.kv_bytes) / kMiB, r.t.us, r.t.wall_us, r.gbps,
                r.fraction, r.speedup, r.max_diff_vs_f16);
    if (r.max_diff_vs_cpu >= 0)
      std::printf(" %10.3g%s\n", r.max_diff_vs_cpu,
                  // Same storage and data: only summation order should differ.
                  !(r.max_diff_vs_cpu <= 1e-2 * std::max(r.max_abs_ref, 1e-3)) ? "  <- WARNING: differs from CPU" : "");
    else
      std::printf(" %10s\n", "-");
    std::fflush(stdout);
    dec.push_back(r);
  }
  std::printf("(d(f16): max |out - f16 out|; d(cpu): max |out - CPU backend out|, same storage");
  if (check) std::printf("; max |CPU out| %.3g", dec[0].max_abs_ref);
  std::printf(")\n\n");

  // c. Append with quantize-on-write.
  std::printf("append: one kvc_append of %llu tokens, f16 K and V in (%.1f MiB)\n",
              (unsigned long long)sz.append_tokens, double(sz.append_tokens * kRow * kF16 * 2) / kMiB);
  std::printf("%-20s %9s %12s %10s %10s %9s %8s\n", "storage", "B/token", "written MiB", "us", "wall us", "GB/s",
              "of copy");
  std::vector<AppendResult> app;
  for (size_t i = 0; i < kNumStorages; ++i) {
    const AppendResult r = bench_append(kStorages[i], stream, dev, sz, dk, dv, copy.gbps);
    std::printf("%-20s %9llu %12.1f %10.1f %10.1f %9.1f %8.3f\n", r.name, (unsigned long long)r.bytes_per_token,
                double(r.written_bytes) / kMiB, r.t.us, r.t.wall_us, r.gbps, r.fraction);
    std::fflush(stdout);
    app.push_back(r);
  }
  std::printf("(GB/s = (input bytes + cache bytes written) / time)\n\n");

  // d. PyTorch baseline, when its script ran first.
  const SdpaResult sdpa = read_sdpa(out_dir, sz, dec[0].t.us);
  if (!sdpa.present)
    std::printf("sdpa: no %s/sdpa.json (run tests/gpu/sdpa_baseline.py first to compare)\n", out_dir.c_str());
  else if (!sdpa.matches)
    std::printf("sdpa: %s/sdpa.json has another shape (--quick mismatch?); not compared\n", out_dir.c_str());
  else
    std::printf("sdpa (%s): %.1f us, %.1f GB/s; libkvcache f16 / sdpa time = %.3f (%.2fx %s)\n",
                sdpa.method.c_str(), sdpa.sdpa_us, sdpa.gbps, sdpa.ratio,
                sdpa.ratio > 0 ? (sdpa.ratio <= 1 ? 1 / sdpa.ratio : sdpa.ratio) : 0.0,
                sdpa.ratio <= 1 ? "faster" : "slower");

  const std::string json = out_dir + "/bench_cuda.json";
  if (!write_json(json, prop.name, sz, quick, copy, dec, app, sdpa)) {
    std::fprintf(stderr, "cannot write %s\n", json.c_str());
    return 1;
  }
  std::printf("wrote %s\n", json.c_str());
  CUDA_CHECK(cudaStreamDestroy(stream));
  return 0;
}
