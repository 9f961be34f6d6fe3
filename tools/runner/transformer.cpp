// SPDX-License-Identifier: Apache-2.0
#include "transformer.h"

#include <cblas.h>

#include "error.h"

namespace kvc_runner {

Transformer::Transformer(const Model &model, int max_positions)
    : model_(model),
      config_(model.config()),
      max_positions_(max_positions > 0 ? max_positions : model.config().seq_len) {
  const ModelConfig &c = config_;
  const int n_pos = max_positions_;
  x_.resize(c.dim);
  xb_.resize(c.dim);
  xb2_.resize(c.dim);
  hb_.resize(c.hidden_dim);
  hb2_.resize(c.hidden_dim);
  q_.resize(c.dim);
  k_.resize(c.kv_dim());
  v_.resize(c.kv_dim());
  att_.resize(std::size_t(c.n_heads) * n_pos);
  logits_.resize(c.vocab_size);
  // RoPE angles: pair (2i, 2i+1) of a head turns by pos * theta^(-2i / head_dim)
  // (GGUF LLaMA weights are permuted at conversion so that this pairing holds).
  const int half = c.head_dim() / 2;
  rope_cos_.resize(std::size_t(n_pos) * half);
  rope_sin_.resize(std::size_t(n_pos) * half);
  for (int pos = 0; pos < n_pos; ++pos) {
    for (int i = 0; i < half; ++i) {
      const float freq = 1.0f / std::pow(c.rope_theta, static_cast<float>(2 * i) /
                                                           static_cast<float>(c.head_dim()));
      const float angle = static_cast<float>(pos) * freq;
      rope_cos_[std::size_t(pos) * half + i] = std::cos(angle);
      rope_sin_[std::size_t(pos) * half + i] = std::sin(angle);
    }
  }
}

void Transformer::rmsnorm(float *out, const float *x, const float *weight) const {
  const int n = config_.dim;
  float ss = 0.0f;
  for (int i = 0; i < n; ++i) ss += x[i] * x[i];
  ss /= static_cast<float>(n);
  ss += config_.norm_eps;
  ss = 1.0f / std::sqrt(ss);
  for (int i = 0; i < n; ++i) out[i] = weight[i] * (ss * x[i]);
}

// out[d] = W[d][n] x[n]. Four rows at a time for instruction-level
// parallelism; each row is still summed in order, so results are unchanged.
void Transformer::matmul(float *out, const float *x, const float *w, int n, int d) {
  int i = 0;
  for (; i + 4 <= d; i += 4) {
    const float *w0 = w + std::size_t(i) * n, *w1 = w0 + n, *w2 = w1 + n, *w3 = w2 + n;
    float s0 = 0.0f, s1 = 0.0f, s2 = 0.0f, s3 = 0.0f;
    for (int j = 0; j < n; ++j) {
      const float xj = x[j];
      s0 += w0[j] * xj;
      s1 += w1[j] * xj;
      s2 += w2[j] * xj;
      s3 += w3[j] * xj;
    }
    out[i] = s0;
    out[i + 1] = s1;
    out[i + 2] = s2;
    out[i + 3] = s3;
  }
  for (; i < d; ++i) {
    const float *row = w + std::size_t(i) * n;
    float s = 0.0f;
    for (int j = 0; j < n; ++j) s += row[j] * x[j];
    out[i] = s;
  }
}

void set_blas_threads(int n) {
  openblas_set_num_threads(n);
}

void Transformer::gemm(float *y, const float *x, const float *w, int rows, int in, int out) {
  // Row-major: Y[rows][out] = X[rows][in] * W[out][in]^T.
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, rows, out, in, 1.0f, x, in, w, in, 0.0f, y,
              out);
}

void Transformer::rmsnorm_rows(float *out, const float *x, const float *weight, int rows) const {
  for (int t = 0; t < rows; ++t)
    rmsnorm(out + std::size_t(t) * config_.dim, x + std::size_t(t) * config_.dim, weight);
}

void Transformer::rope_row(float *vec, int n, int pos) const {
  if (pos < 0 || pos >= max_positions_)
    throw RunnerError("position " + std::to_string(pos) + " is beyond the RoPE table");
  const int head_dim = config_.head_dim(), half = head_dim / 2;
  const float *cos_row = &rope_cos_[std::size_t(pos) * half];
  const float *sin_row = &rope_sin_[std::size_t(pos) * half];
  for (int i = 0; i < n; i += 2) {
    const int pair = (i % head_dim) / 2;
    const float c = cos_row[pair], s = sin_row[pair];
    const float a = vec[i], b = vec[i + 1];
    vec[i] = a * c - b * s;
    vec[i + 1] = a * s + b * c;
  }
}

void Transformer::rope(int pos) {
  const int head_dim = config_.head_dim(), half = head_dim / 2;
  const float *cos_row = &rope_cos_[std::size_t(pos) * half];
  const float *sin_row = &rope_sin_[std::size_t(pos) * half];
  auto rotate = [&](float *vec, int n) {
    for (int i = 0; i < n; i += 2) {
      const int pair = (i % head_dim) / 2;
      const float c = cos_row[pair], s = sin_row[pair];
      const float a = vec[i], b = vec[i + 1];
      vec[i] = a * c - b * s;
      vec[i + 1] = a * s + b * c;
    }
  };
  rotate(q_.data(), config_.dim);
  rotate(k_.data(), config_.kv_dim());
}

}  // namespace kvc_runner
