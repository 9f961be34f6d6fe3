// SPDX-License-Identifier: Apache-2.0
#include "blas.h"

#include <unistd.h>

#include <cblas.h>
#include <cctype>
#include <cstdlib>
#include <cstring>
#include <string>

namespace kvc_runner {

namespace {
std::string lower(const char *name) {
  std::string n(name != nullptr ? name : "");
  for (char &c : n) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return n;
}
}  // namespace

bool blas_core_has_avx2(const char *name) {
  const std::string n = lower(name);
  for (const char *core : {"haswell", "zen", "skylakex", "cooperlake", "sapphirerapids"})
    if (n == core) return true;
  return false;
}

const char *blas_core_name() {
  const char *n = openblas_get_corename();
  return n != nullptr ? n : "unknown";
}

bool blas_chooses_at_run_time() {
  const char *config = openblas_get_config();
  return config != nullptr && std::strstr(config, "DYNAMIC_ARCH") != nullptr;
}

const char *blas_core_override() {
#if defined(__x86_64__)
  if (std::getenv("OPENBLAS_CORETYPE") != nullptr || !blas_chooses_at_run_time()) return nullptr;
  if (blas_core_has_avx2(openblas_get_corename())) return nullptr;
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
  const char *keep = std::getenv("KVCACHE_BLAS_KEEP_CORE");
  if (keep != nullptr && *keep != '\0' && std::strcmp(keep, "0") != 0) return;
  // Under valgrind (its preloaded core) the program would run again natively.
  const char *preload = std::getenv("LD_PRELOAD");
  if (preload != nullptr && std::strstr(preload, "vgpreload") != nullptr) return;
  const char *core = blas_core_override();
  if (core == nullptr || argv == nullptr || argv[0] == nullptr) return;
  // The program's own file (not the dynamic loader's, when it was started
  // through ld.so: that one would read its arguments differently).
  char exe[4096];
  const ssize_t len = readlink("/proc/self/exe", exe, sizeof exe - 1);
  if (len <= 0) return;
  exe[len] = '\0';
  const char *base = std::strrchr(exe, '/');
  base = base != nullptr ? base + 1 : exe;
  if (std::strncmp(base, "ld-", 3) == 0 || std::strncmp(base, "ld.so", 5) == 0) return;
  if (setenv("OPENBLAS_CORETYPE", core, 1) != 0) return;
  execv(exe, argv);
  unsetenv("OPENBLAS_CORETYPE");  // not executed again: OpenBLAS's choice stands
}

}  // namespace kvc_runner
