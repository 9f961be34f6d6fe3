// libFuzzer target: random sequences of pool API calls, valid and invalid.
//
// The input bytes are decoded into a pool geometry (small, bounded) and then
// into up to kMaxOps calls: sequence create / fork / reserve / append /
// truncate / free, gather, block tables, FlashInfer page tables, stats,
// layout and config queries, with unknown ids, NULL pointers, huge counts,
// bad layers and bad dtypes mixed in. After every call the harness checks:
//  - the status is a known kvc_status, and OK exactly when the model of the
//    pool says the call is valid (and, for reserve and copy-on-write appends,
//    when enough blocks are free);
//  - a failed call changed nothing: stats, lengths and every block table are
//    as before;
//  - the pool's visible invariants: blocks_total = free + cached + used;
//    every live sequence has, per layer, ceil(tokens / block_size) blocks;
//    the blocks held by block tables are exactly the used blocks, and those
//    held more than once are exactly the shared ones;
//  - data: gather returns, for every position written, the values last
//    written there by that sequence (forks are copy-on-write);
//  - the pool's internal Pool::check_invariants() (reached through
//    kvc::api::core_pool()) after every call;
//  - a mirror kvc::core::Pool driven with the same structural calls returns
//    the same statuses and passes Pool::check_invariants() (every block in
//    one state, reference counts = number of block tables holding a block);
//  - the prefix cache (enable with or without declared extra-key names, bad
//    declarations, lookup / attach / insert / keys with the declared count
//    of values or another): a bad declaration or a wrong count is refused
//    with KVC_ERR_INVALID_ARGUMENT (NULL names: KVC_ERR_NULL_POINTER) and
//    changes nothing (prefix counters included); the mirror declares the
//    same names in another order plus one more left empty, gets the values
//    in its own order, and must compute the same keys and hits and keep the
//    same blocks (named keys depend on the assignment, not the declaration).
// Any violation prints a description and aborts (a crash for libFuzzer, a
// failed test for fuzz_replay).
#include <algorithm>
#include <cinttypes>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "api/internal.h"
#include "api/struct_fields.h"
#include "common/error.h"
#include "core/pool.h"
#include "core/prefix_cache.h"
#include "kvcache/kvcache.h"

namespace {

constexpr int kMaxOps = 400;
constexpr uint64_t kMaxLength = 0x7fffffffu;

[[noreturn]] void failure(const char *what, int line, const std::string &detail) {
  std::fprintf(stderr, "fuzz_pool_api: line %d: %s %s (last error: \"%s\")\n", line, what,
               detail.c_str(), kvc_last_error_message());
  std::fflush(stderr);
  std::abort();
}
#define FCHECK(cond, detail)                       \
  do {                                             \
    if (!(cond)) failure(#cond, __LINE__, detail); \
  } while (0)

std::string st(kvc_status s) { return kvc_status_string(s); }

// SeqModel::tags: >= 0 the tag last written, -1 reserved and never written
// (reads as zeros), kNotModelled written by another sequence (attached
// prefix blocks; not checked).
constexpr int kNotModelled = -2;

bool known_status(kvc_status s) { return s >= KVC_OK && s <= KVC_ERR_EXCEEDS_CAPACITY; }

// The struct_size rule's oracle: a size is accepted when it is at least the
// minimum, at most KVC_STRUCT_SIZE_MAX and ends on no field of T.
template <typename T>
bool size_ok(size_t sz, size_t min_size) {
  if (sz < min_size || sz > KVC_STRUCT_SIZE_MAX) return false;
  for (const auto &f : kvc::api::StructInfo<T>::fields)
    if (sz > f.offset && sz < f.offset + f.size) return false;
  return true;
}

// kvc_<thing>_init_sized of T with a fuzzed size over guard bytes: accepted
// exactly when the oracle says so, never a byte written past the size (or at
// all when refused), struct_size = the size.
template <typename T, typename F>
void fuzz_init_sized(size_t sz, size_t min_size, F &&init, const char *what) {
  static union {
    uint64_t align;
    uint8_t b[KVC_STRUCT_SIZE_MAX + 64];
  } buf;
  std::memset(buf.b, 0xab, sizeof buf.b);
  const kvc_status r = init(reinterpret_cast<T *>(buf.b), sz);
  const bool ok = size_ok<T>(sz, min_size);
  FCHECK((r == KVC_OK) == ok,
         std::string(what) + " struct_size " + std::to_string(sz) + ": " + st(r));
  if (!ok) {
    FCHECK(r == KVC_ERR_STRUCT_SIZE, std::string(what) + ": " + st(r));
    for (uint8_t x : buf.b) FCHECK(x == 0xab, std::string(what) + " wrote on failure");
    return;
  }
  size_t got = 0;
  std::memcpy(&got, buf.b, sizeof got);
  FCHECK(got == sz, std::string(what) + ": struct_size " + std::to_string(got));
  for (size_t i = sz; i < sizeof buf.b; ++i)
    FCHECK(buf.b[i] == 0xab, std::string(what) + " wrote past struct_size");
  for (size_t i = sizeof(T); i < sz; ++i)
    FCHECK(buf.b[i] == 0, std::string(what) + ": unknown tail not zeroed");
}

class Input {
 public:
  Input(const uint8_t *p, size_t n) : p_(p), n_(n) {}
  bool empty() const { return n_ == 0; }
  uint8_t u8() {
    if (!n_) return 0;
    --n_;
    return *p_++;
  }
  uint32_t u32() {
    uint32_t v = 0;
    for (int i = 0; i < 4; ++i) v = (v << 8) | u8();
    return v;
  }
  uint64_t u64() { return (static_cast<uint64_t>(u32()) << 32) | u32(); }

 private:
  const uint8_t *p_;
  size_t n_;
};

// The harness's model of one sequence: its length and, per layer and
// position, the tag of the values last written there (-1: reserved, not written).
struct SeqModel {
  uint64_t len = 0;
  std::vector<std::vector<int>> tags;  // [layer][position]
};

using Tables = std::map<uint64_t, std::vector<std::vector<int32_t>>>;  // id -> [layer] -> blocks

float value_of(int tag, uint64_t elem) {
  // Small integers: exact in f32, f16 and bf16, so round trips compare exactly.
  return static_cast<float>(static_cast<int>((static_cast<uint64_t>(tag) * 31u + elem * 7u) % 201u) -
                            100);
}

int core_status(const std::function<void()> &f);

struct Harness {
  kvc_pool *pool = nullptr;
  std::unique_ptr<kvc::core::Pool> mirror;
  kvc_pool_config cfg{};
  uint32_t L = 0, H = 0, D = 0, BS = 0;
  uint64_t row = 0;  // elements per token (H * D)
  std::map<uint64_t, SeqModel> seqs;
  Tables tables;     // after the last call
  std::map<int32_t, int> mult;  // block id -> number of block-table entries
  kvc_stats stats{};
  // Prefix cache: off, or on with `names` declared (empty: positional); the
  // mirror declares mirror_names, where mirror_of[j] is the index in `names`
  // of its name j (-1: its extra name, always empty).
  bool prefix = false;
  std::vector<std::string> names, mirror_names;
  std::vector<int> mirror_of;

  ~Harness() { kvc_pool_destroy(pool); }

  uint64_t blocks_for(uint64_t tokens) const { return (tokens + BS - 1) / BS; }

  kvc_stats read_stats() {
    kvc_stats s;
    kvc_stats_init(&s);
    const kvc_status r = kvc_pool_stats(pool, &s);
    FCHECK(r == KVC_OK, st(r));
    return s;
  }

  // Reads every block table and checks the visible invariants.
  void snapshot_and_check(const char *after) {
    const std::string ctx = std::string("after ") + after;
    stats = read_stats();
    FCHECK(stats.blocks_total == stats.blocks_free + stats.blocks_cached + stats.blocks_used, ctx);
    FCHECK(stats.num_sequences == seqs.size(), ctx);
    tables.clear();
    mult.clear();
    for (const auto &[id, m] : seqs) {
      uint64_t len = ~0ull;
      kvc_status r = kvc_seq_length(pool, id, &len);
      FCHECK(r == KVC_OK && len == m.len, ctx + ": length of " + std::to_string(id));
      auto &t = tables[id];
      t.resize(L);
      for (uint32_t l = 0; l < L; ++l) {
        uint64_t nt = ~0ull;
        r = kvc_seq_layer_tokens(pool, id, l, &nt);
        FCHECK(r == KVC_OK && nt == m.len, ctx + ": layer tokens");
        size_t nb = 0;
        r = kvc_seq_block_table(pool, id, l, nullptr, 0, &nb);
        FCHECK(r == KVC_OK && nb == blocks_for(m.len), ctx + ": block count " + std::to_string(nb));
        t[l].assign(nb, -1);
        if (nb) {
          size_t nb2 = 0;
          r = kvc_seq_block_table(pool, id, l, t[l].data(), nb, &nb2);
          FCHECK(r == KVC_OK && nb2 == nb, ctx);
        }
        for (int32_t b : t[l]) {
          FCHECK(b >= 0 && static_cast<uint64_t>(b) < stats.blocks_total, ctx + ": block id");
          ++mult[b];
        }
      }
    }
    uint64_t shared = 0;
    for (const auto &[b, c] : mult)
      if (c >= 2) ++shared;
    FCHECK(mult.size() == stats.blocks_used,
           ctx + ": " + std::to_string(mult.size()) + " blocks in tables, " +
               std::to_string(stats.blocks_used) + " used");
    FCHECK(shared == stats.blocks_shared, ctx + ": shared blocks");
    {  // the pool's own invariants (every block in one state, reference counts)
      const std::string e = kvc::api::core_pool(pool).check_invariants();
      FCHECK(e.empty(), ctx + ": pool invariants: " + e);
    }
    if (mirror) {
      const std::string e = mirror->check_invariants();
      FCHECK(e.empty(), ctx + ": mirror pool: " + e);
      const auto ms = mirror->stats();
      FCHECK(ms.blocks_used == stats.blocks_used && ms.blocks_free == stats.blocks_free &&
                 ms.blocks_shared == stats.blocks_shared && ms.num_sequences == stats.num_sequences,
             ctx + ": mirror pool stats differ");
    }
  }

  // A failed call must leave everything as it was.
  void check_unchanged(const kvc_stats &before, const Tables &tables_before, const char *call,
                       kvc_status r) {
    const kvc_stats now = read_stats();
    FCHECK(std::memcmp(&now, &before, sizeof now) == 0,
           std::string(call) + " failed with " + st(r) + " but changed the stats");
    snapshot_and_check(call);
    FCHECK(tables == tables_before,
           std::string(call) + " failed with " + st(r) + " but changed a block table");
  }

  uint64_t free_blocks() const { return stats.blocks_free + stats.blocks_cached; }
  bool is_shared(int32_t b) const {
    auto it = mult.find(b);
    return it != mult.end() && it->second >= 2;
  }
};

int core_status(const std::function<void()> &f) {
  try {
    f();
    return 0;
  } catch (const kvc::Error &e) {
    return static_cast<int>(e.code());
  } catch (const std::bad_alloc &) {
    return KVC_ERR_OUT_OF_MEMORY;
  } catch (...) {
    return KVC_ERR_INTERNAL;
  }
}

uint64_t pick_id(Input &in) {
  const uint8_t b = in.u8();
  if (b < 232) return b % 6;
  if (b < 240) return UINT64_MAX - (b % 2);
  return in.u64();
}

uint64_t pick_count(Input &in, uint32_t bs, uint64_t cap_tokens) {
  const uint8_t b = in.u8();
  switch (b >> 4) {
    case 12: return 0;
    case 13: return bs - 1 + (b & 3);  // bs-1 .. bs+2
    case 14: return cap_tokens + (b & 1);
    case 15: {
      static const uint64_t huge[] = {UINT64_MAX, 1ull << 31, (1ull << 31) - 1, 1ull << 62,
                                      UINT64_MAX / 2, 1ull << 32, UINT64_MAX - 15, 4096};
      return huge[b & 7];
    }
    default: return 1 + b % 24;
  }
}

uint32_t pick_layer(Input &in, uint32_t L) {
  const uint8_t b = in.u8();
  if (b < 240) return b % L;
  if (b < 248) return L + (b & 3);
  return UINT32_MAX - (b & 1);
}

kvc_dtype pick_dtype(Input &in) {
  const uint8_t b = in.u8();
  if (b < 246) return static_cast<kvc_dtype>(b % 3);
  // Only 0..0x7fffffff: in C++ a kvc_dtype outside its enumerators' range is
  // undefined behaviour (UBSan's -fsanitize=enum says so); C callers may pass
  // negative values, which the cmocka tests cover.
  static const int32_t bad[] = {3, 0x7fffffff, 100, 4, 0x40000000, 1 << 20, 5, 0x7ffffffe};
  return static_cast<kvc_dtype>(bad[b & 7]);
}

bool dtype_ok(kvc_dtype d) { return d == KVC_DTYPE_F32 || d == KVC_DTYPE_F16 || d == KVC_DTYPE_BF16; }

// Rows of n tokens with the given tags, in dtype `d`.
std::vector<uint8_t> make_rows(const std::vector<int> &tags, uint64_t row, kvc_dtype d, int kv) {
  std::vector<float> f(tags.size() * row);
  for (size_t t = 0; t < tags.size(); ++t)
    for (uint64_t e = 0; e < row; ++e) f[t * row + e] = value_of(tags[t] + kv * 97, e);
  size_t es = 4;
  kvc_dtype_size(d, &es);
  std::vector<uint8_t> out(f.size() * es + 1);
  const kvc_status r = kvc_convert(f.data(), KVC_DTYPE_F32, out.data(), d, f.size());
  FCHECK(r == KVC_OK || f.empty(), "convert");
  return out;
}

// Tries invalid configurations: each must fail with a non-OK known status and leave *out alone.
void bad_configs(Input &in, const kvc_pool_config &good) {
  const uint8_t sel = in.u8();
  if (sel >= 64) return;
  struct Big {
    kvc_pool_config c;
    uint8_t extra[24];
  } big{};
  kvc_pool_config c = good;
  const kvc_pool_config *arg = &c;
  kvc_status expect = KVC_ERR_INVALID_ARGUMENT;
  switch (sel % 17) {
    case 0: c.num_layers = 0; break;
    case 1: c.head_dim = 1025 + in.u8(); break;
    case 2: c.num_q_heads = c.num_kv_heads * 2 + 1; if (c.num_kv_heads == 1) c.num_kv_heads = 2; break;
    case 3:  // both capacities given
      c.num_blocks = 1 + in.u8();
      c.capacity_bytes = 1 + in.u8();
      break;
    case 4: c.struct_size = in.u8() % 48; expect = KVC_ERR_STRUCT_SIZE; break;
    case 5:
      big.c = good;
      big.c.struct_size = sizeof big;
      big.extra[in.u8() % sizeof big.extra] = static_cast<uint8_t>(1 + in.u8() % 255);
      arg = &big.c;
      expect = KVC_ERR_UNSUPPORTED;
      break;
    case 6: c.k_dtype = static_cast<kvc_dtype>(3 + in.u8()); break;
    case 7: c.device = KVC_DEVICE_CUDA; expect = KVC_ERR_DEVICE_UNAVAILABLE; break;
    case 8:  // pre-RoPE keys without RoPE, or an unknown bit (0x4 is KVC_POOL_HEADWISE)
      c.flags = in.u8() & 1 ? KVC_POOL_PRE_ROPE_KEYS : 0x8u << (in.u8() % 29);
      break;
    case 9: c.block_size = 0; break;
    case 10: c.num_blocks = 0; c.capacity_bytes = 1; break;  // holds no block
    case 11: c.layout = static_cast<kvc_layout>(2 + in.u8()); break;
    case 12: c.num_blocks = UINT64_MAX; expect = KVC_STATUS_FORCE_32BIT; break;  // any error
    case 13:
      c.num_layers = 4096; c.num_kv_heads = 65536; c.num_q_heads = 65536; c.head_dim = 1024;
      c.block_size = 4096; c.num_blocks = 0x7fffffff; expect = KVC_STATUS_FORCE_32BIT; break;
    case 14: c.device_index = 1 + in.u8(); break;
    case 15: {  // residual rows: f32, f16, bf16 or int8 (5) only
      const uint8_t d = static_cast<uint8_t>(3 + in.u8() % 8);
      c.residual_dtype = static_cast<kvc_dtype>(d == 5 ? 99 : d);
      break;
    }
    default: arg = nullptr; expect = KVC_ERR_NULL_POINTER; break;
  }
  kvc_pool *sentinel = reinterpret_cast<kvc_pool *>(&c);
  kvc_pool *out = sentinel;
  const kvc_status r = kvc_pool_create(arg, &out);
  FCHECK(known_status(r) && r != KVC_OK, "bad config accepted, case " + std::to_string(sel % 17));
  FCHECK(expect == KVC_STATUS_FORCE_32BIT || r == expect,
         "bad config case " + std::to_string(sel % 17) + ": " + st(r) + ", expected " + st(expect));
  FCHECK(out == sentinel, "out written on failure");
  FCHECK(kvc_last_error_message()[0] != '\0', "no error message");
  FCHECK(kvc_pool_create(&good, nullptr) == KVC_ERR_NULL_POINTER, "out NULL");
}

const char *const kNameVocab[] = {"salt", "adapter", "media", "lora", "s", "salt2"};
const char *const kValueVocab[] = {"", "x", "tenant-1", "lora-7"};
const uint8_t kFuzzSeed[32] = {5, 5, 5, 5};

kvc_prefix_stats prefix_stats(kvc_pool *p) {
  kvc_prefix_stats s;
  kvc_prefix_stats_init(&s);
  const kvc_status r = kvc_prefix_get_stats(p, &s);
  FCHECK(r == KVC_OK, "prefix stats: " + st(r));
  return s;
}

// Token ids of a prompt: a small alphabet, so prompts share prefixes.
std::vector<int32_t> prompt_of(uint64_t n, uint8_t variant) {
  std::vector<int32_t> t(n);
  for (uint64_t i = 0; i < n; ++i) t[i] = static_cast<int32_t>((i * 3 + (variant & 1)) % 11);
  return t;
}

// Refused declarations of extra-key names: each fails and leaves the prefix
// cache off (the later valid enable still works).
void bad_declarations(Input &in, kvc_pool *pool) {
  const uint8_t sel = in.u8();
  if (sel >= 96) return;
  kvc_prefix_config pc;
  kvc_prefix_config_init(&pc);
  const std::string long_name(KVC_PREFIX_MAX_EXTRA_KEY_NAME_BYTES + 1 + sel % 3, 'n');
  std::vector<std::string> many(KVC_PREFIX_MAX_EXTRA_KEY_NAMES + 1 + sel % 2);
  for (size_t i = 0; i < many.size(); ++i) many[i] = "n" + std::to_string(i);
  std::vector<const char *> names = {"salt", "adapter"};
  kvc_status expect = KVC_ERR_INVALID_ARGUMENT;
  switch (sel % 6) {
    case 0:
      names.push_back("");
      break;
    case 1:
      names.push_back(long_name.c_str());
      break;
    case 2:
      names.push_back(names[in.u8() % 2]);
      break;  // declared twice
    case 3:
      names.clear();
      for (const std::string &m : many) names.push_back(m.c_str());
      break;
    case 4:
      names.insert(names.begin() + in.u8() % 3, nullptr);
      expect = KVC_ERR_NULL_POINTER;
      break;
    default:
      expect = KVC_ERR_NULL_POINTER;
      break;  // a count without an array
  }
  pc.extra_key_names = sel % 6 == 5 ? nullptr : names.data();
  pc.n_extra_key_names = static_cast<uint32_t>(names.size());
  const kvc_status r = kvc_pool_enable_prefix_cache(pool, &pc);
  FCHECK(r == expect, "bad extra-key names case " + std::to_string(sel % 6) + ": " + st(r));
  FCHECK(kvc_last_error_message()[0] != '\0', "no message");
  kvc_prefix_stats s;
  kvc_prefix_stats_init(&s);
  FCHECK(kvc_prefix_get_stats(pool, &s) == KVC_ERR_INVALID_ARGUMENT,
         "a refused enable turned the cache on");
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  Input in(data, size);
  Harness h;
  // ---- geometry: small and bounded ----
  kvc_pool_config &c = h.cfg;
  kvc_pool_config_init(&c);
  c.num_layers = 1 + in.u8() % 3;
  {
    const uint8_t b = in.u8();
    c.num_kv_heads = 1 + b % 3;
    c.num_q_heads = c.num_kv_heads * (1 + (b >> 4) % 2);
  }
  c.head_dim = 1 + in.u8() % 8;
  c.block_size = 1 + in.u8() % 8;
  const uint64_t nblocks = 1 + in.u8() % 40;
  {
    const uint8_t b = in.u8();
    c.k_dtype = static_cast<kvc_dtype>(b % 3);
    c.v_dtype = static_cast<kvc_dtype>((b >> 2) % 3);
    c.layout = (b >> 4) & 1 ? KVC_LAYOUT_HND : KVC_LAYOUT_NHD;
    c.flags = (b >> 5) & 1 ? KVC_POOL_ZERO_ON_FREE : 0u;
    if ((b >> 6) & 1) {  // capacity as a byte budget
      size_t ek = 2, ev = 2;
      kvc_dtype_size(c.k_dtype, &ek);
      kvc_dtype_size(c.v_dtype, &ev);
      // Block = K part, V part on a 16-byte boundary, stride rounded to 16 bytes.
      const uint64_t kb = uint64_t(c.block_size) * c.num_kv_heads * c.head_dim * ek;
      const uint64_t vb = uint64_t(c.block_size) * c.num_kv_heads * c.head_dim * ev;
      const uint64_t stride = (((kb + 15) / 16 * 16 + vb) + 15) / 16 * 16;
      c.capacity_bytes = nblocks * stride + (b >> 7) % stride;
    } else {
      c.num_blocks = nblocks;
    }
  }
  bad_configs(in, c);
  kvc_status r = kvc_pool_create(&c, &h.pool);
  FCHECK(r == KVC_OK, "valid config refused: " + st(r));
  h.L = c.num_layers;
  h.H = c.num_kv_heads;
  h.D = c.head_dim;
  h.BS = c.block_size;
  h.row = static_cast<uint64_t>(h.H) * h.D;
  {
    kvc::core::PoolConfig pc;
    pc.num_layers = c.num_layers;
    pc.num_q_heads = c.num_q_heads;
    pc.num_kv_heads = c.num_kv_heads;
    pc.head_dim = c.head_dim;
    pc.block_size = c.block_size;
    pc.flags = c.flags;
    pc.num_blocks = c.num_blocks;
    pc.capacity_bytes = c.capacity_bytes;
    pc.k_dtype = static_cast<kvc::DType>(c.k_dtype);
    pc.v_dtype = static_cast<kvc::DType>(c.v_dtype);
    pc.layout = static_cast<kvc::core::Layout>(c.layout);
    h.mirror = std::make_unique<kvc::core::Pool>(pc);
  }
  h.snapshot_and_check("create");
  FCHECK(h.stats.blocks_total == nblocks, "capacity");
  FCHECK(h.stats.blocks_free == nblocks, "fresh pool not all free");
  const uint64_t cap_tokens = nblocks * h.BS;
  auto &mirror = *h.mirror;

  for (int op_i = 0; op_i < kMaxOps && !in.empty(); ++op_i) {
    const kvc_stats before = h.stats;
    const Tables tables_before = h.tables;
    const uint8_t raw_op = in.u8();
    const uint8_t op = raw_op < 238 ? raw_op % 17 : 17 + raw_op % 2;  // 17, 18: the prefix cache
    const char *name = "?";
    bool must_fail = false;   // the model says the call is invalid
    bool may_fail = false;    // valid, but may run out of blocks
    r = KVC_OK;
    int mr = -1;              // the mirror's status, when the call is mirrored
    switch (op) {
      case 0: {  // create
        name = "kvc_seq_create";
        const uint64_t id = pick_id(in);
        must_fail = h.seqs.count(id) != 0;
        r = kvc_seq_create(h.pool, id);
        mr = core_status([&] { mirror.seq_create(id); });
        if (r == KVC_OK) {
          SeqModel m;
          m.tags.assign(h.L, {});
          h.seqs[id] = m;
        } else {
          FCHECK(r == KVC_ERR_SEQ_EXISTS, st(r));
        }
        break;
      }
      case 1: {  // fork
        name = "kvc_seq_fork";
        const uint64_t p = pick_id(in), ch = pick_id(in);
        must_fail = !h.seqs.count(p) || h.seqs.count(ch);
        r = kvc_seq_fork(h.pool, p, ch);
        mr = core_status([&] { mirror.seq_fork(p, ch); });
        if (r == KVC_OK) h.seqs[ch] = h.seqs[p];
        else FCHECK(r == KVC_ERR_SEQ_NOT_FOUND || r == KVC_ERR_SEQ_EXISTS, st(r));
        break;
      }
      case 2:
      case 12: {  // reserve (12: one decode step, reserve 1 and write every layer)
        name = "kvc_seq_reserve";
        const uint64_t id = pick_id(in);
        const uint64_t n = op == 12 ? 1 : pick_count(in, h.BS, cap_tokens);
        const bool with_slots = (in.u8() & 3) != 0;
        auto it = h.seqs.find(id);
        uint64_t need = 0, held_after = 0;
        if (it != h.seqs.end() && n != 0 && n <= kMaxLength - it->second.len) {
          const uint64_t len = it->second.len;
          for (uint32_t l = 0; l < h.L; ++l) {
            need += h.blocks_for(len + n) - h.blocks_for(len);
            held_after += h.blocks_for(len + n);
            if (len % h.BS && h.is_shared(h.tables[id][l].back())) ++need;
          }
        }
        // Admission: more blocks than the whole pool is "never", the rest "not now".
        const bool never = held_after > h.stats.blocks_total;
        must_fail = it == h.seqs.end() || n == 0 || n > kMaxLength - it->second.len;
        may_fail = !must_fail && need > h.free_blocks();
        std::vector<int64_t> slots;
        if (with_slots && !must_fail && !may_fail) slots.assign(h.L * n, -7);
        r = kvc_seq_reserve(h.pool, id, n, slots.empty() ? nullptr : slots.data());
        mr = core_status([&] { mirror.seq_reserve(id, n, nullptr); });
        if (r == KVC_OK) {
          SeqModel &m = it->second;
          for (uint32_t l = 0; l < h.L; ++l) m.tags[l].resize(m.len + n, -1);
          const uint64_t old = m.len;
          m.len += n;
          h.snapshot_and_check(name);
          if (!slots.empty())
            for (uint32_t l = 0; l < h.L; ++l)
              for (uint64_t i = 0; i < n; ++i) {
                const uint64_t idx = old + i;
                const int64_t expect =
                    static_cast<int64_t>(h.tables[id][l][idx / h.BS]) * h.BS + idx % h.BS;
                FCHECK(slots[l * n + i] == expect, "slot mapping");
              }
          if (op == 12) {  // write the new position in every layer
            for (uint32_t l = 0; l < h.L; ++l) {
              const int tag = in.u8();
              const std::vector<int> tg{tag};
              const auto k = make_rows(tg, h.row, KVC_DTYPE_F32, 0);
              const auto v = make_rows(tg, h.row, KVC_DTYPE_F32, 1);
              const kvc_status a = kvc_append(h.pool, id, l, old, 1, k.data(), v.data(), KVC_DTYPE_F32);
              FCHECK(a == KVC_OK, "decode-step append: " + st(a));  // new block, never shared
              const int am = core_status([&] {
                mirror.append(id, l, old, 1, k.data(), v.data(), kvc::DType::F32);
              });
              FCHECK(am == 0, "mirror append");
              m.tags[l][old] = tag;
            }
          }
        } else {
          FCHECK(r == KVC_ERR_SEQ_NOT_FOUND || r == KVC_ERR_INVALID_ARGUMENT ||
                     r == KVC_ERR_OVERFLOW || r == KVC_ERR_POOL_EXHAUSTED || r == KVC_ERR_EXCEEDS_CAPACITY, st(r));
          if (!must_fail) FCHECK(r == (never ? KVC_ERR_EXCEEDS_CAPACITY : KVC_ERR_POOL_EXHAUSTED), st(r));
        }
        break;
      }
      case 3:
      case 13: {  // append (13: every reserved, unwritten position of one layer, valid)
        name = "kvc_append";
        const uint64_t id = pick_id(in);
        uint32_t layer;
        uint64_t pos, n;
        kvc_dtype d;
        const uint8_t nulls = op == 13 ? 0 : in.u8();
        auto it = h.seqs.find(id);
        if (op == 13) {
          layer = in.u8() % h.L;
          d = static_cast<kvc_dtype>(in.u8() % 3);
          pos = 0;
          n = it == h.seqs.end() ? 1 : it->second.len;
          if (it != h.seqs.end())
            while (pos < it->second.len && it->second.tags[layer][pos] >= 0) ++pos;
          if (n > pos) n -= pos; else n = 1;
        } else {
          layer = pick_layer(in, h.L);
          pos = (in.u8() & 1) && it != h.seqs.end() ? it->second.len - std::min<uint64_t>(it->second.len, in.u8() % 8)
                                                    : pick_count(in, h.BS, cap_tokens);
          n = pick_count(in, h.BS, cap_tokens);
          d = pick_dtype(in);
        }
        const bool k_null = nulls >= 248 && (nulls & 1), v_null = nulls >= 248 && !(nulls & 1);
        const bool found = it != h.seqs.end();
        const bool range_ok = found && n != 0 && n <= it->second.len && pos <= it->second.len - n;
        must_fail = k_null || v_null || !dtype_ok(d) || !found || layer >= h.L || !range_ok;
        uint64_t cow = 0;
        if (!must_fail)
          for (uint64_t b = pos / h.BS; b <= (pos + n - 1) / h.BS; ++b)
            if (h.is_shared(h.tables[id][layer][b])) ++cow;
        may_fail = !must_fail && cow > h.free_blocks();
        // Buffers: exact size for a valid call, a small one otherwise (the
        // library must refuse before reading past it).
        const uint64_t rows = must_fail ? 1 : n;
        std::vector<int> tags(rows);
        for (auto &t : tags) t = in.u8();
        const kvc_dtype bd = dtype_ok(d) ? d : KVC_DTYPE_F32;
        const auto k = make_rows(tags, h.row, bd, 0);
        const auto v = make_rows(tags, h.row, bd, 1);
        r = kvc_append(h.pool, id, layer, pos, n, k_null ? nullptr : k.data(),
                       v_null ? nullptr : v.data(), d);
        if (!k_null && !v_null && dtype_ok(d))  // the core refuses bad ranges before reading
          mr = core_status([&] {
            mirror.append(id, layer, pos, n, k.data(), v.data(), static_cast<kvc::DType>(d));
          });
        if (r == KVC_OK) {
          for (uint64_t i = 0; i < n; ++i) it->second.tags[layer][pos + i] = tags[i];
        } else {
          FCHECK(r == KVC_ERR_NULL_POINTER || r == KVC_ERR_INVALID_ARGUMENT ||
                     r == KVC_ERR_SEQ_NOT_FOUND || r == KVC_ERR_OUT_OF_RANGE ||
                     r == KVC_ERR_NOT_RESERVED || r == KVC_ERR_POOL_EXHAUSTED, st(r));
          if (!must_fail) FCHECK(r == KVC_ERR_POOL_EXHAUSTED, st(r));
        }
        break;
      }
      case 4: {  // truncate
        name = "kvc_seq_truncate";
        const uint64_t id = pick_id(in);
        auto it = h.seqs.find(id);
        const uint64_t nl = (in.u8() & 1) && it != h.seqs.end() ? it->second.len - std::min<uint64_t>(it->second.len, in.u8() % 20)
                                                                 : pick_count(in, h.BS, cap_tokens);
        must_fail = it == h.seqs.end();
        r = kvc_seq_truncate(h.pool, id, nl);
        mr = core_status([&] { mirror.seq_truncate(id, nl); });
        if (r == KVC_OK) {
          if (nl < it->second.len) {
            it->second.len = nl;
            for (auto &t : it->second.tags) t.resize(nl);
          }
        } else {
          FCHECK(r == KVC_ERR_SEQ_NOT_FOUND, st(r));
        }
        break;
      }
      case 5: {  // free
        name = "kvc_seq_free";
        const uint64_t id = pick_id(in);
        must_fail = !h.seqs.count(id);
        r = kvc_seq_free(h.pool, id);
        mr = core_status([&] { mirror.seq_free(id); });
        if (r == KVC_OK) h.seqs.erase(id);
        else FCHECK(r == KVC_ERR_SEQ_NOT_FOUND, st(r));
        break;
      }
      case 6: {  // gather
        name = "kvc_gather";
        const uint64_t id = pick_id(in);
        const uint32_t layer = pick_layer(in, h.L);
        auto it = h.seqs.find(id);
        const bool found = it != h.seqs.end();
        uint64_t first, n;
        if ((in.u8() & 3) && found) {
          first = in.u8() % (it->second.len + 1);
          n = it->second.len - first;
        } else {
          first = pick_count(in, h.BS, cap_tokens);
          n = pick_count(in, h.BS, cap_tokens);
        }
        const kvc_dtype d = pick_dtype(in);
        const uint8_t outs = in.u8() % 8;  // bit 0: k, 1: v, 2: positions
        const bool range_ok = found && first <= it->second.len && n <= it->second.len - first;
        must_fail = outs == 0 || !found || layer >= h.L || !dtype_ok(d) || !range_ok;
        const uint64_t rows = must_fail ? 1 : n;
        std::vector<float> kf(rows * h.row + 1), vf(rows * h.row + 1);
        std::vector<int32_t> pos(rows + 1, -1);
        r = kvc_gather(h.pool, id, layer, first, n, (outs & 1) ? kf.data() : nullptr,
                       (outs & 2) ? vf.data() : nullptr, d, (outs & 4) ? pos.data() : nullptr);
        if (r == KVC_OK) {
          size_t es = 4;
          kvc_dtype_size(d, &es);
          for (int kv = 0; kv < 2; ++kv) {
            if (!(outs & (1 << kv))) continue;
            std::vector<float> back(rows * h.row + 1);
            const auto &raw = kv ? vf : kf;
            kvc_convert(raw.data(), d, back.data(), KVC_DTYPE_F32, n * h.row);
            for (uint64_t i = 0; i < n; ++i) {
              const int tag = it->second.tags[layer][first + i];
              if (tag == kNotModelled) continue;
              if (tag < 0) {  // reserved, never written: zeros, never another sequence's bytes
                for (uint64_t e = 0; e < h.row; ++e)
                  FCHECK(back[i * h.row + e] == 0.0f, std::string(kv ? "V" : "K") + " of unwritten position " +
                                                          std::to_string(first + i) + " is not zero");
                continue;
              }
              for (uint64_t e = 0; e < h.row; ++e)
                FCHECK(back[i * h.row + e] == value_of(tag + kv * 97, e),
                       std::string(kv ? "V" : "K") + " of sequence " + std::to_string(id) +
                           " layer " + std::to_string(layer) + " position " +
                           std::to_string(first + i) + " is not what it wrote");
            }
          }
          if (outs & 4)
            for (uint64_t i = 0; i < n; ++i) FCHECK(pos[i] == static_cast<int32_t>(first + i), "positions");
        } else {
          FCHECK(r == KVC_ERR_NULL_POINTER || r == KVC_ERR_INVALID_ARGUMENT ||
                     r == KVC_ERR_SEQ_NOT_FOUND || r == KVC_ERR_OUT_OF_RANGE, st(r));
        }
        break;
      }
      case 7: {  // block table
        name = "kvc_seq_block_table";
        const uint64_t id = pick_id(in);
        const uint32_t layer = pick_layer(in, h.L);
        const uint8_t b = in.u8();
        const size_t cap = b % 48;
        const bool null_ids = (b >> 6) == 1, null_n = (b >> 6) == 2 && (b & 1);
        std::vector<int32_t> ids(cap + 1, -3);
        size_t nb = 12345;
        r = kvc_seq_block_table(h.pool, id, layer, null_ids ? nullptr : ids.data(), cap,
                                null_n ? nullptr : &nb);
        auto it = h.seqs.find(id);
        must_fail = null_n || it == h.seqs.end() || layer >= h.L ||
                    (!null_ids && h.blocks_for(it->second.len) > cap);
        if (r == KVC_OK) {
          FCHECK(nb == h.tables[id][layer].size(), "n_blocks");
          if (!null_ids)
            FCHECK(std::equal(h.tables[id][layer].begin(), h.tables[id][layer].end(), ids.begin()),
                   "block ids");
        } else if (r == KVC_ERR_BUFFER_TOO_SMALL) {
          FCHECK(nb == h.tables[id][layer].size(), "n_blocks on BUFFER_TOO_SMALL");
          FCHECK(ids[0] == -3 || cap == 0, "block_ids written on BUFFER_TOO_SMALL");
        } else {
          FCHECK(r == KVC_ERR_NULL_POINTER || r == KVC_ERR_SEQ_NOT_FOUND ||
                     r == KVC_ERR_OUT_OF_RANGE, st(r));
        }
        break;
      }
      case 8: {  // FlashInfer page table of a batch
        name = "kvc_export_page_table";
        const uint32_t layer = pick_layer(in, h.L);
        const size_t n_seqs = in.u8() % 6;
        std::vector<uint64_t> ids(n_seqs + 1);
        bool all_found = true;
        size_t total = 0;
        for (size_t i = 0; i < n_seqs; ++i) {
          ids[i] = pick_id(in);
          auto it = h.seqs.find(ids[i]);
          if (it == h.seqs.end()) all_found = false;
          else total += h.blocks_for(it->second.len);
        }
        const uint8_t b = in.u8();
        const size_t cap = (b & 0x80) ? total : b % 64;
        const bool null_indices = (b & 0x60) == 0x60;
        const bool null_lpl = (b & 0x60) == 0x40 && n_seqs > 0;
        std::vector<int32_t> indptr(n_seqs + 1, -5), indices(cap + 1, -5), lpl(n_seqs + 1, -5);
        size_t n_idx = 777;
        r = kvc_export_page_table(h.pool, layer, ids.data(), n_seqs, indptr.data(),
                                  null_indices ? nullptr : indices.data(), cap,
                                  null_lpl ? nullptr : lpl.data(), &n_idx);
        must_fail = (null_indices && cap > 0) || null_lpl || layer >= h.L || !all_found ||
                    total > cap;
        if (r == KVC_OK) {
          FCHECK(n_idx == total && indptr[0] == 0, "page table");
          for (size_t i = 0; i < n_seqs; ++i) {
            const auto &t = h.tables[ids[i]][layer];
            FCHECK(static_cast<size_t>(indptr[i + 1] - indptr[i]) == t.size(), "indptr");
            FCHECK(std::equal(t.begin(), t.end(), indices.begin() + indptr[i]), "indices");
            const uint64_t len = h.seqs[ids[i]].len;
            const int32_t expect = len == 0 ? 0 : static_cast<int32_t>(len - (t.size() - 1) * h.BS);
            FCHECK(lpl[i] == expect, "last_page_len");
          }
        } else {
          FCHECK(r == KVC_ERR_NULL_POINTER || r == KVC_ERR_SEQ_NOT_FOUND ||
                     r == KVC_ERR_OUT_OF_RANGE || r == KVC_ERR_BUFFER_TOO_SMALL, st(r));
          if (r == KVC_ERR_BUFFER_TOO_SMALL) FCHECK(n_idx == total, "n_indices on BUFFER_TOO_SMALL");
        }
        break;
      }
      case 9: {  // length and layer tokens, NULL outputs
        name = "kvc_seq_length";
        const uint64_t id = pick_id(in);
        const uint32_t layer = pick_layer(in, h.L);
        const bool null_out = in.u8() < 32;
        uint64_t v = 99;
        auto it = h.seqs.find(id);
        r = kvc_seq_length(h.pool, id, null_out ? nullptr : &v);
        must_fail = null_out || it == h.seqs.end();
        if (r == KVC_OK) FCHECK(v == it->second.len, "length");
        else FCHECK(r == KVC_ERR_NULL_POINTER || r == KVC_ERR_SEQ_NOT_FOUND, st(r));
        if (must_fail) FCHECK(r != KVC_OK, "kvc_seq_length");
        v = 99;
        const kvc_status r2 = kvc_seq_layer_tokens(h.pool, id, layer, null_out ? nullptr : &v);
        const bool must2 = null_out || it == h.seqs.end() || layer >= h.L;
        FCHECK(known_status(r2) && (r2 == KVC_OK) == !must2, "kvc_seq_layer_tokens: " + st(r2));
        if (r2 == KVC_OK) FCHECK(v == it->second.len, "layer tokens");
        else FCHECK(v == 99, "output written on failure");
        break;
      }
      case 10: {  // stats with odd struct sizes, reset_peak
        name = "kvc_pool_stats";
        const uint8_t b = in.u8();
        struct {
          kvc_stats s;
          uint64_t extra[2];
        } big;
        std::memset(&big, 0xab, sizeof big);
        big.s.struct_size = (b & 0x80) ? sizeof big : b % 100;
        r = kvc_pool_stats(h.pool, (b & 0x40) && b < 0x50 ? nullptr : &big.s);
        must_fail = ((b & 0x40) && b < 0x50) || !size_ok<kvc_stats>(big.s.struct_size, 48);
        if (r == KVC_OK) {
          FCHECK(big.s.blocks_total == before.blocks_total && big.s.blocks_used == before.blocks_used,
                 "stats");
          FCHECK(big.extra[0] == 0xababababababababull, "stats wrote past sizeof(kvc_stats)");
          if (big.s.struct_size < sizeof(kvc_stats))
            FCHECK(reinterpret_cast<uint8_t *>(&big.s)[big.s.struct_size] == 0xab,
                   "stats wrote past struct_size");
        } else {
          FCHECK(r == KVC_ERR_NULL_POINTER || r == KVC_ERR_STRUCT_SIZE, st(r));
        }
        if (r == KVC_OK && b % 7 == 0) {
          FCHECK(kvc_pool_reset_peak(h.pool) == KVC_OK, "reset_peak");
          const kvc_stats s = h.read_stats();
          FCHECK(s.peak_bytes_in_use == s.bytes_in_use, "peak after reset");
          h.stats = s;
        }
        break;
      }
      case 11: {  // layout and config with odd struct sizes
        name = "kvc_pool_get_layout";
        const uint8_t b = in.u8();
        kvc_pool_layout lay;
        kvc_pool_layout_init(&lay);
        if (b & 1) lay.struct_size = b % 160;
        r = kvc_pool_get_layout(h.pool, &lay);
        must_fail = !size_ok<kvc_pool_layout>(lay.struct_size, 120);
        if (r == KVC_OK) {
          FCHECK(lay.num_blocks == h.stats.blocks_total && lay.block_stride == h.stats.bytes_per_block,
                 "layout");
        } else {
          FCHECK(r == KVC_ERR_STRUCT_SIZE, st(r));
        }
        kvc_pool_config got;
        kvc_pool_config_init(&got);
        if (b & 2) got.struct_size = b % 80;
        const kvc_status r2 = kvc_pool_get_config(h.pool, &got);
        FCHECK((r2 == KVC_OK) == size_ok<kvc_pool_config>(got.struct_size, 48),
               "kvc_pool_get_config: " + st(r2));
        if (r2 == KVC_OK) FCHECK(got.num_layers == h.L && got.num_blocks == h.stats.blocks_total, "config");
        // The sized init functions with a fuzzed size (0..sizeof + 64).
        const uint8_t which = in.u8();
        const size_t isz = in.u8() % 2 ? in.u8() * 2u : 0x10000u - 8u + in.u8() % 24u;
        switch (which % 11) {
          case 0:
            fuzz_init_sized<kvc_codec>(isz, 48, kvc_codec_init_sized, "kvc_codec_init_sized");
            break;
          case 1:
            fuzz_init_sized<kvc_pool_config>(isz, 48, kvc_pool_config_init_sized,
                                             "kvc_pool_config_init_sized");
            break;
          case 2:
            fuzz_init_sized<kvc_stats>(isz, 48, kvc_stats_init_sized, "kvc_stats_init_sized");
            break;
          case 3:
            fuzz_init_sized<kvc_pool_layout>(isz, 120, kvc_pool_layout_init_sized,
                                             "kvc_pool_layout_init_sized");
            break;
          case 4:
            fuzz_init_sized<kvc_quant_sizes>(isz, 40, kvc_quant_sizes_init_sized,
                                             "kvc_quant_sizes_init_sized");
            break;
          case 5:
            fuzz_init_sized<kvc_attention_params>(isz, 40, kvc_attention_params_init_sized,
                                                  "kvc_attention_params_init_sized");
            break;
          case 6:
            fuzz_init_sized<kvc_policy_config>(isz, 88, kvc_policy_config_init_sized,
                                               "kvc_policy_config_init_sized");
            break;
          case 7:
            fuzz_init_sized<kvc_prefix_config>(isz, 72, kvc_prefix_config_init_sized,
                                               "kvc_prefix_config_init_sized");
            break;
          case 8:
            fuzz_init_sized<kvc_prefix_stats>(isz, 80, kvc_prefix_stats_init_sized,
                                              "kvc_prefix_stats_init_sized");
            break;
          case 9:
            fuzz_init_sized<kvc_tier_config>(
                isz, 56,
                [](kvc_tier_config *c, size_t n) {
                  return kvc_tier_config_init_sized(c, KVC_TIER_HOST, n);
                },
                "kvc_tier_config_init_sized");
            break;
          default:
            fuzz_init_sized<kvc_tier_stats>(isz, 352, kvc_tier_stats_init_sized,
                                            "kvc_tier_stats_init_sized");
            break;
        }
        break;
      }
      case 14: {  // NULL pool: every call refuses it
        name = "NULL pool";
        must_fail = true;
        uint64_t v = 0;
        size_t nb = 0;
        kvc_stats s;
        kvc_stats_init(&s);
        const kvc_status all[] = {
            kvc_seq_create(nullptr, 1), kvc_seq_fork(nullptr, 1, 2), kvc_seq_truncate(nullptr, 1, 0),
            kvc_seq_free(nullptr, 1), kvc_seq_length(nullptr, 1, &v),
            kvc_seq_layer_tokens(nullptr, 1, 0, &v), kvc_seq_reserve(nullptr, 1, 1, nullptr),
            kvc_seq_block_table(nullptr, 1, 0, nullptr, 0, &nb), kvc_pool_stats(nullptr, &s),
            kvc_pool_reset_peak(nullptr)};
        for (kvc_status x : all) FCHECK(x == KVC_ERR_NULL_POINTER, st(x));
        r = KVC_ERR_NULL_POINTER;
        kvc_pool_destroy(nullptr);
        break;
      }
      case 16: {  // save a sequence and restore it under another id, the record intact or damaged
        name = "kvc_seq_restore";
        const uint64_t src = pick_id(in), dst = pick_id(in);
        const uint8_t damage = in.u8();
        size_t size = 0;
        const kvc_status rs = kvc_seq_save(h.pool, src, nullptr, 0, &size);
        if (!h.seqs.count(src)) {
          FCHECK(rs == KVC_ERR_SEQ_NOT_FOUND, "save of a missing sequence: " + st(rs));
          must_fail = true;
          r = rs;
          break;
        }
        // Unwritten positions travel as such (record format 2): the copy's
        // tags below keep them -1, and gather must read them as zeros.
        FCHECK(rs == KVC_ERR_BUFFER_TOO_SMALL && size > 24, "save size query: " + st(rs));
        std::vector<uint8_t> rec(size);
        FCHECK(kvc_seq_save(h.pool, src, rec.data(), rec.size(), &size) == KVC_OK, "save");
        size_t len = rec.size();
        if (damage & 1) rec[8 + (static_cast<size_t>(in.u8()) * 131 + damage) % (rec.size() - 8)] ^= 1u << (damage >> 5);
        else if (damage & 2) len = static_cast<size_t>(in.u8()) % rec.size();
        must_fail = h.seqs.count(dst) != 0 || (damage & 3) != 0;
        may_fail = true;  // a record may need more blocks than are free
        r = kvc_seq_restore(h.pool, dst, rec.data(), len);
        mr = core_status([&] { mirror.seq_restore(dst, rec.data(), len); });
        if (r == KVC_OK) {
          h.seqs[dst] = h.seqs[src];
        } else {
          FCHECK(r == KVC_ERR_SEQ_EXISTS || r == KVC_ERR_CORRUPT || r == KVC_ERR_POOL_EXHAUSTED ||
                     r == KVC_ERR_EXCEEDS_CAPACITY, st(r));
          if (damage & 3 && !h.seqs.count(dst)) FCHECK(r == KVC_ERR_CORRUPT, "damaged record: " + st(r));
        }
        break;
      }
      case 17: {  // enable the prefix cache: bad declarations, then names (or none) in the fuzzer's
                  // order
        name = "kvc_pool_enable_prefix_cache";
        if (!h.prefix) bad_declarations(in, h.pool);
        const uint8_t b = in.u8();
        std::vector<std::string> names;
        const uint32_t k = b % 5;  // 0: positional
        for (uint32_t i = 0; i < k; ++i)
          names.push_back(kNameVocab[(b / 5 + i * (1 + in.u8() % 5)) % 6]);
        std::sort(names.begin(), names.end());
        names.erase(std::unique(names.begin(), names.end()), names.end());
        for (size_t i = names.size(); i > 1; --i) std::swap(names[i - 1], names[in.u8() % i]);
        std::vector<const char *> cn;
        for (const std::string &n : names) cn.push_back(n.c_str());
        kvc_prefix_config pc;
        kvc_prefix_config_init(&pc);
        pc.seed_set = 1;
        std::memcpy(pc.seed, kFuzzSeed, 32);
        pc.verify_tokens = (b >> 7) ? 0u : 1u;
        pc.extra_key_names = cn.empty() ? nullptr : cn.data();
        pc.n_extra_key_names = static_cast<uint32_t>(cn.size());
        must_fail = h.prefix;  // once per pool
        r = kvc_pool_enable_prefix_cache(h.pool, &pc);
        // The mirror: the names rotated, plus one more that calls leave empty.
        kvc::core::PrefixConfig mc;
        mc.seed_set = true;
        std::memcpy(mc.seed, kFuzzSeed, 32);
        mc.verify_tokens = pc.verify_tokens != 0;
        std::vector<int> of;
        if (!names.empty()) {
          const size_t rot = in.u8() % names.size();
          for (size_t j = 0; j < names.size(); ++j) {
            of.push_back(static_cast<int>((j + rot) % names.size()));
            mc.extra_key_names.push_back(names[(j + rot) % names.size()]);
          }
          mc.extra_key_names.push_back("zz-unused");
          of.push_back(-1);
        }
        mr = core_status([&] { mirror.prefix().enable(mc); });
        if (r == KVC_OK) {
          h.prefix = true;
          h.names = names;
          h.mirror_names = mc.extra_key_names;
          h.mirror_of = of;
        } else {
          FCHECK(r == KVC_ERR_INVALID_ARGUMENT && h.prefix, st(r));
        }
        break;
      }
      case 18: {  // lookup / attach / insert / keys with the declared count of values, or another
        const uint8_t b = in.u8();
        const uint32_t what = b % 4;
        name = what == 0   ? "kvc_prefix_lookup"
               : what == 1 ? "kvc_prefix_attach"
               : what == 2 ? "kvc_prefix_insert"
                           : "kvc_prefix_keys";
        const uint32_t declared = static_cast<uint32_t>(h.names.size());
        uint32_t nx = declared;
        const uint8_t cb = in.u8();
        if (cb >= 200)
          nx = cb % 3 == 0 ? declared + 1 : cb % 3 == 1 ? (declared ? declared - 1 : 65) : 0;
        if (h.names.empty() && cb < 200)
          nx = cb < 120 ? 0 : cb % 3;  // positional: any count up to 64
        const bool count_ok = h.names.empty() ? nx <= 64 : nx == declared;
        std::vector<kvc_prefix_extra> ex(nx);
        std::vector<int> vi(nx);
        for (uint32_t i = 0; i < nx; ++i) {
          const uint8_t u =
              i < 8 ? in.u8() : 0;  // mostly "" or "x", so assignments repeat and lookups hit
          vi[i] = u < 192 ? u % 2 : u % 4;
          ex[i] = {kValueVocab[vi[i]], std::strlen(kValueVocab[vi[i]])};
        }
        // The mirror's values: its own declaration order (positional: the same list).
        std::vector<kvc_prefix_extra> mex;
        if (h.names.empty()) {
          mex = ex;
        } else if (count_ok) {
          for (int j : h.mirror_of)
            mex.push_back(j < 0 ? kvc_prefix_extra{nullptr, 0} : ex[static_cast<size_t>(j)]);
        }
        const bool mirrored = h.prefix && count_ok;
        std::vector<kvc::core::PrefixExtra> cex;
        for (const kvc_prefix_extra &e : mex)
          cex.push_back({static_cast<const uint8_t *>(e.data), e.size});
        auto mkx = [&] {
          return mirror.prefix().extra_keys(cex.data(), static_cast<uint32_t>(cex.size()));
        };
        const kvc_prefix_stats ps_before = h.prefix ? prefix_stats(h.pool) : kvc_prefix_stats{};
        must_fail = !h.prefix || !count_ok;
        const kvc_prefix_extra *exp = nx ? ex.data() : nullptr;
        if (what == 2) {  // insert the prompt a sequence holds (or more than its length)
          const uint8_t pick = in.u8();  // mostly a live sequence
          uint64_t id = pick_id(in);
          if ((pick & 3) && !h.seqs.empty())
            id = std::next(h.seqs.begin(), pick % h.seqs.size())->first;
          auto it = h.seqs.find(id);
          const uint64_t len = it == h.seqs.end() ? 0 : it->second.len;
          const uint64_t n =
              (in.u8() & 7) ? len - std::min<uint64_t>(len, in.u8() % 3) : len + 1 + in.u8() % 3;
          const std::vector<int32_t> t = prompt_of(n, b >> 7);
          must_fail = must_fail || it == h.seqs.end() || n > len;
          // Only written blocks register: a reserved, unwritten position in a
          // full block (any layer) refuses the call.
          if (!must_fail)
            for (const auto &lt : it->second.tags)
              for (uint64_t i = 0; i < n / h.BS * h.BS && i < lt.size(); ++i) must_fail = must_fail || lt[i] == -1;
          uint64_t added = 777;
          r = kvc_prefix_insert(h.pool, id, t.data(), n, exp, nx, &added);
          if (mirrored) mr = core_status([&] { mirror.prefix().insert(id, t.data(), n, mkx()); });
          if (r != KVC_OK) FCHECK(added == 777, "insert wrote n_registered on failure");
          if (r != KVC_OK)
            FCHECK(r == KVC_ERR_INVALID_ARGUMENT || r == KVC_ERR_SEQ_NOT_FOUND ||
                       r == KVC_ERR_OUT_OF_RANGE,
                   st(r));
        } else {
          const uint64_t n = in.u8() % 40;
          const std::vector<int32_t> t = prompt_of(n, b >> 7);
          const bool partial = (b >> 6) & 1;
          kvc_prefix_result res;
          std::memset(&res, 0, sizeof res);
          res.struct_size = sizeof res;
          kvc::core::PrefixResult mres;
          if (what == 0) {
            r = kvc_prefix_lookup(h.pool, t.data(), n, exp, nx, partial ? KVC_PREFIX_PARTIAL : 0u,
                                  &res);
            if (mirrored)
              mr = core_status([&] { mres = mirror.prefix().lookup(t.data(), n, mkx(), partial); });
          } else if (what == 1) {
            const uint64_t id = pick_id(in);
            must_fail = must_fail || h.seqs.count(id) != 0;
            may_fail = partial;  // the partial copy needs a block (skipped when none is free)
            r = kvc_prefix_attach(h.pool, id, t.data(), n, exp, nx,
                                  partial ? KVC_PREFIX_PARTIAL : 0u, &res);
            if (mirrored)
              mr = core_status(
                  [&] { mres = mirror.prefix().attach(id, t.data(), n, mkx(), partial); });
            if (r == KVC_OK) {
              SeqModel m;  // what attached blocks hold is not modelled: positions unchecked
              m.len = res.hit_tokens + res.partial_tokens;
              m.tags.assign(h.L, std::vector<int>(m.len, kNotModelled));
              h.seqs[id] = m;
            } else {
              FCHECK(r == KVC_ERR_INVALID_ARGUMENT || r == KVC_ERR_SEQ_EXISTS, st(r));
            }
          } else {
            std::vector<uint8_t> keys(40 / h.BS * 32 + 32), mkeys(keys.size());
            size_t ks = 0;
            r = kvc_prefix_keys(h.pool, t.data(), n, exp, nx, keys.data(), keys.size(), &ks);
            if (mirrored)
              mr = core_status([&] { mirror.prefix().keys(t.data(), n, mkx(), mkeys.data()); });
            if (r == KVC_OK)
              FCHECK(keys == mkeys, "keys differ from the mirror's (another declaration order)");
          }
          if (r == KVC_OK && what < 2) {
            FCHECK(res.hit_tokens == mres.hit_tokens && res.partial_tokens == mres.partial_tokens,
                   "hits differ from the mirror's: " + std::to_string(res.hit_tokens) + " vs " +
                       std::to_string(mres.hit_tokens));
            FCHECK(res.hit_tokens % h.BS == 0 && (n == 0 || res.hit_tokens < n), "hit tokens");
          }
        }
        if (r == KVC_OK && h.prefix && !count_ok)
          FCHECK(false, "a wrong count of values was accepted");
        if (r != KVC_OK && h.prefix) {
          const kvc_prefix_stats ps_after = prefix_stats(h.pool);
          FCHECK(std::memcmp(&ps_after, &ps_before, sizeof ps_after) == 0,
                 std::string(name) + " failed but changed the prefix counters");
        }
        if (r == KVC_ERR_INVALID_ARGUMENT && h.prefix && !count_ok && !h.names.empty())
          FCHECK(std::strstr(kvc_last_error_message(), "extra-key names (") != nullptr,
                 "wrong-count message");
        break;
      }
      default: {  // 15: conversions and dtype sizes
        name = "kvc_convert";
        const kvc_dtype a = pick_dtype(in), b = pick_dtype(in);
        const size_t n = in.u8() % 9;
        float src[8] = {1, -2, 0.5f, 65504, -0.0f, 3, 100, -100};
        uint16_t dst[16];
        r = kvc_convert(src, KVC_DTYPE_F32, dst, b, n);
        must_fail = !dtype_ok(b);
        size_t es = 0;
        const kvc_status r2 = kvc_dtype_size(a, &es);
        FCHECK((r2 == KVC_OK) == dtype_ok(a), "dtype_size");
        FCHECK(kvc_dtype_size(a, nullptr) == KVC_ERR_NULL_POINTER, "dtype_size NULL");
        break;
      }
    }
    FCHECK(known_status(r), std::string(name) + " returned unknown status " + std::to_string(r));
    if (must_fail) FCHECK(r != KVC_OK, std::string(name) + " accepted an invalid call");
    if (!must_fail && !may_fail && op != 14)
      FCHECK(r == KVC_OK, std::string(name) + " refused a valid call: " + st(r));
    if (r != KVC_OK) FCHECK(kvc_last_error_message()[0] != '\0', std::string(name) + ": no message");
    if (mr >= 0)
      FCHECK(mr == static_cast<int>(r), std::string(name) + ": API " + st(r) + ", core " +
                                            std::to_string(mr));
    if (r != KVC_OK) h.check_unchanged(before, tables_before, name, r);
    else h.snapshot_and_check(name);
  }
  // Free everything: no block may stay used.
  for (auto it = h.seqs.begin(); it != h.seqs.end();) {
    FCHECK(kvc_seq_free(h.pool, it->first) == KVC_OK, "final free");
    FCHECK(kvc_seq_free(h.pool, it->first) == KVC_ERR_SEQ_NOT_FOUND, "double free");
    FCHECK(core_status([&] { mirror.seq_free(it->first); }) == 0, "mirror free");
    it = h.seqs.erase(it);
  }
  h.snapshot_and_check("freeing every sequence");
  FCHECK(h.stats.blocks_used == 0 && h.stats.blocks_shared == 0, "blocks still used");
  if ((c.flags & KVC_POOL_ZERO_ON_FREE) &&
      h.stats.blocks_cached ==
          0) {  // freed memory reads as zeros (cached prefix blocks keep theirs)
    kvc_pool_layout lay;
    kvc_pool_layout_init(&lay);
    FCHECK(kvc_pool_get_layout(h.pool, &lay) == KVC_OK, "layout");
    const uint8_t *p = static_cast<const uint8_t *>(lay.base);
    for (uint64_t i = 0; i < lay.num_blocks * lay.block_stride; ++i)
      FCHECK(p[i] == 0, "zero-on-free pool holds non-zero bytes after every sequence was freed");
  }
  return 0;
}
