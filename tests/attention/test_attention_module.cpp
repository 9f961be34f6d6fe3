// White-box tests of src/attention alone: attend() and attend_threads() over
// a TileSource of plain arrays (no pool), against a float64 softmax, with
// tiles of odd sizes, grouped-query heads, causal prefill, observation and
// empty sequences. ctest names: attention_module_<test>.
#include <cmath>
#include <cstdint>
#include <limits>
#include <mutex>
#include <random>
#include <vector>

#include "../whitebox.h"
#include "attention/attention.h"

namespace {

using kvc::attention::Shape;
using kvc::attention::TileSource;

// K and V [n][kv_heads][head_dim] in memory, read at most `tile` tokens at a time.
class ArraySource final : public TileSource {
 public:
  ArraySource(const std::vector<float> &k, const std::vector<float> &v, uint64_t row, uint64_t tile)
      : k_(k), v_(v), row_(row), tile_(tile) {}
  uint64_t read(uint64_t t0, uint64_t max_count, float *kt, float *vt) const override {
    const uint64_t c = std::min(max_count, tile_ - t0 % tile_);  // tile boundaries, like blocks
    for (uint64_t i = 0; i < c * row_; ++i) {
      kt[i] = k_[t0 * row_ + i];
      vt[i] = v_[t0 * row_ + i];
    }
    ++reads;
    return c;
  }
  mutable uint64_t reads = 0;

 private:
  const std::vector<float> &k_, &v_;
  uint64_t row_, tile_;
};

struct Case {
  uint64_t q_heads, kv_heads, head_dim, n, tile;
};

std::vector<float> randoms(uint64_t n, uint32_t seed, float scale) {
  std::mt19937 g(seed);
  std::uniform_real_distribution<float> d(-scale, scale);
  std::vector<float> v(n);
  for (float &x : v) x = d(g);
  return v;
}

// float64 attention of query row i (seeing tokens [0, vis)) of head h; probabilities into p.
void reference(const Case &c, const std::vector<float> &q, const std::vector<float> &k,
               const std::vector<float> &v, uint64_t i, uint64_t h, uint64_t vis, double *out,
               double *lse, std::vector<double> *p) {
  const uint64_t g = h / (c.q_heads / c.kv_heads), row = c.kv_heads * c.head_dim;
  std::vector<double> s(vis);
  double mx = -std::numeric_limits<double>::infinity();
  for (uint64_t t = 0; t < vis; ++t) {
    double d = 0;
    for (uint64_t e = 0; e < c.head_dim; ++e)
      d += double(q[(i * c.q_heads + h) * c.head_dim + e]) * k[t * row + g * c.head_dim + e];
    s[t] = d;
    mx = std::max(mx, d);
  }
  double sum = 0;
  for (uint64_t t = 0; t < vis; ++t) sum += std::exp(s[t] - mx);
  for (uint64_t e = 0; e < c.head_dim; ++e) out[e] = 0;
  if (p) p->assign(vis, 0.0);
  for (uint64_t t = 0; t < vis; ++t) {
    const double pt = std::exp(s[t] - mx) / sum;
    if (p) (*p)[t] = pt;
    for (uint64_t e = 0; e < c.head_dim; ++e) out[e] += pt * v[t * row + g * c.head_dim + e];
  }
  *lse = vis ? mx + std::log(sum) : -std::numeric_limits<double>::infinity();
}

void check_rows(const Case &c, const std::vector<float> &q, const std::vector<float> &k,
                const std::vector<float> &v, uint64_t n_q, bool prefill, const std::vector<float> &out,
                const std::vector<float> &lse) {
  std::vector<double> ref(c.head_dim);
  for (uint64_t i = 0; i < n_q; ++i)
    for (uint64_t h = 0; h < c.q_heads; ++h) {
      const uint64_t vis = prefill ? c.n - n_q + i + 1 : c.n;
      double l = 0;
      reference(c, q, k, v, i, h, vis, ref.data(), &l, nullptr);
      for (uint64_t e = 0; e < c.head_dim; ++e)
        CHECK_NEAR(out[(i * c.q_heads + h) * c.head_dim + e], ref[e], 2e-5);
      CHECK_NEAR(lse[i * c.q_heads + h], l, 2e-5);
    }
}

const Case kCases[] = {{8, 2, 16, 37, 5}, {4, 4, 8, 64, 16}, {12, 3, 32, 1, 7}, {2, 1, 64, 130, 33}};

}  // namespace

// Decode: one query row sees every token; tiles of 5, 16, 7 and 33 tokens.
KVTEST(decode_matches_float64) {
  for (const Case &c : kCases) {
    const uint64_t row = c.kv_heads * c.head_dim;
    const auto k = randoms(c.n * row, 1, 1.0f), v = randoms(c.n * row, 2, 2.0f);
    const auto q = randoms(c.q_heads * c.head_dim, 3, 0.5f);
    ArraySource src(k, v, row, c.tile);
    std::vector<float> out(c.q_heads * c.head_dim), lse(c.q_heads);
    const Shape sh{c.q_heads, c.kv_heads, c.head_dim, c.tile};
    kvc::attention::attend(sh, src, c.n, q.data(), 1, false, out.data(), lse.data(), nullptr, 0, nullptr);
    check_rows(c, q, k, v, 1, false, out, lse);
    CHECK(src.reads == (c.n + c.tile - 1) / c.tile);  // each tile read once for the row
  }
}

// Prefill: the last n_q tokens' queries, each seeing its causal prefix.
KVTEST(prefill_causal_matches_float64) {
  for (const Case &c : kCases) {
    const uint64_t row = c.kv_heads * c.head_dim, n_q = std::min<uint64_t>(c.n, 9);
    const auto k = randoms(c.n * row, 4, 1.0f), v = randoms(c.n * row, 5, 1.0f);
    const auto q = randoms(n_q * c.q_heads * c.head_dim, 6, 0.5f);
    ArraySource src(k, v, row, c.tile);
    std::vector<float> out(n_q * c.q_heads * c.head_dim), lse(n_q * c.q_heads);
    const Shape sh{c.q_heads, c.kv_heads, c.head_dim, c.tile};
    kvc::attention::attend(sh, src, c.n, q.data(), n_q, true, out.data(), lse.data(), nullptr, 0, nullptr);
    check_rows(c, q, k, v, n_q, true, out, lse);
  }
}

// Observation: every observed row adds its probabilities, summed over the
// query heads of each KV head, to obs[token][kv_head]; rows before
// observe_from add nothing.
KVTEST(observation_adds_probabilities) {
  const Case c{8, 2, 16, 29, 6};
  const uint64_t row = c.kv_heads * c.head_dim, n_q = 5, from = 2;
  const auto k = randoms(c.n * row, 7, 1.0f), v = randoms(c.n * row, 8, 1.0f);
  const auto q = randoms(n_q * c.q_heads * c.head_dim, 9, 0.7f);
  ArraySource src(k, v, row, c.tile);
  std::vector<float> out(n_q * c.q_heads * c.head_dim), lse(n_q * c.q_heads);
  std::vector<float> obs(c.n * c.kv_heads, 1.0f);  // starts at 1: the call adds
  std::mutex mu;
  const Shape sh{c.q_heads, c.kv_heads, c.head_dim, c.tile};
  kvc::attention::attend(sh, src, c.n, q.data(), n_q, true, out.data(), lse.data(), obs.data(), from, &mu);
  std::vector<double> want(c.n * c.kv_heads, 1.0), ref(c.head_dim), p;
  for (uint64_t i = from; i < n_q; ++i)
    for (uint64_t h = 0; h < c.q_heads; ++h) {
      double l = 0;
      reference(c, q, k, v, i, h, c.n - n_q + i + 1, ref.data(), &l, &p);
      for (uint64_t t = 0; t < p.size(); ++t) want[t * c.kv_heads + h / (c.q_heads / c.kv_heads)] += p[t];
    }
  for (uint64_t i = 0; i < want.size(); ++i) CHECK_NEAR(obs[i], want[i], 2e-5);
}

// Split-K over threads equals one pass (within the log-sum-exp merge's rounding).
KVTEST(threads_match_one_pass) {
  const Case c{8, 2, 32, 1500, 16};
  const uint64_t row = c.kv_heads * c.head_dim, seqs = 3;
  std::vector<std::vector<float>> ks, vs;
  for (uint32_t s = 0; s < seqs; ++s) {
    ks.push_back(randoms((c.n - s * 400) * row, 10 + s, 1.0f));
    vs.push_back(randoms((c.n - s * 400) * row, 20 + s, 1.0f));
  }
  std::vector<ArraySource> srcs;
  std::vector<const TileSource *> ptrs;
  std::vector<uint64_t> ns;
  for (uint32_t s = 0; s < seqs; ++s) {
    srcs.emplace_back(ks[s], vs[s], row, c.tile);
    ns.push_back(c.n - s * 400);
  }
  for (auto &s : srcs) ptrs.push_back(&s);
  const auto q = randoms(seqs * c.q_heads * c.head_dim, 30, 0.5f);
  const Shape sh{c.q_heads, c.kv_heads, c.head_dim, c.tile};
  std::vector<float> out(q.size()), lse(seqs * c.q_heads), one(q.size()), lse1(lse.size());
  kvc::attention::attend_threads(sh, ptrs, ns, q.data(), out.data(), lse.data(), 4);
  for (uint32_t s = 0; s < seqs; ++s)
    kvc::attention::attend(sh, srcs[s], ns[s], q.data() + s * c.q_heads * c.head_dim, 1, false,
                           one.data() + s * c.q_heads * c.head_dim, lse1.data() + s * c.q_heads, nullptr, 0,
                           nullptr);
  for (size_t i = 0; i < out.size(); ++i) CHECK_NEAR(out[i], one[i], 1e-5);
  for (size_t i = 0; i < lse.size(); ++i) CHECK_NEAR(lse[i], lse1[i], 1e-5);
}

// A sequence with no tokens: zeros and a log-sum-exp of -inf, nothing read.
KVTEST(empty_sequence) {
  const Case c{4, 2, 8, 0, 4};
  std::vector<float> k, v;
  ArraySource src(k, v, c.kv_heads * c.head_dim, c.tile);
  const auto q = randoms(c.q_heads * c.head_dim, 40, 1.0f);
  std::vector<float> out(q.size(), 7.0f), lse(c.q_heads, 7.0f);
  const Shape sh{c.q_heads, c.kv_heads, c.head_dim, c.tile};
  kvc::attention::attend(sh, src, 0, q.data(), 1, false, out.data(), lse.data(), nullptr, 0, nullptr);
  for (float x : out) CHECK(x == 0.0f);
  for (float x : lse) CHECK(std::isinf(x) && x < 0);
  CHECK(src.reads == 0);
}

int main(int argc, char **argv) { return kvtest_main(argc, argv); }
