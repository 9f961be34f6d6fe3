// core_state_concurrent_*: kvc_seq_save while other threads append to the
// same sequence. A record is the sequence at one instant: every append call
// is in it whole or not at all, never half (a torn record). Runs under
// ThreadSanitizer in CI (the TSan stage runs core_state_concurrent_*).
#include <kvcache/kvcache.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include <unistd.h>

namespace {

constexpr uint32_t kLayers = 4, kHeads = 2, kDim = 16, kRow = kHeads * kDim, kTokens = 64;
int g_failures = 0;

#define CHECK(cond)                                                                     \
  do {                                                                                  \
    if (!(cond)) {                                                                      \
      std::fprintf(stderr, "%s:%d: CHECK failed: %s (%s)\n", __FILE__, __LINE__, #cond, \
                   kvc_last_error_message());                                           \
      __atomic_add_fetch(&g_failures, 1, __ATOMIC_RELAXED);                             \
    }                                                                                   \
  } while (0)

float value(uint32_t version, uint32_t layer, uint32_t pos, uint32_t e) {
  return static_cast<float>(version) * 1000.0f + static_cast<float>(layer) * 100.0f +
         static_cast<float>(pos) + static_cast<float>(e) / 64.0f;
}

kvc_pool *make_pool(bool file) {
  kvc_pool_config c;
  kvc_pool_config_init(&c);
  c.num_layers = kLayers;
  c.num_q_heads = kHeads;
  c.num_kv_heads = kHeads;
  c.head_dim = kDim;
  c.block_size = 16;
  c.num_blocks = 64;
  c.k_dtype = c.v_dtype = KVC_DTYPE_F32;
  (void)file;
  kvc_pool *p = nullptr;
  CHECK(kvc_pool_create(&c, &p) == KVC_OK);
  return p;
}

// Writers rewrite every layer's 64 tokens in one append each, with a new
// version number each round (one writer thread per pair of layers, so
// appends of one sequence run at once). A saver saves the sequence over and
// over and restores each record into a second pool: every layer of a record
// must hold one version in all 64 tokens.
void run(bool to_file) {
  kvc_pool *p = make_pool(false), *q = make_pool(false);
  CHECK(kvc_seq_create(p, 1) == KVC_OK);
  CHECK(kvc_seq_reserve(p, 1, kTokens, nullptr) == KVC_OK);
  std::vector<float> k(kTokens * kRow), v(kTokens * kRow);
  for (uint32_t l = 0; l < kLayers; ++l) {
    for (uint32_t t = 0; t < kTokens; ++t)
      for (uint32_t e = 0; e < kRow; ++e) k[t * kRow + e] = v[t * kRow + e] = value(0, l, t, e);
    CHECK(kvc_append(p, 1, l, 0, kTokens, k.data(), v.data(), KVC_DTYPE_F32) == KVC_OK);
  }
  std::atomic<bool> stop{false};
  std::vector<std::thread> writers;
  for (uint32_t w = 0; w < 2; ++w)
    writers.emplace_back([&, w] {
      std::vector<float> kk(kTokens * kRow), vv(kTokens * kRow);
      for (uint32_t version = 1; !stop.load(std::memory_order_relaxed); ++version)
        for (uint32_t l = w; l < kLayers; l += 2) {
          for (uint32_t t = 0; t < kTokens; ++t)
            for (uint32_t e = 0; e < kRow; ++e)
              kk[t * kRow + e] = vv[t * kRow + e] = value(version % 1000, l, t, e);
          CHECK(kvc_append(p, 1, l, 0, kTokens, kk.data(), vv.data(), KVC_DTYPE_F32) == KVC_OK);
        }
    });
  const std::string path =
      "core_state_concurrent_" + std::to_string(static_cast<long>(getpid())) + ".rec";
  std::vector<uint8_t> rec;
  uint64_t id = 100;
  for (int round = 0; round < 60; ++round, ++id) {
    if (to_file) {
      CHECK(kvc_seq_save_file(p, 1, path.c_str()) == KVC_OK);
      CHECK(kvc_seq_restore_file(q, id, path.c_str()) == KVC_OK);
    } else {
      size_t size = 0;
      CHECK(kvc_seq_save(p, 1, nullptr, 0, &size) == KVC_ERR_BUFFER_TOO_SMALL);
      rec.assign(size, 0);
      CHECK(kvc_seq_save(p, 1, rec.data(), rec.size(), &size) == KVC_OK);
      CHECK(kvc_seq_restore(q, id, rec.data(), size) == KVC_OK);
    }
    std::vector<float> gk(kTokens * kRow), gv(kTokens * kRow);
    for (uint32_t l = 0; l < kLayers; ++l) {
      CHECK(kvc_gather(q, id, l, 0, kTokens, gk.data(), gv.data(), KVC_DTYPE_F32, nullptr) ==
            KVC_OK);
      // The version of token 0 must be that of every token (one append).
      const uint32_t version = static_cast<uint32_t>((gk[0] - l * 100.0f) / 1000.0f + 0.5f);
      int torn = 0;
      for (uint32_t t = 0; t < kTokens; ++t)
        for (uint32_t e = 0; e < kRow; ++e)
          torn += gk[t * kRow + e] != value(version, l, t, e) ||
                  gv[t * kRow + e] != value(version, l, t, e);
      if (torn)
        std::fprintf(stderr, "round %d layer %u: %d values torn from version %u\n", round, l, torn,
                     version);
      CHECK(torn == 0);
    }
    CHECK(kvc_seq_free(q, id) == KVC_OK);
  }
  stop.store(true);
  for (auto &t : writers) t.join();
  if (to_file) std::remove(path.c_str());
  kvc_pool_destroy(q);
  kvc_pool_destroy(p);
}

}  // namespace

int main(int argc, char **argv) {
  const std::string which = argc > 1 ? argv[1] : "";
  if (which == "save_buffer")
    run(false);
  else if (which == "save_file")
    run(true);
  else {
    std::fprintf(stderr, "usage: test_state_concurrent save_buffer|save_file\n");
    return 2;
  }
  if (g_failures)
    std::fprintf(stderr, "%d checks failed\n", g_failures);
  else
    std::printf("ok\n");
  return g_failures ? 1 : 0;
}
