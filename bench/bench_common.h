// Shared by the benchmark programs: abort with the library's message when a
// set-up call fails (a benchmark must never time a failing call).
#pragma once
#include <cstdio>
#include <cstdlib>

#include "kvcache/kvcache.h"

[[noreturn]] inline void bench_die(const char *what, kvc_status s) {
  std::fprintf(stderr, "%s: %s (%s)\n", what, kvc_status_string(s), kvc_last_error_message());
  std::abort();
}
#define OK(call)                                  \
  do {                                            \
    const kvc_status s_ = (call);                 \
    if (s_ != KVC_OK) bench_die(#call, s_);       \
  } while (0)
