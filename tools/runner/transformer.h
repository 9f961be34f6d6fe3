// SPDX-License-Identifier: Apache-2.0
// The llama-2 forward pass of one token (RMSNorm, RoPE, grouped-query
// attention, SwiGLU) over any cache with the interface of kv_cache.h.
// Arithmetic follows llama2.c's reference order (sequential f32 sums), so an
// f32 cache reproduces its outputs bit for bit.
#pragma once

#include <algorithm>
#include <cmath>
#include <vector>

#include "model.h"

namespace kvc_runner {

/// Threads of the BLAS library behind forward_chunk (OpenBLAS); callers that
/// run one forward pass per thread set 1.
void set_blas_threads(int n);

class Transformer {
 public:
  /// `max_positions`: the largest position forward() accepts, plus one
  /// (0: the model's seq_len). Positions past seq_len run outside the
  /// trained context (kvcache eval --long measures what that costs).
  explicit Transformer(const Model &model, int max_positions = 0);
  int max_positions() const { return max_positions_; }

  const ModelConfig &config() const { return config_; }

  /// Runs token `token` at position `pos` (0-based, below max_positions()) and returns
  /// the logits [vocab_size], valid until the next call. The cache must hold
  /// positions 0..pos-1 of this sequence; this call adds position pos.
  template <class Cache>
  const float *forward(Cache &cache, int token, int pos);

  /// Runs `n` tokens at positions [pos, pos + n) at once: the matrix products
  /// as BLAS GEMMs over the chunk (weights read once per chunk, not once per
  /// token) and the library's causal prefill attention over the cache
  /// (AttnSequence). Returns the logits `[n][vocab]`, valid until the next
  /// call. Not bit-identical to forward() (other summation order).
  template <class Cache>
  const float *forward_chunk(Cache &cache, const int *tokens, int n, int pos);

 private:
  void rmsnorm(float *out, const float *x, const float *weight) const;
  static void matmul(float *out, const float *x, const float *w, int n, int d);
  void rope(int pos);
  /// Rotates one head-major row of `n_values` values (q: dim, k: kv_dim) to position `pos`.
  void rope_row(float *v, int n_values, int pos) const;
  /// y[t][out] = sum_i x[t][in_i] w[out][in_i] for t < rows (cblas_sgemm).
  static void gemm(float *y, const float *x, const float *w, int rows, int in, int out);
  void rmsnorm_rows(float *out, const float *x, const float *weight, int rows) const;

  const Model &model_;
  ModelConfig config_;
  int max_positions_ = 0;
  std::vector<float> x_, xb_, xb2_, hb_, hb2_, q_, k_, v_, att_, logits_;
  std::vector<float> rope_cos_, rope_sin_;  // [max_positions][head_dim / 2]
  // Chunk buffers (forward_chunk), grown on demand.
  std::vector<float> cx_, cxb_, cxb2_, cq_, ck_, cv_, ch1_, ch3_, clogits_;
  std::vector<int> crope_;
};

template <class Cache>
const float *Transformer::forward_chunk(Cache &cache, const int *tokens, int n, int pos) {
  const ModelConfig &c = config_;
  const ModelWeights &w = model_.weights();
  const int dim = c.dim, kv_dim = c.kv_dim(), hidden = c.hidden_dim;
  const std::size_t rows = static_cast<std::size_t>(n);
  auto grow = [](std::vector<float> &v, std::size_t size) {
    if (v.size() < size) v.resize(size);
  };
  grow(cx_, rows * dim);
  grow(cxb_, rows * dim);
  grow(cxb2_, rows * dim);
  grow(cq_, rows * dim);
  grow(ck_, rows * kv_dim);
  grow(cv_, rows * kv_dim);
  grow(ch1_, rows * hidden);
  grow(ch3_, rows * hidden);
  grow(clogits_, rows * c.vocab_size);
  crope_.resize(rows);
  for (int t = 0; t < n; ++t) {
    const float *e = w.token_embedding + std::size_t(tokens[t]) * dim;
    std::copy(e, e + dim, &cx_[std::size_t(t) * dim]);
  }
  cache.begin_chunk(pos, n);
  cache.rope_positions(pos, n, crope_.data());
  for (int layer = 0; layer < c.n_layers; ++layer) {
    const std::size_t l = static_cast<std::size_t>(layer);
    rmsnorm_rows(cxb_.data(), cx_.data(), w.rms_att + l * dim, n);
    gemm(cq_.data(), cxb_.data(), w.wq + l * dim * dim, n, dim, dim);
    gemm(ck_.data(), cxb_.data(), w.wk + l * dim * kv_dim, n, dim, kv_dim);
    gemm(cv_.data(), cxb_.data(), w.wv + l * dim * kv_dim, n, dim, kv_dim);
    for (int t = 0; t < n; ++t) {
      rope_row(&cq_[std::size_t(t) * dim], dim, crope_[t]);
      rope_row(&ck_[std::size_t(t) * kv_dim], kv_dim, crope_[t]);
    }
    cache.store_chunk(layer, pos, n, ck_.data(), cv_.data());
    cache.attend_chunk(layer, cq_.data(), n, cxb_.data());
    gemm(cxb2_.data(), cxb_.data(), w.wo + l * dim * dim, n, dim, dim);
    for (std::size_t i = 0; i < rows * dim; ++i) cx_[i] += cxb2_[i];
    rmsnorm_rows(cxb_.data(), cx_.data(), w.rms_ffn + l * dim, n);
    gemm(ch1_.data(), cxb_.data(), w.w1 + l * dim * hidden, n, dim, hidden);
    gemm(ch3_.data(), cxb_.data(), w.w3 + l * dim * hidden, n, dim, hidden);
    for (std::size_t i = 0; i < rows * hidden; ++i) {
      float val = ch1_[i];
      val *= 1.0f / (1.0f + std::exp(-val));  // SiLU
      ch1_[i] = val * ch3_[i];
    }
    gemm(cxb_.data(), ch1_.data(), w.w2 + l * dim * hidden, n, hidden, dim);
    for (std::size_t i = 0; i < rows * dim; ++i) cx_[i] += cxb_[i];
  }
  rmsnorm_rows(cx_.data(), cx_.data(), w.rms_final, n);
  gemm(clogits_.data(), cx_.data(), w.classifier, n, dim, c.vocab_size);
  return clogits_.data();
}

template <class Cache>
const float *Transformer::forward(Cache &cache, int token, int pos) {
  const ModelConfig &c = config_;
  const ModelWeights &w = model_.weights();
  const int dim = c.dim, kv_dim = c.kv_dim(), hidden = c.hidden_dim, head_dim = c.head_dim();
  const int q_per_kv = c.q_per_kv();
  const float sqrt_head = std::sqrt(static_cast<float>(head_dim));

  const float *embedding = w.token_embedding + std::size_t(token) * dim;
  for (int i = 0; i < dim; ++i) x_[i] = embedding[i];
  cache.begin_token(pos);
  // Caches that run attention themselves (the library's kvc_attention_decode)
  // may also place tokens at other RoPE positions (StreamingLLM).
  constexpr bool kLibraryAttention = requires(Cache & ch, const float *qq, float *o) {
    ch.attend(0, qq, o);
    ch.rope_position(0);
  };
  int rope_pos = pos;
  if constexpr (kLibraryAttention) rope_pos = cache.rope_position(pos);

  for (int layer = 0; layer < c.n_layers; ++layer) {
    const std::size_t l = static_cast<std::size_t>(layer);
    rmsnorm(xb_.data(), x_.data(), w.rms_att + l * dim);
    matmul(q_.data(), xb_.data(), w.wq + l * dim * dim, dim, dim);
    matmul(k_.data(), xb_.data(), w.wk + l * dim * kv_dim, dim, kv_dim);
    matmul(v_.data(), xb_.data(), w.wv + l * dim * kv_dim, dim, kv_dim);
    rope(rope_pos);
    // Caches that watch the queries (calibration of query-weighted key smoothing).
    if constexpr (requires(Cache & ch, const float *qq) { ch.observe_query(0, 0, qq); })
      cache.observe_query(layer, rope_pos, q_.data());
    cache.store(layer, pos, k_.data(), v_.data());
    if constexpr (kLibraryAttention) {
      cache.attend(layer, q_.data(), xb_.data());
    } else {
      // Attention, one KV head at a time: the q_per_kv query heads that share
      // it score and mix each cached row in one pass over the cache.
      const int n = pos + 1;
      const std::size_t att_stride = static_cast<std::size_t>(max_positions_);
      for (int kv_head = 0; kv_head < c.n_kv_heads; ++kv_head) {
        const int h0 = kv_head * q_per_kv;
        const float *q0 = &q_[std::size_t(h0) * head_dim];
        float *att0 = &att_[std::size_t(h0) * att_stride];
        cache.for_each_key(
            layer, n, kv_head,
            [&](int t0, int count, const float *__restrict rows, std::size_t stride) {
              float *__restrict att = att0 + t0;
              for (int r = 0; r < count; ++r) {
                const float *key = rows + std::size_t(r) * stride;
                for (int g = 0; g < q_per_kv; ++g) {
                  const float *q = q0 + std::size_t(g) * head_dim;
                  float score = 0.0f;
                  for (int i = 0; i < head_dim; ++i) score += q[i] * key[i];
                  att[g * att_stride + r] = score / sqrt_head;
                }
              }
            });
        for (int g = 0; g < q_per_kv; ++g) {
          float *att = att0 + g * att_stride;
          float max_score = att[0];
          for (int t = 1; t < n; ++t) {
            if (att[t] > max_score) max_score = att[t];
          }
          float sum = 0.0f;
          for (int t = 0; t < n; ++t) {
            att[t] = std::exp(att[t] - max_score);
            sum += att[t];
          }
          for (int t = 0; t < n; ++t) att[t] /= sum;
        }
        float *out0 = &xb_[std::size_t(h0) * head_dim];
        for (int i = 0; i < q_per_kv * head_dim; ++i) out0[i] = 0.0f;
        cache.for_each_value(
            layer, n, kv_head,
            [&](int t0, int count, const float *__restrict rows, std::size_t stride) {
              for (int g = 0; g < q_per_kv; ++g) {
                const float *__restrict a = att0 + g * att_stride + t0;
                float *__restrict out = out0 + std::size_t(g) * head_dim;
                for (int r = 0; r < count; ++r) {
                  const float *value = rows + std::size_t(r) * stride;
                  for (int i = 0; i < head_dim; ++i) out[i] += a[r] * value[i];
                }
              }
            });
      }
    }  // library attention
    matmul(xb2_.data(), xb_.data(), w.wo + l * dim * dim, dim, dim);
    for (int i = 0; i < dim; ++i) x_[i] += xb2_[i];

    rmsnorm(xb_.data(), x_.data(), w.rms_ffn + l * dim);
    matmul(hb_.data(), xb_.data(), w.w1 + l * dim * hidden, dim, hidden);
    matmul(hb2_.data(), xb_.data(), w.w3 + l * dim * hidden, dim, hidden);
    for (int i = 0; i < hidden; ++i) {
      float val = hb_[i];
      val *= 1.0f / (1.0f + std::exp(-val));  // SiLU
      hb_[i] = val * hb2_[i];
    }
    matmul(xb_.data(), hb_.data(), w.w2 + l * dim * hidden, hidden, dim);
    for (int i = 0; i < dim; ++i) x_[i] += xb_[i];
  }
  rmsnorm(x_.data(), x_.data(), w.rms_final);
  matmul(logits_.data(), x_.data(), w.classifier, dim, c.vocab_size);
  return logits_.data();
}

}  // namespace kvc_runner
