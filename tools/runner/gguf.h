// SPDX-License-Identifier: Apache-2.0
// A reader of GGUF files (ggml's model format, version 2 and 3): header,
// metadata key/values, tensor infos and tensor data, with dequantization of
// F32, F16, BF16, Q8_0, Q4_0 and Q4_1 tensors to f32.
//
// Layout (little-endian): "GGUF", u32 version, u64 tensor_count, u64 kv_count;
// kv_count x (string key, u32 type, value); tensor_count x (string name, u32
// n_dims, u64 ne[n_dims], u32 ggml_type, u64 offset); padding to
// `general.alignment` (default 32); the data section, each tensor at its
// offset. A string is u64 length + bytes; an array is u32 element type, u64
// count, elements. ne[0] is the fastest-varying dimension: a weight matrix
// [ne0 = in][ne1 = out] is stored as `out` rows of `in` values.
//
// Every size, count and offset is checked against the file before use: a
// malformed or truncated file gives a RunnerError naming what is wrong.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <variant>
#include <vector>

namespace kvc_runner {

enum class GgmlType : std::uint32_t { F32 = 0, F16 = 1, Q4_0 = 2, Q4_1 = 3, Q8_0 = 8, BF16 = 30 };

/// One metadata value: an integer (any width, signedness kept in the value),
/// a float, a bool, a string, or an array of those.
struct GgufValue {
  enum class Kind { Int, Float, Bool, String, IntArray, FloatArray, StringArray };
  Kind kind = Kind::Int;
  std::int64_t i = 0;
  double f = 0;
  bool b = false;
  std::string s;
  std::vector<std::int64_t> ints;
  std::vector<double> floats;
  std::vector<std::string> strings;
};

struct GgufTensor {
  std::string name;
  std::vector<std::uint64_t> ne;  ///< dimensions, fastest first
  std::uint32_t type = 0;         ///< ggml type id
  std::uint64_t offset = 0;       ///< from the start of the data section
  std::uint64_t bytes = 0;        ///< stored size
  std::uint64_t elements() const;
};

class GgufFile {
 public:
  /// Reads and validates the whole file; throws RunnerError.
  static GgufFile load(const std::string &path);
  /// Parses bytes already in memory (the fuzz test's entry point).
  static GgufFile parse(std::vector<std::uint8_t> bytes, const std::string &name);

  std::uint32_t version() const { return version_; }
  const std::string &path() const { return path_; }
  const std::map<std::string, GgufValue> &metadata() const { return kv_; }
  const std::vector<GgufTensor> &tensors() const { return tensors_; }

  bool has(const std::string &key) const { return kv_.count(key) != 0; }
  /// Typed access; a missing key or a value of another kind is a RunnerError.
  std::int64_t get_int(const std::string &key) const;
  double get_float(const std::string &key) const;  ///< also accepts an integer
  bool get_bool(const std::string &key, bool fallback) const;
  const std::string &get_string(const std::string &key) const;
  const std::vector<std::string> &get_strings(const std::string &key) const;

  const GgufTensor *find(const std::string &name) const;
  /// The tensor `name`, which must exist with dimensions `ne` (else a RunnerError naming both).
  const GgufTensor &require(const std::string &name, const std::vector<std::uint64_t> &ne) const;
  /// Appends the f32 values of tensor `t` to `out`.
  void dequantize_into(const GgufTensor &t, std::vector<float> &out) const;

 private:
  std::string path_;
  std::uint32_t version_ = 0;
  std::vector<std::uint8_t> bytes_;
  std::uint64_t data_start_ = 0;
  std::map<std::string, GgufValue> kv_;
  std::vector<GgufTensor> tensors_;
};

/// Name of a ggml type id ("q4_1", ...; "type N" when unknown).
std::string ggml_type_name(std::uint32_t type);

}  // namespace kvc_runner
