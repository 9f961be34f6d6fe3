// SPDX-License-Identifier: Apache-2.0
#include "model.h"

#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>

#include "error.h"
#include "gguf.h"

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
  std::uint64_t n = vocab * dim;               // token embedding
  n += layers * dim;                           // rms_att
  n += layers * dim * dim;                     // wq
  n += 2 * layers * dim * kv_dim;              // wk, wv
  n += layers * dim * dim;                     // wo
  n += layers * dim;                           // rms_ffn
  n += 3 * layers * dim * hidden;              // w1, w2, w3
  n += dim;                                    // rms_final
  n += std::uint64_t(c.seq_len) * head;        // freq_cis real + imag (seq_len * head/2 each)
  if (!c.shared_classifier) n += vocab * dim;  // wcls
  return n;
}

}  // namespace

Model::Model(Model &&other) noexcept
    : path_(std::move(other.path_)),
      config_(other.config_),
      data_(std::move(other.data_)),
      freq_cis_(other.freq_cis_) {
  bind_weights();
}

Model Model::load(const std::string &path) {
  std::error_code ec;
  if (std::filesystem::is_directory(path, ec))
    throw RunnerError("cannot read model file '" + path + "': it is a directory");
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    throw RunnerError("cannot open model file '" + path + "': " + std::strerror(errno));
  }
  {
    char magic[4] = {0, 0, 0, 0};
    in.read(magic, 4);
    if (in && std::memcmp(magic, "GGUF", 4) == 0) return load_gguf(path);
    in.clear();
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
    throw RunnerError("model '" + path +
                      "': impossible header: n_heads = " + std::to_string(c.n_heads) +
                      " is not a multiple of n_kv_heads = " + std::to_string(c.n_kv_heads));
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

Model Model::load_gguf(const std::string &path) {
  const GgufFile g = GgufFile::load(path);
  const std::string arch = g.get_string("general.architecture");
  if (arch != "llama") {
    throw RunnerError("model '" + path + "': architecture '" + arch + "' is not supported (llama)");
  }
  Model m;
  m.path_ = path;
  ModelConfig &c = m.config_;
  c.gguf = true;
  auto geti = [&](const char *key, std::int64_t lo, std::int64_t hi) {
    const std::int64_t v = g.get_int(key);
    check_range(path, key, v, lo, hi);
    return static_cast<int>(v);
  };
  c.dim = geti("llama.embedding_length", 1, 1 << 16);
  c.hidden_dim = geti("llama.feed_forward_length", 1, 1 << 20);
  c.n_layers = geti("llama.block_count", 1, 4096);
  c.n_heads = geti("llama.attention.head_count", 1, 1 << 16);
  c.n_kv_heads = g.has("llama.attention.head_count_kv")
                     ? geti("llama.attention.head_count_kv", 1, 1 << 16)
                     : c.n_heads;
  c.seq_len = geti("llama.context_length", 1, 1 << 24);
  const std::vector<std::string> &tokens = g.get_strings("tokenizer.ggml.tokens");
  check_range(path, "tokenizer.ggml.tokens (vocabulary size)",
              static_cast<std::int64_t>(tokens.size()), 3, 1 << 24);
  c.vocab_size = static_cast<int>(tokens.size());
  if (g.has("llama.vocab_size") && g.get_int("llama.vocab_size") != c.vocab_size)
    throw RunnerError("model '" + path + "': llama.vocab_size does not match the tokenizer's " +
                      std::to_string(c.vocab_size) + " tokens");
  c.rope_theta = g.has("llama.rope.freq_base")
                     ? static_cast<float>(g.get_float("llama.rope.freq_base"))
                     : 10000.0f;
  c.norm_eps = static_cast<float>(g.get_float("llama.attention.layer_norm_rms_epsilon"));
  if (!(c.rope_theta > 1.0f) || !(c.norm_eps > 0.0f && c.norm_eps < 1.0f))
    throw RunnerError("model '" + path + "': impossible rope.freq_base or layer_norm_rms_epsilon");
  if (c.n_kv_heads > c.n_heads || c.n_heads % c.n_kv_heads != 0 || c.dim % c.n_heads != 0 ||
      c.head_dim() % 2 != 0 || c.head_dim() > 1024)
    throw RunnerError("model '" + path + "': impossible head geometry (dim " +
                      std::to_string(c.dim) + ", " + std::to_string(c.n_heads) + " heads, " +
                      std::to_string(c.n_kv_heads) + " KV heads)");
  if (g.has("llama.rope.dimension_count") &&
      g.get_int("llama.rope.dimension_count") != c.head_dim())
    throw RunnerError("model '" + path +
                      "': partial RoPE (rope.dimension_count != head size) is not supported");
  c.add_bos = g.get_bool("tokenizer.ggml.add_bos_token", true);
  c.bos_token = g.has("tokenizer.ggml.bos_token_id")
                    ? static_cast<int>(g.get_int("tokenizer.ggml.bos_token_id"))
                    : 1;
  if (c.bos_token < 0 || c.bos_token >= c.vocab_size)
    throw RunnerError("model '" + path + "': bos_token_id out of range");
  const GgufTensor *out = g.find("output.weight");
  c.shared_classifier = out == nullptr;

  // The llama2.c order of Model::data (see bind_weights), dequantized to f32.
  const std::uint64_t dim = c.dim, hidden = c.hidden_dim, kv = c.kv_dim(), vocab = c.vocab_size;
  auto append = [&](const std::string &name, std::vector<std::uint64_t> ne) {
    g.dequantize_into(g.require(name, ne), m.data_);
  };
  auto per_layer = [&](const char *suffix, std::vector<std::uint64_t> ne) {
    for (int l = 0; l < c.n_layers; ++l) append("blk." + std::to_string(l) + "." + suffix, ne);
  };
  try {
    m.data_.reserve(static_cast<std::size_t>(
        vocab * dim * (c.shared_classifier ? 1 : 2) +
        std::uint64_t(c.n_layers) * (2 * dim * dim + 2 * dim * kv + 3 * dim * hidden + 2 * dim) +
        dim));
    append("token_embd.weight", {dim, vocab});
    per_layer("attn_norm.weight", {dim});
    per_layer("attn_q.weight", {dim, dim});
    per_layer("attn_k.weight", {dim, kv});
    per_layer("attn_v.weight", {dim, kv});
    per_layer("attn_output.weight", {dim, dim});
    per_layer("ffn_norm.weight", {dim});
    per_layer("ffn_gate.weight", {dim, hidden});
    per_layer("ffn_down.weight", {hidden, dim});
    per_layer("ffn_up.weight", {dim, hidden});
    append("output_norm.weight", {dim});
    if (!c.shared_classifier) append("output.weight", {dim, vocab});
  } catch (const std::bad_alloc &) {
    throw RunnerError("model '" + path + "': out of memory for its weights in f32");
  }
  m.freq_cis_ = false;
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
  w.token_embedding = p;
  p += vocab * dim;
  w.rms_att = p;
  p += layers * dim;
  w.wq = p;
  p += layers * dim * dim;
  w.wk = p;
  p += layers * dim * kv_dim;
  w.wv = p;
  p += layers * dim * kv_dim;
  w.wo = p;
  p += layers * dim * dim;
  w.rms_ffn = p;
  p += layers * dim;
  w.w1 = p;
  p += layers * dim * hidden;
  w.w2 = p;
  p += layers * hidden * dim;
  w.w3 = p;
  p += layers * dim * hidden;
  w.rms_final = p;
  p += dim;
  if (freq_cis_)
    p += std::size_t(c.seq_len) * head;  // llama2.c's freq_cis tables: RoPE is computed, not read
  w.classifier = c.shared_classifier ? w.token_embedding : p;
}

}  // namespace kvc_runner
