// codec_sinks_adv: adversarial random operations on pools with attention
// sinks (residual_sinks): many geometries (sinks = block_size, one layer,
// more layers than a sink block holds, per-channel groups, hybrid fractions,
// bf16 / f32 residuals), out-of-order appends, rewrites of encoded sinks,
// truncation anywhere, forks at every stage, save / restore round trips and
// damaged records (checksum recomputed, so the parser sees the damage),
// attention against a reference over kvc_gather(), and a small residual
// arena so reserves and forks run out. After every call: the internal
// invariants; failed calls must leave the pool as it was; every written
// position reads back (sinks exactly as residual_dtype).
#include <kvcache/kvcache.h>
#include <xxhash.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "api/internal.h"

#include "../whitebox.h"

namespace {
std::map<std::string, uint64_t> g_count;  // outcomes seen (printed with -v)
const bool g_trace = std::getenv("SINKS_ADV_TRACE") != nullptr;
#define TRACE(...)                         \
  do {                                     \
    if (g_trace) std::fprintf(stderr, __VA_ARGS__); \
  } while (0)

struct Cfg {
  const char *name;
  uint32_t layers, heads, dim, block, sinks;
  kvc_dtype kd, vd;          // codec dtypes (F16 = plain)
  kvc_granularity kg, vg;    // granularity
  uint32_t group;            // per-channel / per-group size
  uint32_t window;
  double fraction;
  kvc_dtype res;
  uint64_t blocks, res_blocks;
  float tol;
};

float value(int64_t tag, uint64_t pos, uint32_t e, int kv) {
  return 1.3f * std::sin(0.131f * static_cast<float>(pos) + 0.77f * static_cast<float>(e) +
                         0.37f * static_cast<float>(tag % 11) + (kv ? 1.1f : 0.0f));
}

float round_to(float x, kvc_dtype d) {
  if (d == KVC_DTYPE_F32) return x;
  uint16_t h;
  float r;
  kvc_convert(&x, KVC_DTYPE_F32, &h, d, 1);
  kvc_convert(&h, d, &r, KVC_DTYPE_F32, 1);
  return r;
}

struct Seq {
  std::vector<std::vector<int64_t>> tags;  // [layer][pos], -1: reserved, not written
  uint64_t len() const { return tags[0].size(); }
};

struct Snapshot {
  kvc_stats st;
  std::map<uint64_t, std::vector<float>> data;
  std::map<uint64_t, uint64_t> lens;
};

class Fuzz {
 public:
  Fuzz(const Cfg &c, uint32_t seed) : c_(c), rng_(seed) {
    row_ = c.heads * c.dim;
    kvc_codec_init(&k_);
    kvc_codec_init(&v_);
    setup(&k_, c.kd, c.kg);
    setup(&v_, c.vd, c.vg);
    kvc_pool_config pc;
    kvc_pool_config_init(&pc);
    pc.num_layers = c.layers;
    pc.num_q_heads = pc.num_kv_heads = c.heads;
    pc.head_dim = c.dim;
    pc.block_size = c.block;
    pc.num_blocks = c.blocks;
    pc.num_residual_blocks = c.res_blocks;
    pc.k_codec = c.kd == KVC_DTYPE_F16 ? nullptr : &k_;
    pc.v_codec = c.vd == KVC_DTYPE_F16 ? nullptr : &v_;
    pc.residual_window = c.window;
    pc.residual_fraction = c.fraction;
    pc.residual_dtype = c.res;
    pc.residual_sinks = c.sinks;
    cfg_ = pc;
    const kvc_status st = kvc_pool_create(&pc, &p_);
    CHECKF(st == KVC_OK, "%s: create", c.name);
    channel_ = c.kg == KVC_SCALE_PER_CHANNEL || c.vg == KVC_SCALE_PER_CHANNEL;
  }
  ~Fuzz() {
    if (p_) kvc_pool_destroy(p_);
  }
  void setup(kvc_codec *cd, kvc_dtype d, kvc_granularity g) {
    cd->dtype = d;
    cd->granularity = g;
    if (g == KVC_SCALE_PER_CHANNEL) {
      cd->group_size = c_.group;
      cd->asymmetric = 1;
    } else if (g == KVC_SCALE_PER_GROUP) {
      cd->group_size = c_.group;
    }
  }

  void fill(int64_t tag, uint64_t pos, uint64_t n, std::vector<float> &kb, std::vector<float> &vb) {
    kb.resize(n * row_);
    vb.resize(n * row_);
    for (uint64_t t = 0; t < n; ++t)
      for (uint32_t e = 0; e < row_; ++e) {
        kb[t * row_ + e] = value(tag, pos + t, e, 0);
        vb[t * row_ + e] = value(tag, pos + t, e, 1);
      }
  }

  Snapshot snap() {
    Snapshot s;
    kvc_stats_init(&s.st);
    kvc_pool_stats(p_, &s.st);
    for (auto &[id, sq] : m_) {
      uint64_t len = 0;
      kvc_seq_length(p_, id, &len);
      s.lens[id] = len;
      std::vector<float> &d = s.data[id];
      for (uint32_t l = 0; l < c_.layers; ++l) {
        uint64_t n = 0;
        kvc_seq_layer_tokens(p_, id, l, &n);
        std::vector<float> ko(n * row_ + 1), vo(n * row_ + 1);
        if (n) kvc_gather(p_, id, l, 0, n, ko.data(), vo.data(), KVC_DTYPE_F32, nullptr);
        d.insert(d.end(), ko.begin(), ko.begin() + n * row_);
        d.insert(d.end(), vo.begin(), vo.begin() + n * row_);
      }
    }
    return s;
  }
  void same(const Snapshot &a, const char *what) {
    Snapshot b = snap();
    CHECKF(a.st.residual_blocks_used == b.st.residual_blocks_used && a.st.blocks_used == b.st.blocks_used &&
              a.st.tokens_stored == b.st.tokens_stored && a.st.num_sequences == b.st.num_sequences,
           "%s: failed %s changed the pool's counts (res %llu -> %llu, blocks %llu -> %llu)", c_.name, what,
           (unsigned long long)a.st.residual_blocks_used, (unsigned long long)b.st.residual_blocks_used,
           (unsigned long long)a.st.blocks_used, (unsigned long long)b.st.blocks_used);
    CHECKF(a.lens == b.lens, "%s: failed %s changed a length", c_.name, what);
    bool eq = a.data.size() == b.data.size();
    for (auto &[id, d] : a.data) {
      auto it = b.data.find(id);
      eq = eq && it != b.data.end() && it->second.size() == d.size() &&
           (d.empty() || std::memcmp(d.data(), it->second.data(), d.size() * 4) == 0);
    }
    CHECKF(eq, "%s: failed %s changed the data", c_.name, what);
  }

  void verify(const char *after) {
    const std::string inv = kvc::api::core_pool(p_).check_invariants();
    CHECKF(inv.empty(), "%s after %s: %s", c_.name, after, inv.c_str());
    for (auto &[id, sq] : m_) {
      uint64_t len = 0;
      CHECKF(kvc_seq_length(p_, id, &len) == KVC_OK && len == sq.len(), "%s: length of %llu", c_.name,
             (unsigned long long)id);
      if (!len) continue;
      std::vector<float> ko(len * row_), vo(len * row_);
      for (uint32_t l = 0; l < c_.layers; ++l) {
        CHECKF(kvc_gather(p_, id, l, 0, len, ko.data(), vo.data(), KVC_DTYPE_F32, nullptr) == KVC_OK, "gather");
        {  // a sub-range, K or V only, as f16 / bf16: the same values
          const uint64_t first = rng_() % len, n = 1 + rng_() % (len - first);
          const kvc_dtype dt = static_cast<kvc_dtype>(rng_() % 3);
          const int which = static_cast<int>(rng_() % 3);  // 0 both, 1 K only, 2 V only
          std::vector<uint8_t> ks(n * row_ * 4), vs(n * row_ * 4);
          std::vector<float> kf(n * row_), vf(n * row_);
          CHECKF(kvc_gather(p_, id, l, first, n, which == 2 ? nullptr : ks.data(), which == 1 ? nullptr : vs.data(),
                           dt, nullptr) == KVC_OK,
                 "gather range");
          kvc_convert(ks.data(), dt, kf.data(), KVC_DTYPE_F32, n * row_);
          kvc_convert(vs.data(), dt, vf.data(), KVC_DTYPE_F32, n * row_);
          for (uint64_t i = 0; i < n * row_; ++i) {
            const float wk = round_to(ko[first * row_ + i], dt), wv = round_to(vo[first * row_ + i], dt);
            if ((which != 2 && kf[i] != wk) || (which != 1 && vf[i] != wv)) {
              CHECKF(false, "%s after %s: gather of [%llu, +%llu) as dtype %d differs at %llu", c_.name, after,
                     (unsigned long long)first, (unsigned long long)n, (int)dt, (unsigned long long)i);
              return;
            }
          }
        }
        for (uint64_t t = 0; t < len; ++t) {
          const int64_t tag = sq.tags[l][t];
          if (tag < 0) continue;
          for (uint32_t e = 0; e < row_; ++e) {
            const float ek = value(tag, t, e, 0), ev = value(tag, t, e, 1);
            const float gk = ko[t * row_ + e], gv = vo[t * row_ + e];
            if (t < c_.sinks) {
              if (!(gk == round_to(ek, c_.res) && gv == round_to(ev, c_.res))) {
                CHECKF(false, "%s after %s: seq %llu layer %u sink %llu e %u: %g / %g, want %g / %g (tag %lld)",
                       c_.name, after, (unsigned long long)id, l, (unsigned long long)t, e, gk, gv,
                       round_to(ek, c_.res), round_to(ev, c_.res), (long long)tag);
                return;
              }
            } else if (!(std::fabs(gk - ek) <= c_.tol && std::fabs(gv - ev) <= c_.tol)) {
              CHECKF(false, "%s after %s: seq %llu layer %u pos %llu e %u: %g / %g, want %g / %g", c_.name, after,
                     (unsigned long long)id, l, (unsigned long long)t, e, gk, gv, ek, ev);
              return;
            }
          }
        }
      }
    }
  }

  void attention(uint64_t id) {
    Seq &sq = m_[id];
    const uint32_t l = static_cast<uint32_t>(rng_() % c_.layers);
    const uint64_t n = sq.len();
    if (!n) return;
    std::vector<float> ko(n * row_), vo(n * row_);
    CHECKF(kvc_gather(p_, id, l, 0, n, ko.data(), vo.data(), KVC_DTYPE_F32, nullptr) == KVC_OK, "gather");
    const uint64_t nq = 1 + rng_() % std::min<uint64_t>(n, 3);
    std::vector<float> q(nq * row_), out(nq * row_), ref(nq * row_, 0.0f);
    for (auto &x : q) x = std::uniform_real_distribution<float>(-2, 2)(rng_);
    const float scale = 1.0f / std::sqrt(static_cast<float>(c_.dim));
    for (uint64_t i = 0; i < nq; ++i) {
      const uint64_t vis = n - nq + i + 1;  // prefill rows (causal)
      for (uint32_t h = 0; h < c_.heads; ++h) {
        std::vector<double> s(vis);
        double mx = -1e300;
        for (uint64_t t = 0; t < vis; ++t) {
          double d = 0;
          for (uint32_t x = 0; x < c_.dim; ++x) d += q[i * row_ + h * c_.dim + x] * ko[t * row_ + h * c_.dim + x];
          s[t] = d * scale;
          mx = std::max(mx, s[t]);
        }
        double sum = 0;
        for (auto &x : s) sum += (x = std::exp(x - mx));
        for (uint32_t x = 0; x < c_.dim; ++x) {
          double a = 0;
          for (uint64_t t = 0; t < vis; ++t) a += s[t] * vo[t * row_ + h * c_.dim + x];
          ref[i * row_ + h * c_.dim + x] = static_cast<float>(a / sum);
        }
      }
    }
    kvc_attention_params ap;
    kvc_attention_params_init(&ap);
    ap.num_q_heads = c_.heads;
    CHECKF(kvc_attention_prefill(p_, l, id, q.data(), nq, out.data(), nullptr, &ap) == KVC_OK, "prefill");
    for (size_t i = 0; i < out.size(); ++i)
      if (!(std::fabs(out[i] - ref[i]) <= 1e-4f)) {
        CHECKF(false, "%s: prefill seq %llu layer %u: out[%zu] %g, ref %g", c_.name, (unsigned long long)id, l, i,
               out[i], ref[i]);
        break;
      }
    // Decode: the last query row sees everything.
    std::vector<float> o1(row_);
    CHECKF(kvc_attention_decode(p_, l, &id, 1, q.data() + (nq - 1) * row_, o1.data(), nullptr, &ap) == KVC_OK,
           "decode");
    for (uint32_t i = 0; i < row_; ++i)
      if (!(std::fabs(o1[i] - ref[(nq - 1) * row_ + i]) <= 1e-4f)) {
        CHECKF(false, "%s: decode seq %llu layer %u: out[%u] %g, ref %g", c_.name, (unsigned long long)id, l, i,
               o1[i], ref[(nq - 1) * row_ + i]);
        break;
      }
  }

  void fix_checksum(std::vector<uint8_t> &b) {
    const uint64_t sum = XXH3_64bits(b.data() + 24, b.size() - 24);
    std::memcpy(b.data() + 16, &sum, 8);
  }

  bool save(uint64_t id, std::vector<uint8_t> &b) {
    size_t need = 0;
    if (kvc_seq_save(p_, id, nullptr, 0, &need) != KVC_ERR_BUFFER_TOO_SMALL && need == 0) {
      CHECKF(false, "%s: save size", c_.name);
      return false;
    }
    b.resize(need);
    size_t got = 0;
    const kvc_status st = kvc_seq_save(p_, id, b.data(), b.size(), &got);
    CHECKF(st == KVC_OK && got == need, "%s: save (%zu vs %zu)", c_.name, got, need);
    return st == KVC_OK;
  }

  void op_reserve_write(uint64_t id, int64_t tag) {
    Seq &sq = m_[id];
    const uint64_t len = sq.len();
    const uint64_t n = 1 + rng_() % (2 * c_.block);
    Snapshot before = snap();
    const kvc_status st = kvc_seq_reserve(p_, id, n, nullptr);
    ++g_count[std::string(len ? "reserve " : "first reserve ") + std::to_string(st)];
    TRACE("reserve seq %llu len %llu n %llu: %d\n", (unsigned long long)id, (unsigned long long)len,
          (unsigned long long)n, (int)st);
    CHECKF(st == KVC_OK || st == KVC_ERR_POOL_EXHAUSTED, "%s: reserve %d", c_.name, (int)st);
    if (st != KVC_OK) {
      same(before, "reserve");
      return;
    }
    for (auto &t : sq.tags) t.resize(len + n, -1);
    for (uint32_t l = 0; l < c_.layers; ++l) {
      // This layer stays unwritten (its slots keep whatever the block held;
      // not with per-channel groups, where such garbage, say Inf from a
      // damaged record restored earlier, spoils the group's written tokens).
      if (!channel_ && rng_() % 8 == 0) continue;
      // Split [len, len + n) into chunks written in a random order.
      std::vector<std::pair<uint64_t, uint64_t>> chunks;
      for (uint64_t p = len; p < len + n;) {
        const uint64_t m = 1 + rng_() % (len + n - p);
        chunks.push_back({p, m});
        p += m;
      }
      if (rng_() % 2) std::shuffle(chunks.begin(), chunks.end(), rng_);
      for (auto [p, m] : chunks) write(id, l, p, m, tag);
    }
  }

  void write(uint64_t id, uint32_t l, uint64_t p, uint64_t m, int64_t tag) {
    std::vector<float> kb, vb;
    fill(tag, p, m, kb, vb);
    Snapshot before;
    const bool check = rng_() % 4 == 0;
    if (check) before = snap();
    const kvc_status a = kvc_append(p_, id, l, p, m, kb.data(), vb.data(), KVC_DTYPE_F32);
    TRACE("append seq %llu layer %u pos %llu n %llu tag %lld: %d\n", (unsigned long long)id, l,
          (unsigned long long)p, (unsigned long long)m, (long long)tag, (int)a);
    ++g_count[std::string("append ") + std::to_string(a)];
    if (a == KVC_OK) {
      for (uint64_t t = 0; t < m; ++t) m_[id].tags[l][p + t] = tag;
    } else {
      CHECKF(a == KVC_ERR_POOL_EXHAUSTED || (channel_ && a == KVC_ERR_NOT_RESERVED), "%s: append %d", c_.name,
             (int)a);
      if (check) same(before, "append");
    }
  }

  void run(int ops) {
    if (!p_) return;
    uint64_t next = 1;
    for (int op = 0; op < ops && !g_kvtest_fail; ++op) {
      std::vector<uint64_t> ids;
      for (auto &[id, _] : m_) ids.push_back(id);
      const uint64_t pick = ids.empty() ? 0 : ids[rng_() % ids.size()];
      int what = static_cast<int>(rng_() % 16);
      if (ids.size() > 5 && what <= 2) what = 4;  // keep a few sequences: most reserves should fit
      const char *name = "?";
      if (ids.empty() || what == 0) {
        name = "create";
        TRACE("create %llu\n", (unsigned long long)next);
        CHECKF(kvc_seq_create(p_, next) == KVC_OK, "create");
        m_[next].tags.assign(c_.layers, {});
        ++next;
      } else if (what == 1 || what == 2) {
        name = "fork";
        Snapshot before = snap();
        const kvc_status st = kvc_seq_fork(p_, pick, next);
        ++g_count[std::string("fork ") + std::to_string(st)];
        TRACE("fork %llu -> %llu: %d\n", (unsigned long long)pick, (unsigned long long)next, (int)st);
        CHECKF(st == KVC_OK || st == KVC_ERR_POOL_EXHAUSTED, "fork %d", (int)st);
        if (st == KVC_OK) m_[next] = m_[pick];
        else same(before, "fork");
        ++next;
      } else if (what == 3) {
        name = "truncate";
        const uint64_t len = m_[pick].len();
        uint64_t to = len ? rng_() % (len + 1) : 0;
        if (rng_() % 3 == 0) to = std::min<uint64_t>(len, rng_() % (c_.sinks + 2));
        Snapshot before = snap();
        const kvc_status st = kvc_seq_truncate(p_, pick, to);
        ++g_count[std::string("truncate ") + std::to_string(st)];
        TRACE("truncate seq %llu to %llu: %d\n", (unsigned long long)pick, (unsigned long long)to, (int)st);
        CHECKF(st == KVC_OK || st == KVC_ERR_POOL_EXHAUSTED, "truncate %d", (int)st);
        if (st == KVC_OK) for (auto &t : m_[pick].tags) t.resize(std::min<uint64_t>(t.size(), to));
        else same(before, "truncate");
      } else if (what == 4 && ids.size() > 1) {
        name = "free";
        TRACE("free %llu\n", (unsigned long long)pick);
        CHECKF(kvc_seq_free(p_, pick) == KVC_OK, "free");
        m_.erase(pick);
      } else if (what == 5) {
        name = "rewrite";
        const uint64_t len = m_[pick].len();
        if (len) {
          uint64_t p = rng_() % len;
          if (rng_() % 2) p = rng_() % std::min<uint64_t>(len, c_.sinks + 1);
          const uint64_t m = 1 + rng_() % (len - p);
          write(pick, static_cast<uint32_t>(rng_() % c_.layers), p, m, op);
        }
      } else if (what == 6) {
        name = "save/restore";
        TRACE("save/restore %llu (copy %llu)\n", (unsigned long long)pick, (unsigned long long)next);
        std::vector<uint8_t> b;
        if (save(pick, b)) {
          Snapshot before = snap();
          // Restore as a copy, compare, free the copy.
          const kvc_status st = kvc_seq_restore(p_, next, b.data(), b.size());
          CHECKF(st == KVC_OK || st == KVC_ERR_POOL_EXHAUSTED, "restore %d", (int)st);
          if (st == KVC_OK) {
            m_[next] = m_[pick];
            verify("restore");
            CHECKF(kvc_seq_free(p_, next) == KVC_OK, "free");
            m_.erase(next);
            same(before, "restore + free");
          } else {
            same(before, "restore");
          }
          ++next;
          // Round trip in place.
          if (kvc_seq_free(p_, pick) == KVC_OK) {
            const kvc_status st2 = kvc_seq_restore(p_, pick, b.data(), b.size());
            // (Blocks shared with forks stay held: the record may not fit.)
            CHECKF(st2 == KVC_OK || st2 == KVC_ERR_POOL_EXHAUSTED, "restore in place %d", (int)st2);
            if (st2 != KVC_OK) m_.erase(pick);
          }
        }
      } else if (what == 7) {
        name = "damaged restore";
        TRACE("damaged restore of %llu as %llu\n", (unsigned long long)pick, (unsigned long long)next);
        std::vector<uint8_t> b;
        if (save(pick, b) && b.size() > 24) {
          const int flips = 1 + static_cast<int>(rng_() % 3);
          for (int f = 0; f < flips; ++f) {
            size_t at = 24 + rng_() % (b.size() - 24);
            // Often the header / tables / sink count region, where parsing happens.
            if (rng_() % 2) at = 24 + rng_() % std::min<size_t>(b.size() - 24, 400);
            b[at] ^= static_cast<uint8_t>(1u << (rng_() % 8));
          }
          if (rng_() % 4) fix_checksum(b);
          Snapshot before = snap();
          const kvc_status st = kvc_seq_restore(p_, next, b.data(), b.size());
          ++g_count[std::string("damaged restore ") + std::to_string(st)];
          CHECKF(st == KVC_OK || st == KVC_ERR_CORRUPT || st == KVC_ERR_INCOMPATIBLE ||
                    st == KVC_ERR_POOL_EXHAUSTED,
                 "%s: damaged restore %d", c_.name, (int)st);
          if (st == KVC_OK) {
            const std::string inv = kvc::api::core_pool(p_).check_invariants();
            CHECKF(inv.empty(), "%s after a damaged restore: %s", c_.name, inv.c_str());
            // Reading it must not crash.
            for (uint32_t l = 0; l < c_.layers; ++l) {
              uint64_t n = 0;
              kvc_seq_layer_tokens(p_, next, l, &n);
              std::vector<float> ko(n * row_ + 1), vo(n * row_ + 1);
              if (n) kvc_gather(p_, next, l, 0, n, ko.data(), vo.data(), KVC_DTYPE_F32, nullptr);
            }
            CHECKF(kvc_seq_free(p_, next) == KVC_OK, "free");
            same(before, "damaged restore + free");
          } else {
            same(before, "damaged restore");
          }
          ++next;
        }
      } else if (what == 8) {
        name = "attention";
        attention(pick);
      } else {
        name = "reserve+write";
        op_reserve_write(pick, op);
      }
      verify(name);
    }
    // Free everything: nothing may stay held.
    for (auto &[id, _] : m_) CHECKF(kvc_seq_free(p_, id) == KVC_OK, "free");
    m_.clear();
    kvc_stats st;
    kvc_stats_init(&st);
    kvc_pool_stats(p_, &st);
    CHECKF(st.residual_blocks_used == 0 && st.blocks_used == 0 && st.tokens_stored == 0,
           "%s: after freeing all: %llu residual blocks, %llu blocks, %llu tokens", c_.name,
           (unsigned long long)st.residual_blocks_used, (unsigned long long)st.blocks_used,
           (unsigned long long)st.tokens_stored);
    const std::string inv = kvc::api::core_pool(p_).check_invariants();
    CHECKF(inv.empty(), "%s at the end: %s", c_.name, inv.c_str());
  }

  kvc_pool *pool() { return p_; }
  kvc_pool_config cfg_;

 private:
  Cfg c_;
  std::mt19937 rng_;
  uint32_t row_;
  kvc_codec k_, v_;
  kvc_pool *p_ = nullptr;
  bool channel_ = false;
  std::map<uint64_t, Seq> m_;
};

const kvc_dtype I8 = KVC_DTYPE_INT8, I4 = KVC_DTYPE_INT4, I3 = KVC_DTYPE_INT3, F16 = KVC_DTYPE_F16;
const kvc_granularity TOK = KVC_SCALE_PER_TOKEN, GRP = KVC_SCALE_PER_GROUP, CH = KVC_SCALE_PER_CHANNEL,
                      TEN = KVC_SCALE_PER_TENSOR, NONE = KVC_SCALE_NONE;

const Cfg kCfgs[] = {
    // name            L  H  D  bs S  kd   vd   kg   vg   grp win frac res              blocks res_blocks tol
    {"one-layer-S1", 1, 1, 4, 4, 1, I8, I8, TOK, TOK, 0, 0, 0.0, KVC_DTYPE_F16, 40, 12, 0.03f},
    {"S=bs", 3, 2, 4, 4, 4, I8, I8, TOK, TOK, 0, 0, 0.0, KVC_DTYPE_F16, 60, 20, 0.03f},
    {"many-layers", 5, 1, 8, 8, 3, I8, I8, GRP, TOK, 4, 0, 0.0, KVC_DTYPE_BF16, 80, 25, 0.03f},
    {"channel-g=bs", 3, 2, 4, 4, 2, I8, I8, CH, TOK, 4, 0, 0.0, KVC_DTYPE_F16, 60, 24, 0.08f},
    {"kivi", 2, 2, 4, 8, 5, I8, I8, CH, TOK, 2, 3, 0.0, KVC_DTYPE_F32, 50, 24, 0.08f},
    {"hybrid", 3, 1, 8, 4, 2, I4, I4, TOK, GRP, 4, 2, 0.3, KVC_DTYPE_BF16, 60, 30, 0.35f},
    {"k-tensor-v-plain", 2, 2, 4, 4, 3, I8, F16, TEN, NONE, 0, 0, 0.0, KVC_DTYPE_F16, 50, 16, 0.05f},
    {"k-plain-v-chan", 2, 1, 8, 8, 8, F16, I8, NONE, CH, 8, 0, 0.0, KVC_DTYPE_F16, 50, 24, 0.08f},
    {"bs3-S2", 4, 1, 4, 3, 2, I8, I8, TOK, TOK, 0, 1, 0.0, KVC_DTYPE_F16, 80, 30, 0.03f},
    // int3 (head_dim a multiple of 8): groups of 12 straddle the 3-byte units.
    {"int3-tok-grp12", 3, 2, 8, 4, 2, I3, I3, TOK, GRP, 12, 0, 0.0, KVC_DTYPE_F16, 60, 20, 0.23f},
    {"int3-kivi", 2, 2, 8, 8, 3, I3, I3, CH, TOK, 4, 3, 0.0, KVC_DTYPE_F32, 50, 24, 0.23f},
    {"int3-hybrid", 3, 1, 16, 4, 2, I3, I3, TOK, GRP, 4, 2, 0.3, KVC_DTYPE_BF16, 60, 30, 0.23f},
};

// Targeted reproducers.

kvc_pool *make_pool(uint32_t layers, uint32_t block, uint32_t sinks, kvc_granularity kg, uint32_t group,
                    uint64_t res_blocks = 0, uint32_t window = 0, uint64_t blocks = 64) {
  static kvc_codec k, v;
  kvc_codec_init(&k);
  kvc_codec_init(&v);
  k.dtype = v.dtype = KVC_DTYPE_INT8;
  k.granularity = kg;
  if (kg == KVC_SCALE_PER_CHANNEL) k.group_size = group, k.asymmetric = 1;
  kvc_pool_config c;
  kvc_pool_config_init(&c);
  c.num_layers = layers;
  c.num_q_heads = c.num_kv_heads = 1;
  c.head_dim = 4;
  c.block_size = block;
  c.num_blocks = blocks;
  c.num_residual_blocks = res_blocks;
  c.k_codec = &k;
  c.v_codec = &v;
  c.residual_sinks = sinks;
  c.residual_window = window;
  kvc_pool *p = nullptr;
  CHECKF(kvc_pool_create(&c, &p) == KVC_OK, "create");
  return p;
}

void put_tokens(kvc_pool *p, uint64_t id, uint32_t layers, uint64_t n, int64_t tag) {
  uint64_t len = 0;
  kvc_seq_length(p, id, &len);
  CHECKF(kvc_seq_reserve(p, id, n, nullptr) == KVC_OK, "reserve");
  std::vector<float> kb(n * 4), vb(n * 4);
  for (uint64_t t = 0; t < n; ++t)
    for (uint32_t e = 0; e < 4; ++e) kb[t * 4 + e] = value(tag, len + t, e, 0), vb[t * 4 + e] = value(tag, len + t, e, 1);
  for (uint32_t l = 0; l < layers; ++l)
    CHECKF(kvc_append(p, id, l, len, n, kb.data(), vb.data(), KVC_DTYPE_F32) == KVC_OK, "append");
}

std::vector<uint8_t> save_record(kvc_pool *p, uint64_t id) {
  size_t need = 0;
  kvc_seq_save(p, id, nullptr, 0, &need);
  std::vector<uint8_t> b(need);
  CHECKF(kvc_seq_save(p, id, b.data(), b.size(), &need) == KVC_OK, "save");
  return b;
}

void reseal(std::vector<uint8_t> &b) {
  const uint64_t sum = XXH3_64bits(b.data() + 24, b.size() - 24);
  std::memcpy(b.data() + 16, &sum, 8);
}

// Offsets in a record: the length, then layer 0's table.
size_t length_at(const std::vector<uint8_t> &b) {
  uint32_t fp_n;
  std::memcpy(&fp_n, b.data() + 24, 4);
  return 28 + fp_n;
}
size_t layer0_at(const std::vector<uint8_t> &b) { return length_at(b) + 8 + 4 + 4; }

// A damaged (resealed) record whose length exceeds its layers' tokens must
// be refused: restored, an append at the record's last position wrote past
// the layer's block tables.
void repro_length_above_tokens() {
  kvc_pool *p = make_pool(1, 4, 1, KVC_SCALE_PER_TOKEN, 0);
  kvc_seq_create(p, 1);
  put_tokens(p, 1, 1, 2, 1);
  std::vector<uint8_t> b = save_record(p, 1);
  const uint64_t len = 3;  // 2 tokens in the layer
  std::memcpy(b.data() + length_at(b), &len, 8);
  reseal(b);
  const kvc_status st = kvc_seq_restore(p, 2, b.data(), b.size());
  CHECKF(st == KVC_ERR_CORRUPT, "length above the layer's tokens: restore gave %d", (int)st);
  if (st == KVC_OK) {
    const std::string inv = kvc::api::core_pool(p).check_invariants();
    CHECKF(inv.empty(), "after restore: %s", inv.c_str());
    float kb[4] = {1, 2, 3, 4};
    // idx 2 of a layer with 2 tokens: past the residual table.
    kvc_append(p, 2, 0, 2, 1, kb, kb, KVC_DTYPE_F32);
  }
  kvc_pool_destroy(p);
}

// A damaged (resealed) record whose codec token count cuts a per-channel
// group must be refused: restored, aging encoded a group across the end of
// a block.
void repro_lp_not_whole_group() {
  kvc_pool *p = make_pool(1, 8, 2, KVC_SCALE_PER_CHANNEL, 2);
  kvc_seq_create(p, 1);
  put_tokens(p, 1, 1, 6, 1);  // n_lp 6 (groups of 2), 0 staged
  put_tokens(p, 1, 1, 1, 2);  // n_lp 6, 1 staged
  std::vector<uint8_t> b = save_record(p, 1);
  const size_t t = layer0_at(b);
  uint64_t n_tokens, n_lp;
  std::memcpy(&n_tokens, b.data() + t, 8);
  std::memcpy(&n_lp, b.data() + t + 8, 8);
  CHECKF(n_tokens == 7 && n_lp == 6, "setup: %llu tokens, %llu encoded", (unsigned long long)n_tokens,
         (unsigned long long)n_lp);
  n_lp = 7;  // same codec block count (1), residual 0 tokens: n_res must then be 0
  std::memcpy(b.data() + t + 8, &n_lp, 8);
  // Drop the residual block from the record (n_res 0) so the counts agree.
  uint32_t n_res = 0, res_off = 0;
  std::memcpy(b.data() + t + 32, &res_off, 4);
  std::memcpy(b.data() + t + 44, &n_res, 4);
  kvc_stats st0;
  kvc_stats_init(&st0);
  kvc_pool_stats(p, &st0);
  // Bytes: remove the layer's residual block (it precedes the sink blocks).
  const size_t rb = st0.residual_bytes_per_block, bb = st0.bytes_per_block;
  const size_t blocks_at = b.size() - rb /*sinks*/ - rb /*residual*/ - bb;
  b.erase(b.begin() + static_cast<std::ptrdiff_t>(blocks_at + bb), b.begin() + static_cast<std::ptrdiff_t>(blocks_at + bb + rb));
  const uint64_t total = b.size();
  std::memcpy(b.data() + 8, &total, 8);
  reseal(b);
  const kvc_status st = kvc_seq_restore(p, 2, b.data(), b.size());
  CHECKF(st == KVC_ERR_CORRUPT, "codec tokens cutting a per-channel group: restore gave %d", (int)st);
  if (st == KVC_OK) {
    const std::string inv = kvc::api::core_pool(p).check_invariants();
    CHECKF(inv.empty(), "after restore: %s", inv.c_str());
    put_tokens(p, 2, 1, 3, 3);  // ages a group from token 7: slots 7 and 8 of an 8-slot block
  }
  kvc_pool_destroy(p);
}

// Threads appending to their own sequences (and forking, truncating,
// reading them) at once: each reads back its own values.
void threads() {
  kvc_pool *p = make_pool(4, 4, 3, KVC_SCALE_PER_TOKEN, 0, 2000, 2, 4000);
  std::atomic<int> bad{0};
  auto note = [&](int line, uint64_t id, int it) {
    std::fprintf(stderr, "threads: line %d seq %llu iteration %d: %s\n", line, (unsigned long long)id, it,
                 kvc_last_error_message());
    ++bad;
  };
  auto worker = [&](uint64_t id) {
    std::mt19937 rng(static_cast<uint32_t>(id));
    if (kvc_seq_create(p, id) != KVC_OK) note(__LINE__, id, -1);
    std::vector<int64_t> tags;
    for (int it = 0; it < 150; ++it) {
      const uint64_t len = tags.size();
      const uint64_t n = 1 + rng() % 6;
      if (kvc_seq_reserve(p, id, n, nullptr) != KVC_OK) {
        std::fprintf(stderr, "reserve: %s\n", kvc_last_error_message());
        ++bad;
        return;
      }
      std::vector<float> kb(n * 4), vb(n * 4);
      for (uint64_t t = 0; t < n; ++t)
        for (uint32_t e = 0; e < 4; ++e)
          kb[t * 4 + e] = value(it + id, len + t, e, 0), vb[t * 4 + e] = value(it + id, len + t, e, 1);
      for (uint32_t l = 0; l < 4; ++l)
        for (uint64_t t = n; t-- > 0;)  // newest first: out of order
          if (kvc_append(p, id, l, len + t, 1, kb.data() + t * 4, vb.data() + t * 4, KVC_DTYPE_F32) != KVC_OK) note(__LINE__, id, it);
      tags.resize(len + n, static_cast<int64_t>(it + id));
      if (rng() % 5 == 0) {  // rewrite a sink of every layer
        const uint64_t pos = rng() % std::min<uint64_t>(3, tags.size());
        float kr[4], vr[4];
        for (uint32_t e = 0; e < 4; ++e) kr[e] = value(it + id + 1000, pos, e, 0), vr[e] = value(it + id + 1000, pos, e, 1);
        for (uint32_t l = 0; l < 4; ++l)
          if (kvc_append(p, id, l, pos, 1, kr, vr, KVC_DTYPE_F32) != KVC_OK) note(__LINE__, id, it);
        tags[pos] = static_cast<int64_t>(it + id + 1000);
      }
      if (rng() % 7 == 0) {
        const uint64_t to = rng() % (tags.size() + 1);
        if (kvc_seq_truncate(p, id, to) != KVC_OK) note(__LINE__, id, it);
        tags.resize(to);
      }
      if (rng() % 6 == 0) {
        const uint64_t child = (id << 32) | static_cast<uint64_t>(it + 1);
        if (kvc_seq_fork(p, id, child) != KVC_OK || kvc_seq_free(p, child) != KVC_OK) note(__LINE__, id, it);
      }
      const uint64_t m = tags.size();
      std::vector<float> ko(m * 4 + 1), vo(m * 4 + 1);
      for (uint32_t l = 0; l < 4 && m; ++l) {
        if (kvc_gather(p, id, l, 0, m, ko.data(), vo.data(), KVC_DTYPE_F32, nullptr) != KVC_OK) note(__LINE__, id, it);
        for (uint64_t t = 0; t < std::min<uint64_t>(m, 3); ++t)
          for (uint32_t e = 0; e < 4; ++e)
            if (ko[t * 4 + e] != round_to(value(tags[t], t, e, 0), KVC_DTYPE_F16) ||
                vo[t * 4 + e] != round_to(value(tags[t], t, e, 1), KVC_DTYPE_F16)) {
              std::fprintf(stderr, "threads: seq %llu it %d layer %u sink %llu e %u: %g / %g, want %g / %g (tag %lld)\n",
                           (unsigned long long)id, it, l, (unsigned long long)t, e, ko[t * 4 + e], vo[t * 4 + e],
                           round_to(value(tags[t], t, e, 0), KVC_DTYPE_F16),
                           round_to(value(tags[t], t, e, 1), KVC_DTYPE_F16), (long long)tags[t]);
              ++bad;
            }
      }
    }
    if (kvc_seq_free(p, id) != KVC_OK) note(__LINE__, id, -2);
  };
  std::vector<std::thread> th;
  for (uint64_t i = 1; i <= 4; ++i) th.emplace_back(worker, i);
  for (auto &t : th) t.join();
  CHECKF(bad.load() == 0, "threads: %d bad results", bad.load());
  kvc_stats st;
  kvc_stats_init(&st);
  kvc_pool_stats(p, &st);
  CHECKF(st.residual_blocks_used == 0 && st.blocks_used == 0, "threads: %llu residual blocks left",
         (unsigned long long)st.residual_blocks_used);
  const std::string inv = kvc::api::core_pool(p).check_invariants();
  CHECKF(inv.empty(), "threads: %s", inv.c_str());
  kvc_pool_destroy(p);
}

// Decode split over threads by token ranges (FlashDecoding): every range
// reads the sinks' copies, as one thread does.
void long_decode() {
  kvc_pool *p = make_pool(1, 16, 4, KVC_SCALE_PER_TOKEN, 0, 0, 0, 200);
  kvc_seq_create(p, 1);
  // Sinks with a large magnitude so their copies matter.
  const uint64_t n = 1100;
  CHECKF(kvc_seq_reserve(p, 1, n, nullptr) == KVC_OK, "reserve");
  std::vector<float> kb(n * 4), vb(n * 4);
  for (uint64_t t = 0; t < n; ++t)
    for (uint32_t e = 0; e < 4; ++e) {
      kb[t * 4 + e] = value(1, t, e, 0) * (t < 4 ? 7.0f : 1.0f);
      vb[t * 4 + e] = value(1, t, e, 1) * (t < 4 ? 7.0f : 1.0f);
    }
  CHECKF(kvc_append(p, 1, 0, 0, n, kb.data(), vb.data(), KVC_DTYPE_F32) == KVC_OK, "append");
  std::vector<float> ko(n * 4), vo(n * 4);
  CHECKF(kvc_gather(p, 1, 0, 0, n, ko.data(), vo.data(), KVC_DTYPE_F32, nullptr) == KVC_OK, "gather");
  for (uint64_t t = 0; t < 4; ++t)
    for (uint32_t e = 0; e < 4; ++e)
      CHECKF(ko[t * 4 + e] == round_to(kb[t * 4 + e], KVC_DTYPE_F16), "sink %llu", (unsigned long long)t);
  float q[4] = {0.9f, -1.3f, 0.4f, 1.1f};
  double ref[4] = {0, 0, 0, 0}, mx = -1e300, sum = 0;
  std::vector<double> sc(n);
  for (uint64_t t = 0; t < n; ++t) {
    double d = 0;
    for (int x = 0; x < 4; ++x) d += q[x] * ko[t * 4 + x];
    sc[t] = d / 2.0;
    mx = std::max(mx, sc[t]);
  }
  for (uint64_t t = 0; t < n; ++t) {
    const double w = std::exp(sc[t] - mx);
    sum += w;
    for (int x = 0; x < 4; ++x) ref[x] += w * vo[t * 4 + x];
  }
  for (uint32_t threads : {1u, 2u, 4u}) {
    kvc_attention_params ap;
    kvc_attention_params_init(&ap);
    ap.num_q_heads = 1;
    ap.num_threads = threads;
    float out[4];
    const uint64_t id = 1;
    CHECKF(kvc_attention_decode(p, 0, &id, 1, q, out, nullptr, &ap) == KVC_OK, "decode");
    for (int x = 0; x < 4; ++x)
      CHECKF(std::fabs(out[x] - ref[x] / sum) < 1e-4, "decode with %u threads: out[%d] %g, ref %g", threads, x,
             out[x], ref[x] / sum);
  }
  kvc_pool_destroy(p);
}

// A plain (float) part accepts NaN and Inf; staged in the residual (every
// token is, with attention sinks) and kept as a sink copy they must read
// back as written: NaN became -65504 (and Inf 65504).
void plain_nonfinite() {
  static kvc_codec k;
  kvc_codec_init(&k);
  k.dtype = KVC_DTYPE_INT8;
  for (uint32_t sinks : {0u, 2u}) {
    kvc_pool_config c;
    kvc_pool_config_init(&c);
    c.num_layers = 1;
    c.num_q_heads = c.num_kv_heads = 1;
    c.head_dim = 4;
    c.block_size = 4;
    c.num_blocks = 8;
    c.k_codec = &k;  // V: plain f16
    c.residual_sinks = sinks;
    c.residual_window = sinks ? 0 : 2;
    kvc_pool *p = nullptr;
    CHECKF(kvc_pool_create(&c, &p) == KVC_OK, "create");
    kvc_seq_create(p, 1);
    CHECKF(kvc_seq_reserve(p, 1, 3, nullptr) == KVC_OK, "reserve");
    const float inf = INFINITY, nan = NAN;
    float kb[12] = {1, 2, 3, 4, 1, 2, 3, 4, 1, 2, 3, 4};
    float vb[12] = {nan, inf, -inf, 1, nan, inf, -inf, 1, nan, inf, -inf, 1};
    CHECKF(kvc_append(p, 1, 0, 0, 3, kb, vb, KVC_DTYPE_F32) == KVC_OK, "append");
    float vo[12];
    CHECKF(kvc_gather(p, 1, 0, 0, 3, nullptr, vo, KVC_DTYPE_F32, nullptr) == KVC_OK, "gather");
    for (int t = 0; t < 3; ++t)
      CHECKF(std::isnan(vo[4 * t]) && vo[4 * t + 1] == inf && vo[4 * t + 2] == -inf && vo[4 * t + 3] == 1.0f,
             "sinks %u: plain V of token %d read back as %g %g %g %g, written NaN Inf -Inf 1", sinks, t, vo[4 * t],
             vo[4 * t + 1], vo[4 * t + 2], vo[4 * t + 3]);
    kvc_pool_destroy(p);
  }
}

// The residual arena runs out at the first reserve (the sinks fit, the
// staging does not) and at a fork: both fail and change nothing.
void exhaustion() {
  uint64_t used = 0;
  auto res_used = [&](kvc_pool *p) {
    kvc_stats st;
    kvc_stats_init(&st);
    kvc_pool_stats(p, &st);
    return st.residual_blocks_used;
  };
  // 3 layers, block 4, 4 sinks: 3 sink blocks; a token needs 1 staging block per layer.
  kvc_pool *p = make_pool(3, 4, 4, KVC_SCALE_PER_TOKEN, 0, 5);
  kvc_seq_create(p, 1);
  CHECKF(kvc_seq_reserve(p, 1, 1, nullptr) == KVC_ERR_POOL_EXHAUSTED, "first reserve: 6 of 5");
  CHECKF(res_used(p) == 0, "failed first reserve took %llu residual blocks", (unsigned long long)res_used(p));
  uint64_t len = 1;
  kvc_seq_length(p, 1, &len);
  CHECKF(len == 0, "failed first reserve: length %llu", (unsigned long long)len);
  std::string inv = kvc::api::core_pool(p).check_invariants();
  CHECKF(inv.empty(), "%s", inv.c_str());
  kvc_pool_destroy(p);
  p = make_pool(3, 4, 4, KVC_SCALE_PER_TOKEN, 0, 8);
  kvc_seq_create(p, 1);
  put_tokens(p, 1, 3, 4, 1);  // 3 sink blocks; tokens encoded: staging freed
  used = res_used(p);
  CHECKF(used == 3, "3 sink blocks, %llu held", (unsigned long long)used);
  CHECKF(kvc_seq_fork(p, 1, 2) == KVC_OK, "fork: 3 of 5");
  CHECKF(kvc_seq_fork(p, 1, 3) == KVC_ERR_POOL_EXHAUSTED, "fork: 3 of 2");
  CHECKF(res_used(p) == 6, "failed fork: %llu held", (unsigned long long)res_used(p));
  CHECKF(kvc_seq_free(p, 3) == KVC_ERR_SEQ_NOT_FOUND, "the failed fork made its child");
  inv = kvc::api::core_pool(p).check_invariants();
  CHECKF(inv.empty(), "%s", inv.c_str());
  CHECKF(kvc_seq_free(p, 1) == KVC_OK && kvc_seq_free(p, 2) == KVC_OK, "free");
  CHECKF(res_used(p) == 0, "after free: %llu held", (unsigned long long)res_used(p));
  kvc_pool_destroy(p);
}

// A record restores only into a pool with the same residual_sinks.
void restore_other_sinks() {
  kvc_pool *a = make_pool(2, 4, 2, KVC_SCALE_PER_TOKEN, 0);
  kvc_pool *b = make_pool(2, 4, 3, KVC_SCALE_PER_TOKEN, 0);
  kvc_pool *c = make_pool(2, 4, 0, KVC_SCALE_PER_TOKEN, 0, 0, 2);
  kvc_seq_create(a, 1);
  put_tokens(a, 1, 2, 5, 1);
  std::vector<uint8_t> rec = save_record(a, 1);
  CHECKF(kvc_seq_restore(b, 1, rec.data(), rec.size()) == KVC_ERR_INCOMPATIBLE, "sinks 2 into 3");
  CHECKF(kvc_seq_restore(c, 1, rec.data(), rec.size()) == KVC_ERR_INCOMPATIBLE, "sinks 2 into 0");
  kvc_seq_create(c, 2);
  put_tokens(c, 2, 2, 5, 1);
  rec = save_record(c, 2);
  CHECKF(kvc_seq_restore(a, 2, rec.data(), rec.size()) == KVC_ERR_INCOMPATIBLE, "sinks 0 into 2");
  for (kvc_pool *p : {a, b, c}) {
    const std::string inv = kvc::api::core_pool(p).check_invariants();
    CHECKF(inv.empty(), "%s", inv.c_str());
    kvc_pool_destroy(p);
  }
}

}  // namespace

int main(int argc, char **argv) {
  if (argc > 1 && std::strcmp(argv[1], "repro") == 0) {
    const char *which = argc > 2 ? argv[2] : "all";
    auto want = [&](const char *n) { return std::strcmp(which, "all") == 0 || std::strcmp(which, n) == 0; };
    if (want("length")) repro_length_above_tokens();
    if (want("group")) repro_lp_not_whole_group();
    if (want("threads")) threads();
    if (want("other")) restore_other_sinks();
    if (want("long")) long_decode();
    if (want("nonfinite")) plain_nonfinite();
    if (want("exhaustion")) exhaustion();
    std::printf("%s\n", g_kvtest_fail ? "FAILED" : "passed");
    return g_kvtest_fail ? 1 : 0;
  }
  const int ops = argc > 1 ? std::atoi(argv[1]) : 300;
  const uint32_t seeds = argc > 2 ? static_cast<uint32_t>(std::atoi(argv[2])) : 4;
  const char *only = argc > 3 ? argv[3] : nullptr;  // one configuration by name
  for (const Cfg &c : kCfgs)
    for (uint32_t s = 1; s <= seeds && !g_kvtest_fail; ++s) {
      if (only && std::strcmp(only, c.name) != 0) continue;
      if (std::getenv("SINKS_ADV_VERBOSE")) std::fprintf(stderr, "%s seed %u\n", c.name, s);
      Fuzz f(c, s * 7919u + static_cast<uint32_t>(c.layers));
      f.run(ops);
    }
  if (std::getenv("SINKS_ADV_VERBOSE"))
    for (auto &[k, n] : g_count) std::printf("%s: %llu\n", k.c_str(), (unsigned long long)n);
  std::printf("%s\n", g_kvtest_fail ? "FAILED" : "passed");
  return g_kvtest_fail ? 1 : 0;
}
