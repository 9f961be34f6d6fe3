// SPDX-License-Identifier: Apache-2.0
// codec_codebook_fit_*: the weighted Lloyd fit of `kvcache calibrate
// --codebook` and `codebook=fit` rows (tools/cli/codebook_fit.h), against
// fixed points computed by hand, and its file format.
#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "../cli/codebook_fit.h"
#include "../runner/error.h"

namespace {

int failures = 0;
void check(bool ok, const std::string &what) {
  if (!ok) {
    ++failures;
    std::fprintf(stderr, "FAIL: %s\n", what.c_str());
  }
}
std::string show(const std::vector<float> &v) {
  std::string s;
  for (float x : v) s += " " + std::to_string(x);
  return s;
}

// Lloyd's fixed points:
// - uniform samples on [-1, 1], 4 levels: each level the middle of its
//   quarter, -0.75, -0.25, 0.25, 0.75 (starting from the Gaussian table);
// - four weighted clusters: each level the weighted mean of its cluster,
//   e.g. 0.1 x 3 and 0.3 x 1 -> 0.15;
// - the weights matter: the same samples unweighted give 0.2;
// - fewer distinct values than levels: the levels stay strictly ascending in [-1, 1].
int lloyd() {
  std::vector<float> init(4);
  std::vector<float> gauss = {-0.8f, -0.3f, 0.3f, 0.8f};
  {
    std::mt19937 rng(7);
    std::uniform_real_distribution<float> u(-1.0f, 1.0f);
    std::vector<float> s(400000), w(400000, 1.0f);
    for (float &x : s) x = u(rng);
    const std::vector<float> lv = kvc_cli::lloyd_levels(s, w, 2, gauss);
    const float want[4] = {-0.75f, -0.25f, 0.25f, 0.75f};
    for (int i = 0; i < 4; ++i)
      check(std::fabs(lv[i] - want[i]) < 5e-3, "uniform: level " + std::to_string(i) + show(lv));
  }
  {
    const std::vector<float> s = {-0.9f, -0.7f, -0.2f, -0.2f, 0.1f, 0.3f, 0.8f, 1.0f};
    const std::vector<float> w = {1.0f, 1.0f, 2.0f, 5.0f, 3.0f, 1.0f, 1.0f, 3.0f};
    const std::vector<float> lv = kvc_cli::lloyd_levels(s, w, 2, gauss);
    const float want[4] = {-0.8f, -0.2f, 0.15f, 0.95f};
    for (int i = 0; i < 4; ++i)
      check(std::fabs(lv[i] - want[i]) < 2e-4, "weighted: level " + std::to_string(i) + show(lv));
    const std::vector<float> one(s.size(), 1.0f);
    const std::vector<float> lu = kvc_cli::lloyd_levels(s, one, 2, gauss);
    check(std::fabs(lu[2] - 0.2f) < 2e-4 && std::fabs(lu[3] - 0.9f) < 2e-4,
          "unweighted: levels 2, 3" + show(lu));
  }
  {
    const std::vector<float> s = {1.0f, 1.0f, 1.0f}, w = {1.0f, 1.0f, 1.0f};
    const std::vector<float> lv = kvc_cli::lloyd_levels(s, w, 2, gauss);
    bool ok = lv.size() == 4;
    for (std::size_t i = 0; ok && i < lv.size(); ++i)
      ok = lv[i] >= -1.0f && lv[i] <= 1.0f && (i == 0 || lv[i] > lv[i - 1]);
    check(ok && lv[3] == 1.0f, "one value at 1: ascending, top level 1:" + show(lv));
  }
  bool threw = false;
  try {
    kvc_cli::lloyd_levels({1.5f}, {1.0f}, 2, gauss);
  } catch (const kvc_runner::RunnerError &) {
    threw = true;
  }
  check(threw, "a sample outside [-1, 1] is refused");
  return failures ? 1 : 0;
}

// The file format: format_codebooks -> parse_codebooks keeps every level
// bit for bit (9 significant digits hold a float), and each malformed file
// is refused with its line.
int file() {
  kvc_cli::FittedCodebook a, b;
  a.how.part = 0;
  a.how.bits = 2;
  a.how.group = 64;
  a.layers = 2;
  a.levels = {-0.987654321f, -0.1f, 0.123456789f, 1.0f, -1.0f, -0.5f, 0.25f, 0.75f};
  b.how.part = 1;
  b.how.bits = 3;
  b.how.group = 32;
  b.layers = 1;
  b.levels = {-0.9f, -0.6f, -0.3f, -0.01f, 0.02f, 0.31f, 0.6f, 0.93f};
  const std::string text = kvc_cli::format_codebooks({a, b}, "a comment\nsecond line");
  const std::vector<kvc_cli::FittedCodebook> got = kvc_cli::parse_codebooks(text, "t");
  check(got.size() == 2, "two parts back");
  if (got.size() == 2) {
    check(got[0].how.part == 0 && got[0].how.bits == 2 && got[0].how.group == 64 &&
              got[0].layers == 2 && got[1].how.part == 1 && got[1].how.bits == 3 &&
              got[1].how.group == 32 && got[1].layers == 1,
          "headers back");
    check(got[0].levels.size() == a.levels.size() &&
              std::memcmp(got[0].levels.data(), a.levels.data(), 4 * a.levels.size()) == 0 &&
              got[1].levels.size() == b.levels.size() &&
              std::memcmp(got[1].levels.data(), b.levels.data(), 4 * b.levels.size()) == 0,
          "levels back bit for bit");
  }
  const char *bad[][2] = {
      {"", "empty"},
      {"kvcache-codebook 2\n", "header"},
      {"kvcache-codebook 1\n", "no 'part' line"},
      {"kvcache-codebook 1\npart x bits 2 group 8 layers 1\n", "expected 'part"},
      {"kvcache-codebook 1\npart k bits 5 group 8 layers 1\n", "bits 5 is above 4"},
      {"kvcache-codebook 1\npart k bits 1 group 8 layers 1\n", "bits must be 2, 3 or 4"},
      {"kvcache-codebook 1 extra\n", "header"},
      {"kvcache-codebook 1\npart k bits +2 group 8 layers 1\n", "not a whole number"},
      {"kvcache-codebook 1\npart k bits 2 group -8 layers 1\n", "not a whole number"},
      {"kvcache-codebook 1\npart k bits 2 group 8 layers 1 x\n", "expected 'part"},
      {"kvcache-codebook 1\npart k bits 2 group 8 layers 1\nlevels 00 -1 0 0.5 1\n",
       "expected 'levels 0'"},
      {"kvcache-codebook 1\npart k bits 2 group 8 layers 1\nlevels 0 -1 0.1 0.10000000001 1\n",
       "ascend strictly"},
      {"kvcache-codebook 1\npart k bits 2 group 8 layers 1\nlevels 0 -1 0 0.5x 1\n",
       "expected a number"},
      {"kvcache-codebook 1\npart k bits 2 group 8 layers 1\nlevels 0 -1 0.5 0.2 1\n",
       "ascend strictly"},
      {"kvcache-codebook 1\npart k bits 2 group 8 layers 1\nlevels 0 -1 0 0.5 1.5\n", "in [-1, 1]"},
      {"kvcache-codebook 1\npart k bits 2 group 8 layers 2\nlevels 0 -1 0 0.5 1\n",
       "fewer levels lines"},
      {"kvcache-codebook 1\npart k bits 2 group 8 layers 1\nlevels 1 -1 0 0.5 1\n",
       "expected 'levels 0'"},
      {"kvcache-codebook 1\npart k bits 2 group 8 layers 1\nlevels 0 -1 0 0.5 1 1\n",
       "expected 2^bits = 4"},
      {"kvcache-codebook 1\nlevels 0 -1 0 0.5 1\n", "before any 'part'"},
  };
  for (const auto &c : bad) {
    std::string msg;
    try {
      kvc_cli::parse_codebooks(c[0], "f");
    } catch (const kvc_runner::RunnerError &e) {
      msg = e.what();
    }
    check(msg.find(c[1]) != std::string::npos,
          std::string("bad file refused with '") + c[1] + "': got '" + msg + "'");
  }
  return failures ? 1 : 0;
}

}  // namespace

int main(int argc, char **argv) {
  const std::string what = argc > 1 ? argv[1] : "";
  if (what == "lloyd") return lloyd();
  if (what == "file") return file();
  std::fprintf(stderr, "usage: %s lloyd|file\n", argv[0]);
  return 2;
}
