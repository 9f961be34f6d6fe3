// The helper of the C++ tests (the white-box tests of a module, tests/<module>/,
// which add the module's internal headers themselves, and the C++ black-box
// tests of tests/api): CHECK macros that count failures, a registry of named
// tests and a main that runs one by name (one ctest per KVTEST, kvc_kvtest_tests
// in tests/CMakeLists.txt) or all of them.
#pragma once
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <string>

#include "kvcache/kvcache.h"

inline int g_kvtest_fail = 0;

#define CHECK(cond)                                                               \
  do {                                                                            \
    if (!(cond)) {                                                                \
      std::fprintf(stderr, "%s:%d: CHECK failed: %s\n", __FILE__, __LINE__, #cond); \
      ++g_kvtest_fail;                                                            \
    }                                                                             \
  } while (0)

// CHECK with a printf-style explanation and the library's last error
// message; prints the first 25 failures (randomized tests can fail often).
#define CHECKF(cond, ...)                                                   \
  do {                                                                      \
    if (!(cond)) {                                                          \
      if (g_kvtest_fail < 25) {                                             \
        std::fprintf(stderr, "%s:%d: %s: ", __FILE__, __LINE__, #cond);     \
        std::fprintf(stderr, __VA_ARGS__);                                  \
        std::fprintf(stderr, " (%s)\n", kvc_last_error_message());          \
      }                                                                     \
      ++g_kvtest_fail;                                                      \
    }                                                                       \
  } while (0)

// A call that must return `want`.
#define CHECK_STATUS(call, want)                                                             \
  do {                                                                                       \
    const kvc_status st_ = (call);                                                           \
    if (st_ != (want)) {                                                                     \
      std::fprintf(stderr, "%s:%d: %s returned %s (%s), expected %s\n", __FILE__, __LINE__,  \
                   #call, kvc_status_string(st_), kvc_last_error_message(),                  \
                   kvc_status_string(want));                                                 \
      ++g_kvtest_fail;                                                                       \
    }                                                                                        \
  } while (0)
#define CHECK_OK(call) CHECK_STATUS(call, KVC_OK)

#define CHECK_NEAR(a, b, tol)                                                                  \
  do {                                                                                         \
    const double a_ = (a), b_ = (b);                                                           \
    if (!(std::fabs(a_ - b_) <= (tol))) {                                                      \
      std::fprintf(stderr, "%s:%d: |%s - %s| = |%.9g - %.9g| > %g\n", __FILE__, __LINE__, #a, \
                   #b, a_, b_, static_cast<double>(tol));                                      \
      ++g_kvtest_fail;                                                                         \
    }                                                                                          \
  } while (0)

using KvTestFn = void (*)();
inline std::map<std::string, KvTestFn> &kvtest_registry() {
  static std::map<std::string, KvTestFn> r;
  return r;
}
struct KvTestReg {
  KvTestReg(const char *name, KvTestFn fn) { kvtest_registry()[name] = fn; }
};
#define KVTEST(name)                          \
  static void name();                         \
  static KvTestReg name##_reg(#name, name);   \
  static void name()

// Runs the test named argv[1] (all when absent). Exit 0 only if it ran and passed.
inline int kvtest_main(int argc, char **argv) {
  int ran = 0;
  for (const auto &[name, fn] : kvtest_registry())
    if (argc < 2 || name == argv[1]) {
      fn();
      ++ran;
    }
  if (!ran) {
    std::fprintf(stderr, "no test named %s\n", argc > 1 ? argv[1] : "");
    return 1;
  }
  std::printf("%d test(s) run, %d check(s) failed\n", ran, g_kvtest_fail);
  return g_kvtest_fail ? 1 : 0;
}
