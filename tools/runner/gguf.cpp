// SPDX-License-Identifier: Apache-2.0
#include "gguf.h"

#include <cerrno>
#include <cmath>
#include <cstring>
#include <fstream>
#include <limits>

#include "error.h"

namespace kvc_runner {
namespace {

constexpr std::uint32_t kMagic = 0x46554747u;  // "GGUF" read as a little-endian u32
constexpr std::uint64_t kMaxString = 1ull << 24;
constexpr std::uint64_t kMaxArray = 1ull << 26;
constexpr std::uint64_t kMaxTensors = 1ull << 20;
constexpr std::uint64_t kMaxKv = 1ull << 20;
constexpr std::uint32_t kMaxDims = 4;

enum : std::uint32_t {
  kU8 = 0,
  kI8 = 1,
  kU16 = 2,
  kI16 = 3,
  kU32 = 4,
  kI32 = 5,
  kF32 = 6,
  kBool = 7,
  kString = 8,
  kArray = 9,
  kU64 = 10,
  kI64 = 11,
  kF64 = 12
};

float half_to_float(std::uint16_t h) {
  const std::uint32_t sign = (std::uint32_t(h) & 0x8000u) << 16;
  const std::uint32_t exponent = (h >> 10) & 0x1Fu, mantissa = h & 0x3FFu;
  float v;
  if (exponent == 0)
    v = std::ldexp(static_cast<float>(mantissa), -24);
  else if (exponent == 31)
    v = mantissa ? NAN : INFINITY;
  else
    v = std::ldexp(static_cast<float>(mantissa | 0x400u), int(exponent) - 25);
  std::uint32_t bits;
  std::memcpy(&bits, &v, sizeof bits);
  bits |= sign;
  std::memcpy(&v, &bits, sizeof v);
  return v;
}

/// Bytes per block and values per block of a ggml type (0: unsupported).
void block_shape(std::uint32_t type, std::uint64_t &block_bytes, std::uint64_t &block_values) {
  switch (static_cast<GgmlType>(type)) {
    case GgmlType::F32:
      block_bytes = 4;
      block_values = 1;
      return;
    case GgmlType::F16:
      block_bytes = 2;
      block_values = 1;
      return;
    case GgmlType::BF16:
      block_bytes = 2;
      block_values = 1;
      return;
    case GgmlType::Q8_0:
      block_bytes = 2 + 32;
      block_values = 32;
      return;
    case GgmlType::Q4_0:
      block_bytes = 2 + 16;
      block_values = 32;
      return;
    case GgmlType::Q4_1:
      block_bytes = 4 + 16;
      block_values = 32;
      return;
  }
  block_bytes = block_values = 0;
}

/// Bounds-checked little-endian cursor over the file bytes.
class Reader {
 public:
  Reader(const std::vector<std::uint8_t> &b, const std::string &name) : b_(b), name_(name) {}
  std::uint64_t pos() const { return pos_; }
  [[noreturn]] void fail(const std::string &what) const {
    throw RunnerError("GGUF file '" + name_ + "': " + what + " (at byte " + std::to_string(pos_) +
                      " of " + std::to_string(b_.size()) + ")");
  }
  void need(std::uint64_t n, const char *what) const {
    if (n > b_.size() - pos_)
      fail(std::string("truncated: ") + what + " needs " + std::to_string(n) + " more bytes");
  }
  template <class T>
  T get(const char *what) {
    need(sizeof(T), what);
    T v;
    std::memcpy(&v, b_.data() + pos_,
                sizeof v);  // the format is little-endian, as are the hosts we build for
    pos_ += sizeof v;
    return v;
  }
  std::string str(const char *what) {
    const std::uint64_t n = get<std::uint64_t>(what);
    if (n > kMaxString)
      fail(std::string(what) + ": string length " + std::to_string(n) + " is implausible");
    need(n, what);
    std::string s(reinterpret_cast<const char *>(b_.data() + pos_), static_cast<std::size_t>(n));
    pos_ += n;
    return s;
  }

 private:
  const std::vector<std::uint8_t> &b_;
  const std::string &name_;
  std::uint64_t pos_ = 0;
};

std::int64_t read_int(Reader &r, std::uint32_t type, const char *what) {
  switch (type) {
    case kU8:
      return r.get<std::uint8_t>(what);
    case kI8:
      return r.get<std::int8_t>(what);
    case kU16:
      return r.get<std::uint16_t>(what);
    case kI16:
      return r.get<std::int16_t>(what);
    case kU32:
      return r.get<std::uint32_t>(what);
    case kI32:
      return r.get<std::int32_t>(what);
    case kU64: {
      const std::uint64_t v = r.get<std::uint64_t>(what);
      if (v > std::uint64_t(std::numeric_limits<std::int64_t>::max()))
        r.fail(std::string(what) + ": u64 value too large");
      return static_cast<std::int64_t>(v);
    }
    case kI64:
      return r.get<std::int64_t>(what);
  }
  r.fail(std::string(what) + ": not an integer type");
}

bool is_int_type(std::uint32_t t) {
  return t <= kI32 || t == kU64 || t == kI64;
}

GgufValue read_value(Reader &r, std::uint32_t type, const std::string &key) {
  GgufValue v;
  const char *what = key.c_str();
  if (is_int_type(type)) {
    v.kind = GgufValue::Kind::Int;
    v.i = read_int(r, type, what);
  } else if (type == kF32 || type == kF64) {
    v.kind = GgufValue::Kind::Float;
    v.f = type == kF32 ? double(r.get<float>(what)) : r.get<double>(what);
  } else if (type == kBool) {
    v.kind = GgufValue::Kind::Bool;
    const std::uint8_t x = r.get<std::uint8_t>(what);
    if (x > 1) r.fail("metadata '" + key + "': bool value " + std::to_string(x));
    v.b = x != 0;
  } else if (type == kString) {
    v.kind = GgufValue::Kind::String;
    v.s = r.str(what);
  } else if (type == kArray) {
    const std::uint32_t et = r.get<std::uint32_t>(what);
    const std::uint64_t n = r.get<std::uint64_t>(what);
    if (n > kMaxArray)
      r.fail("metadata '" + key + "': array of " + std::to_string(n) + " elements is implausible");
    if (et == kString) {
      v.kind = GgufValue::Kind::StringArray;
      for (std::uint64_t i = 0; i < n; ++i) v.strings.push_back(r.str(what));
    } else if (is_int_type(et) || et == kBool) {
      v.kind = GgufValue::Kind::IntArray;
      for (std::uint64_t i = 0; i < n; ++i)
        v.ints.push_back(et == kBool ? r.get<std::uint8_t>(what) : read_int(r, et, what));
    } else if (et == kF32 || et == kF64) {
      v.kind = GgufValue::Kind::FloatArray;
      for (std::uint64_t i = 0; i < n; ++i)
        v.floats.push_back(et == kF32 ? double(r.get<float>(what)) : r.get<double>(what));
    } else {
      r.fail("metadata '" + key + "': array element type " + std::to_string(et) +
             " is not supported");
    }
  } else {
    r.fail("metadata '" + key + "': unknown value type " + std::to_string(type));
  }
  return v;
}

}  // namespace

std::string ggml_type_name(std::uint32_t type) {
  switch (static_cast<GgmlType>(type)) {
    case GgmlType::F32:
      return "f32";
    case GgmlType::F16:
      return "f16";
    case GgmlType::BF16:
      return "bf16";
    case GgmlType::Q8_0:
      return "q8_0";
    case GgmlType::Q4_0:
      return "q4_0";
    case GgmlType::Q4_1:
      return "q4_1";
  }
  return "type " + std::to_string(type);
}

std::uint64_t GgufTensor::elements() const {
  std::uint64_t n = 1;
  for (std::uint64_t d : ne) n *= d;
  return n;
}

GgufFile GgufFile::load(const std::string &path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw RunnerError("cannot open model file '" + path + "': " + std::strerror(errno));
  in.seekg(0, std::ios::end);
  const std::streamoff size = in.tellg();
  if (size < 0) throw RunnerError("cannot read model file '" + path + "'");
  in.seekg(0, std::ios::beg);
  std::vector<std::uint8_t> bytes;
  try {
    bytes.resize(static_cast<std::size_t>(size));
  } catch (const std::bad_alloc &) {
    throw RunnerError("model '" + path + "': out of memory for " + std::to_string(size) + " bytes");
  }
  in.read(reinterpret_cast<char *>(bytes.data()), size);
  if (!in) throw RunnerError("model '" + path + "': read error");
  return parse(std::move(bytes), path);
}

GgufFile GgufFile::parse(std::vector<std::uint8_t> bytes, const std::string &name) {
  GgufFile g;
  g.path_ = name;
  g.bytes_ = std::move(bytes);
  Reader r(g.bytes_, g.path_);
  if (r.get<std::uint32_t>("magic") != kMagic) r.fail("not a GGUF file (bad magic)");
  g.version_ = r.get<std::uint32_t>("version");
  if (g.version_ != 2 && g.version_ != 3)
    r.fail("GGUF version " + std::to_string(g.version_) + " is not supported (2 or 3)");
  const std::uint64_t n_tensors = r.get<std::uint64_t>("tensor count");
  const std::uint64_t n_kv = r.get<std::uint64_t>("metadata count");
  if (n_tensors > kMaxTensors)
    r.fail("tensor count " + std::to_string(n_tensors) + " is implausible");
  if (n_kv > kMaxKv) r.fail("metadata count " + std::to_string(n_kv) + " is implausible");
  for (std::uint64_t i = 0; i < n_kv; ++i) {
    std::string key = r.str("metadata key");
    const std::uint32_t type = r.get<std::uint32_t>("metadata type");
    GgufValue v = read_value(r, type, key);
    if (!g.kv_.emplace(key, std::move(v)).second)
      r.fail("metadata key '" + key + "' appears twice");
  }
  std::map<std::string, std::size_t> seen;
  for (std::uint64_t i = 0; i < n_tensors; ++i) {
    GgufTensor t;
    t.name = r.str("tensor name");
    const std::uint32_t nd = r.get<std::uint32_t>("tensor dims");
    if (nd == 0 || nd > kMaxDims)
      r.fail("tensor '" + t.name + "': " + std::to_string(nd) + " dimensions");
    std::uint64_t elements = 1;
    for (std::uint32_t d = 0; d < nd; ++d) {
      const std::uint64_t e = r.get<std::uint64_t>("tensor dimension");
      if (e == 0 || e > (1ull << 40) || elements > (1ull << 40) / e)
        r.fail("tensor '" + t.name + "': dimension " + std::to_string(e) + " is out of range");
      elements *= e;
      t.ne.push_back(e);
    }
    t.type = r.get<std::uint32_t>("tensor type");
    t.offset = r.get<std::uint64_t>("tensor offset");
    std::uint64_t bb = 0, bv = 0;
    block_shape(t.type, bb, bv);
    if (bb == 0)
      r.fail("tensor '" + t.name + "': ggml type " + std::to_string(t.type) +
             " is not supported (f32, f16, bf16, q8_0, q4_0, q4_1)");
    if (t.ne[0] % bv != 0)
      r.fail("tensor '" + t.name + "': row of " + std::to_string(t.ne[0]) +
             " values is not a whole number of " + ggml_type_name(t.type) + " blocks");
    t.bytes = elements / bv * bb;
    if (!seen.emplace(t.name, i).second) r.fail("tensor '" + t.name + "' appears twice");
    g.tensors_.push_back(std::move(t));
  }
  std::uint64_t alignment = 32;
  if (g.has("general.alignment")) {
    const std::int64_t a = g.get_int("general.alignment");
    if (a < 1 || a > (1 << 20) || (a & (a - 1)) != 0)
      r.fail("general.alignment " + std::to_string(a) + " is not a power of two");
    alignment = static_cast<std::uint64_t>(a);
  }
  g.data_start_ = (r.pos() + alignment - 1) / alignment * alignment;
  const std::uint64_t size = g.bytes_.size();
  if (g.data_start_ > size) r.fail("truncated: no data section");
  for (const GgufTensor &t : g.tensors_) {
    if (t.offset % alignment != 0)
      r.fail("tensor '" + t.name + "': offset " + std::to_string(t.offset) + " is not aligned");
    if (t.offset > size - g.data_start_ || t.bytes > size - g.data_start_ - t.offset)
      r.fail("truncated: tensor '" + t.name + "' (" + std::to_string(t.bytes) +
             " bytes at offset " + std::to_string(t.offset) + ") runs past the end of the file");
  }
  return g;
}

std::int64_t GgufFile::get_int(const std::string &key) const {
  const auto it = kv_.find(key);
  if (it == kv_.end())
    throw RunnerError("GGUF file '" + path_ + "': metadata '" + key + "' is missing");
  if (it->second.kind != GgufValue::Kind::Int)
    throw RunnerError("GGUF file '" + path_ + "': metadata '" + key + "' is not an integer");
  return it->second.i;
}

double GgufFile::get_float(const std::string &key) const {
  const auto it = kv_.find(key);
  if (it == kv_.end())
    throw RunnerError("GGUF file '" + path_ + "': metadata '" + key + "' is missing");
  if (it->second.kind == GgufValue::Kind::Int) return double(it->second.i);
  if (it->second.kind != GgufValue::Kind::Float)
    throw RunnerError("GGUF file '" + path_ + "': metadata '" + key + "' is not a number");
  return it->second.f;
}

bool GgufFile::get_bool(const std::string &key, bool fallback) const {
  const auto it = kv_.find(key);
  if (it == kv_.end()) return fallback;
  if (it->second.kind != GgufValue::Kind::Bool)
    throw RunnerError("GGUF file '" + path_ + "': metadata '" + key + "' is not a bool");
  return it->second.b;
}

const std::string &GgufFile::get_string(const std::string &key) const {
  const auto it = kv_.find(key);
  if (it == kv_.end())
    throw RunnerError("GGUF file '" + path_ + "': metadata '" + key + "' is missing");
  if (it->second.kind != GgufValue::Kind::String)
    throw RunnerError("GGUF file '" + path_ + "': metadata '" + key + "' is not a string");
  return it->second.s;
}

const std::vector<std::string> &GgufFile::get_strings(const std::string &key) const {
  const auto it = kv_.find(key);
  if (it == kv_.end())
    throw RunnerError("GGUF file '" + path_ + "': metadata '" + key + "' is missing");
  if (it->second.kind != GgufValue::Kind::StringArray)
    throw RunnerError("GGUF file '" + path_ + "': metadata '" + key +
                      "' is not an array of strings");
  return it->second.strings;
}

const GgufTensor *GgufFile::find(const std::string &name) const {
  for (const GgufTensor &t : tensors_)
    if (t.name == name) return &t;
  return nullptr;
}

const GgufTensor &GgufFile::require(const std::string &name,
                                    const std::vector<std::uint64_t> &ne) const {
  const GgufTensor *t = find(name);
  if (t == nullptr)
    throw RunnerError("GGUF file '" + path_ + "': tensor '" + name + "' is missing");
  if (t->ne != ne) {
    auto dims = [](const std::vector<std::uint64_t> &v) {
      std::string s = "[";
      for (std::size_t i = 0; i < v.size(); ++i) s += (i ? ", " : "") + std::to_string(v[i]);
      return s + "]";
    };
    throw RunnerError("GGUF file '" + path_ + "': tensor '" + name + "' has dimensions " +
                      dims(t->ne) + ", the metadata implies " + dims(ne));
  }
  return *t;
}

void GgufFile::dequantize_into(const GgufTensor &t, std::vector<float> &out) const {
  const std::uint8_t *p = bytes_.data() + data_start_ + t.offset;
  const std::uint64_t n = t.elements();
  const std::size_t base = out.size();
  out.resize(base + static_cast<std::size_t>(n));
  float *o = out.data() + base;
  auto f16 = [](const std::uint8_t *q) {
    std::uint16_t h;
    std::memcpy(&h, q, 2);
    return half_to_float(h);
  };
  switch (static_cast<GgmlType>(t.type)) {
    case GgmlType::F32:
      std::memcpy(o, p, n * 4);
      return;
    case GgmlType::F16:
      for (std::uint64_t i = 0; i < n; ++i) o[i] = f16(p + 2 * i);
      return;
    case GgmlType::BF16:
      for (std::uint64_t i = 0; i < n; ++i) {
        std::uint16_t h;
        std::memcpy(&h, p + 2 * i, 2);
        const std::uint32_t bits = std::uint32_t(h) << 16;
        std::memcpy(o + i, &bits, 4);
      }
      return;
    case GgmlType::Q8_0:  // {f16 d; i8 q[32]}: x = d q
      for (std::uint64_t b = 0; b < n / 32; ++b, p += 34) {
        const float d = f16(p);
        for (int j = 0; j < 32; ++j)
          o[b * 32 + j] = d * static_cast<float>(static_cast<std::int8_t>(p[2 + j]));
      }
      return;
    case GgmlType::Q4_0:  // {f16 d; u8 qs[16]}: value j in the low nibble of qs[j], j + 16 in its
                          // high nibble; x = d (q - 8)
      for (std::uint64_t b = 0; b < n / 32; ++b, p += 18) {
        const float d = f16(p);
        for (int j = 0; j < 16; ++j) {
          o[b * 32 + j] = d * static_cast<float>((p[2 + j] & 0x0F) - 8);
          o[b * 32 + j + 16] = d * static_cast<float>((p[2 + j] >> 4) - 8);
        }
      }
      return;
    case GgmlType::Q4_1:  // {f16 d; f16 m; u8 qs[16]}: x = d q + m
      for (std::uint64_t b = 0; b < n / 32; ++b, p += 20) {
        const float d = f16(p), m = f16(p + 2);
        for (int j = 0; j < 16; ++j) {
          o[b * 32 + j] = d * static_cast<float>(p[4 + j] & 0x0F) + m;
          o[b * 32 + j + 16] = d * static_cast<float>(p[4 + j] >> 4) + m;
        }
      }
      return;
  }
  throw RunnerError("GGUF file '" + path_ + "': tensor '" + t.name + "' has unsupported type " +
                    ggml_type_name(t.type));
}

}  // namespace kvc_runner
