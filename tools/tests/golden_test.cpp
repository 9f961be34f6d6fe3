// SPDX-License-Identifier: Apache-2.0
// golden_* tests: the model runner on the dense f32 kvc_pool (or the plain
// array cache) against llama2.c's reference outputs in <shared>/models/.
//   golden_test tokenizer
//   golden_test greedy   [--array-cache]
//   golden_test logprobs [--array-cache]
//   golden_test cli PATH_TO_KVCACHE
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <memory>
#include <unordered_map>
#include <sstream>
#include <string>
#include <vector>

#include "process.h"
#include "runner/error.h"
#include "runner/kv_cache.h"
#include "runner/model.h"
#include "runner/runner.h"
#include "runner/tokenizer.h"
#include "runner/transformer.h"

using namespace kvc_runner;

namespace {

int failures = 0;

void fail(const std::string &msg) {
  std::fprintf(stderr, "FAIL: %s\n", msg.c_str());
  ++failures;
}

std::string models_dir() {
  return shared_dir() + "/models";
}

struct GoldenRun {
  int steps = 0;
  std::string prompt;
  std::vector<int> token_ids;
  std::string stdout_text;
};

std::vector<GoldenRun> parse_golden_greedy() {
  const std::string text = read_text_file(models_dir() + "/golden-greedy.txt", "golden file");
  std::vector<GoldenRun> runs;
  std::size_t at = 0;
  const std::string run_tag = "=== RUN n=", begin_tag = "----- BEGIN STDOUT -----\n",
                    end_tag = "----- END STDOUT -----";
  while ((at = text.find(run_tag, at)) != std::string::npos) {
    GoldenRun r;
    const std::size_t eol = text.find('\n', at);
    const std::string header = text.substr(at, eol - at);  // === RUN n=128 prompt="..."
    r.steps = std::stoi(header.substr(run_tag.size()));
    const std::size_t q1 = header.find("prompt=\"");
    const std::size_t q2 = header.rfind('"');
    if (q1 == std::string::npos || q2 <= q1 + 8)
      throw RunnerError("golden file: bad RUN line: " + header);
    r.prompt = header.substr(q1 + 8, q2 - (q1 + 8));
    const std::size_t bytes_at = text.find("stdout_bytes: ", eol);
    const std::size_t expected_bytes = std::stoul(text.substr(bytes_at + 14));
    const std::size_t ids_at = text.find("token_ids (", eol);
    const std::size_t ids_colon = text.find("):", ids_at);
    const std::size_t ids_count = std::stoul(text.substr(ids_at + 11));
    std::istringstream ids(text.substr(ids_colon + 2, text.find('\n', ids_colon) - ids_colon - 2));
    for (int id; ids >> id;) r.token_ids.push_back(id);
    if (r.token_ids.size() != ids_count) throw RunnerError("golden file: token id count mismatch");
    const std::size_t b = text.find(begin_tag, ids_at);
    const std::size_t e = text.find(end_tag, b);
    r.stdout_text = text.substr(b + begin_tag.size(), e - b - begin_tag.size());
    if (r.stdout_text.size() != expected_bytes) {
      throw RunnerError("golden file: stdout block has " + std::to_string(r.stdout_text.size()) +
                        " bytes, header says " + std::to_string(expected_bytes));
    }
    runs.push_back(r);
    at = e;
  }
  if (runs.size() != 4)
    throw RunnerError("golden file: expected 4 runs, found " + std::to_string(runs.size()));
  return runs;
}

std::string join_ids(const std::vector<int> &v) {
  std::string s;
  for (int t : v) {
    if (!s.empty()) s += ' ';
    s += std::to_string(t);
  }
  return s;
}

/// The merge loop written the slow, obvious way (rescan every pair after each
/// merge, best score wins, leftmost on ties), to check the fast encoder.
std::vector<int> slow_merge(const Tokenizer &tok, std::vector<int> ids) {
  std::unordered_map<std::string, int> index;
  for (int i = tok.vocab_size() - 1; i >= 0; --i) index[tok.piece(i)] = i;
  for (;;) {
    int best_at = -1, best_id = -1;
    float best_score = -1e10f;
    for (std::size_t k = 0; k + 1 < ids.size(); ++k) {
      auto it = index.find(tok.piece(ids[k]) + tok.piece(ids[k + 1]));
      if (it != index.end() && tok.score(it->second) > best_score) {
        best_score = tok.score(it->second);
        best_id = it->second;
        best_at = static_cast<int>(k);
      }
    }
    if (best_at < 0) return ids;
    ids[best_at] = best_id;
    ids.erase(ids.begin() + best_at + 1);
  }
}

void test_tokenizer() {
  const Model model = Model::load(models_dir() + "/stories260K.bin");
  const Tokenizer tok = Tokenizer::load(models_dir() + "/tok512.bin", model.config().vocab_size);
  struct Case {
    const char *text;
    std::vector<int> ids;
  };
  const Case cases[] = {
      {"the quick brown fox", {1, 265, 410, 456, 425, 417, 340, 268, 420, 327, 416, 272, 414, 444}},
      {"Once upon a time", {1, 403, 407, 261, 378}},
      {"Lily and Tom", {1, 317, 269, 274, 287}},
  };
  for (const Case &c : cases) {
    const std::vector<int> got = tok.encode(c.text, true, false);
    if (got != c.ids)
      fail(std::string("encode(\"") + c.text + "\") = " + join_ids(got) + ", want " +
           join_ids(c.ids));
  }
  // Byte fallback: "\n" is <0x0A> = 13; a character outside the vocabulary becomes its UTF-8 bytes.
  const std::vector<int> nl = tok.encode("a\nb", false, false);
  bool has_13 = false;
  for (int t : nl) has_13 = has_13 || t == 13;
  if (!has_13) fail("encode(\"a\\nb\") has no <0x0A> (13): " + join_ids(nl));
  // The fast merge equals the slow rescan on real text, paragraph by paragraph.
  std::unordered_map<std::string, int> index;
  for (int i = tok.vocab_size() - 1; i >= 0; --i) index[tok.piece(i)] = i;
  for (const char *file : {"/data/tinystories-valid-sample.txt", "/data/out-of-domain.txt"}) {
    const std::string sample = read_text_file(shared_dir() + file, "text file");
    std::size_t start = 0;
    for (int block = 0; block < 150 && start < sample.size(); ++block) {
      std::size_t end = sample.find("\n\n", start);
      if (end == std::string::npos) end = sample.size();
      const std::string text = sample.substr(start, end + 2 - start);
      start = end + 2;
      // Unmerged ids built independently: BOS, the dummy-prefix space, then
      // each UTF-8 code point's piece or its bytes as <0xNN> (3 + byte).
      const std::vector<int> fast = tok.encode(text, true, false);
      std::vector<int> units = {kBosToken, index.at(" ")};
      for (std::size_t i = 0; i < text.size();) {
        std::size_t j = i + 1;
        while (j < text.size() && j - i < 4 && (static_cast<unsigned char>(text[j]) & 0xC0) == 0x80)
          ++j;
        auto it = index.find(text.substr(i, j - i));
        if (it != index.end()) {
          units.push_back(it->second);
        } else {
          for (std::size_t b = i; b < j; ++b)
            units.push_back(3 + static_cast<unsigned char>(text[b]));
        }
        i = j;
      }
      const std::vector<int> slow = slow_merge(tok, units);
      if (slow != fast) {
        fail(std::string("fast and slow BPE merges differ on block ") + std::to_string(block) +
             " of " + file);
        break;
      }
    }
  }
  if (tok.decode(5, 13) != "\n") fail("decode(13) is not a newline");
  if (tok.decode(kBosToken, 403) != "Once") fail("decode after BOS keeps the leading space");
}

void test_greedy(bool array_cache) {
  const Model model = Model::load(models_dir() + "/stories260K.bin");
  const Tokenizer tok = Tokenizer::load(models_dir() + "/tok512.bin", model.config().vocab_size);
  for (const GoldenRun &run : parse_golden_greedy()) {
    GenerateOptions opt;
    opt.prompt = run.prompt;
    opt.steps = run.steps;
    opt.temperature = 0.0f;
    opt.use_pool = !array_cache;
    const GenerateResult r = generate(model, tok, opt);
    const std::string name = "n=" + std::to_string(run.steps) + " prompt=\"" + run.prompt + "\"";
    if (r.tokens != run.token_ids) {
      std::size_t i = 0;
      while (i < r.tokens.size() && i < run.token_ids.size() && r.tokens[i] == run.token_ids[i])
        ++i;
      fail(name + ": token ids differ from index " + std::to_string(i) + " (got " +
           std::to_string(r.tokens.size()) + " ids, want " + std::to_string(run.token_ids.size()) +
           ")");
    } else if (r.text != run.stdout_text) {
      fail(name + ": decoded text differs");
    } else {
      std::printf("ok   %s: %zu token ids and %zu bytes of text identical%s\n", name.c_str(),
                  r.tokens.size(), r.text.size(),
                  static_cast<int>(r.tokens.size()) < run.steps + 1 ? " (stopped at BOS)" : "");
    }
  }
}

void test_logprobs(bool array_cache, bool library_attention = false) {
  const Model model = Model::load(models_dir() + "/stories260K.bin");
  const ModelConfig &c = model.config();
  const Tokenizer tok = Tokenizer::load(models_dir() + "/tok512.bin", c.vocab_size);
  // The first 9 blocks of the sample, split on "\n\n" (see models/README.md).
  const std::string sample =
      read_text_file(shared_dir() + "/data/tinystories-valid-sample.txt", "text file");
  std::size_t end = 0;
  for (int block = 0; block < 9; ++block) {
    end = sample.find("\n\n", end == 0 ? 0 : end + 2);
    if (end == std::string::npos) throw RunnerError("sample has fewer than 9 blocks");
  }
  const std::string text = sample.substr(0, end);
  const std::vector<int> tokens = tok.encode(text, true, false);
  std::printf("text: %zu bytes, BOS + %zu tokens\n", text.size(), tokens.size() - 1);
  if (text.size() != 2063)
    fail("golden text should be 2,063 bytes, is " + std::to_string(text.size()));

  struct Row {
    int window, position, token;
    double logprob;
  };
  std::vector<Row> rows;
  {
    std::ifstream in(models_dir() + "/golden-logprobs.tsv");
    std::string line;
    std::getline(in, line);  // header
    Row r;
    while (in >> r.window >> r.position >> r.token >> r.logprob) rows.push_back(r);
  }
  if (rows.size() != 1022)
    fail("golden-logprobs.tsv: expected 1022 rows, got " + std::to_string(rows.size()));

  Transformer transformer(model);
  std::vector<double> logp;
  double max_diff = 0.0, nll = 0.0;
  std::size_t next = 0;
  const int window_len = c.seq_len;  // 512
  std::unique_ptr<KvPool> pool;
  if (!array_cache) pool = std::make_unique<KvPool>(c, KVC_DTYPE_F32, KVC_DTYPE_F32, window_len);
  for (int w = 0; w < 2; ++w) {
    std::unique_ptr<ArrayCache> array;
    std::unique_ptr<PoolSequence> seq;
    std::unique_ptr<AttnSequence> attn;
    if (array_cache)
      array = std::make_unique<ArrayCache>(c);
    else if (library_attention)
      attn = std::make_unique<AttnSequence>(*pool, static_cast<std::uint64_t>(w), c);
    else
      seq = std::make_unique<PoolSequence>(*pool, static_cast<std::uint64_t>(w), c.n_layers);
    for (int p = 0; p < window_len - 1; ++p) {
      const int token = p == 0 ? kBosToken : tokens[1 + (window_len - 1) * w + p - 1];
      const float *logits = array_cache         ? transformer.forward(*array, token, p)
                            : library_attention ? transformer.forward(*attn, token, p)
                                                : transformer.forward(*seq, token, p);
      log_softmax(logits, c.vocab_size, logp);
      const int target = tokens[1 + (window_len - 1) * w + p];
      if (next >= rows.size()) break;
      const Row &row = rows[next++];
      if (row.window != w || row.position != p + 1 || row.token != target) {
        fail("row " + std::to_string(next) + ": expected (" + std::to_string(row.window) + ", " +
             std::to_string(row.position) + ", " + std::to_string(row.token) + "), computed (" +
             std::to_string(w) + ", " + std::to_string(p + 1) + ", " + std::to_string(target) +
             ")");
        return;
      }
      const double diff = std::fabs(logp[target] - row.logprob);
      max_diff = std::max(max_diff, diff);
      if (diff > 1e-4) {
        fail("window " + std::to_string(w) + " position " + std::to_string(p + 1) + ": logprob " +
             std::to_string(logp[target]) + ", golden " + std::to_string(row.logprob));
      }
      nll -= logp[target];
    }
  }
  const double ppl = std::exp(nll / double(rows.size()));
  std::printf("%zu log-probabilities, max |diff| %.3g; perplexity %.6f (golden 4.139753)\n",
              rows.size(), max_diff, ppl);
  if (std::fabs(ppl - 4.139753) > 1e-5) fail("perplexity " + std::to_string(ppl) + " != 4.139753");
}

// A request whose prompt shares a cached prefix gives exactly the log-
// probabilities of the same request run cold (f32 storage, library attention).
void test_prefix_reuse() {
  const Model model = Model::load(models_dir() + "/stories260K.bin");
  const ModelConfig &c = model.config();
  const Tokenizer tok = Tokenizer::load(models_dir() + "/tok512.bin", c.vocab_size);
  const std::string sample =
      read_text_file(shared_dir() + "/data/tinystories-valid-sample.txt", "text file");
  const std::vector<int> all = tok.encode(sample, true, false);
  if (all.size() < 600) throw RunnerError("sample too short");
  // Request 1: 150 tokens. Request 2: the same first 128, then other text.
  std::vector<int> r1(all.begin(), all.begin() + 150), r2(all.begin(), all.begin() + 128);
  r2.insert(r2.end(), all.begin() + 400, all.begin() + 440);
  Transformer transformer(model);
  PoolSettings warm_settings;
  warm_settings.k_dtype = warm_settings.v_dtype = KVC_DTYPE_F32;
  warm_settings.prefix_cache = true;
  KvPool warm(c, warm_settings, 512, 4);
  {
    AttnSequence s1(warm, 1, c);
    for (int p = 0; p < static_cast<int>(r1.size()); ++p) transformer.forward(s1, r1[p], p);
    s1.register_prefix(r1);
  }  // freed: its blocks stay cached
  std::vector<std::vector<float>> warm_logits, cold_logits;
  int cached = 0;
  {
    AttnSequence s2(warm, 2, c, r2);
    cached = s2.cached_tokens();
    for (int p = cached; p < static_cast<int>(r2.size()); ++p) {
      const float *l = transformer.forward(s2, r2[p], p);
      warm_logits.emplace_back(l, l + c.vocab_size);
    }
  }
  PoolSettings cold_settings;
  cold_settings.k_dtype = cold_settings.v_dtype = KVC_DTYPE_F32;
  KvPool cold(c, cold_settings, 512, 1);
  {
    AttnSequence s3(cold, 3, c);
    for (int p = 0; p < static_cast<int>(r2.size()); ++p) {
      const float *l = transformer.forward(s3, r2[p], p);
      if (p >= cached) cold_logits.emplace_back(l, l + c.vocab_size);
    }
  }
  std::printf("prefix reuse: %d of %zu prompt tokens from the cache\n", cached, r2.size());
  if (cached != 128)
    fail("expected 128 cached tokens (8 blocks of 16), got " + std::to_string(cached));
  if (warm_logits.size() != cold_logits.size()) fail("different numbers of computed positions");
  for (size_t i = 0; i < warm_logits.size() && i < cold_logits.size(); ++i)
    if (std::memcmp(warm_logits[i].data(), cold_logits[i].data(),
                    warm_logits[i].size() * sizeof(float)) != 0) {
      fail("position " + std::to_string(cached + static_cast<int>(i)) +
           ": warm and cold logits differ");
      break;
    }
}

void test_cli(const std::string &kvcache) {
  for (const GoldenRun &run : parse_golden_greedy()) {
    const ProcessResult r = run_process({kvcache, "generate", "--model", "stories260k", "-t", "0",
                                         "-n", std::to_string(run.steps), "-i", run.prompt});
    const std::string name =
        "kvcache generate -n " + std::to_string(run.steps) + " -i \"" + run.prompt + "\"";
    if (!r.exited || r.exit_code != 0) {
      fail(name + ": did not exit 0: " + r.err);
    } else if (r.out != run.stdout_text) {
      fail(name + ": stdout differs from run.c's (" + std::to_string(r.out.size()) + " vs " +
           std::to_string(run.stdout_text.size()) + " bytes)");
    } else {
      std::printf("ok   %s: stdout identical (%zu bytes)\n", name.c_str(), r.out.size());
    }
  }
}

}  // namespace

int main(int argc, char **argv) {
  if (argc < 2) {
    std::fprintf(stderr,
                 "usage: %s tokenizer | greedy [--array-cache] | logprobs [--array-cache | "
                 "--library-attention] | cli KVCACHE\n",
                 argv[0]);
    return 2;
  }
  const std::string mode = argv[1];
  const bool array_cache = argc > 2 && std::string(argv[2]) == "--array-cache";
  try {
    if (mode == "tokenizer")
      test_tokenizer();
    else if (mode == "greedy")
      test_greedy(array_cache);
    else if (mode == "logprobs")
      test_logprobs(array_cache, argc > 2 && std::string(argv[2]) == "--library-attention");
    else if (mode == "cli" && argc > 2)
      test_cli(argv[2]);
    else if (mode == "prefix")
      test_prefix_reuse();
    else {
      std::fprintf(stderr, "unknown mode %s\n", mode.c_str());
      return 2;
    }
  } catch (const std::exception &e) {
    fail(e.what());
  }
  if (failures) {
    std::fprintf(stderr, "%d failure(s)\n", failures);
    return 1;
  }
  std::printf("PASS\n");
  return 0;
}
