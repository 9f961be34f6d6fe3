// Replays saved fuzz inputs through the libFuzzer target's entry point, as an
// ordinary program (any compiler, no libFuzzer): the ctest test
// fuzz_corpus_replay runs it over tests/fuzz/corpus/. A violated check aborts.
// Usage: fuzz_replay FILE_OR_DIR...
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int main(int argc, char **argv) {
  namespace fs = std::filesystem;
  std::vector<fs::path> files;
  for (int i = 1; i < argc; ++i) {
    const fs::path p(argv[i]);
    if (fs::is_directory(p)) {
      for (const auto &e : fs::directory_iterator(p))
        if (e.is_regular_file()) files.push_back(e.path());
    } else {
      files.push_back(p);
    }
  }
  if (files.empty()) {
    std::fprintf(stderr, "fuzz_replay: no input files\n");
    return 1;
  }
  std::sort(files.begin(), files.end());
  for (const auto &f : files) {
    std::ifstream in(f, std::ios::binary);
    if (!in) {
      std::fprintf(stderr, "fuzz_replay: cannot read %s\n", f.string().c_str());
      return 1;
    }
    const std::vector<uint8_t> bytes((std::istreambuf_iterator<char>(in)),
                                     std::istreambuf_iterator<char>());
    LLVMFuzzerTestOneInput(bytes.data(), bytes.size());
  }
  // The empty input and a few fixed ones as well.
  LLVMFuzzerTestOneInput(nullptr, 0);
  std::printf("fuzz_replay: %zu inputs replayed, every check held\n", files.size());
  return 0;
}
