// SPDX-License-Identifier: Apache-2.0
#include "eval.h"

#include <unistd.h>

#include <time.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <exception>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <thread>

#include "../runner/error.h"
#include "../runner/kv_cache.h"
#include "../runner/runner.h"
#include "../runner/transformer.h"
#include "memory.h"

namespace kvc_cli {
using namespace kvc_runner;

namespace {

using Clock = std::chrono::steady_clock;

/// CPU time of the calling thread in seconds: per-token costs stay honest when
/// the threads share the cores with other work.
double thread_cpu_seconds() {
  timespec ts{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return double(ts.tv_sec) + double(ts.tv_nsec) * 1e-9;
}

/// Sums of one strategy over one window; reduced in window order at the end
/// so the results do not depend on the number of threads.
struct WindowSums {
  double nll = 0, kl = 0, seconds = 0;
  std::int64_t top1 = 0, tokens = 0, positions = 0;
  // Cache size at the end of the window (full windows only): bytes in use
  // (codes, scales, zero points, residual blocks) and tokens held (all layers).
  double bytes_at_end = 0, tokens_at_end = 0, positions_at_end = 0;
  // Cache size after every forward pass, weighted by the positions it fed:
  // sum of bytes in use x positions, of tokens held x positions.
  double bytes_time = 0, tokens_time = 0;
  // Negative log-likelihood and targets per segment of positions.
  std::vector<double> seg_nll;
  std::vector<std::int64_t> seg_tokens;
  double late_nll = 0;  // targets at positions [ctx / 2, ctx)
  std::int64_t late_tokens = 0;
};

struct Window {
  std::size_t first = 0;  ///< index of its first content token
  int scored = 0;         ///< tokens scored (positions fed = scored + 1)
};

int argmax(const float *v, int n) {
  int best = 0;
  for (int i = 1; i < n; ++i) {
    if (v[i] > v[best]) best = i;
  }
  return best;
}

void progress_bar(std::int64_t done, std::int64_t total, double elapsed) {
  const int width = 40;
  const double f = total > 0 ? double(done) / double(total) : 1.0;
  const int filled = static_cast<int>(f * width);
  char bar[width + 1];
  for (int i = 0; i < width; ++i) bar[i] = i < filled ? '#' : '.';
  bar[width] = '\0';
  const double eta = f > 0 ? elapsed * (1.0 - f) / f : 0.0;
  std::fprintf(stderr, "\r[%s] %3.0f%%  %lld/%lld positions  %.0fs elapsed, ~%.0fs left ", bar,
               f * 100.0, static_cast<long long>(done), static_cast<long long>(total), elapsed, eta);
  std::fflush(stderr);
}

}  // namespace

EvalReport run_eval(const EvalOptions &opt) {
  EvalReport rep;
  rep.model = opt.model;
  rep.model_path = resolve_model_path(opt.model);
  rep.text_path = opt.text.empty() ? shared_dir() + "/data/tinystories-valid-sample.txt" : opt.text;

  const Model model = Model::load(rep.model_path);
  rep.tokenizer_path = resolve_tokenizer_path(opt.tokenizer, opt.model);
  const ModelConfig &c = model.config();
  const Tokenizer tokenizer = Tokenizer::load(rep.tokenizer_path, c.vocab_size);
  const std::string text = read_text_file(rep.text_path, "text file");
  rep.num_layers = c.n_layers;
  rep.num_q_heads = c.n_heads;
  rep.num_kv_heads = c.n_kv_heads;
  rep.head_dim = c.head_dim();

  // Windows: the trained context, at most kDefaultWindow positions (SmolLM2 is trained on 8,192).
  const int base_window = std::min(c.seq_len, kDefaultWindow);
  const int ctx = opt.ctx != 0 ? opt.ctx : opt.long_context ? kLongContextFactor * base_window : base_window;
  if (ctx < 2 || ctx > kMaxEvalContext) {
    throw RunnerError("--ctx " + std::to_string(ctx) + " is out of range: must be 2.." +
                      std::to_string(kMaxEvalContext) + " (the model's trained context is " +
                      std::to_string(c.seq_len) + ")");
  }
  if (opt.max_tokens < 0) throw RunnerError("--max-tokens must be >= 0");
  if (opt.segment < 0) throw RunnerError("--segment must be >= 1 (0: the model's seq_len)");
  rep.ctx = ctx;
  rep.trained_context = c.seq_len;
  const int segment = opt.segment > 0 ? opt.segment : base_window;
  rep.segment = segment;
  const std::size_t n_segments = static_cast<std::size_t>((ctx - 1) / segment + 1);
  if (n_segments > kMaxSegments) {
    throw RunnerError("--segment " + std::to_string(segment) + " cuts a window of " + std::to_string(ctx) + " into " +
                      std::to_string(n_segments) + " segments; at most " + std::to_string(kMaxSegments));
  }

  // A window's position 0 is BOS when the model's sequences start with it
  // (llama2.c); otherwise (SmolLM2's GGUF) the text token before the window's
  // first scored token, so the text's very first token is context only.
  const bool use_bos = c.add_bos;
  const int bos = tokenizer.bos_token();
  std::vector<int> tokens = tokenizer.encode(text, false, false);
  const std::int64_t lead = use_bos ? 0 : 1;
  if (static_cast<std::int64_t>(tokens.size()) <= lead) throw RunnerError("text file '" + rep.text_path + "' holds too few tokens");
  std::int64_t to_score = static_cast<std::int64_t>(tokens.size()) - lead;
  // GGUF models cost ~40x more per token: 4,096 tokens by default, and two
  // windows with --long.
  const std::int64_t max_tokens = !(opt.max_tokens_default && c.gguf) ? opt.max_tokens
                                  : opt.long_context                   ? 2 * std::int64_t(ctx - 1)
                                                                       : kGgufEvalTokens;
  if (max_tokens > 0) to_score = std::min(to_score, max_tokens);
  if (opt.chunk < 0) throw RunnerError("--chunk must be >= 1 (0: the model's default)");
  const int chunk = opt.chunk > 0 ? opt.chunk : c.gguf ? kGgufChunk : 1;
  rep.chunk = chunk;
  rep.bos = use_bos;
  std::vector<Window> windows;
  for (std::int64_t first = lead; first < lead + to_score; first += ctx - 1) {
    windows.push_back({static_cast<std::size_t>(first),
                       static_cast<int>(std::min<std::int64_t>(ctx - 1, lead + to_score - first))});
  }
  rep.windows = static_cast<int>(windows.size());
  rep.tokens_scored = to_score;

  // Row 0 is always the dense f32 reference; the listed strategies follow (f32 reuses row 0).
  std::vector<Strategy> rows;
  rows.push_back(parse_strategy("f32"));
  std::vector<int> row_of;  // for each listed strategy, its row
  for (const Strategy &s : opt.strategies) {
    if (s.spec == "f32") {
      row_of.push_back(0);
      continue;
    }
    auto it = std::find_if(rows.begin(), rows.end(), [&](const Strategy &r) { return r.spec == s.spec; });
    if (it != rows.end()) {
      row_of.push_back(static_cast<int>(it - rows.begin()));
    } else {
      row_of.push_back(static_cast<int>(rows.size()));
      rows.push_back(s);
    }
  }
  const std::size_t n_rows = rows.size();

  // Eviction policies (immutable, shared by every worker's pools).
  struct PolicyHolder {
    std::vector<kvc_policy *> p;
    ~PolicyHolder() {
      for (kvc_policy *x : p) kvc_policy_destroy(x);
    }
  } policies;
  policies.p.assign(rows.size(), nullptr);
  for (std::size_t r = 0; r < rows.size(); ++r) {
    const Strategy &s = rows[r];
    if (s.protocol == Strategy::Protocol::None) continue;
    kvc_policy_config pc;
    kvc_policy_config_init(&pc);
    pc.kind = s.policy_kind;
    pc.sink_tokens = s.sinks;
    pc.recent_fraction = s.recent_fraction;
    pc.window = s.obs_window;
    pc.kernel_size = s.kernel;
    pc.pooling = s.pooling;
    pc.schedule = s.schedule;
    pc.shift_positions = s.shift_positions ? 1u : 0u;
    if (s.protocol == Strategy::Protocol::Stream) {
      pc.budget_tokens = s.budget_tokens ? s.budget_tokens
                                         : static_cast<std::uint64_t>(std::ceil(s.budget * ctx - 1e-9));
      if (s.policy_kind == KVC_POLICY_STREAMING && pc.budget_tokens <= s.sinks) {
        throw RunnerError("strategy '" + s.spec + "': a cap of " + std::to_string(pc.budget_tokens) +
                          " tokens at ctx " + std::to_string(ctx) + " leaves no room for the window after " +
                          std::to_string(s.sinks) + " sinks");
      }
      pc.auto_evict = 1;
    } else {
      pc.compression_ratio = 1.0 - s.budget;  // kvpress: the fraction dropped from the prefill
    }
    check_kvc(kvc_policy_create(&pc, &policies.p[r]), "kvc_policy_create");
  }

  unsigned hw = std::thread::hardware_concurrency();
  int threads = opt.threads > 0 ? opt.threads : static_cast<int>(hw == 0 ? 1 : hw);
  threads = std::max(1, std::min(threads, rep.windows));
  rep.threads = threads;
  set_blas_threads(1);  // parallel over windows: one BLAS thread per worker

  WindowSums blank;
  blank.seg_nll.assign(n_segments, 0.0);
  blank.seg_tokens.assign(n_segments, 0);
  std::vector<std::vector<WindowSums>> sums(windows.size(), std::vector<WindowSums>(n_rows, blank));
  std::vector<WindowSums> array_sums(windows.size());
  std::vector<kvc_stats> row_stats(n_rows);
  std::vector<std::uint64_t> row_peak(n_rows, 0);
  std::mutex stats_mutex;
  std::atomic<std::size_t> next_window{0};
  std::atomic<std::int64_t> positions_done{0};
  std::exception_ptr failure;
  std::mutex failure_mutex;
  const int vocab = c.vocab_size;
  const std::int64_t total_positions =
      static_cast<std::int64_t>(n_rows + (opt.overhead ? 1 : 0)) * (to_score + rep.windows);

  auto worker = [&](int) {
    try {
      Transformer transformer(model, ctx);
      std::vector<std::unique_ptr<KvPool>> pools;
      for (const Strategy &s : rows) {
        const kvc_runner::PoolSettings ps = pool_settings(s);
        pools.push_back(std::make_unique<KvPool>(c, ps, static_cast<std::uint32_t>(ctx)));
      }
      std::unique_ptr<ArrayCache> array_cache;
      if (opt.overhead) array_cache = std::make_unique<ArrayCache>(c);
      std::vector<double> ref_logp(static_cast<std::size_t>(ctx - 1) * vocab);
      std::vector<double> ref_p(ref_logp.size());
      std::vector<int> ref_top1(static_cast<std::size_t>(ctx));
      std::vector<double> logp;
      for (;;) {
        const std::size_t w = next_window.fetch_add(1);
        if (w >= windows.size()) break;
        {
          std::lock_guard<std::mutex> lock(failure_mutex);
          if (failure) break;
        }
        const Window &win = windows[w];
        const int n_pos = win.scored + 1;
        auto token_at = [&](int pos) {
          return pos > 0 ? tokens[win.first + pos - 1] : use_bos ? bos : tokens[win.first - 1];
        };
        std::vector<int> win_tokens(static_cast<std::size_t>(n_pos));
        for (int pos = 0; pos < n_pos; ++pos) win_tokens[static_cast<std::size_t>(pos)] = token_at(pos);
        for (std::size_t r = 0; r < n_rows; ++r) {
          WindowSums &acc = sums[w][r];
          EvictionSettings ev;
          if (rows[r].protocol != Strategy::Protocol::None) {
            ev.policy = policies.p[r];
            ev.observe = rows[r].observe;
            ev.shift_positions = rows[r].shift_positions;
            if (rows[r].protocol == Strategy::Protocol::Stream) {
              ev.protocol = EvictionSettings::Protocol::Stream;
            } else {
              ev.protocol = EvictionSettings::Protocol::PrefillCompress;
              ev.prefill_tokens = std::max(1, static_cast<int>(rows[r].prefill_fraction * n_pos));
              ev.observe_window = static_cast<int>(rows[r].obs_window);
            }
          }
          AttnSequence seq(*pools[r], w, c, ev);
          const float *chunk_logits = nullptr;
          int chunk_from = 0, chunk_len = 0;
          for (int pos = 0; pos < n_pos; ++pos) {
            if (pos >= chunk_from + chunk_len) {
              // The next chunk: up to `chunk` positions, never across SnapKV's prefill boundary.
              chunk_from = pos;
              chunk_len = std::min(chunk, n_pos - pos);
              const int boundary = seq.prefill_boundary();
              if (boundary > pos && boundary < pos + chunk_len) chunk_len = boundary - pos;
              const double t0 = thread_cpu_seconds();
              chunk_logits = chunk_len == 1 && chunk == 1
                                 ? transformer.forward(seq, win_tokens[static_cast<std::size_t>(pos)], pos)
                                 : transformer.forward_chunk(seq, &win_tokens[static_cast<std::size_t>(pos)], chunk_len, pos);
              acc.seconds += thread_cpu_seconds() - t0;
              acc.positions += chunk_len;
              const kvc_stats now = pools[r]->stats();
              acc.bytes_time += double(now.bytes_in_use) * chunk_len;
              acc.tokens_time += double(now.tokens_stored) * chunk_len;
            }
            const float *logits = chunk_logits + std::size_t(pos - chunk_from) * vocab;
            if (pos + 1 >= n_pos) break;  // its prediction belongs to the next window
            const int target = tokens[win.first + pos];
            log_softmax(logits, vocab, logp);
            const int top1 = argmax(logits, vocab);
            double *ref = &ref_logp[std::size_t(pos) * vocab];
            double *p_ref = &ref_p[std::size_t(pos) * vocab];
            if (r == 0) {
              std::copy(logp.begin(), logp.end(), ref);
              for (int i = 0; i < vocab; ++i) p_ref[i] = std::exp(ref[i]);
              ref_top1[pos] = top1;
              acc.top1 += 1;
            } else {
              double kl = 0.0;
              for (int i = 0; i < vocab; ++i) kl += p_ref[i] * (ref[i] - logp[i]);
              acc.kl += kl;
              acc.top1 += top1 == ref_top1[pos] ? 1 : 0;
            }
            acc.nll -= logp[target];
            ++acc.tokens;
            const std::size_t seg = static_cast<std::size_t>((pos + 1) / segment);  // the target's position
            acc.seg_nll[seg] -= logp[target];
            ++acc.seg_tokens[seg];
            if (2 * (pos + 1) >= ctx) {
              acc.late_nll -= logp[target];
              ++acc.late_tokens;
            }
          }
          if (n_pos == ctx || windows.size() == 1) {  // the cache of a whole window, measured
            const kvc_stats st = pools[r]->stats();
            acc.bytes_at_end += double(st.bytes_in_use);
            acc.tokens_at_end += double(st.tokens_stored);
            acc.positions_at_end += double(n_pos) * c.n_layers;
          }
          positions_done += n_pos;
        }
        if (array_cache) {
          WindowSums &acc = array_sums[w];
          for (int pos = 0; pos < n_pos; ++pos) {
            const double t0 = thread_cpu_seconds();
            transformer.forward(*array_cache, win_tokens[static_cast<std::size_t>(pos)], pos);
            acc.seconds += thread_cpu_seconds() - t0;
            ++acc.positions;
          }
          positions_done += n_pos;
        }
      }
      std::lock_guard<std::mutex> lock(stats_mutex);
      for (std::size_t r = 0; r < n_rows; ++r) {
        row_stats[r] = pools[r]->stats();
        row_peak[r] = std::max(row_peak[r], row_stats[r].peak_bytes_in_use);
      }
    } catch (...) {
      std::lock_guard<std::mutex> lock(failure_mutex);
      if (!failure) failure = std::current_exception();
    }
  };

  const auto start = Clock::now();
  std::vector<std::thread> pool_threads;
  for (int t = 0; t < threads; ++t) pool_threads.emplace_back(worker, t);
  const bool show_progress = opt.progress && isatty(STDERR_FILENO);
  if (show_progress) {
    for (;;) {
      const std::int64_t done = positions_done.load();
      progress_bar(done, total_positions, std::chrono::duration<double>(Clock::now() - start).count());
      if (done >= total_positions) break;
      {
        std::lock_guard<std::mutex> lock(failure_mutex);
        if (failure) break;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(250));
    }
  }
  for (std::thread &t : pool_threads) t.join();
  if (show_progress) std::fprintf(stderr, "\n");
  if (failure) std::rethrow_exception(failure);
  rep.wall_seconds = std::chrono::duration<double>(Clock::now() - start).count();

  // f16 bytes per token, measured from a pool, for the compression column.
  std::uint64_t f16_bytes_per_token = 0;
  {
    KvPool f16_pool(c, KVC_DTYPE_F16, KVC_DTYPE_F16, 16);
    f16_bytes_per_token = f16_pool.stats().bytes_per_token;
  }
  const double elements_per_token = 2.0 * c.n_layers * c.n_kv_heads * c.head_dim();

  std::vector<StrategyResult> row_results(n_rows);
  for (std::size_t r = 0; r < n_rows; ++r) {
    WindowSums total;
    for (std::size_t w = 0; w < windows.size(); ++w) {
      const WindowSums &s = sums[w][r];
      total.nll += s.nll;
      total.kl += s.kl;
      total.seconds += s.seconds;
      total.top1 += s.top1;
      total.tokens += s.tokens;
      total.positions += s.positions;
      total.bytes_at_end += s.bytes_at_end;
      total.tokens_at_end += s.tokens_at_end;
      total.positions_at_end += s.positions_at_end;
      total.bytes_time += s.bytes_time;
      total.tokens_time += s.tokens_time;
      total.late_nll += s.late_nll;
      total.late_tokens += s.late_tokens;
      if (total.seg_nll.empty()) {
        total.seg_nll.assign(n_segments, 0.0);
        total.seg_tokens.assign(n_segments, 0);
      }
      for (std::size_t k = 0; k < n_segments; ++k) {
        total.seg_nll[k] += s.seg_nll[k];
        total.seg_tokens[k] += s.seg_tokens[k];
      }
    }
    StrategyResult &res = row_results[r];
    res.strategy = rows[r].spec;
    res.reference = r == 0;
    // Measured at the end of every full window: bytes in use over tokens held
    // (so residual f16 tokens, scales and zero points all count).
    // Without a full window (a text shorter than ctx) the last blocks are
    // partly filled; the pool's exact per-token size is used instead.
    const bool full_window = windows.front().scored + 1 == ctx;
    const double bytes_per_token = full_window && total.tokens_at_end > 0
                                       ? total.bytes_at_end / (total.tokens_at_end / c.n_layers)
                                       : double(row_stats[r].bytes_per_token);
    res.kv_bytes_per_token = static_cast<std::uint64_t>(std::llround(bytes_per_token));
    res.bits_per_element = bytes_per_token * 8.0 / elements_per_token;
    res.mean_bits_per_element =
        total.tokens_time > 0 ? total.bytes_time / (total.tokens_time / c.n_layers) * 8.0 / elements_per_token
                              : res.bits_per_element;
    res.peak_kv_bytes = row_peak[r];
    res.compression_vs_f16 = bytes_per_token > 0 ? double(f16_bytes_per_token) / bytes_per_token : 0.0;
    res.ppl = std::exp(total.nll / double(total.tokens));
    res.kl_mean = total.kl / double(total.tokens);
    res.top1_agreement = double(total.top1) / double(total.tokens);
    res.ms_per_token = total.seconds * 1000.0 / double(total.positions);
    res.kept_fraction = total.positions_at_end > 0 ? total.tokens_at_end / total.positions_at_end : 1.0;
    res.effective_bits_per_element = res.bits_per_element * res.kept_fraction;
    for (std::size_t k = 0; k < n_segments; ++k) {
      res.segment_ppl.push_back(total.seg_tokens[k] > 0 ? std::exp(total.seg_nll[k] / double(total.seg_tokens[k]))
                                                        : 0.0);
    }
    res.second_half_ppl = total.late_tokens > 0 ? std::exp(total.late_nll / double(total.late_tokens)) : 0.0;
    if (r == 0) rep.positions_fed = total.positions;
  }
  for (StrategyResult &res : row_results) {
    res.ppl_delta_pct = (res.ppl - row_results[0].ppl) / row_results[0].ppl * 100.0;
  }
  // Output rows: the reference first, then the listed strategies in order (no duplicates).
  rep.results.push_back(row_results[0]);
  std::vector<bool> emitted(n_rows, false);
  emitted[0] = true;
  for (int r : row_of) {
    if (!emitted[r]) {
      emitted[r] = true;
      rep.results.push_back(row_results[r]);
    }
  }
  if (opt.overhead) {
    double seconds = 0;
    std::int64_t positions = 0;
    for (const WindowSums &s : array_sums) {
      seconds += s.seconds;
      positions += s.positions;
    }
    rep.has_overhead = true;
    rep.array_ms_per_token = seconds * 1000.0 / double(positions);
    rep.pool_f32_ms_per_token = row_results[0].ms_per_token;
  }
  return rep;
}


void print_eval_table(const EvalReport &rep, std::FILE *out) {
  std::fprintf(out, "model   %s (%s): %d layers, %d query heads, %d KV heads, head_dim %d\n",
               rep.model.c_str(), rep.model_path.c_str(), rep.num_layers, rep.num_q_heads,
               rep.num_kv_heads, rep.head_dim);
  std::fprintf(out, "text    %s\n", rep.text_path.c_str());
  std::fprintf(out,
               "scored  %lld tokens in %d window%s of ctx %d (teacher forcing, each window starts "
               "with %s); reference: dense f32%s\n",
               static_cast<long long>(rep.tokens_scored), rep.windows, rep.windows == 1 ? "" : "s", rep.ctx,
               rep.bos ? "BOS" : "the token before its first scored one",
               rep.chunk > 1 ? (", forward pass in chunks of " + std::to_string(rep.chunk) + " positions").c_str() : "");
  if (rep.ctx > rep.trained_context) {
    std::fprintf(out,
                 "note    ctx %d is above the model's trained context of %d positions: dense caches run "
                 "positions it never saw\n",
                 rep.ctx, rep.trained_context);
  }
  std::fprintf(out, "\n");
  std::vector<std::vector<std::string>> cells;
  cells.push_back({"strategy", "bits/elem", "mean bits", "KV B/token", "kept", "peak KV", "vs f16", "ppl", "ppl Δ%",
                   "KL mean", "top-1", "ms/token"});
  char buf[64];
  for (const StrategyResult &r : rep.results) {
    std::vector<std::string> row;
    row.push_back(r.strategy);
    std::snprintf(buf, sizeof buf, "%.2f", r.bits_per_element);
    row.push_back(buf);
    std::snprintf(buf, sizeof buf, "%.2f", r.mean_bits_per_element);
    row.push_back(buf);
    row.push_back(std::to_string(r.kv_bytes_per_token));
    std::snprintf(buf, sizeof buf, "%.1f%%", r.kept_fraction * 100.0);
    row.push_back(buf);
    row.push_back(human_bytes(static_cast<long double>(r.peak_kv_bytes)));
    std::snprintf(buf, sizeof buf, "%.2fx", r.compression_vs_f16);
    row.push_back(buf);
    std::snprintf(buf, sizeof buf, "%.6f", r.ppl);
    row.push_back(buf);
    std::snprintf(buf, sizeof buf, "%+.5f", r.ppl_delta_pct);
    row.push_back(buf);
    std::snprintf(buf, sizeof buf, "%.3e", r.kl_mean);
    row.push_back(buf);
    std::snprintf(buf, sizeof buf, "%.4f", r.top1_agreement);
    row.push_back(buf);
    std::snprintf(buf, sizeof buf, "%.4f", r.ms_per_token);
    row.push_back(buf);
    cells.push_back(row);
  }
  // Column widths counted in code points (the header holds a 'Δ').
  auto width = [](const std::string &s) {
    std::size_t n = 0;
    for (unsigned char ch : s) n += (ch & 0xC0) != 0x80;
    return n;
  };
  std::vector<std::size_t> widths(cells[0].size(), 0);
  for (const auto &row : cells) {
    for (std::size_t i = 0; i < row.size(); ++i) widths[i] = std::max(widths[i], width(row[i]));
  }
  for (std::size_t k = 0; k < cells.size(); ++k) {
    std::string line;
    for (std::size_t i = 0; i < cells[k].size(); ++i) {
      const std::string &s = cells[k][i];
      const std::string pad(widths[i] - width(s), ' ');
      line += i == 0 ? s + pad : "  " + pad + s;  // first column left, numbers right
    }
    std::fprintf(out, "%s\n", line.c_str());
    if (k == 0) {
      std::size_t total = 0;
      for (std::size_t w : widths) total += w + 2;
      std::fprintf(out, "%s\n", std::string(total - 2, '-').c_str());
    }
  }
  std::fprintf(out,
               "\nbits/elem: bits held per stored element at the end of each full window; mean bits: the same "
               "averaged over every forward pass (partly filled blocks and tokens staged in f16 count while they "
               "exist);\n"
               "kept: K/V tokens held at the end of a full window over positions fed (eviction); "
               "KL: mean KL(dense f32 || strategy) over the full vocabulary, nats per token; top-1: "
               "share of positions whose argmax equals the dense one;\nms/token: CPU time of "
               "the forward pass with the cache, per position. Wall time %.1f s on %d thread(s).\n",
               rep.wall_seconds, rep.threads);
  const std::size_t n_segments = rep.results.empty() ? 0 : rep.results[0].segment_ppl.size();
  if (n_segments > 1) {
    std::fprintf(out, "\nperplexity per segment of %d positions (targets at positions [from, to)):\n\n",
                 rep.segment);
    std::string head = "strategy";
    std::size_t name_w = head.size();
    for (const StrategyResult &r : rep.results) name_w = std::max(name_w, r.strategy.size());
    std::string line = head + std::string(name_w - head.size(), ' ');
    for (std::size_t k = 0; k < n_segments; ++k) {
      const int from = static_cast<int>(k) * rep.segment, to = std::min(rep.ctx, from + rep.segment);
      std::snprintf(buf, sizeof buf, "%d-%d", from, to);
      line += "  " + std::string(std::max<int>(0, 10 - static_cast<int>(std::strlen(buf))), ' ') + buf;
    }
    std::snprintf(buf, sizeof buf, "%d-%d / 0-%d", rep.ctx / 2, rep.ctx, rep.segment);
    line += "  " + std::string(buf);
    std::fprintf(out, "%s\n%s\n", line.c_str(), std::string(line.size(), '-').c_str());
    for (const StrategyResult &r : rep.results) {
      line = r.strategy + std::string(name_w - r.strategy.size(), ' ');
      for (double p : r.segment_ppl) {
        if (p > 0) std::snprintf(buf, sizeof buf, "%10.4f", p);
        else std::snprintf(buf, sizeof buf, "%10s", "-");  // no scored target in this segment
        line += "  " + std::string(buf);
      }
      if (r.segment_ppl[0] > 0 && r.second_half_ppl > 0)
        std::snprintf(buf, sizeof buf, "%.3fx", r.second_half_ppl / r.segment_ppl[0]);
      else
        std::snprintf(buf, sizeof buf, "-");
      line += "  " + std::string(buf);
      std::fprintf(out, "%s\n", line.c_str());
    }
  }
  if (rep.has_overhead) {
    std::fprintf(out,
                 "Overhead: plain array cache %.4f ms/token, f32 pool %.4f ms/token: %.3fx\n",
                 rep.array_ms_per_token, rep.pool_f32_ms_per_token,
                 rep.pool_f32_ms_per_token / rep.array_ms_per_token);
  }
}

std::string read_peer_report(const std::string &path) {
  const std::string text = read_text_file(path, "peer report");
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(text);
  } catch (const std::exception &e) {
    throw RunnerError("peer report '" + path + "' is not JSON: " + e.what());
  }
  if (!j.is_object() || !j.contains("results") || !j["results"].is_array() || j["results"].empty())
    throw RunnerError("peer report '" + path + "' has no results (expected bench/peers/llamacpp_kv.py --json output)");
  for (const auto &r : j["results"]) {
    for (const char *k : {"strategy", "bits_per_element", "kv_bytes_per_token", "ppl", "ppl_delta_pct", "kl_mean"})
      if (!r.contains(k)) throw RunnerError("peer report '" + path + "': a result lacks '" + k + "'");
    if (!r["strategy"].is_string() || !r["bits_per_element"].is_number() || !r["ppl"].is_number() ||
        !r["ppl_delta_pct"].is_number() || !r["kl_mean"].is_number() || !r["kv_bytes_per_token"].is_number())
      throw RunnerError("peer report '" + path + "': a result has a field of the wrong type");
  }
  return text;
}

void print_peer_table(const EvalReport &rep, const std::string &peer, std::FILE *out) {
  const nlohmann::json j = nlohmann::json::parse(peer);
  std::fprintf(out, "\nside by side with %s (%s; %s windows of ctx %s, %s tokens scored). Our rows against dense "
                    "f32, the peer's against its own f16 K/V:\n\n",
               j.value("peer", std::string("peer")).c_str(), j.value("model", std::string("?")).c_str(),
               j.contains("windows") ? j["windows"].dump().c_str() : "?", j.contains("ctx") ? j["ctx"].dump().c_str() : "?",
               j.contains("tokens_scored") ? j["tokens_scored"].dump().c_str() : "?");
  struct Row {
    std::string name;
    double bits, bytes, ppl, delta, kl;
  };
  std::vector<Row> rows;
  for (const StrategyResult &r : rep.results)
    rows.push_back({r.strategy, r.effective_bits_per_element, double(r.kv_bytes_per_token) * r.kept_fraction, r.ppl,
                    r.ppl_delta_pct, r.kl_mean});
  for (const auto &r : j["results"])
    rows.push_back({r["strategy"].get<std::string>(), r["bits_per_element"].get<double>(),
                    r["kv_bytes_per_token"].get<double>(), r["ppl"].get<double>(), r["ppl_delta_pct"].get<double>(),
                    r["kl_mean"].get<double>()});
  std::stable_sort(rows.begin(), rows.end(), [](const Row &a, const Row &b) { return a.bits < b.bits; });
  std::size_t w = 8;
  for (const Row &r : rows) w = std::max(w, r.name.size());
  std::fprintf(out, "%-*s  %9s  %12s  %10s  %10s  %10s\n", static_cast<int>(w), "strategy", "eff. bits", "B/position",
               "ppl", "ppl Δ%", "KL mean");
  std::fprintf(out, "%s\n", std::string(w + 60, '-').c_str());
  for (const Row &r : rows)
    std::fprintf(out, "%-*s  %9.2f  %12.0f  %10.5f  %+10.4f  %10.3e\n", static_cast<int>(w), r.name.c_str(), r.bits,
                 r.bytes, r.ppl, r.delta, r.kl);
  std::fprintf(out, "\neff. bits: bits per element x share of positions held; B/position: KV bytes per position "
                    "of the window.\n");
}

std::string eval_json(const EvalReport &rep, const std::string &peer) {
  nlohmann::ordered_json j;
  j["model"] = rep.model;
  j["model_path"] = rep.model_path;
  j["tokenizer"] = rep.tokenizer_path;
  j["text"] = rep.text_path;
  j["ctx"] = rep.ctx;
  j["trained_context"] = rep.trained_context;
  j["chunk"] = rep.chunk;
  j["segment"] = rep.segment;
  j["windows"] = rep.windows;
  j["tokens_scored"] = rep.tokens_scored;
  j["geometry"] = {{"num_layers", rep.num_layers},
                   {"num_q_heads", rep.num_q_heads},
                   {"num_kv_heads", rep.num_kv_heads},
                   {"head_dim", rep.head_dim}};
  j["threads"] = rep.threads;
  j["wall_seconds"] = rep.wall_seconds;
  nlohmann::ordered_json results = nlohmann::ordered_json::array();
  for (const StrategyResult &r : rep.results) {
    nlohmann::ordered_json o;
    o["strategy"] = r.strategy;
    o["reference"] = r.reference;
    o["bits_per_element"] = r.bits_per_element;
    o["kv_bytes_per_token"] = r.kv_bytes_per_token;
    o["peak_kv_bytes"] = r.peak_kv_bytes;
    o["compression_vs_f16"] = r.compression_vs_f16;
    o["ppl"] = r.ppl;
    o["ppl_delta_pct"] = r.ppl_delta_pct;
    o["kl_mean"] = r.kl_mean;
    o["top1_agreement"] = r.top1_agreement;
    o["ms_per_token"] = r.ms_per_token;
    o["kept_fraction"] = r.kept_fraction;
    o["effective_bits_per_element"] = r.effective_bits_per_element;
    o["mean_bits_per_element"] = r.mean_bits_per_element;
    // A segment without a scored target (a text shorter than the window) is null.
    nlohmann::ordered_json seg = nlohmann::ordered_json::array();
    for (double p : r.segment_ppl) seg.push_back(p > 0 ? nlohmann::ordered_json(p) : nlohmann::ordered_json());
    o["segment_ppl"] = seg;
    o["second_half_ppl"] = r.second_half_ppl > 0 ? nlohmann::ordered_json(r.second_half_ppl) : nlohmann::ordered_json();
    results.push_back(o);
  }
  j["results"] = results;
  if (!peer.empty()) j["peer"] = nlohmann::ordered_json::parse(peer);
  if (rep.has_overhead) {
    j["overhead"] = {{"array_ms_per_token", rep.array_ms_per_token},
                     {"pool_f32_ms_per_token", rep.pool_f32_ms_per_token},
                     {"ratio", rep.pool_f32_ms_per_token / rep.array_ms_per_token}};
  }
  return j.dump(2);
}

namespace {
std::string extension_of(const std::string &path) {
  const std::size_t dot = path.find_last_of('.');
  if (dot == std::string::npos) return "";
  std::string ext = path.substr(dot + 1);
  std::transform(ext.begin(), ext.end(), ext.begin(), [](unsigned char ch) { return static_cast<char>(std::tolower(ch)); });
  return ext;
}

std::string gnuplot_quote(const std::string &s) {
  std::string out = "'";
  for (char ch : s) {
    if (ch == '\'') out += "''";
    else out += ch;
  }
  return out + "'";
}
}  // namespace

void check_plot_target(const std::string &path) {
  const std::string ext = extension_of(path);
  if (ext != "png" && ext != "svg") {
    throw RunnerError("--plot '" + path + "': the file name must end in .png or .svg");
  }
  if (path.find_first_of("\n\r") != std::string::npos)
    throw RunnerError("--plot: the file name must not contain a line break");
  std::error_code ec;
  const std::filesystem::path p(path);
  if (std::filesystem::is_directory(p, ec)) throw RunnerError("--plot '" + path + "' is a directory");
  const std::filesystem::path dir = p.has_parent_path() ? p.parent_path() : std::filesystem::path(".");
  if (!std::filesystem::is_directory(dir, ec))
    throw RunnerError("--plot '" + path + "': folder '" + dir.string() + "' does not exist");
  if (access(dir.c_str(), W_OK) != 0)
    throw RunnerError("--plot '" + path + "': folder '" + dir.string() + "' is not writable");
  if (std::system("gnuplot --version > /dev/null 2>&1") != 0) {
    throw RunnerError("--plot needs gnuplot, which was not found on PATH (install it, e.g. "
                      "apt-get install gnuplot-nox, or leave out --plot)");
  }
}

void write_plot(const EvalReport &rep, const std::string &path) {
  check_plot_target(path);
  const std::string ext = extension_of(path);
  // gnuplot's own output (should `set output` fail, the image itself) goes to
  // stderr, never into our stdout (which may hold the JSON report).
  std::fflush(stdout);
  FILE *gp = popen("gnuplot 1>&2", "w");
  if (gp == nullptr) throw RunnerError("cannot start gnuplot");
  std::fprintf(gp, "set terminal %s size 1000,650\n", ext == "svg" ? "svg" : "png");
  std::fprintf(gp, "set output %s\n", gnuplot_quote(path).c_str());
  std::fprintf(gp, "set grid\nset termoption noenhanced\n");  // strategy names hold '_' and '^'
  const std::size_t n_segments = rep.results.empty() ? 0 : rep.results[0].segment_ppl.size();
  if (n_segments > 1) {
    // Long context: perplexity per segment, one line per strategy.
    std::fprintf(gp, "set title %s\n",
                 gnuplot_quote("Perplexity per segment of " + std::to_string(rep.segment) + " positions: " +
                               rep.model + ", ctx " + std::to_string(rep.ctx) + " (trained " +
                               std::to_string(rep.trained_context) + "), " +
                               std::to_string(rep.tokens_scored) + " tokens").c_str());
    std::fprintf(gp, "set xlabel 'position (start of segment)'\nset ylabel 'perplexity'\n");
    std::fprintf(gp, "set logscale y\nset key top left\n");
    std::fprintf(gp, "set arrow from %d, graph 0 to %d, graph 1 nohead dashtype 2\n", rep.trained_context,
                 rep.trained_context);
    for (std::size_t r = 0; r < rep.results.size(); ++r) {
      std::fprintf(gp, "$s%zu << EOD\n", r);
      for (std::size_t k = 0; k < n_segments; ++k) {
        if (rep.results[r].segment_ppl[k] > 0)
          std::fprintf(gp, "%zu %.9g\n", k * static_cast<std::size_t>(rep.segment), rep.results[r].segment_ppl[k]);
      }
      std::fprintf(gp, "EOD\n");
    }
    std::string cmd = "plot ";
    for (std::size_t r = 0; r < rep.results.size(); ++r) {
      cmd += (r ? ", " : "") + std::string("$s") + std::to_string(r) + " using 1:2 with linespoints lw 2 title " +
             gnuplot_quote(rep.results[r].strategy + (rep.results[r].reference ? " (dense)" : ""));
    }
    std::fprintf(gp, "%s\n", cmd.c_str());
  } else {
    std::fprintf(gp, "set title %s\n",
                 gnuplot_quote("KV-cache quality loss vs storage size: " + rep.model + ", " +
                               std::to_string(rep.tokens_scored) + " tokens, ctx " +
                               std::to_string(rep.ctx)).c_str());
    // Changes from -1 % to +3000 % on one axis: a symmetric log scale,
    // y = sign(d) log10(1 + |d| / 0.1 %), linear below 0.1 %, labelled in percent.
    auto symlog = [](double pct) { return (pct < 0 ? -1.0 : 1.0) * std::log10(1.0 + std::fabs(pct) / 0.1); };
    std::fprintf(gp, "set xlabel 'effective bits per K/V element (bits of a held token x share of positions held; log scale)'\n");
    std::fprintf(gp, "set ylabel 'perplexity change vs dense f32 (symmetric log scale)'\n");
    std::fprintf(gp, "set logscale x 2\nset xtics (1, 2, 3, 4, 6, 8, 12, 16, 24, 32)\n");
    std::string tics;
    for (const double pct : {-10.0, -1.0, -0.1, 0.0, 0.1, 0.3, 1.0, 3.0, 10.0, 30.0, 100.0, 300.0, 1000.0, 3000.0}) {
      char t[64];
      // (gnuplot reads tic labels as formats: '%%' there is a literal percent sign)
      std::snprintf(t, sizeof t, "%s'%s%g%s' %.6f", tics.empty() ? "" : ", ", pct > 0 ? "+" : "", pct,
                    pct == 0 ? "" : "%%", symlog(pct));
      tics += t;
    }
    std::fprintf(gp, "set ytics (%s)\n", tics.c_str());
    std::fprintf(gp, "set key top right\nset offsets graph 0.05, graph 0.2, graph 0.05, graph 0.05\n");
    std::string cmd;
    for (int evicting = 0; evicting < 2; ++evicting) {
      std::string rows;
      for (const StrategyResult &r : rep.results) {
        if ((r.kept_fraction < 1.0) != (evicting == 1)) continue;
        char line[512];
        std::snprintf(line, sizeof line, "%.6f %.9g \"%s\"\n", r.effective_bits_per_element, symlog(r.ppl_delta_pct),
                      r.strategy.c_str());
        rows += line;
      }
      if (rows.empty()) continue;  // gnuplot warns about an empty series
      std::fprintf(gp, "$d%d << EOD\n%sEOD\n", evicting, rows.c_str());
      const std::string d = "$d" + std::to_string(evicting);
      cmd += std::string(cmd.empty() ? "plot " : ", ") + d + " using 1:2 with points " +
             (evicting ? "pt 5 ps 1.3 lc rgb '#d62728' title 'eviction (tokens dropped)'"
                       : "pt 7 ps 1.3 lc rgb '#1f77b4' title 'all tokens held (codecs)'") +
             ", " + d + " using 1:2:3 with labels left offset 0.6,0 font ',7' notitle";
    }
    std::fprintf(gp, "%s\n", cmd.c_str());
  }
  const int rc = pclose(gp);
  if (rc != 0) throw RunnerError("gnuplot failed to write '" + path + "'");
}

}  // namespace kvc_cli
