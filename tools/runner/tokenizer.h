// SPDX-License-Identifier: Apache-2.0
// Tokenizers of the runner's models: llama2.c's BPE (tokenizer.bin format:
// uint32 max_token_length, then per token: float32 score, int32 length,
// bytes), or the byte-level BPE stored in a GGUF model (bpe.h).
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace kvc_runner {

constexpr int kUnkToken = 0;
constexpr int kBosToken = 1;
constexpr int kEosToken = 2;

class ByteBpe;

class Tokenizer {
 public:
  /// Loads a tokenizer (a llama2.c tokenizer.bin, or a GGUF file's) and checks
  /// that it holds exactly `vocab_size` pieces.
  static Tokenizer load(const std::string &path, int vocab_size);

  /// SentencePiece-style BPE as llama2.c does it: optional BOS, a dummy-prefix
  /// space, UTF-8 code points (byte fallback <0xNN> = 3 + byte), then greedy
  /// merges of the best-scoring adjacent pair.
  std::vector<int> encode(std::string_view text, bool bos, bool eos) const;

  /// Text of `token` following `prev`: strips the leading space after BOS and
  /// turns <0xNN> pieces into their byte.
  std::string decode(int prev, int token) const;

  /// decode() filtered as llama2.c prints: single bytes that are neither
  /// printable nor whitespace are dropped.
  std::string printable(int prev, int token) const;

  int vocab_size() const { return static_cast<int>(pieces_.size()); }
  int bos_token() const { return bos_; }
  bool byte_level() const { return bpe_ != nullptr; }
  const std::string &piece(int id) const { return pieces_.at(static_cast<std::size_t>(id)); }
  float score(int id) const { return scores_.at(static_cast<std::size_t>(id)); }

 private:
  int lookup(std::string_view s) const;

  std::vector<std::string> pieces_;
  std::vector<float> scores_;
  std::unordered_map<std::string, int> index_;
  std::shared_ptr<const ByteBpe> bpe_;  // GGUF "gpt2" tokenizers
  int bos_ = kBosToken, eos_ = kEosToken;
};

}  // namespace kvc_runner
