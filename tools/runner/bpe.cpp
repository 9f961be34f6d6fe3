// SPDX-License-Identifier: Apache-2.0
#include "bpe.h"

#include <unicode/uchar.h>

#include <algorithm>
#include <limits>
#include <queue>

#include "error.h"

namespace kvc_runner {
namespace {

void append_utf8(std::string &out, std::uint32_t cp) {
  if (cp < 0x80) {
    out += static_cast<char>(cp);
  } else if (cp < 0x800) {
    out += static_cast<char>(0xC0 | (cp >> 6));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else if (cp < 0x10000) {
    out += static_cast<char>(0xE0 | (cp >> 12));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else {
    out += static_cast<char>(0xF0 | (cp >> 18));
    out += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  }
}

/// One code point and the bytes it came from.
struct Cp {
  std::uint32_t cp;
  std::size_t begin, end;
};

/// Decodes UTF-8; an invalid byte becomes U+FFFD over that one byte (its
/// bytes are still what BPE sees).
std::vector<Cp> decode_utf8(std::string_view s) {
  std::vector<Cp> out;
  std::size_t i = 0;
  while (i < s.size()) {
    const unsigned char c = static_cast<unsigned char>(s[i]);
    std::size_t len = c < 0x80           ? 1
                      : (c >> 5) == 0x6  ? 2
                      : (c >> 4) == 0xE  ? 3
                      : (c >> 3) == 0x1E ? 4
                                         : 0;
    std::uint32_t cp = len == 1 ? c : len == 2 ? c & 0x1F : len == 3 ? c & 0x0F : c & 0x07;
    bool ok = len != 0 && i + len <= s.size();
    for (std::size_t k = 1; ok && k < len; ++k) {
      const unsigned char cc = static_cast<unsigned char>(s[i + k]);
      if ((cc & 0xC0) != 0x80) ok = false;
      cp = (cp << 6) | (cc & 0x3F);
    }
    if (!ok) {
      out.push_back({0xFFFD, i, i + 1});
      ++i;
      continue;
    }
    out.push_back({cp, i, i + len});
    i += len;
  }
  return out;
}

bool is_letter(std::uint32_t cp) {
  const std::int8_t t = u_charType(static_cast<UChar32>(cp));
  return t == U_UPPERCASE_LETTER || t == U_LOWERCASE_LETTER || t == U_TITLECASE_LETTER ||
         t == U_MODIFIER_LETTER || t == U_OTHER_LETTER;
}
bool is_number(std::uint32_t cp) {
  const std::int8_t t = u_charType(static_cast<UChar32>(cp));
  return t == U_DECIMAL_DIGIT_NUMBER || t == U_LETTER_NUMBER || t == U_OTHER_NUMBER;
}
bool is_space(std::uint32_t cp) {
  return u_isUWhiteSpace(static_cast<UChar32>(cp));
}

/// GPT-2's split of cps[from, to) into [begin, end) index ranges.
void gpt2_split(const std::vector<Cp> &cps, std::size_t from, std::size_t to,
                std::vector<std::pair<std::size_t, std::size_t>> &out) {
  std::size_t pos = from;
  auto at = [&](std::size_t i) { return i < to ? cps[i].cp : 0xFFFFFFFFu; };
  auto other = [&](std::uint32_t cp) {
    return cp != 0xFFFFFFFFu && !is_space(cp) && !is_letter(cp) && !is_number(cp);
  };
  while (pos < to) {
    const std::uint32_t c = cps[pos].cp;
    // 's 't 're 've 'm 'll 'd (lower case only, as GPT-2)
    if (c == '\'' && pos + 1 < to) {
      const std::uint32_t n1 = at(pos + 1), n2 = at(pos + 2);
      if (n1 == 's' || n1 == 't' || n1 == 'm' || n1 == 'd') {
        out.emplace_back(pos, pos + 2);
        pos += 2;
        continue;
      }
      if ((n1 == 'r' && n2 == 'e') || (n1 == 'v' && n2 == 'e') || (n1 == 'l' && n2 == 'l')) {
        out.emplace_back(pos, pos + 3);
        pos += 3;
        continue;
      }
    }
    // ' ?\p{L}+', ' ?\p{N}+', ' ?[^\s\p{L}\p{N}]+'
    const std::size_t start = pos;
    std::size_t p = pos;
    if (c == ' ' && p + 1 < to) {
      const std::uint32_t n = at(p + 1);
      if (is_letter(n) || is_number(n) || other(n)) ++p;
    }
    const std::uint32_t head = at(p);
    if (p < to && is_letter(head)) {
      while (p < to && is_letter(at(p))) ++p;
      out.emplace_back(start, p);
      pos = p;
      continue;
    }
    if (p < to && is_number(head)) {
      while (p < to && is_number(at(p))) ++p;
      out.emplace_back(start, p);
      pos = p;
      continue;
    }
    if (p < to && other(head)) {
      while (p < to && other(at(p))) ++p;
      out.emplace_back(start, p);
      pos = p;
      continue;
    }
    // '\s+(?!\S)', then '\s+'
    std::size_t e = pos;
    while (e < to && is_space(at(e))) ++e;
    if (e > pos) {
      if (e < to && e - pos > 1) --e;  // leave the last space to prefix the next word
      out.emplace_back(pos, e);
      pos = e;
      continue;
    }
    out.emplace_back(pos, pos + 1);  // not reached for valid input; never loop forever
    ++pos;
  }
}

}  // namespace

ByteBpe::ByteBpe(std::vector<std::string> tokens, const std::vector<std::string> &merges,
                 const std::string &pre)
    : tokens_(std::move(tokens)) {
  if (pre == "smollm" || pre == "starcoder")
    split_digits_ = true;
  else if (pre != "gpt2" && pre != "default")
    throw RunnerError("tokenizer pre-processing '" + pre +
                      "' is not supported (smollm, starcoder, gpt2, default)");
  for (std::size_t i = 0; i < tokens_.size(); ++i) index_.emplace(tokens_[i], static_cast<int>(i));
  for (std::size_t r = 0; r < merges.size(); ++r) {
    const std::string &m = merges[r];
    const std::size_t sp = m.find(' ', 1);
    if (sp == std::string::npos || sp + 1 >= m.size())
      throw RunnerError("tokenizer merge " + std::to_string(r) + " '" + m +
                        "' is not 'left right'");
    merge_rank_.emplace(m, static_cast<int>(r));
  }
  // bytes_to_unicode: printable Latin-1 bytes map to themselves, the others
  // to U+0100 + n in byte order.
  int n = 0;
  for (int b = 0; b < 256; ++b) {
    const bool keep =
        (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
    const std::uint32_t cp =
        keep ? static_cast<std::uint32_t>(b) : 0x100u + static_cast<std::uint32_t>(n++);
    append_utf8(byte_to_text_[b], cp);
    text_to_byte_[cp] = static_cast<std::uint8_t>(b);
  }
}

std::vector<std::string> ByteBpe::pre_tokenize(std::string_view text) const {
  const std::vector<Cp> cps = decode_utf8(text);
  std::vector<std::pair<std::size_t, std::size_t>> ranges;
  std::size_t from = 0;
  for (std::size_t i = 0; i <= cps.size(); ++i) {
    const bool cut = i == cps.size() || (split_digits_ && is_number(cps[i].cp));
    if (!cut) continue;
    if (i > from) gpt2_split(cps, from, i, ranges);
    if (i < cps.size()) ranges.emplace_back(i, i + 1);
    from = i + 1;
  }
  std::vector<std::string> pieces;
  for (const auto &[b, e] : ranges)
    pieces.emplace_back(text.substr(cps[b].begin, cps[e - 1].end - cps[b].begin));
  return pieces;
}

void ByteBpe::bpe_piece(const std::string &piece, std::vector<int> &out) const {
  // Symbols: the byte-mapped text of each byte; merged in place.
  std::vector<std::string> sym;
  for (unsigned char b : piece) sym.push_back(byte_to_text_[b]);
  if (sym.empty()) return;
  std::vector<int> prev(sym.size()), next(sym.size());
  std::vector<bool> alive(sym.size(), true);
  for (std::size_t i = 0; i < sym.size(); ++i) {
    prev[i] = static_cast<int>(i) - 1;
    next[i] = i + 1 < sym.size() ? static_cast<int>(i + 1) : -1;
  }
  struct Pair {
    int rank, left, right;
    std::size_t left_len, right_len;  // to detect stale entries
  };
  auto worse = [](const Pair &a, const Pair &b) {
    return a.rank != b.rank ? a.rank > b.rank : a.left > b.left;
  };
  std::priority_queue<Pair, std::vector<Pair>, decltype(worse)> heap(worse);
  auto consider = [&](int l, int r) {
    if (l < 0 || r < 0) return;
    const auto it = merge_rank_.find(sym[l] + " " + sym[r]);
    if (it != merge_rank_.end()) heap.push({it->second, l, r, sym[l].size(), sym[r].size()});
  };
  for (std::size_t i = 0; i + 1 < sym.size(); ++i)
    consider(static_cast<int>(i), static_cast<int>(i + 1));
  while (!heap.empty()) {
    const Pair p = heap.top();
    heap.pop();
    if (!alive[p.left] || !alive[p.right] || next[p.left] != p.right ||
        sym[p.left].size() != p.left_len || sym[p.right].size() != p.right_len)
      continue;  // stale: a side was merged since
    sym[p.left] += sym[p.right];
    alive[p.right] = false;
    next[p.left] = next[p.right];
    if (next[p.left] >= 0) prev[next[p.left]] = p.left;
    consider(prev[p.left], p.left);
    consider(p.left, next[p.left]);
  }
  for (int i = 0; i >= 0; i = next[i]) {
    const auto it = index_.find(sym[i]);
    if (it != index_.end()) {
      out.push_back(it->second);
      continue;
    }
    // Not in the vocabulary: one token per byte symbol.
    const std::vector<Cp> cps = decode_utf8(sym[i]);
    for (const Cp &c : cps) {
      const auto t = index_.find(sym[i].substr(c.begin, c.end - c.begin));
      if (t == index_.end())
        throw RunnerError("tokenizer: the vocabulary has no token for byte symbol '" +
                          sym[i].substr(c.begin, c.end - c.begin) + "'");
      out.push_back(t->second);
    }
  }
}

std::vector<int> ByteBpe::encode(std::string_view text) const {
  std::vector<int> out;
  for (const std::string &piece : pre_tokenize(text)) bpe_piece(piece, out);
  return out;
}

std::string ByteBpe::decode(int token) const {
  if (token < 0 || token >= vocab_size()) return {};
  std::string out;
  for (const Cp &c : decode_utf8(tokens_[static_cast<std::size_t>(token)])) {
    const auto it = text_to_byte_.find(c.cp);
    if (it != text_to_byte_.end())
      out += static_cast<char>(it->second);
    else
      out += tokens_[static_cast<std::size_t>(token)].substr(c.begin,
                                                             c.end - c.begin);  // special tokens
  }
  return out;
}

}  // namespace kvc_runner
