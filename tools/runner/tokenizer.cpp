// SPDX-License-Identifier: Apache-2.0
#include "tokenizer.h"

#include <cctype>
#include <cerrno>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <queue>

#include "bpe.h"
#include "error.h"
#include "gguf.h"

namespace kvc_runner {
namespace {

template <class T>
bool read_pod(const std::vector<char> &buf, std::size_t &off, T &out) {
  if (buf.size() - off < sizeof(T)) return false;
  std::memcpy(&out, buf.data() + off, sizeof(T));
  off += sizeof(T);
  return true;
}

int hex_value(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  return -1;
}

}  // namespace

Tokenizer Tokenizer::load(const std::string &path, int vocab_size) {
  std::error_code ec;
  if (std::filesystem::is_directory(path, ec))
    throw RunnerError("cannot read tokenizer file '" + path + "': it is a directory");
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    throw RunnerError("cannot open tokenizer file '" + path + "': " + std::strerror(errno));
  }
  {
    char magic[4] = {0, 0, 0, 0};
    in.read(magic, 4);
    if (in && std::memcmp(magic, "GGUF", 4) == 0) {
      const GgufFile g = GgufFile::load(path);
      const std::string model = g.get_string("tokenizer.ggml.model");
      if (model != "gpt2") {
        throw RunnerError("tokenizer of '" + path + "': model '" + model +
                          "' is not supported (gpt2 byte-level BPE)");
      }
      Tokenizer t;
      t.pieces_ = g.get_strings("tokenizer.ggml.tokens");
      if (static_cast<int>(t.pieces_.size()) != vocab_size) {
        throw RunnerError("tokenizer '" + path + "' has " + std::to_string(t.pieces_.size()) +
                          " tokens but the model's vocab_size is " + std::to_string(vocab_size) +
                          " (tokenizer does not match the model)");
      }
      t.scores_.assign(t.pieces_.size(), 0.0f);
      const std::string pre =
          g.has("tokenizer.ggml.pre") ? g.get_string("tokenizer.ggml.pre") : "default";
      t.bpe_ = std::make_shared<ByteBpe>(t.pieces_, g.get_strings("tokenizer.ggml.merges"), pre);
      auto id = [&](const char *key, int fallback) {
        if (!g.has(key)) return fallback;
        const std::int64_t v = g.get_int(key);
        if (v < 0 || v >= vocab_size)
          throw RunnerError("tokenizer '" + path + "': " + key + " out of range");
        return static_cast<int>(v);
      };
      t.bos_ = id("tokenizer.ggml.bos_token_id", kBosToken);
      t.eos_ = id("tokenizer.ggml.eos_token_id", kEosToken);
      return t;
    }
    in.clear();
    in.seekg(0);
  }
  std::vector<char> buf((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::size_t off = 0;
  std::uint32_t max_len = 0;
  if (!read_pod(buf, off, max_len) || max_len == 0 || max_len > (1u << 16)) {
    throw RunnerError("tokenizer '" + path + "' is not a llama2.c tokenizer file (bad header)");
  }
  Tokenizer t;
  while (off < buf.size()) {
    float score = 0;
    std::int32_t len = 0;
    if (!read_pod(buf, off, score) || !read_pod(buf, off, len)) {
      throw RunnerError("tokenizer '" + path + "' is truncated inside entry " +
                        std::to_string(t.pieces_.size()));
    }
    if (len < 0 || static_cast<std::uint32_t>(len) > max_len ||
        buf.size() - off < std::size_t(len)) {
      throw RunnerError("tokenizer '" + path + "': entry " + std::to_string(t.pieces_.size()) +
                        " has an impossible length " + std::to_string(len));
    }
    t.pieces_.emplace_back(buf.data() + off, static_cast<std::size_t>(len));
    t.scores_.push_back(score);
    off += static_cast<std::size_t>(len);
  }
  if (static_cast<int>(t.pieces_.size()) != vocab_size) {
    throw RunnerError("tokenizer '" + path + "' has " + std::to_string(t.pieces_.size()) +
                      " tokens but the model's vocab_size is " + std::to_string(vocab_size) +
                      " (tokenizer does not match the model)");
  }
  for (std::size_t i = 0; i < t.pieces_.size(); ++i) {
    t.index_.emplace(t.pieces_[i], static_cast<int>(i));  // first id wins on duplicates
  }
  return t;
}

int Tokenizer::lookup(std::string_view s) const {
  auto it = index_.find(std::string(s));
  return it == index_.end() ? -1 : it->second;
}

std::vector<int> Tokenizer::encode(std::string_view text, bool bos, bool eos) const {
  if (bpe_) {
    std::vector<int> tokens;
    if (bos) tokens.push_back(bos_);
    const std::vector<int> body = bpe_->encode(text);
    tokens.insert(tokens.end(), body.begin(), body.end());
    if (eos) tokens.push_back(eos_);
    return tokens;
  }
  std::vector<int> tokens;
  tokens.reserve(text.size() + 3);
  if (bos) tokens.push_back(kBosToken);
  if (!text.empty()) {
    const int space = lookup(" ");
    if (space >= 0) tokens.push_back(space);
  }
  // Split into UTF-8 code points (a lead byte and at most 3 continuation bytes).
  const int n_vocab = vocab_size();
  std::size_t i = 0;
  while (i < text.size()) {
    std::size_t j = i + 1;
    while (j < text.size() && j - i < 4 && (static_cast<unsigned char>(text[j]) & 0xC0) == 0x80) {
      ++j;
    }
    const std::string_view cp = text.substr(i, j - i);
    const int id = lookup(cp);
    if (id >= 0) {
      tokens.push_back(id);
    } else {
      for (unsigned char byte : cp) {
        const int fallback = 3 + byte;
        tokens.push_back(fallback < n_vocab ? fallback : kUnkToken);
      }
    }
    i = j;
  }
  // Merge the best-scoring adjacent pair (the leftmost on ties) until no pair
  // is in the vocabulary. A max-heap of candidate pairs over a linked list
  // makes this O(n log n) while picking exactly the pair a rescan would pick.
  const std::size_t n = tokens.size();  // BOS takes part, as in llama2.c
  int *ids = tokens.data();
  if (n >= 2) {
    struct Candidate {
      float score;
      std::uint32_t left, right, left_version, right_version;
      int merged;
    };
    auto worse = [](const Candidate &a, const Candidate &b) {
      if (a.score != b.score) return a.score < b.score;
      return a.left > b.left;
    };
    std::vector<std::uint32_t> next(n), prev(n), version(n, 0);
    std::vector<bool> alive(n, true);
    constexpr std::uint32_t kNone = 0xFFFFFFFFu;
    for (std::size_t k = 0; k < n; ++k) {
      next[k] = k + 1 < n ? static_cast<std::uint32_t>(k + 1) : kNone;
      prev[k] = k > 0 ? static_cast<std::uint32_t>(k - 1) : kNone;
    }
    std::priority_queue<Candidate, std::vector<Candidate>, decltype(worse)> heap(worse);
    std::string pair;
    auto consider = [&](std::uint32_t left, std::uint32_t right) {
      if (left == kNone || right == kNone) return;
      pair = pieces_[ids[left]];
      pair += pieces_[ids[right]];
      const int id = lookup(pair);
      if (id >= 0 && scores_[id] > -1e10f) {
        heap.push({scores_[id], left, right, version[left], version[right], id});
      }
    };
    for (std::uint32_t k = 0; k + 1 < n; ++k) consider(k, k + 1);
    while (!heap.empty()) {
      const Candidate c = heap.top();
      heap.pop();
      if (!alive[c.left] || !alive[c.right] || next[c.left] != c.right ||
          version[c.left] != c.left_version || version[c.right] != c.right_version) {
        continue;  // stale: one side was merged since
      }
      ids[c.left] = c.merged;
      ++version[c.left];
      alive[c.right] = false;
      next[c.left] = next[c.right];
      if (next[c.left] != kNone) prev[next[c.left]] = c.left;
      consider(prev[c.left], c.left);
      consider(c.left, next[c.left]);
    }
    std::size_t out = 0;
    for (std::uint32_t k = 0; k != kNone && k < n; k = next[k]) ids[out++] = ids[k];
    tokens.resize(out);
  }
  if (eos) tokens.push_back(kEosToken);
  return tokens;
}

std::string Tokenizer::decode(int prev, int token) const {
  if (token < 0 || token >= vocab_size()) return {};
  if (bpe_) return bpe_->decode(token);
  std::string_view p = pieces_[token];
  if (prev == kBosToken && !p.empty() && p[0] == ' ') p.remove_prefix(1);
  if (p.size() == 6 && p.substr(0, 3) == "<0x" && p[5] == '>') {
    const int hi = hex_value(p[3]), lo = hex_value(p[4]);
    if (hi >= 0 && lo >= 0) return std::string(1, static_cast<char>(hi * 16 + lo));
  }
  return std::string(p);
}

std::string Tokenizer::printable(int prev, int token) const {
  std::string s = decode(prev, token);
  if (s.size() == 1) {
    const unsigned char c = static_cast<unsigned char>(s[0]);
    if (!(std::isprint(c) || std::isspace(c))) return {};
  }
  return s;
}

}  // namespace kvc_runner
