// SPDX-License-Identifier: Apache-2.0
// libFuzzer target of eviction: sequences of create / append / fork / free /
// truncate, observed scores and query rows (kvc_seq_observe_scores,
// kvc_seq_observe_queries, attention with every observe mode), and kvc_evict
// with any policy configuration (every kind, Knorm and ExpectedAttention
// included, AdaKV head budgets, valid or not), kvc_seq_keep_head, on a small
// pool with or without RoPE, an int8 codec and head-wise tables
// (KVC_POOL_HEADWISE), and per-layer codecs (layer_k_codecs / layer_v_codecs:
// two block formats, or refused where documented). Checks after every call:
// - the status is a documented one;
// - a refused call changed nothing (every layer's positions as before);
// - an eviction kept, per layer and KV head, an increasing subset of the
//   positions held before, at most as many as before;
// - the pool's invariants hold (block states, reference counts, tables).
// Input: 3 bytes of pool setup, then operations of a few bytes each. Seeds:
// tests/fuzz/corpus-evict.
#include <kvcache/kvcache.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <string>
#include <vector>

#include "api/internal.h"

namespace {

constexpr uint32_t kLayers = 2, kHq = 4, kHkv = 2, kHd = 8, kBs = 4;

struct Input {
  const uint8_t *p;
  size_t n;
  bool empty() const { return n == 0; }
  uint8_t u8() {
    if (!n) return 0;
    --n;
    return *p++;
  }
  float f() {  // a finite value in [-8, 8)
    return (static_cast<float>(u8()) - 128.0f) / 16.0f;
  }
};

[[noreturn]] void die(const std::string &what) {
  std::fprintf(stderr, "fuzz_evict: %s\n", what.c_str());
  std::abort();
}

bool documented(kvc_status s) {
  switch (s) {
    case KVC_OK:
    case KVC_ERR_INVALID_ARGUMENT:
    case KVC_ERR_NULL_POINTER:
    case KVC_ERR_SEQ_NOT_FOUND:
    case KVC_ERR_SEQ_EXISTS:
    case KVC_ERR_OUT_OF_RANGE:
    case KVC_ERR_POOL_EXHAUSTED:
    case KVC_ERR_EXCEEDS_CAPACITY:
    case KVC_ERR_NON_FINITE:
    case KVC_ERR_OVERFLOW:
    case KVC_ERR_UNSUPPORTED:
    case KVC_ERR_BUFFER_TOO_SMALL:
      return true;
    default:
      return false;
  }
}

using Snapshot = std::map<uint64_t, std::vector<std::vector<int32_t>>>;

Snapshot snapshot(kvc_pool *p, const std::vector<uint64_t> &ids) {
  Snapshot s;
  for (uint64_t id : ids) {
    uint64_t len = 0;
    if (kvc_seq_length(p, id, &len) != KVC_OK) continue;
    auto &tables = s[id];  // [layer x kHkv + head]: each KV head's positions
    for (uint32_t l = 0; l < kLayers; ++l)
      for (uint32_t h = 0; h < kHkv; ++h) {
        uint64_t n = 0;
        if (kvc_seq_head_tokens(p, id, l, h, &n) != KVC_OK) die("head tokens of a live sequence");
        std::vector<int32_t> pos(n);
        if (n && kvc_gather_head(p, id, l, h, 0, n, nullptr, nullptr, KVC_DTYPE_F32, pos.data()) !=
                     KVC_OK)
          die("positions of a live sequence");
        tables.push_back(std::move(pos));
      }
  }
  return s;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  Input in{data, size};
  const uint8_t setup = in.u8();
  kvc_codec int8;
  kvc_codec_init(&int8);
  int8.dtype = KVC_DTYPE_INT8;
  int8.granularity = KVC_SCALE_PER_TOKEN;
  kvc_pool_config c;
  kvc_pool_config_init(&c);
  c.num_layers = kLayers;
  c.num_q_heads = kHq;
  c.num_kv_heads = kHkv;
  c.head_dim = kHd;
  c.block_size = kBs;
  const uint8_t blocks = in.u8();
  c.num_blocks = 24 + blocks % 64;
  c.k_dtype = c.v_dtype = KVC_DTYPE_F32;
  c.rope_style = static_cast<kvc_rope_style>(setup % 3);
  if (setup & 4) c.k_codec = c.v_codec = &int8;
  // Keys with codec outliers (int4, 1 or 2 per head) and, token-wise, key smoothing.
  kvc_codec int4o;
  kvc_codec_init(&int4o);
  int4o.dtype = KVC_DTYPE_INT4;
  int4o.granularity = KVC_SCALE_PER_TOKEN;
  int4o.full_range = 1;
  int4o.outliers = 1 + (setup >> 6) % 2;
  if (setup & 16) c.k_codec = &int4o;
  // Values as int3 codes with a codebook (the built-in Gaussian levels), token-wise.
  kvc_codec int3;
  kvc_codec_init(&int3);
  int3.dtype = KVC_DTYPE_INT3;
  int3.granularity = KVC_SCALE_PER_TOKEN;
  int3.rotation = (blocks & 128) ? KVC_ROTATION_HADAMARD : KVC_ROTATION_NONE;
  const bool codebook = (blocks & 64) && !(setup & 8);
  if (codebook) c.v_codec = &int3;
  if (setup & 8) {  // head-wise: a block table per (layer, KV head)
    c.flags |= KVC_POOL_HEADWISE;
    c.num_blocks *= kHkv;
  }
  // Per-layer codecs (mixed precision): layer 1 takes another codec of the
  // same kind (int8 <-> int4 keys, int8 -> int4 or int3 -> int2 values with
  // the same rotation, f32 -> f16 plain parts); a plain pool given a
  // quantized layer, a head-wise pool with two formats, and an unknown dtype
  // are refused with the documented status and hand out no pool (a NULL
  // values table: every layer takes v_codec).
  const uint8_t mix = in.u8();
  kvc_codec alt_k, alt_v, plain16, bad_k;
  kvc_codec_init(&bad_k);
  kvc_codec_init(&alt_k);
  kvc_codec_init(&alt_v);
  kvc_codec_init(&plain16);
  plain16.dtype = KVC_DTYPE_F16;
  plain16.granularity = KVC_SCALE_NONE;
  alt_k.granularity = alt_v.granularity = KVC_SCALE_PER_TOKEN;
  const kvc_codec *ktab[kLayers] = {nullptr, nullptr}, *vtab[kLayers] = {nullptr, nullptr};
  bool mixed_v2 = false;  // values: int3 then int2 codes, both with codebooks
  kvc_status expect = KVC_OK;
  if (mix % 4) {
    if (mix & 16) ktab[0] = c.k_codec, vtab[0] = c.v_codec;  // explicit, or NULL: the pool's
    if (c.k_codec == &int8) {
      alt_k.dtype = KVC_DTYPE_INT4;
      alt_k.full_range = 1;
      alt_k.outliers = (mix >> 5) % 3;
      ktab[1] = &alt_k;
    } else if (c.k_codec == &int4o) {
      alt_k.dtype = KVC_DTYPE_INT8;
      ktab[1] = &alt_k;
    } else if (mix & 4) {
      alt_k.dtype = KVC_DTYPE_INT8;  // quantized layer 1 in a plain pool: refused
      ktab[1] = &alt_k;
      expect = KVC_ERR_UNSUPPORTED;
    } else {
      ktab[1] = &plain16;
    }
    if (c.v_codec == &int3) {
      alt_v.dtype = KVC_DTYPE_INT2;
      alt_v.rotation = int3.rotation;
      vtab[1] = &alt_v;
      mixed_v2 = true;
    } else if (c.v_codec == &int8 && (mix & 8)) {
      alt_v.dtype = KVC_DTYPE_INT4;
      vtab[1] = &alt_v;
    }
    if ((setup & 8) && expect == KVC_OK) expect = KVC_ERR_UNSUPPORTED;  // head-wise
    if (mix % 4 == 3) {  // an unknown storage dtype in layer 1's keys
      bad_k.dtype = static_cast<kvc_dtype>(99);
      ktab[1] = &bad_k;
      expect = KVC_ERR_INVALID_ARGUMENT;
    }
    c.layer_k_codecs = ktab;
    c.layer_v_codecs = (mix & 64) && !mixed_v2 ? nullptr : vtab;  // NULL: every layer v_codec
  }
  kvc_pool *p = nullptr;
  if (expect != KVC_OK) {
    const kvc_status r = kvc_pool_create(&c, &p);
    if (r != expect || p)
      die("per-layer codecs (mix " + std::to_string(mix) + "): status " + std::to_string(r) +
          ", expected " + std::to_string(expect));
    c.layer_k_codecs = c.layer_v_codecs = nullptr;
    mixed_v2 = false;
  }
  if (kvc_pool_create(&c, &p) != KVC_OK) die(std::string("pool create: ") + kvc_last_error_message());
  if (c.layer_k_codecs) {
    kvc_stats st;
    kvc_stats_init(&st);
    if (kvc_pool_stats(p, &st) != KVC_OK || st.blocks_total != c.num_blocks)
      die("per-layer codecs: blocks_total is not num_blocks");
  }
  if ((setup & 32) && c.k_codec && !(setup & 8)) {
    std::vector<float> sc(kLayers * kHkv * kHd), off(sc.size());
    for (size_t i = 0; i < sc.size(); ++i) sc[i] = 0.5f + float(i % 3), off[i] = float(i % 5) - 2.0f;
    if (kvc_pool_set_key_smoothing(p, sc.data(), off.data(), sc.size()) != KVC_OK) die("key smoothing");
  }
  if (codebook) {  // each layer's 2^bits levels in turn (int3, or int3 then int2)
    std::vector<float> lv(mixed_v2 ? 8 + 4 : kLayers * 8);
    if (kvc_codebook_gaussian(3, kHd, lv.data()) != KVC_OK ||
        kvc_codebook_gaussian(mixed_v2 ? 2 : 3, kHd, lv.data() + 8) != KVC_OK)
      die("gaussian levels");
    if (mixed_v2 && kvc_pool_set_codebook(p, 1, lv.data(), kLayers * 8) != KVC_ERR_INVALID_ARGUMENT)
      die("per-layer codebook: a count for uniform int3 layers accepted");
    if (kvc_pool_set_codebook(p, 1, lv.data(), lv.size()) != KVC_OK) die("codebook");
  }
  const std::vector<uint64_t> ids = {1, 2, 3, 4};
  std::vector<float> buf;
  for (int op_i = 0; op_i < 48 && !in.empty(); ++op_i) {
    const uint8_t op = in.u8() % 10;
    const uint64_t id = ids[in.u8() % ids.size()];
    const uint32_t layer = in.u8() % (kLayers + 1);  // kLayers: out of range
    const Snapshot before = snapshot(p, ids);
    kvc_status r = KVC_OK;
    bool evicting = false;
    switch (op) {
      case 0:
        r = kvc_seq_create(p, id);
        break;
      case 1: {  // reserve n, append every layer
        const uint64_t n = 1 + in.u8() % 12;
        uint64_t len = 0;
        if (kvc_seq_length(p, id, &len) != KVC_OK) {
          r = kvc_seq_reserve(p, id, n, nullptr);
          break;
        }
        r = kvc_seq_reserve(p, id, n, nullptr);
        if (r != KVC_OK) break;
        buf.resize(n * kHkv * kHd);
        for (float &x : buf) x = in.f();
        for (uint32_t l = 0; l < kLayers; ++l)
          if (kvc_append(p, id, l, len, n, buf.data(), buf.data(), KVC_DTYPE_F32) != KVC_OK)
            die("append of reserved positions");
        continue;  // a change by design: no snapshot comparison
      }
      case 2: {  // query rows: valid, NaN, wrong heads or a negative position
        const uint64_t n = in.u8() % 6;
        buf.resize(n * kHq * kHd + 1);
        for (float &x : buf) x = in.f();
        std::vector<int32_t> pos(n + 1);
        for (int32_t &x : pos) x = in.u8();
        const uint8_t bad = in.u8() % 8;
        if (bad == 1 && n) buf[n / 2] = NAN;
        if (bad == 2 && n) pos[0] = -1;
        const uint32_t heads = bad == 3 ? kHq + 1 : kHq;
        r = kvc_seq_observe_queries(p, id, layer, bad == 4 ? nullptr : buf.data(),
                                    bad == 5 ? KVC_DTYPE_INT8 : KVC_DTYPE_F32, n, heads,
                                    pos.data());
        if (r == KVC_OK) continue;  // statistics changed (not visible in positions)
        break;
      }
      case 3: {  // scores: valid or negative
        uint64_t n = 0;
        kvc_seq_layer_tokens(p, id, layer % kLayers, &n);
        buf.resize(n * kHkv + 1);
        for (float &x : buf) x = std::fabs(in.f());
        if (in.u8() % 4 == 0) buf[0] = -1.0f;
        r = kvc_seq_observe_scores(p, id, layer, buf.data(), n + (in.u8() % 4 == 0), in.u8() & 1);
        if (r == KVC_OK) continue;
        break;
      }
      case 4: {  // attention with any observe mode (5: unknown)
        uint64_t n = 0;
        kvc_seq_layer_tokens(p, id, layer % kLayers, &n);
        const uint64_t nq = 1 + in.u8() % 4;
        buf.resize(2 * nq * kHq * kHd);
        for (float &x : buf) x = in.f();
        kvc_attention_params a;
        kvc_attention_params_init(&a);
        a.num_q_heads = kHq;
        a.observe = static_cast<kvc_observe>(in.u8() % 6);
        a.observe_from = in.u8() % 5;
        if (in.u8() & 1)
          r = kvc_attention_prefill(p, layer, id, buf.data(), nq, buf.data() + nq * kHq * kHd,
                                    nullptr, &a);
        else
          r = kvc_attention_decode(p, layer, &id, 1, buf.data(), buf.data() + kHq * kHd, nullptr,
                                   &a);
        if (r == KVC_OK) continue;  // scores or statistics may change
        break;
      }
      case 5: {  // evict with any policy configuration
        kvc_policy_config pc;
        kvc_policy_config_init(&pc);
        pc.kind = static_cast<kvc_policy_kind>(in.u8() % 12);  // 11: unknown
        pc.budget_tokens = in.u8() % 3 ? in.u8() % 24 : 0;
        pc.compression_ratio = in.u8() % 3 ? 0.0 : (in.u8() % 12) / 10.0;
        pc.sink_tokens = in.u8() % 6;
        pc.recent_tokens = in.u8() % 6;
        pc.future_positions = in.u8() % 4 == 0 ? 0 : 1 + in.u8() * 8;
        pc.window = 1 + in.u8() % 8;
        pc.shift_positions = (in.u8() % 4 == 0);
        pc.head_budget = static_cast<kvc_head_budget>(in.u8() % 3);  // 2: unknown
        pc.head_floor = in.u8() % 8 == 0 ? 1.5 : (in.u8() % 11) / 10.0;
        // DuoAttention gates (kind 10): as many as the pool's heads, or one too few
        std::vector<float> gates(kLayers * kHkv - (in.u8() % 5 == 0));
        for (float &x : gates) x = (in.u8() % 12) / 10.0f;  // 1.1: refused
        if (in.u8() % 3 == 0 || pc.kind == KVC_POLICY_DUO_ATTENTION) {
          pc.head_gates = gates.data();
          pc.num_head_gates = static_cast<uint32_t>(gates.size());
        }
        kvc_policy *pol = nullptr;
        r = kvc_policy_create(&pc, &pol);
        if (!documented(r)) die("policy create status " + std::to_string(r));
        if (r != KVC_OK) {
          if (pol) die("a refused policy handed out");
          continue;
        }
        r = kvc_evict(p, id, pol, nullptr);
        kvc_policy_destroy(pol);
        evicting = r == KVC_OK;
        break;
      }
      case 6:
        r = kvc_seq_fork(p, id, ids[in.u8() % ids.size()]);
        if (r == KVC_OK) continue;
        break;
      case 7:
        r = kvc_seq_free(p, id);
        if (r == KVC_OK) continue;
        break;
      case 8: {
        uint64_t len = 0;
        kvc_seq_length(p, id, &len);
        r = kvc_seq_truncate(p, id, len - std::min<uint64_t>(len, in.u8() % 6));
        if (r == KVC_OK) continue;
        break;
      }
      case 9: {  // keep_head: one head's own survivors (valid, repeated, past the end, bad head)
        const uint32_t head = in.u8() % (kHkv + 1);
        uint64_t n = 0;
        kvc_seq_head_tokens(p, id, layer % kLayers, head % kHkv, &n);
        std::vector<uint64_t> keep;
        for (uint64_t t = 0; t < n + 1; ++t)
          if (in.u8() & 1) keep.push_back(t);  // t == n: one past the end
        if (!keep.empty() && in.u8() % 4 == 0) keep.push_back(keep.back());
        r = kvc_seq_keep_head(p, id, layer, head, keep.empty() ? nullptr : keep.data(), keep.size(),
                              nullptr);
        evicting = r == KVC_OK;
        break;
      }
    }
    if (!documented(r))
      die("op " + std::to_string(op) + ": undocumented status " + std::to_string(r));
    const Snapshot after = snapshot(p, ids);
    if (evicting) {
      for (const auto &[sid, tables] : after) {
        const auto &old = before.at(sid);
        for (size_t l = 0; l < tables.size(); ++l) {
          const auto &a = tables[l], &b = old[l];
          if (sid != id && a != b) die("an eviction changed another sequence");
          if (a.size() > b.size() || !std::is_sorted(a.begin(), a.end()) ||
              std::adjacent_find(a.begin(), a.end()) != a.end() ||
              !std::includes(b.begin(), b.end(), a.begin(), a.end()))
            die("kept positions are not an increasing subset of those held");
        }
      }
    } else if (r != KVC_OK && after != before) {
      die("op " + std::to_string(op) + " failed with " + std::to_string(r) +
          " but changed the positions");
    }
    const std::string e = kvc::api::core_pool(p).check_invariants();
    if (!e.empty()) die("invariant after op " + std::to_string(op) + ": " + e);
  }
  kvc_pool_destroy(p);
  return 0;
}
