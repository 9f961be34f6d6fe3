// SPDX-License-Identifier: Apache-2.0
#include "eval_prefix.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <nlohmann/json.hpp>
#include <set>

#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>
#include <cerrno>

extern char **environ;

#include "../runner/error.h"
#include "../runner/kv_cache.h"
#include "../runner/runner.h"
#include "../runner/transformer.h"

namespace kvc_cli {
using namespace kvc_runner;

namespace {

using Clock = std::chrono::steady_clock;

double ms_since(Clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
}

void summarize(std::vector<double> ttft, PrefixRun &run) {
  if (ttft.empty()) return;
  double sum = 0;
  for (double t : ttft) sum += t;
  run.ttft_ms_mean = sum / double(ttft.size());
  std::sort(ttft.begin(), ttft.end());
  const std::size_t n = ttft.size();
  run.ttft_ms_p50 = n % 2 ? ttft[n / 2] : 0.5 * (ttft[n / 2 - 1] + ttft[n / 2]);
  run.ttft_ms_max = ttft.back();
}

}  // namespace

namespace {

// What every phase shares: the model, its tokenizer and the prompts.
struct Setup {
  std::string model_path, text_path;
  Model model;
  std::vector<std::vector<int>> prompts;
  int prompt_len = 0;
};

Setup make_setup(const PrefixEvalOptions &o) {
  if (o.requests < 1 || o.requests > 4096) throw RunnerError("--requests must be in 1..4096");
  if (o.prefix_tokens < 1) throw RunnerError("--prefix-tokens must be >= 1 (BOS included)");
  if (o.suffix_tokens < 1) throw RunnerError("--suffix-tokens must be >= 1");
  if (o.block_size < 1 || o.block_size > 4096) throw RunnerError("--block-size must be in 1..4096");
  const std::string model_path = resolve_model_path(o.model);
  Setup st{model_path,
           o.text.empty() ? shared_dir() + "/data/tinystories-valid-sample.txt" : o.text,
           Model::load(model_path),
           {},
           0};
  const ModelConfig &c = st.model.config();
  const Tokenizer tokenizer =
      Tokenizer::load(resolve_tokenizer_path(o.tokenizer, o.model), c.vocab_size);
  const std::int64_t prompt_len64 = std::int64_t(o.prefix_tokens) + o.suffix_tokens;
  if (prompt_len64 > c.seq_len) {
    throw RunnerError("--prefix-tokens + --suffix-tokens = " + std::to_string(prompt_len64) +
                      " is more than the model's context of " + std::to_string(c.seq_len));
  }
  st.prompt_len = static_cast<int>(prompt_len64);
  // The shared prefix: BOS and the text's first stories (the same few-shot
  // context for every request). Each suffix is the next unused stretch of
  // text whose first block differs from every earlier suffix's, so reuse is
  // exactly the prefix's whole blocks.
  const std::vector<int> text =
      tokenizer.encode(read_text_file(st.text_path, "text file"), false, false);
  std::vector<int> prefix = {kBosToken};
  prefix.insert(prefix.end(), text.begin(),
                text.begin() + std::min<std::size_t>(text.size(), o.prefix_tokens - 1));
  if (static_cast<int>(prefix.size()) < o.prefix_tokens)
    throw RunnerError("text file '" + st.text_path + "' is too short");
  std::set<std::vector<int>> first_blocks;
  const std::size_t head = static_cast<std::size_t>(std::min(o.block_size, o.suffix_tokens));
  for (std::size_t at = static_cast<std::size_t>(o.prefix_tokens - 1);
       static_cast<int>(st.prompts.size()) < o.requests && at + o.suffix_tokens <= text.size();
       at += o.suffix_tokens) {
    std::vector<int> first(text.begin() + at, text.begin() + at + head);
    if (!first_blocks.insert(first).second) continue;
    std::vector<int> p = prefix;
    p.insert(p.end(), text.begin() + at, text.begin() + at + o.suffix_tokens);
    st.prompts.push_back(std::move(p));
  }
  if (static_cast<int>(st.prompts.size()) < o.requests) {
    throw RunnerError("text file '" + st.text_path + "' holds too few distinct suffixes for " +
                      std::to_string(o.requests) + " requests");
  }
  return st;
}

}  // namespace

namespace {

// ---------------------------------------------------------------------------
// The tiered run (docs/tiers.md)

kvc_tier_config tier_config(kvc_tier_kind kind) {
  kvc_tier_config t;
  check_kvc(kvc_tier_config_init(&t, kind), "kvc_tier_config_init");
  return t;
}

void add_tier(KvPool &pool, kvc_tier_kind kind, const PrefixEvalOptions &o) {
  kvc_tier_config t = tier_config(kind);
  t.capacity_bytes = std::uint64_t(1) << 30;
  if (kind == KVC_TIER_DISK) t.path = o.tier_dir.c_str();
  if (kind == KVC_TIER_REDIS) {
    t.address = o.redis.c_str();
    if (o.redis.find(',') != std::string::npos) t.flags = KVC_TIER_REDIS_CLUSTER;
  }
  check_kvc(kvc_pool_add_tier(pool.get(), &t, nullptr), "kvc_pool_add_tier");
}

// Reclaims every cached block of the pool (so they are demoted) and waits
// until the tiers have them.
void squeeze(KvPool &pool, const ModelConfig &c, int block_size) {
  const kvc_stats s = pool.stats();
  const std::uint64_t per_layer = (s.blocks_free + s.blocks_cached) / std::uint64_t(c.n_layers);
  const std::uint64_t id = std::uint64_t(1) << 40;
  check_kvc(kvc_seq_create(pool.get(), id), "kvc_seq_create");
  if (per_layer)
    check_kvc(kvc_seq_reserve(pool.get(), id, per_layer * std::uint64_t(block_size), nullptr),
              "kvc_seq_reserve");
  check_kvc(kvc_seq_free(pool.get(), id), "kvc_seq_free");
  check_kvc(kvc_pool_flush_tiers(pool.get()), "kvc_pool_flush_tiers");
}

struct RequestResult {
  double ttft_ms = 0, load_ms = 0;
  std::int64_t loaded = 0, hit = 0, computed = 0;
  double nll = 0;
  std::int64_t nll_tokens = 0;
};

// One request: lookup (tiers included), load what the tiers hold, attach,
// compute the rest. Timed from its start to the last prompt position's logits.
RequestResult run_request(KvPool &pool, Transformer &tf, const ModelConfig &c,
                          const std::vector<int> &prompt, std::uint64_t seq_id, int prefix_tokens,
                          bool load) {
  RequestResult res;
  std::vector<std::int32_t> t(prompt.begin(), prompt.end());
  const auto t0 = Clock::now();
  if (load) {
    kvc_prefix_result r;
    std::memset(&r, 0, sizeof r);
    r.struct_size = sizeof r;
    check_kvc(kvc_prefix_lookup(pool.get(), t.data(), t.size(), nullptr, 0, 0, &r),
              "kvc_prefix_lookup");
    if (r.tier_tokens) {
      std::uint64_t loaded = 0;
      check_kvc(kvc_prefix_load(pool.get(), t.data(), t.size(), nullptr, 0, &loaded),
                "kvc_prefix_load");
      res.loaded = static_cast<std::int64_t>(loaded);
    }
    res.load_ms = ms_since(t0);
  }
  AttnSequence seq(pool, seq_id, c, prompt);
  const int from = seq.cached_tokens();
  res.hit = from;
  std::vector<double> logp;
  const int n = static_cast<int>(prompt.size());
  for (int p = from; p < n; ++p) {
    const float *logits = tf.forward(seq, prompt[static_cast<std::size_t>(p)], p);
    ++res.computed;
    if (p + 1 == n) res.ttft_ms = ms_since(t0);
    if (p >= prefix_tokens && p + 1 < n) {
      log_softmax(logits, c.vocab_size, logp);
      res.nll -= logp[static_cast<std::size_t>(prompt[static_cast<std::size_t>(p) + 1])];
      ++res.nll_tokens;
    }
  }
  // Only the shared prefix is registered: every phase then reuses exactly it.
  seq.register_prefix(
      std::vector<int>(prompt.begin(), prompt.begin() + std::min<int>(prefix_tokens, n)));
  return res;
}

void finish(TierPhase &ph, const std::vector<RequestResult> &rs) {
  std::vector<double> ttft;
  double nll = 0, load = 0;
  std::int64_t nll_tokens = 0;
  for (const RequestResult &r : rs) {
    ttft.push_back(r.ttft_ms);
    load += r.load_ms;
    ph.tokens_loaded += r.loaded;
    ph.tokens_hit += r.hit;
    ph.tokens_computed += r.computed;
    nll += r.nll;
    nll_tokens += r.nll_tokens;
  }
  ph.ran = true;
  ph.requests = static_cast<int>(rs.size());
  PrefixRun tmp;
  summarize(ttft, tmp);
  ph.ttft_ms_mean = tmp.ttft_ms_mean;
  ph.ttft_ms_p50 = tmp.ttft_ms_p50;
  ph.ttft_ms_max = tmp.ttft_ms_max;
  ph.load_ms_mean = rs.empty() ? 0 : load / double(rs.size());
  ph.suffix_nll_mean = nll_tokens ? nll / double(nll_tokens) : 0;
}

nlohmann::ordered_json phase_json(const TierPhase &p) {
  nlohmann::ordered_json j;
  j["name"] = p.name;
  j["ran"] = p.ran;
  if (!p.ran) {
    j["skipped"] = p.skipped;
    return j;
  }
  j["requests"] = p.requests;
  j["tokens_loaded"] = p.tokens_loaded;
  j["tokens_hit"] = p.tokens_hit;
  j["tokens_computed"] = p.tokens_computed;
  j["ttft_ms_mean"] = p.ttft_ms_mean;
  j["ttft_ms_p50"] = p.ttft_ms_p50;
  j["ttft_ms_max"] = p.ttft_ms_max;
  j["load_ms_mean"] = p.load_ms_mean;
  j["suffix_nll_mean"] = p.suffix_nll_mean;
  j["nll_equal_to_compute"] = p.nll_equal;
  return j;
}

TierPhase phase_from_json(const nlohmann::json &j) {
  TierPhase p;
  p.name = j.at("name").get<std::string>();
  p.ran = j.at("ran").get<bool>();
  if (!p.ran) {
    p.skipped = j.value("skipped", std::string());
    return p;
  }
  p.requests = j.at("requests").get<int>();
  p.tokens_loaded = j.at("tokens_loaded").get<std::int64_t>();
  p.tokens_hit = j.at("tokens_hit").get<std::int64_t>();
  p.tokens_computed = j.at("tokens_computed").get<std::int64_t>();
  p.ttft_ms_mean = j.at("ttft_ms_mean").get<double>();
  p.ttft_ms_p50 = j.at("ttft_ms_p50").get<double>();
  p.ttft_ms_max = j.at("ttft_ms_max").get<double>();
  p.load_ms_mean = j.at("load_ms_mean").get<double>();
  p.suffix_nll_mean = j.at("suffix_nll_mean").get<double>();
  return p;
}

// A phase in a process that just started, whose only copy of the prefix is in
// one tier (disk, or Redis written by another process): before each request
// the pool's copy is reclaimed (the tier already holds it: nothing is written),
// so every request loads the prefix from the tier.
TierPhase child_phase(const PrefixEvalOptions &o, const Setup &st, const std::string &kind) {
  TierPhase ph;
  ph.name = kind + " (new process)";
  const ModelConfig &c = st.model.config();
  Transformer tf(st.model);
  PoolSettings ps;
  ps.k_dtype = ps.v_dtype = KVC_DTYPE_F32;
  ps.block_size = static_cast<std::uint32_t>(o.block_size);
  ps.prefix_cache = true;
  KvPool pool(c, ps, static_cast<std::uint32_t>(st.prompt_len), 4);
  add_tier(pool, kind == "disk" ? KVC_TIER_DISK : KVC_TIER_REDIS, o);
  std::vector<RequestResult> rs;
  for (std::size_t r = 0; r < st.prompts.size(); ++r) {
    squeeze(pool, c, o.block_size);
    rs.push_back(run_request(pool, tf, c, st.prompts[r], r, o.prefix_tokens, true));
  }
  finish(ph, rs);
  return ph;
}

// Runs this program again as a new process for one phase; its stdout is one JSON line.
TierPhase spawn_phase(const PrefixEvalOptions &o, const std::string &kind) {
  std::vector<std::string> args = {"kvcache",
                                   "eval",
                                   "--prefix",
                                   "--model",
                                   o.model,
                                   "--requests",
                                   std::to_string(o.requests),
                                   "--prefix-tokens",
                                   std::to_string(o.prefix_tokens),
                                   "--suffix-tokens",
                                   std::to_string(o.suffix_tokens),
                                   "--block-size",
                                   std::to_string(o.block_size),
                                   "--tier-child",
                                   kind,
                                   "--tier-dir",
                                   o.tier_dir};
  if (!o.tokenizer.empty()) args.insert(args.end(), {"--tokenizer", o.tokenizer});
  if (!o.text.empty()) args.insert(args.end(), {"--text", o.text});
  if (!o.redis.empty()) args.insert(args.end(), {"--redis", o.redis});
  std::vector<char *> argv;
  for (std::string &a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  int fds[2];
  if (pipe(fds) != 0) throw RunnerError("pipe failed");
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_adddup2(&fa, fds[1], 1);
  posix_spawn_file_actions_addclose(&fa, fds[0]);
  pid_t pid = 0;
  const int rc = posix_spawn(&pid, "/proc/self/exe", &fa, nullptr, argv.data(), environ);
  posix_spawn_file_actions_destroy(&fa);
  close(fds[1]);
  std::string out;
  if (rc == 0) {
    char buf[4096];
    for (ssize_t n; (n = read(fds[0], buf, sizeof buf)) != 0;) {
      if (n < 0 && errno == EINTR) continue;
      if (n < 0) break;
      out.append(buf, static_cast<std::size_t>(n));
    }
  }
  close(fds[0]);
  TierPhase ph;
  ph.name = kind + " (new process)";
  if (rc != 0) {
    ph.skipped = std::string("cannot start a new process: ") + std::strerror(rc);
    return ph;
  }
  int status = 0;
  waitpid(pid, &status, 0);
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
    ph.skipped =
        "the " + kind + " process failed (exit status " + std::to_string(WEXITSTATUS(status)) + ")";
    return ph;
  }
  try {
    return phase_from_json(nlohmann::json::parse(out));
  } catch (const std::exception &e) {
    ph.skipped = std::string("unreadable report from the ") + kind + " process: " + e.what();
    return ph;
  }
}

void run_tiers(const PrefixEvalOptions &o, const Setup &st, PrefixReport &rep) {
  const ModelConfig &c = st.model.config();
  Transformer tf(st.model);
  PoolSettings ps;
  ps.k_dtype = ps.v_dtype = KVC_DTYPE_F32;
  ps.block_size = static_cast<std::uint32_t>(o.block_size);
  std::vector<RequestResult> rs;
  TierPhase compute;  // no cache: every position computed
  compute.name = "compute";
  {
    KvPool pool(c, ps, static_cast<std::uint32_t>(st.prompt_len), 4);
    for (std::size_t r = 0; r < st.prompts.size(); ++r) {
      AttnSequence seq(pool, r, c);
      RequestResult res;
      const auto t0 = Clock::now();
      std::vector<double> logp;
      const std::vector<int> &prompt = st.prompts[r];
      const int n = static_cast<int>(prompt.size());
      for (int p = 0; p < n; ++p) {
        const float *logits = tf.forward(seq, prompt[static_cast<std::size_t>(p)], p);
        ++res.computed;
        if (p + 1 == n) res.ttft_ms = ms_since(t0);
        if (p >= o.prefix_tokens && p + 1 < n) {
          log_softmax(logits, c.vocab_size, logp);
          res.nll -= logp[static_cast<std::size_t>(prompt[static_cast<std::size_t>(p) + 1])];
          ++res.nll_tokens;
        }
      }
      rs.push_back(res);
    }
  }
  finish(compute, rs);
  compute.nll_equal = true;
  rep.tiers.push_back(compute);

  ps.prefix_cache = true;
  KvPool pool(c, ps, static_cast<std::uint32_t>(st.prompt_len), 4);
  add_tier(pool, KVC_TIER_HOST, o);
  add_tier(pool, KVC_TIER_DISK, o);
  TierPhase redis_skip;
  if (!o.redis.empty()) add_tier(pool, KVC_TIER_REDIS, o);
  // Warm-up (untimed): the first request computes the prefix; its blocks are
  // written through to every tier.
  run_request(pool, tf, c, st.prompts[0], 1u << 20, o.prefix_tokens, false);
  std::vector<std::int32_t> p0(st.prompts[0].begin(), st.prompts[0].end());
  check_kvc(kvc_prefix_offload(pool.get(), p0.data(), p0.size(), nullptr, 0, nullptr),
            "kvc_prefix_offload");
  check_kvc(kvc_pool_flush_tiers(pool.get()), "kvc_pool_flush_tiers");

  TierPhase in_pool;  // the prefix's blocks cached in the pool
  in_pool.name = "pool";
  rs.clear();
  for (std::size_t r = 0; r < st.prompts.size(); ++r) {
    rs.push_back(run_request(pool, tf, c, st.prompts[r], r, o.prefix_tokens, true));
  }
  finish(in_pool, rs);
  rep.tiers.push_back(in_pool);

  TierPhase host;  // reclaimed from the pool before each request: loaded from host memory
  host.name = "host";
  rs.clear();
  for (std::size_t r = 0; r < st.prompts.size(); ++r) {
    squeeze(pool, c, o.block_size);
    rs.push_back(run_request(pool, tf, c, st.prompts[r], r, o.prefix_tokens, true));
  }
  finish(host, rs);
  rep.tiers.push_back(host);

  rep.tiers.push_back(spawn_phase(o, "disk"));
  if (o.redis.empty()) {
    TierPhase r;
    r.name = "redis (new process)";
    r.skipped = "no --redis address";
    rep.tiers.push_back(r);
  } else {
    rep.tiers.push_back(spawn_phase(o, "redis"));
  }
  for (TierPhase &ph : rep.tiers)
    if (ph.ran) ph.nll_equal = ph.suffix_nll_mean == compute.suffix_nll_mean;
}

}  // namespace

std::string run_tier_child(const PrefixEvalOptions &o) {
  if (o.tier_child != "disk" && o.tier_child != "redis")
    throw RunnerError("--tier-child: disk or redis");
  if (o.tier_child == "redis" && o.redis.empty())
    throw RunnerError("--tier-child redis needs --redis");
  const Setup st = make_setup(o);
  return phase_json(child_phase(o, st, o.tier_child)).dump();
}

PrefixReport run_prefix_eval(const PrefixEvalOptions &o) {
  Setup st = make_setup(o);
  PrefixReport rep;
  rep.model = o.model;
  rep.model_path = st.model_path;
  rep.text_path = st.text_path;
  const Model &model = st.model;
  const ModelConfig &c = model.config();
  const int prompt_len = st.prompt_len;
  const std::vector<std::vector<int>> &prompts = st.prompts;
  rep.requests = o.requests;
  rep.prefix_tokens = o.prefix_tokens;
  rep.suffix_tokens = o.suffix_tokens;
  rep.block_size = o.block_size;
  rep.prompt_tokens_total = std::int64_t(o.requests) * prompt_len;
  rep.shared_prefix_share = double(o.prefix_tokens) / double(prompt_len);

  Transformer transformer(model);
  std::vector<double> logp;
  // Logits of the suffix positions of every request in the run without the
  // cache, compared with the run with it.
  std::vector<std::vector<float>> cold_logits(prompts.size());

  for (int pass = 0; pass < 2; ++pass) {
    const bool cached = pass == 1;
    PrefixRun &run = cached ? rep.with_cache : rep.without_cache;
    run.prefix_cache = cached;
    PoolSettings ps;
    ps.k_dtype = ps.v_dtype = KVC_DTYPE_F32;
    ps.block_size = static_cast<std::uint32_t>(o.block_size);
    ps.prefix_cache = cached;
    KvPool pool(c, ps, static_cast<std::uint32_t>(prompt_len), 4);
    std::vector<double> ttft;
    double nll = 0;
    std::int64_t nll_tokens = 0;
    const auto start = Clock::now();
    for (std::size_t r = 0; r < prompts.size(); ++r) {
      const std::vector<int> &prompt = prompts[r];
      const auto t0 = Clock::now();
      std::unique_ptr<AttnSequence> seq = cached
                                              ? std::make_unique<AttnSequence>(pool, r, c, prompt)
                                              : std::make_unique<AttnSequence>(pool, r, c);
      const int from = seq->cached_tokens();
      run.hit_tokens += from;
      run.hit_requests += from > 0 ? 1 : 0;
      std::vector<float> &mine = cold_logits[r];
      for (int p = from; p < prompt_len; ++p) {
        const float *logits = transformer.forward(*seq, prompt[static_cast<std::size_t>(p)], p);
        ++run.tokens_computed;
        if (p + 1 == prompt_len) ttft.push_back(ms_since(t0));
        if (p < o.prefix_tokens) continue;
        const std::size_t i = static_cast<std::size_t>(p - o.prefix_tokens) * c.vocab_size;
        if (!cached) {
          mine.insert(mine.end(), logits, logits + c.vocab_size);
        } else if (i + c.vocab_size <= mine.size()) {
          ++rep.positions_compared;
          if (std::memcmp(logits, &mine[i], sizeof(float) * c.vocab_size) != 0)
            rep.logprobs_identical = false;
          std::vector<double> cold;
          log_softmax(&mine[i], c.vocab_size, cold);
          log_softmax(logits, c.vocab_size, logp);
          for (int v = 0; v < c.vocab_size; ++v)
            rep.max_abs_logprob_diff =
                std::max(rep.max_abs_logprob_diff, std::fabs(cold[v] - logp[v]));
        }
        if (p + 1 < prompt_len) {
          log_softmax(logits, c.vocab_size, logp);
          nll -= logp[static_cast<std::size_t>(prompt[static_cast<std::size_t>(p) + 1])];
          ++nll_tokens;
        }
      }
      if (cached) seq->register_prefix(prompt);  // its whole blocks stay findable after the free
    }
    run.wall_seconds = std::chrono::duration<double>(Clock::now() - start).count();
    run.suffix_nll_mean = nll_tokens ? nll / double(nll_tokens) : 0.0;
    summarize(ttft, run);
    if (cached) {
      kvc_prefix_stats st;
      kvc_prefix_stats_init(&st);
      check_kvc(kvc_prefix_get_stats(pool.get(), &st), "kvc_prefix_get_stats");
      run.queried_tokens = st.queried_tokens;
      run.stats_hit_tokens = st.hit_tokens;
      run.registered_blocks = st.registered_blocks;
    }
    if (!cached) rep.logprobs_identical = true;  // until a compared position differs
  }
  const std::int64_t expected = std::int64_t(prompts.size()) * o.suffix_tokens;
  if (rep.positions_compared != expected) rep.logprobs_identical = false;
  if (!o.tier_dir.empty()) run_tiers(o, st, rep);
  return rep;
}

void print_prefix_report(const PrefixReport &r, std::FILE *out) {
  std::fprintf(out, "model   %s (%s)\ntext    %s\n", r.model.c_str(), r.model_path.c_str(),
               r.text_path.c_str());
  std::fprintf(
      out,
      "requests %d, one after another: a shared prefix of %d tokens (BOS and the text's first "
      "stories) + %d different tokens each;\nf32 storage, block size %d, library attention, "
      "one thread\n\n",
      r.requests, r.prefix_tokens, r.suffix_tokens, r.block_size);
  std::fprintf(out, "%-22s  %16s  %12s  %12s  %12s  %12s  %10s\n", "run", "tokens computed",
               "hit requests", "hit tokens", "TTFT mean ms", "TTFT p50 ms", "wall s");
  std::fprintf(out, "%s\n", std::string(108, '-').c_str());
  for (const PrefixRun *run : {&r.without_cache, &r.with_cache}) {
    char computed[64], hits[64], tokens[64];
    std::snprintf(computed, sizeof computed, "%lld / %lld",
                  static_cast<long long>(run->tokens_computed),
                  static_cast<long long>(r.prompt_tokens_total));
    std::snprintf(hits, sizeof hits, "%lld / %d", static_cast<long long>(run->hit_requests),
                  r.requests);
    std::snprintf(tokens, sizeof tokens, "%.1f%%",
                  100.0 * double(run->hit_tokens) / double(r.prompt_tokens_total));
    std::fprintf(out, "%-22s  %16s  %12s  %12s  %12.3f  %12.3f  %10.3f\n",
                 run->prefix_cache ? "with prefix cache" : "without prefix cache", computed, hits,
                 tokens, run->ttft_ms_mean, run->ttft_ms_p50, run->wall_seconds);
  }
  const double speedup =
      r.with_cache.ttft_ms_mean > 0 ? r.without_cache.ttft_ms_mean / r.with_cache.ttft_ms_mean : 0;
  std::fprintf(
      out,
      "\ntime to first token (request start to the logits of the last prompt position): %.2fx "
      "faster "
      "with the cache;\ntokens computed: %.1f%% of the run without it. Library counters: %llu "
      "tokens "
      "queried, %llu hit, %llu blocks registered.\n",
      speedup,
      100.0 * double(r.with_cache.tokens_computed) / double(r.without_cache.tokens_computed),
      static_cast<unsigned long long>(r.with_cache.queried_tokens),
      static_cast<unsigned long long>(r.with_cache.stats_hit_tokens),
      static_cast<unsigned long long>(r.with_cache.registered_blocks));
  std::fprintf(
      out,
      "log-probabilities of the %lld suffix positions: %s (max |difference| %.3g nats); mean "
      "suffix "
      "NLL %.6f vs %.6f nats\n",
      static_cast<long long>(r.positions_compared),
      r.logprobs_identical ? "identical in both runs, bit for bit" : "DIFFERENT between the runs",
      r.max_abs_logprob_diff, r.without_cache.suffix_nll_mean, r.with_cache.suffix_nll_mean);
}

void print_tier_report(const PrefixReport &r, std::FILE *out) {
  if (r.tiers.empty()) return;
  std::fprintf(
      out,
      "\ntiered run (docs/tiers.md): before each request the shared prefix is only in one place; "
      "TTFT includes the lookup and the load\n");
  std::fprintf(out, "%-22s  %9s  %13s  %13s  %12s  %12s  %12s  %s\n", "prefix served from",
               "requests", "tokens loaded", "tokens computed", "TTFT mean ms", "TTFT p50 ms",
               "load mean ms", "suffix NLL");
  std::fprintf(out, "%s\n", std::string(120, '-').c_str());
  for (const TierPhase &p : r.tiers) {
    if (!p.ran) {
      std::fprintf(out, "%-22s  skipped: %s\n", p.name.c_str(), p.skipped.c_str());
      continue;
    }
    std::fprintf(out, "%-22s  %9d  %13lld  %13lld  %12.3f  %12.3f  %12.3f  %.6f%s\n",
                 p.name.c_str(), p.requests, static_cast<long long>(p.tokens_loaded),
                 static_cast<long long>(p.tokens_computed), p.ttft_ms_mean, p.ttft_ms_p50,
                 p.load_ms_mean, p.suffix_nll_mean, p.nll_equal ? " (= compute)" : " (DIFFERS)");
  }
}

std::string prefix_json(const PrefixReport &r) {
  auto run_json = [&](const PrefixRun &run) {
    nlohmann::ordered_json j;
    j["prefix_cache"] = run.prefix_cache;
    j["tokens_computed"] = run.tokens_computed;
    j["hit_requests"] = run.hit_requests;
    j["hit_tokens"] = run.hit_tokens;
    j["hit_rate_requests"] = double(run.hit_requests) / double(r.requests);
    j["hit_rate_tokens"] = double(run.hit_tokens) / double(r.prompt_tokens_total);
    j["ttft_ms_mean"] = run.ttft_ms_mean;
    j["ttft_ms_p50"] = run.ttft_ms_p50;
    j["ttft_ms_max"] = run.ttft_ms_max;
    j["wall_seconds"] = run.wall_seconds;
    j["suffix_nll_mean"] = run.suffix_nll_mean;
    if (run.prefix_cache) {
      j["library_stats"] = {{"queried_tokens", run.queried_tokens},
                            {"hit_tokens", run.stats_hit_tokens},
                            {"registered_blocks", run.registered_blocks}};
    }
    return j;
  };
  nlohmann::ordered_json j;
  j["mode"] = "prefix";
  j["model"] = r.model;
  j["model_path"] = r.model_path;
  j["text"] = r.text_path;
  j["storage"] = "f32";
  j["block_size"] = r.block_size;
  j["requests"] = r.requests;
  j["prefix_tokens"] = r.prefix_tokens;
  j["suffix_tokens"] = r.suffix_tokens;
  j["prompt_tokens_total"] = r.prompt_tokens_total;
  j["shared_prefix_share"] = r.shared_prefix_share;
  j["without_cache"] = run_json(r.without_cache);
  j["with_cache"] = run_json(r.with_cache);
  j["ttft_speedup"] = r.with_cache.ttft_ms_mean > 0
                          ? r.without_cache.ttft_ms_mean / r.with_cache.ttft_ms_mean
                          : 0.0;
  j["logprobs_identical"] = r.logprobs_identical;
  j["positions_compared"] = r.positions_compared;
  j["max_abs_logprob_diff"] = r.max_abs_logprob_diff;
  if (!r.tiers.empty()) {
    nlohmann::ordered_json t = nlohmann::ordered_json::array();
    for (const TierPhase &p : r.tiers) t.push_back(phase_json(p));
    j["tiers"] = t;
  }
  return j.dump(2);
}

}  // namespace kvc_cli
