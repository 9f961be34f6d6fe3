// SPDX-License-Identifier: Apache-2.0
// The test driver of the kvcache tool (cli_check.cpp; the `recommend` cases in
// cli_check_recommend.cpp): what its checks share.
#pragma once

#include <string>

#include "process.h"

namespace cli_check {

/// Failures reported so far: a mode exits 1 when there is any.
extern int failures;

/// Prints "FAIL: msg" on stderr and counts it.
void fail(const std::string &msg);

/// fail(msg) unless `ok`.
void check(bool ok, const std::string &msg);

/// How a process ended: "exit code N", "killed by signal N" or "could not start".
std::string describe(const ProcessResult &r);

/// `cli_check recommend CASE KVCACHE DATA_DIR`: checks `kvcache recommend` on
/// the crafted eval reports of DATA_DIR (cli_check_recommend.cpp); 0 when it passes.
int recommend(const std::string &which, const std::string &kvcache, const std::string &dir);

}  // namespace cli_check
