// Attention over a cached sequence: decode (one or more query rows per
// sequence) and causal prefill, with grouped-query heads and online softmax
// (FlashAttention's running max and sum, FlashDecoding's split-K with a
// log-sum-exp merge; no score matrix), an optional log-sum-exp output and
// optional observation of each cached token's attention probability for the
// eviction policies (H2O, TOVA, SnapKV).
//
// The K/V come from a TileSource a tile at a time (a pool block, dequantized
// by the caller's codec path), so this module knows no pool: core/ provides
// the source over its blocks.
#pragma once
#include <cstdint>
#include <mutex>
#include <vector>

namespace kvc::attention {

// How the K (or the V) of a tile is stored, for the fused decode kernels
// that read it in place (no f32 copy): value = (code - offset) * scale + zero
// for integer codes (scale and zero per token and KV head, or per group of
// values of a head), the value itself for float storage.
// FP8E4M3 / FP8E5M2: OCP fp8 codes (value = the code's float x scale; no
// zero point).
enum class RawType : uint8_t { None, F32, F16, BF16, Int8, UInt8, Int4, FP8E4M3, FP8E5M2 };
struct RawPart {
  RawType type = RawType::None;
  const uint8_t *data = nullptr;  // token 0 of the tile, KV head 0
  uint64_t token_stride = 0;      // bytes between tokens
  uint64_t head_stride = 0;       // bytes between KV heads
  // Integer codes: int4 packs element j of a head in bits 4(j%2).. of byte j/2.
  int32_t offset = 0;
  const uint8_t *scale = nullptr;   // token 0, KV head 0 (f32 or f16, little-endian)
  const uint8_t *zero = nullptr;    // null: symmetric (zero 0); else as scale
  uint64_t scale_token_stride = 0;  // bytes between tokens' scales
  uint64_t scale_head_stride = 0;   // bytes between KV heads' scales
  bool scale_f16 = false;
  // Integer codes with per-group scales (llama.cpp's q4_0 / q8_0 blocks,
  // HQQ's and transformers' group-wise caches): the values of each scale, a
  // multiple of 16 dividing head_dim, the head's groups' scales (and zeros)
  // adjacent, scale_head_stride = (head_dim / group) x their bytes. 0: one
  // scale per token and KV head.
  uint32_t group = 0;
  // Integer codes with per-channel scales (KIVI's keys): one scale (and
  // zero) per dimension for every token of the tile, head h's head_dim of
  // them at scale + h x scale_head_stride (= head_dim x their bytes);
  // scale_token_stride 0.
  bool channel = false;
  // Codes of Hadamard-rotated rows (QuaRot's rotation; codec::hadamard, in
  // blocks of this many values, a power of two dividing head_dim): the
  // stored values are H x. 0: none.
  uint32_t rotation = 0;
};
struct RawTile {
  RawPart k, v;
};

// K and V of one sequence's layer, read a tile at a time. Reads may run on
// several threads at once (attend_threads).
class TileSource {
 public:
  virtual ~TileSource() = default;
  // Tokens [t0, t0 + c) with 1 <= c <= max_count (the source picks c, e.g. up
  // to the end of a block): K into k and V into v, each [c][kv_heads][head_dim]
  // f32. Returns c.
  virtual uint64_t read(uint64_t t0, uint64_t max_count, float *k, float *v) const = 0;
  // The same tokens as read() would return (the same c), described where they
  // are stored, when the source can (0 otherwise: read() is used). A source
  // returns 0 where read() would change the stored values (sinks' exact
  // copies, unwritten rows, pre-RoPE keys), except for Hadamard rotations,
  // which it describes (RawPart::rotation).
  virtual uint64_t raw(uint64_t /*t0*/, uint64_t /*max_count*/, RawTile & /*rt*/) const {
    return 0;
  }
};

struct Shape {
  uint64_t q_heads = 0;  // query heads; q_heads / kv_heads query heads share a KV head (GQA)
  uint64_t kv_heads = 0;
  uint64_t head_dim = 0;
  uint64_t max_tile = 0;  // the most tokens one read returns (a block)
  // One-row decode: the query quantized to int8 for integer keys where the
  // CPU has AVX-512 VNNI (KVC_QUERY_INT8; attention/fused.h).
  bool query_int8 = false;
  // With query_int8: also the weighted sum over symmetric int8 or int4
  // value codes in integers (KVC_QUERY_INT8_VALUES; attention/fused.h).
  bool int_values = false;
};

// One sequence of n tokens: n_q query rows q [n_q][q_heads][head_dim] (f32,
// already scaled) -> out [n_q][q_heads][head_dim] (f32) and lse [n_q][q_heads].
// Decode (prefill false): every row sees all n tokens. Prefill: row i sees
// tokens [0, n - n_q + i] (causal). Rows that see nothing give zeros and a
// log-sum-exp of -inf.
// obs_scores: null, or [n][kv_heads], to which the attention probability of
// every row i >= observe_from is added (summed over the query heads of each
// KV head), under *obs_mu when given; with obs_max, each entry is raised to
// the largest such probability instead (over rows and the KV head's query
// heads).
void attend(const Shape &sh, const TileSource &src, uint64_t n, const float *q, uint64_t n_q,
            bool prefill, float *out, float *lse, float *obs_scores, uint64_t observe_from,
            std::mutex *obs_mu, bool obs_max = false);

// attend() without observation over up to `threads` threads (the caller's
// included): blocks of 32 query rows are independent, so the output is the
// same bytes as attend()'s on one thread. For prefill chunks and multi-row
// decode of one sequence.
void attend_rows_threads(const Shape &sh, const TileSource &src, uint64_t n, const float *q,
                         uint64_t n_q, bool prefill, float *out, float *lse, uint32_t threads);

// Decode of one query row per sequence over up to `threads` threads (the
// caller's included): work units are (sequence, token range); a sequence
// longer than its share is split into ranges whose partial states are merged
// by log-sum-exp (FlashDecoding). src[i] holds n[i] tokens; q, out and lse
// are as for attend() with n_q = 1, row i for sequence i.
void attend_threads(const Shape &sh, const std::vector<const TileSource *> &src,
                    const std::vector<uint64_t> &n, const float *q, float *out, float *lse,
                    uint32_t threads);

}  // namespace kvc::attention
