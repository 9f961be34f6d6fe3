// SPDX-License-Identifier: Apache-2.0
// GPT-2-style byte-level BPE (the "gpt2" tokenizer model of GGUF files), with
// the pre-tokenizers of the models the runner knows:
//  - "smollm" (SmolLM / SmolLM2, also StarCoder): every digit is a piece of
//    its own, then GPT-2's split of the rest;
//  - "gpt2" / "default": GPT-2's split:
//      's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
// Unicode categories (letters, numbers, white space) come from ICU. Each
// piece's UTF-8 bytes are mapped to printable code points (GPT-2's
// bytes_to_unicode), then merged by rank: repeatedly the adjacent pair with
// the lowest merge rank, the leftmost on ties, as llama.cpp and Hugging Face
// tokenizers do.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace kvc_runner {

class ByteBpe {
 public:
  /// `tokens`: the vocabulary (byte-mapped text per id); `merges`: "left right"
  /// per rank; `pre`: the pre-tokenizer name. Throws RunnerError on a
  /// malformed merge or an unknown pre-tokenizer.
  ByteBpe(std::vector<std::string> tokens, const std::vector<std::string> &merges,
          const std::string &pre);

  /// Token ids of `text` (no special tokens are parsed: "<|im_start|>" is text).
  std::vector<int> encode(std::string_view text) const;
  /// The bytes of a token (byte mapping undone).
  std::string decode(int token) const;
  /// The pieces the pre-tokenizer cuts `text` into (for tests).
  std::vector<std::string> pre_tokenize(std::string_view text) const;

  int vocab_size() const { return static_cast<int>(tokens_.size()); }

 private:
  void bpe_piece(const std::string &piece, std::vector<int> &out) const;

  std::vector<std::string> tokens_;
  std::unordered_map<std::string, int> index_;
  std::unordered_map<std::string, int> merge_rank_;  // "left right" -> rank
  bool split_digits_ = false;
  std::string byte_to_text_[256];  // GPT-2 bytes_to_unicode, as UTF-8
  std::unordered_map<std::uint32_t, std::uint8_t> text_to_byte_;
};

}  // namespace kvc_runner
