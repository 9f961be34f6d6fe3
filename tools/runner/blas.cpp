// SPDX-License-Identifier: Apache-2.0
#include "blas.h"

#include <unistd.h>

#include <cblas.h>
#include <cctype>
#include <cstdlib>
#include <string>

namespace kvc_runner {

namespace {
// OpenBLAS's x86 core names without AVX2 kernels (lower case).
bool pre_avx2_core(const char *name) {
  if (name == nullptr) return true;
  std::string n(name);
  for (char &c : n) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  for (const char *old : {"prescott",  "core2",       "penryn",       "dunnington", "nehalem",
                          "atom",      "sandybridge", "katmai",       "coppermine", "northwood",
                          "banias",    "opteron",     "opteron_sse3", "barcelona",  "bobcat",
                          "bulldozer", "piledriver",  "steamroller",  "excavator",  "unknown"})
    if (n == old) return true;
  return false;
}
}  // namespace

const char *blas_core_name() {
  const char *n = openblas_get_corename();
  return n != nullptr ? n : "unknown";
}

const char *blas_core_override() {
#if defined(__x86_64__)
  if (std::getenv("OPENBLAS_CORETYPE") != nullptr) return nullptr;
  if (!pre_avx2_core(openblas_get_corename())) return nullptr;
  __builtin_cpu_init();
  if (!__builtin_cpu_supports("avx2") || !__builtin_cpu_supports("fma")) return nullptr;
  if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
      __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512vl"))
    return "SkylakeX";
  return "Haswell";
#else
  return nullptr;
#endif
}

void ensure_blas_core(char **argv) {
  if (std::getenv("KVCACHE_BLAS_KEEP_CORE") != nullptr) return;
  const char *core = blas_core_override();
  if (core == nullptr || argv == nullptr || argv[0] == nullptr) return;
  if (setenv("OPENBLAS_CORETYPE", core, 1) != 0) return;
  execv("/proc/self/exe", argv);
  unsetenv("OPENBLAS_CORETYPE");  // not executed again: OpenBLAS's choice stands
}

}  // namespace kvc_runner
