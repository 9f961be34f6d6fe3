// SPDX-License-Identifier: Apache-2.0
// Bytes one sequence's cache takes in a pool of a strategy, at any geometry
// and length, as the library lays it out (for `kvcache recommend`).
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "strategy.h"

namespace kvc_cli {

/// A pool of one strategy at one geometry, reduced to what sets a sequence's
/// bytes: block sizes measured from the library (kvc_pool_stats() of a pool
/// with these settings), and the rules by which tokens move from the residual
/// arena into codec blocks (src/core/pool.cpp: hp_target, age_unit, the sinks).
struct SeqBytes {
  std::uint64_t layers = 0, block_size = 16;
  std::uint64_t block_bytes = 0;           ///< one codec block (K and V, one layer)
  std::uint64_t residual_block_bytes = 0;  ///< one residual block (0: no residual arena)
  std::uint64_t window = 0;                ///< residual window R
  double fraction = 0;                     ///< hybrid: floor(fraction x n) newest tokens stay in the residual
  std::uint64_t unit = 1;                  ///< tokens encoded together (a per-channel group)
  std::uint64_t sink_blocks = 0;           ///< residual blocks of the attention-sink copies, per sequence
  /// While the residual target max(window, floor(fraction x n)) is at most 1
  /// (n < settle: the first length with a target of 2 or more; UINT64_MAX
  /// when there is none), every encoding empties the residual and the next
  /// staged token starts a fresh block (offset 0); `encoded_at_reset` is the
  /// encoded count at the last such emptying (the one at settle - 1).
  std::uint64_t settle = 0, encoded_at_reset = 0;

  /// Bytes in use by one sequence holding n tokens, appended one at a time
  /// (reserve, then append): per layer, ceil(e / block_size) codec blocks for
  /// the e tokens encoded and the residual blocks of the n - e still staged
  /// (from offset (e - encoded_at_reset) mod block_size of their first one),
  /// plus the sink blocks. e = the largest multiple of unit <= n - max(window,
  /// floor(fraction x n)) (0 when that is negative); without a residual
  /// arena e = n.
  std::uint64_t bytes(std::uint64_t n) const;
  /// The most bytes(m) for m <= n: what a sequence needs on its way to n tokens
  /// (bytes fall where a group is encoded, so they are not monotone).
  std::uint64_t peak(std::uint64_t n) const;
};

/// The model of strategy `s` on a geometry; std::nullopt (and why in `why`)
/// when the library refuses such a pool (e.g. a head_dim the codec cannot take).
std::optional<SeqBytes> seq_bytes(const Strategy &s, std::uint32_t layers, std::uint32_t kv_heads,
                                  std::uint32_t head_dim, std::string *why);

}  // namespace kvc_cli
