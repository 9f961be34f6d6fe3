// Fused decode kernels (internal to the attention module): one query row
// against runs of tiles of stored K/V read in place (f16 / bf16 / f32, or
// int8 / int4 / fp8 e4m3 / e5m2 codes with per-token scales or per-group
// scales within each head, or int8 / int4 codes with per-channel scales
// (KIVI's keys), the last two dequantized in registers; any of them
// Hadamard-rotated: the query rotated for the keys, each run's value sums
// rotated back), each K and V row read and
// converted once for all the query heads of its GQA group, the conversion
// (or dequantization) fused into the dot products and the weighted sum, the
// exponentials vectorized, the softmax's bookkeeping once per run of up to
// 64 tokens (128 for integer keys and an int8 query), the next run streamed into L2 while one
// computes. The layout of llama.cpp's CPU flash attention (one KV row, all heads of its group) and
// FlashInfer's decode (K/V tiles in registers across a group) on AVX2 + FMA +
// F16C, with larger register blocks where AVX-512VL gives 32 registers.
#pragma once
#include <cstdint>

#include "attention/attention.h"

namespace kvc::attention::fused {

// Whether this CPU has the instructions (AVX2, FMA, F16C) and they are not
// switched off by set_isa_limit(0).
bool available();
// Caps the instruction set the kernels use (tests compare the paths): 0 =
// none (every tile through the f32 tile path), 1 = AVX2 where the CPU has it,
// 2 (the default) = the AVX-512VL kernels where the CPU has AVX-512F and VL
// (the same 256-bit vectors, twice the accumulators in the 32 registers),
// and the int8-query score kernels (KVC_QUERY_INT8) where it also has VNNI
// and BW. Returns the level now in use. (512-bit vectors measured no faster
// on a Zen 4 core, whose 512-bit units are two 256-bit halves.)
int set_isa_limit(int limit);

// The query of one decode row quantized to int8 (KVC_QUERY_INT8, the way
// llama.cpp's CPU attention converts the query to the key type's dot-product
// type): codes [q_heads][head_dim] with q ~= codes x scale[head] (scale =
// max |q| / 127 per head, codes rounded to nearest even), sum[head] = the sum
// of the head's codes.
struct QueryI8 {
  const int8_t *codes = nullptr;
  const float *scale = nullptr;
  const int32_t *sum = nullptr;
  // KVC_QUERY_INT8_VALUES: symmetric int8 or int4 value codes are also
  // summed in integers: per run, KV head and query head, the probabilities
  // times the tokens' value scales are quantized to 15-bit integers (one f32
  // scale, their largest / 32767) and multiplied with the codes (int4
  // nibbles less their offset, as int16) by vpdpwssd, two tokens an
  // instruction.
  bool int_values = false;
  // Optional (null: not made): the codes in int4-key order, per head and
  // chunk of nib_chunk dimensions (128 where head_dim % 128 == 0, else 64)
  // the even ones then the odd ones (split_query_nibbles), so int4 keys
  // score without unpacking their nibbles in order: a key byte's low nibble
  // meets an even dimension, its high nibble the next odd one. Made where
  // head_dim % 64 == 0.
  const int8_t *codes_nib = nullptr;
  uint64_t nib_chunk = 0;
  // Optional (null: not made): the codes laid out for the AMX tiles
  // (amx_query_tiles), made where amx_in_use(), head_dim is a multiple of 64
  // of at most 64 x kAmxMaxChunks and a KV head has at most 4 x
  // kAmxMaxPieces query heads: int8 keys are then scored on the tiles.
  const int8_t *codes_amx = nullptr;
};
// codes [q_heads][head_dim] (head_dim % 64 == 0) -> out in int4-key order
// (QueryI8::codes_nib); returns the chunk (QueryI8::nib_chunk).
uint64_t split_query_nibbles(const int8_t *codes, uint64_t q_heads, uint64_t head_dim, int8_t *out);
// Whether the int8-query kernels run here: AVX-512 VNNI + VL + BW and level 2.
bool int8_query_available();

// --- AMX (fused_amx.cpp): the int8 query's int8-key scores on Intel AMX
// tiles (TDPBSSD / TDPBUSD: 16 tokens x 4 query heads x 64 dimensions an
// instruction, the key rows read in place) where the CPU has AMX-TILE and
// AMX-INT8 and Linux grants the process the tile state (asked once, on the
// first call of amx_in_use()). The sums are the VNNI kernel's exact
// integers: the same scores, bit for bit.
// Whether the tiles are used: the CPU and OS allow it, int8_query_available()
// and not switched off by set_amx(false).
bool amx_in_use();
// Switches the AMX scores on or off (tests compare the paths); returns
// amx_in_use().
bool set_amx(bool on);
// Bands of 16 tokens the calling thread has scored on the tiles (tests).
uint64_t amx_bands_here();
// The most 64-dimension chunks (head_dim <= 256) and pieces of 4 query heads
// per KV head (16 heads) the AMX scores take.
constexpr uint64_t kAmxMaxChunks = 4, kAmxMaxPieces = 4;
// Bytes of amx_query_tiles's layout.
uint64_t amx_query_bytes(uint64_t q_heads, uint64_t kv_heads, uint64_t head_dim);
// codes [q_heads][head_dim] -> out [kv_heads][pieces of 4 query heads]
// [head_dim / 64][16 rows][4 heads][4 codes]: the tiles' second operand per
// KV head (a piece's missing heads zero).
void amx_query_tiles(const int8_t *codes, uint64_t q_heads, uint64_t kv_heads, uint64_t head_dim,
                     int8_t *out);
// Loads the tile configuration of scores_i8_amx on the calling thread; writes
// the last band's scores and releases the tiles.
void amx_begin();
void amx_end();
// scores_i8_512's scores (fused.cpp) of 16 tokens of one KV head (int8 codes,
// signed, or unsigned ones, in rows kts bytes apart from k0) for its grp
// query heads, on the tiles (between amx_begin and amx_end): s[j x ss + t] =
// (sum - corr[j]) x qs[j] (signed codes: the VNNI kernel's sum less corr[j],
// which is the signed sum itself), bt the KV head's part of
// amx_query_tiles. A call's scores are written by the next call or by
// amx_end().
void scores_i8_amx(const uint8_t *k0, uint64_t kts, uint64_t hd, uint64_t grp, bool is_signed,
                   const int8_t *bt, const int32_t *corr, const float *qs, float *s, uint64_t ss);
// Fills codes [q_heads * head_dim], scale [q_heads] and sum [q_heads] from
// q [q_heads][head_dim] (finite f32).
void quantize_query(const float *q, uint64_t q_heads, uint64_t head_dim, int8_t *codes,
                    float *scale, int32_t *sum);

// Whether the kernels take this tile: known types on both parts, head_dim
// a multiple of 16, per-group scales (RawPart::group) in groups of a
// multiple of 16 that divide head_dim, a head's scales adjacent, and
// per-channel ones (RawPart::channel) on integer codes, a head's head_dim of
// them adjacent. Keys with per-group or per-channel scales take the exact
// query (q8 is ignored for their runs).
bool supports(const RawTile &rt, uint64_t head_dim);

// The most tiles one run() takes.
constexpr int kMaxRun = 8;
// Whether two tiles are stored alike (types, strides, code offsets, scale
// format): tiles of one run must be.
bool same_layout(const RawTile &a, const RawTile &b);

// Adds the tokens of a run of n tiles (1 <= n <= kMaxRun) to the
// online-softmax state (running max m [q_heads], sum ls [q_heads],
// accumulator acc [q_heads][head_dim]) of one query row q
// [q_heads][head_dim] (f32, already scaled). Tile i holds c[i] tokens; the
// tiles hold consecutive tokens from t0 and share one layout (same_layout).
// obs: null, or the row's raw scores [q_heads][obs_stride], written at
// columns [t0, t0 + sum c) (clamped to +-FLT_MAX, NaN as -FLT_MAX, as the
// tile path records them). next: null, or the run that follows (next_n
// tiles of next_c tokens), whose K and V are prefetched while this one
// computes. q8: null, or q quantized (int8_query_available(), head_dim a
// multiple of 32): integer keys (int8, uint8, int4 codes) are then scored in
// integers against it; f16 / bf16 / f32 keys and the values use q as always.
void run(const Shape &sh, const RawTile *rt, const uint64_t *c, int n, const float *q, float *m,
         float *ls, float *acc, float *obs, uint64_t obs_stride, uint64_t t0, const RawTile *next,
         const uint64_t *next_c, int next_n, const QueryI8 *q8 = nullptr);

}  // namespace kvc::attention::fused
