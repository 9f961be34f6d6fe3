// SPDX-License-Identifier: Apache-2.0
// Errors of the model runner and the kvcache tool: one exception type whose
// message is meant for the user (printed as "kvcache: error: <message>").
#pragma once

#include <stdexcept>
#include <string>

namespace kvc_runner {

class RunnerError : public std::runtime_error {
 public:
  explicit RunnerError(const std::string &message) : std::runtime_error(message) {}
};

}  // namespace kvc_runner
