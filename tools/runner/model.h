// SPDX-License-Identifier: Apache-2.0
// A model for the runner: a llama2.c checkpoint (legacy .bin format: header of
// seven int32 then float32 weights) or a GGUF file of the LLaMA architecture
// (weights dequantized to f32 at load, tokenizer in its metadata).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace kvc_runner {

/// Hyper-parameters from the checkpoint header, plus derived sizes.
struct ModelConfig {
  int dim = 0;                    ///< width of the residual stream
  int hidden_dim = 0;             ///< width of the SwiGLU feed-forward layer
  int n_layers = 0;               ///< transformer layers
  int n_heads = 0;                ///< query heads
  int n_kv_heads = 0;             ///< key/value heads (GQA when fewer than n_heads)
  int vocab_size = 0;             ///< tokens (always positive here)
  int seq_len = 0;                ///< maximum context
  bool shared_classifier = true;  ///< header vocab_size > 0: logits use the token embedding
  float rope_theta = 10000.0f;    ///< RoPE base
  float norm_eps = 1e-5f;         ///< RMSNorm epsilon
  bool gguf = false;              ///< loaded from a GGUF file
  bool add_bos = true;  ///< sequences start with bos_token (llama2.c: always; GGUF: its metadata)
  int bos_token = 1;

  int head_dim() const { return dim / n_heads; }
  int kv_dim() const { return n_kv_heads * head_dim(); }
  int q_per_kv() const { return n_heads / n_kv_heads; }
};

/// Pointers into Model::data, in llama2.c order. Matrices are row-major [out][in].
struct ModelWeights {
  const float *token_embedding = nullptr;  ///< [vocab][dim]
  const float *rms_att = nullptr;          ///< [layers][dim]
  const float *wq = nullptr;               ///< [layers][dim][dim]
  const float *wk = nullptr;               ///< [layers][kv_dim][dim]
  const float *wv = nullptr;               ///< [layers][kv_dim][dim]
  const float *wo = nullptr;               ///< [layers][dim][dim]
  const float *rms_ffn = nullptr;          ///< [layers][dim]
  const float *w1 = nullptr;               ///< [layers][hidden][dim]
  const float *w2 = nullptr;               ///< [layers][dim][hidden]
  const float *w3 = nullptr;               ///< [layers][hidden][dim]
  const float *rms_final = nullptr;        ///< [dim]
  const float *classifier = nullptr;       ///< [vocab][dim]
};

class Model {
 public:
  /// Loads and validates a checkpoint; throws RunnerError with a clear message.
  static Model load(const std::string &path);

  const ModelConfig &config() const { return config_; }
  const ModelWeights &weights() const { return weights_; }
  const std::string &path() const { return path_; }

  Model(Model &&other) noexcept;
  Model &operator=(Model &&) = delete;
  Model(const Model &) = delete;

 private:
  Model() = default;
  void bind_weights();
  static Model load_gguf(const std::string &path);

  std::string path_;
  ModelConfig config_;
  std::vector<float> data_;  // every float after the header
  bool freq_cis_ = true;     // data_ holds llama2.c's (unused) RoPE tables before the classifier
  ModelWeights weights_;
};

}  // namespace kvc_runner
