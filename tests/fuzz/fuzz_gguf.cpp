// SPDX-License-Identifier: Apache-2.0
// libFuzzer target of the runner's GGUF reader (tools/runner/gguf.cpp): any
// bytes either parse into a file whose tensors all lie inside it, or are
// refused with a RunnerError; parsed tensors of up to 2^20 values are
// dequantized (every read must stay in bounds). Seeds: tests/fuzz/corpus-gguf.
#include <cstddef>
#include <cstdint>
#include <vector>

#include "runner/error.h"
#include "runner/gguf.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  try {
    const kvc_runner::GgufFile g =
        kvc_runner::GgufFile::parse(std::vector<std::uint8_t>(data, data + size), "fuzz input");
    std::vector<float> out;
    for (const kvc_runner::GgufTensor &t : g.tensors()) {
      if (t.elements() > (1u << 20)) continue;
      out.clear();
      g.dequantize_into(t, out);
    }
  } catch (const kvc_runner::RunnerError &) {
  }
  return 0;
}
