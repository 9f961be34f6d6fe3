// SPDX-License-Identifier: Apache-2.0
// Tests of the GGUF model path of the runner (gguf_*, smollm2_*, llamacpp_kv_matches_runner):
// MODEL.gguf may be the known name "smollm2" (scripts/fetch-models.sh's cache).
//   gguf_test bad-files MODEL.gguf DIR       malformed and truncated GGUF files give a clear
//                                            RunnerError, never a crash
//   gguf_test load MODEL.gguf                 SmolLM2-135M's geometry, tensors and tied classifier
//   gguf_test tokenize MODEL.gguf FIXTURES    our BPE ids equal llama.cpp's on both texts
//   gguf_test logprobs MODEL.gguf FIXTURES    our forward pass (f16 K/V) against llama.cpp's
//                                            log-probabilities over 2,048 tokens
//   gguf_test chunk MODEL.gguf                chunked forward passes agree with token-by-token ones
//   gguf_test llama-state MODEL.gguf FIXTURES llama.cpp's sequence state blob of 8 tokens
//                                            (kvc_seq_import_llama) against our forward's K/V
// The shared text comes from <shared>/data (KVCACHE_SHARED_DIR).
#include <openssl/evp.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <iterator>
#include <sstream>
#include <string>
#include <vector>

#include "runner/blas.h"
#include "runner/error.h"
#include "runner/gguf.h"
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

void check(bool ok, const std::string &msg) {
  if (!ok) fail(msg);
}

std::vector<std::uint8_t> read_bytes(const std::string &path, std::size_t max = SIZE_MAX) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw RunnerError("cannot open " + path);
  std::vector<std::uint8_t> b((std::istreambuf_iterator<char>(in)),
                              std::istreambuf_iterator<char>());
  if (b.size() > max) b.resize(max);
  return b;
}

void write_bytes(const std::string &path, const std::vector<std::uint8_t> &b) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(reinterpret_cast<const char *>(b.data()), static_cast<std::streamsize>(b.size()));
  if (!out) throw RunnerError("cannot write " + path);
}

/// `what` must fail with a RunnerError whose message contains `expect`.
template <class F>
void expect_error(const std::string &name, const std::string &expect, F &&what) {
  try {
    what();
    fail(name + ": accepted, expected an error containing '" + expect + "'");
  } catch (const RunnerError &e) {
    const std::string msg = e.what();
    if (msg.find(expect) == std::string::npos)
      fail(name + ": message '" + msg + "' lacks '" + expect + "'");
    else
      std::printf("%-34s -> %s\n", name.c_str(), msg.c_str());
  }
}

void put_u32(std::vector<std::uint8_t> &b, std::size_t at, std::uint32_t v) {
  std::memcpy(&b[at], &v, 4);
}
void put_u64(std::vector<std::uint8_t> &b, std::size_t at, std::uint64_t v) {
  std::memcpy(&b[at], &v, 8);
}

int bad_files(const std::string &model, const std::string &dir) {
  // The header, metadata and tensor infos of SmolLM2's file fit in its first 2 MB.
  const std::vector<std::uint8_t> head = read_bytes(model, 2u << 20);
  const GgufFile good = GgufFile::load(model);
  auto parse = [](std::vector<std::uint8_t> b) {
    return [b]() mutable { GgufFile::parse(std::move(b), "crafted"); };
  };
  {
    auto b = head;
    b[0] = 'X';
    expect_error("bad magic", "not a GGUF file", parse(b));
  }
  {
    auto b = head;
    put_u32(b, 4, 4);
    expect_error("version 4", "GGUF version 4 is not supported", parse(b));
  }
  {
    auto b = head;
    put_u64(b, 8, 1ull << 40);
    expect_error("huge tensor count", "tensor count", parse(b));
  }
  {
    auto b = head;
    put_u64(b, 16, 1ull << 40);
    expect_error("huge metadata count", "metadata count", parse(b));
  }
  {
    auto b = head;
    put_u64(b, 24, 1ull << 50);  // the first key's length
    expect_error("huge key length", "implausible", parse(b));
  }
  {
    auto b = head;
    put_u32(b, 24 + 8 + std::strlen("general.architecture"), 99);  // its value type
    expect_error("unknown value type", "unknown value type 99", parse(b));
  }
  // Cuts of the header region fail cleanly (cut points denser near the start, where the structure
  // is).
  int cuts = 0;
  for (std::size_t cut = 0; cut < 1785664; cut += 1 + cut / 16 + (cut * 7919) % 97) {
    std::vector<std::uint8_t> b(head.begin(), head.begin() + static_cast<std::ptrdiff_t>(cut));
    try {
      GgufFile::parse(std::move(b), "cut");
      fail("a file cut at byte " + std::to_string(cut) + " was accepted");
    } catch (const RunnerError &e) {
      if (std::string(e.what()).find("truncated") == std::string::npos &&
          std::string(e.what()).find("not a GGUF") == std::string::npos)
        fail("cut at " + std::to_string(cut) + ": unexpected message " + e.what());
    }
    ++cuts;
  }
  std::printf("%d cuts of the header region: all refused as truncated\n", cuts);
  // The whole header but not all the data: a tensor runs past the end.
  expect_error("data section cut", "runs past the end of the file", parse(head));
  // A file on disk: the loader names it, a tensor shape that contradicts the metadata is refused.
  write_bytes(dir + "/cut.gguf", head);
  expect_error("load a cut file", "runs past the end", [&] { Model::load(dir + "/cut.gguf"); });
  check(good.tensors().size() == 272, "SmolLM2 has 272 tensors");
  // Flip one tensor's type to an unsupported one (q5_k = 13).
  {
    auto b = head;
    // Find the type field of the first tensor info: after its name "token_embd.weight", n_dims,
    // dims.
    const std::string name = "token_embd.weight";
    std::size_t at = std::string(b.begin(), b.end()).find(name);
    check(at != std::string::npos, "tensor name found");
    at += name.size() + 4 + 2 * 8;
    put_u32(b, at, 13);
    expect_error("unsupported tensor type", "ggml type 13 is not supported", parse(b));
  }
  return failures ? 1 : 0;
}

int load(const std::string &path) {
  const Model m = Model::load(path);
  const ModelConfig &c = m.config();
  std::printf(
      "dim %d hidden %d layers %d heads %d/%d head_dim %d vocab %d ctx %d theta %g eps %g\n", c.dim,
      c.hidden_dim, c.n_layers, c.n_heads, c.n_kv_heads, c.head_dim(), c.vocab_size, c.seq_len,
      c.rope_theta, c.norm_eps);
  check(c.gguf && c.dim == 576 && c.hidden_dim == 1536 && c.n_layers == 30 && c.n_heads == 9 &&
            c.n_kv_heads == 3 && c.head_dim() == 64 && c.vocab_size == 49152 && c.seq_len == 8192,
        "SmolLM2-135M geometry");
  check(c.rope_theta == 100000.0f && std::fabs(c.norm_eps - 1e-5f) < 1e-9f,
        "rope base 100000, eps 1e-5");
  check(c.shared_classifier && m.weights().classifier == m.weights().token_embedding,
        "tied classifier");
  check(!c.add_bos && c.bos_token == 1, "no BOS added; bos id 1");
  // Spot values: the embedding row of token 0 is finite and not all zero; norms near 1.
  double sum = 0;
  for (int i = 0; i < c.dim; ++i) sum += std::fabs(m.weights().token_embedding[i]);
  check(std::isfinite(sum) && sum > 0, "embedding row 0");
  return failures ? 1 : 0;
}

std::string sha256_ids(const std::vector<int> &ids) {
  std::vector<std::uint8_t> bytes(ids.size() * 4);
  for (std::size_t i = 0; i < ids.size(); ++i) {
    const std::uint32_t v = static_cast<std::uint32_t>(ids[i]);
    for (int k = 0; k < 4; ++k) bytes[4 * i + k] = static_cast<std::uint8_t>(v >> (8 * k));
  }
  unsigned char md[32];
  unsigned int len = 0;
  EVP_Digest(bytes.data(), bytes.size(), md, &len, EVP_sha256(), nullptr);
  static const char *hex = "0123456789abcdef";
  std::string s;
  for (unsigned i = 0; i < len; ++i) {
    s += hex[md[i] >> 4];
    s += hex[md[i] & 15];
  }
  return s;
}

int tokenize(const std::string &model, const std::string &fixtures) {
  const Model m = Model::load(model);
  const Tokenizer tok = Tokenizer::load(model, m.config().vocab_size);
  for (const char *name : {"tinystories-valid-sample", "out-of-domain"}) {
    std::ifstream in(fixtures + "/tokens-" + name + ".txt");
    if (!in) throw RunnerError(std::string("missing fixture tokens-") + name + ".txt");
    std::string line, digest;
    std::size_t count = 0;
    std::vector<int> head;
    while (std::getline(in, line)) {
      if (line.empty() || line[0] == '#') continue;
      std::istringstream ls(line);
      if (line.rfind("count ", 0) == 0)
        ls.ignore(6) >> count;
      else if (line.rfind("sha256 ", 0) == 0)
        ls.ignore(7) >> digest;
      else
        for (int id; ls >> id;) head.push_back(id);
    }
    const std::string text = read_text_file(shared_dir() + "/data/" + name + ".txt", "text file");
    const std::vector<int> ids = tok.encode(text, false, false);
    std::size_t first_diff = 0;
    while (first_diff < head.size() && first_diff < ids.size() &&
           ids[first_diff] == head[first_diff])
      ++first_diff;
    std::printf("%s: %zu ids (llama.cpp %zu); first %zu of llama.cpp's head agree\n", name,
                ids.size(), count, first_diff);
    if (first_diff < head.size() && first_diff < ids.size()) {
      std::string ours, theirs;
      for (std::size_t k = first_diff; k < first_diff + 8 && k < ids.size() && k < head.size();
           ++k) {
        for (auto [out, id] : {std::pair<std::string *, int>{&ours, ids[k]}, {&theirs, head[k]}}) {
          out->append(" ")
              .append(std::to_string(id))
              .append("'")
              .append(tok.decode(0, id))
              .append("'");
        }
      }
      fail(std::string(name) + ": first difference at id " + std::to_string(first_diff) + ": ours" +
           ours + " | llama.cpp" + theirs);
    }
    check(ids.size() == count, std::string(name) + ": token count differs from llama.cpp's");
    check(sha256_ids(ids) == digest,
          std::string(name) + ": SHA-256 of the ids differs from llama.cpp's");
  }
  return failures ? 1 : 0;
}

int logprobs(const std::string &model, const std::string &fixtures) {
  const Model m = Model::load(model);
  const ModelConfig &c = m.config();
  const Tokenizer tok = Tokenizer::load(model, c.vocab_size);
  const std::string text =
      read_text_file(shared_dir() + "/data/tinystories-valid-sample.txt", "text file");
  std::vector<int> ids = tok.encode(text, false, false);
  const int n = 2048;
  if (static_cast<int>(ids.size()) < n) throw RunnerError("text too short");
  ids.resize(n);
  std::ifstream in(fixtures + "/logprobs-2048.tsv");
  if (!in) throw RunnerError("missing fixture logprobs-2048.tsv");
  std::vector<int> target, top1, top1_b;
  std::vector<double> ref, ref_b;
  std::string line;
  while (std::getline(in, line)) {
    if (line.empty() || line[0] == '#') continue;
    std::istringstream ls(line);
    int pos, t, k, kb;
    double lp, lpb;
    if (!(ls >> pos >> t >> lp >> k >> lpb >> kb) || pos != static_cast<int>(ref.size()))
      throw RunnerError("bad fixture line: " + line);
    target.push_back(t);
    ref.push_back(lp);
    top1.push_back(k);
    ref_b.push_back(lpb);
    top1_b.push_back(kb);
  }
  check(static_cast<int>(ref.size()) == n - 1, "fixture holds 2047 positions");
  Transformer tr(m, n);
  set_blas_threads(2);
  KvPool pool(c, KVC_DTYPE_F16, KVC_DTYPE_F16, static_cast<std::uint32_t>(n));
  AttnSequence seq(pool, 1, c);
  std::vector<double> logp;
  double abs_sum = 0, max_abs = 0, peer_abs_sum = 0;
  int agree = 0, targets_match = 0, peer_agree = 0;
  const int chunk = 128;
  for (int pos = 0; pos < n; pos += chunk) {
    const int len = std::min(chunk, n - pos);
    const float *logits = tr.forward_chunk(seq, ids.data() + pos, len, pos);
    for (int i = 0; i < len; ++i) {
      const int p = pos + i;
      if (p >= n - 1) break;
      const float *row = logits + std::size_t(i) * c.vocab_size;
      log_softmax(row, c.vocab_size, logp);
      int best = 0;
      for (int v = 1; v < c.vocab_size; ++v)
        if (row[v] > row[best]) best = v;
      targets_match += ids[static_cast<std::size_t>(p) + 1] == target[static_cast<std::size_t>(p)];
      const double d =
          std::fabs(logp[static_cast<std::size_t>(target[static_cast<std::size_t>(p)])] -
                    ref[static_cast<std::size_t>(p)]);
      abs_sum += d;
      max_abs = std::max(max_abs, d);
      agree += best == top1[static_cast<std::size_t>(p)];
      peer_abs_sum +=
          std::fabs(ref_b[static_cast<std::size_t>(p)] - ref[static_cast<std::size_t>(p)]);
      peer_agree += top1_b[static_cast<std::size_t>(p)] == top1[static_cast<std::size_t>(p)];
    }
  }
  const double mean_abs = abs_sum / (n - 1), agreement = double(agree) / (n - 1);
  const double peer_mean = peer_abs_sum / (n - 1), peer_agreement = double(peer_agree) / (n - 1);
  std::printf(
      "ours (f16 K/V) vs llama.cpp (f16 K/V, flash attention), 2047 positions: top-1 agreement "
      "%.4f, "
      "mean |logprob diff| %.5f nats, max %.4f\n",
      agreement, mean_abs, max_abs);
  std::printf(
      "llama.cpp (f32 K/V, no flash attention) vs the same: top-1 agreement %.4f, mean |logprob "
      "diff| %.5f "
      "nats\n",
      peer_agreement, peer_mean);
  check(targets_match == n - 1, "the fixture's targets are our token ids");
  // This Q4_1 model amplifies rounding: llama.cpp moves by ~0.05 nats when only
  // its attention numerics change. We must be no farther from llama.cpp than
  // llama.cpp is from itself, and close in absolute terms.
  check(mean_abs <= peer_mean * 1.05,
        "farther from llama.cpp than llama.cpp's own two configurations are");
  check(agreement >= peer_agreement - 0.005,
        "top-1 agreement below llama.cpp's own across configurations");
  check(mean_abs < 0.06 && agreement > 0.96, "absolute agreement with llama.cpp");
  return failures ? 1 : 0;
}

int chunk(const std::string &model) {
  const Model m = Model::load(model);
  const ModelConfig &c = m.config();
  const Tokenizer tok = Tokenizer::load(model, c.vocab_size);
  const std::string text =
      read_text_file(shared_dir() + "/data/tinystories-valid-sample.txt", "text file");
  std::vector<int> ids = tok.encode(text.substr(0, 1000), false, false);
  const int n = 48;
  Transformer tr(m, 64);
  KvPool pool(c, KVC_DTYPE_F32, KVC_DTYPE_F32, 64, 2);
  std::vector<float> one;
  {
    AttnSequence s(pool, 1, c);
    for (int p = 0; p < n; ++p) {
      const float *l = tr.forward(s, ids[static_cast<std::size_t>(p)], p);
      one.insert(one.end(), l, l + c.vocab_size);
    }
  }
  AttnSequence s(pool, 2, c);
  double max_diff = 0, max_abs = 0;
  for (int pos = 0; pos < n; pos += 20) {  // chunks of 20, 20 and 8
    const int len = std::min(20, n - pos);
    const float *l = tr.forward_chunk(s, ids.data() + pos, len, pos);
    for (std::size_t i = 0; i < std::size_t(len) * c.vocab_size; ++i) {
      const float a = one[std::size_t(pos) * c.vocab_size + i];
      max_diff = std::max(max_diff, double(std::fabs(l[i] - a)));
      max_abs = std::max(max_abs, double(std::fabs(a)));
    }
  }
  std::printf(
      "chunked vs token by token, %d positions: max |logit difference| %.3g (logits up to %.1f)\n",
      n, max_diff, max_abs);
  check(max_diff < 1e-3 * std::max(1.0, max_abs), "chunked logits differ from token-by-token ones");
  return failures ? 1 : 0;
}

// llama.cpp's K/V of the fixture's tokens, imported from its blobs, against our forward
// pass's on the same tokens, layer by layer (f16 K/V; q8_0 with its rotation undone).
int llama_state(const std::string &model, const std::string &fixtures) {
  const Model m = Model::load(model);
  const ModelConfig &c = m.config();
  std::ifstream in(fixtures + "/llama-state.txt");
  if (!in) throw RunnerError("missing fixture llama-state.txt");
  std::vector<int> ids;
  std::string line;
  while (std::getline(in, line))
    if (line.rfind("tokens ", 0) == 0) {
      std::istringstream ls(line.substr(7));
      for (int t; ls >> t;) ids.push_back(t);
    }
  const int n = static_cast<int>(ids.size());
  check(n == 8, "llama-state.txt names 8 tokens");
  if (n == 0) return 1;
  Transformer tr(m, 64);
  KvPool pool(c, KVC_DTYPE_F32, KVC_DTYPE_F32, 64, 4);
  AttnSequence seq(pool, 1, c);
  tr.forward_chunk(seq, ids.data(), n, 0);
  const std::size_t row = static_cast<std::size_t>(c.kv_dim());
  std::vector<float> ours(n * row), theirs(n * row);
  const struct {
    const char *blob;
    std::uint32_t flags;
    double tol;
  } cases[] = {{"f16", 0, 0.1}, {"f16-vtrans", 0, 0.1}, {"q8_0", KVC_LLAMA_ATTN_ROT, 0.1}};
  std::uint64_t id = 10;
  for (const auto &cs : cases) {
    const std::vector<std::uint8_t> b = read_bytes(fixtures + "/llama-state-" + cs.blob + ".bin");
    std::uint64_t got = 0;
    const kvc_status st =
        kvc_seq_import_llama(pool.get(), ++id, b.data(), b.size(), cs.flags, &got);
    if (st != KVC_OK) {
      fail(std::string(cs.blob) + ": import: " + kvc_last_error_message());
      continue;
    }
    check(got == static_cast<std::uint64_t>(n), std::string(cs.blob) + ": tokens imported");
    // Relative L2 error ||ours - theirs|| / ||ours|| per layer and K / V: llama.cpp's forward
    // multiplies Q4_1 weights with q8-quantized activations, ours in f32, so they differ slightly.
    double worst[2] = {0, 0}, first[2] = {0, 0};
    for (int l = 0; l < c.n_layers; ++l)
      for (int is_v = 0; is_v < 2; ++is_v) {
        float *o = ours.data(), *t = theirs.data();
        check(kvc_gather(pool.get(), 1, l, 0, n, is_v ? nullptr : o, is_v ? o : nullptr,
                         KVC_DTYPE_F32, nullptr) == KVC_OK,
              "gather ours");
        check(kvc_gather(pool.get(), id, l, 0, n, is_v ? nullptr : t, is_v ? t : nullptr,
                         KVC_DTYPE_F32, nullptr) == KVC_OK,
              "gather theirs");
        double num = 0, den = 0;
        for (std::size_t i = 0; i < ours.size(); ++i) {
          num += (double(o[i]) - double(t[i])) * (double(o[i]) - double(t[i]));
          den += double(o[i]) * double(o[i]);
        }
        const double rel = std::sqrt(num / std::max(den, 1e-30));
        worst[is_v] = std::max(worst[is_v], rel);
        if (l == 0) first[is_v] = rel;
      }
    std::printf(
        "%-10s ||ours - llama.cpp|| / ||ours||: layer 0 K %.4f V %.4f; worst layer K %.4f V %.4f\n",
        cs.blob, first[0], first[1], worst[0], worst[1]);
    // Measured (SmolLM2, 8 tokens): layer 0 about 0.4 % (K) and 1.5 % (V), the worst layer
    // about 2.4 % and 5.8 %; a layout error (element order, rotation left in) gives over 100 %.
    check(first[0] < 0.03 && first[1] < 0.03 && worst[0] < cs.tol && worst[1] < cs.tol,
          std::string(cs.blob) + ": llama.cpp's K/V differ from ours beyond the tolerance");
  }
  return failures ? 1 : 0;
}

}  // namespace

int main(int argc, char **argv) {
  kvc_runner::ensure_blas_core(argv);
  const std::string mode = argc > 1 ? argv[1] : "";
  try {
    const std::string model =
        argc > 2 ? resolve_model_path(argv[2]) : "";  // "smollm2": the model cache
    if (mode == "bad-files" && argc == 4) return bad_files(model, argv[3]);
    if (mode == "load" && argc == 3) return load(model);
    if (mode == "tokenize" && argc == 4) return tokenize(model, argv[3]);
    if (mode == "logprobs" && argc == 4) return logprobs(model, argv[3]);
    if (mode == "chunk" && argc == 3) return chunk(model);
    if (mode == "llama-state" && argc == 4) return llama_state(model, argv[3]);
  } catch (const std::exception &e) {
    fail(e.what());
    return 1;
  }
  std::fprintf(stderr, "usage: see the comment at the top of gguf_test.cpp\n");
  return 2;
}
