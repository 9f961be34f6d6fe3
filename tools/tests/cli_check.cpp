// SPDX-License-Identifier: Apache-2.0
// Test driver for the kvcache tool (eval_* tests):
//   cli_check make-bad-files REAL_MODEL OUTDIR   writes broken checkpoints/tokenizers
//   cli_check expect-fail REGEX -- CMD ARGS...   CMD must exit non-zero (not by a
//                                               signal) with REGEX in its output
//   cli_check eval-json -- CMD ARGS...           checks an `eval --json` report
//   cli_check memory KVCACHE                     checks `memory` against hand-computed sizes
//   cli_check blas-core KVCACHE                  `eval --json`'s blas_core: no pre-AVX2 kernels
//                                               on an AVX2 CPU, OPENBLAS_CORETYPE kept
//   cli_check plot KVCACHE FILE.svg              a short eval writes a plot
//   cli_check prefix KVCACHE                     `eval --prefix`: exact reuse counts, identical
//   log-probs cli_check long KVCACHE FILE.svg              `eval --long`: segments, kept shares,
//   StreamingLLM result cli_check bench KVCACHE                      `bench --quick --json`: every
//   group, sane figures cli_check recommend CASE KVCACHE DATA_DIR    checks `recommend` on the
//   crafted eval reports
//                                               of DATA_DIR (tools/tests/data/recommend;
//                                               cli_check_recommend.cpp)
#include <sys/stat.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <filesystem>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <utility>
#include <iterator>
#include <map>
#include <sstream>
#include <nlohmann/json.hpp>
#include <regex>
#include <string>
#include <vector>

#include "cli_check.h"
#include "runner/blas.h"
#include "process.h"

namespace cli_check {

int failures = 0;

void fail(const std::string &msg) {
  std::fprintf(stderr, "FAIL: %s\n", msg.c_str());
  ++failures;
}

void check(bool ok, const std::string &msg) {
  if (!ok) fail(msg);
}

std::string describe(const ProcessResult &r) {
  if (!r.started) return "could not start";
  if (!r.exited) return "killed by signal " + std::to_string(r.signal);
  return "exit code " + std::to_string(r.exit_code);
}

}  // namespace cli_check

using namespace cli_check;

namespace {

void write_file(const std::string &path, const std::string &bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  if (!out) fail("cannot write " + path);
}

std::string with_header(const std::string &model, std::vector<std::int32_t> header) {
  std::string s = model;
  std::memcpy(s.data(), header.data(), header.size() * sizeof(std::int32_t));
  return s;
}

int make_bad_files(const std::string &model_path, const std::string &dir) {
  mkdir(dir.c_str(), 0755);
  mkdir((dir + "/dir.svg").c_str(), 0755);  // a folder named like a plot file
  std::ifstream in(model_path, std::ios::binary);
  const std::string model((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (model.size() < 1000) {
    fail("cannot read " + model_path);
    return 1;
  }
  write_file(dir + "/truncated.bin", model.substr(0, 100000));
  write_file(dir + "/header-only.bin", model.substr(0, 20));
  write_file(dir + "/trailing-bytes.bin", model + std::string(8, '\0'));
  // Real header: dim 64, hidden 172, layers 5, heads 8, kv heads 4, vocab 512, seq_len 512.
  write_file(dir + "/heads-not-multiple.bin", with_header(model, {64, 172, 5, 8, 3, 512, 512}));
  write_file(dir + "/dim-not-multiple.bin", with_header(model, {60, 172, 5, 8, 4, 512, 512}));
  write_file(dir + "/zero-layers.bin", with_header(model, {64, 172, 0, 8, 4, 512, 512}));
  write_file(dir + "/negative-hidden.bin", with_header(model, {64, -172, 5, 8, 4, 512, 512}));
  write_file(dir + "/huge-dims.bin",
             with_header(model, {65536, 1 << 20, 4096, 512, 512, 1 << 24, 1 << 24}));
  // A well-formed tokenizer file with 10 pieces (the model has 512).
  std::string tok;
  auto put32 = [&](std::uint32_t v) { tok.append(reinterpret_cast<const char *>(&v), 4); };
  put32(4);
  for (int i = 0; i < 10; ++i) {
    float score = -float(i);
    tok.append(reinterpret_cast<const char *>(&score), 4);
    put32(1);
    tok.push_back(static_cast<char>('a' + i));
  }
  write_file(dir + "/fake-tokenizer.bin", tok);
  // Key statistics of stories260K's geometry (5 layers, 4 KV heads of 8):
  // without the queries' rms, and with it for layer 0 only.
  std::string stats = "kvcache-key-stats 1\nlayers 5 kv_heads 4 head_dim 8\n";
  for (const char *name : {"mean", "rms", "absmax"})
    for (int l = 0; l < 5; ++l) {
      stats += std::string(name) + " " + std::to_string(l);
      for (int c = 0; c < 32; ++c) stats += name[0] == 'm' ? " 0" : " 1";
      stats += "\n";
    }
  write_file(dir + "/keys-no-qrms.txt", stats);
  stats += "qrms 0";
  for (int c = 0; c < 32; ++c) stats += " 1";
  write_file(dir + "/keys-partial-qrms.txt", stats + "\n");
  return failures ? 1 : 0;
}

int expect_fail(const std::string &regex, const std::vector<std::string> &cmd) {
  const ProcessResult r = run_process(cmd);
  const std::string all = r.out + r.err;
  std::printf("%s\n--- output ---\n%s", describe(r).c_str(), all.c_str());
  check(r.started, "command did not start");
  check(r.exited, "command crashed: " + describe(r));
  check(r.exited && r.exit_code != 0 && r.exit_code != 127,
        "expected a non-zero exit, got " + describe(r));
  check(std::regex_search(all, std::regex(regex)), "output does not match /" + regex + "/");
  check(all.find("error") != std::string::npos, "output does not say 'error'");
  return failures ? 1 : 0;
}

// `eval --json` names OpenBLAS's kernels (blas_core). Where OpenBLAS picks
// them at run time (DYNAMIC_ARCH) on an x86-64 CPU with AVX2 and FMA, they
// are cores with AVX2 kernels (the tool executes itself again with
// OPENBLAS_CORETYPE where OpenBLAS's detection fell back to an older one),
// and a core the user names with OPENBLAS_CORETYPE is kept.
int blas_core(const std::string &kvcache) {
  using kvc_runner::blas_core_has_avx2;
  // The rule on OpenBLAS 0.3.21's own names.
  for (const char *name :
       {"Haswell", "Zen", "SkylakeX", "skylakex", "Cooperlake", "SapphireRapids"})
    check(blas_core_has_avx2(name), std::string(name) + " has AVX2 kernels");
  for (const char *name :
       {"Prescott", "Core2", "Nehalem", "Sandybridge", "Nano", "Athlon", "Barcelona", "Bulldozer",
        "Piledriver", "Steamroller", "Excavator", "Unknown", ""})
    check(!blas_core_has_avx2(name), std::string(name) + " has no AVX2 kernels");
  check(!blas_core_has_avx2(nullptr), "no name: no AVX2 kernels");
  const std::vector<std::string> cmd = {
      kvcache, "eval",         "--model", "stories260k", "--max-tokens",  "64",        "--ctx",
      "64",    "--strategies", "int8",    "--json",      "--no-progress", "--threads", "1"};
  auto core_of = [&](double *ppl) -> std::string {
    const ProcessResult r = run_process(cmd);
    if (!r.exited || r.exit_code != 0) {
      fail("eval failed: " + describe(r));
      return "";
    }
    try {
      const nlohmann::json j = nlohmann::json::parse(r.out);
      *ppl = j.at("results").at(0).at("ppl").get<double>();
      return j.at("blas_core").get<std::string>();
    } catch (const std::exception &e) {
      fail(std::string("no blas_core in the report: ") + e.what());
      return "";
    }
  };
  unsetenv("OPENBLAS_CORETYPE");
  unsetenv("KVCACHE_BLAS_KEEP_CORE");
  double ppl_auto = 0, ppl_asked = 0;
  const std::string chosen = core_of(&ppl_auto);
  std::printf("blas_core without OPENBLAS_CORETYPE: %s (%s)\n", chosen.c_str(),
              kvc_runner::blas_chooses_at_run_time() ? "chosen at run time" : "fixed at build");
  check(!chosen.empty() && chosen != "unknown", "a core is named");
#if defined(__x86_64__)
  __builtin_cpu_init();
  if (!kvc_runner::blas_chooses_at_run_time() || !__builtin_cpu_supports("avx2") ||
      !__builtin_cpu_supports("fma")) {
    std::printf("no run-time kernel choice or no AVX2 here: the override is not checked\n");
    return failures == 0 ? 0 : 1;
  }
  check(blas_core_has_avx2(chosen.c_str()), "an AVX2 CPU runs " + chosen + " kernels");
  setenv("OPENBLAS_CORETYPE", "Prescott", 1);
  std::string asked = core_of(&ppl_asked);
  unsetenv("OPENBLAS_CORETYPE");
  for (char &c : asked) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  check(asked == "prescott", "OPENBLAS_CORETYPE=Prescott is kept (got " + asked + ")");
  // Other kernels sum in another order: the same perplexity to 0.1 %.
  check(std::isfinite(ppl_auto) && std::fabs(ppl_asked - ppl_auto) <= 1e-3 * ppl_auto,
        "the reference perplexity agrees across kernels (" + std::to_string(ppl_auto) + " vs " +
            std::to_string(ppl_asked) + ")");
  setenv("KVCACHE_BLAS_KEEP_CORE", "0", 1);  // "0": not kept
  const std::string zero = core_of(&ppl_asked);
  unsetenv("KVCACHE_BLAS_KEEP_CORE");
  check(zero == chosen, "KVCACHE_BLAS_KEEP_CORE=0 overrides as unset (got " + zero + ")");
#endif
  return failures == 0 ? 0 : 1;
}

int eval_json(const std::vector<std::string> &cmd) {
  const ProcessResult r = run_process(cmd);
  std::fprintf(stderr, "%s", r.err.c_str());
  if (!r.exited || r.exit_code != 0) {
    fail("eval failed: " + describe(r));
    return 1;
  }
  std::printf("%s", r.out.c_str());
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(r.out);
  } catch (const std::exception &e) {
    fail(std::string("stdout is not one JSON object: ") + e.what());
    return 1;
  }
  for (const char *key : {"model", "text", "ctx", "tokens_scored", "results"}) {
    check(j.contains(key), std::string("missing key ") + key);
  }
  if (failures) return 1;
  check(j["tokens_scored"].get<std::int64_t>() >= 2048, "tokens_scored < 2048");
  bool seen[3] = {false, false, false};
  for (const auto &row : j["results"]) {
    for (const char *key :
         {"strategy", "bits_per_element", "kv_bytes_per_token", "peak_kv_bytes",
          "compression_vs_f16", "ppl", "ppl_delta_pct", "kl_mean", "top1_agreement", "ms_per_token",
          "kept_fraction", "effective_bits_per_element", "mean_bits_per_element", "segment_ppl",
          "second_half_ppl", "memory_vs_f16", "peak_memory_vs_f16"}) {
      check(row.contains(key), std::string("result row misses ") + key);
    }
    if (failures) return 1;
    // Without eviction every position stays; with it, fewer. One segment (ctx = the trained
    // context) whose ppl is the row's.
    const std::string name = row["strategy"];
    const double kept = row["kept_fraction"];
    const bool evicts = name.find("budget=") != std::string::npos ||
                        name.rfind("duo-attention", 0) == 0;  // streaming heads: sinks + window
    if (!evicts)
      check(kept == 1.0, name + ": kept_fraction must be 1");
    else
      check(kept > 0.2 && kept < 0.9, name + ": kept_fraction must be below 1 with eviction");
    check(std::fabs(row["effective_bits_per_element"].get<double>() -
                    kept * row["bits_per_element"].get<double>()) < 1e-9,
          name + ": effective bits = bits x kept");
    // The memory saving against dense f16 is the per-token one divided by the share kept:
    // streaming at a budget of 0.3 holds about 3.2x less than the dense f16 cache.
    check(std::fabs(row["memory_vs_f16"].get<double>() -
                    row["compression_vs_f16"].get<double>() / kept) < 1e-6,
          name + ": memory_vs_f16 = compression_vs_f16 / kept_fraction");
    check(row["peak_memory_vs_f16"].get<double>() > 0 &&
              row["peak_memory_vs_f16"].get<double>() <= row["memory_vs_f16"].get<double>() + 1e-9,
          name + ": the peak saving is positive and at most the end-of-window saving");
    // Before a window's end its last block is partly filled: without eviction a token costs at
    // least as much.
    if (kept == 1.0)
      check(row["mean_bits_per_element"].get<double>() >=
                row["bits_per_element"].get<double>() - 1e-9,
            name + ": mean_bits_per_element below bits_per_element without eviction");
    check(
        row["segment_ppl"].size() == 1 &&
            std::fabs(row["segment_ppl"][0].get<double>() / row["ppl"].get<double>() - 1.0) < 1e-12,
        "one segment, whose ppl is the row's ppl");
    const std::string s = row["strategy"];
    const double delta = row["ppl_delta_pct"], top1 = row["top1_agreement"], kl = row["kl_mean"];
    const double bits = row["bits_per_element"];
    check(row["ppl"].get<double>() > 1.0 && std::isfinite(row["ppl"].get<double>()),
          s + ": bad ppl");
    check(row["peak_kv_bytes"].get<std::uint64_t>() > 0, s + ": peak_kv_bytes is 0");
    if (s == "f32") {
      seen[0] = true;
      check(delta == 0.0, "f32 ppl_delta_pct must be exactly 0");
      check(kl == 0.0 && top1 == 1.0, "f32 must equal the reference");
      check(bits >= 32.0, "f32 bits_per_element < 32");
    } else if (s == "f16" || s == "bf16") {
      seen[s == "f16" ? 1 : 2] = true;
      check(delta != 0.0 && std::fabs(delta) < 1.0,
            s + ": ppl_delta_pct must be non-zero and < 1%");
      check(kl > 0.0, s + ": kl_mean must be > 0");
      check(top1 > 0.95 && top1 <= 1.0, s + ": top1_agreement must be > 0.95");
      check(bits >= 16.0 && bits < 32.0, s + ": bits_per_element out of range");
      check(std::fabs(row["compression_vs_f16"].get<double>() - 16.0 / bits) < 1e-9 || bits > 16.0,
            s + ": compression_vs_f16 inconsistent");
    }
  }
  check(seen[0] && seen[1] && seen[2], "results must have f32, f16 and bf16 rows");
  return failures ? 1 : 0;
}

nlohmann::json memory_json(const std::string &kvcache, const std::vector<std::string> &args) {
  std::vector<std::string> cmd = {kvcache, "memory", "--json"};
  cmd.insert(cmd.end(), args.begin(), args.end());
  const ProcessResult r = run_process(cmd);
  if (!r.exited || r.exit_code != 0) {
    fail("memory failed: " + describe(r) + ": " + r.err);
    return nlohmann::json::object();
  }
  return nlohmann::json::parse(r.out);
}

int memory(const std::string &kvcache) {
  const std::uint64_t GiB = 1ull << 30;
  // LLaMA-7B f16: 2 (K,V) x 32 layers x 32 heads x 128 x 2 bytes = 524,288 bytes per token.
  const std::uint64_t lengths[] = {2048, 4096, 8192, 32768};
  const std::uint64_t gib[] = {1, 2, 4, 16};
  for (int i = 0; i < 4; ++i) {
    const auto j =
        memory_json(kvcache, {"--preset", "llama-7b", "--seq-len", std::to_string(lengths[i])});
    if (failures) return 1;
    check(j["bytes_per_token"] == 524288u, "llama-7b bytes_per_token != 524288");
    check(j["bytes_per_token_per_layer"] == 16384u, "llama-7b bytes per token per layer != 16384");
    check(j["bytes_total"] == gib[i] * GiB,
          "llama-7b total for " + std::to_string(lengths[i]) + " tokens");
    check(j["bytes_per_layer"] == gib[i] * GiB / 32, "llama-7b per layer");
  }
  // The text report prints the four lengths with two decimals.
  const ProcessResult t =
      run_process({kvcache, "memory", "--preset", "llama-7b", "--seq-len", "32768"});
  std::printf("%s", t.out.c_str());
  for (const char *line : {"2048 tokens    1.00 GiB", "4096 tokens    2.00 GiB",
                           "8192 tokens    4.00 GiB", "32768 tokens   16.00 GiB", "512.00 KiB"}) {
    check(t.out.find(line) != std::string::npos, std::string("text output misses '") + line + "'");
  }
  // GQA presets: Llama-2-70B 2 x 80 x 8 x 128 x 2 = 327,680 bytes/token; batch 4 x 4096 tokens.
  auto j = memory_json(kvcache, {"--preset", "llama-2-70b", "--seq-len", "4096", "--batch", "4"});
  check(j["bytes_per_token"] == 327680u, "llama-2-70b bytes_per_token != 327680");
  check(j["bytes_total"] == 327680ull * 4096 * 4, "llama-2-70b total (5 GiB)");
  // Qwen2.5-7B bf16: 2 x 28 x 4 x 128 x 2 = 57,344 bytes/token.
  j = memory_json(kvcache, {"--preset", "qwen2.5-7b", "--seq-len", "1000", "--dtype", "bf16"});
  check(j["bytes_per_token"] == 57344u, "qwen2.5-7b bytes_per_token != 57344");
  // Explicit dimensions in f32: stories260K-like 2 x 5 x 4 x 8 x 4 = 1,280 bytes/token.
  j = memory_json(kvcache, {"--layers", "5", "--kv-heads", "4", "--head-dim", "8", "--seq-len",
                            "512", "--dtype", "f32"});
  check(j["bytes_per_token"] == 1280u && j["bytes_total"] == 1280u * 512, "explicit dims f32");
  j = memory_json(kvcache, {"--preset", "stories260k", "--seq-len", "512"});
  check(j["bytes_per_token"] == 640u, "stories260k f16 bytes_per_token != 640");
  return failures ? 1 : 0;
}

int plot(const std::string &kvcache, const std::string &file) {
  std::remove(file.c_str());
  const ProcessResult r =
      run_process({kvcache, "eval", "--max-tokens", "300", "--no-progress", "--plot", file});
  std::printf("%s%s", r.out.c_str(), r.err.c_str());
  check(r.exited && r.exit_code == 0, "eval --plot failed: " + describe(r));
  std::ifstream in(file);
  const std::string svg((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  check(svg.find("<svg") != std::string::npos, "no SVG written to " + file);
  check(svg.find("bf16") != std::string::npos, "plot has no bf16 label");
  return failures ? 1 : 0;
}

nlohmann::json run_json(const std::vector<std::string> &cmd) {
  const ProcessResult r = run_process(cmd);
  if (!r.exited || r.exit_code != 0) {
    fail(cmd[1] + " failed: " + describe(r) + ": " + r.err);
    return nlohmann::json::object();
  }
  return nlohmann::json::parse(r.out);
}

// The rows of an eval JSON report by strategy.
std::map<std::string, nlohmann::json> rows_by_strategy(const nlohmann::json &report) {
  std::map<std::string, nlohmann::json> by;
  for (const auto &r : report["results"]) by[r["strategy"].get<std::string>()] = r;
  return by;
}

// `kvcache eval --json` of `rows` over max_tokens tokens: the report and its
// rows by strategy; false (a failure recorded) when it fails or lacks a row.
bool eval_rows(const std::string &kvcache, const std::vector<std::string> &rows,
               const std::string &max_tokens, nlohmann::json *report,
               std::map<std::string, nlohmann::json> *by) {
  std::string list;
  for (const std::string &r : rows) list += (list.empty() ? "" : ",") + r;
  *report = run_json({kvcache, "eval", "--max-tokens", max_tokens, "--json", "--no-progress",
                      "--strategies", list});
  if (!report->contains("results")) return false;
  *by = rows_by_strategy(*report);
  for (const std::string &name : rows)
    if (!by->count(name)) {
      fail("no row " + name);
      return false;
    }
  return true;
}

// Keys and values with their own codecs (k-NAME / v-NAME). stories260K: 5
// layers, 4 KV heads, head_dim 8, so a token's row is 32 values per layer.
// - k-f32+v-f32 stores exactly what f32 stores: the same log-probabilities.
// - k-int8+v-int8 is int8 on both sides: equal to int8:per-token.
// - k-int8:per-token alone: K int8 with an f32 scale per token and head
//   (8 + 32 / 8 = 12 bits), V in the pool's default f16 (16 bits): 14 bits per
//   element, 5 x 32 x (12 + 16) / 8 = 560 bytes per token.
// - v-int4:group=32 alone: K f16, V int4 with an f16 scale per 32 values
//   (4.5 bits): 10.25 bits, 5 x 32 x 20.5 / 8 = 410 bytes per token; it must
//   lose more than the K-int8 row, whose error is far smaller.
int split_kv(const std::string &kvcache) {
  const nlohmann::json j =
      run_json({kvcache, "eval", "--max-tokens", "600", "--json", "--no-progress", "--strategies",
                "f32,k-f32+v-f32,int8:per-token,k-int8:per-token+v-int8:per-token,k-int8:per-token,"
                "v-int4:group=32,"
                "kivi4:group=16:residual=32,kivi4:group=16:residual=32:sinks=2"});
  if (!j.contains("results")) return 1;
  std::map<std::string, nlohmann::json> by = rows_by_strategy(j);
  for (const char *name :
       {"f32", "k-f32+v-f32", "int8:per-token", "k-int8:per-token+v-int8:per-token",
        "k-int8:per-token", "v-int4:group=32"})
    if (!by.count(name)) {
      fail(std::string("no row ") + name);
      return 1;
    }
  check(by["k-f32+v-f32"]["ppl"] == by["f32"]["ppl"], "k-f32+v-f32 differs from f32");
  check(by["k-int8:per-token+v-int8:per-token"]["ppl"] == by["int8:per-token"]["ppl"] &&
            by["k-int8:per-token+v-int8:per-token"]["kl_mean"] == by["int8:per-token"]["kl_mean"],
        "k-int8+v-int8 differs from int8:per-token");
  check(std::fabs(by["k-int8:per-token"]["bits_per_element"].get<double>() - 14.0) < 1e-9,
        "k-int8:per-token: bits " + by["k-int8:per-token"]["bits_per_element"].dump() +
            ", expected 14");
  // Averaged over the run (one position per forward pass): with t tokens a
  // layer holds ceil(t / 16) blocks of 16, so the two windows (512 and 90
  // positions) hold sum 16 ceil(t / 16) = 135,168 + 4,800 token slots for
  // sum t = 131,328 + 4,095 tokens.
  check(std::fabs(by["k-int8:per-token"]["mean_bits_per_element"].get<double>() -
                  14.0 * 139968.0 / 135423.0) < 1e-9,
        "k-int8:per-token: mean bits " + by["k-int8:per-token"]["mean_bits_per_element"].dump() +
            ", expected " + std::to_string(14.0 * 139968.0 / 135423.0));
  check(by["k-int8:per-token"]["kv_bytes_per_token"].get<double>() == 560.0,
        "k-int8:per-token: bytes per token " + by["k-int8:per-token"]["kv_bytes_per_token"].dump() +
            ", expected 560");
  check(std::fabs(by["v-int4:group=32"]["bits_per_element"].get<double>() - 10.25) < 1e-9,
        "v-int4:group=32: bits " + by["v-int4:group=32"]["bits_per_element"].dump() +
            ", expected 10.25");
  check(by["v-int4:group=32"]["kv_bytes_per_token"].get<double>() == 410.0,
        "v-int4:group=32: bytes per token " + by["v-int4:group=32"]["kv_bytes_per_token"].dump() +
            ", expected 410");
  const double k8 = by["k-int8:per-token"]["kl_mean"].get<double>(),
               v4 = by["v-int4:group=32"]["kl_mean"].get<double>();
  check(k8 > 0 && v4 > k8,
        "expected 0 < KL(k-int8) < KL(v-int4): " + std::to_string(k8) + ", " + std::to_string(v4));
  // Attention sinks: the copies of every layer's first 2 tokens share one
  // residual block per sequence (floor(16 / 2) = 8 layers to a block of 16
  // tokens x K and V x f16), measured at the end of each window of ctx tokens.
  const nlohmann::json &geo = j["geometry"];
  const double layers = geo["num_layers"].get<double>(),
               row = geo["num_kv_heads"].get<double>() * geo["head_dim"].get<double>();
  const double sink_blocks = std::ceil(layers / 8.0), ctx = j["ctx"].get<double>();
  const double extra = sink_blocks * 16 * 2 * row * 2 / ctx;  // bytes per token (all layers)
  const nlohmann::json &k0 = by["kivi4:group=16:residual=32"],
                       &k2 = by["kivi4:group=16:residual=32:sinks=2"];
  if (k0.is_null() || k2.is_null()) {
    fail("no kivi4 rows");
    return 1;
  }
  const double got =
      k2["kv_bytes_per_token"].get<double>() - k0["kv_bytes_per_token"].get<double>();
  check(std::fabs(got - extra) <= 1.0, "sinks=2 adds " + std::to_string(got) +
                                           " bytes per token, expected " + std::to_string(extra));
  check(k2["kl_mean"] != k0["kl_mean"], "sinks=2 changed nothing");
  return failures ? 1 : 0;
}

// Key smoothing (the `smooth` codec flag, kvc_pool_set_key_smoothing) on
// stories260K (5 layers, 4 KV heads of 8):
// - `kvcache calibrate` writes a statistics file eval reads back (--key-stats),
//   and the file's smoothing gives the built-in statistics' result when they
//   are the same file (bench/calib/keys-stories260k.txt is fitted with the
//   command's defaults);
// - the smoothing costs no bits: int4 per token with f16 scales is
//   4 + 16 / 8 = 6 bits per key element, values in f16: 11 bits per element,
//   5 x 32 x 22 / 8 = 440 bytes per token, with or without it;
// - it lowers the KL of int4 per-token pre-RoPE keys at least fivefold (the
//   channel offsets of stories260K's keys reach 15 and per-token scales over
//   8 values cannot hold them; measured: 0.89 -> 0.012 at 4,096 tokens);
// - the file holds the queries' rms (one qrms line per layer), and
//   `qsmooth` (the scale divided by them ^ B) changes the codes, at the
//   same bits; the file without them (as written before) gives the smooth
//   rows the same result, and a default run with it leaves out the qsmooth
//   rows.
int smooth(const std::string &kvcache, const std::string &dir) {
  const std::string stats = dir + "/keys-stories260k.txt";
  const ProcessResult c =
      run_process({kvcache, "calibrate", "--model", "stories260k", "-o", stats});
  if (!c.exited || c.exit_code != 0) {
    fail("calibrate failed: " + describe(c) + "\n" + c.err);
    return 1;
  }
  const std::vector<std::string> rows = {
      "k-int4:per-token:pre-rope", "k-int4:per-token:pre-rope:smooth",
      "k-int4:per-token:smooth=0.5:pre-rope", "k-int4:per-token:smooth=0.5:qsmooth=0.5:pre-rope"};
  const std::string list = rows[0] + "," + rows[1] + "," + rows[2] + "," + rows[3];
  const nlohmann::json a = run_json(
      {kvcache, "eval", "--max-tokens", "600", "--json", "--no-progress", "--strategies", list});
  const nlohmann::json b = run_json({kvcache, "eval", "--max-tokens", "600", "--json",
                                     "--no-progress", "--key-stats", stats, "--strategies", list});
  if (!a.contains("results") || !b.contains("results")) return 1;
  std::map<std::string, nlohmann::json> by = rows_by_strategy(a), file = rows_by_strategy(b);
  for (const std::string &name : rows)
    if (!by.count(name) || !file.count(name)) {
      fail("no row " + name);
      return 1;
    }
  const nlohmann::json &plain = by[rows[0]], &sm = by[rows[1]];
  for (const nlohmann::json *r :
       {&plain, &sm, &std::as_const(by[rows[2]]), &std::as_const(by[rows[3]])}) {
    check(std::fabs((*r)["bits_per_element"].get<double>() - 11.0) < 1e-9,
          (*r)["strategy"].get<std::string>() + ": bits " + (*r)["bits_per_element"].dump() +
              ", expected 11");
    check((*r)["kv_bytes_per_token"].get<double>() == 440.0,
          (*r)["strategy"].get<std::string>() + ": bytes per token " +
              (*r)["kv_bytes_per_token"].dump() + ", expected 440");
  }
  const double kp = plain["kl_mean"].get<double>(), ks = sm["kl_mean"].get<double>();
  check(ks > 0 && ks * 5 < kp, "expected 0 < 5 x KL(smooth) < KL(plain): " + std::to_string(ks) +
                                   ", " + std::to_string(kp));
  for (int i : {1, 3})
    check(file[rows[i]]["kl_mean"] == by[rows[i]]["kl_mean"] &&
              file[rows[i]]["ppl"] == by[rows[i]]["ppl"],
          rows[i] +
              ": --key-stats with a fresh calibration differs from the built-in statistics: " +
              file[rows[i]]["kl_mean"].dump() + " vs " + by[rows[i]]["kl_mean"].dump());
  // The queries' rms (qrms) are in the file, one line per layer, and
  // weighing the smoothing by them changes the keys' codes.
  std::ifstream in(stats);
  int qrms_lines = 0;
  for (std::string line; std::getline(in, line);) qrms_lines += line.rfind("qrms ", 0) == 0;
  check(qrms_lines == 5,
        "expected 5 qrms lines in the calibration, got " + std::to_string(qrms_lines));
  check(by[rows[3]]["kl_mean"] != by[rows[2]]["kl_mean"],
        "qsmooth=0.5 gives the KL of smooth=0.5 alone: " + by[rows[3]]["kl_mean"].dump());
  // A file without the qrms lines (as written before qsmooth) gives the
  // smooth rows the same result, and a default run with it leaves out the
  // qsmooth rows instead of failing.
  {
    std::ifstream again(stats);
    std::string old_file;
    for (std::string line; std::getline(again, line);)
      if (line.rfind("qrms ", 0) != 0) old_file += line + "\n";
    const std::string old_stats = dir + "/keys-stories260k-no-qrms.txt";
    std::ofstream(old_stats) << old_file;
    const nlohmann::json o =
        run_json({kvcache, "eval", "--max-tokens", "600", "--json", "--no-progress", "--key-stats",
                  old_stats, "--strategies", rows[1]});
    std::map<std::string, nlohmann::json> ob = rows_by_strategy(o);
    check(ob.count(rows[1]) && ob[rows[1]]["kl_mean"] == sm["kl_mean"] &&
              ob[rows[1]]["ppl"] == sm["ppl"],
          "a statistics file without qrms lines changes the smooth row");
    const nlohmann::json d = run_json({kvcache, "eval", "--max-tokens", "600", "--json",
                                       "--no-progress", "--key-stats", old_stats});
    int smooth_rows = 0, qsmooth_rows = 0;
    for (const auto &r : d.value("results", nlohmann::json::array())) {
      const std::string name = r["strategy"].get<std::string>();
      smooth_rows += name.find("smooth") != std::string::npos;
      qsmooth_rows += name.find("qsmooth") != std::string::npos;
    }
    check(d.contains("results") && smooth_rows >= 1 && qsmooth_rows == 0,
          "a default run with an old statistics file: " + std::to_string(smooth_rows) +
              " smooth rows, " + std::to_string(qsmooth_rows) + " qsmooth rows (want >= 1, 0)");
  }
  return failures ? 1 : 0;
}

// Codebooks (the `codebook` codec flag, kvc_pool_set_codebook with the
// built-in Gaussian levels) on stories260K (5 layers, 4 KV heads of 8):
// - a codebook costs no bits: int3 per token with f16 scales is 3 + 16 / 8 =
//   5 bits per value element, keys in f16: (16 + 5) / 2 = 10.5 bits per
//   element, 5 x 32 x 21 / 8 = 420 bytes per token, with or without it
//   (int2: 4 bits per value element, 10 bits, 400 bytes);
// - its 2^b levels lose less than the symmetric codes' 2^b - 1 of the same
//   bits: KL at most 0.8x theirs for Hadamard-rotated values.
int codebook(const std::string &kvcache) {
  const std::vector<std::string> rows = {
      "k-f16+v-int3:per-token:hadamard", "k-f16+v-int3:per-token:hadamard:codebook",
      "k-f16+v-int2:per-token:sym:hadamard", "k-f16+v-int2:per-token:hadamard:codebook"};
  nlohmann::json a;
  std::map<std::string, nlohmann::json> by;
  if (!eval_rows(kvcache, rows, "600", &a, &by)) return 1;
  for (size_t i = 0; i < rows.size(); ++i) {
    const nlohmann::json &r = by[rows[i]];
    const double bits = i < 2 ? 10.5 : 10.0, bytes = i < 2 ? 420.0 : 400.0;
    check(
        std::fabs(r["bits_per_element"].get<double>() - bits) < 1e-9,
        rows[i] + ": bits " + r["bits_per_element"].dump() + ", expected " + std::to_string(bits));
    check(r["kv_bytes_per_token"].get<double>() == bytes,
          rows[i] + ": bytes per token " + r["kv_bytes_per_token"].dump() + ", expected " +
              std::to_string(bytes));
  }
  for (size_t i = 0; i < rows.size(); i += 2) {
    const double ku = by[rows[i]]["kl_mean"].get<double>(),
                 kc = by[rows[i + 1]]["kl_mean"].get<double>();
    check(kc > 0 && kc < 0.8 * ku, "expected 0 < KL(" + rows[i + 1] + ") < 0.8 x KL(" + rows[i] +
                                       "): " + std::to_string(kc) + ", " + std::to_string(ku));
  }
  return failures ? 1 : 0;
}

// Fitted codebooks (`kvcache calibrate --codebook`, `codebook=fit`) on
// stories260K (5 layers, 4 KV heads of 8):
// - calibrate writes a codebook file: the header, one part per codebook
//   part of the strategy (values int3 per token: group 8, 8 levels; keys
//   int4 per token: 16 levels), one line of 2^b ascending levels in [-1, 1]
//   per layer;
// - a fitted row costs the bits of the Gaussian row (10.5 and 11.1 bits,
//   420 and 444 bytes per token);
// - fitted per layer on the out-of-domain text, the levels lose less than
//   the Gaussian table on this model's values and keys (measured at 600
//   tokens: KL 6.72e-3 against 7.25e-3, 7.46e-3 against 8.48e-3), and the
//   report names the text they were fitted on.
// Per-layer codecs (BASE@LAYERS=CODECS) and the sensitivity scan on
// stories260K (5 layers): each row pays every layer's own bytes, more bits
// in two layers lose less, codebooks per layer run, and --sensitivity makes
// the base and one row per layer.
int mixed(const std::string &kvcache) {
  const std::string base = "k-int4:per-token+v-int4:per-token";
  const std::string hi = "k-int8:per-token+v-int8:per-token";
  const std::string mix = base + "@0.3=" + hi;
  const std::string cb = "k-int4:per-token:hadamard:codebook+v-int3:per-token:hadamard:codebook";
  const std::string cb_mix =
      cb + "@1-2=k-int2:per-token:sym:hadamard:codebook+v-int2:per-token:sym:hadamard:codebook";
  // int8 keys in layer 4 of a codebook row: no levels there (uniform codes)
  const std::string k8 = "k-int8:per-token:hadamard+v-int3:per-token:hadamard:codebook";
  const std::string cb_k8 = cb + "@4=" + k8;
  const std::vector<std::string> rows = {base, hi, mix, cb, cb_mix, k8, cb_k8};
  nlohmann::json a;
  std::map<std::string, nlohmann::json> by;
  if (!eval_rows(kvcache, rows, "300", &a, &by)) return 1;
  const double b_lo = by[base]["kv_bytes_per_token"].get<double>();
  const double b_hi = by[hi]["kv_bytes_per_token"].get<double>();
  const double b_mix = by[mix]["kv_bytes_per_token"].get<double>();
  // 2 of 5 layers at int8: (2 x int8 + 3 x int4) / 5 of the uniform rows' bytes
  check(std::fabs(5.0 * b_mix - (2.0 * b_hi + 3.0 * b_lo)) < 5.0,
        "mixed bytes per token " + std::to_string(b_mix) + ", expected (2 x " +
            std::to_string(b_hi) + " + 3 x " + std::to_string(b_lo) + ") / 5");
  check(by[mix]["mean_bits_per_element"].get<double>() >
                by[base]["mean_bits_per_element"].get<double>() &&
            by[mix]["mean_bits_per_element"].get<double>() <
                by[hi]["mean_bits_per_element"].get<double>(),
        "mixed mean bits between the uniform rows'");
  const double kl_lo = by[base]["kl_mean"].get<double>(), kl_mix = by[mix]["kl_mean"].get<double>();
  check(kl_mix < kl_lo, "int8 in layers 0 and 3 loses less: KL " + std::to_string(kl_mix) + " vs " +
                            std::to_string(kl_lo));
  check(by[cb_mix]["kv_bytes_per_token"].get<double>() < by[cb]["kv_bytes_per_token"].get<double>(),
        "int2 codebook layers cost fewer bytes");
  check(by[cb_mix]["kl_mean"].get<double>() > by[cb]["kl_mean"].get<double>(),
        "int2 codebook layers lose more");
  const double b_cb = by[cb]["kv_bytes_per_token"].get<double>(),
               b_k8 = by[k8]["kv_bytes_per_token"].get<double>(),
               b_cb_k8 = by[cb_k8]["kv_bytes_per_token"].get<double>();
  check(std::fabs(5.0 * b_cb_k8 - (4.0 * b_cb + b_k8)) < 5.0,
        "int8 keys in one codebook layer: bytes per token " + std::to_string(b_cb_k8) +
            ", expected (4 x " + std::to_string(b_cb) + " + " + std::to_string(b_k8) + ") / 5");
  check(by[cb_k8]["kl_mean"].get<double>() < by[cb]["kl_mean"].get<double>(),
        "int8 keys in layer 4 lose less than its int4 codebook keys: KL " +
            by[cb_k8]["kl_mean"].dump() + " vs " + by[cb]["kl_mean"].dump());
  // --sensitivity: the base, then one row per layer with int2 there.
  const nlohmann::json sres = run_json({kvcache, "eval", "--max-tokens", "100", "--json",
                                        "--no-progress", "--sensitivity", "int2:per-token"});
  if (!sres.contains("results")) return 1;
  std::vector<std::string> names;
  for (const auto &r : sres["results"]) names.push_back(r["strategy"].get<std::string>());
  const std::vector<std::string> want = {"f32",
                                         "int8",
                                         "int8@0=int2:per-token",
                                         "int8@1=int2:per-token",
                                         "int8@2=int2:per-token",
                                         "int8@3=int2:per-token",
                                         "int8@4=int2:per-token"};
  check(names == want, "sensitivity rows: " + nlohmann::json(names).dump());
  if (names == want) {
    const double b8 = sres["results"][1]["kv_bytes_per_token"].get<double>();
    for (std::size_t i = 2; i < want.size(); ++i) {
      check(sres["results"][i]["kv_bytes_per_token"].get<double>() < b8,
            want[i] + ": fewer bytes than int8");
      check(
          sres["results"][i]["kl_mean"].get<double>() > sres["results"][1]["kl_mean"].get<double>(),
          want[i] + ": int2 in one layer loses more than int8 everywhere");
    }
  }
  return failures ? 1 : 0;
}

int codebook_fit(const std::string &kvcache, const std::string &dir) {
  const std::string file = dir + "/codebook-stories260k.txt";
  const std::string spec =
      "k-int4:per-token:pre-rope:smooth:hadamard:codebook:sinks=1+v-int3:per-token:hadamard:"
      "codebook";
  const ProcessResult c =
      run_process({kvcache, "calibrate", "--model", "stories260k", "--codebook", spec, "-o", file});
  if (!c.exited || c.exit_code != 0) {
    fail("calibrate --codebook failed: " + describe(c) + "\n" + c.err);
    return 1;
  }
  std::ifstream in(file);
  std::vector<std::string> lines;
  for (std::string line; std::getline(in, line);)
    if (!line.empty() && line[0] != '#') lines.push_back(line);
  check(lines.size() == 1 + 2 * (1 + 5),
        "codebook file: " + std::to_string(lines.size()) + " lines without comments, expected 13");
  if (lines.size() == 13) {
    check(lines[0] == "kvcache-codebook 1", "header: " + lines[0]);
    check(lines[1] == "part k bits 4 group 8 layers 5", "keys part: " + lines[1]);
    check(lines[7] == "part v bits 3 group 8 layers 5", "values part: " + lines[7]);
    for (int part = 0; part < 2; ++part)
      for (int l = 0; l < 5; ++l) {
        std::istringstream ls(lines[std::size_t(2 + part * 6 + l)]);
        std::string word;
        int layer = -1;
        ls >> word >> layer;
        std::vector<double> v;
        for (double x; ls >> x;) v.push_back(x);
        bool ok = word == "levels" && layer == l && v.size() == (part ? 8u : 16u);
        for (std::size_t i = 0; ok && i < v.size(); ++i)
          ok = v[i] >= -1.0 && v[i] <= 1.0 && (i == 0 || v[i] > v[i - 1]);
        check(ok, "levels line: " + ls.str());
      }
  }
  const std::vector<std::string> rows = {
      "k-f16+v-int3:per-token:hadamard:codebook", "k-f16+v-int3:per-token:hadamard:codebook=fit",
      "k-int4:per-token:pre-rope:smooth:hadamard:codebook:sinks=1",
      "k-int4:per-token:pre-rope:smooth:hadamard:codebook=fit:sinks=1"};
  nlohmann::json a;
  std::map<std::string, nlohmann::json> by;
  if (!eval_rows(kvcache, rows, "600", &a, &by)) return 1;
  check(a.value("codebook_fit_text", "") == "out-of-domain.txt, 4 windows of 512 positions",
        "codebook_fit_text: " + a.value("codebook_fit_text", std::string("(none)")));
  for (size_t i = 0; i < rows.size(); i += 2) {
    const nlohmann::json &g = by[rows[i]], &f = by[rows[i + 1]];
    check(g["bits_per_element"] == f["bits_per_element"] &&
              g["kv_bytes_per_token"] == f["kv_bytes_per_token"] &&
              g["kv_bytes_per_token"].get<double>() == (i ? 444.0 : 420.0),
          rows[i + 1] + ": bytes per token " + f["kv_bytes_per_token"].dump() + " vs " +
              g["kv_bytes_per_token"].dump());
    const double kg = g["kl_mean"].get<double>(), kf = f["kl_mean"].get<double>();
    check(kf > 0 && kf < kg, "expected 0 < KL(" + rows[i + 1] + ") < KL(" + rows[i] +
                                 "): " + std::to_string(kf) + ", " + std::to_string(kg));
  }
  return failures ? 1 : 0;
}

// Prompts of P tokens shared + S different: every request after the first
// reuses the prefix's whole blocks, floor(P / B) x B tokens, and computes the
// rest; the first request computes all of its P + S.
int prefix(const std::string &kvcache) {
  struct Case {
    int requests, prefix, suffix, block;
  };
  for (const Case k : {Case{32, 256, 64, 16}, Case{12, 100, 40, 24}}) {
    const std::string name = "R=" + std::to_string(k.requests) + " P=" + std::to_string(k.prefix) +
                             " S=" + std::to_string(k.suffix) + " B=" + std::to_string(k.block);
    const nlohmann::json j =
        run_json({kvcache, "eval", "--prefix", "--json", "--requests", std::to_string(k.requests),
                  "--prefix-tokens", std::to_string(k.prefix), "--suffix-tokens",
                  std::to_string(k.suffix), "--block-size", std::to_string(k.block)});
    if (failures) return 1;
    const std::int64_t total = std::int64_t(k.requests) * (k.prefix + k.suffix);
    const std::int64_t reused = std::int64_t(k.prefix / k.block) * k.block;
    const std::int64_t computed =
        (k.prefix + k.suffix) + std::int64_t(k.requests - 1) * (k.prefix + k.suffix - reused);
    std::printf("%s: expect %lld of %lld tokens computed with the cache\n", name.c_str(),
                static_cast<long long>(computed), static_cast<long long>(total));
    check(j["prompt_tokens_total"] == total, name + ": prompt_tokens_total");
    check(j["without_cache"]["tokens_computed"] == total,
          name + ": the run without the cache computes everything");
    check(j["without_cache"]["hit_tokens"] == 0, name + ": hits without the cache");
    check(j["with_cache"]["tokens_computed"] == computed,
          name + ": tokens computed with the cache = " + j["with_cache"]["tokens_computed"].dump());
    check(j["with_cache"]["hit_tokens"] == total - computed, name + ": hit tokens");
    check(j["with_cache"]["hit_requests"] == k.requests - 1,
          name + ": every request but the first hits");
    check(j["with_cache"]["library_stats"]["hit_tokens"] == total - computed,
          name + ": the library's hit counter");
    check(j["with_cache"]["library_stats"]["queried_tokens"] == total,
          name + ": the library's query counter");
    check(j["logprobs_identical"] == true, name + ": log-probabilities differ between the runs");
    check(j["positions_compared"] == std::int64_t(k.requests) * k.suffix,
          name + ": positions compared");
    check(j["max_abs_logprob_diff"] == 0.0, name + ": max |logprob difference| must be 0");
    check(j["with_cache"]["ttft_ms_mean"].get<double>() > 0 &&
              j["without_cache"]["ttft_ms_mean"].get<double>() > 0,
          name + ": time to first token must be measured");
  }
  return failures ? 1 : 0;
}

// The tiered run: the prefix served from the pool, host memory, a disk tier
// read by a new process (and Redis when an address is given): each phase
// loads exactly the prefix's whole blocks and scores the suffix exactly as
// the run that computes everything.
int prefix_tiers(const std::string &kvcache, const std::string &dir,
                 const std::string &ports_file) {
  // The Redis phase uses the standalone server of the tier tests' fixture
  // (tests/tier/redis_fixture.sh writes "standalone PORT" to its ports file).
  std::string redis;
  if (!ports_file.empty()) {
    std::ifstream pf(ports_file);
    std::string what;
    int port = 0;
    while (pf >> what) {
      if (what == "standalone" && pf >> port) redis = "127.0.0.1:" + std::to_string(port);
      std::getline(pf, what);
    }
    std::printf("redis phase: %s\n", redis.empty() ? "no server (skipped)" : redis.c_str());
  }
  std::error_code ec;
  std::filesystem::remove_all(dir, ec);  // a fresh disk tier
  std::vector<std::string> cmd = {kvcache,           "eval", "--prefix",        "--json",
                                  "--requests",      "6",    "--prefix-tokens", "100",
                                  "--suffix-tokens", "40",   "--block-size",    "16",
                                  "--tier-dir",      dir};
  if (!redis.empty()) cmd.insert(cmd.end(), {"--redis", redis});
  const nlohmann::json j = run_json(cmd);
  if (failures) return 1;
  if (!j.contains("tiers") || j["tiers"].size() != 5) {
    fail("tiers: 5 phases expected");
    return 1;
  }
  const char *names[] = {"compute", "pool", "host", "disk (new process)", "redis (new process)"};
  for (int i = 0; i < 5; ++i) {
    const nlohmann::json &p = j["tiers"][i];
    const std::string name = names[i];
    check(p["name"] == name, "phase " + std::to_string(i) + " is " + p["name"].dump());
    if (name == "redis (new process)" && redis.empty()) {
      check(p["ran"] == false && p["skipped"] == "no --redis address",
            "redis skipped without an address");
      continue;
    }
    check(p["ran"] == true, name + ": did not run: " + p.value("skipped", std::string()));
    if (p["ran"] != true) continue;
    const bool computes_all = name == "compute";
    const bool loads = !computes_all && name != "pool";
    check(p["requests"] == 6, name + ": 6 requests");
    check(p["tokens_computed"] == (computes_all ? 6 * 140 : 6 * (140 - 96)),
          name + ": tokens computed " + p["tokens_computed"].dump());
    check(p["tokens_loaded"] == (loads ? 6 * 96 : 0),
          name + ": tokens loaded " + p["tokens_loaded"].dump());
    check(p["tokens_hit"] == (computes_all ? 0 : 6 * 96),
          name + ": tokens hit " + p["tokens_hit"].dump());
    check(p["nll_equal_to_compute"] == true, name + ": suffix NLL differs from the compute phase");
    check(p["ttft_ms_mean"].get<double>() > 0, name + ": TTFT measured");
  }
  return failures ? 1 : 0;
}

// One window of 4,096 positions, 8x the trained context: per-segment
// perplexity, kept shares, and StreamingLLM's result (sinks + a window with
// positions inside the cache stay flat; dense and sinks at their text
// positions degrade far from the trained context).
int long_context(const std::string &kvcache, const std::string &plot_file) {
  std::remove(plot_file.c_str());
  const nlohmann::json j =
      run_json({kvcache, "eval", "--long", "--max-tokens", "4095", "--no-progress", "--json",
                "--plot", plot_file, "--strategies",
                "f32,window:tokens=512,streaming:tokens=512,streaming:tokens=512:keep-positions"});
  if (failures) return 1;
  check(j["ctx"] == 4096 && j["trained_context"] == 512 && j["segment"] == 512,
        "ctx 4096, trained 512, segment 512");
  check(j["windows"] == 1 && j["tokens_scored"] == 4095, "one window of 4095 scored tokens");
  std::map<std::string, nlohmann::json> rows = rows_by_strategy(j);
  for (const char *name : {"f32", "window:tokens=512+f16", "streaming:tokens=512+f16",
                           "streaming:tokens=512:keep-positions+f16"}) {
    if (!rows.count(name)) {
      fail(std::string("no row ") + name);
      return 1;
    }
    const auto &r = rows[name];
    check(r["segment_ppl"].size() == 8, std::string(name) + ": 8 segments");
    for (const auto &p : r["segment_ppl"])
      check(p.get<double>() > 1.0, std::string(name) + ": segment ppl > 1");
    std::printf("%-40s kept %.4f  ppl[0,512) %.4f  ppl[2048,4096) %.4f\n", name,
                r["kept_fraction"].get<double>(), r["segment_ppl"][0].get<double>(),
                r["second_half_ppl"].get<double>());
  }
  check(rows["f32"]["kept_fraction"] == 1.0, "dense keeps every token");
  check(rows["streaming:tokens=512+f16"]["kept_fraction"] == 512.0 / 4096.0,
        "streaming keeps 512 of 4096");
  check(rows["streaming:tokens=512+f16"]["effective_bits_per_element"] == 2.0,
        "f16 x 1/8 = 2 effective bits");
  check(rows["window:tokens=512+f16"]["kept_fraction"] == 512.0 / 4096.0,
        "window keeps 512 of 4096");
  auto ratio = [&](const char *name) {
    return rows[name]["second_half_ppl"].get<double>() / rows[name]["segment_ppl"][0].get<double>();
  };
  check(ratio("streaming:tokens=512+f16") < 1.10,
        "StreamingLLM: ppl over 2048-4096 within 10% of the first 512");
  check(ratio("f32") > 2.0, "dense far past the trained context degrades");
  check(ratio("streaming:tokens=512:keep-positions+f16") > 1.5,
        "sinks at their text positions degrade");
  // The first segment is the same computation for every strategy until the cache fills.
  check(std::fabs(rows["streaming:tokens=512+f16"]["segment_ppl"][0].get<double>() -
                  rows["f32"]["segment_ppl"][0].get<double>()) < 1e-2,
        "first segment: streaming (f16) and dense agree");
  std::ifstream in(plot_file);
  const std::string svg((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  check(svg.find("<svg") != std::string::npos, "no SVG written to " + plot_file);
  check(svg.find("keep-positions") != std::string::npos, "plot has no line label");
  return failures ? 1 : 0;
}

// Every group of cases runs and reports a finite time beside its baseline;
// the speed is their ratio. No timing is judged.
int bench(const std::string &kvcache) {
  const nlohmann::json j = run_json({kvcache, "bench", "--quick", "--json"});
  if (failures) return 1;
  std::map<std::string, int> groups;
  for (const auto &r : j["results"]) {
    const std::string name = r["group"].get<std::string>() + "/" + r["name"].get<std::string>();
    ++groups[r["group"].get<std::string>()];
    const double t = r["seconds"], b = r["baseline_seconds"], speed = r["speed_vs_baseline"];
    check(std::isfinite(t) && t > 0 && std::isfinite(b) && b > 0,
          name + ": times must be positive");
    check(std::fabs(speed - b / t) <= 1e-9 * speed, name + ": speed_vs_baseline = baseline / time");
    check(!r["baseline"].get<std::string>().empty(), name + ": names its baseline");
    std::printf("%-90s %.3fx\n", name.c_str(), speed);
  }
  for (const char *g : {"pool", "codec", "attention", "evict", "prefix", "model"})
    check(groups[g] >= 1, std::string("no ") + g + " case");
  check(groups["codec"] == 6 && groups["attention"] == 12 && groups["prefix"] == 2,
        "case counts per group");
  // --filter narrows the run to matching cases.
  const nlohmann::json f = run_json({kvcache, "bench", "--quick", "--json", "--filter", "prefix/"});
  check(!failures && f["results"].size() == 2, "--filter prefix/ runs the two prefix cases");
  return failures ? 1 : 0;
}

std::vector<std::string> after_dashes(int argc, char **argv, int from) {
  std::vector<std::string> cmd;
  for (int i = from; i < argc; ++i) cmd.emplace_back(argv[i]);
  return cmd;
}

}  // namespace

// residual=R / block=N on per-token codecs, and chunked prefill that reads
// what token-by-token decode reads (each query's own residual window exact).
// stories260K's default run is token by token; --chunk 16 and 64 run
// forward_chunk. Without the runner's correction the chunked rows lose far
// more (the chunk's older tokens would be codes for every query of it); the
// measured gap between the two protocols is below 1e-3 of the perplexity
// (differences of summation order only). The rows cover a window with
// sinks and per-layer codecs (the default list's shape), hybrid's growing
// window and per-channel groups. A residual also has to help: the window's
// row loses less than the same codec without one.
int residual(const std::string &kvcache) {
  const std::vector<std::string> rows = {
      "int8:per-token:residual=4:block=4",
      "int4:per-token:hadamard:residual=4:block=4",
      "int4:per-token:hadamard",
      "kivi2:group=16:residual=32",
      "hybrid:fraction=0.25",
      "k-int4:kchannel=16:asym+v-int4:per-token:residual=2",
      "int4:per-token:hadamard:sinks=1:residual=4:block=2@0.3=int8:per-token:hadamard",
      "int4:per-token:hadamard:residual=4:block=4:residual-int8"};
  std::string list = "f32";
  for (const std::string &r : rows) list += "," + r;
  nlohmann::json rep[3];
  std::map<std::string, nlohmann::json> by[3];
  const char *chunks[3] = {"1", "16", "64"};
  for (int i = 0; i < 3; ++i) {
    rep[i] = run_json({kvcache, "eval", "--max-tokens", "600", "--json", "--no-progress",
                       "--strategies", list, "--chunk", chunks[i]});
    if (!rep[i].contains("results")) return 1;
    by[i] = rows_by_strategy(rep[i]);
    for (const std::string &name : rows)
      if (!by[i].count(name)) {
        fail("no row " + name);
        return 1;
      }
  }
  for (const std::string &name : rows)
    for (int i = 1; i < 3; ++i) {
      const double a = by[0][name]["ppl"].get<double>(), b = by[i][name]["ppl"].get<double>();
      check(std::fabs(b / a - 1.0) < 1e-3, name + ": chunks of " + chunks[i] + ": perplexity " +
                                               std::to_string(b) + " vs token by token " +
                                               std::to_string(a));
    }
  const std::string w = "int4:per-token:hadamard:residual=4:block=4",
                    plain = "int4:per-token:hadamard";
  for (int i = 0; i < 3; ++i)
    check(by[i][w]["kl_mean"].get<double>() < 0.8 * by[i][plain]["kl_mean"].get<double>(),
          "a 4-token window loses less: KL " + by[i][w]["kl_mean"].dump() + " vs " +
              by[i][plain]["kl_mean"].dump());
  // block=4: the int8 row's 4-token blocks of codes and of residual; its
  // bytes per token at the end of a window are the int8 row's per-token size
  // (5 layers x 32 values x 2 x (8 bits + 32-bit scale / 8 values) / 8 = 480
  // bytes) plus the window's f16 rows: 4 tokens x 5 x 32 x 2 x 2 bytes over
  // the 512-position window's tokens (the ctx): about 5 bytes.
  const double bytes =
      by[0]["int8:per-token:residual=4:block=4"]["kv_bytes_per_token"].get<double>();
  check(bytes > 480.0 && bytes < 490.0,
        "int8 residual=4 block=4: " + std::to_string(bytes) + " bytes per token");
  // residual-int8: the window's rows as int8 with an f16 scale per token and
  // KV head (4 heads x (8 + 2) bytes a part) instead of f16 (4 x 8 x 2): at
  // a window's end 4 tokens x 5 layers x 2 parts x 24 bytes less over its
  // 512 tokens of 5 x 2 x 32 values, 0.046875 bits per element. Int8 rows
  // keep most of what the window gains (head_dim 8 here, so an int8 row's
  // scale is set by 8 values: KL 8.3e-2 against 7.5e-2 for f16 rows and
  // 0.49 without a window).
  const std::string w8 = w + ":residual-int8";
  for (int i = 0; i < 3; ++i) {
    const double saved =
        by[i][w]["bits_per_element"].get<double>() - by[i][w8]["bits_per_element"].get<double>();
    check(std::fabs(saved - 0.046875) < 1e-9,
          "residual-int8 saves " + std::to_string(saved) + " bits per element, not 0.046875");
    const double kl8 = by[i][w8]["kl_mean"].get<double>(), kl = by[i][w]["kl_mean"].get<double>(),
                 none = by[i][plain]["kl_mean"].get<double>();
    check(kl8 < 1.15 * kl && kl8 < 0.25 * none, "residual-int8 KL " + std::to_string(kl8) +
                                                    " vs f16 window " + std::to_string(kl) +
                                                    ", no window " + std::to_string(none));
  }
  return failures ? 1 : 0;
}

int main(int argc, char **argv) {
  const std::string mode = argc > 1 ? argv[1] : "";
  try {
    if (mode == "make-bad-files" && argc == 4) return make_bad_files(argv[2], argv[3]);
    if (mode == "expect-fail" && argc > 4 && std::string(argv[3]) == "--")
      return expect_fail(argv[2], after_dashes(argc, argv, 4));
    if (mode == "eval-json" && argc > 3 && std::string(argv[2]) == "--")
      return eval_json(after_dashes(argc, argv, 3));
    if (mode == "memory" && argc == 3) return memory(argv[2]);
    if (mode == "blas-core" && argc == 3) return blas_core(argv[2]);
    if (mode == "split-kv" && argc == 3) return split_kv(argv[2]);
    if (mode == "smooth" && argc == 4) return smooth(argv[2], argv[3]);
    if (mode == "codebook" && argc == 3) return codebook(argv[2]);
    if (mode == "codebook-fit" && argc == 4) return codebook_fit(argv[2], argv[3]);
    if (mode == "mixed" && argc == 3) return mixed(argv[2]);
    if (mode == "residual" && argc == 3) return residual(argv[2]);
    if (mode == "plot" && argc == 4) return plot(argv[2], argv[3]);
    if (mode == "prefix" && argc == 3) return prefix(argv[2]);
    if (mode == "prefix-tiers" && (argc == 4 || argc == 5))
      return prefix_tiers(argv[2], argv[3], argc == 5 ? argv[4] : "");
    if (mode == "long" && argc == 4) return long_context(argv[2], argv[3]);
    if (mode == "bench" && argc == 3) return bench(argv[2]);
    if (mode == "recommend" && argc == 5) return recommend(argv[2], argv[3], argv[4]);
  } catch (const std::exception &e) {
    fail(e.what());
    return 1;
  }
  std::fprintf(stderr, "usage: see the comment at the top of cli_check.cpp\n");
  return 2;
}
