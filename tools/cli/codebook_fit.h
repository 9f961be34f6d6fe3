// SPDX-License-Identifier: Apache-2.0
// Codebooks fitted to a model's own keys and values (the codecs issue's
// "fitted offline by weighted k-means on real K/V"; KVQuant, arXiv
// 2401.18079, fits its non-uniform levels per layer offline): a model run
// collects each layer's K and V rows, puts them through what the pool does
// before a codebook encodes them (RoPE undone for pre-RoPE keys, key
// smoothing, the Hadamard rotation, division by each scale group's signed
// extreme), and Lloyd's algorithm fits 2^bits levels per layer to the
// normalized values, each weighted by its group's squared extreme (so the
// levels minimize the squared error of the decoded values, not of their
// normalized images). `kvcache calibrate --codebook` writes them to a file;
// `kvcache eval` fits them for `codebook=fit` rows.
//
// The file format (text, '#' comments), one block per part:
//
//   kvcache-codebook 1
//   part k bits 4 group 64 layers 30   part k (keys) or v (values); group: values per scale group
//   levels <layer> <2^bits numbers>    one line per layer, ascending, in [-1, 1]
//
// The levels of a part are kvc_pool_set_codebook()'s `[num_layers][2^bits]`.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "../runner/model.h"
#include "../runner/tokenizer.h"
#include "strategy.h"

namespace kvc_cli {

/// What the pool does to one part's rows before its codebook encodes them.
struct CodebookPart {
  int part = 0;                ///< 0: keys, 1: values
  std::uint32_t bits = 4;      ///< 2, 3 or 4
  std::uint64_t group = 0;     ///< values per scale group (head_dim for per-token scales)
  std::uint32_t rotation = 0;  ///< Hadamard block inside each head (0: none)
  bool pre_rope = false;       ///< keys: RoPE undone at each position first
  /// Keys: per-channel smoothing `[layers][kv_dim]` ((k - offset) / scale), empty: none.
  std::vector<float> smooth_scale, smooth_offset;
};

/// Bits and group (head_dim for per-token scales) of codec `c` into `p`.
void layer_codebook_part(const kvc_codec &c, const kvc_runner::ModelConfig &mc, CodebookPart &p);

/// The parts of strategy `s` with a codebook (keys first; with `fit_only`
/// only its `codebook=fit` parts), as its pool transforms them: bits and
/// group of its codec (head_dim for per-token scales), the Hadamard block
/// the pool takes by default (the largest power of two dividing head_dim, at
/// most 1024), pre-RoPE keys, and the key smoothing `key_scale` /
/// `key_offset` (`[layers][kv_dim]`, empty: none).
std::vector<CodebookPart> strategy_codebook_parts(const Strategy &s,
                                                  const kvc_runner::ModelConfig &c,
                                                  const std::vector<float> &key_scale,
                                                  const std::vector<float> &key_offset,
                                                  bool fit_only);

/// Fitted levels of one part: `[layers][2^bits]`, ascending in [-1, 1] within a layer.
struct FittedCodebook {
  CodebookPart how;
  int layers = 0;
  std::vector<float> levels;
  std::uint64_t groups = 0;  ///< scale groups seen per layer
};

/// Lloyd's algorithm on weighted samples in [-1, 1]: 2^bits ascending
/// levels (strictly, within [-1, 1]) that locally minimize the weighted
/// squared distance of each sample to its nearest level, starting from
/// `init` (2^bits ascending values). Samples go into `bins` equal bins
/// (their weighted sums keep each bin's centroid exact).
std::vector<float> lloyd_levels(const std::vector<float> &samples,
                                const std::vector<float> &weights, std::uint32_t bits,
                                const std::vector<float> &init, std::uint32_t bins = 1u << 14);

/// Fits every part of `parts` from one run of `model` over `windows`
/// windows of `window` positions (BOS, then the next window - 1 tokens of
/// `tokens`), one token at a time on a plain f32 cache. Position 0 of each
/// window (the attention sink, which pools keep exact with residual_sinks)
/// is left out. Levels start from the Gaussian table
/// (kvc_codebook_gaussian) of the part's bits and group. Throws RunnerError
/// for a part the model's geometry does not fit or a text that is too short.
std::vector<FittedCodebook> fit_codebooks(const kvc_runner::Model &model,
                                          const std::vector<int> &tokens, int bos, int window,
                                          int windows, const std::vector<CodebookPart> &parts);

/// The text codebooks are fitted on and how it is cut: `path` (empty: the
/// shared data/out-of-domain.txt, never the eval text), windows of
/// min(context, 512) positions, up to 4 of them.
struct CodebookText {
  std::vector<int> tokens;
  int window = 0, windows = 0;
  std::string description;  ///< "<file name>, N windows of W positions"
};
CodebookText codebook_fit_text(const kvc_runner::Tokenizer &tokenizer,
                               const kvc_runner::ModelConfig &c, const std::string &path);

/// The text of fitted codebooks (levels to 9 significant digits), `comment` lines first.
std::string format_codebooks(const std::vector<FittedCodebook> &books, const std::string &comment);

/// Parses a codebook text; throws RunnerError naming `where`, the line and the problem.
std::vector<FittedCodebook> parse_codebooks(const std::string &text, const std::string &where);

}  // namespace kvc_cli
