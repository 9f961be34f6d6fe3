// SPDX-License-Identifier: Apache-2.0
// Test driver for the kvcache tool (eval_* tests):
//   cli_check make-bad-files REAL_MODEL OUTDIR   writes broken checkpoints/tokenizers
//   cli_check expect-fail REGEX -- CMD ARGS...   CMD must exit non-zero (not by a
//                                               signal) with REGEX in its output
//   cli_check eval-json -- CMD ARGS...           checks an `eval --json` report
//   cli_check memory KVCACHE                     checks `memory` against hand-computed sizes
//   cli_check plot KVCACHE FILE.svg              a short eval writes a plot
#include <sys/stat.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <iterator>
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
                            "top1_agreement", "ms_per_token"}) {
      check(row.contains(key), std::string("result row misses ") + key);
    }
    if (failures) return 1;
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
    if (mode == "plot" && argc == 4) return plot(argv[2], argv[3]);
  } catch (const std::exception &e) {
    fail(e.what());
    return 1;
  }
  std::fprintf(stderr, "usage: see the comment at the top of cli_check.cpp\n");
  return 2;
}
