// Fused decode kernels (internal to the attention module): one query row
// against a tile of stored K/V read in place (f16 / bf16 / f32, or int8 /
// int4 codes with per-token scales), each K and V row read and converted once
// for all the query heads of its GQA group, the conversion (or dequantization)
// fused into the dot products and the weighted sum, the exponentials
// vectorized. The layout of llama.cpp's CPU flash attention (one KV row, all
// heads of its group) and FlashInfer's decode (K/V tiles in registers across a
// group) on AVX2 + FMA + F16C.
#pragma once
#include <cstdint>

#include "attention/attention.h"

namespace kvc::attention::fused {

// Whether this CPU has the instructions (AVX2, FMA, F16C) and they are not
// switched off by set_isa_limit(0).
bool available();
// Caps the instruction set the kernels use (tests compare the paths): 0 =
// none (every tile through the f32 tile path), 1 = AVX2 where the CPU has it
// (the default). Returns the level now in use. (AVX-512 versions of the
// kernels measured no faster on a Zen 4 core, whose 512-bit units are two
// 256-bit halves, and were left out.)
int set_isa_limit(int limit);

// Whether the kernels take this tile: known types on both parts and
// head_dim a multiple of 16.
bool supports(const RawTile &rt, uint64_t head_dim);

// Adds the c tokens of tile rt to the online-softmax state (running max m
// [q_heads], sum ls [q_heads], accumulator acc [q_heads][head_dim]) of one
// query row q [q_heads][head_dim] (f32, already scaled). obs: null, or the
// row's raw scores [q_heads][obs_stride], written at columns [t0, t0 + c)
// (clamped to +-FLT_MAX, NaN as -FLT_MAX, as the tile path records them).
// next: null, or the tile that follows (next_c tokens), whose keys are
// prefetched while this one computes.
void tile(const Shape &sh, const RawTile &rt, uint64_t c, const float *q, float *m, float *ls,
          float *acc, float *obs, uint64_t obs_stride, uint64_t t0, const RawTile *next = nullptr,
          uint64_t next_c = 0);

}  // namespace kvc::attention::fused
