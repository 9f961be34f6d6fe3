// GPU tests: every CUDA kernel against the CPU implementation on the same
// inputs. A CUDA pool and a CPU pool with the same configuration go through
// the same calls; their blocks must hold the same bytes (codecs bit for
// bit), gathers must match bit for bit, attention within 1e-3 relative.
//
// Usage: test_cuda MODE, MODE one of codecs, attention, evict, errors,
// stream, tiers. Exits 77 (ctest: skipped) with a message when there is no CUDA
// device or driver.
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "kvcache/kvcache.h"

namespace {

int g_failures = 0;
#define CHECK(cond, ...)                                    \
  do {                                                      \
    if (!(cond)) {                                          \
      std::printf("FAIL %s:%d: ", __FILE__, __LINE__);      \
      std::printf(__VA_ARGS__);                             \
      std::printf("\n");                                    \
      ++g_failures;                                         \
    }                                                       \
  } while (0)
#define OK(call)                                                                          \
  do {                                                                                    \
    const kvc_status st_ = (call);                                                        \
    if (st_ != KVC_OK) {                                                                  \
      std::printf("FAIL %s:%d: %s -> %s: %s\n", __FILE__, __LINE__, #call,                \
                  kvc_status_string(st_), kvc_last_error_message());                      \
      ++g_failures;                                                                       \
      return;                                                                             \
    }                                                                                     \
  } while (0)

struct Case {
  const char *name;
  uint32_t hq, h, hd;
  kvc_layout layout = KVC_LAYOUT_NHD;
  kvc_dtype plain = KVC_DTYPE_F16;  // plain storage when dtype below is a float
  kvc_dtype dtype = KVC_DTYPE_F16;
  kvc_granularity gran = KVC_SCALE_NONE;
  uint32_t group = 32;
  uint32_t asym = 0;
  kvc_dtype scale_dtype = KVC_DTYPE_F32;
  uint32_t rotate = 0;
  double static_scale = 0.0;
};

std::vector<Case> cases() {
  std::vector<Case> v;
  auto add = [&](Case c) { v.push_back(c); };
  for (uint32_t hd : {8u, 64u, 96u, 128u, 256u}) {
    const uint32_t h = hd >= 128 ? 2 : 3, hq = hd == 8 ? 6 : 3 * h;
    add({"f16", hq, h, hd});
    add({"int8 token", hq, h, hd, KVC_LAYOUT_NHD, KVC_DTYPE_F16, KVC_DTYPE_INT8, KVC_SCALE_PER_TOKEN});
    add({"int4 group32 f16 scales hadamard", hq, h, hd, KVC_LAYOUT_NHD, KVC_DTYPE_F16, KVC_DTYPE_INT4,
         KVC_SCALE_PER_GROUP, hd < 32 ? 8u : 32u, 0, KVC_DTYPE_F16, 1});
    add({"fp8 e4m3 token", hq, h, hd, KVC_LAYOUT_NHD, KVC_DTYPE_F16, KVC_DTYPE_FP8_E4M3, KVC_SCALE_PER_TOKEN});
  }
  // Everything else at head_dim 64 (and the odd shapes).
  add({"f32", 8, 2, 64, KVC_LAYOUT_NHD, KVC_DTYPE_F32, KVC_DTYPE_F32});
  add({"bf16", 8, 2, 64, KVC_LAYOUT_NHD, KVC_DTYPE_BF16, KVC_DTYPE_BF16});
  add({"f16 HND", 8, 2, 64, KVC_LAYOUT_HND});
  add({"bf16 HND hd8", 4, 2, 8, KVC_LAYOUT_HND, KVC_DTYPE_BF16, KVC_DTYPE_BF16});
  add({"f16 hd12", 4, 2, 12});
  add({"fp8 e5m2 group16", 8, 2, 64, KVC_LAYOUT_NHD, KVC_DTYPE_F16, KVC_DTYPE_FP8_E5M2, KVC_SCALE_PER_GROUP, 16});
  add({"int8 token asym f16", 8, 2, 64, KVC_LAYOUT_NHD, KVC_DTYPE_F16, KVC_DTYPE_INT8, KVC_SCALE_PER_TOKEN, 32, 1,
       KVC_DTYPE_F16});
  add({"int8 tensor dynamic", 8, 2, 64, KVC_LAYOUT_NHD, KVC_DTYPE_F16, KVC_DTYPE_INT8, KVC_SCALE_PER_TENSOR});
  add({"int8 tensor static", 8, 2, 64, KVC_LAYOUT_NHD, KVC_DTYPE_F16, KVC_DTYPE_INT8, KVC_SCALE_PER_TENSOR, 32, 0,
       KVC_DTYPE_F32, 0, 0.02});
  add({"fp8 e4m3 tensor static f16", 8, 2, 64, KVC_LAYOUT_NHD, KVC_DTYPE_F16, KVC_DTYPE_FP8_E4M3,
       KVC_SCALE_PER_TENSOR, 32, 0, KVC_DTYPE_F16, 0, 0.01});
  add({"int4 token asym", 8, 2, 64, KVC_LAYOUT_NHD, KVC_DTYPE_F16, KVC_DTYPE_INT4, KVC_SCALE_PER_TOKEN, 32, 1});
  add({"int4 group4 (not a multiple of 8)", 8, 2, 64, KVC_LAYOUT_NHD, KVC_DTYPE_F16, KVC_DTYPE_INT4,
       KVC_SCALE_PER_GROUP, 4});
  add({"int4 group96 across heads", 8, 2, 64, KVC_LAYOUT_NHD, KVC_DTYPE_F16, KVC_DTYPE_INT4, KVC_SCALE_PER_GROUP, 96});
  add({"int2 group16 asym", 8, 2, 64, KVC_LAYOUT_NHD, KVC_DTYPE_F16, KVC_DTYPE_INT2, KVC_SCALE_PER_GROUP, 16, 1});
  add({"int2 token hadamard", 8, 2, 64, KVC_LAYOUT_NHD, KVC_DTYPE_F16, KVC_DTYPE_INT2, KVC_SCALE_PER_TOKEN, 32, 0,
       KVC_DTYPE_F32, 1});
  add({"int8 token hd8 gqa", 8, 1, 8, KVC_LAYOUT_NHD, KVC_DTYPE_F16, KVC_DTYPE_INT8, KVC_SCALE_PER_TOKEN});
  add({"f16 gqa 16", 32, 2, 64});
  return v;
}

struct Pools {
  kvc_pool *cpu = nullptr, *gpu = nullptr;
  kvc_codec codec{};
  ~Pools() {
    kvc_pool_destroy(cpu);
    kvc_pool_destroy(gpu);
  }
};

kvc_status make_pools(const Case &c, uint32_t layers, uint64_t blocks, Pools &p, uint32_t block_size = 16) {
  kvc_codec_init(&p.codec);
  p.codec.dtype = c.dtype;
  p.codec.granularity = c.gran;
  p.codec.group_size = c.group;
  p.codec.asymmetric = c.asym;
  p.codec.scale_dtype = c.scale_dtype;
  p.codec.rotation = c.rotate ? KVC_ROTATION_HADAMARD : KVC_ROTATION_NONE;
  p.codec.static_scale = c.static_scale > 0;
  p.codec.scale = c.static_scale;
  kvc_pool_config cfg;
  kvc_pool_config_init(&cfg);
  cfg.num_layers = layers;
  cfg.num_q_heads = c.hq;
  cfg.num_kv_heads = c.h;
  cfg.head_dim = c.hd;
  cfg.block_size = block_size;
  cfg.num_blocks = blocks;
  cfg.k_dtype = cfg.v_dtype = c.plain;
  cfg.layout = c.layout;
  cfg.rope_style = KVC_ROPE_NEOX;
  if (c.gran != KVC_SCALE_NONE) cfg.k_codec = cfg.v_codec = &p.codec;
  kvc_status s = kvc_pool_create(&cfg, &p.cpu);
  if (s != KVC_OK) return s;
  cfg.device = KVC_DEVICE_CUDA;
  return kvc_pool_create(&cfg, &p.gpu);
}

// Normal values with a few outlier channels (what real keys look like).
std::vector<float> rows(std::mt19937 &rng, uint64_t n, uint64_t row) {
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::vector<float> x(n * row);
  for (uint64_t i = 0; i < x.size(); ++i) x[i] = nd(rng) * ((i % row) % 17 == 3 ? 8.0f : 1.0f);
  return x;
}

template <class T>
T *to_device(const std::vector<T> &v) {
  T *d = nullptr;
  if (cudaMalloc(&d, v.size() * sizeof(T) + 16) != cudaSuccess) return nullptr;
  cudaMemcpy(d, v.data(), v.size() * sizeof(T), cudaMemcpyHostToDevice);
  cudaDeviceSynchronize();
  return d;
}

// Same calls on both pools: reserve and append (host f32 rows first, then
// f16 rows from device memory).
void append_both(Pools &p, uint64_t seq, uint32_t layers, uint64_t pos, uint64_t n, uint64_t row, std::mt19937 &rng,
                 bool device_half) {
  for (uint32_t l = 0; l < layers; ++l) {
    std::vector<float> k = rows(rng, n, row), v = rows(rng, n, row);
    if (!device_half) {
      OK(kvc_append(p.cpu, seq, l, pos, n, k.data(), v.data(), KVC_DTYPE_F32));
      OK(kvc_append(p.gpu, seq, l, pos, n, k.data(), v.data(), KVC_DTYPE_F32));
      continue;
    }
    std::vector<uint16_t> kh(k.size()), vh(v.size());
    kvc_convert(k.data(), KVC_DTYPE_F32, kh.data(), KVC_DTYPE_F16, k.size());
    kvc_convert(v.data(), KVC_DTYPE_F32, vh.data(), KVC_DTYPE_F16, v.size());
    uint16_t *dk = to_device(kh), *dv = to_device(vh);
    OK(kvc_append(p.cpu, seq, l, pos, n, kh.data(), vh.data(), KVC_DTYPE_F16));
    OK(kvc_append(p.gpu, seq, l, pos, n, dk, dv, KVC_DTYPE_F16));
    OK(kvc_pool_sync(p.gpu));
    cudaFree(dk);
    cudaFree(dv);
  }
}

void grow(Pools &p, uint64_t seq, uint64_t n) {
  OK(kvc_seq_reserve(p.cpu, seq, n, nullptr));
  OK(kvc_seq_reserve(p.gpu, seq, n, nullptr));
}

// The blocks of a sequence hold the same bytes in both pools.
void same_blocks(Pools &p, uint64_t seq, uint32_t layers, const char *what) {
  kvc_stats st;
  kvc_stats_init(&st);
  OK(kvc_pool_stats(p.cpu, &st));
  for (uint32_t l = 0; l < layers; ++l) {
    int32_t a[512], b[512];
    size_t na = 0, nb = 0;
    OK(kvc_seq_block_table(p.cpu, seq, l, a, 512, &na));
    OK(kvc_seq_block_table(p.gpu, seq, l, b, 512, &nb));
    CHECK(na == nb && std::memcmp(a, b, na * 4) == 0, "%s: block tables differ (layer %u)", what, l);
    if (na != nb) return;
    std::vector<uint8_t> ca(na * st.bytes_per_block), cb(na * st.bytes_per_block, 0xAB);
    OK(kvc_pool_copy_blocks(p.cpu, a, na, ca.data(), KVC_COPY_TO_HOST));
    OK(kvc_pool_copy_blocks(p.gpu, b, nb, cb.data(), KVC_COPY_TO_HOST));
    size_t first = SIZE_MAX;
    for (size_t i = 0; i < ca.size() && first == SIZE_MAX; ++i)
      if (ca[i] != cb[i]) first = i;
    CHECK(first == SIZE_MAX, "%s: layer %u block bytes differ first at byte %zu of %zu (block %zu, offset %zu): cpu %02x gpu %02x",
          what, l, first, ca.size(), first / st.bytes_per_block, first % st.bytes_per_block,
          first == SIZE_MAX ? 0 : ca[first], first == SIZE_MAX ? 0 : cb[first]);
    if (first != SIZE_MAX) {
      size_t ndiff = 0;
      for (size_t i = 0; i < ca.size(); ++i) ndiff += ca[i] != cb[i];
      std::printf("    %zu bytes differ; from the first: cpu", ndiff);
      for (size_t i = first; i < first + 12 && i < ca.size(); ++i) std::printf(" %02x", ca[i]);
      std::printf(" | gpu");
      for (size_t i = first; i < first + 12 && i < ca.size(); ++i) std::printf(" %02x", cb[i]);
      std::printf("\n");
    }
  }
}

// Gathers match bit for bit (host f32 and device f16 outputs).
void same_gather(Pools &p, uint64_t seq, uint32_t layers, uint64_t row, const char *what) {
  for (uint32_t l = 0; l < layers; ++l) {
    uint64_t n = 0, n2 = 0;
    OK(kvc_seq_layer_tokens(p.cpu, seq, l, &n));
    OK(kvc_seq_layer_tokens(p.gpu, seq, l, &n2));
    CHECK(n == n2, "%s: token counts %llu vs %llu", what, (unsigned long long)n, (unsigned long long)n2);
    std::vector<float> ka(n * row), va(n * row), kb(n * row, -1.0f), vb(n * row, -1.0f);
    std::vector<int32_t> pa(n), pb(n);
    OK(kvc_gather(p.cpu, seq, l, 0, n, ka.data(), va.data(), KVC_DTYPE_F32, pa.data()));
    OK(kvc_gather(p.gpu, seq, l, 0, n, kb.data(), vb.data(), KVC_DTYPE_F32, pb.data()));
    CHECK(std::memcmp(ka.data(), kb.data(), ka.size() * 4) == 0, "%s: gathered K differs (layer %u)", what, l);
    CHECK(std::memcmp(va.data(), vb.data(), va.size() * 4) == 0, "%s: gathered V differs (layer %u)", what, l);
    CHECK(pa == pb, "%s: positions differ", what);
    // f16 into device memory.
    std::vector<uint16_t> kh(n * row), vh(n * row, 0), dkh(n * row, 1);
    uint16_t *dk = nullptr;
    cudaMalloc(&dk, n * row * 2 + 16);
    OK(kvc_gather(p.cpu, seq, l, 0, n, kh.data(), vh.data(), KVC_DTYPE_F16, nullptr));
    OK(kvc_gather(p.gpu, seq, l, 0, n, dk, nullptr, KVC_DTYPE_F16, nullptr));
    OK(kvc_pool_sync(p.gpu));
    cudaMemcpy(dkh.data(), dk, n * row * 2, cudaMemcpyDeviceToHost);
    cudaFree(dk);
    CHECK(kh == dkh, "%s: f16 gather into device memory differs (layer %u)", what, l);
  }
}

double rel_diff(const std::vector<float> &a, const std::vector<float> &b) {
  double d = 0, m = 1e-6;
  for (size_t i = 0; i < a.size(); ++i) {
    if (!std::isfinite(a[i]) || !std::isfinite(b[i])) {  // an empty sequence's lse: -inf on both sides
      if (!(a[i] == b[i])) return INFINITY;
      continue;
    }
    d = std::max(d, static_cast<double>(std::fabs(a[i] - b[i])));
    m = std::max(m, static_cast<double>(std::fabs(a[i])));
  }
  return d / m;
}

// Decode over seq_ids and prefill over the last n_q tokens of seq_ids[0]
// agree within 1e-3 relative (f32 out, and f16 q/out from device memory).
void same_attention(Pools &p, const Case &c, const std::vector<uint64_t> &ids, uint32_t layer, uint64_t n_q,
                    std::mt19937 &rng, const char *what) {
  const uint64_t qrow = static_cast<uint64_t>(c.hq) * c.hd;
  kvc_attention_params ap;
  kvc_attention_params_init(&ap);
  ap.num_q_heads = c.hq;
  {
    std::vector<float> q = rows(rng, ids.size(), qrow);
    std::vector<float> oa(q.size()), ob(q.size(), NAN), la(ids.size() * c.hq), lb(la.size(), NAN);
    OK(kvc_attention_decode(p.cpu, layer, ids.data(), ids.size(), q.data(), oa.data(), la.data(), &ap));
    OK(kvc_attention_decode(p.gpu, layer, ids.data(), ids.size(), q.data(), ob.data(), lb.data(), &ap));
    const double r = rel_diff(oa, ob), rl = rel_diff(la, lb);
    CHECK(r <= 1e-3 && rl <= 1e-3, "%s: decode differs by %.3g relative (lse %.3g)", what, r, rl);
    // f16 q and out in device memory.
    std::vector<uint16_t> qh(q.size()), oh(q.size());
    kvc_convert(q.data(), KVC_DTYPE_F32, qh.data(), KVC_DTYPE_F16, q.size());
    uint16_t *dq = to_device(qh), *dout = to_device(oh);
    kvc_attention_params hp = ap;
    hp.q_dtype = hp.out_dtype = KVC_DTYPE_F16;
    std::vector<uint16_t> ref(q.size());
    OK(kvc_attention_decode(p.cpu, layer, ids.data(), ids.size(), qh.data(), ref.data(), nullptr, &hp));
    OK(kvc_attention_decode(p.gpu, layer, ids.data(), ids.size(), dq, dout, nullptr, &hp));
    OK(kvc_pool_sync(p.gpu));
    cudaMemcpy(oh.data(), dout, oh.size() * 2, cudaMemcpyDeviceToHost);
    cudaFree(dq);
    cudaFree(dout);
    std::vector<float> fa(q.size()), fb(q.size());
    kvc_convert(ref.data(), KVC_DTYPE_F16, fa.data(), KVC_DTYPE_F32, q.size());
    kvc_convert(oh.data(), KVC_DTYPE_F16, fb.data(), KVC_DTYPE_F32, q.size());
    const double r16 = rel_diff(fa, fb);
    CHECK(r16 <= 1e-3, "%s: f16 decode from device memory differs by %.3g relative", what, r16);
  }
  if (n_q) {
    std::vector<float> q = rows(rng, n_q, qrow);
    std::vector<float> oa(q.size()), ob(q.size(), NAN), la(n_q * c.hq), lb(la.size(), NAN);
    OK(kvc_attention_prefill(p.cpu, layer, ids[0], q.data(), n_q, oa.data(), la.data(), &ap));
    OK(kvc_attention_prefill(p.gpu, layer, ids[0], q.data(), n_q, ob.data(), lb.data(), &ap));
    const double r = rel_diff(oa, ob), rl = rel_diff(la, lb);
    CHECK(r <= 1e-3 && rl <= 1e-3, "%s: prefill differs by %.3g relative (lse %.3g)", what, r, rl);
  }
}

void run_case(const Case &c, bool attention, bool evict) {
  char what[160];
  std::snprintf(what, sizeof what, "%s hq%u h%u hd%u", c.name, c.hq, c.h, c.hd);
  const uint32_t layers = 2;
  const uint64_t row = static_cast<uint64_t>(c.h) * c.hd;
  Pools p;
  const kvc_status s = make_pools(c, layers, 256, p);
  if (s != KVC_OK) {
    CHECK(false, "%s: pool create: %s: %s", what, kvc_status_string(s), kvc_last_error_message());
    return;
  }
  std::mt19937 rng(1234 + c.hd);
  OK(kvc_seq_create(p.cpu, 1));
  OK(kvc_seq_create(p.gpu, 1));
  grow(p, 1, 50);
  append_both(p, 1, layers, 0, 50, row, rng, false);
  grow(p, 1, 27);
  append_both(p, 1, layers, 50, 27, row, rng, true);
  same_blocks(p, 1, layers, what);
  same_gather(p, 1, layers, row, what);
  // Fork (shared blocks), then append to the child: copy-on-write of its last block.
  OK(kvc_seq_fork(p.cpu, 1, 2));
  OK(kvc_seq_fork(p.gpu, 1, 2));
  grow(p, 2, 9);
  append_both(p, 2, layers, 77, 9, row, rng, false);
  same_blocks(p, 2, layers, what);
  same_blocks(p, 1, layers, what);
  same_gather(p, 2, layers, row, what);
  OK(kvc_seq_create(p.cpu, 3));
  OK(kvc_seq_create(p.gpu, 3));  // empty sequence: zeros and lse -inf
  if (attention) {
    same_attention(p, c, {1, 2, 3, 1}, 1, 9, rng, what);
    // A longer sequence: several splits per sequence.
    OK(kvc_seq_create(p.cpu, 4));
    OK(kvc_seq_create(p.gpu, 4));
    grow(p, 4, 1500);
    append_both(p, 4, layers, 0, 1500, row, rng, true);
    same_attention(p, c, {4, 1}, 0, 70, rng, what);
  }
  if (evict) {
    // Streaming with re-rotated keys (a shift), then H2O on fed scores
    // (scattered survivors): compaction on the device.
    kvc_policy_config pc;
    kvc_policy_config_init(&pc);
    pc.kind = KVC_POLICY_STREAMING;
    pc.sink_tokens = 4;
    pc.budget_tokens = 40;
    const bool tensor = c.gran == KVC_SCALE_PER_TENSOR;
    pc.shift_positions = tensor ? 0 : 1;  // one scale per tensor cannot hold re-rotated keys
    kvc_policy *pol = nullptr;
    OK(kvc_policy_create(&pc, &pol));
    std::vector<uint64_t> da(layers), db(layers);
    const kvc_status ea = kvc_evict(p.cpu, 1, pol, da.data()), eb = kvc_evict(p.gpu, 1, pol, db.data());
    kvc_policy_destroy(pol);
    CHECK(ea == KVC_OK && eb == KVC_OK && da == db, "%s: streaming eviction: %s / %s", what, kvc_status_string(ea),
          kvc_status_string(eb));
    same_blocks(p, 1, layers, what);
    same_gather(p, 1, layers, row, what);
    same_blocks(p, 2, layers, what);  // the fork kept its shared blocks
    pc.kind = KVC_POLICY_H2O;
    pc.budget_tokens = 30;
    pc.shift_positions = 0;
    OK(kvc_policy_create(&pc, &pol));
    for (uint32_t l = 0; l < layers; ++l) {
      uint64_t n = 0;
      OK(kvc_seq_layer_tokens(p.cpu, 2, l, &n));
      std::vector<float> sc(n * c.h);
      for (size_t i = 0; i < sc.size(); ++i) sc[i] = static_cast<float>((i * 7919) % 101);
      OK(kvc_seq_observe_scores(p.cpu, 2, l, sc.data(), n, 0));
      OK(kvc_seq_observe_scores(p.gpu, 2, l, sc.data(), n, 0));
    }
    const kvc_status ha = kvc_evict(p.cpu, 2, pol, da.data()), hb = kvc_evict(p.gpu, 2, pol, db.data());
    kvc_policy_destroy(pol);
    CHECK(ha == KVC_OK && hb == KVC_OK && da == db, "%s: H2O eviction: %s / %s", what, kvc_status_string(ha),
          kvc_status_string(hb));
    same_blocks(p, 2, layers, what);
    same_gather(p, 2, layers, row, what);
    if (attention) same_attention(p, c, {2, 1}, 0, 0, rng, what);
  }
  OK(kvc_pool_sync(p.gpu));
}

void test_errors() {
  const Case c{"int8 token", 8, 2, 64, KVC_LAYOUT_NHD, KVC_DTYPE_F16, KVC_DTYPE_INT8, KVC_SCALE_PER_TOKEN};
  Pools p;
  OK(make_pools(c, 1, 64, p));
  const uint64_t row = 128;
  OK(kvc_seq_create(p.gpu, 1));
  OK(kvc_seq_reserve(p.gpu, 1, 20, nullptr));
  std::mt19937 rng(7);
  std::vector<float> k = rows(rng, 20, row), v = rows(rng, 20, row);
  float *dk = to_device(k), *dv = to_device(v);
  OK(kvc_append(p.gpu, 1, 0, 0, 20, dk, dv, KVC_DTYPE_F32));
  OK(kvc_pool_sync(p.gpu));
  std::vector<float> before(20 * row), after(20 * row);
  OK(kvc_gather(p.gpu, 1, 0, 0, 20, before.data(), nullptr, KVC_DTYPE_F32, nullptr));
  // A NaN in V on the device: the append returns at once, writes nothing,
  // and the next sync reports it (then the flag is clear).
  std::vector<float> k2 = rows(rng, 20, row), v2 = v;
  v2[5 * row + 3] = NAN;
  float *dk2 = to_device(k2), *dv2 = to_device(v2);
  CHECK(kvc_append(p.gpu, 1, 0, 0, 20, dk2, dv2, KVC_DTYPE_F32) == KVC_OK, "device append with NaN: not queued");
  const kvc_status s = kvc_pool_sync(p.gpu);
  CHECK(s == KVC_ERR_NON_FINITE, "sync after a NaN append: %s", kvc_status_string(s));
  CHECK(std::strstr(kvc_last_error_message(), "1 append") != nullptr, "message: %s", kvc_last_error_message());
  CHECK(kvc_pool_sync(p.gpu) == KVC_OK, "the flag was not cleared");
  OK(kvc_gather(p.gpu, 1, 0, 0, 20, after.data(), nullptr, KVC_DTYPE_F32, nullptr));
  CHECK(before == after, "a refused append changed K");
  // Inf from host memory: the same (host inputs are checked on the device too).
  v2[5 * row + 3] = INFINITY;
  CHECK(kvc_append(p.gpu, 1, 0, 0, 20, k2.data(), v2.data(), KVC_DTYPE_F32) == KVC_OK, "host append with Inf");
  CHECK(kvc_pool_sync(p.gpu) == KVC_ERR_NON_FINITE, "Inf not reported");
  cudaFree(dk), cudaFree(dv), cudaFree(dk2), cudaFree(dv2);
  // Bad requests are refused with their own status.
  kvc_pool_config cfg;
  kvc_pool_config_init(&cfg);
  cfg.num_layers = 1, cfg.num_q_heads = 2, cfg.num_kv_heads = 2, cfg.head_dim = 64, cfg.num_blocks = 4;
  cfg.device = KVC_DEVICE_CUDA;
  kvc_pool *bad = nullptr;
  cfg.device_index = 4096;
  CHECK(kvc_pool_create(&cfg, &bad) == KVC_ERR_DEVICE_UNAVAILABLE && !bad, "device 4096: %s", kvc_last_error_message());
  cfg.device_index = 0;
  cfg.head_dim = 512;
  CHECK(kvc_pool_create(&cfg, &bad) == KVC_ERR_UNSUPPORTED && !bad, "head_dim 512");
  cfg.head_dim = 64;
  kvc_codec kc;
  kvc_codec_init(&kc);
  cfg.k_codec = &kc;
  cfg.residual_window = 16;
  CHECK(kvc_pool_create(&cfg, &bad) == KVC_ERR_UNSUPPORTED && !bad, "residual window on CUDA");
  cfg.residual_dtype = KVC_DTYPE_INT8;  // int8 residual rows: CPU pools only, as every residual
  CHECK(kvc_pool_create(&cfg, &bad) == KVC_ERR_UNSUPPORTED && !bad, "int8 residual rows on CUDA: %s",
        kvc_last_error_message());
  cfg.residual_window = 0;
  cfg.residual_sinks = 1;
  CHECK(kvc_pool_create(&cfg, &bad) == KVC_ERR_UNSUPPORTED && !bad, "int8 sink rows on CUDA: %s",
        kvc_last_error_message());
  cfg.residual_sinks = 0;
  cfg.residual_dtype = KVC_DTYPE_F16;
  cfg.block_size = 4096;  // 2 MiB blocks x 2^20: 2 TiB, far beyond the device's memory
  cfg.num_blocks = uint64_t(1) << 20;
  cfg.k_codec = nullptr;
  CHECK(kvc_pool_create(&cfg, &bad) == KVC_ERR_OUT_OF_MEMORY && !bad, "huge pool: %s", kvc_last_error_message());
  kvc_attention_params ap;
  kvc_attention_params_init(&ap);
  ap.num_q_heads = 8;
  ap.observe = KVC_OBSERVE_ACCUMULATE;
  std::vector<float> q(8 * 64), o(8 * 64);
  const uint64_t id = 1;
  CHECK(kvc_attention_decode(p.gpu, 0, &id, 1, q.data(), o.data(), nullptr, &ap) == KVC_ERR_UNSUPPORTED,
        "observation on CUDA");
  int32_t blk = 1 << 20;
  std::vector<uint8_t> host(1 << 16);
  CHECK(kvc_pool_copy_blocks(p.gpu, &blk, 1, host.data(), KVC_COPY_TO_HOST) == KVC_ERR_OUT_OF_RANGE, "block id");
  CHECK(kvc_pool_copy_blocks(p.gpu, &blk, 1, host.data(), (kvc_copy_direction)7) == KVC_ERR_INVALID_ARGUMENT,
        "direction");
  CHECK(kvc_pool_set_stream(p.cpu, reinterpret_cast<void *>(16)) == KVC_ERR_INVALID_ARGUMENT, "stream on a CPU pool");
}

// Work on an engine's stream; blocks swapped out to pinned memory and back.
void test_stream() {
  const Case c{"fp8 e4m3 token", 8, 2, 128, KVC_LAYOUT_NHD, KVC_DTYPE_F16, KVC_DTYPE_FP8_E4M3, KVC_SCALE_PER_TOKEN};
  Pools p;
  OK(make_pools(c, 1, 64, p));
  cudaStream_t st;
  cudaStreamCreate(&st);
  OK(kvc_pool_set_stream(p.gpu, st));
  const uint64_t row = 256;
  std::mt19937 rng(9);
  OK(kvc_seq_create(p.cpu, 1));
  OK(kvc_seq_create(p.gpu, 1));
  grow(p, 1, 100);
  append_both(p, 1, 1, 0, 100, row, rng, true);
  same_blocks(p, 1, 1, "stream");
  int32_t ids[16];
  size_t nb = 0;
  OK(kvc_seq_block_table(p.gpu, 1, 0, ids, 16, &nb));
  kvc_stats s;
  kvc_stats_init(&s);
  OK(kvc_pool_stats(p.gpu, &s));
  uint8_t *pinned = nullptr;
  cudaMallocHost(&pinned, nb * s.bytes_per_block);
  std::vector<uint8_t> ref(nb * s.bytes_per_block);
  OK(kvc_pool_copy_blocks(p.cpu, ids, nb, ref.data(), KVC_COPY_TO_HOST));
  OK(kvc_pool_copy_blocks(p.gpu, ids, nb, pinned, KVC_COPY_TO_HOST));  // queued
  OK(kvc_pool_sync(p.gpu));
  CHECK(std::memcmp(pinned, ref.data(), ref.size()) == 0, "swap out to pinned memory");
  // Swap in over zeroed blocks: the data comes back.
  std::vector<uint8_t> zeros(ref.size(), 0);
  OK(kvc_pool_copy_blocks(p.gpu, ids, nb, zeros.data(), KVC_COPY_FROM_HOST));
  OK(kvc_pool_copy_blocks(p.gpu, ids, nb, pinned, KVC_COPY_FROM_HOST));
  OK(kvc_pool_sync(p.gpu));
  same_blocks(p, 1, 1, "swap in");
  same_gather(p, 1, 1, row, "swap in");
  cudaFreeHost(pinned);
  OK(kvc_pool_set_stream(p.gpu, nullptr));
  cudaStreamDestroy(st);
}

// Prints the scale bytes of one token written by each pool (diagnostics).
void probe() {
  for (uint32_t hd : {64u, 8u}) {
    const Case c{"probe", 4, 2, hd, KVC_LAYOUT_NHD, KVC_DTYPE_F16, KVC_DTYPE_INT8, KVC_SCALE_PER_TOKEN, 32, 0,
                 KVC_DTYPE_F16};
    Pools p;
    OK(make_pools(c, 1, 4, p));
    const uint64_t row = 2ull * hd;
    std::vector<float> k(row, 1.0f), v(row, 0.5f);
    for (uint64_t i = 0; i < row; ++i) k[i] = 1.0f + 0.01f * static_cast<float>(i);
    for (kvc_pool *pool : {p.cpu, p.gpu}) {
      OK(kvc_seq_create(pool, 1));
      OK(kvc_seq_reserve(pool, 1, 1, nullptr));
      OK(kvc_append(pool, 1, 0, 0, 1, k.data(), v.data(), KVC_DTYPE_F32));
      OK(kvc_pool_sync(pool));
      kvc_stats st;
      kvc_stats_init(&st);
      OK(kvc_pool_stats(pool, &st));
      std::vector<uint8_t> b(st.bytes_per_block);
      int32_t id = 0;
      OK(kvc_pool_copy_blocks(pool, &id, 1, b.data(), KVC_COPY_TO_HOST));
      const size_t so = 16 * row;  // K scales follow K's codes
      std::printf("hd %u %s: K codes[0..3] %02x %02x %02x %02x; K scales", hd, pool == p.cpu ? "cpu" : "gpu", b[0], b[1],
                  b[2], b[3]);
      for (size_t i = so; i < so + 8; ++i) std::printf(" %02x", b[i]);
      std::vector<float> g(row);
      OK(kvc_gather(pool, 1, 0, 0, 1, g.data(), nullptr, KVC_DTYPE_F32, nullptr));
      std::printf("; gathered k[0] %.6f k[last] %.6f\n", g[0], g[row - 1]);
    }
  }
}


// Offload tiers with a CUDA pool (docs/tiers.md): a GPU pool's prefix blocks
// go to a disk tier (offload, and demotion when the pool reclaims them); a
// CPU pool and a second GPU pool load them back. Every gather equals the
// first GPU pool's, bit for bit.
void test_tiers() {
  const Case c{"int8 token", 8, 2, 128, KVC_LAYOUT_NHD, KVC_DTYPE_F16, KVC_DTYPE_INT8, KVC_SCALE_PER_TOKEN};
  char dir[] = "/tmp/kvc_cuda_tiers_XXXXXX";
  if (!mkdtemp(dir)) return;
  const uint32_t layers = 2;
  const uint64_t n = 16 * 4 + 1, row = uint64_t(c.h) * c.hd;
  std::vector<int32_t> tokens(n);
  for (uint64_t i = 0; i < n; ++i) tokens[i] = static_cast<int32_t>(7 + i);
  auto setup = [&](kvc_pool *pool) -> kvc_status {
    kvc_prefix_config pc;
    kvc_prefix_config_init(&pc);
    pc.seed_set = 1;
    kvc_status s = kvc_pool_enable_prefix_cache(pool, &pc);
    if (s != KVC_OK) return s;
    kvc_tier_config t;
    kvc_tier_config_init(&t, KVC_TIER_DISK);
    t.capacity_bytes = 1ull << 30;
    t.path = dir;
    return kvc_pool_add_tier(pool, &t, nullptr);
  };
  Pools a, b;
  OK(make_pools(c, layers, 16, a));
  OK(make_pools(c, layers, 16, b));
  OK(setup(a.gpu));
  OK(setup(a.cpu));
  OK(setup(b.gpu));
  std::mt19937 rng(5);
  const std::vector<float> k = rows(rng, n, row), v = rows(rng, n, row);
  OK(kvc_seq_create(a.gpu, 1));
  OK(kvc_seq_reserve(a.gpu, 1, n, nullptr));
  for (uint32_t l = 0; l < layers; ++l) OK(kvc_append(a.gpu, 1, l, 0, n, k.data(), v.data(), KVC_DTYPE_F32));
  OK(kvc_prefix_insert(a.gpu, 1, tokens.data(), n, nullptr, 0, nullptr));
  std::vector<float> want_k((n - 1) * row * layers), want_v((n - 1) * row * layers);
  for (uint32_t l = 0; l < layers; ++l)
    OK(kvc_gather(a.gpu, 1, l, 0, n - 1, want_k.data() + l * (n - 1) * row, want_v.data() + l * (n - 1) * row,
                  KVC_DTYPE_F32, nullptr));
  OK(kvc_seq_free(a.gpu, 1));
  // The pool reclaims the cached blocks: demoted from device memory.
  OK(kvc_seq_create(a.gpu, 2));
  OK(kvc_seq_reserve(a.gpu, 2, 16 / layers * 16, nullptr));
  OK(kvc_seq_free(a.gpu, 2));
  OK(kvc_pool_flush_tiers(a.gpu));
  kvc_tier_stats st;
  kvc_tier_stats_init(&st);
  OK(kvc_pool_tier_stats(a.gpu, 0, &st));
  CHECK(st.demotions == 4 && st.errors == 0, "4 blocks demoted from the GPU pool, got %llu (%llu errors: %s)",
        (unsigned long long)st.demotions, (unsigned long long)st.errors, st.last_error);
  for (kvc_pool *pool : {a.gpu, a.cpu, b.gpu}) {
    uint64_t loaded = 0;
    OK(kvc_prefix_load(pool, tokens.data(), n, nullptr, 0, &loaded));
    CHECK(loaded == 64, "loaded %llu tokens", (unsigned long long)loaded);
    kvc_prefix_result r;
    std::memset(&r, 0, sizeof r);
    r.struct_size = sizeof r;
    OK(kvc_prefix_attach(pool, 3, tokens.data(), n, nullptr, 0, 0, &r));
    CHECK(r.hit_tokens == 64, "attached %llu tokens", (unsigned long long)r.hit_tokens);
    std::vector<float> gk((n - 1) * row), gv((n - 1) * row);
    for (uint32_t l = 0; l < layers; ++l) {
      OK(kvc_gather(pool, 3, l, 0, 64, gk.data(), gv.data(), KVC_DTYPE_F32, nullptr));
      CHECK(std::memcmp(gk.data(), want_k.data() + l * (n - 1) * row, 64 * row * 4) == 0 &&
                std::memcmp(gv.data(), want_v.data() + l * (n - 1) * row, 64 * row * 4) == 0,
            "%s pool, layer %u: loaded K/V differ", pool == a.cpu ? "CPU" : "GPU", l);
    }
    OK(kvc_seq_free(pool, 3));
  }
  std::string cmd = std::string("rm -rf '") + dir + "'";
  if (std::system(cmd.c_str()) != 0) std::printf("cannot remove %s\n", dir);
}

}  // namespace

int main(int argc, char **argv) {
  const std::string mode = argc > 1 ? argv[1] : "codecs";
  int n = 0;
  const cudaError_t e = cudaGetDeviceCount(&n);
  if (e != cudaSuccess || n == 0) {
    std::printf("no CUDA device (%s): skipped\n", e != cudaSuccess ? cudaGetErrorString(e) : "0 devices");
    return 77;
  }
  if (mode == "codecs" || mode == "attention" || mode == "evict") {
    for (const Case &c : cases()) {
      const int before = g_failures;
      run_case(c, mode == "attention", mode == "evict");
      std::printf("%s %s hq%u h%u hd%u\n", g_failures == before ? "ok  " : "FAIL", c.name, c.hq, c.h, c.hd);
    }
  } else if (mode == "errors") {
    test_errors();
  } else if (mode == "probe") {
    probe();
  } else if (mode == "stream") {
    test_stream();
  } else if (mode == "tiers") {
    test_tiers();
  } else {
    std::printf("unknown mode %s\n", mode.c_str());
    return 2;
  }
  std::printf("%s: %d failure(s)\n", mode.c_str(), g_failures);
  return g_failures ? 1 : 0;
}
