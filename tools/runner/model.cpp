// SPDX-License-Identifier: Apache-2.0
#include "model.h"

#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <limits>

#include "error.h"

namespace kvc_runner {
namespace {

constexpr int kHeaderInts = 7;
constexpr std::uint64_t kHeaderBytes = kHeaderInts * sizeof(std::int32_t);

void check_range(const std::string &path, const char *name, std::int64_t value, std::int64_t lo,
                 std::int64_t hi) {
  if (value < lo || value > hi) {
    throw RunnerError("model '" + path + "': impossible header: " + name + " = " +
                      std::to_string(value) + " (must be " + std::to_string(lo) + ".." +
                      std::to_string(hi) + ")");
  }
}

/// Floats after the header that a checkpoint with this config holds.
std::uint64_t expected_floats(const ModelConfig &c) {
  const std::uint64_t dim = c.dim, hidden = c.hidden_dim, layers = c.n_layers;
  const std::uint64_t vocab = c.vocab_size, kv_dim = c.kv_dim(), head = c.head_dim();
  std::uint64_t n = vocab * dim;                 // token embedding
  n += layers * dim;                             // rms_att
  n += layers * dim * dim;                       // wq
  n += 2 * layers * dim * kv_dim;                // wk, wv
  n += layers * dim * dim;                       // wo
  n += layers * dim;                             // rms_ffn
  n += 3 * layers * dim * hidden;                // w1, w2, w3
  n += dim;                                      // rms_final
  n += std::uint64_t(c.seq_len) * head;          // freq_cis real + imag (seq_len * head/2 each)
  if (!c.shared_classifier) n += vocab * dim;    // wcls
  return n;
}

}  // namespace

Model::Model(Model &&other) noexcept
    : path_(std::move(other.path_)), config_(other.config_), data_(std::move(other.data_)) {
  bind_weights();
}

Model Model::load(const std::string &path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    throw RunnerError("cannot open model file '" + path + "': " + std::strerror(errno));
  }
  in.seekg(0, std::ios::end);
  const std::streamoff size_off = in.tellg();
  if (size_off < 0) throw RunnerError("cannot read model file '" + path + "'");
  const std::uint64_t file_size = static_cast<std::uint64_t>(size_off);
  in.seekg(0, std::ios::beg);
  if (file_size < kHeaderBytes) {
    throw RunnerError("model '" + path + "' is truncated: " + std::to_string(file_size) +
                      " bytes, but the llama2.c header alone needs " +
                      std::to_string(kHeaderBytes));
  }
  std::int32_t header[kHeaderInts];
  in.read(reinterpret_cast<char *>(header), sizeof(header));
  if (!in) throw RunnerError("cannot read the header of model '" + path + "'");

  Model m;
  m.path_ = path;
  ModelConfig &c = m.config_;
  c.dim = header[0];
  c.hidden_dim = header[1];
  c.n_layers = header[2];
  c.n_heads = header[3];
  c.n_kv_heads = header[4];
  const std::int32_t vocab_field = header[5];
  c.seq_len = header[6];
  c.shared_classifier = vocab_field > 0;
  const std::int64_t vocab = vocab_field < 0 ? -std::int64_t(vocab_field) : vocab_field;

  check_range(path, "dim", c.dim, 1, 1 << 16);
  check_range(path, "hidden_dim", c.hidden_dim, 1, 1 << 20);
  check_range(path, "n_layers", c.n_layers, 1, 4096);
  check_range(path, "n_heads", c.n_heads, 1, 1 << 16);
  check_range(path, "n_kv_heads", c.n_kv_heads, 1, 1 << 16);
  check_range(path, "vocab_size", vocab, 3, 1 << 24);  // ids 0-2: unk, BOS, EOS
  check_range(path, "seq_len", c.seq_len, 1, 1 << 24);
  c.vocab_size = static_cast<int>(vocab);
  if (c.n_kv_heads > c.n_heads || c.n_heads % c.n_kv_heads != 0) {
    throw RunnerError("model '" + path + "': impossible header: n_heads = " +
                      std::to_string(c.n_heads) + " is not a multiple of n_kv_heads = " +
                      std::to_string(c.n_kv_heads));
  }
  if (c.dim % c.n_heads != 0) {
    throw RunnerError("model '" + path + "': impossible header: dim = " + std::to_string(c.dim) +
                      " is not a multiple of n_heads = " + std::to_string(c.n_heads));
  }
  if (c.head_dim() % 2 != 0) {
    throw RunnerError("model '" + path + "': impossible header: head size " +
                      std::to_string(c.head_dim()) + " is odd (RoPE rotates pairs)");
  }
  if (c.head_dim() > 1024) {
    throw RunnerError("model '" + path + "': impossible header: head size " +
                      std::to_string(c.head_dim()) + " exceeds 1024");
  }

  const std::uint64_t floats = expected_floats(c);
  const std::uint64_t want = kHeaderBytes + floats * sizeof(float);
  if (file_size < want) {
    throw RunnerError("model '" + path + "' is truncated: the header (dim " +
                      std::to_string(c.dim) + ", " + std::to_string(c.n_layers) +
                      " layers, vocab " + std::to_string(c.vocab_size) + ") implies " +
                      std::to_string(want) + " bytes, the file has " + std::to_string(file_size));
  }
  if (file_size > want) {
    throw RunnerError("model '" + path + "': file size " + std::to_string(file_size) +
                      " bytes does not match the header, which implies " + std::to_string(want) +
                      " bytes (not a llama2.c checkpoint, or a corrupt header)");
  }
  if (floats > std::numeric_limits<std::size_t>::max() / sizeof(float)) {
    throw RunnerError("model '" + path + "' is too large for this machine");
  }
  try {
    m.data_.resize(static_cast<std::size_t>(floats));
  } catch (const std::bad_alloc &) {
    throw RunnerError("model '" + path + "': out of memory for " + std::to_string(want) + " bytes");
  }
  in.read(reinterpret_cast<char *>(m.data_.data()),
          static_cast<std::streamsize>(floats * sizeof(float)));
  if (!in) throw RunnerError("model '" + path + "': read error (truncated?)");
  m.bind_weights();
  return m;
}

void Model::bind_weights() {
  if (data_.empty()) return;
  const ModelConfig &c = config_;
  const std::size_t dim = c.dim, hidden = c.hidden_dim, layers = c.n_layers;
  const std::size_t kv_dim = c.kv_dim(), vocab = c.vocab_size, head = c.head_dim();
  const float *p = data_.data();
  ModelWeights &w = weights_;
  w.token_embedding = p; p += vocab * dim;
  w.rms_att = p;         p += layers * dim;
  w.wq = p;              p += layers * dim * dim;
  w.wk = p;              p += layers * dim * kv_dim;
  w.wv = p;              p += layers * dim * kv_dim;
  w.wo = p;              p += layers * dim * dim;
  w.rms_ffn = p;         p += layers * dim;
  w.w1 = p;              p += layers * dim * hidden;
  w.w2 = p;              p += layers * hidden * dim;
  w.w3 = p;              p += layers * dim * hidden;
  w.rms_final = p;       p += dim;
  p += std::size_t(c.seq_len) * head;  // freq_cis tables: RoPE is computed, not read
  w.classifier = c.shared_classifier ? w.token_embedding : p;
}

}  // namespace kvc_runner
