// SPDX-License-Identifier: Apache-2.0
// libFuzzer target of the llama.cpp sequence state import / export
// (kvc_seq_import_llama / kvc_seq_export_llama, docs/engines.md) on a pool of
// 2 layers and one KV head of 64:
// - any input either imports (the sequence then holds the cells it reported)
//   or is refused with a status and leaves no sequence behind;
// - an imported sequence exports under every type and flag combination the
//   export accepts, and each export imports again with the same token count;
//   an f32 export re-imported into the f32 pool exports byte-identically;
// - the pool's other sequence is never touched.
// Input: 1 byte of set-up (pool dtype: f32, f16 or int8 per token; import
// flags), then the blob. Seeds: tests/fuzz/corpus-llama (exports of small
// sequences: f32, f16, q8_0, V transposed, rotated).
#include <kvcache/kvcache.h>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

namespace {

[[noreturn]] void die(const char *what) {
  std::fprintf(stderr, "fuzz_llama: %s (%s)\n", what, kvc_last_error_message());
  std::abort();
}

kvc_pool *make(int kind) {
  kvc_pool_config c;
  kvc_pool_config_init(&c);
  c.num_layers = 2;
  c.num_q_heads = 2;
  c.num_kv_heads = 1;
  c.head_dim = 64;
  c.block_size = 16;
  c.num_blocks = 64;
  kvc_codec cod;
  kvc_codec_init(&cod);
  if (kind == 2) {
    cod.dtype = KVC_DTYPE_INT8;
    c.k_codec = c.v_codec = &cod;
  } else {
    c.k_dtype = c.v_dtype = kind == 1 ? KVC_DTYPE_F16 : KVC_DTYPE_F32;
  }
  kvc_pool *p = nullptr;
  if (kvc_pool_create(&c, &p) != KVC_OK) die("pool");
  return p;
}

uint64_t length(kvc_pool *p, uint64_t id) {
  uint64_t n = 0;
  if (kvc_seq_length(p, id, &n) != KVC_OK) die("length");
  return n;
}

bool exists(kvc_pool *p, uint64_t id) {
  uint64_t n = 0;
  return kvc_seq_length(p, id, &n) == KVC_OK;
}

// The export; empty where f16 or q8_0 was asked for values it cannot hold (NaN, Inf, too large:
// an f32 blob may carry them into an f32 pool).
std::vector<uint8_t> export_of(kvc_pool *p, uint64_t id, kvc_llama_type k, kvc_llama_type v,
                               uint32_t flags) {
  size_t size = 0;
  const kvc_status st = kvc_seq_export_llama(p, id, 0, k, v, flags, nullptr, 0, &size);
  if (st != KVC_ERR_BUFFER_TOO_SMALL) die("export size");
  std::vector<uint8_t> b(size);
  const kvc_status w = kvc_seq_export_llama(p, id, 0, k, v, flags, b.data(), b.size(), &size);
  if (w == KVC_ERR_NON_FINITE && (k != KVC_LLAMA_F32 || v != KVC_LLAMA_F32)) return {};
  if (w != KVC_OK || size != b.size()) die("export");
  return b;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (size < 1) return 0;
  const int kind = data[0] % 3;
  const uint32_t flags = (data[0] >> 2) & 1 ? KVC_LLAMA_ATTN_ROT : 0;
  kvc_pool *p = make(kind);
  // A bystander sequence of 3 tokens.
  if (kvc_seq_create(p, 1) != KVC_OK || kvc_seq_reserve(p, 1, 3, nullptr) != KVC_OK) die("seq 1");
  std::vector<float> k(3 * 64), v(3 * 64);
  for (size_t i = 0; i < k.size(); ++i) {
    k[i] = static_cast<float>(i % 13) - 6.0f;
    v[i] = static_cast<float>(i % 7) * 0.5f;
  }
  for (uint32_t l = 0; l < 2; ++l)
    if (kvc_append(p, 1, l, 0, 3, k.data(), v.data(), KVC_DTYPE_F32) != KVC_OK) die("append");
  std::vector<float> before(3 * 64 * 2);
  if (kvc_gather(p, 1, 1, 0, 3, before.data(), before.data() + 3 * 64, KVC_DTYPE_F32, nullptr) !=
      KVC_OK)
    die("gather");

  uint64_t n = 77;
  const kvc_status st = kvc_seq_import_llama(p, 2, data + 1, size - 1, flags, &n);
  if (st != KVC_OK) {
    if (exists(p, 2)) die("a refused blob left its sequence");
    if (n != 0) die("a refused import reported tokens");
  } else {
    if (length(p, 2) != n) die("imported length");
    static const kvc_llama_type types[] = {KVC_LLAMA_F32, KVC_LLAMA_F16, KVC_LLAMA_Q8_0};
    uint64_t next = 3;
    for (kvc_llama_type kt : types)
      for (kvc_llama_type vt : types)
        for (uint32_t f = 0; f < 4; ++f) {
          if ((f & KVC_LLAMA_V_TRANS) && vt == KVC_LLAMA_Q8_0) continue;
          const std::vector<uint8_t> b = export_of(p, 2, kt, vt, f);
          if (b.empty()) continue;
          uint64_t m = 0;
          const kvc_status again =
              kvc_seq_import_llama(p, next, b.data(), b.size(), f & KVC_LLAMA_ATTN_ROT, &m);
          // A quantized pool may refuse values its codec cannot hold (an f16 export of large
          // values holds Inf); every other pool takes it.
          if (again != KVC_OK && again != KVC_ERR_NON_FINITE)
            die("an export does not import again");
          if (again == KVC_OK) {
            if (m != n) die("re-imported token count");
            if (kind == 0 && kt == KVC_LLAMA_F32 && vt == KVC_LLAMA_F32 && f == 0 &&
                export_of(p, next, kt, vt, f) != b)
              die("an f32 export is not byte-identical after a round trip");
            if (kvc_seq_free(p, next) != KVC_OK) die("free");
          }
          ++next;
        }
  }
  std::vector<float> after(before.size());
  if (kvc_gather(p, 1, 1, 0, 3, after.data(), after.data() + 3 * 64, KVC_DTYPE_F32, nullptr) !=
          KVC_OK ||
      std::memcmp(before.data(), after.data(), before.size() * sizeof(float)) != 0)
    die("the bystander sequence changed");
  kvc_pool_destroy(p);
  return 0;
}
