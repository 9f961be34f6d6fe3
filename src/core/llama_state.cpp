// llama.cpp per-sequence state blobs to and from pool sequences.
//
// The layout (llama_context::state_seq_get_data and llama_kv_cache::state_write
// of the llama.cpp in llama-cpp-python 0.3.36, all little-endian):
//   u32 magic 0xaf143cd8 (llama.cpp's io_magic: the format's only version mark)
//   i32 seq_id (the sequence it was read from)
//   u32 n_stream
//   per stream: u32 cell_count; when cell_count > 0:
//     cell_count x { i32 pos; u32 n_seq_id; n_seq_id x i32 seq_id }
//     u32 v_trans; u32 n_layer
//     n_layer x { i32 k_type; u64 k_row_bytes; cell_count rows }
//     v_trans 0: n_layer x { i32 v_type; u64 v_row_bytes; cell_count rows }
//     v_trans 1: n_layer x { i32 v_type; u32 value_bytes; u32 row_values;
//                            row_values x (cell_count values) }
// A row is num_kv_heads x head_dim values ([head][dim]), K after RoPE.
#include "core/llama_state.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "codec/codec.h"
#include "common/convert.h"
#include "common/error.h"
#include "core/pool.h"

namespace kvc::core {
namespace {

constexpr uint32_t kMagic = 0xaf143cd8u;
constexpr uint32_t kQ8Block = 32;
constexpr uint32_t kQ8Bytes = 34;  // f16 d + 32 x int8

bool known_type(int32_t t) {
  return t == static_cast<int32_t>(LlamaType::F32) || t == static_cast<int32_t>(LlamaType::F16) ||
         t == static_cast<int32_t>(LlamaType::Q8_0);
}

bool quantized(int32_t t) {
  return t == static_cast<int32_t>(LlamaType::Q8_0);
}

// Bytes of a row of n values of type t (0: n not a multiple of the block).
uint64_t row_bytes(int32_t t, uint64_t n) {
  switch (static_cast<LlamaType>(t)) {
    case LlamaType::F32:
      return 4 * n;
    case LlamaType::F16:
      return 2 * n;
    case LlamaType::Q8_0:
      return n % kQ8Block ? 0 : n / kQ8Block * kQ8Bytes;
  }
  return 0;
}

const char *type_name(int32_t t) {
  switch (t) {
    case 0:
      return "f32";
    case 1:
      return "f16";
    case 8:
      return "q8_0";
    default:
      return nullptr;
  }
}

std::string type_text(int32_t t) {
  const char *n = type_name(t);
  return n ? std::string(n) : "ggml type " + std::to_string(t);
}

// The Hadamard block llama.cpp rotates with (0: none): K the largest power of
// two dividing the head size, V 64; only quantized types, head size % 64 == 0.
uint32_t rotation_block(bool is_k, int32_t type, uint32_t head_dim, uint32_t flags) {
  if (!(flags & kLlamaAttnRot) || !quantized(type) || head_dim % 64) return 0;
  if (!is_k) return 64;
  uint32_t b = 64;
  while (head_dim % (2 * b) == 0) b *= 2;
  return b;
}

void decode_row(int32_t type, const uint8_t *src, uint64_t n, float *out) {
  switch (static_cast<LlamaType>(type)) {
    case LlamaType::F32:
      std::memcpy(out, src, n * 4);
      return;
    case LlamaType::F16:
      for (uint64_t i = 0; i < n; ++i) {
        uint16_t h;
        std::memcpy(&h, src + 2 * i, 2);
        out[i] = f16_to_f32_scalar(h);
      }
      return;
    case LlamaType::Q8_0:
      for (uint64_t b = 0; b < n / kQ8Block; ++b) {
        const uint8_t *blk = src + b * kQ8Bytes;
        uint16_t dh;
        std::memcpy(&dh, blk, 2);
        const float d = f16_to_f32_scalar(dh);
        for (uint32_t j = 0; j < kQ8Block; ++j)
          out[b * kQ8Block + j] = d * static_cast<float>(static_cast<int8_t>(blk[2 + j]));
      }
      return;
  }
}

// As ggml's reference quantizers (quantize_row_q8_0_ref: d = amax / 127,
// q = round(x / d), half away from zero).
void encode_row(int32_t type, const float *x, uint64_t n, uint8_t *dst) {
  switch (static_cast<LlamaType>(type)) {
    case LlamaType::F32:
      std::memcpy(dst, x, n * 4);
      return;
    case LlamaType::F16:
      for (uint64_t i = 0; i < n; ++i) {
        const uint16_t h = f32_to_f16_scalar(x[i]);
        if ((h & 0x7c00u) == 0x7c00u && std::isfinite(x[i]))
          fail(Errc::NonFinite, "llama.cpp state: " + std::to_string(x[i]) +
                                    " is beyond f16's range (65504; an f32 export holds it)");
        std::memcpy(dst + 2 * i, &h, 2);
      }
      return;
    case LlamaType::Q8_0:
      for (uint64_t b = 0; b < n / kQ8Block; ++b) {
        const float *v = x + b * kQ8Block;
        float amax = 0.0f;
        for (uint32_t j = 0; j < kQ8Block; ++j) {
          if (!std::isfinite(v[j]))
            fail(Errc::NonFinite,
                 "llama.cpp state: q8_0 cannot hold NaN or Inf (an f32 or f16 "
                 "export can)");
          amax = std::max(amax, std::fabs(v[j]));
        }
        const float d = amax / 127.0f;
        const float id = d != 0.0f ? 1.0f / d : 0.0f;
        uint8_t *blk = dst + b * kQ8Bytes;
        const uint16_t dh = f32_to_f16_scalar(d);
        if ((dh & 0x7c00u) == 0x7c00u)
          fail(Errc::NonFinite, "llama.cpp state: " + std::to_string(amax) +
                                    " is beyond q8_0's range (its f16 scale; 65504 x 127)");
        std::memcpy(blk, &dh, 2);
        for (uint32_t j = 0; j < kQ8Block; ++j)
          blk[2 + j] = static_cast<uint8_t>(static_cast<int8_t>(std::lround(v[j] * id)));
      }
      return;
  }
}

class Reader {
 public:
  Reader(const uint8_t *p, size_t n) : p_(p), n_(n) {}
  template <typename T>
  T get(const char *what) {
    T v;
    take(&v, sizeof v, what);
    return v;
  }
  const uint8_t *bytes(uint64_t n, const char *what) {
    if (n > n_ - at_) short_of(what);
    const uint8_t *r = p_ + at_;
    at_ += static_cast<size_t>(n);
    return r;
  }
  size_t left() const { return n_ - at_; }

 private:
  void take(void *dst, size_t n, const char *what) { std::memcpy(dst, bytes(n, what), n); }
  [[noreturn]] void short_of(const char *what) {
    fail(Errc::Corrupt, std::string("llama.cpp state: the blob ends inside ") + what +
                            " (at byte " + std::to_string(at_) + " of " + std::to_string(n_) + ")");
  }
  const uint8_t *p_;
  size_t n_, at_ = 0;
};

struct Tensor {
  int32_t type = 0;
  const uint8_t *data = nullptr;  // cell_count rows, or transposed values
};

struct Parsed {
  uint32_t cells = 0;
  std::vector<uint32_t> order;  // order[pos] = cell index
  bool v_trans = false;
  std::vector<Tensor> k, v;
};

Parsed parse(const Pool &pool, const uint8_t *blob, size_t size) {
  const auto &cfg = pool.config();
  const uint64_t row = static_cast<uint64_t>(cfg.num_kv_heads) * cfg.head_dim;
  Reader r(blob, size);
  Parsed out;
  const uint32_t magic = r.get<uint32_t>("the magic");
  if (magic != kMagic) {
    char hex[16];
    std::snprintf(hex, sizeof hex, "%08x", magic);
    fail(Errc::Version,
         std::string("llama.cpp state: magic ") + hex +
             ", not the sequence state of the llama.cpp this library knows (af143cd8)");
  }
  const int32_t src_seq = r.get<int32_t>("the sequence id");
  if (src_seq < 0) fail(Errc::Corrupt, "llama.cpp state: sequence id " + std::to_string(src_seq));
  const uint32_t n_stream = r.get<uint32_t>("n_stream");
  if (n_stream == 0 || n_stream > 4096)
    fail(Errc::Corrupt, "llama.cpp state: n_stream " + std::to_string(n_stream) + " (1..4096)");
  bool found = false;
  for (uint32_t s = 0; s < n_stream; ++s) {
    const uint32_t cells = r.get<uint32_t>("cell_count");
    if (cells == 0) continue;
    if (found)
      fail(Errc::Unsupported,
           "llama.cpp state: several streams hold cells (one sequence's blob has one)");
    found = true;
    // Each cell is at least 12 bytes: a bound before allocating.
    if (cells > r.left() / 12)
      fail(Errc::Corrupt, "llama.cpp state: " + std::to_string(cells) +
                              " cells do not fit in the blob's remaining " +
                              std::to_string(r.left()) + " bytes");
    out.cells = cells;
    out.order.assign(cells, UINT32_MAX);
    for (uint32_t i = 0; i < cells; ++i) {
      const int32_t pos = r.get<int32_t>("a cell's position");
      const uint32_t n_seq = r.get<uint32_t>("a cell's sequence count");
      if (n_seq != 1)
        fail(Errc::Corrupt, "llama.cpp state: cell " + std::to_string(i) + " belongs to " +
                                std::to_string(n_seq) +
                                " sequences (a sequence's blob has one per cell)");
      const int32_t seq = r.get<int32_t>("a cell's sequence id");
      if (seq < 0)
        fail(Errc::Corrupt,
             "llama.cpp state: cell " + std::to_string(i) + " of sequence " + std::to_string(seq));
      if (pos < 0 || static_cast<uint32_t>(pos) >= cells || out.order[pos] != UINT32_MAX)
        fail(Errc::Corrupt, "llama.cpp state: cell " + std::to_string(i) + " at position " +
                                std::to_string(pos) + ": the positions must be 0.." +
                                std::to_string(cells - 1) + ", each once");
      out.order[pos] = i;
    }
    const uint32_t v_trans = r.get<uint32_t>("v_trans");
    if (v_trans > 1)
      fail(Errc::Corrupt, "llama.cpp state: v_trans " + std::to_string(v_trans) + " (0 or 1)");
    out.v_trans = v_trans == 1;
    const uint32_t n_layer = r.get<uint32_t>("n_layer");
    if (n_layer != cfg.num_layers)
      fail(Errc::Incompatible, "llama.cpp state: " + std::to_string(n_layer) +
                                   " layers, the pool has " + std::to_string(cfg.num_layers));
    auto rows = [&](bool is_k, uint32_t layer) {
      const char *kv = is_k ? "K" : "V";
      Tensor t;
      t.type = r.get<int32_t>(is_k ? "a K type" : "a V type");
      if (!known_type(t.type))
        fail(Errc::Unsupported, std::string("llama.cpp state: layer ") + std::to_string(layer) +
                                    " " + kv + " is " + type_text(t.type) +
                                    " (f32, f16 and q8_0 are imported)");
      const uint64_t rb = r.get<uint64_t>("a row size");
      const uint64_t want = row_bytes(t.type, row);
      if (want == 0 || rb != want)
        fail(Errc::Incompatible, std::string("llama.cpp state: layer ") + std::to_string(layer) +
                                     " " + kv + " rows of " + std::to_string(rb) +
                                     " bytes; the pool's rows (" + std::to_string(row) + " " +
                                     type_text(t.type) + " values) take " + std::to_string(want));
      if (rb > r.left() / cells) r.bytes(r.left() + 1, "the K / V rows");
      t.data = r.bytes(rb * cells, "the K / V rows");
      return t;
    };
    for (uint32_t l = 0; l < n_layer; ++l) out.k.push_back(rows(true, l));
    for (uint32_t l = 0; l < n_layer; ++l) {
      if (!out.v_trans) {
        out.v.push_back(rows(false, l));
        continue;
      }
      Tensor t;
      t.type = r.get<int32_t>("a V type");
      if (t.type != static_cast<int32_t>(LlamaType::F32) &&
          t.type != static_cast<int32_t>(LlamaType::F16))
        fail(known_type(t.type) ? Errc::Corrupt : Errc::Unsupported,
             "llama.cpp state: layer " + std::to_string(l) + " transposed V is " +
                 type_text(t.type) + " (f32 or f16)");
      const uint32_t el = r.get<uint32_t>("V's value size");
      const uint32_t n_embd = r.get<uint32_t>("V's row values");
      if (el != row_bytes(t.type, 1) || n_embd != row)
        fail(Errc::Incompatible, "llama.cpp state: layer " + std::to_string(l) +
                                     " transposed V of " + std::to_string(n_embd) + " values of " +
                                     std::to_string(el) + " bytes; the pool's rows are " +
                                     std::to_string(row) + " values");
      const uint64_t per = static_cast<uint64_t>(el) * cells;
      if (per > r.left() / std::max<uint64_t>(row, 1)) r.bytes(r.left() + 1, "the V values");
      t.data = r.bytes(per * row, "the V values");
      out.v.push_back(t);
    }
  }
  if (r.left() != 0)
    fail(Errc::Corrupt, "llama.cpp state: " + std::to_string(r.left()) +
                            " bytes after the last layer (not a llama_kv_cache sequence blob)");
  return out;
}

}  // namespace

uint64_t llama_import(Pool &pool, uint64_t id, const uint8_t *blob, size_t size, uint32_t flags) {
  const auto &cfg = pool.config();
  if (flags & ~kLlamaAttnRot)
    fail(Errc::InvalidArgument,
         "flags " + std::to_string(flags) + ": KVC_LLAMA_ATTN_ROT is the import's only flag");
  if (cfg.device != Device::CPU)
    fail(Errc::Unsupported, "llama.cpp state: CUDA pools do not import blobs (a CPU pool does)");
  if (cfg.headwise_heads)
    fail(Errc::Unsupported,
         "llama.cpp state: a head-wise pool (KVC_POOL_HEADWISE) does not import blobs (llama.cpp "
         "keeps every KV head of a token together; import into a token-wise pool)");
  const Parsed b = parse(pool, blob, size);  // every blob check before anything changes
  const uint64_t row = static_cast<uint64_t>(cfg.num_kv_heads) * cfg.head_dim;
  pool.seq_create(id);
  try {
    if (b.cells == 0) return 0;
    // In chunks of block_size tokens, as an engine's appends would come (a pool with a small
    // residual arena takes the tokens as they age out of it).
    const uint32_t chunk = std::max<uint32_t>(cfg.block_size, 1);
    std::vector<float> k(row * chunk), v(row * chunk);
    for (uint32_t p0 = 0; p0 < b.cells; p0 += chunk) {
      const uint32_t m = std::min(chunk, b.cells - p0);
      pool.seq_reserve(id, m, nullptr);
      for (uint32_t l = 0; l < cfg.num_layers; ++l) {
        const Tensor &kt = b.k[l], &vt = b.v[l];
        const uint64_t krb = row_bytes(kt.type, row);
        const uint32_t krot = rotation_block(true, kt.type, cfg.head_dim, flags);
        const uint32_t vrot = rotation_block(false, vt.type, cfg.head_dim, flags);
        for (uint32_t i = 0; i < m; ++i) {
          const uint32_t c = b.order[p0 + i];
          float *kr = k.data() + i * row;
          decode_row(kt.type, kt.data + c * krb, row, kr);
          if (krot) codec::hadamard(kr, row, krot);
          float *vr = v.data() + i * row;
          if (!b.v_trans) {
            decode_row(vt.type, vt.data + c * row_bytes(vt.type, row), row, vr);
          } else {
            const uint64_t el = row_bytes(vt.type, 1);
            for (uint64_t j = 0; j < row; ++j)
              decode_row(vt.type, vt.data + (j * b.cells + c) * el, 1, vr + j);
          }
          if (vrot) codec::hadamard(vr, row, vrot);
        }
        pool.append(id, l, p0, m, k.data(), v.data(), DType::F32);
      }
    }
  } catch (...) {
    pool.seq_free(id);
    throw;
  }
  return b.cells;
}

size_t llama_export(const Pool &pool, uint64_t id, int32_t llama_seq_id, int32_t k_type,
                    int32_t v_type, uint32_t flags, uint8_t *buf, size_t capacity) {
  const auto &cfg = pool.config();
  if (cfg.headwise_heads)
    fail(Errc::Unsupported,
         "llama.cpp state: a head-wise pool (KVC_POOL_HEADWISE) does not export blobs (llama.cpp "
         "keeps every KV head of a token together)");
  if (flags & ~(kLlamaAttnRot | kLlamaVTrans))
    fail(Errc::InvalidArgument, "flags " + std::to_string(flags) +
                                    ": KVC_LLAMA_ATTN_ROT and KVC_LLAMA_V_TRANS are the export's");
  if (!known_type(k_type) || !known_type(v_type))
    fail(Errc::InvalidArgument, "k_type " + type_text(k_type) + ", v_type " + type_text(v_type) +
                                    ": KVC_LLAMA_F32, KVC_LLAMA_F16 or KVC_LLAMA_Q8_0");
  if (llama_seq_id < 0)
    fail(Errc::InvalidArgument,
         "llama_seq_id " + std::to_string(llama_seq_id) + ": a llama.cpp sequence id is >= 0");
  const bool v_trans = flags & kLlamaVTrans;
  if (v_trans && quantized(v_type))
    fail(Errc::InvalidArgument, "KVC_LLAMA_V_TRANS: llama.cpp transposes f32 and f16 V only");
  if (cfg.device != Device::CPU)
    fail(Errc::Unsupported, "llama.cpp state: CUDA pools do not export blobs (a CPU pool does)");
  const uint64_t row = static_cast<uint64_t>(cfg.num_kv_heads) * cfg.head_dim;
  const uint64_t krb = row_bytes(k_type, row), vrb = row_bytes(v_type, row);
  if (krb == 0 || vrb == 0)
    fail(Errc::InvalidArgument, "q8_0 needs rows (num_kv_heads x head_dim = " +
                                    std::to_string(row) + ") in blocks of 32 values");
  const uint64_t n = pool.seq_layer_tokens(id, 0);
  std::vector<int32_t> pos0(n), pos(n);
  if (n) pool.gather(id, 0, 0, n, nullptr, nullptr, DType::F32, pos0.data());
  for (uint32_t l = 1; l < cfg.num_layers; ++l) {
    if (pool.seq_layer_tokens(id, l) != n)
      fail(Errc::Unsupported, "llama.cpp state: layer " + std::to_string(l) + " holds " +
                                  std::to_string(pool.seq_layer_tokens(id, l)) +
                                  " tokens, layer 0 " + std::to_string(n) +
                                  " (llama.cpp cells are the same in every layer)");
    if (n) pool.gather(id, l, 0, n, nullptr, nullptr, DType::F32, pos.data());
    if (pos != pos0)
      fail(Errc::Unsupported, "llama.cpp state: layer " + std::to_string(l) +
                                  " holds other positions than layer 0 (per-layer eviction)");
  }
  if (n > UINT32_MAX) fail(Errc::Overflow, "llama.cpp state: more than 2^32 - 1 cells");
  // The size: magic, sequence id, header, cells, then per layer K and V.
  uint64_t total = 4 + 4 + 4 + 4;
  if (n) {
    total += n * 12 + 8;
    const uint64_t vhead = v_trans ? 4 + 4 + 4 : 4 + 8;
    const uint64_t per_layer = 12 + n * krb + vhead + n * vrb;
    if (per_layer > (UINT64_MAX - total) / std::max<uint32_t>(cfg.num_layers, 1))
      fail(Errc::Overflow, "llama.cpp state: the blob's size overflows");
    total += per_layer * cfg.num_layers;
  }
  if (total > SIZE_MAX) fail(Errc::Overflow, "llama.cpp state: the blob's size overflows");
  if (!buf || capacity < total) return static_cast<size_t>(total);

  uint8_t *w = buf;
  auto put = [&](const void *p, size_t bytes) {
    std::memcpy(w, p, bytes);
    w += bytes;
  };
  const uint32_t one = 1, cells = static_cast<uint32_t>(n);
  put(&kMagic, 4);
  put(&llama_seq_id, 4);
  put(&one, 4);  // n_stream
  put(&cells, 4);
  if (n) {
    for (uint64_t i = 0; i < n; ++i) {
      put(&pos0[i], 4);
      put(&one, 4);
      put(&llama_seq_id, 4);
    }
    const uint32_t vt = v_trans ? 1 : 0, layers = cfg.num_layers;
    put(&vt, 4);
    put(&layers, 4);
    std::vector<float> k(row * n), v(row * n);
    std::vector<uint8_t> vbytes;
    // K of every layer, then V of every layer: gather each layer once per pass.
    for (int pass = 0; pass < 2; ++pass) {
      const bool is_k = pass == 0;
      const int32_t type = is_k ? k_type : v_type;
      const uint32_t rot = rotation_block(is_k, type, cfg.head_dim, flags);
      for (uint32_t l = 0; l < cfg.num_layers; ++l) {
        float *x = is_k ? k.data() : v.data();
        pool.gather(id, l, 0, n, is_k ? x : nullptr, is_k ? nullptr : x, DType::F32, nullptr);
        if (rot)
          for (uint64_t i = 0; i < n; ++i) codec::hadamard(x + i * row, row, rot);
        put(&type, 4);
        if (is_k || !v_trans) {
          const uint64_t rb = is_k ? krb : vrb;
          put(&rb, 8);
          for (uint64_t i = 0; i < n; ++i) {
            encode_row(type, x + i * row, row, w);
            w += rb;
          }
        } else {
          const uint32_t el = static_cast<uint32_t>(row_bytes(type, 1)),
                         n_embd = static_cast<uint32_t>(row);
          put(&el, 4);
          put(&n_embd, 4);
          for (uint64_t j = 0; j < row; ++j)
            for (uint64_t i = 0; i < n; ++i) {
              encode_row(type, x + i * row + j, 1, w);
              w += el;
            }
        }
      }
    }
  }
  if (static_cast<uint64_t>(w - buf) != total)
    fail(Errc::Internal, "llama.cpp state: wrote " + std::to_string(w - buf) + " bytes of " +
                             std::to_string(total));
  return static_cast<size_t>(total);
}

}  // namespace kvc::core
