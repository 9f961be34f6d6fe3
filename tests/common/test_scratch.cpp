// core_scratch_*: per-thread scratch buffers (common/scratch.h) stay allocated
// across calls of a steady size and are released when a call that grew them
// above the keep size returns, on every thread; data written through them
// reads back. The keep size is lowered to 1 MiB here.
#include <kvcache/kvcache.h>

#include <cmath>
#include <cstdio>
#include <thread>
#include <vector>

#include "../whitebox.h"
#include "common/scratch.h"

namespace {

constexpr uint32_t kHeads = 8, kDim = 128, kRow = kHeads * kDim;  // 4 KiB of f32 per token
constexpr size_t kKeep = size_t(1) << 20;

kvc_pool *int8_pool() {
  kvc_codec c;
  kvc_codec_init(&c);  // int8 per token: appends convert through the scratch
  kvc_pool_config cfg;
  kvc_pool_config_init(&cfg);
  cfg.num_layers = 1;
  cfg.num_q_heads = cfg.num_kv_heads = kHeads;
  cfg.head_dim = kDim;
  cfg.num_blocks = 64;  // 1,024 tokens
  cfg.k_codec = &c;
  cfg.v_codec = &c;
  kvc_pool *p = nullptr;
  CHECK(kvc_pool_create(&cfg, &p) == KVC_OK);
  return p;
}

float value(uint64_t t, uint32_t e) { return std::sin(0.01f * float(t) + 0.37f * float(e)); }

// Appends tokens [from, from + n) and checks them back within int8's half step (absmax / 127 / 2 per head).
void append_and_check(kvc_pool *p, uint64_t from, uint64_t n) {
  std::vector<float> x(n * kRow), back(n * kRow);
  for (uint64_t t = 0; t < n; ++t)
    for (uint32_t e = 0; e < kRow; ++e) x[t * kRow + e] = value(from + t, e);
  CHECK(kvc_seq_reserve(p, 1, n, nullptr) == KVC_OK);
  CHECK(kvc_append(p, 1, 0, from, n, x.data(), x.data(), KVC_DTYPE_F32) == KVC_OK);
  CHECK(kvc_gather(p, 1, 0, from, n, back.data(), nullptr, KVC_DTYPE_F32, nullptr) == KVC_OK);
  float worst = 0.0f;
  for (size_t i = 0; i < x.size(); ++i) worst = std::fmax(worst, std::fabs(back[i] - x[i]));
  CHECK(worst <= 1.0f / 127.0f / 2.0f * 1.001f);
}

void run(bool on_thread) {
  CHECK(kvc::thread_scratch_bytes() == 0);  // nothing yet on this thread
  kvc_pool *p = int8_pool();
  CHECK(kvc_seq_create(p, 1) == KVC_OK);
  // 16 tokens: two 64 KiB rows of scratch (K and V in f32), below the keep size: kept.
  append_and_check(p, 0, 16);
  const size_t small = kvc::thread_scratch_bytes();
  CHECK(small >= 2 * 16 * kRow * sizeof(float) && small <= kKeep);
  append_and_check(p, 16, 16);
  CHECK(kvc::thread_scratch_bytes() == small);  // reused, not grown
  // 512 tokens: 4 MiB of scratch, released as the append returns (the gather
  // after it is small); the data is intact.
  append_and_check(p, 32, 512);
  CHECK(kvc::thread_scratch_bytes() <= kKeep);
  // kvc_quantize of 2,048 rows of 1,024 values: 8 MiB of f32 scratch for the f16 input, released.
  {
    kvc_codec c;
    kvc_codec_init(&c);
    c.dtype = KVC_DTYPE_INT4;
    c.granularity = KVC_SCALE_PER_GROUP;
    const uint64_t n = 2048;
    std::vector<uint16_t> in(n * kRow);
    std::vector<float> f(n * kRow);
    for (uint64_t i = 0; i < n * kRow; ++i) f[i] = value(i / kRow, uint32_t(i % kRow));
    CHECK(kvc_convert(f.data(), KVC_DTYPE_F32, in.data(), KVC_DTYPE_F16, n * kRow) == KVC_OK);
    kvc_quant_sizes sz;
    kvc_quant_sizes_init(&sz);
    CHECK(kvc_quantize_sizes(&c, n, kRow, &sz) == KVC_OK);
    std::vector<uint8_t> codes(sz.codes_bytes), scales(sz.scales_bytes), zeros(sz.zeros_bytes + 1);
    CHECK(kvc_quantize(&c, in.data(), KVC_DTYPE_F16, n, kRow, codes.data(), scales.data(), zeros.data()) == KVC_OK);
    CHECK(kvc::thread_scratch_bytes() <= kKeep);
    std::vector<float> out(n * kRow);
    CHECK(kvc_dequantize(&c, codes.data(), scales.data(), zeros.data(), n, kRow, out.data(), KVC_DTYPE_F32) ==
          KVC_OK);
    float worst = 0.0f;  // int4 groups of 32: half a step of 1 / 7, plus the f16 input's rounding
    for (size_t i = 0; i < out.size(); ++i) worst = std::fmax(worst, std::fabs(out[i] - f[i]));
    CHECK(worst <= 1.0f / 7.0f / 2.0f * 1.01f + 1e-3f);
  }
  // A call that fails after growing its scratch releases it too: 300
  // tokens whose last value is NaN are converted (2.4 MiB), then refused.
  {
    const uint64_t n = 300;
    std::vector<float> x(n * kRow, 0.5f);
    x.back() = NAN;
    CHECK(kvc_seq_reserve(p, 1, n, nullptr) == KVC_OK);
    CHECK(kvc_append(p, 1, 0, 544, n, x.data(), x.data(), KVC_DTYPE_F32) == KVC_ERR_NON_FINITE);
    CHECK(kvc::thread_scratch_bytes() <= kKeep);
  }
  kvc_pool_destroy(p);
  (void)on_thread;
}

}  // namespace

int main() {
  kvc::set_scratch_keep_bytes(kKeep);
  run(false);
  // Another thread: its own buffers, released the same way; its exit frees them.
  std::thread t([] { run(true); });
  t.join();
  if (g_kvtest_fail) std::fprintf(stderr, "core_scratch: %d failure(s)\n", g_kvtest_fail);
  else std::printf("core_scratch: ok\n");
  return g_kvtest_fail ? 1 : 0;
}
