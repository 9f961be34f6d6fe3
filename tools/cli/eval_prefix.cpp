// SPDX-License-Identifier: Apache-2.0
#include "eval_prefix.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <nlohmann/json.hpp>
#include <set>

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

PrefixReport run_prefix_eval(const PrefixEvalOptions &o) {
  if (o.requests < 1 || o.requests > 4096) throw RunnerError("--requests must be in 1..4096");
  if (o.prefix_tokens < 1) throw RunnerError("--prefix-tokens must be >= 1 (BOS included)");
  if (o.suffix_tokens < 1) throw RunnerError("--suffix-tokens must be >= 1");
  if (o.block_size < 1 || o.block_size > 4096) throw RunnerError("--block-size must be in 1..4096");
  PrefixReport rep;
  rep.model = o.model;
  rep.model_path = resolve_model_path(o.model);
  rep.text_path = o.text.empty() ? shared_dir() + "/data/tinystories-valid-sample.txt" : o.text;
  const Model model = Model::load(rep.model_path);
  const ModelConfig &c = model.config();
  const Tokenizer tokenizer = Tokenizer::load(resolve_tokenizer_path(o.tokenizer, o.model), c.vocab_size);
  const std::int64_t prompt_len64 = std::int64_t(o.prefix_tokens) + o.suffix_tokens;
  if (prompt_len64 > c.seq_len) {
    throw RunnerError("--prefix-tokens + --suffix-tokens = " + std::to_string(prompt_len64) +
                      " is more than the model's context of " + std::to_string(c.seq_len));
  }
  const int prompt_len = static_cast<int>(prompt_len64);
  rep.requests = o.requests;
  rep.prefix_tokens = o.prefix_tokens;
  rep.suffix_tokens = o.suffix_tokens;
  rep.block_size = o.block_size;
  rep.prompt_tokens_total = std::int64_t(o.requests) * prompt_len;
  rep.shared_prefix_share = double(o.prefix_tokens) / double(prompt_len);

  // The shared prefix: BOS and the text's first stories (the same few-shot
  // context for every request). Each suffix is the next unused stretch of
  // text whose first block differs from every earlier suffix's, so reuse is
  // exactly the prefix's whole blocks.
  const std::vector<int> text = tokenizer.encode(read_text_file(rep.text_path, "text file"), false, false);
  std::vector<int> prefix = {kBosToken};
  prefix.insert(prefix.end(), text.begin(), text.begin() + std::min<std::size_t>(text.size(), o.prefix_tokens - 1));
  if (static_cast<int>(prefix.size()) < o.prefix_tokens) throw RunnerError("text file '" + rep.text_path + "' is too short");
  std::vector<std::vector<int>> prompts;
  std::set<std::vector<int>> first_blocks;
  const std::size_t head = static_cast<std::size_t>(std::min(o.block_size, o.suffix_tokens));
  for (std::size_t at = static_cast<std::size_t>(o.prefix_tokens - 1);
       static_cast<int>(prompts.size()) < o.requests && at + o.suffix_tokens <= text.size(); at += o.suffix_tokens) {
    std::vector<int> first(text.begin() + at, text.begin() + at + head);
    if (!first_blocks.insert(first).second) continue;
    std::vector<int> p = prefix;
    p.insert(p.end(), text.begin() + at, text.begin() + at + o.suffix_tokens);
    prompts.push_back(std::move(p));
  }
  if (static_cast<int>(prompts.size()) < o.requests) {
    throw RunnerError("text file '" + rep.text_path + "' holds too few distinct suffixes for " +
                      std::to_string(o.requests) + " requests");
  }

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
      std::unique_ptr<AttnSequence> seq = cached ? std::make_unique<AttnSequence>(pool, r, c, prompt)
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
          if (std::memcmp(logits, &mine[i], sizeof(float) * c.vocab_size) != 0) rep.logprobs_identical = false;
          std::vector<double> cold;
          log_softmax(&mine[i], c.vocab_size, cold);
          log_softmax(logits, c.vocab_size, logp);
          for (int v = 0; v < c.vocab_size; ++v)
            rep.max_abs_logprob_diff = std::max(rep.max_abs_logprob_diff, std::fabs(cold[v] - logp[v]));
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
  return rep;
}

void print_prefix_report(const PrefixReport &r, std::FILE *out) {
  std::fprintf(out, "model   %s (%s)\ntext    %s\n", r.model.c_str(), r.model_path.c_str(), r.text_path.c_str());
  std::fprintf(out,
               "requests %d, one after another: a shared prefix of %d tokens (BOS and the text's first "
               "stories) + %d different tokens each;\nf32 storage, block size %d, library attention, "
               "one thread\n\n",
               r.requests, r.prefix_tokens, r.suffix_tokens, r.block_size);
  std::fprintf(out, "%-22s  %16s  %12s  %12s  %12s  %12s  %10s\n", "run", "tokens computed", "hit requests",
               "hit tokens", "TTFT mean ms", "TTFT p50 ms", "wall s");
  std::fprintf(out, "%s\n", std::string(108, '-').c_str());
  for (const PrefixRun *run : {&r.without_cache, &r.with_cache}) {
    char computed[64], hits[64], tokens[64];
    std::snprintf(computed, sizeof computed, "%lld / %lld", static_cast<long long>(run->tokens_computed),
                  static_cast<long long>(r.prompt_tokens_total));
    std::snprintf(hits, sizeof hits, "%lld / %d", static_cast<long long>(run->hit_requests), r.requests);
    std::snprintf(tokens, sizeof tokens, "%.1f%%",
                  100.0 * double(run->hit_tokens) / double(r.prompt_tokens_total));
    std::fprintf(out, "%-22s  %16s  %12s  %12s  %12.3f  %12.3f  %10.3f\n",
                 run->prefix_cache ? "with prefix cache" : "without prefix cache", computed, hits, tokens,
                 run->ttft_ms_mean, run->ttft_ms_p50, run->wall_seconds);
  }
  const double speedup = r.with_cache.ttft_ms_mean > 0 ? r.without_cache.ttft_ms_mean / r.with_cache.ttft_ms_mean : 0;
  std::fprintf(out,
               "\ntime to first token (request start to the logits of the last prompt position): %.2fx faster "
               "with the cache;\ntokens computed: %.1f%% of the run without it. Library counters: %llu tokens "
               "queried, %llu hit, %llu blocks registered.\n",
               speedup,
               100.0 * double(r.with_cache.tokens_computed) / double(r.without_cache.tokens_computed),
               static_cast<unsigned long long>(r.with_cache.queried_tokens),
               static_cast<unsigned long long>(r.with_cache.stats_hit_tokens),
               static_cast<unsigned long long>(r.with_cache.registered_blocks));
  std::fprintf(out,
               "log-probabilities of the %lld suffix positions: %s (max |difference| %.3g nats); mean suffix "
               "NLL %.6f vs %.6f nats\n",
               static_cast<long long>(r.positions_compared),
               r.logprobs_identical ? "identical in both runs, bit for bit" : "DIFFERENT between the runs",
               r.max_abs_logprob_diff, r.without_cache.suffix_nll_mean, r.with_cache.suffix_nll_mean);
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
  j["ttft_speedup"] = r.with_cache.ttft_ms_mean > 0 ? r.without_cache.ttft_ms_mean / r.with_cache.ttft_ms_mean : 0.0;
  j["logprobs_identical"] = r.logprobs_identical;
  j["positions_compared"] = r.positions_compared;
  j["max_abs_logprob_diff"] = r.max_abs_logprob_diff;
  return j.dump(2);
}

}  // namespace kvc_cli
