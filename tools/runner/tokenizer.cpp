// SPDX-License-Identifier: Apache-2.0
#include "tokenizer.h"

#include <cctype>
#include <cerrno>
#include <cstdint>
#include <cstring>
#include <fstream>
#include <iterator>

#include "error.h"

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
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    throw RunnerError("cannot open tokenizer file '" + path + "': " + std::strerror(errno));
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
    if (len < 0 || static_cast<std::uint32_t>(len) > max_len || buf.size() - off < std::size_t(len)) {
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
    while (j < text.size() && j - i < 4 &&
           (static_cast<unsigned char>(text[j]) & 0xC0) == 0x80) {
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
  // Merge the best-scoring adjacent pair until none is in the vocabulary.
  std::string pair;
  for (;;) {
    float best_score = -1e10f;
    int best_id = -1;
    std::size_t best_at = 0;
    for (std::size_t k = 0; k + 1 < tokens.size(); ++k) {
      pair = pieces_[tokens[k]];
      pair += pieces_[tokens[k + 1]];
      const int id = lookup(pair);
      if (id >= 0 && scores_[id] > best_score) {
        best_score = scores_[id];
        best_id = id;
        best_at = k;
      }
    }
    if (best_id < 0) break;
    tokens[best_at] = best_id;
    tokens.erase(tokens.begin() + static_cast<std::ptrdiff_t>(best_at) + 1);
  }
  if (eos) tokens.push_back(kEosToken);
  return tokens;
}

std::string Tokenizer::decode(int prev, int token) const {
  if (token < 0 || token >= vocab_size()) return {};
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
