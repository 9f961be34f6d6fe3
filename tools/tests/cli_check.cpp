// SPDX-License-Identifier: Apache-2.0
// Test driver for the kvcache tool (eval_* tests):
//   cli_check make-bad-files REAL_MODEL OUTDIR   writes broken checkpoints/tokenizers
//   cli_check expect-fail REGEX -- CMD ARGS...   CMD must exit non-zero (not by a
//                                               signal) with REGEX in its output
//   cli_check eval-json -- CMD ARGS...           checks an `eval --json` report
//   cli_check memory KVCACHE                     checks `memory` against hand-computed sizes
//   cli_check plot KVCACHE FILE.svg              a short eval writes a plot
//   cli_check prefix KVCACHE                     `eval --prefix`: exact reuse counts, identical log-probs
//   cli_check long KVCACHE FILE.svg              `eval --long`: segments, kept shares, StreamingLLM result
//   cli_check bench KVCACHE                      `bench --quick --json`: every group, sane figures
//   cli_check recommend CASE KVCACHE DATA_DIR    checks `recommend` on the crafted eval reports
//                                               of DATA_DIR (tools/tests/data/recommend)
#include <sys/stat.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <iterator>
#include <map>
#include <nlohmann/json.hpp>
#include <regex>
#include <string>
#include <vector>

#include "process.h"

namespace {

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
  write_file(dir + "/huge-dims.bin", with_header(model, {65536, 1 << 20, 4096, 512, 512, 1 << 24, 1 << 24}));
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
  return failures ? 1 : 0;
}

int expect_fail(const std::string &regex, const std::vector<std::string> &cmd) {
  const ProcessResult r = run_process(cmd);
  const std::string all = r.out + r.err;
  std::printf("%s\n--- output ---\n%s", describe(r).c_str(), all.c_str());
  check(r.started, "command did not start");
  check(r.exited, "command crashed: " + describe(r));
  check(r.exited && r.exit_code != 0 && r.exit_code != 127, "expected a non-zero exit, got " + describe(r));
  check(std::regex_search(all, std::regex(regex)), "output does not match /" + regex + "/");
  check(all.find("error") != std::string::npos, "output does not say 'error'");
  return failures ? 1 : 0;
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
    for (const char *key : {"strategy", "bits_per_element", "kv_bytes_per_token", "peak_kv_bytes",
                            "compression_vs_f16", "ppl", "ppl_delta_pct", "kl_mean",
                            "top1_agreement", "ms_per_token", "kept_fraction", "effective_bits_per_element",
                            "mean_bits_per_element", "segment_ppl", "second_half_ppl"}) {
      check(row.contains(key), std::string("result row misses ") + key);
    }
    if (failures) return 1;
    // Without eviction every position stays; with it, fewer. One segment (ctx = the trained context)
    // whose ppl is the row's.
    const std::string name = row["strategy"];
    const double kept = row["kept_fraction"];
    if (name.find("budget=") == std::string::npos) check(kept == 1.0, name + ": kept_fraction must be 1");
    else check(kept > 0.2 && kept < 0.9, name + ": kept_fraction must be below 1 with eviction");
    check(std::fabs(row["effective_bits_per_element"].get<double>() - kept * row["bits_per_element"].get<double>()) <
              1e-9,
          name + ": effective bits = bits x kept");
    // Before a window's end its last block is partly filled: without eviction a token costs at least as much.
    if (kept == 1.0)
      check(row["mean_bits_per_element"].get<double>() >= row["bits_per_element"].get<double>() - 1e-9,
            name + ": mean_bits_per_element below bits_per_element without eviction");
    check(row["segment_ppl"].size() == 1 &&
              std::fabs(row["segment_ppl"][0].get<double>() / row["ppl"].get<double>() - 1.0) < 1e-12,
          "one segment, whose ppl is the row's ppl");
    const std::string s = row["strategy"];
    const double delta = row["ppl_delta_pct"], top1 = row["top1_agreement"], kl = row["kl_mean"];
    const double bits = row["bits_per_element"];
    check(row["ppl"].get<double>() > 1.0 && std::isfinite(row["ppl"].get<double>()), s + ": bad ppl");
    check(row["peak_kv_bytes"].get<std::uint64_t>() > 0, s + ": peak_kv_bytes is 0");
    if (s == "f32") {
      seen[0] = true;
      check(delta == 0.0, "f32 ppl_delta_pct must be exactly 0");
      check(kl == 0.0 && top1 == 1.0, "f32 must equal the reference");
      check(bits >= 32.0, "f32 bits_per_element < 32");
    } else if (s == "f16" || s == "bf16") {
      seen[s == "f16" ? 1 : 2] = true;
      check(delta != 0.0 && std::fabs(delta) < 1.0, s + ": ppl_delta_pct must be non-zero and < 1%");
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
    const auto j = memory_json(kvcache, {"--preset", "llama-7b", "--seq-len", std::to_string(lengths[i])});
    if (failures) return 1;
    check(j["bytes_per_token"] == 524288u, "llama-7b bytes_per_token != 524288");
    check(j["bytes_per_token_per_layer"] == 16384u, "llama-7b bytes per token per layer != 16384");
    check(j["bytes_total"] == gib[i] * GiB, "llama-7b total for " + std::to_string(lengths[i]) + " tokens");
    check(j["bytes_per_layer"] == gib[i] * GiB / 32, "llama-7b per layer");
  }
  // The text report prints the four lengths with two decimals.
  const ProcessResult t = run_process({kvcache, "memory", "--preset", "llama-7b", "--seq-len", "32768"});
  std::printf("%s", t.out.c_str());
  for (const char *line : {"2048 tokens    1.00 GiB", "4096 tokens    2.00 GiB", "8192 tokens    4.00 GiB",
                           "32768 tokens   16.00 GiB", "512.00 KiB"}) {
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
  j = memory_json(kvcache, {"--layers", "5", "--kv-heads", "4", "--head-dim", "8", "--seq-len", "512", "--dtype", "f32"});
  check(j["bytes_per_token"] == 1280u && j["bytes_total"] == 1280u * 512, "explicit dims f32");
  j = memory_json(kvcache, {"--preset", "stories260k", "--seq-len", "512"});
  check(j["bytes_per_token"] == 640u, "stories260k f16 bytes_per_token != 640");
  return failures ? 1 : 0;
}

int plot(const std::string &kvcache, const std::string &file) {
  std::remove(file.c_str());
  const ProcessResult r = run_process({kvcache, "eval", "--max-tokens", "300", "--no-progress", "--plot", file});
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
                "f32,k-f32+v-f32,int8:per-token,k-int8:per-token+v-int8:per-token,k-int8:per-token,v-int4:group=32,"
                "kivi4:group=16:residual=32,kivi4:group=16:residual=32:sinks=2"});
  if (!j.contains("results")) return 1;
  std::map<std::string, nlohmann::json> by;
  for (const auto &r : j["results"]) by[r["strategy"].get<std::string>()] = r;
  for (const char *name : {"f32", "k-f32+v-f32", "int8:per-token", "k-int8:per-token+v-int8:per-token",
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
        "k-int8:per-token: bits " + by["k-int8:per-token"]["bits_per_element"].dump() + ", expected 14");
  // Averaged over the run (one position per forward pass): with t tokens a
  // layer holds ceil(t / 16) blocks of 16, so the two windows (512 and 90
  // positions) hold sum 16 ceil(t / 16) = 135,168 + 4,800 token slots for
  // sum t = 131,328 + 4,095 tokens.
  check(std::fabs(by["k-int8:per-token"]["mean_bits_per_element"].get<double>() - 14.0 * 139968.0 / 135423.0) < 1e-9,
        "k-int8:per-token: mean bits " + by["k-int8:per-token"]["mean_bits_per_element"].dump() + ", expected " +
            std::to_string(14.0 * 139968.0 / 135423.0));
  check(by["k-int8:per-token"]["kv_bytes_per_token"].get<double>() == 560.0,
        "k-int8:per-token: bytes per token " + by["k-int8:per-token"]["kv_bytes_per_token"].dump() + ", expected 560");
  check(std::fabs(by["v-int4:group=32"]["bits_per_element"].get<double>() - 10.25) < 1e-9,
        "v-int4:group=32: bits " + by["v-int4:group=32"]["bits_per_element"].dump() + ", expected 10.25");
  check(by["v-int4:group=32"]["kv_bytes_per_token"].get<double>() == 410.0,
        "v-int4:group=32: bytes per token " + by["v-int4:group=32"]["kv_bytes_per_token"].dump() + ", expected 410");
  const double k8 = by["k-int8:per-token"]["kl_mean"].get<double>(), v4 = by["v-int4:group=32"]["kl_mean"].get<double>();
  check(k8 > 0 && v4 > k8, "expected 0 < KL(k-int8) < KL(v-int4): " + std::to_string(k8) + ", " + std::to_string(v4));
  // Attention sinks: the copies of every layer's first 2 tokens share one
  // residual block per sequence (floor(16 / 2) = 8 layers to a block of 16
  // tokens x K and V x f16), measured at the end of each window of ctx tokens.
  const nlohmann::json &geo = j["geometry"];
  const double layers = geo["num_layers"].get<double>(), row = geo["num_kv_heads"].get<double>() * geo["head_dim"].get<double>();
  const double sink_blocks = std::ceil(layers / 8.0), ctx = j["ctx"].get<double>();
  const double extra = sink_blocks * 16 * 2 * row * 2 / ctx;  // bytes per token (all layers)
  const nlohmann::json &k0 = by["kivi4:group=16:residual=32"], &k2 = by["kivi4:group=16:residual=32:sinks=2"];
  if (k0.is_null() || k2.is_null()) {
    fail("no kivi4 rows");
    return 1;
  }
  const double got = k2["kv_bytes_per_token"].get<double>() - k0["kv_bytes_per_token"].get<double>();
  check(std::fabs(got - extra) <= 1.0, "sinks=2 adds " + std::to_string(got) + " bytes per token, expected " + std::to_string(extra));
  check(k2["kl_mean"] != k0["kl_mean"], "sinks=2 changed nothing");
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
    const nlohmann::json j = run_json({kvcache, "eval", "--prefix", "--json", "--requests", std::to_string(k.requests),
                                       "--prefix-tokens", std::to_string(k.prefix), "--suffix-tokens",
                                       std::to_string(k.suffix), "--block-size", std::to_string(k.block)});
    if (failures) return 1;
    const std::int64_t total = std::int64_t(k.requests) * (k.prefix + k.suffix);
    const std::int64_t reused = std::int64_t(k.prefix / k.block) * k.block;
    const std::int64_t computed = (k.prefix + k.suffix) + std::int64_t(k.requests - 1) * (k.prefix + k.suffix - reused);
    std::printf("%s: expect %lld of %lld tokens computed with the cache\n", name.c_str(),
                static_cast<long long>(computed), static_cast<long long>(total));
    check(j["prompt_tokens_total"] == total, name + ": prompt_tokens_total");
    check(j["without_cache"]["tokens_computed"] == total, name + ": the run without the cache computes everything");
    check(j["without_cache"]["hit_tokens"] == 0, name + ": hits without the cache");
    check(j["with_cache"]["tokens_computed"] == computed,
          name + ": tokens computed with the cache = " + j["with_cache"]["tokens_computed"].dump());
    check(j["with_cache"]["hit_tokens"] == total - computed, name + ": hit tokens");
    check(j["with_cache"]["hit_requests"] == k.requests - 1, name + ": every request but the first hits");
    check(j["with_cache"]["library_stats"]["hit_tokens"] == total - computed, name + ": the library's hit counter");
    check(j["with_cache"]["library_stats"]["queried_tokens"] == total, name + ": the library's query counter");
    check(j["logprobs_identical"] == true, name + ": log-probabilities differ between the runs");
    check(j["positions_compared"] == std::int64_t(k.requests) * k.suffix, name + ": positions compared");
    check(j["max_abs_logprob_diff"] == 0.0, name + ": max |logprob difference| must be 0");
    check(j["with_cache"]["ttft_ms_mean"].get<double>() > 0 && j["without_cache"]["ttft_ms_mean"].get<double>() > 0,
          name + ": time to first token must be measured");
  }
  return failures ? 1 : 0;
}

// The tiered run: the prefix served from the pool, host memory, a disk tier
// read by a new process (and Redis when an address is given): each phase
// loads exactly the prefix's whole blocks and scores the suffix exactly as
// the run that computes everything.
int prefix_tiers(const std::string &kvcache, const std::string &dir, const std::string &ports_file) {
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
  std::vector<std::string> cmd = {kvcache, "eval", "--prefix", "--json", "--requests", "6", "--prefix-tokens", "100",
                                  "--suffix-tokens", "40", "--block-size", "16", "--tier-dir", dir};
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
      check(p["ran"] == false && p["skipped"] == "no --redis address", "redis skipped without an address");
      continue;
    }
    check(p["ran"] == true, name + ": did not run: " + p.value("skipped", std::string()));
    if (p["ran"] != true) continue;
    const bool computes_all = name == "compute";
    const bool loads = !computes_all && name != "pool";
    check(p["requests"] == 6, name + ": 6 requests");
    check(p["tokens_computed"] == (computes_all ? 6 * 140 : 6 * (140 - 96)),
          name + ": tokens computed " + p["tokens_computed"].dump());
    check(p["tokens_loaded"] == (loads ? 6 * 96 : 0), name + ": tokens loaded " + p["tokens_loaded"].dump());
    check(p["tokens_hit"] == (computes_all ? 0 : 6 * 96), name + ": tokens hit " + p["tokens_hit"].dump());
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
      run_json({kvcache, "eval", "--long", "--max-tokens", "4095", "--no-progress", "--json", "--plot", plot_file,
                "--strategies", "f32,window:tokens=512,streaming:tokens=512,streaming:tokens=512:keep-positions"});
  if (failures) return 1;
  check(j["ctx"] == 4096 && j["trained_context"] == 512 && j["segment"] == 512, "ctx 4096, trained 512, segment 512");
  check(j["windows"] == 1 && j["tokens_scored"] == 4095, "one window of 4095 scored tokens");
  std::map<std::string, nlohmann::json> rows;
  for (const auto &r : j["results"]) rows[r["strategy"].get<std::string>()] = r;
  for (const char *name : {"f32", "window:tokens=512+f16", "streaming:tokens=512+f16",
                           "streaming:tokens=512:keep-positions+f16"}) {
    if (!rows.count(name)) {
      fail(std::string("no row ") + name);
      return 1;
    }
    const auto &r = rows[name];
    check(r["segment_ppl"].size() == 8, std::string(name) + ": 8 segments");
    for (const auto &p : r["segment_ppl"]) check(p.get<double>() > 1.0, std::string(name) + ": segment ppl > 1");
    std::printf("%-40s kept %.4f  ppl[0,512) %.4f  ppl[2048,4096) %.4f\n", name, r["kept_fraction"].get<double>(),
                r["segment_ppl"][0].get<double>(), r["second_half_ppl"].get<double>());
  }
  check(rows["f32"]["kept_fraction"] == 1.0, "dense keeps every token");
  check(rows["streaming:tokens=512+f16"]["kept_fraction"] == 512.0 / 4096.0, "streaming keeps 512 of 4096");
  check(rows["streaming:tokens=512+f16"]["effective_bits_per_element"] == 2.0, "f16 x 1/8 = 2 effective bits");
  check(rows["window:tokens=512+f16"]["kept_fraction"] == 512.0 / 4096.0, "window keeps 512 of 4096");
  auto ratio = [&](const char *name) {
    return rows[name]["second_half_ppl"].get<double>() / rows[name]["segment_ppl"][0].get<double>();
  };
  check(ratio("streaming:tokens=512+f16") < 1.10, "StreamingLLM: ppl over 2048-4096 within 10% of the first 512");
  check(ratio("f32") > 2.0, "dense far past the trained context degrades");
  check(ratio("streaming:tokens=512:keep-positions+f16") > 1.5, "sinks at their text positions degrade");
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
    check(std::isfinite(t) && t > 0 && std::isfinite(b) && b > 0, name + ": times must be positive");
    check(std::fabs(speed - b / t) <= 1e-9 * speed, name + ": speed_vs_baseline = baseline / time");
    check(!r["baseline"].get<std::string>().empty(), name + ": names its baseline");
    std::printf("%-90s %.3fx\n", name.c_str(), speed);
  }
  for (const char *g : {"pool", "codec", "attention", "evict", "prefix", "model"})
    check(groups[g] >= 1, std::string("no ") + g + " case");
  check(groups["codec"] == 6 && groups["attention"] == 5 && groups["prefix"] == 2, "case counts per group");
  // --filter narrows the run to matching cases.
  const nlohmann::json f = run_json({kvcache, "bench", "--quick", "--json", "--filter", "prefix/"});
  check(!failures && f["results"].size() == 2, "--filter prefix/ runs the two prefix cases");
  return failures ? 1 : 0;
}

// --- recommend -------------------------------------------------------------------
// The crafted reports (tools/tests/data/recommend) have rows whose answers are
// worked out by hand below. Llama-3-8B: 2 x 32 layers x 8 KV heads x 128 = 65,536
// elements per token, so b bits per element make 8,192 x b bytes per token.

constexpr std::uint64_t kGiB = 1ull << 30;

nlohmann::json recommend_json(const std::string &kvcache, const std::vector<std::string> &args) {
  std::vector<std::string> cmd = {kvcache, "recommend", "--json"};
  cmd.insert(cmd.end(), args.begin(), args.end());
  const ProcessResult r = run_process(cmd);
  if (!r.exited || r.exit_code != 0) {
    fail("recommend failed: " + describe(r) + ": " + r.err);
    return nlohmann::json::object();
  }
  try {
    return nlohmann::json::parse(r.out);
  } catch (const std::exception &e) {
    fail(std::string("recommend --json: stdout is not JSON: ") + e.what());
    return nlohmann::json::object();
  }
}

std::vector<std::string> llama3(const std::string &from, const std::string &memory, const std::string &floor,
                                std::vector<std::string> more = {}) {
  std::vector<std::string> a = {"--preset", "llama-3-8b", "--seq-len", "4096", "--batch", "8", "--memory",
                                memory, "--max-ppl-increase", floor, "--from", from};
  a.insert(a.end(), more.begin(), more.end());
  return a;
}

const nlohmann::json *row_named(const nlohmann::json &j, const std::string &strategy) {
  if (!j.contains("rows")) return nullptr;
  for (const auto &r : j["rows"]) {
    if (r["strategy"] == strategy) return &r;
  }
  return nullptr;
}

bool near(double a, double b) { return std::fabs(a - b) <= 1e-9 * std::max(1.0, std::fabs(b)); }

void check_pick(const nlohmann::json &j, const std::string &strategy, std::uint64_t bytes_per_token,
                const std::string &what) {
  if (!j.contains("pick") || !j["pick"].is_object()) {
    fail(what + ": no pick");
    return;
  }
  const auto &p = j["pick"];
  check(j["verdict"] == "recommend", what + ": verdict is not recommend");
  check(p["strategy"] == strategy, what + ": picked " + p["strategy"].dump() + ", expected " + strategy);
  check(p["bytes_per_token"] == bytes_per_token,
        what + ": bytes_per_token " + p["bytes_per_token"].dump() + ", expected " + std::to_string(bytes_per_token));
  check(p["meets_floor"] == true, what + ": the pick does not meet the floor");
}

// Bytes at llama-3-8b (32 layers, 8 KV heads of 128, blocks of 16 tokens) come from the pools'
// layouts there (cli/seq_bytes.h), not from the bits measured on stories260K (head_dim 8):
// - kivi4:group=16:residual=32: a block per layer holds int4 codes of K and V (2 x 8,192 bytes),
//   keys' f16 scale and zero point per channel (4,096) and values' per group of 16 (4,096):
//   24,576 bytes; a residual block 16 x 1,024 x 2 x 2 = 65,536 (K and V in f16). On the way to
//   4,096 tokens a sequence holds the most at 4,095: 4,048 encoded (253 blocks) and 47 staged
//   (3 residual blocks): 32 x (253 x 24,576 + 3 x 65,536) = 205,258,752 bytes, 50,112 per token.
// - int4:group=32:kchannel=16: 5 bits for keys (an f16 scale per channel and 16 tokens), 4.5 for
//   values: blocks of 19,456 bytes; at 4,095 tokens 255 blocks and one staging block per layer:
//   32 x (255 x 19,456 + 65,536) = 160,858,112 bytes, 39,272 per token.
// - int8:per-token: 8 bits and an f32 scale per 128 values: 32 x 8 x 132 x 2 = 67,584 bytes per token.
int recommend_pick(const std::string &k, const std::string &dir) {
  const std::string basic = dir + "/eval-basic.json";
  // Floor 1%: kivi4 (+0.5%) over int4 (+3%) and int2 (+20%).
  auto j = recommend_json(k, llama3(basic, "16GiB", "1"));
  if (failures) return 1;
  check_pick(j, "kivi4:group=16:residual=32", 50112, "floor 1");
  check(j["pick"]["bytes_per_sequence"] == 205258752u && j["pick"]["bytes_source"] == "pool layout",
        "kivi4: 205,258,752 bytes per sequence from the pool layout");
  for (const char *cheaper : {"int4:group=32", "int2:group=32", "int4:group=32:kchannel=16"}) {
    const auto *r = row_named(j, cheaper);
    check(r && (*r)["meets_floor"] == false && (*r)["bytes_total"] < j["pick"]["bytes_total"],
          std::string(cheaper) + " must be cheaper than the pick and miss the floor");
  }
  check(j["rows"].size() == 8, "8 rows besides the reference");
  for (std::size_t i = 1; i < j["rows"].size(); ++i)
    check(j["rows"][i - 1]["bytes_total"] <= j["rows"][i]["bytes_total"], "rows are not sorted by total memory");
  check(j["reference"]["strategy"] == "f32" && j["reference"]["bytes_per_token"] == 262144u, "reference f32: 262144 B/token");
  check(j["measurements"]["source"] == "file" && j["measurements"]["strategies"] == 8, "measurements");
  // The floor moves the pick: 2.5% -> int4 with per-channel keys (5 bits), 5% -> int4 (4.5 bits),
  // 0.1% -> int8 (12 bits), 0.0002% (inclusive) -> f16.
  check_pick(recommend_json(k, llama3(basic, "16GiB", "2.5")), "int4:group=32:kchannel=16", 39272, "floor 2.5");
  check_pick(recommend_json(k, llama3(basic, "16GiB", "5")), "int4:group=32", 36864, "floor 5");
  check_pick(recommend_json(k, llama3(basic, "16GiB", "0.1")), "int8:per-token", 67584, "floor 0.1");
  check_pick(recommend_json(k, llama3(basic, "16GiB", "0.0002")), "f16", 131072, "floor 0.0002");
  return failures ? 1 : 0;
}

int recommend_none(const std::string &k, const std::string &dir) {
  // Nothing meets 0.0001%: a verdict with exit 0, the closest row (f16, +0.0002%).
  auto j = recommend_json(k, llama3(dir + "/eval-basic.json", "16GiB", "0.0001"));
  if (failures) return 1;
  check(j["verdict"] == "nothing_meets_floor", "verdict must be nothing_meets_floor");
  check(j["pick"].is_null() && j["fits"].is_null(), "no pick when nothing meets the floor");
  check(j["closest"].is_object() && j["closest"]["strategy"] == "f16", "closest must be f16");
  check(near(j["closest"]["ppl_delta_pct"].get<double>(), 0.0002), "closest ppl_delta_pct 0.0002");
  for (const auto &r : j["rows"]) check(r["meets_floor"] == false, r["strategy"].get<std::string>() + " meets the floor");
  const ProcessResult t = run_process({k, "recommend", "--preset", "llama-3-8b", "--seq-len", "4096", "--batch", "8",
                                       "--memory", "16GiB", "--max-ppl-increase", "0.0001", "--from",
                                       dir + "/eval-basic.json"});
  std::printf("%s", t.out.c_str());
  check(t.exited && t.exit_code == 0, "text run must exit 0: " + describe(t));
  check(t.out.find("no strategy meets the floor") != std::string::npos, "text misses 'no strategy meets the floor'");
  check(t.out.find("closest: f16") != std::string::npos, "text misses 'closest: f16'");
  return failures ? 1 : 0;
}

int recommend_fits(const std::string &k, const std::string &dir) {
  const std::string basic = dir + "/eval-basic.json";
  // kivi4 at 4096 tokens x batch 8: 8 x 205,258,752 (above) = 1,642,070,016 bytes = 9.56% of 16 GiB.
  auto j = recommend_json(k, llama3(basic, "16GiB", "1"));
  if (failures) return 1;
  const auto &p = j["pick"];
  check(j["target"]["memory_bytes"] == 16 * kGiB && j["target"]["elements_per_token"] == 65536u, "target");
  check(p["tokens_held"] == 4096u && p["bytes_total"] == 1642070016ull, "kivi4 total != 1,642,070,016");
  check(near(p["budget_share"].get<double>(), 1642070016.0 / (16.0 * kGiB)), "budget share != 0.0956");
  check(p["fits"] == true && j["fits"] == true, "must fit in 16 GiB");
  // Headroom: floor(16 GiB / 205,258,752) = 83 sequences. At batch 8 a sequence may take 2 GiB,
  // 67,108,864 bytes per layer: 43,600 tokens hold 2,723 blocks and 32 staged tokens (2 residual
  // blocks; 67,051,520 bytes), 4,095 before them at most 67,092,480 (2,722 blocks, 47 staged); at
  // 43,601 the 33 staged tokens need a third residual block: 67,117,056.
  check(p["largest_batch_that_fits"] == 83u && p["largest_seq_len_that_fits"] == 43600u, "headroom in 16 GiB");
  // 1 GiB: does not fit; floor(2^30 / 205,258,752) = 5 sequences. At batch 8, 4,194,304 bytes per
  // layer: 2,640 tokens take 163 x 24,576 + 2 x 65,536 = 4,136,960 (2,639: 162 blocks, 3 residual:
  // 4,177,920); 2,641 take 163 blocks and 3 residual, 4,202,496.
  j = recommend_json(k, llama3(basic, "1GiB", "1"));
  check(j["fits"] == false && j["pick"]["fits"] == false, "must not fit in 1 GiB");
  check(j["pick"]["strategy"] == "kivi4:group=16:residual=32", "the pick does not depend on the memory");
  check(j["pick"]["largest_batch_that_fits"] == 5u, "largest batch in 1 GiB != 5");
  check(j["pick"]["largest_seq_len_that_fits"] == 2640u, "largest seq-len in 1 GiB != 2640");
  // 1e9 bytes: 4 sequences; 3,906,250 bytes per layer at batch 8: 2,448 tokens take 151 blocks
  // and 2 residual (3,842,048; 2,447: 150 blocks and 3 residual, 3,883,008); 2,449 take 151 and 3,
  // 3,907,584. Explicit dimensions = the preset.
  j = recommend_json(k, {"--layers", "32", "--kv-heads", "8", "--head-dim", "128", "--seq-len", "4096", "--batch", "8",
                         "--memory", "1e9", "--max-ppl-increase", "1", "--from", basic});
  check(j["target"]["memory_bytes"] == 1000000000u && j["target"]["model"] == "custom", "1e9 / custom geometry");
  check(j["pick"]["bytes_total"] == 1642070016ull && j["pick"]["largest_seq_len_that_fits"] == 2448u, "1e9 bytes");
  j = recommend_json(k, llama3(basic, "512 MiB", "1"));
  check(j["target"]["memory_bytes"] == 536870912u, "512 MiB");
  // f32 reference: 262,144 B/token x 32,768 tokens = 8 GiB.
  check(j["reference"]["bytes_total"] == 8 * kGiB, "reference total != 8 GiB");
  const ProcessResult t = run_process({k, "recommend", "--preset", "llama-3-8b", "--seq-len", "4096", "--batch", "8",
                                       "--memory", "1GiB", "--max-ppl-increase", "1", "--from", basic});
  std::printf("%s", t.out.c_str());
  check(t.exited && t.exit_code == 0, "text run must exit 0: " + describe(t));
  // kivi4 keeps up to 32 + 15 tokens in f16 (its window and a group of 16 waiting): measured at ctx 512.
  for (const char *s : {"DOES NOT FIT", "batch 5 at most", "seq-len 2640 at most", "1642070016 bytes",
                        "note: up to 47 of its newest tokens wait in f16"})
    check(t.out.find(s) != std::string::npos, std::string("text misses '") + s + "'");
  return failures ? 1 : 0;
}

int recommend_eviction(const std::string &k, const std::string &dir) {
  // Eviction rows at 4096 tokens hold whole f16 blocks of 16 tokens: 16 x 8 x 128 x 2 x 2 = 65,536
  // bytes per block and layer, 2,097,152 per block of all 32 layers; kivi4 (no eviction) 205,258,752
  // bytes per sequence (recommend_pick).
  auto j = recommend_json(k, llama3(dir + "/eval-eviction.json", "1GiB", "1"));
  if (failures) return 1;
  // streaming: measured kept_fraction 0.125 (its spec says 0.5): 512 tokens, 32 blocks: 67,108,864
  // bytes per sequence, 131,072 per token, x 8 = 536,870,912.
  check_pick(j, "streaming:budget=0.5+f16", 131072, "eviction");
  const auto &p = j["pick"];
  check(p["kept_fraction_source"] == "measured" && near(p["kept_fraction"].get<double>(), 0.125), "kept 0.125 measured");
  check(p["tokens_held"] == 512u && p["bytes_total"] == 536870912ull && p["fits"] == true, "streaming total");
  // Largest length at batch 8: 2^27 bytes per sequence = 64 blocks = 1,024 tokens held = 12.5% of
  // 8,192; floor(2^30 / 67,108,864) = 16 sequences.
  check(p["largest_seq_len_that_fits"] == 8192u && p["largest_batch_that_fits"] == 16u, "streaming headroom");
  struct Want { const char *s; const char *source; double kept; std::uint64_t held, blocks, bpt; bool meets; };
  const Want want[] = {
      // held, whole blocks of 16 held, ceil(blocks x 2,097,152 / held) bytes per token
      {"window:budget=0.3+f16", "spec", 0.3, 1229, 77, 131392, true},                  // ceil(0.3 x 4096)
      {"snapkv:budget=0.3:prefill=0.25+f16", "spec", 0.825, 3380, 212, 131538, true},  // 1 - 0.7 x 0.25
      {"pyramidkv:budget=0.3+f16", "measured", 0.65, 2663, 167, 131515, true},         // ceil(0.65 x 4096)
      {"h2o:budget=0.25+f16", "measured", 0.0625, 256, 16, 131072, false}};            // cheapest, +1.5%
  for (const Want &w : want) {
    const auto *r = row_named(j, w.s);
    if (!r) {
      fail(std::string("no row ") + w.s);
      continue;
    }
    check((*r)["kept_fraction_source"] == w.source, std::string(w.s) + ": kept_fraction_source");
    check(near((*r)["kept_fraction"].get<double>(), w.kept), std::string(w.s) + ": kept_fraction");
    check((*r)["tokens_held"] == w.held, std::string(w.s) + ": tokens_held " + (*r)["tokens_held"].dump());
    check((*r)["bytes_per_token"] == w.bpt, std::string(w.s) + ": bytes_per_token " + (*r)["bytes_per_token"].dump());
    check((*r)["bytes_per_sequence"] == w.blocks * 2097152u, std::string(w.s) + ": bytes_per_sequence");
    check((*r)["bytes_total"] == 8 * w.blocks * 2097152u, std::string(w.s) + ": bytes_total");
    check((*r)["meets_floor"] == w.meets, std::string(w.s) + ": meets_floor");
    check((*r)["evicts"] == (w.kept < 1.0), std::string(w.s) + ": evicts");
  }
  const auto *kivi = row_named(j, "kivi4:group=16:residual=32");
  check(kivi && (*kivi)["evicts"] == false && (*kivi)["tokens_held"] == 4096u &&
            (*kivi)["bytes_per_sequence"] == 205258752u && (*kivi)["kept_fraction_source"] == "no eviction",
        "kivi4 row");
  // At a floor of 0.06% only snapkv (+0.05%) and f16 meet it: snapkv holds 212 blocks per
  // sequence, f16 256.
  check_pick(recommend_json(k, llama3(dir + "/eval-eviction.json", "16GiB", "0.06")),
             "snapkv:budget=0.3:prefill=0.25+f16", 131538, "eviction floor 0.06");
  return failures ? 1 : 0;
}

const nlohmann::json *block_option(const nlohmann::json &prefix, std::uint64_t block) {
  for (const auto &o : prefix["block_size_options"]) {
    if (o["block_size"] == block) return &o;
  }
  return nullptr;
}

int recommend_block_size(const std::string &k, const std::string &dir) {
  const std::string basic = dir + "/eval-basic.json";
  // int8 (67,584 B/token at llama-3-8b: recommend_pick) at a 0.1% floor; a 100-token prefix of a
  // 200-token prompt, batch 8. Block 16: 96 tokens reusable (4 lost); 8: 96; 4: all 100. Block
  // tables: ceil(4096 / b) x 32 x 4 bytes per sequence = 32,768 / 65,536 / 131,072. Block 4 shares
  // 7 x 4 x 67,584 = 1,892,352 bytes more for 8 x 98,304 = 786,432 bytes more block tables: net
  // +1,105,920, so lower it to 4.
  auto j = recommend_json(k, llama3(basic, "16GiB", "0.1", {"--prefix-tokens", "100", "--prefix-share", "0.5"}));
  if (failures) return 1;
  const auto &p = j["prefix"];
  check(p["assessed"] == true && p["strategy"] == "int8:per-token", "prefix assessed for int8");
  check(p["prompt_tokens"] == 200u && p["prompt_tokens_assumed"] == false, "prompt = 100 / 0.5 = 200 tokens");
  check(p["reusable_tokens_per_request"] == 96u && p["lost_tokens_per_request"] == 4u, "96 reusable, 4 lost");
  check(p["memory_saved_bytes"] == 7ull * 96 * 67584, "memory saved = 7 x 96 x 67,584");
  check(p["bytes_total_with_sharing"] == 8ull * 4096 * 67584 - 7ull * 96 * 67584, "total with sharing");
  check(near(p["compute_saved_share_per_request"].get<double>(), 0.48), "compute saved 96 / 200");
  check(near(p["compute_saved_share_batch"].get<double>(), 0.42), "compute saved across the batch 7/8 x 0.48");
  check(p["pays"] == true, "prefix caching pays");
  const auto *b4 = block_option(p, 4), *b8 = block_option(p, 8), *b16 = block_option(p, 16);
  if (!b4 || !b8 || !b16) {
    fail("block sizes 16, 8 and 4 expected");
    return 1;
  }
  check((*b16)["block_table_bytes_per_sequence"] == 32768u && (*b4)["block_table_bytes_per_sequence"] == 131072u,
        "block table bytes per sequence");
  check((*b4)["reusable_tokens"] == 100u && (*b8)["reusable_tokens"] == 96u, "reusable at 4 and 8");
  check((*b4)["extra_saved_bytes"] == 1892352 && (*b4)["extra_block_table_bytes"] == 786432 &&
            (*b4)["net_bytes"] == 1105920,
        "block 4: +1,892,352 shared, +786,432 tables");
  check((*b8)["net_bytes"] == -262144, "block 8: net -262,144");
  check(p["recommended_block_size"] == 4u, "lower the block size to 4");
  // A prefix that is a whole number of blocks (96): smaller blocks reuse nothing more: keep 16.
  j = recommend_json(k, llama3(basic, "16GiB", "0.1", {"--prefix-tokens", "96", "--prefix-share", "0.5"}));
  check(j["prefix"]["recommended_block_size"] == 16u && j["prefix"]["lost_tokens_per_request"] == 0u, "96 tokens: keep 16");
  // Batch 1 shares no memory: the 4 extra tokens never pay for the block tables.
  auto one = llama3(basic, "16GiB", "0.1", {"--prefix-tokens", "100", "--prefix-share", "0.5"});
  one[5] = "1";
  j = recommend_json(k, one);
  check(j["prefix"]["memory_saved_bytes"] == 0u && j["prefix"]["recommended_block_size"] == 16u, "batch 1: keep 16");
  // --block-size 32: 96 of 100 at 32, 16 and 8 alike: keep 32.
  j = recommend_json(k, llama3(basic, "16GiB", "0.1", {"--prefix-tokens", "100", "--prefix-share", "0.5", "--block-size", "32"}));
  check(j["prefix"]["block_size"] == 32u && j["prefix"]["recommended_block_size"] == 32u, "block 32: keep");
  // Keys per channel over 16 tokens: the pool stages a group in its residual arena and refuses the
  // prefix cache (as kvc_pool_enable_prefix_cache does), so int8 is assessed, with its own block advice.
  j = recommend_json(k, llama3(basic, "16GiB", "2.5", {"--prefix-tokens", "100", "--prefix-share", "0.5"}));
  check(j["pick"]["strategy"] == "int4:group=32:kchannel=16" && j["pick"]["prefix_cache_ok"] == false &&
            j["prefix"]["strategy"] == "int8:per-token" && j["prefix"]["recommended_block_size"] == 4u,
        "kchannel pick refuses the prefix cache: " + j["prefix"].dump());
  check(j["prefix"]["note"].get<std::string>().find("per-channel groups") != std::string::npos, "the note says why");
  // kivi4 keeps a residual window: no prefix cache; assessed for int8 (the cheapest that can).
  j = recommend_json(k, llama3(basic, "16GiB", "1", {"--prefix-tokens", "100", "--prefix-share", "0.5"}));
  check(j["pick"]["prefix_cache_ok"] == false && j["prefix"]["strategy"] == "int8:per-token", "kivi4 refuses the prefix cache");
  check(j["prefix"].contains("note"), "a note says why another row is assessed");
  // Share only: the prompt is taken as the whole --seq-len: 0.5 x 4096 = 2048 tokens shared.
  j = recommend_json(k, llama3(basic, "16GiB", "0.1", {"--prefix-share", "0.5"}));
  check(j["prefix"]["prefix_tokens"] == 2048u && j["prefix"]["prompt_tokens_assumed"] == true, "share only");
  // No prefix information: not assessed.
  j = recommend_json(k, llama3(basic, "16GiB", "0.1"));
  check(j["prefix"]["assessed"] == false && j["prefix"].contains("how"), "no prefix flags: not assessed");
  return failures ? 1 : 0;
}

int recommend_prefix_report(const std::string &k, const std::string &dir) {
  // eval --prefix measured 32 requests of 256 + 64 tokens: 2,304 of 10,240 tokens computed.
  auto j = recommend_json(k, llama3(dir + "/eval-basic.json", "16GiB", "0.1", {"--from-prefix", dir + "/prefix-report.json"}));
  if (failures) return 1;
  const auto &p = j["prefix"];
  check(p["source"] == "file" && p["prefix_tokens"] == 256u && p["prompt_tokens"] == 320u, "prefix from the report");
  check(near(p["measured"]["compute_saved_share"].get<double>(), 1.0 - 2304.0 / 10240.0), "measured compute saved");
  check(near(p["measured"]["ttft_speedup"].get<double>(), 4.0), "measured TTFT speedup");
  check(p["block_size"] == 16u && p["reusable_tokens_per_request"] == 256u, "256 of 256 reusable in blocks of 16");
  check(p["memory_saved_bytes"] == 7ull * 256 * 67584, "memory saved = 7 x 256 x 67,584");
  check(p["recommended_block_size"] == 16u, "a whole number of blocks: keep 16");
  // With --block-size 48: 240 reusable (16 lost); 24 reuses 240 too; 12 reuses 252 and pays.
  j = recommend_json(k, llama3(dir + "/eval-basic.json", "16GiB", "0.1",
                               {"--from-prefix", dir + "/prefix-report.json", "--block-size", "48"}));
  check(j["prefix"]["reusable_tokens_per_request"] == 240u && j["prefix"]["recommended_block_size"] == 12u,
        "block 48: lower to 12");
  // An eviction pick shares no memory (compaction copies shared blocks) but still skips prefill.
  j = recommend_json(k, llama3(dir + "/eval-eviction.json", "16GiB", "1", {"--from-prefix", dir + "/prefix-report.json"}));
  check(j["prefix"]["strategy"] == "streaming:budget=0.5+f16" && j["prefix"]["memory_saved_bytes"] == 0u &&
            j["prefix"]["pays"] == true,
        "eviction pick: no memory saved, compute saved");
  return failures ? 1 : 0;
}

int recommend_eval_run(const std::string &k) {
  // No --from: a short eval of two strategies on the shared model, then the same choice.
  auto j = recommend_json(k, {"--preset", "llama-3-8b", "--seq-len", "4096", "--batch", "8", "--memory", "16GiB",
                              "--max-ppl-increase", "1", "--eval-tokens", "300", "--strategies", "f16,int8:per-token",
                              "--no-progress"});
  if (failures) return 1;
  std::printf("%s\n", j.dump(2).c_str());
  check(j["measurements"]["source"] == "eval" && j["measurements"]["tokens_scored"] == 300, "an eval run of 300 tokens");
  check(j["rows"].size() == 2 && j["reference"]["strategy"] == "f32", "f32 reference and two rows");
  for (const auto &r : j["rows"]) {
    // Bytes from the pools' layouts at llama-3-8b: f16 2 bytes, int8 1 and an f32 scale per 128 values.
    const std::uint64_t bpt = r["bytes_per_token"];
    check(r["bytes_source"] == "pool layout" && bpt == (r["strategy"] == "f16" ? 131072u : 67584u),
          "bytes per token from the pool layout: " + r.dump());
    check(r["bytes_total"] == 8ull * 4096 * bpt && r["bytes_per_sequence"] == 4096u * bpt,
          "total = 8 x 4096 x bytes per token");
    check(r["meets_floor"] == (r["ppl_delta_pct"].get<double>() <= 1.0), "meets_floor follows ppl_delta_pct");
  }
  if (j["verdict"] == "recommend") {
    for (const auto &r : j["rows"])
      if (r["meets_floor"] == true) check(j["pick"]["bytes_total"] <= r["bytes_total"], "the pick is the smallest that meets");
  }
  return failures ? 1 : 0;
}

int recommend_fixed_cap(const std::string &k, const std::string &dir) {
  // tokens=N is a fixed cap: min(N, seq-len) tokens held at any length, whatever kept_fraction the
  // eval measured at its ctx (4096) and never the default budget 0.3. 16 bits = 131,072 B/token.
  const std::string caps = dir + "/eval-fixed-cap.json";
  auto j = recommend_json(k, {"--preset", "llama-3-8b", "--seq-len", "16384", "--batch", "8", "--memory", "16GiB",
                              "--max-ppl-increase", "1", "--from", caps});
  if (failures) return 1;
  // streaming:tokens=256 (no kept_fraction; not 0.3 x 16384 = 4,916): 8 x 256 x 131,072 = 268,435,456.
  check_pick(j, "streaming:tokens=256+f16", 131072, "fixed cap");
  const auto &p = j["pick"];
  check(p["fixed_cap_tokens"] == 256u && p["tokens_held"] == 256u && p["bytes_total"] == 268435456ull,
        "streaming:tokens=256 holds 256 tokens: " + p.dump());
  check(near(p["kept_fraction"].get<double>(), 256.0 / 16384.0), "kept share at 16384 = 256 / 16384");
  // floor(16 GiB / (256 x 131,072)) = 512 sequences; any length fits at batch 8 (clamped to 2^40).
  check(p["largest_batch_that_fits"] == 512u && p["largest_batch_unbounded"] == false, "fixed cap: batch 512");
  check(p["largest_seq_len_unbounded"] == true && p["largest_seq_len_that_fits"] == (1ull << 40),
        "fixed cap: any seq-len fits");
  // window:tokens=512 measured kept_fraction 0.125 at ctx 4096: 512 tokens held, not 0.125 x 16384 = 2048.
  const auto *w = row_named(j, "window:tokens=512+f16");
  check(w && (*w)["tokens_held"] == 512u && (*w)["bytes_total"] == 8ull * 512 * 131072 && (*w)["fixed_cap_tokens"] == 512u,
        "window:tokens=512 holds 512 tokens");
  const auto *h = row_named(j, "h2o:tokens=100+f16");
  check(h && (*h)["tokens_held"] == 100u && (*h)["meets_floor"] == false, "h2o:tokens=100 holds 100 tokens");
  // Shorter than the cap: every token is held.
  j = recommend_json(k, {"--preset", "llama-3-8b", "--seq-len", "200", "--batch", "8", "--memory", "16GiB",
                         "--max-ppl-increase", "1", "--from", caps});
  w = row_named(j, "window:tokens=512+f16");
  check(w && (*w)["tokens_held"] == 200u && near((*w)["kept_fraction"].get<double>(), 1.0), "seq-len 200 < cap 512");
  // 200 MiB: does not fit; floor(209,715,200 / 33,554,432) = 6 sequences, and at batch 8 a
  // sequence may take 26,214,400 bytes: 12 whole blocks of 16 tokens (2,097,152 bytes for the 32
  // layers): seq-len 192.
  j = recommend_json(k, {"--preset", "llama-3-8b", "--seq-len", "16384", "--batch", "8", "--memory", "200MiB",
                         "--max-ppl-increase", "1", "--from", caps});
  check(j["pick"]["fits"] == false && j["pick"]["largest_batch_that_fits"] == 6u &&
            j["pick"]["largest_seq_len_that_fits"] == 192u && j["pick"]["largest_seq_len_unbounded"] == false,
        "fixed cap in 200 MiB: " + j["pick"].dump());
  const ProcessResult t = run_process({k, "recommend", "--preset", "llama-3-8b", "--seq-len", "16384", "--batch", "8",
                                       "--memory", "16GiB", "--max-ppl-increase", "1", "--from", caps});
  std::printf("%s", t.out.c_str());
  check(t.exited && t.exit_code == 0, "text run must exit 0: " + describe(t));
  for (const char *s : {"a fixed cap of 256 tokens", "256 of 16384 tokens held", "1.6% (cap 256)",
                        "any seq-len at batch 8 (it never holds more than 256 tokens)", "holds the same 256 tokens"})
    check(t.out.find(s) != std::string::npos, std::string("text misses '") + s + "'");
  return failures ? 1 : 0;
}

int recommend_tiny_kept(const std::string &k, const std::string &dir) {
  // kept_fraction 1e-300: at least one token is held, in one f16 block of 16 tokens per layer
  // (2,097,152 bytes for the 32 layers), so 8 x 2,097,152 bytes; floor(16 GiB / 2,097,152) = 8,192
  // sequences; any length (clamped to 2^40, the largest --seq-len) at batch 8.
  auto j = recommend_json(k, llama3(dir + "/eval-tiny-kept.json", "16GiB", "1"));
  if (failures) return 1;
  check_pick(j, "streaming:budget=0.3+f16", 2097152, "tiny kept_fraction");
  const auto &p = j["pick"];
  check(p["tokens_held"] == 1u && p["bytes_total"] == 16777216u, "at least one token held: " + p.dump());
  check(p["largest_batch_that_fits"] == 8192u && p["largest_batch_unbounded"] == false, "batch 8192");
  check(p["largest_seq_len_that_fits"] == (1ull << 40) && p["largest_seq_len_unbounded"] == true, "seq-len clamped");
  const ProcessResult t = run_process({k, "recommend", "--preset", "llama-3-8b", "--seq-len", "4096", "--batch", "8",
                                       "--memory", "16GiB", "--max-ppl-increase", "1", "--from",
                                       dir + "/eval-tiny-kept.json"});
  std::printf("%s", t.out.c_str());
  check(t.exited && t.exit_code == 0, "text run must exit 0: " + describe(t));
  for (const char *s : {"1 of 4096 tokens held per sequence (at least one token is held)", "up to batch 8192 at",
                        "seq-len 1099511627776 or more at batch 8"})
    check(t.out.find(s) != std::string::npos, std::string("text misses '") + s + "'");
  check(t.out.find("batch 0") == std::string::npos && t.out.find("9223372036854775808") == std::string::npos,
        "no batch 0, no seq-len 2^63");
  return failures ? 1 : 0;
}

int recommend_layout_fallback(const std::string &k, const std::string &dir) {
  // At head_dim 12 the library refuses int3 pools (12 x 3 bits is no whole byte), and this build
  // cannot read "future-codec:x": both carry their measured bits over, per token held:
  // ceil(3.5 x 2 x 2 layers x 1 x 12 / 8) = 21 and ceil(2.0 x 48 / 8) = 12 bytes, x 100 tokens.
  // f32 comes from its pool: 100 tokens in 7 blocks of 16: 7 x 16 x 2 x 2 x 12 x 4 = 21,504 bytes.
  const std::vector<std::string> args = {"--layers", "2", "--kv-heads", "1", "--head-dim", "12", "--seq-len", "100",
                                         "--batch", "1", "--memory", "1GiB", "--max-ppl-increase", "1", "--from",
                                         dir + "/eval-layout-fallback.json"};
  auto j = recommend_json(k, args);
  if (failures) return 1;
  const auto *i3 = row_named(j, "int3:group=32:full-range"), *fc = row_named(j, "future-codec:x");
  check(i3 && (*i3)["bytes_source"] == "bits_per_element" && (*i3)["bytes_per_token"] == 21u &&
            (*i3)["bytes_per_sequence"] == 2100u,
        "int3 at head_dim 12 carries its bits over");
  check(fc && (*fc)["bytes_source"] == "bits_per_element" && (*fc)["bytes_per_token"] == 12u &&
            (*fc)["bytes_per_sequence"] == 1200u,
        "an unknown spec carries its bits over");
  check(j["reference"]["bytes_source"] == "pool layout" && j["reference"]["bytes_per_sequence"] == 21504u,
        "f32 from its pool: " + j["reference"].dump());
  std::vector<std::string> cmd = {k, "recommend"};
  cmd.insert(cmd.end(), args.begin(), args.end());
  const ProcessResult t = run_process(cmd);
  std::printf("%s", t.out.c_str());
  check(t.exited && t.exit_code == 0, "text run must exit 0: " + describe(t));
  check(t.out.find("int3:group=32:full-range: ") != std::string::npos &&
            t.out.find("its bits per element carry over") != std::string::npos &&
            t.out.find("future-codec:x: this build does not know its spec") != std::string::npos,
        "the text says which rows carry their bits over, and why");
  // future-codec:x carries 2 bits x 2 x 2^31 elements = 2^30 bytes per token: 10 tokens take
  // 10 GiB; the headroom search asks about 2^40 tokens (2^70 bytes: never fits), which must
  // not fail the run ("the size per sequence exceeds 2^63").
  const std::vector<std::string> huge = {"--layers", "1", "--kv-heads", "2048", "--head-dim", "1048576",
                                         "--seq-len", "10", "--memory", "1e18", "--max-ppl-increase", "5", "--from",
                                         dir + "/eval-layout-fallback.json"};
  auto h = recommend_json(k, huge);
  if (failures) return 1;
  const auto *hf = row_named(h, "future-codec:x");
  check(hf && (*hf)["bytes_source"] == "bits_per_element" && (*hf)["bytes_per_sequence"] == 10 * (1ull << 30) &&
            (*hf)["largest_seq_len_that_fits"] == 1000000000000000000ull / (1ull << 30),
        "a carried row at a huge geometry: " + (hf ? hf->dump() : h.dump()));
  // An odd head_dim: no RoPE can rotate it, but sizes do not need RoPE: f16 comes from its pool
  // (2 layers x 7 blocks of 16 x 7 x 2 x 2 bytes = 6,272), int4 (7 x 4 bits, no whole byte) does not.
  auto odd = recommend_json(k, {"--layers", "2", "--kv-heads", "1", "--head-dim", "7", "--seq-len", "100", "--batch",
                                "1", "--memory", "1GiB", "--max-ppl-increase", "1", "--from", dir + "/eval-basic.json"});
  const auto *f16 = row_named(odd, "f16"), *i4 = row_named(odd, "int4:group=32");
  check(f16 && (*f16)["bytes_source"] == "pool layout" && (*f16)["bytes_per_sequence"] == 6272u,
        "f16 at head_dim 7 from its pool");
  check(i4 && (*i4)["bytes_source"] == "bits_per_element", "int4 at head_dim 7 carries its bits over");
  return failures ? 1 : 0;
}

int recommend_block_advice(const std::string &k, const std::string &dir) {
  const std::string basic = dir + "/eval-basic.json";
  // Batch 1 shares no memory; block 8 reuses 96 of the 100 prefix tokens like 16, block 4 all
  // 100: the advice names block 4 (4 more tokens), never "smaller blocks reuse no more".
  auto one = llama3(basic, "16GiB", "0.1", {"--prefix-tokens", "100", "--prefix-share", "0.5"});
  one[5] = "1";
  auto j = recommend_json(k, one);
  if (failures) return 1;
  std::string v = j["prefix"]["block_size_verdict"];
  check(j["prefix"]["recommended_block_size"] == 16u &&
            v.find("block size 4 would reuse 4 more prefix tokens per request") != std::string::npos &&
            v.find("reuse no more") == std::string::npos,
        "batch 1: " + v);
  // Block size 3: 3 / 2 and 3 / 4 are no block sizes; the codec is not to blame.
  j = recommend_json(k, llama3(basic, "16GiB", "0.1", {"--prefix-tokens", "100", "--prefix-share", "0.5", "--block-size", "3"}));
  v = j["prefix"]["block_size_verdict"];
  check(j["prefix"]["block_size_options"].size() == 1 && v.find("3 / 2 and 3 / 4 are not whole numbers") != std::string::npos &&
            v.find("int8") == std::string::npos,
        "block 3: " + v);
  // Block 24: the kchannel=16 pick refuses the prefix cache (and cannot use 24 either): int8 is assessed,
  // and it takes blocks of 24, 12 and 6.
  j = recommend_json(k, llama3(basic, "16GiB", "2.5", {"--prefix-tokens", "100", "--prefix-share", "0.5", "--block-size", "24"}));
  check(j["pick"]["strategy"] == "int4:group=32:kchannel=16" && j["prefix"]["strategy"] == "int8:per-token" &&
            j["prefix"]["note"].get<std::string>().find("cannot share blocks") != std::string::npos,
        "kchannel pick at block 24: " + j["prefix"].dump());
  for (const auto &o : j["prefix"]["block_size_options"]) check(o["valid"] == true, "int8 takes blocks of 24, 12, 6");
  // The pick, int4:kchannel=16 (8 x 160,858,112 = 1,286,864,896 bytes: recommend_pick), cannot share
  // (its pool refuses the prefix cache), nor can it use blocks of 24; the cheapest row that can,
  // streaming (8 x 77 blocks x 2,097,152 = 1,291,845,632), evicts and saves nothing by sharing. int8
  // with the prefix shared needs less than the pick: 8 x 4096 x 67,584 - 7 x 2000 x 67,584 =
  // 1,268,416,512 at block 16, and - 7 x 1992 x 67,584 = 1,272,201,216 at block 24 (it takes 24).
  // Only rows that can share are ever suggested.
  const std::string codecs = dir + "/eval-prefix-codecs.json";
  auto shared = [&](const std::string &block) {
    return llama3(codecs, "16GiB", "1", {"--prefix-tokens", "2000", "--prefix-share", "0.5", "--block-size", block});
  };
  j = recommend_json(k, shared("16"));
  check(j["pick"]["strategy"] == "int4:group=32:kchannel=16" && j["pick"]["bytes_total"] == 1286864896ull &&
            j["prefix"]["strategy"] == "streaming:budget=0.3+f16" && j["prefix"]["memory_saved_bytes"] == 0u,
        "kchannel pick, streaming assessed: " + j["prefix"].dump());
  check(j["prefix"]["best_with_sharing"] == "int8:per-token", "block 16: " + j["prefix"].dump());
  j = recommend_json(k, shared("24"));
  check(j["prefix"]["best_with_sharing"] == "int8:per-token", "block 24: " + j["prefix"].dump());
  auto text = [&](const std::string &block) {
    std::vector<std::string> cmd = {k, "recommend"};
    for (const std::string &a : shared(block)) cmd.push_back(a);
    const ProcessResult t = run_process(cmd);
    check(t.exited && t.exit_code == 0, "text run must exit 0: " + describe(t));
    return t.out;
  };
  const std::string at16 = text("16"), at24 = text("24");
  std::printf("%s\n%s", at16.c_str(), at24.c_str());
  for (const std::string *t : {&at16, &at24}) {
    check(t->find("with the prefix shared, int8:per-token needs less than the pick: 1.18 GiB (" +
                  std::string(t == &at16 ? "1268416512" : "1272201216") + " bytes)") != std::string::npos,
          "int8 with sharing is suggested");
    check(t->find("kchannel=16 needs less") == std::string::npos && t->find("f32 needs less") == std::string::npos,
          "no row that cannot share (or use the block size) is suggested");
  }
  return failures ? 1 : 0;
}

/// `kvcache recommend ARGS` must fail with exit code 1 and "kvcache: error: ...WANT...".
void expect_error(const std::string &k, const std::vector<std::string> &args, const std::string &want) {
  std::vector<std::string> cmd = {k, "recommend"};
  cmd.insert(cmd.end(), args.begin(), args.end());
  const ProcessResult r = run_process(cmd);
  std::printf("%s: %s", describe(r).c_str(), r.err.c_str());
  check(r.exited && r.exit_code == 1, "expected exit code 1 for '" + want + "', got " + describe(r) + ": " + r.err);
  check(r.err.find("kvcache: error: ") != std::string::npos && r.err.find(want) != std::string::npos,
        "stderr misses '" + want + "': " + r.err);
}

int recommend_errors(const std::string &k, const std::string &dir) {
  const std::string basic = dir + "/eval-basic.json", report = dir + "/prefix-report.json";
  auto target = [&](const std::string &from, std::vector<std::string> more = {}) {
    std::vector<std::string> a = {"--preset", "llama-3-8b", "--seq-len", "4096", "--memory", "16GiB", "--from", from};
    a.insert(a.end(), more.begin(), more.end());
    if (std::find(a.begin(), a.end(), "--max-ppl-increase") == a.end()) {
      a.push_back("--max-ppl-increase");
      a.push_back("1");
    }
    return a;
  };
  // Numbers no double holds, a directory: read errors, not internal ones.
  expect_error(k, target(dir + "/bad-number-overflow.json"), "holds a number out of range");
  expect_error(k, target(dir + "/bad-number-overflow-negative.json"), "number overflow parsing '-1e400'");
  expect_error(k, target(dir + "/bad-integer-overflow.json"), "holds a number out of range");
  expect_error(k, target(dir), "eval report '" + dir + "' is a directory, not a file");
  expect_error(k, target(basic, {"--from-prefix", dir}), "prefix report '" + dir + "' is a directory, not a file");
  // A reference row that is not the reference.
  expect_error(k, target(dir + "/bad-reference-delta.json"), "the reference row has ppl_delta_pct 3 (expected 0");
  expect_error(k, target(dir + "/bad-reference-kl.json"), "the reference row has kl_mean 0.01 (expected 0");
  // Impossible prefix reports.
  expect_error(k, target(basic, {"--from-prefix", dir + "/bad-prefix-more-with-cache.json"}),
               "with_cache.tokens_computed (12000) is more than without_cache.tokens_computed (10240)");
  expect_error(k, target(basic, {"--from-prefix", dir + "/bad-prefix-speedup.json"}), "ttft_speedup -2 must be > 0");
  expect_error(k, target(basic, {"--from-prefix", dir + "/bad-prefix-overflow.json"}),
               "prefix_tokens + suffix_tokens (9223372036854775807 + 64) overflows 64 bits");
  expect_error(k, target(basic, {"--from-prefix", dir + "/bad-prefix-without-cache.json"}),
               "without_cache.tokens_computed (10240) is not requests x (prefix_tokens + suffix_tokens) = 32 x 64");
  // Floors and shares named as typed.
  expect_error(k, target(basic, {"--max-ppl-increase", ""}), "--max-ppl-increase '' is not a number");
  expect_error(k, target(basic, {"--max-ppl-increase", "nan"}), "--max-ppl-increase 'nan' is not a finite number");
  expect_error(k, target(basic, {"--max-ppl-increase", "inf"}), "--max-ppl-increase 'inf' is not a finite number");
  expect_error(k, target(basic, {"--max-ppl-increase", "1e999"}), "--max-ppl-increase '1e999' is out of the range");
  expect_error(k, target(basic, {"--max-ppl-increase", "-1"}), "--max-ppl-increase '-1' must be a finite percentage >= 0");
  expect_error(k, target(basic, {"--prefix-share", "nan"}), "--prefix-share 'nan' is not a finite number");
  expect_error(k, target(basic, {"--prefix-share", ""}), "--prefix-share '' is not a number");
  // --block-size without prefix information has nothing to size.
  expect_error(k, target(basic, {"--block-size", "8"}), "--block-size 8 is used only to assess prefix caching");
  // With prefix information it is accepted (the report's own block size otherwise).
  recommend_json(k, target(basic, {"--from-prefix", report, "--block-size", "8"}));
  return failures ? 1 : 0;
}

int recommend(const std::string &which, const std::string &kvcache, const std::string &dir) {
  if (which == "pick") return recommend_pick(kvcache, dir);
  if (which == "none") return recommend_none(kvcache, dir);
  if (which == "fits") return recommend_fits(kvcache, dir);
  if (which == "eviction") return recommend_eviction(kvcache, dir);
  if (which == "block-size") return recommend_block_size(kvcache, dir);
  if (which == "prefix-report") return recommend_prefix_report(kvcache, dir);
  if (which == "eval-run") return recommend_eval_run(kvcache);
  if (which == "fixed-cap") return recommend_fixed_cap(kvcache, dir);
  if (which == "tiny-kept") return recommend_tiny_kept(kvcache, dir);
  if (which == "layout-fallback") return recommend_layout_fallback(kvcache, dir);
  if (which == "block-advice") return recommend_block_advice(kvcache, dir);
  if (which == "errors") return recommend_errors(kvcache, dir);
  fail("unknown recommend case '" + which + "'");
  return 1;
}

std::vector<std::string> after_dashes(int argc, char **argv, int from) {
  std::vector<std::string> cmd;
  for (int i = from; i < argc; ++i) cmd.emplace_back(argv[i]);
  return cmd;
}

}  // namespace

int main(int argc, char **argv) {
  const std::string mode = argc > 1 ? argv[1] : "";
  try {
    if (mode == "make-bad-files" && argc == 4) return make_bad_files(argv[2], argv[3]);
    if (mode == "expect-fail" && argc > 4 && std::string(argv[3]) == "--")
      return expect_fail(argv[2], after_dashes(argc, argv, 4));
    if (mode == "eval-json" && argc > 3 && std::string(argv[2]) == "--")
      return eval_json(after_dashes(argc, argv, 3));
    if (mode == "memory" && argc == 3) return memory(argv[2]);
    if (mode == "split-kv" && argc == 3) return split_kv(argv[2]);
    if (mode == "plot" && argc == 4) return plot(argv[2], argv[3]);
    if (mode == "prefix" && argc == 3) return prefix(argv[2]);
    if (mode == "prefix-tiers" && (argc == 4 || argc == 5)) return prefix_tiers(argv[2], argv[3], argc == 5 ? argv[4] : "");
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
