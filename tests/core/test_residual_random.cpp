// codec_residual_random: random sequences of create / fork / reserve+append /
// truncate / free on pools with a residual window (KIVI per-channel keys,
// hybrid fractions), checking after every call the pool's internal
// invariants (blocks and residual blocks in exactly one state, reference
// counts equal to the number of tables holding them, token counts) and that
// every sequence reads back what it wrote, within two int8 steps; with
// attention sinks (residual_sinks), its first tokens exactly as f16 (or, with
// int8 residual rows, exactly as kvc_quantize's int8 per-token f16-scale rows).
#include <kvcache/kvcache.h>

#include <cmath>
#include <cstdio>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "api/internal.h"

#include "../whitebox.h"

namespace {

constexpr uint32_t kLayers = 2, kHeads = 2, kDim = 8, kRow = kHeads * kDim, kBlock = 8;

float value(uint64_t tag, uint64_t pos, uint32_t e, int kv) {
  return std::sin(0.131f * static_cast<float>(pos) + 0.77f * static_cast<float>(e) +
                  0.3f * static_cast<float>(tag % 7) + (kv ? 1.1f : 0.0f));
}

float f16_of(float x) {
  uint16_t h;
  float r;
  kvc_convert(&x, KVC_DTYPE_F32, &h, KVC_DTYPE_F16, 1);
  kvc_convert(&h, KVC_DTYPE_F16, &r, KVC_DTYPE_F32, 1);
  return r;
}

// A row [kHeads][kDim] as int8 residual rows store it.
void int8_row(const float *in, float *out) {
  kvc_codec c;
  kvc_codec_init(&c);
  c.dtype = KVC_DTYPE_INT8;
  c.granularity = KVC_SCALE_PER_TOKEN;
  c.scale_dtype = KVC_DTYPE_F16;
  int8_t codes[kRow];
  uint16_t scales[kHeads];
  kvc_quantize(&c, in, KVC_DTYPE_F32, kHeads, kDim, codes, scales, nullptr);
  kvc_dequantize(&c, codes, scales, nullptr, kHeads, kDim, out, KVC_DTYPE_F32);
}

void run(uint32_t seed, uint32_t window, double fraction, bool channel, uint32_t sinks = 0,
         kvc_dtype residual = KVC_DTYPE_F16) {
  std::mt19937 rng(seed);
  kvc_codec k, v;
  kvc_codec_init(&k);
  kvc_codec_init(&v);
  k.dtype = v.dtype = KVC_DTYPE_INT8;
  if (channel) {
    k.granularity = KVC_SCALE_PER_CHANNEL;
    k.group_size = 4;
    k.asymmetric = 1;
  }
  kvc_pool_config c;
  kvc_pool_config_init(&c);
  c.num_layers = kLayers;
  c.num_q_heads = c.num_kv_heads = kHeads;
  c.head_dim = kDim;
  c.block_size = kBlock;
  c.num_blocks = 60;
  c.num_residual_blocks = 40;
  c.k_codec = &k;
  c.v_codec = &v;
  c.residual_window = window;
  c.residual_fraction = fraction;
  c.residual_sinks = sinks;
  c.residual_dtype = residual;
  kvc_pool *p = nullptr;
  if (kvc_pool_create(&c, &p) != KVC_OK) {
    CHECKF(false, "create");
    return;
  }
  // Model: per sequence, the tag that wrote each position.
  std::map<uint64_t, std::vector<uint64_t>> model;
  uint64_t next_id = 1;
  std::vector<float> kb(kRow * 8), vb(kRow * 8);
  for (int op = 0; op < 600; ++op) {
    const int what = static_cast<int>(rng() % 10);
    std::vector<uint64_t> ids;
    for (auto &[id, _] : model) ids.push_back(id);
    const uint64_t pick = ids.empty() ? 0 : ids[rng() % ids.size()];
    if (what == 0 || ids.empty()) {
      CHECKF(kvc_seq_create(p, next_id) == KVC_OK, "create %llu", (unsigned long long)next_id);
      model[next_id++] = {};
    } else if (what == 1) {
      if (kvc_seq_fork(p, pick, next_id) == KVC_OK) model[next_id] = model[pick];
      ++next_id;
    } else if (what == 2) {
      const uint64_t len = model[pick].size();
      const uint64_t to = len ? rng() % (len + 1) : 0;
      const kvc_status st = kvc_seq_truncate(p, pick, to);
      CHECKF(st == KVC_OK || st == KVC_ERR_POOL_EXHAUSTED, "truncate");
      if (st == KVC_OK) model[pick].resize(to);
    } else if (what == 3 && ids.size() > 2) {
      CHECKF(kvc_seq_free(p, pick) == KVC_OK, "free");
      model.erase(pick);
    } else {
      const uint64_t n = 1 + rng() % (what == 4 ? 8 : 2);
      const uint64_t len = model[pick].size();
      const kvc_status st = kvc_seq_reserve(p, pick, n, nullptr);
      CHECKF(st == KVC_OK || st == KVC_ERR_POOL_EXHAUSTED, "reserve");
      if (st == KVC_OK) {
        const uint64_t tag = static_cast<uint64_t>(op);
        for (uint64_t t = 0; t < n; ++t)
          for (uint32_t e = 0; e < kRow; ++e) {
            kb[t * kRow + e] = value(tag, len + t, e, 0);
            vb[t * kRow + e] = value(tag, len + t, e, 1);
          }
        for (uint32_t l = 0; l < kLayers; ++l) {
          const kvc_status a = kvc_append(p, pick, l, len, n, kb.data(), vb.data(), KVC_DTYPE_F32);
          CHECKF(a == KVC_OK || a == KVC_ERR_POOL_EXHAUSTED, "append");
          if (a != KVC_OK) {  // a copy-on-write had no block: free something and retry later
            kvc_seq_truncate(p, pick, len);
            goto next;
          }
        }
        for (uint64_t t = 0; t < n; ++t) model[pick].push_back(tag);
      }
    }
  next:
    const std::string inv = kvc::api::core_pool(p).check_invariants();
    CHECKF(inv.empty(), "op %d: %s", op, inv.c_str());
    if (op % 20 == 0 || !inv.empty()) {
      for (auto &[id, tags] : model) {
        uint64_t len = 0;
        CHECKF(kvc_seq_length(p, id, &len) == KVC_OK && len == tags.size(), "length");
        if (tags.empty()) continue;
        std::vector<float> ko(tags.size() * kRow), vo(tags.size() * kRow);
        for (uint32_t l = 0; l < kLayers; ++l) {
          CHECKF(kvc_gather(p, id, l, 0, tags.size(), ko.data(), vo.data(), KVC_DTYPE_F32, nullptr) == KVC_OK, "gather");
          for (uint64_t t = 0; t < tags.size(); ++t) {
            float sk[kRow], sv[kRow], ik[kRow], iv[kRow];  // what a sink copy holds
            for (uint32_t e = 0; e < kRow; ++e) {
              ik[e] = value(tags[t], t, e, 0);
              iv[e] = value(tags[t], t, e, 1);
              sk[e] = f16_of(ik[e]);
              sv[e] = f16_of(iv[e]);
            }
            if (residual == KVC_DTYPE_INT8) {
              int8_row(ik, sk);
              int8_row(iv, sv);
            }
            for (uint32_t e = 0; e < kRow; ++e) {
              const float ek = value(tags[t], t, e, 0), ev = value(tags[t], t, e, 1);
              CHECKF(std::fabs(ko[t * kRow + e] - ek) <= 2.5f / 127.0f, "seq %llu layer %u pos %llu k %g vs %g",
                     (unsigned long long)id, l, (unsigned long long)t, ko[t * kRow + e], ek);
              CHECKF(std::fabs(vo[t * kRow + e] - ev) <= 2.5f / 127.0f, "v");
              if (t < sinks)
                CHECKF(ko[t * kRow + e] == sk[e] && vo[t * kRow + e] == sv[e],
                       "seq %llu layer %u sink %llu: %g / %g, stored as %g / %g of %g / %g",
                       (unsigned long long)id, l, (unsigned long long)t, ko[t * kRow + e],
                       vo[t * kRow + e], sk[e], sv[e], ek, ev);
            }
          }
        }
      }
    }
    if (g_kvtest_fail) break;
  }
  kvc_pool_destroy(p);
}
}  // namespace

int main() {
  for (uint32_t seed = 1; seed <= 6; ++seed) {
    run(seed, 6, 0.0, false);
    run(seed + 100, 0, 0.0, true);    // per-channel staging only
    run(seed + 200, 5, 0.0, true);    // KIVI: window + channel groups
    run(seed + 300, 2, 0.3, false);   // hybrid
    run(seed + 400, 0, 0.5, true);    // hybrid + channel
    run(seed + 500, 2, 0.0, false, 3);  // attention sinks, per-token codecs (writes into codec blocks)
    run(seed + 600, 0, 0.0, true, 5);   // attention sinks + channel groups (re-staged by truncation)
    run(seed + 700, 0, 0.0, false, 2);  // attention sinks alone (every token staged, encoded by its append)
    // Int8 residual rows (residual_dtype KVC_DTYPE_INT8).
    run(seed + 800, 6, 0.0, false, 0, KVC_DTYPE_INT8);
    run(seed + 900, 5, 0.0, true, 0, KVC_DTYPE_INT8);   // KIVI
    run(seed + 1000, 2, 0.3, false, 3, KVC_DTYPE_INT8);  // hybrid + sinks
    run(seed + 1100, 0, 0.0, true, 5, KVC_DTYPE_INT8);   // sinks + channel groups
  }
  std::printf("%d passed, %d failed\n", g_kvtest_fail ? 0 : 1, g_kvtest_fail ? 1 : 0);
  return g_kvtest_fail ? 1 : 0;
}
