// SPDX-License-Identifier: Apache-2.0
// `kvcache eval`, running: every strategy over every window of the text,
// teacher-forced, in worker threads, against the dense f32 reference; the
// sums reduced in window order into one StrategyResult per strategy.
#include <unistd.h>

#include <time.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <exception>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "../runner/error.h"
#include "../runner/kv_cache.h"
#include "../runner/runner.h"
#include "../runner/transformer.h"
#include "eval.h"
#include "duo_gates.h"
#include "codebook_fit.h"
#include "key_stats.h"
#include "eval_load.h"
#include "strategy.h"

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

/// Block size of the dense f16 pool the memory columns compare with.
constexpr int kF16Block = 16;
int round_up_block(int n) {
  return (n + kF16Block - 1) / kF16Block * kF16Block;
}

/// Sums of one strategy over one window; reduced in window order at the end
/// so the results do not depend on the number of threads.
struct WindowSums {
  double nll = 0, kl = 0, seconds = 0;
  std::int64_t top1 = 0, tokens = 0, positions = 0;
  // Cache size at the end of the window (full windows only): bytes in use
  // (codes, scales, zero points, residual blocks) and tokens held (all layers).
  double bytes_at_end = 0, tokens_at_end = 0, positions_at_end = 0;
  // Slots a dense f16 pool (blocks of kF16Block) holds for the same windows.
  double f16_slots_at_end = 0;
  // Cache size after every forward pass, weighted by the positions it fed:
  // sum of bytes in use x positions, of tokens held x positions.
  double bytes_time = 0, tokens_time = 0;
  // Negative log-likelihood and targets per segment of positions.
  std::vector<double> seg_nll;
  std::vector<std::int64_t> seg_tokens;
  double late_nll = 0;  // targets at positions [ctx / 2, ctx)
  std::int64_t late_tokens = 0;
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
               f * 100.0, static_cast<long long>(done), static_cast<long long>(total), elapsed,
               eta);
  std::fflush(stderr);
}

/// The repeat instructions of KVzip's reconstruction passes: the first
/// chunk's, and the later chunks' (followed by the previous chunk's last
/// kRepeatOverlap tokens), as the KVzip paper and kvpress word them.
struct RepeatPrompts {
  std::vector<int> first, next;
};
constexpr int kRepeatOverlap = 8;

/// KVzip's context reconstruction (arXiv 2505.23416) for the prefill of `seq`
/// (positions [0, P), P = seq.prefill_boundary()): the context tokens
/// 1..P-1 are fed again after a repeat instruction, `rchunk` of them per
/// pass, each pass on a fresh fork of `seq` (its blocks shared) whose
/// attention records every token's largest probability (KVC_OBSERVE_MAX);
/// the maxima of positions [0, P) over all passes replace `seq`'s recorded
/// scores (kvc_seq_observe_scores), which KVC_POLICY_KVZIP then ranks.
/// Unlike kvpress, whose score softmax covers the sinks, the chunk and the
/// pass's own tokens, ours is the model's attention over the whole fork.
/// Each pass holds P + |prompt| + rchunk tokens at most; the forks are freed.
void reconstruct_context(Transformer &transformer, AttnSequence &seq, const ModelConfig &c,
                         const std::vector<int> &win_tokens, const RepeatPrompts &prompts,
                         int rchunk, std::uint64_t fork_id) {
  const int P = seq.prefill_boundary();
  const std::size_t heads = static_cast<std::size_t>(c.n_kv_heads);
  std::vector<std::vector<float>> best(static_cast<std::size_t>(c.n_layers),
                                       std::vector<float>(std::size_t(P) * heads, 0.0f));
  std::vector<float> got;
  constexpr int kRows = 64;  // forward_chunk rows per call
  for (int c0 = std::min(1, P - 1); c0 < P; c0 += rchunk) {
    const int c1 = std::min(P, c0 + rchunk);
    std::vector<int> feed(c0 <= 1 ? prompts.first : prompts.next);
    if (c0 > 1)  // "..., starting with" the previous chunk's last tokens
      feed.insert(feed.end(), win_tokens.begin() + std::max(1, c0 - kRepeatOverlap),
                  win_tokens.begin() + c0);
    feed.insert(feed.end(), win_tokens.begin() + c0, win_tokens.begin() + c1);
    AttnSequence fork(seq, fork_id, KVC_OBSERVE_MAX);
    const int n_feed = static_cast<int>(feed.size());
    for (int i = 0; i < n_feed; i += kRows)
      transformer.forward_chunk(fork, &feed[static_cast<std::size_t>(i)],
                                std::min(kRows, n_feed - i), P + i);
    const std::uint64_t held = static_cast<std::uint64_t>(P + n_feed);
    got.resize(held * heads);
    for (int layer = 0; layer < c.n_layers; ++layer) {
      check_kvc(kvc_seq_scores(fork.pool(), fork.id(), static_cast<std::uint32_t>(layer),
                               got.data(), held),
                "kvc_seq_scores");
      std::vector<float> &b = best[static_cast<std::size_t>(layer)];
      for (std::size_t i = 0; i < b.size(); ++i) b[i] = std::max(b[i], got[i]);
    }
  }
  for (int layer = 0; layer < c.n_layers; ++layer)
    check_kvc(kvc_seq_observe_scores(seq.pool(), seq.id(), static_cast<std::uint32_t>(layer),
                                     best[static_cast<std::size_t>(layer)].data(),
                                     static_cast<std::uint64_t>(P), 0),
              "kvc_seq_observe_scores");
}

/// The rows of the run: row 0 is always the dense f32 reference; each listed
/// strategy follows once (f32 reuses row 0, a repeated spec its first row).
struct StrategyRows {
  std::vector<Strategy> rows;
  std::vector<int> row_of;  ///< for each listed strategy, its row
};

StrategyRows strategy_rows(const std::vector<Strategy> &listed) {
  StrategyRows out;
  std::vector<Strategy> &rows = out.rows;
  rows.push_back(parse_strategy("f32"));
  for (const Strategy &s : listed) {
    if (s.spec == "f32") {
      out.row_of.push_back(0);
      continue;
    }
    auto it =
        std::find_if(rows.begin(), rows.end(), [&](const Strategy &r) { return r.spec == s.spec; });
    if (it != rows.end()) {
      out.row_of.push_back(static_cast<int>(it - rows.begin()));
    } else {
      out.row_of.push_back(static_cast<int>(rows.size()));
      rows.push_back(s);
    }
  }
  return out;
}

/// The eviction policy of each row (nullptr: none); immutable, shared by every worker's pools.
struct Policies {
  std::vector<kvc_policy *> p;
  Policies() = default;
  Policies(const Policies &) = delete;
  Policies &operator=(const Policies &) = delete;
  ~Policies() {
    for (kvc_policy *x : p) kvc_policy_destroy(x);
  }
};

/// Creates the policies of `rows` for windows of `ctx` positions; throws
/// RunnerError when a StreamingLLM cap leaves no room after its sinks.
void create_policies(const std::vector<Strategy> &rows, int ctx, const ModelConfig &model,
                     const std::string &gates_file, Policies &policies) {
  policies.p.assign(rows.size(), nullptr);
  std::vector<float> gates, row_gates;  // duo-attention: the model's gates, a row's binary ones
  for (std::size_t r = 0; r < rows.size(); ++r) {
    const Strategy &s = rows[r];
    if (s.protocol == Strategy::Protocol::None) continue;
    kvc_policy_config pc;
    kvc_policy_config_init(&pc);
    if (s.policy_kind == KVC_POLICY_DUO_ATTENTION) {
      if (gates.empty()) gates = model_gates(model, gates_file);
      row_gates = streaming_heads(gates, s.duo_stream_share, s.duo_stream_head);
      pc.head_gates = row_gates.data();
      pc.num_head_gates = static_cast<std::uint32_t>(row_gates.size());
      pc.recent_tokens = s.duo_window;
    }
    pc.kind = s.policy_kind;
    pc.sink_tokens = s.sinks;
    pc.recent_fraction = s.recent_fraction;
    pc.window = s.obs_window;
    pc.kernel_size = s.kernel;
    pc.pooling = s.pooling;
    pc.schedule = s.schedule;
    pc.shift_positions = s.shift_positions ? 1u : 0u;
    pc.future_positions = s.future_positions;
    pc.head_budget = s.head_budget;
    pc.head_floor = s.head_floor;
    if (s.policy_kind == KVC_POLICY_DUO_ATTENTION) {
      pc.auto_evict = 1;  // streaming heads trimmed at every reserve; no layer cap
    } else if (s.protocol == Strategy::Protocol::Stream) {
      pc.budget_tokens = s.budget_tokens
                             ? s.budget_tokens
                             : static_cast<std::uint64_t>(std::ceil(s.budget * ctx - 1e-9));
      if (s.policy_kind == KVC_POLICY_STREAMING && pc.budget_tokens <= s.sinks) {
        throw RunnerError("strategy '" + s.spec + "': a cap of " +
                          std::to_string(pc.budget_tokens) + " tokens at ctx " +
                          std::to_string(ctx) + " leaves no room for the window after " +
                          std::to_string(s.sinks) + " sinks");
      }
      pc.auto_evict = 1;
    } else {
      pc.compression_ratio = 1.0 - s.budget;  // kvpress: the fraction dropped from the prefill
    }
    check_kvc(kvc_policy_create(&pc, &policies.p[r]), "kvc_policy_create");
  }
}

/// What the workers measured: sums per window and row, the pools' last counters.
struct RunSums {
  std::vector<std::vector<WindowSums>> sums;  ///< [window][row]
  std::vector<WindowSums> array_sums;         ///< [window]: the bare forward pass (--overhead)
  std::vector<kvc_stats> row_stats;     ///< each row's pool at the end of a worker's last window
  std::vector<std::uint64_t> row_peak;  ///< each row's peak bytes in use, over every worker
  double wall_seconds = 0;              ///< from the workers' start to the last one's end
};

/// Runs every row over every window on `threads` workers (one pool per row
/// and worker), with a progress bar on a terminal; the first failure of a
/// worker is rethrown.
RunSums run_windows(const EvalInput &in, const std::vector<Strategy> &rows,
                    const std::vector<kvc_runner::PoolSettings> &row_settings,
                    const Policies &policies, const EvalOptions &opt, int threads) {
  const Model &model = in.model;
  const ModelConfig &c = model.config();
  const std::vector<int> &tokens = in.tokens;
  const std::vector<EvalWindow> &windows = in.windows;
  const int ctx = in.ctx, segment = in.segment, chunk = in.chunk, bos = in.bos;
  const bool use_bos = in.use_bos;
  const std::size_t n_rows = rows.size();

  WindowSums blank;
  blank.seg_nll.assign(in.n_segments, 0.0);
  blank.seg_tokens.assign(in.n_segments, 0);
  RunSums out;
  std::vector<std::vector<WindowSums>> &sums = out.sums;
  sums.assign(windows.size(), std::vector<WindowSums>(n_rows, blank));
  std::vector<WindowSums> &array_sums = out.array_sums;
  array_sums.resize(windows.size());
  std::vector<kvc_stats> &row_stats = out.row_stats;
  row_stats.resize(n_rows);
  std::vector<std::uint64_t> &row_peak = out.row_peak;
  row_peak.assign(n_rows, 0);
  std::mutex stats_mutex;
  std::atomic<std::size_t> next_window{0};
  std::atomic<std::int64_t> positions_done{0};
  std::exception_ptr failure;
  std::mutex failure_mutex;
  const int vocab = c.vocab_size;
  const std::int64_t total_positions = static_cast<std::int64_t>(n_rows + (opt.overhead ? 1 : 0)) *
                                       (in.to_score + static_cast<std::int64_t>(windows.size()));

  // KVzip rows: the repeat instruction of the reconstruction passes, and room
  // for its positions (past the prefill) and a fork in their pools.
  RepeatPrompts repeat;
  repeat.first = in.tokenizer.encode("\n\nRepeat the previous context exactly.", false, false);
  repeat.next = in.tokenizer.encode(
      "\n\nRepeat the part of the previous context exactly, starting with", false, false);
  int max_positions = ctx;
  for (const Strategy &s : rows)
    if (s.reconstruct)
      max_positions = std::max<int>(
          max_positions, ctx +
                             static_cast<int>(std::max(repeat.first.size(), repeat.next.size()) +
                                              kRepeatOverlap + s.recon_chunk) +
                             1);

  auto worker = [&](int) {
    try {
      Transformer transformer(model, max_positions);
      std::vector<std::unique_ptr<KvPool>> pools;
      for (std::size_t r = 0; r < rows.size(); ++r) {
        const Strategy &s = rows[r];
        const kvc_runner::PoolSettings &ps = row_settings[r];
        // kvzip: room for a fork that holds the prefill, a prompt and a chunk (up to max_positions)
        pools.push_back(std::make_unique<KvPool>(
            c, ps, static_cast<std::uint32_t>(s.reconstruct ? max_positions : ctx),
            s.reconstruct ? 2u : 1u));
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
        const EvalWindow &win = windows[w];
        const int n_pos = win.scored + 1;
        auto token_at = [&](int pos) {
          return pos > 0 ? tokens[win.first + pos - 1] : use_bos ? bos : tokens[win.first - 1];
        };
        std::vector<int> win_tokens(static_cast<std::size_t>(n_pos));
        for (int pos = 0; pos < n_pos; ++pos)
          win_tokens[static_cast<std::size_t>(pos)] = token_at(pos);
        for (std::size_t r = 0; r < n_rows; ++r) {
          WindowSums &acc = sums[w][r];
          // A head-wise pool counts (token, KV head) pairs: tokens = pairs / KV heads.
          const double held_per_token = rows[r].headwise ? double(c.n_kv_heads) : 1.0;
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
              if (rows[r].reconstruct && pos == boundary && pos > 0)  // counted in ms/token
                reconstruct_context(transformer, seq, c, win_tokens, repeat,
                                    static_cast<int>(rows[r].recon_chunk),
                                    (std::uint64_t(1) << 40) + w);
              chunk_logits =
                  chunk_len == 1 && chunk == 1
                      ? transformer.forward(seq, win_tokens[static_cast<std::size_t>(pos)], pos)
                      : transformer.forward_chunk(seq, &win_tokens[static_cast<std::size_t>(pos)],
                                                  chunk_len, pos);
              acc.seconds += thread_cpu_seconds() - t0;
              acc.positions += chunk_len;
              const kvc_stats now = pools[r]->stats();
              acc.bytes_time += double(now.bytes_in_use) * chunk_len;
              acc.tokens_time += double(now.tokens_stored) * chunk_len / held_per_token;
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
            const std::size_t seg =
                static_cast<std::size_t>((pos + 1) / segment);  // the target's position
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
            acc.tokens_at_end += double(st.tokens_stored) / held_per_token;
            acc.positions_at_end += double(n_pos) * c.n_layers;
            acc.f16_slots_at_end += double(round_up_block(n_pos));
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
      progress_bar(done, total_positions,
                   std::chrono::duration<double>(Clock::now() - start).count());
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
  out.wall_seconds = std::chrono::duration<double>(Clock::now() - start).count();
  return out;
}

/// One result per row, from the sums reduced in window order (so the results
/// do not depend on the number of threads); row 0 is the reference every
/// ppl_delta_pct is measured against. Sets `rep.positions_fed`.
std::vector<StrategyResult> summarize(const EvalInput &in, const std::vector<Strategy> &rows,
                                      const RunSums &run, EvalReport &rep) {
  const ModelConfig &c = in.model.config();
  const std::vector<EvalWindow> &windows = in.windows;
  const std::size_t n_rows = rows.size(), n_segments = in.n_segments;
  const int ctx = in.ctx;
  const std::vector<std::vector<WindowSums>> &sums = run.sums;
  const std::vector<kvc_stats> &row_stats = run.row_stats;
  const std::vector<std::uint64_t> &row_peak = run.row_peak;

  // f16 bytes per token, measured from a pool, for the compression column.
  std::uint64_t f16_bytes_per_token = 0;
  {
    KvPool f16_pool(c, KVC_DTYPE_F16, KVC_DTYPE_F16, kF16Block);
    f16_bytes_per_token = f16_pool.stats().bytes_per_token;
  }
  const double elements_per_token = 2.0 * c.n_layers * c.n_kv_heads * c.head_dim();
  // Positions of the longest window (the dense cache's peak holds all of them).
  double longest_window = 0;
  for (const EvalWindow &w : windows)
    longest_window = std::max(longest_window, double(w.scored + 1));

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
      total.f16_slots_at_end += s.f16_slots_at_end;
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
        total.tokens_time > 0
            ? total.bytes_time / (total.tokens_time / c.n_layers) * 8.0 / elements_per_token
            : res.bits_per_element;
    res.peak_kv_bytes = row_peak[r];
    res.compression_vs_f16 =
        bytes_per_token > 0 ? double(f16_bytes_per_token) / bytes_per_token : 0.0;
    res.ppl = std::exp(total.nll / double(total.tokens));
    res.kl_mean = total.kl / double(total.tokens);
    res.top1_agreement = double(total.top1) / double(total.tokens);
    res.ms_per_token = total.seconds * 1000.0 / double(total.positions);
    res.kept_fraction =
        total.positions_at_end > 0 ? total.tokens_at_end / total.positions_at_end : 1.0;
    // Dense f16 bytes at the same moments: every position of the window held, in whole blocks
    // as a dense f16 pool holds them (a window of 512 positions fills its blocks exactly).
    const double f16_at_end = double(f16_bytes_per_token) * total.f16_slots_at_end;
    res.memory_vs_f16 = total.bytes_at_end > 0 ? f16_at_end / total.bytes_at_end
                        : bytes_per_token > 0
                            ? double(f16_bytes_per_token) / bytes_per_token / res.kept_fraction
                            : 0.0;
    res.peak_memory_vs_f16 = row_peak[r] > 0
                                 ? double(f16_bytes_per_token) *
                                       round_up_block(int(longest_window)) / double(row_peak[r])
                                 : 0.0;
    res.effective_bits_per_element = res.bits_per_element * res.kept_fraction;
    for (std::size_t k = 0; k < n_segments; ++k) {
      res.segment_ppl.push_back(
          total.seg_tokens[k] > 0 ? std::exp(total.seg_nll[k] / double(total.seg_tokens[k])) : 0.0);
    }
    res.second_half_ppl =
        total.late_tokens > 0 ? std::exp(total.late_nll / double(total.late_tokens)) : 0.0;
    if (r == 0) rep.positions_fed = total.positions;
  }
  for (StrategyResult &res : row_results) {
    res.ppl_delta_pct = (res.ppl - row_results[0].ppl) / row_results[0].ppl * 100.0;
  }
  return row_results;
}

}  // namespace

EvalReport run_eval(const EvalOptions &opt) {
  EvalReport rep;
  const EvalInput in = load_eval_input(opt, rep);
  if (opt.before_run) opt.before_run(rep);
  std::vector<Strategy> listed = opt.strategies;
  if (opt.default_rows) {
    // Default rows this model cannot run are left out (with a note): per-layer
    // rows of a deeper model (SmolLM2's), and qsmooth rows when --key-stats
    // is a file without the queries' rms (written before qsmooth existed).
    bool no_qrms = false;
    if (!opt.key_stats.empty())
      for (const Strategy &s : listed)
        if (s.key_qsmooth > 0.0) {
          no_qrms = model_key_stats(in.model.config(), opt.key_stats).qrms.empty();
          break;
        }
    const auto skip = [&](const Strategy &s) {
      for (const Strategy::LayerPart &lp : s.layer_parts)
        for (std::uint32_t l : lp.layers)
          if (l >= std::uint32_t(in.model.config().n_layers)) {
            std::fprintf(stderr, "kvcache eval: default row %s left out: it names layer %u\n",
                         s.spec.c_str(), l);
            return true;
          }
      if (no_qrms && s.key_qsmooth > 0.0) {
        std::fprintf(stderr,
                     "kvcache eval: default row %s left out: --key-stats has no query rms "
                     "(qrms lines; fit it again with `kvcache calibrate`)\n",
                     s.spec.c_str());
        return true;
      }
      return false;
    };
    listed.erase(std::remove_if(listed.begin(), listed.end(), skip), listed.end());
  }
  if (!opt.sensitivity.empty()) {  // the base, then one layer at a time with CODECS
    listed = {parse_strategy(opt.sensitivity_base)};
    for (int l = 0; l < in.model.config().n_layers; ++l)
      listed.push_back(
          parse_strategy(opt.sensitivity_base + "@" + std::to_string(l) + "=" + opt.sensitivity));
  }
  const StrategyRows strategy_list = strategy_rows(listed);
  const std::vector<Strategy> &rows = strategy_list.rows;
  const std::size_t n_rows = rows.size();
  Policies policies;
  create_policies(rows, in.ctx, in.model.config(), opt.head_gates, policies);

  unsigned hw = std::thread::hardware_concurrency();
  int threads = opt.threads > 0 ? opt.threads : static_cast<int>(hw == 0 ? 1 : hw);
  threads = std::max(1, std::min(threads, rep.windows));
  rep.threads = threads;
  set_blas_threads(1);  // parallel over windows: one BLAS thread per worker
  // Pool settings per row; `smooth` rows take the model's key statistics.
  std::vector<kvc_runner::PoolSettings> row_settings;
  KeyStats key_stats;
  const kvc_runner::ModelConfig &mc = in.model.config();
  for (const Strategy &s : rows) {
    row_settings.push_back(pool_settings(s));
    if (s.key_smooth > 0.0) {
      if (!key_stats.layers) key_stats = model_key_stats(mc, opt.key_stats);
      key_smoothing(key_stats, s.key_smooth, s.key_qsmooth, row_settings.back().key_scale,
                    row_settings.back().key_offset);
    }
  }
  // `codebook` parts: the built-in Gaussian levels, each layer; `codebook=fit`
  // parts: levels fitted to the model's K/V (one run for every such part).
  std::vector<CodebookPart> fit_parts;
  std::vector<std::pair<std::size_t, int>> fit_of;  // (row, part) of each fitted part
  for (std::size_t r = 0; r < n_rows; ++r) {
    for (CodebookPart &p : strategy_codebook_parts(rows[r], mc, row_settings[r].key_scale,
                                                   row_settings[r].key_offset, false)) {
      if (rows[r].codebook_fit[p.part]) {
        fit_of.emplace_back(r, p.part);
        fit_parts.push_back(std::move(p));
        continue;
      }
      std::vector<float> &all = row_settings[r].codebook[p.part];
      for (int l = 0; l < mc.n_layers; ++l) {
        // Per-layer codecs: the layer's own bits and group.
        CodebookPart q = p;
        for (const kvc_runner::PoolSettings::LayerCodec &lc : row_settings[r].layer_codecs)
          if (lc.layer == std::uint32_t(l)) layer_codebook_part(p.part ? lc.v : lc.k, mc, q);
        if (!q.bits) continue;  // an int8 / fp8 layer: no levels
        std::vector<float> one(std::size_t{1} << q.bits);
        if (kvc_codebook_gaussian(q.bits, q.group, one.data()) != KVC_OK)
          throw RunnerError("kvc_codebook_gaussian: " + std::string(kvc_last_error_message()));
        all.insert(all.end(), one.begin(), one.end());
      }
    }
  }
  if (!fit_parts.empty()) {
    const CodebookText text = codebook_fit_text(in.tokenizer, mc, opt.codebook_text);
    const std::vector<FittedCodebook> fitted =
        fit_codebooks(in.model, text.tokens, in.bos, text.window, text.windows, fit_parts);
    for (std::size_t i = 0; i < fitted.size(); ++i)
      row_settings[fit_of[i].first].codebook[fit_of[i].second] = fitted[i].levels;
    rep.codebook_fit_text = text.description;
  }
  const RunSums run = run_windows(in, rows, row_settings, policies, opt, threads);
  rep.wall_seconds = run.wall_seconds;

  const std::vector<StrategyResult> row_results = summarize(in, rows, run, rep);
  // Output rows: the reference first, then the listed strategies in order (no duplicates).
  rep.results.push_back(row_results[0]);
  std::vector<bool> emitted(n_rows, false);
  emitted[0] = true;
  for (int r : strategy_list.row_of) {
    if (!emitted[r]) {
      emitted[r] = true;
      rep.results.push_back(row_results[r]);
    }
  }
  if (opt.overhead) {
    double seconds = 0;
    std::int64_t positions = 0;
    for (const WindowSums &s : run.array_sums) {
      seconds += s.seconds;
      positions += s.positions;
    }
    rep.has_overhead = true;
    rep.array_ms_per_token = seconds * 1000.0 / double(positions);
    rep.pool_f32_ms_per_token = row_results[0].ms_per_token;
  }
  return rep;
}

}  // namespace kvc_cli
