// SPDX-License-Identifier: Apache-2.0
// `cli_check recommend CASE KVCACHE DATA_DIR` (cli_check.h): `kvcache recommend`
// on the crafted eval reports of tools/tests/data/recommend.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <exception>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "cli_check.h"
#include "process.h"

namespace cli_check {
namespace {

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

std::vector<std::string> llama3(const std::string &from, const std::string &memory,
                                const std::string &floor, std::vector<std::string> more = {}) {
  std::vector<std::string> a = {
      "--preset", "llama-3-8b", "--seq-len",          "4096", "--batch", "8",
      "--memory", memory,       "--max-ppl-increase", floor,  "--from",  from};
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

bool near(double a, double b) {
  return std::fabs(a - b) <= 1e-9 * std::max(1.0, std::fabs(b));
}

void check_pick(const nlohmann::json &j, const std::string &strategy, std::uint64_t bytes_per_token,
                const std::string &what) {
  if (!j.contains("pick") || !j["pick"].is_object()) {
    fail(what + ": no pick");
    return;
  }
  const auto &p = j["pick"];
  check(j["verdict"] == "recommend", what + ": verdict is not recommend");
  check(p["strategy"] == strategy,
        what + ": picked " + p["strategy"].dump() + ", expected " + strategy);
  check(p["bytes_per_token"] == bytes_per_token, what + ": bytes_per_token " +
                                                     p["bytes_per_token"].dump() + ", expected " +
                                                     std::to_string(bytes_per_token));
  check(p["meets_floor"] == true, what + ": the pick does not meet the floor");
}

// Bytes at llama-3-8b (32 layers, 8 KV heads of 128, blocks of 16 tokens) come from the pools'
// layouts there (kvc_pool_seq_bytes), not from the bits measured on stories260K (head_dim 8):
// - kivi4:group=16:residual=32: a block per layer holds int4 codes of K and V (2 x 8,192 bytes),
//   keys' f16 scale and zero point per channel (4,096) and values' per group of 16 (4,096):
//   24,576 bytes; a residual block 16 x 1,024 x 2 x 2 = 65,536 (K and V in f16). On the way to
//   4,096 tokens a sequence holds the most at 4,095: 4,048 encoded (253 blocks) and 47 staged
//   (3 residual blocks): 32 x (253 x 24,576 + 3 x 65,536) = 205,258,752 bytes, 50,112 per token.
// - int4:group=32:kchannel=16: 5 bits for keys (an f16 scale per channel and 16 tokens), 4.5 for
//   values: blocks of 19,456 bytes; at 4,095 tokens 255 blocks and one staging block per layer:
//   32 x (255 x 19,456 + 65,536) = 160,858,112 bytes, 39,272 per token.
// - int8:per-token: 8 bits and an f32 scale per 128 values: 32 x 8 x 132 x 2 = 67,584 bytes per
// token.
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
    check(j["rows"][i - 1]["bytes_total"] <= j["rows"][i]["bytes_total"],
          "rows are not sorted by total memory");
  check(j["reference"]["strategy"] == "f32" && j["reference"]["bytes_per_token"] == 262144u,
        "reference f32: 262144 B/token");
  check(j["measurements"]["source"] == "file" && j["measurements"]["strategies"] == 8,
        "measurements");
  // The floor moves the pick: 2.5% -> int4 with per-channel keys (5 bits), 5% -> int4 (4.5 bits),
  // 0.1% -> int8 (12 bits), 0.0002% (inclusive) -> f16.
  check_pick(recommend_json(k, llama3(basic, "16GiB", "2.5")), "int4:group=32:kchannel=16", 39272,
             "floor 2.5");
  check_pick(recommend_json(k, llama3(basic, "16GiB", "5")), "int4:group=32", 36864, "floor 5");
  check_pick(recommend_json(k, llama3(basic, "16GiB", "0.1")), "int8:per-token", 67584,
             "floor 0.1");
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
  for (const auto &r : j["rows"])
    check(r["meets_floor"] == false, r["strategy"].get<std::string>() + " meets the floor");
  const ProcessResult t = run_process(
      {k, "recommend", "--preset", "llama-3-8b", "--seq-len", "4096", "--batch", "8", "--memory",
       "16GiB", "--max-ppl-increase", "0.0001", "--from", dir + "/eval-basic.json"});
  std::printf("%s", t.out.c_str());
  check(t.exited && t.exit_code == 0, "text run must exit 0: " + describe(t));
  check(t.out.find("no strategy meets the floor") != std::string::npos,
        "text misses 'no strategy meets the floor'");
  check(t.out.find("closest: f16") != std::string::npos, "text misses 'closest: f16'");
  return failures ? 1 : 0;
}

int recommend_fits(const std::string &k, const std::string &dir) {
  const std::string basic = dir + "/eval-basic.json";
  // kivi4 at 4096 tokens x batch 8: 8 x 205,258,752 (above) = 1,642,070,016 bytes = 9.56% of 16
  // GiB.
  auto j = recommend_json(k, llama3(basic, "16GiB", "1"));
  if (failures) return 1;
  const auto &p = j["pick"];
  check(j["target"]["memory_bytes"] == 16 * kGiB && j["target"]["elements_per_token"] == 65536u,
        "target");
  check(p["tokens_held"] == 4096u && p["bytes_total"] == 1642070016ull,
        "kivi4 total != 1,642,070,016");
  check(near(p["budget_share"].get<double>(), 1642070016.0 / (16.0 * kGiB)),
        "budget share != 0.0956");
  check(p["fits"] == true && j["fits"] == true, "must fit in 16 GiB");
  // Headroom: floor(16 GiB / 205,258,752) = 83 sequences. At batch 8 a sequence may take 2 GiB,
  // 67,108,864 bytes per layer: 43,600 tokens hold 2,723 blocks and 32 staged tokens (2 residual
  // blocks; 67,051,520 bytes), 4,095 before them at most 67,092,480 (2,722 blocks, 47 staged); at
  // 43,601 the 33 staged tokens need a third residual block: 67,117,056.
  check(p["largest_batch_that_fits"] == 83u && p["largest_seq_len_that_fits"] == 43600u,
        "headroom in 16 GiB");
  // 1 GiB: does not fit; floor(2^30 / 205,258,752) = 5 sequences. At batch 8, 4,194,304 bytes per
  // layer: 2,640 tokens take 163 x 24,576 + 2 x 65,536 = 4,136,960 (2,639: 162 blocks, 3 residual:
  // 4,177,920); 2,641 take 163 blocks and 3 residual, 4,202,496.
  j = recommend_json(k, llama3(basic, "1GiB", "1"));
  check(j["fits"] == false && j["pick"]["fits"] == false, "must not fit in 1 GiB");
  check(j["pick"]["strategy"] == "kivi4:group=16:residual=32",
        "the pick does not depend on the memory");
  check(j["pick"]["largest_batch_that_fits"] == 5u, "largest batch in 1 GiB != 5");
  check(j["pick"]["largest_seq_len_that_fits"] == 2640u, "largest seq-len in 1 GiB != 2640");
  // 1e9 bytes: 4 sequences; 3,906,250 bytes per layer at batch 8: 2,448 tokens take 151 blocks
  // and 2 residual (3,842,048; 2,447: 150 blocks and 3 residual, 3,883,008); 2,449 take 151 and 3,
  // 3,907,584. Explicit dimensions = the preset.
  j = recommend_json(
      k, {"--layers", "32", "--kv-heads", "8", "--head-dim", "128", "--seq-len", "4096", "--batch",
          "8", "--memory", "1e9", "--max-ppl-increase", "1", "--from", basic});
  check(j["target"]["memory_bytes"] == 1000000000u && j["target"]["model"] == "custom",
        "1e9 / custom geometry");
  check(
      j["pick"]["bytes_total"] == 1642070016ull && j["pick"]["largest_seq_len_that_fits"] == 2448u,
      "1e9 bytes");
  j = recommend_json(k, llama3(basic, "512 MiB", "1"));
  check(j["target"]["memory_bytes"] == 536870912u, "512 MiB");
  // f32 reference: 262,144 B/token x 32,768 tokens = 8 GiB.
  check(j["reference"]["bytes_total"] == 8 * kGiB, "reference total != 8 GiB");
  const ProcessResult t =
      run_process({k, "recommend", "--preset", "llama-3-8b", "--seq-len", "4096", "--batch", "8",
                   "--memory", "1GiB", "--max-ppl-increase", "1", "--from", basic});
  std::printf("%s", t.out.c_str());
  check(t.exited && t.exit_code == 0, "text run must exit 0: " + describe(t));
  // kivi4 keeps its newest tokens in f16 (a window of 32 and a group of 16 being filled): measured
  // at ctx 512.
  for (const char *s :
       {"DOES NOT FIT", "batch 5 at most", "seq-len 2640 at most", "1642070016 bytes",
        "note: its newest tokens (a residual window of 32 tokens and a per-channel group of up to "
        "16 "
        "tokens being filled) wait in f16"})
    check(t.out.find(s) != std::string::npos, std::string("text misses '") + s + "'");
  return failures ? 1 : 0;
}

int recommend_eviction(const std::string &k, const std::string &dir) {
  // Eviction rows at 4096 tokens hold whole f16 blocks of 16 tokens: 16 x 8 x 128 x 2 x 2 = 65,536
  // bytes per block and layer, 2,097,152 per block of all 32 layers; kivi4 (no eviction)
  // 205,258,752 bytes per sequence (recommend_pick).
  auto j = recommend_json(k, llama3(dir + "/eval-eviction.json", "1GiB", "1"));
  if (failures) return 1;
  // streaming: measured kept_fraction 0.125 (its spec says 0.5): 512 tokens, 32 blocks: 67,108,864
  // bytes per sequence, 131,072 per token, x 8 = 536,870,912.
  check_pick(j, "streaming:budget=0.5+f16", 131072, "eviction");
  const auto &p = j["pick"];
  check(p["kept_fraction_source"] == "measured" && near(p["kept_fraction"].get<double>(), 0.125),
        "kept 0.125 measured");
  check(p["tokens_held"] == 512u && p["bytes_total"] == 536870912ull && p["fits"] == true,
        "streaming total");
  // Largest length at batch 8: 2^27 bytes per sequence = 64 blocks = 1,024 tokens held = 12.5% of
  // 8,192; floor(2^30 / 67,108,864) = 16 sequences.
  check(p["largest_seq_len_that_fits"] == 8192u && p["largest_batch_that_fits"] == 16u,
        "streaming headroom");
  struct Want {
    const char *s;
    const char *source;
    double kept;
    std::uint64_t held, blocks, bpt;
    bool meets;
  };
  const Want want[] = {
      // held, whole blocks of 16 held, ceil(blocks x 2,097,152 / held) bytes per token
      {"window:budget=0.3+f16", "spec", 0.3, 1229, 77, 131392, true},  // ceil(0.3 x 4096)
      {"snapkv:budget=0.3:prefill=0.25+f16", "spec", 0.825, 3380, 212, 131538,
       true},                                                                   // 1 - 0.7 x 0.25
      {"pyramidkv:budget=0.3+f16", "measured", 0.65, 2663, 167, 131515, true},  // ceil(0.65 x 4096)
      {"h2o:budget=0.25+f16", "measured", 0.0625, 256, 16, 131072, false}};     // cheapest, +1.5%
  for (const Want &w : want) {
    const auto *r = row_named(j, w.s);
    if (!r) {
      fail(std::string("no row ") + w.s);
      continue;
    }
    check((*r)["kept_fraction_source"] == w.source, std::string(w.s) + ": kept_fraction_source");
    check(near((*r)["kept_fraction"].get<double>(), w.kept), std::string(w.s) + ": kept_fraction");
    check((*r)["tokens_held"] == w.held,
          std::string(w.s) + ": tokens_held " + (*r)["tokens_held"].dump());
    check((*r)["bytes_per_token"] == w.bpt,
          std::string(w.s) + ": bytes_per_token " + (*r)["bytes_per_token"].dump());
    check((*r)["bytes_per_sequence"] == w.blocks * 2097152u,
          std::string(w.s) + ": bytes_per_sequence");
    check((*r)["bytes_total"] == 8 * w.blocks * 2097152u, std::string(w.s) + ": bytes_total");
    check((*r)["meets_floor"] == w.meets, std::string(w.s) + ": meets_floor");
    check((*r)["evicts"] == (w.kept < 1.0), std::string(w.s) + ": evicts");
  }
  const auto *kivi = row_named(j, "kivi4:group=16:residual=32");
  check(kivi && (*kivi)["evicts"] == false && (*kivi)["tokens_held"] == 4096u &&
            (*kivi)["bytes_per_sequence"] == 205258752u &&
            (*kivi)["kept_fraction_source"] == "no eviction",
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
  auto j = recommend_json(
      k, llama3(basic, "16GiB", "0.1", {"--prefix-tokens", "100", "--prefix-share", "0.5"}));
  if (failures) return 1;
  const auto &p = j["prefix"];
  check(p["assessed"] == true && p["strategy"] == "int8:per-token", "prefix assessed for int8");
  check(p["prompt_tokens"] == 200u && p["prompt_tokens_assumed"] == false,
        "prompt = 100 / 0.5 = 200 tokens");
  check(p["reusable_tokens_per_request"] == 96u && p["lost_tokens_per_request"] == 4u,
        "96 reusable, 4 lost");
  check(p["memory_saved_bytes"] == 7ull * 96 * 67584, "memory saved = 7 x 96 x 67,584");
  check(p["bytes_total_with_sharing"] == 8ull * 4096 * 67584 - 7ull * 96 * 67584,
        "total with sharing");
  check(near(p["compute_saved_share_per_request"].get<double>(), 0.48), "compute saved 96 / 200");
  check(near(p["compute_saved_share_batch"].get<double>(), 0.42),
        "compute saved across the batch 7/8 x 0.48");
  check(p["pays"] == true, "prefix caching pays");
  const auto *b4 = block_option(p, 4), *b8 = block_option(p, 8), *b16 = block_option(p, 16);
  if (!b4 || !b8 || !b16) {
    fail("block sizes 16, 8 and 4 expected");
    return 1;
  }
  check((*b16)["block_table_bytes_per_sequence"] == 32768u &&
            (*b4)["block_table_bytes_per_sequence"] == 131072u,
        "block table bytes per sequence");
  check((*b4)["reusable_tokens"] == 100u && (*b8)["reusable_tokens"] == 96u, "reusable at 4 and 8");
  check((*b4)["extra_saved_bytes"] == 1892352 && (*b4)["extra_block_table_bytes"] == 786432 &&
            (*b4)["net_bytes"] == 1105920,
        "block 4: +1,892,352 shared, +786,432 tables");
  check((*b8)["net_bytes"] == -262144, "block 8: net -262,144");
  check(p["recommended_block_size"] == 4u, "lower the block size to 4");
  // A prefix that is a whole number of blocks (96): smaller blocks reuse nothing more: keep 16.
  j = recommend_json(
      k, llama3(basic, "16GiB", "0.1", {"--prefix-tokens", "96", "--prefix-share", "0.5"}));
  check(
      j["prefix"]["recommended_block_size"] == 16u && j["prefix"]["lost_tokens_per_request"] == 0u,
      "96 tokens: keep 16");
  // Batch 1 shares no memory: the 4 extra tokens never pay for the block tables.
  auto one = llama3(basic, "16GiB", "0.1", {"--prefix-tokens", "100", "--prefix-share", "0.5"});
  one[5] = "1";
  j = recommend_json(k, one);
  check(j["prefix"]["memory_saved_bytes"] == 0u && j["prefix"]["recommended_block_size"] == 16u,
        "batch 1: keep 16");
  // --block-size 32: 96 of 100 at 32, 16 and 8 alike: keep 32.
  j = recommend_json(
      k, llama3(basic, "16GiB", "0.1",
                {"--prefix-tokens", "100", "--prefix-share", "0.5", "--block-size", "32"}));
  check(j["prefix"]["block_size"] == 32u && j["prefix"]["recommended_block_size"] == 32u,
        "block 32: keep");
  // Keys per channel over 16 tokens: the pool stages a group in its residual arena and refuses the
  // prefix cache (as kvc_pool_enable_prefix_cache does), so int8 is assessed, with its own block
  // advice.
  j = recommend_json(
      k, llama3(basic, "16GiB", "2.5", {"--prefix-tokens", "100", "--prefix-share", "0.5"}));
  check(j["pick"]["strategy"] == "int4:group=32:kchannel=16" &&
            j["pick"]["prefix_cache_ok"] == false && j["prefix"]["strategy"] == "int8:per-token" &&
            j["prefix"]["recommended_block_size"] == 4u,
        "kchannel pick refuses the prefix cache: " + j["prefix"].dump());
  check(j["prefix"]["note"].get<std::string>().find("per-channel groups") != std::string::npos,
        "the note says why");
  // kivi4 keeps a residual window: no prefix cache; assessed for int8 (the cheapest that can).
  j = recommend_json(
      k, llama3(basic, "16GiB", "1", {"--prefix-tokens", "100", "--prefix-share", "0.5"}));
  check(j["pick"]["prefix_cache_ok"] == false && j["prefix"]["strategy"] == "int8:per-token",
        "kivi4 refuses the prefix cache");
  check(j["prefix"].contains("note"), "a note says why another row is assessed");
  // Share only: the prompt is taken as the whole --seq-len: 0.5 x 4096 = 2048 tokens shared.
  j = recommend_json(k, llama3(basic, "16GiB", "0.1", {"--prefix-share", "0.5"}));
  check(j["prefix"]["prefix_tokens"] == 2048u && j["prefix"]["prompt_tokens_assumed"] == true,
        "share only");
  // No prefix information: not assessed.
  j = recommend_json(k, llama3(basic, "16GiB", "0.1"));
  check(j["prefix"]["assessed"] == false && j["prefix"].contains("how"),
        "no prefix flags: not assessed");
  return failures ? 1 : 0;
}

int recommend_prefix_report(const std::string &k, const std::string &dir) {
  // eval --prefix measured 32 requests of 256 + 64 tokens: 2,304 of 10,240 tokens computed.
  auto j = recommend_json(k, llama3(dir + "/eval-basic.json", "16GiB", "0.1",
                                    {"--from-prefix", dir + "/prefix-report.json"}));
  if (failures) return 1;
  const auto &p = j["prefix"];
  check(p["source"] == "file" && p["prefix_tokens"] == 256u && p["prompt_tokens"] == 320u,
        "prefix from the report");
  check(near(p["measured"]["compute_saved_share"].get<double>(), 1.0 - 2304.0 / 10240.0),
        "measured compute saved");
  check(near(p["measured"]["ttft_speedup"].get<double>(), 4.0), "measured TTFT speedup");
  check(p["block_size"] == 16u && p["reusable_tokens_per_request"] == 256u,
        "256 of 256 reusable in blocks of 16");
  check(p["memory_saved_bytes"] == 7ull * 256 * 67584, "memory saved = 7 x 256 x 67,584");
  check(p["recommended_block_size"] == 16u, "a whole number of blocks: keep 16");
  // With --block-size 48: 240 reusable (16 lost); 24 reuses 240 too; 12 reuses 252 and pays.
  j = recommend_json(k,
                     llama3(dir + "/eval-basic.json", "16GiB", "0.1",
                            {"--from-prefix", dir + "/prefix-report.json", "--block-size", "48"}));
  check(j["prefix"]["reusable_tokens_per_request"] == 240u &&
            j["prefix"]["recommended_block_size"] == 12u,
        "block 48: lower to 12");
  // An eviction pick shares no memory (compaction copies shared blocks) but still skips prefill.
  j = recommend_json(k, llama3(dir + "/eval-eviction.json", "16GiB", "1",
                               {"--from-prefix", dir + "/prefix-report.json"}));
  check(j["prefix"]["strategy"] == "streaming:budget=0.5+f16" &&
            j["prefix"]["memory_saved_bytes"] == 0u && j["prefix"]["pays"] == true,
        "eviction pick: no memory saved, compute saved");
  return failures ? 1 : 0;
}

int recommend_eval_run(const std::string &k) {
  // No --from: a short eval of two strategies on the shared model, then the same choice.
  auto j = recommend_json(k, {"--preset", "llama-3-8b", "--seq-len", "4096", "--batch", "8",
                              "--memory", "16GiB", "--max-ppl-increase", "1", "--eval-tokens",
                              "300", "--strategies", "f16,int8:per-token", "--no-progress"});
  if (failures) return 1;
  std::printf("%s\n", j.dump(2).c_str());
  check(j["measurements"]["source"] == "eval" && j["measurements"]["tokens_scored"] == 300,
        "an eval run of 300 tokens");
  check(j["rows"].size() == 2 && j["reference"]["strategy"] == "f32", "f32 reference and two rows");
  for (const auto &r : j["rows"]) {
    // Bytes from the pools' layouts at llama-3-8b: f16 2 bytes, int8 1 and an f32 scale per 128
    // values.
    const std::uint64_t bpt = r["bytes_per_token"];
    check(r["bytes_source"] == "pool layout" && bpt == (r["strategy"] == "f16" ? 131072u : 67584u),
          "bytes per token from the pool layout: " + r.dump());
    check(r["bytes_total"] == 8ull * 4096 * bpt && r["bytes_per_sequence"] == 4096u * bpt,
          "total = 8 x 4096 x bytes per token");
    check(r["meets_floor"] == (r["ppl_delta_pct"].get<double>() <= 1.0),
          "meets_floor follows ppl_delta_pct");
  }
  if (j["verdict"] == "recommend") {
    for (const auto &r : j["rows"])
      if (r["meets_floor"] == true)
        check(j["pick"]["bytes_total"] <= r["bytes_total"], "the pick is the smallest that meets");
  }
  return failures ? 1 : 0;
}

int recommend_fixed_cap(const std::string &k, const std::string &dir) {
  // tokens=N is a fixed cap: min(N, seq-len) tokens held at any length, whatever kept_fraction the
  // eval measured at its ctx (4096) and never the default budget 0.3. 16 bits = 131,072 B/token.
  const std::string caps = dir + "/eval-fixed-cap.json";
  auto j = recommend_json(k, {"--preset", "llama-3-8b", "--seq-len", "16384", "--batch", "8",
                              "--memory", "16GiB", "--max-ppl-increase", "1", "--from", caps});
  if (failures) return 1;
  // streaming:tokens=256 (no kept_fraction; not 0.3 x 16384 = 4,916): 8 x 256 x 131,072 =
  // 268,435,456.
  check_pick(j, "streaming:tokens=256+f16", 131072, "fixed cap");
  const auto &p = j["pick"];
  check(
      p["fixed_cap_tokens"] == 256u && p["tokens_held"] == 256u && p["bytes_total"] == 268435456ull,
      "streaming:tokens=256 holds 256 tokens: " + p.dump());
  check(near(p["kept_fraction"].get<double>(), 256.0 / 16384.0),
        "kept share at 16384 = 256 / 16384");
  // floor(16 GiB / (256 x 131,072)) = 512 sequences; any length fits at batch 8 (clamped to 2^40).
  check(p["largest_batch_that_fits"] == 512u && p["largest_batch_unbounded"] == false,
        "fixed cap: batch 512");
  check(p["largest_seq_len_unbounded"] == true && p["largest_seq_len_that_fits"] == (1ull << 40),
        "fixed cap: any seq-len fits");
  // window:tokens=512 measured kept_fraction 0.125 at ctx 4096: 512 tokens held, not 0.125 x 16384
  // = 2048.
  const auto *w = row_named(j, "window:tokens=512+f16");
  check(w && (*w)["tokens_held"] == 512u && (*w)["bytes_total"] == 8ull * 512 * 131072 &&
            (*w)["fixed_cap_tokens"] == 512u,
        "window:tokens=512 holds 512 tokens");
  const auto *h = row_named(j, "h2o:tokens=100+f16");
  check(h && (*h)["tokens_held"] == 100u && (*h)["meets_floor"] == false,
        "h2o:tokens=100 holds 100 tokens");
  // Shorter than the cap: every token is held.
  j = recommend_json(k, {"--preset", "llama-3-8b", "--seq-len", "200", "--batch", "8", "--memory",
                         "16GiB", "--max-ppl-increase", "1", "--from", caps});
  w = row_named(j, "window:tokens=512+f16");
  check(w && (*w)["tokens_held"] == 200u && near((*w)["kept_fraction"].get<double>(), 1.0),
        "seq-len 200 < cap 512");
  // 200 MiB: does not fit; floor(209,715,200 / 33,554,432) = 6 sequences, and at batch 8 a
  // sequence may take 26,214,400 bytes: 12 whole blocks of 16 tokens (2,097,152 bytes for the 32
  // layers): seq-len 192.
  j = recommend_json(k, {"--preset", "llama-3-8b", "--seq-len", "16384", "--batch", "8", "--memory",
                         "200MiB", "--max-ppl-increase", "1", "--from", caps});
  check(j["pick"]["fits"] == false && j["pick"]["largest_batch_that_fits"] == 6u &&
            j["pick"]["largest_seq_len_that_fits"] == 192u &&
            j["pick"]["largest_seq_len_unbounded"] == false,
        "fixed cap in 200 MiB: " + j["pick"].dump());
  const ProcessResult t =
      run_process({k, "recommend", "--preset", "llama-3-8b", "--seq-len", "16384", "--batch", "8",
                   "--memory", "16GiB", "--max-ppl-increase", "1", "--from", caps});
  std::printf("%s", t.out.c_str());
  check(t.exited && t.exit_code == 0, "text run must exit 0: " + describe(t));
  for (const char *s : {"a fixed cap of 256 tokens", "256 of 16384 tokens held", "1.6% (cap 256)",
                        "any seq-len at batch 8 (it never holds more than 256 tokens)",
                        "holds the same 256 tokens"})
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
  check(p["tokens_held"] == 1u && p["bytes_total"] == 16777216u,
        "at least one token held: " + p.dump());
  check(p["largest_batch_that_fits"] == 8192u && p["largest_batch_unbounded"] == false,
        "batch 8192");
  check(p["largest_seq_len_that_fits"] == (1ull << 40) && p["largest_seq_len_unbounded"] == true,
        "seq-len clamped");
  const ProcessResult t = run_process(
      {k, "recommend", "--preset", "llama-3-8b", "--seq-len", "4096", "--batch", "8", "--memory",
       "16GiB", "--max-ppl-increase", "1", "--from", dir + "/eval-tiny-kept.json"});
  std::printf("%s", t.out.c_str());
  check(t.exited && t.exit_code == 0, "text run must exit 0: " + describe(t));
  for (const char *s : {"1 of 4096 tokens held per sequence (at least one token is held)",
                        "up to batch 8192 at", "seq-len 1099511627776 or more at batch 8"})
    check(t.out.find(s) != std::string::npos, std::string("text misses '") + s + "'");
  check(t.out.find("batch 0") == std::string::npos &&
            t.out.find("9223372036854775808") == std::string::npos,
        "no batch 0, no seq-len 2^63");
  return failures ? 1 : 0;
}

int recommend_layout_fallback(const std::string &k, const std::string &dir) {
  // At head_dim 12 the library refuses int3 pools (12 x 3 bits is no whole byte), and this build
  // cannot read "future-codec:x": both carry their measured bits over, per token held:
  // ceil(3.5 x 2 x 2 layers x 1 x 12 / 8) = 21 and ceil(2.0 x 48 / 8) = 12 bytes, x 100 tokens.
  // f32 comes from its pool: 100 tokens in 7 blocks of 16: 7 x 16 x 2 x 2 x 12 x 4 = 21,504 bytes.
  const std::vector<std::string> args = {"--layers",
                                         "2",
                                         "--kv-heads",
                                         "1",
                                         "--head-dim",
                                         "12",
                                         "--seq-len",
                                         "100",
                                         "--batch",
                                         "1",
                                         "--memory",
                                         "1GiB",
                                         "--max-ppl-increase",
                                         "1",
                                         "--from",
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
  check(j["reference"]["bytes_source"] == "pool layout" &&
            j["reference"]["bytes_per_sequence"] == 21504u,
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
  const std::vector<std::string> huge = {"--layers",
                                         "1",
                                         "--kv-heads",
                                         "2048",
                                         "--head-dim",
                                         "1048576",
                                         "--seq-len",
                                         "10",
                                         "--memory",
                                         "1e18",
                                         "--max-ppl-increase",
                                         "5",
                                         "--from",
                                         dir + "/eval-layout-fallback.json"};
  auto h = recommend_json(k, huge);
  if (failures) return 1;
  const auto *hf = row_named(h, "future-codec:x");
  check(hf && (*hf)["bytes_source"] == "bits_per_element" &&
            (*hf)["bytes_per_sequence"] == 10 * (1ull << 30) &&
            (*hf)["largest_seq_len_that_fits"] == 1000000000000000000ull / (1ull << 30),
        "a carried row at a huge geometry: " + (hf ? hf->dump() : h.dump()));
  // An odd head_dim: no RoPE can rotate it, but sizes do not need RoPE: f16 comes from its pool
  // (2 layers x 7 blocks of 16 x 7 x 2 x 2 bytes = 6,272), int4 (7 x 4 bits, no whole byte) does
  // not.
  auto odd = recommend_json(
      k, {"--layers", "2", "--kv-heads", "1", "--head-dim", "7", "--seq-len", "100", "--batch", "1",
          "--memory", "1GiB", "--max-ppl-increase", "1", "--from", dir + "/eval-basic.json"});
  const auto *f16 = row_named(odd, "f16"), *i4 = row_named(odd, "int4:group=32");
  check(f16 && (*f16)["bytes_source"] == "pool layout" && (*f16)["bytes_per_sequence"] == 6272u,
        "f16 at head_dim 7 from its pool");
  check(i4 && (*i4)["bytes_source"] == "bits_per_element",
        "int4 at head_dim 7 carries its bits over");
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
            v.find("block size 4 would reuse 4 more prefix tokens per request") !=
                std::string::npos &&
            v.find("reuse no more") == std::string::npos,
        "batch 1: " + v);
  // Block size 3: 3 / 2 and 3 / 4 are no block sizes; the codec is not to blame.
  j = recommend_json(
      k, llama3(basic, "16GiB", "0.1",
                {"--prefix-tokens", "100", "--prefix-share", "0.5", "--block-size", "3"}));
  v = j["prefix"]["block_size_verdict"];
  check(j["prefix"]["block_size_options"].size() == 1 &&
            v.find("3 / 2 and 3 / 4 are not whole numbers") != std::string::npos &&
            v.find("int8") == std::string::npos,
        "block 3: " + v);
  // Block 24: the kchannel=16 pick refuses the prefix cache (and cannot use 24 either): int8 is
  // assessed, and it takes blocks of 24, 12 and 6.
  j = recommend_json(
      k, llama3(basic, "16GiB", "2.5",
                {"--prefix-tokens", "100", "--prefix-share", "0.5", "--block-size", "24"}));
  check(j["pick"]["strategy"] == "int4:group=32:kchannel=16" &&
            j["prefix"]["strategy"] == "int8:per-token" &&
            j["prefix"]["note"].get<std::string>().find("cannot share blocks") != std::string::npos,
        "kchannel pick at block 24: " + j["prefix"].dump());
  for (const auto &o : j["prefix"]["block_size_options"])
    check(o["valid"] == true, "int8 takes blocks of 24, 12, 6");
  // The pick, int4:kchannel=16 (8 x 160,858,112 = 1,286,864,896 bytes: recommend_pick), cannot
  // share (its pool refuses the prefix cache), nor can it use blocks of 24; the cheapest row that
  // can, streaming (8 x 77 blocks x 2,097,152 = 1,291,845,632), evicts and saves nothing by
  // sharing. int8 with the prefix shared needs less than the pick: 8 x 4096 x 67,584 - 7 x 2000 x
  // 67,584 = 1,268,416,512 at block 16, and - 7 x 1992 x 67,584 = 1,272,201,216 at block 24 (it
  // takes 24). Only rows that can share are ever suggested.
  const std::string codecs = dir + "/eval-prefix-codecs.json";
  auto shared = [&](const std::string &block) {
    return llama3(codecs, "16GiB", "1",
                  {"--prefix-tokens", "2000", "--prefix-share", "0.5", "--block-size", block});
  };
  j = recommend_json(k, shared("16"));
  check(j["pick"]["strategy"] == "int4:group=32:kchannel=16" &&
            j["pick"]["bytes_total"] == 1286864896ull &&
            j["prefix"]["strategy"] == "streaming:budget=0.3+f16" &&
            j["prefix"]["memory_saved_bytes"] == 0u,
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
                  std::string(t == &at16 ? "1268416512" : "1272201216") + " bytes)") !=
              std::string::npos,
          "int8 with sharing is suggested");
    check(t->find("kchannel=16 needs less") == std::string::npos &&
              t->find("f32 needs less") == std::string::npos,
          "no row that cannot share (or use the block size) is suggested");
  }
  return failures ? 1 : 0;
}

/// `kvcache recommend ARGS` must fail with exit code 1 and "kvcache: error: ...WANT...".
void expect_error(const std::string &k, const std::vector<std::string> &args,
                  const std::string &want) {
  std::vector<std::string> cmd = {k, "recommend"};
  cmd.insert(cmd.end(), args.begin(), args.end());
  const ProcessResult r = run_process(cmd);
  std::printf("%s: %s", describe(r).c_str(), r.err.c_str());
  check(r.exited && r.exit_code == 1,
        "expected exit code 1 for '" + want + "', got " + describe(r) + ": " + r.err);
  check(
      r.err.find("kvcache: error: ") != std::string::npos && r.err.find(want) != std::string::npos,
      "stderr misses '" + want + "': " + r.err);
}

int recommend_errors(const std::string &k, const std::string &dir) {
  const std::string basic = dir + "/eval-basic.json", report = dir + "/prefix-report.json";
  auto target = [&](const std::string &from, std::vector<std::string> more = {}) {
    std::vector<std::string> a = {"--preset", "llama-3-8b", "--seq-len", "4096",
                                  "--memory", "16GiB",      "--from",    from};
    a.insert(a.end(), more.begin(), more.end());
    if (std::find(a.begin(), a.end(), "--max-ppl-increase") == a.end()) {
      a.push_back("--max-ppl-increase");
      a.push_back("1");
    }
    return a;
  };
  // Numbers no double holds, a directory: read errors, not internal ones.
  expect_error(k, target(dir + "/bad-number-overflow.json"), "holds a number out of range");
  expect_error(k, target(dir + "/bad-number-overflow-negative.json"),
               "number overflow parsing '-1e400'");
  expect_error(k, target(dir + "/bad-integer-overflow.json"), "holds a number out of range");
  expect_error(k, target(dir), "eval report '" + dir + "' is a directory, not a file");
  expect_error(k, target(basic, {"--from-prefix", dir}),
               "prefix report '" + dir + "' is a directory, not a file");
  // A reference row that is not the reference.
  expect_error(k, target(dir + "/bad-reference-delta.json"),
               "the reference row has ppl_delta_pct 3 (expected 0");
  expect_error(k, target(dir + "/bad-reference-kl.json"),
               "the reference row has kl_mean 0.01 (expected 0");
  // Impossible prefix reports.
  expect_error(
      k, target(basic, {"--from-prefix", dir + "/bad-prefix-more-with-cache.json"}),
      "with_cache.tokens_computed (12000) is more than without_cache.tokens_computed (10240)");
  expect_error(k, target(basic, {"--from-prefix", dir + "/bad-prefix-speedup.json"}),
               "ttft_speedup -2 must be > 0");
  expect_error(k, target(basic, {"--from-prefix", dir + "/bad-prefix-overflow.json"}),
               "prefix_tokens + suffix_tokens (9223372036854775807 + 64) overflows 64 bits");
  expect_error(k, target(basic, {"--from-prefix", dir + "/bad-prefix-without-cache.json"}),
               "without_cache.tokens_computed (10240) is not requests x (prefix_tokens + "
               "suffix_tokens) = 32 x 64");
  // Floors and shares named as typed.
  expect_error(k, target(basic, {"--max-ppl-increase", ""}),
               "--max-ppl-increase '' is not a number");
  expect_error(k, target(basic, {"--max-ppl-increase", "nan"}),
               "--max-ppl-increase 'nan' is not a finite number");
  expect_error(k, target(basic, {"--max-ppl-increase", "inf"}),
               "--max-ppl-increase 'inf' is not a finite number");
  expect_error(k, target(basic, {"--max-ppl-increase", "1e999"}),
               "--max-ppl-increase '1e999' is out of the range");
  expect_error(k, target(basic, {"--max-ppl-increase", "-1"}),
               "--max-ppl-increase '-1' must be a finite percentage >= 0");
  expect_error(k, target(basic, {"--prefix-share", "nan"}),
               "--prefix-share 'nan' is not a finite number");
  expect_error(k, target(basic, {"--prefix-share", ""}), "--prefix-share '' is not a number");
  // --block-size without prefix information has nothing to size.
  expect_error(k, target(basic, {"--block-size", "8"}),
               "--block-size 8 is used only to assess prefix caching");
  // With prefix information it is accepted (the report's own block size otherwise).
  recommend_json(k, target(basic, {"--from-prefix", report, "--block-size", "8"}));
  return failures ? 1 : 0;
}

}  // namespace

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

}  // namespace cli_check
