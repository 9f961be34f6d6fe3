// core_threads_*: several threads append to their own sequences while others
// fork, truncate and free at once. Run under ThreadSanitizer in CI (a TSan
// build runs the tests named core_threads_*). Checks every sequence's data
// afterwards and that no block leaks.
#include <kvcache/kvcache.h>

#include <atomic>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <thread>
#include <vector>

#include "api/internal.h"

namespace {

int g_failures = 0;
#define CHECK(cond)                                                     \
  do {                                                                  \
    if (!(cond)) {                                                      \
      std::fprintf(stderr, "%s:%d: CHECK failed: %s (%s)\n", __FILE__, __LINE__, #cond, \
                   kvc_last_error_message());                           \
      __atomic_add_fetch(&g_failures, 1, __ATOMIC_RELAXED);             \
    }                                                                   \
  } while (0)

constexpr uint32_t kLayers = 3, kHeads = 2, kDim = 8, kRow = kHeads * kDim, kBlock = 8;

float value(uint64_t seq, uint32_t layer, uint64_t pos, uint32_t e) {
  return static_cast<float>(seq % 1000) * 10000.0f + layer * 1000.0f + static_cast<float>(pos) +
         static_cast<float>(e) / 32.0f;
}

bool write_one(kvc_pool *p, uint64_t seq, uint64_t pos) {
  if (kvc_seq_reserve(p, seq, 1, nullptr) != KVC_OK) return false;
  float k[kRow], v[kRow];
  for (uint32_t l = 0; l < kLayers; ++l) {
    for (uint32_t e = 0; e < kRow; ++e) k[e] = v[e] = value(seq, l, pos, e);
    CHECK(kvc_append(p, seq, l, pos, 1, k, v, KVC_DTYPE_F32) == KVC_OK);
  }
  return true;
}

void verify(kvc_pool *p, uint64_t seq, uint64_t owner, uint64_t n) {
  std::vector<float> k(n * kRow), v(n * kRow);
  for (uint32_t l = 0; l < kLayers; ++l) {
    CHECK(kvc_gather(p, seq, l, 0, n, k.data(), v.data(), KVC_DTYPE_F32, nullptr) == KVC_OK);
    for (uint64_t t = 0; t < n; ++t)
      for (uint32_t e = 0; e < kRow; ++e) CHECK(k[t * kRow + e] == value(owner, l, t, e));
  }
}

// Writers: each thread owns sequences [base, base + 4); appends 200 tokens
// to each, forks one of them, truncates, rewrites, frees.
void writer(kvc_pool *p, uint64_t base, std::atomic<int> *ready) {
  ready->fetch_add(1);
  while (ready->load() < 4) std::this_thread::yield();
  for (uint64_t s = base; s < base + 4; ++s) CHECK(kvc_seq_create(p, s) == KVC_OK);
  for (uint64_t pos = 0; pos < 200; ++pos)
    for (uint64_t s = base; s < base + 4; ++s) CHECK(write_one(p, s, pos));
  for (uint64_t s = base; s < base + 4; ++s) verify(p, s, s, 200);
  // Fork: the child reads the parent's data; both then write on.
  CHECK(kvc_seq_fork(p, base, base + 100) == KVC_OK);
  verify(p, base + 100, base, 200);
  CHECK(kvc_seq_truncate(p, base + 100, 77) == KVC_OK);
  for (uint64_t pos = 77; pos < 120; ++pos) CHECK(write_one(p, base + 100, pos));
  verify(p, base, base, 200);
  CHECK(kvc_seq_truncate(p, base + 1, 50) == KVC_OK);
  verify(p, base + 1, base + 1, 50);
  for (uint64_t s = base; s < base + 4; ++s) CHECK(kvc_seq_free(p, s) == KVC_OK);
  CHECK(kvc_seq_free(p, base + 100) == KVC_OK);
}

// A reader that polls stats and exports page tables while the writers run.
void observer(kvc_pool *p, std::atomic<bool> *stop) {
  while (!stop->load()) {
    kvc_stats s;
    kvc_stats_init(&s);
    CHECK(kvc_pool_stats(p, &s) == KVC_OK);
    CHECK(s.blocks_free + s.blocks_cached + s.blocks_used == s.blocks_total);
    uint64_t ids[1] = {1000};
    int32_t indptr[2], idx[64], last[1];
    size_t n;
    kvc_status st = kvc_export_page_table(p, 0, ids, 1, indptr, idx, 64, last, &n);
    CHECK(st == KVC_OK || st == KVC_ERR_SEQ_NOT_FOUND || st == KVC_ERR_BUFFER_TOO_SMALL);
  }
}

// The tests' pool geometry with num_blocks blocks (f32 K and V unless set).
kvc_pool_config make_config(uint64_t num_blocks) {
  kvc_pool_config c;
  kvc_pool_config_init(&c);
  c.num_layers = kLayers;
  c.num_q_heads = kHeads * 2;
  c.num_kv_heads = kHeads;
  c.head_dim = kDim;
  c.block_size = kBlock;
  c.num_blocks = num_blocks;
  return c;
}

// Residual pool (keys int8 per channel over 8 tokens, values int8 per
// token, window 4): per sequence, one reserve per chunk, then one thread per
// layer appends the chunk at once (an append of a layer's newest positions
// ages that layer under the exclusive lock, racing the other layers'
// appends), while a reader gathers. Values read back within the codecs'
// bounds.
int residual_run() {
  kvc_pool_config c = make_config(2 * kLayers * 64);
  kvc_codec kc, vc;
  kvc_codec_init(&kc);
  kvc_codec_init(&vc);
  kc.dtype = vc.dtype = KVC_DTYPE_INT8;
  kc.granularity = KVC_SCALE_PER_CHANNEL;
  kc.group_size = 8;
  kc.asymmetric = 1;
  vc.granularity = KVC_SCALE_PER_TOKEN;
  c.k_codec = &kc;
  c.v_codec = &vc;
  c.residual_window = 4;
  kvc_pool *p = nullptr;
  if (kvc_pool_create(&c, &p) != KVC_OK) return 1;
  constexpr uint64_t kChunk = 6, kChunks = 30, kN = kChunk * kChunks;
  auto val = [](uint64_t seq, uint32_t l, uint64_t pos, uint32_t e) {
    return static_cast<float>(seq) + 0.5f * static_cast<float>(l) + 0.01f * static_cast<float>((pos * 7 + e) % 50);
  };
  std::atomic<bool> stop{false};
  std::atomic<uint64_t> written{0};  // sequence 1's positions whose appends returned
  std::thread reader([&] {
    std::vector<float> k(kN * kRow);
    while (!stop.load()) {
      const uint64_t n = written.load();  // (positions being written are not read: that race is the caller's)
      if (n > 0) CHECK(kvc_gather(p, 1, 1, 0, n, k.data(), nullptr, KVC_DTYPE_F32, nullptr) == KVC_OK);
    }
  });
  for (uint64_t seq : {1, 2}) CHECK(kvc_seq_create(p, seq) == KVC_OK);
  for (uint64_t ch = 0; ch < kChunks; ++ch)
    for (uint64_t seq : {1, 2}) {
      CHECK(kvc_seq_reserve(p, seq, kChunk, nullptr) == KVC_OK);
      std::vector<std::thread> ts;
      for (uint32_t l = 0; l < kLayers; ++l)
        ts.emplace_back([&, l, seq] {
          std::vector<float> k(kChunk * kRow);
          for (uint64_t t = 0; t < kChunk; ++t)
            for (uint32_t e = 0; e < kRow; ++e) k[t * kRow + e] = val(seq, l, ch * kChunk + t, e);
          CHECK(kvc_append(p, seq, l, ch * kChunk, kChunk, k.data(), k.data(), KVC_DTYPE_F32) == KVC_OK);
        });
      for (auto &t : ts) t.join();
      if (seq == 1) written = (ch + 1) * kChunk;
    }
  stop = true;
  reader.join();
  std::vector<float> k(kN * kRow), v(kN * kRow);
  for (uint64_t seq : {1, 2})
    for (uint32_t l = 0; l < kLayers; ++l) {
      CHECK(kvc_gather(p, seq, l, 0, kN, k.data(), v.data(), KVC_DTYPE_F32, nullptr) == KVC_OK);
      for (uint64_t t = 0; t < kN; ++t)
        for (uint32_t e = 0; e < kRow; ++e) {
          const float x = val(seq, l, t, e);  // int8 steps: at most 0.49 / 255 (keys), |x| / 127 (values)
          CHECK(std::fabs(k[t * kRow + e] - x) <= 0.5f / 255.0f + 1e-3f);
          CHECK(std::fabs(v[t * kRow + e] - x) <= std::fabs(x) / 127.0f);
        }
    }
  kvc_stats st;
  kvc_stats_init(&st);
  CHECK(kvc_pool_stats(p, &st) == KVC_OK);
  CHECK(st.residual_blocks_used <= 2 * kLayers * 3);  // aged as they went: window 4 + group 8 + a chunk
  const std::string inv = kvc::api::core_pool(p).check_invariants();
  if (!inv.empty()) {
    std::fprintf(stderr, "invariant: %s\n", inv.c_str());
    ++g_failures;
  }
  for (uint64_t seq : {1, 2}) CHECK(kvc_seq_free(p, seq) == KVC_OK);
  kvc_pool_destroy(p);
  std::printf("%d passed, %d failed\n", g_failures ? 0 : 1, g_failures ? 1 : 0);
  return g_failures ? 1 : 0;
}

}  // namespace

int main(int argc, char **argv) {
  if (argc > 1 && std::strcmp(argv[1], "residual") == 0) return residual_run();
  kvc_pool_config c = make_config(4 * 5 * kLayers * ((200 + kBlock - 1) / kBlock) + 64);
  c.k_dtype = c.v_dtype = KVC_DTYPE_F32;
  kvc_pool *p = nullptr;
  if (kvc_pool_create(&c, &p) != KVC_OK) return 1;
  std::atomic<int> ready{0};
  std::atomic<bool> stop{false};
  std::thread obs(observer, p, &stop);
  std::vector<std::thread> ts;
  for (uint64_t t = 0; t < 4; ++t) ts.emplace_back(writer, p, 1000 + t * 10, &ready);
  for (auto &t : ts) t.join();
  stop = true;
  obs.join();
  const std::string inv = kvc::api::core_pool(p).check_invariants();
  if (!inv.empty()) {
    std::fprintf(stderr, "invariant: %s\n", inv.c_str());
    ++g_failures;
  }
  kvc_stats s;
  kvc_stats_init(&s);
  kvc_pool_stats(p, &s);
  CHECK(s.blocks_used == 0 && s.num_sequences == 0);
  kvc_pool_destroy(p);
  std::printf("%d passed, %d failed\n", g_failures ? 0 : 1, g_failures ? 1 : 0);
  return g_failures ? 1 : 0;
}
