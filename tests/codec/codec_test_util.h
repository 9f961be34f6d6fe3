// Shared pieces of the codec_* white-box tests (test_codec.cpp,
// test_codec_fp8.cpp): the failure counter and CHECK, the seeded generator,
// a quantize-then-dequantize round trip, and the runner of named tests.
#pragma once
#include <cmath>
#include <cstdio>
#include <cstring>
#include <functional>
#include <map>
#include <random>
#include <string>
#include <vector>
#if defined(__x86_64__)
#include <xmmintrin.h>
#endif

#include "codec/codec.h"
#include "common/error.h"
#include "common/fp8.h"

using namespace kvc;
using namespace kvc::codec;

inline int g_fail = 0;
#define CHECK(c)                                                                                  \
  do {                                                                                            \
    if (!(c)) {                                                                                   \
      if (g_fail < 25) std::fprintf(stderr, "%s:%d: CHECK failed: %s\n", __FILE__, __LINE__, #c); \
      ++g_fail;                                                                                   \
    }                                                                                             \
  } while (0)

inline std::mt19937 rng(20261129);

inline std::vector<float> gaussian(size_t n, float sigma, float mean = 0.0f) {
  std::normal_distribution<float> g(mean, sigma);
  std::vector<float> v(n);
  for (auto &x : v) x = g(rng);
  return v;
}

struct Quantized {
  std::vector<uint8_t> codes, scales, zeros;
  std::vector<float> out;
};

inline Quantized roundtrip(const Spec &s, const std::vector<float> &x, uint64_t n, uint64_t d) {
  Quantized q;
  q.codes.resize(n * row_bytes(s.dtype, d));
  q.scales.resize(num_scales(s, n, d) * scale_bytes(s));
  q.zeros.resize(s.asym ? q.scales.size() : 0);
  quantize(s, x.data(), kvc::DType::F32, n, d, q.codes.data(), q.scales.data(), q.zeros.data());
  q.out.resize(n * d);
  dequantize(s, q.codes.data(), q.scales.data(), q.zeros.data(), n, d, q.out.data(),
             kvc::DType::F32);
  return q;
}

inline void expect_error(const std::function<void()> &f, kvc::Errc code) {
  try {
    f();
    CHECK(!"expected an error");
  } catch (const kvc::Error &e) {
    CHECK(e.code() == code);
  }
}

// Runs the test named argv[1] (every test without an argument); prints the
// counts; the exit status is 1 when a check failed or no test has the name.
inline int run_named_tests(int argc, char **argv,
                           const std::map<std::string, void (*)()> &tests) {
  int ran = 0;
  for (const auto &[name, fn] : tests)
    if (argc < 2 || name == argv[1]) {
      fn();
      ++ran;
    }
  if (!ran) {
    std::fprintf(stderr, "no test named %s\n", argv[1]);
    return 1;
  }
  std::printf("%d passed, %d failed\n", g_fail ? 0 : ran, g_fail ? 1 : 0);
  return g_fail ? 1 : 0;
}
