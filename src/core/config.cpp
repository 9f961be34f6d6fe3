// A pool's configuration: the checks of kvc_pool_create (ranges, what each
// device and codec supports, overflow of every size product) and the
// fingerprint of its geometry and storage (docs/prefix-cache.md).
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <limits>

#include "codec/codec.h"
#include "common/error.h"
#include "common/le.h"
#include "core/format.h"
#include "core/pool_int.h"
#include "cuda/backend.h"

namespace kvc::core {

namespace {

constexpr uint64_t kMaxBlocks = static_cast<uint64_t>(std::numeric_limits<int32_t>::max());

bool mul_overflows(uint64_t a, uint64_t b, uint64_t *out) {
  return __builtin_mul_overflow(a, b, out);
}

void check_range(const char *name, uint64_t v, uint64_t lo, uint64_t hi) {
  if (v < lo || v > hi)
    fail(Errc::InvalidArgument,
         std::string(name) + " " + u64s(v) + ": must be " + u64s(lo) + ".." + u64s(hi));
}

}  // namespace

void validate_config(PoolConfig &c, bool check_memory) {
  check_range("num_layers", c.num_layers, 1, c.headwise_heads ? (1u << 20) : 4096u);
  check_range("num_q_heads", c.num_q_heads, 1, 65536);
  check_range("num_kv_heads", c.num_kv_heads, 1, 65536);
  check_range("head_dim", c.head_dim, 1, 1024);
  check_range("block_size", c.block_size, 1, 4096);
  {
    const int32_t rs = static_cast<int32_t>(c.rope_style);
    if (rs < 0 || rs > 2)
      fail(Errc::InvalidArgument,
           "rope_style " + std::to_string(rs) +
               ": unknown (KVC_ROPE_NONE, KVC_ROPE_INTERLEAVED or KVC_ROPE_NEOX)");
    if (c.rope_dims % 2 != 0 || c.rope_dims > c.head_dim)
      fail(Errc::InvalidArgument,
           "rope_dims " + u64s(c.rope_dims) + " must be even and at most head_dim (0: head_dim)");
    if (c.rope_style != RopeStyle::None && c.rope_dims == 0 && c.head_dim % 2 != 0)
      fail(Errc::InvalidArgument, "RoPE needs an even head_dim (or an even rope_dims)");
    if (!(c.rope_theta > 1.0 && c.rope_theta <= 1e12))
      fail(Errc::InvalidArgument, "rope_theta must be in (1, 1e12] (default 10000)");
  }
  if (c.num_q_heads % c.num_kv_heads != 0)
    fail(Errc::InvalidArgument, "num_q_heads " + u64s(c.num_q_heads) +
                                    " is not a multiple of num_kv_heads " + u64s(c.num_kv_heads));
  if (c.flags & ~(kFlagZeroOnFree | kFlagPreRopeKeys | kFlagHeadwise))
    fail(
        Errc::InvalidArgument,
        "flags 0x" +
            [&] {
              char b[16];
              std::snprintf(b, sizeof b, "%x", c.flags);
              return std::string(b);
            }() +
            ": unknown bits (known: KVC_POOL_ZERO_ON_FREE, KVC_POOL_PRE_ROPE_KEYS, "
            "KVC_POOL_HEADWISE)");
  for (int kv = 0; kv < 2; ++kv) {
    const int32_t d = static_cast<int32_t>(kv == 0 ? c.k_dtype : c.v_dtype);
    if (!dtype_is_plain(d))
      fail(Errc::InvalidArgument,
           std::string(kv == 0 ? "k_dtype " : "v_dtype ") + std::to_string(d) +
               (d >= 3 && d <= 8 ? ": fp8 and integer storage is described by a codec: set "
                                   "k_codec / v_codec (kvc_codec) instead"
                                 : ": unknown storage dtype (f32, f16 or bf16)"));
  }
  // A part's codec: plain storage folded into its dtype, a codec checked
  // (codec::validate and what a pool adds). Returns whether it is quantized.
  auto check_part = [&](codec::Spec &sp, DType plain, const std::string &name) {
    if (is_float(sp.dtype) && sp.gran == codec::Gran::None && sp.static_scale == 0.0 && !sp.asym &&
        sp.rotation_block == 0 && sp.outliers == 0) {
      sp.dtype = plain;  // plain storage
      return false;
    }
    try {
      codec::validate(sp, c.head_dim);
    } catch (const Error &e) {
      fail(e.code(), name + ": " + e.what());
    }
    if (is_float(sp.dtype)) return false;
    if (sp.gran == codec::Gran::Tensor && sp.asym)
      fail(Errc::InvalidArgument, name +
                                      ": per-tensor scales in a pool are symmetric (one scale per "
                                      "layer); use per-token or per-group scales for zero points");
    if (sp.gran == codec::Gran::Channel &&
        (sp.group > c.block_size || c.block_size % sp.group != 0))
      fail(Errc::InvalidArgument, name + ": per-channel group_size " + u64s(sp.group) +
                                      " must divide block_size " + u64s(c.block_size) +
                                      " (a group of tokens is encoded inside one block)");
    if ((static_cast<uint64_t>(c.head_dim) * bits_of(sp.dtype)) % 8 != 0)
      fail(Errc::InvalidArgument, name + ": head_dim " + u64s(c.head_dim) + " x " +
                                      std::to_string(bits_of(sp.dtype)) +
                                      " bits is not a whole number of bytes");
    if (c.layout != Layout::NHD)
      fail(Errc::Unsupported, name + ": quantized storage uses the NHD layout only");
    return true;
  };
  for (int kv = 0; kv < 2; ++kv) {
    codec::Spec &sp = kv == 0 ? c.k_codec : c.v_codec;
    DType &plain = kv == 0 ? c.k_dtype : c.v_dtype;
    if (!check_part(sp, plain, kv == 0 ? "k_codec" : "v_codec") && is_float(sp.dtype))
      plain = static_cast<DType>(sp.dtype);
  }
  // Mixed precision: each layer's codecs checked as the pool's, then what a
  // first version of per-layer formats needs (docs/codecs.md "Mixed precision").
  if (c.mixed() && c.layer_codec[0].size() == c.num_layers &&
      c.layer_codec[1].size() == c.num_layers) {
    for (int kv = 0; kv < 2; ++kv)
      for (uint32_t l = 0; l < c.num_layers; ++l) {
        codec::Spec &sp = c.layer_codec[kv][l];
        const std::string name =
            std::string(kv == 0 ? "layer_k_codecs[" : "layer_v_codecs[") + u64s(l) + "]";
        if (is_float(sp.dtype) && !dtype_is_plain(static_cast<int32_t>(sp.dtype)))
          fail(Errc::InvalidArgument, name + ": unknown storage dtype");
        if (!check_part(sp, static_cast<DType>(sp.dtype), name)) {  // plain: its dtype alone
          const DType d = static_cast<DType>(sp.dtype);
          sp = codec::Spec{};
          sp.dtype = d;
        }
      }
    bool differ = false;
    for (int kv = 0; kv < 2; ++kv) {
      const std::vector<codec::Spec> &lc = c.layer_codec[kv];
      const char *part = kv == 0 ? "keys" : "values";
      for (uint32_t l = 1; l < c.num_layers; ++l) {
        differ = differ || !same_spec(lc[l], lc[0]);
        if (is_float(lc[l].dtype) != is_float(lc[0].dtype))
          fail(Errc::Unsupported, std::string("per-layer codecs: layer ") + u64s(l) + "'s " + part +
                                      " are " + (is_float(lc[l].dtype) ? "plain" : "quantized") +
                                      " and layer 0's are not: in this version every layer "
                                      "quantizes a part or none does");
        if (lc[l].rotation_block != lc[0].rotation_block)
          fail(Errc::Unsupported, std::string("per-layer codecs: layer ") + u64s(l) + "'s " + part +
                                      " have another Hadamard rotation than layer 0's: in "
                                      "this version every layer rotates a part alike");
      }
      for (uint32_t l = 0; l < c.num_layers; ++l)
        if (lc[l].gran == codec::Gran::Channel)
          fail(Errc::Unsupported, std::string("per-layer codecs: layer ") + u64s(l) + "'s " + part +
                                      " have per-channel scales, which stage tokens in a "
                                      "residual arena: not with per-layer codecs in this version");
    }
    // The pool's codecs become layer 0's (what every layer shares: quantized
    // or not, the rotation).
    c.k_codec = c.layer_codec[0][0];
    c.v_codec = c.layer_codec[1][0];
    if (is_float(c.k_codec.dtype)) c.k_dtype = static_cast<DType>(c.k_codec.dtype);
    if (is_float(c.v_codec.dtype)) c.v_dtype = static_cast<DType>(c.v_codec.dtype);
    if (!differ) {  // one format after all: an ordinary pool
      c.layer_codec[0].clear();
      c.layer_codec[1].clear();
    } else {
      if (c.device == Device::CUDA)
        fail(Errc::Unsupported, "device CUDA: per-layer codecs are CPU-only in this version");
      if (c.flags & kFlagHeadwise)
        fail(Errc::Unsupported,
             "per-layer codecs and head-wise pools (KVC_POOL_HEADWISE) do not combine in this "
             "version");
    }
  } else if (c.mixed() || !c.layer_codec[1].empty()) {
    fail(Errc::InvalidArgument, "per-layer codecs: give both tables with num_layers entries each");
  }
  const bool channel =
      c.k_codec.gran == codec::Gran::Channel || c.v_codec.gran == codec::Gran::Channel;
  if (c.k_codec.gran == codec::Gran::Channel && c.v_codec.gran == codec::Gran::Channel &&
      !is_float(c.k_codec.dtype) && !is_float(c.v_codec.dtype) &&
      c.k_codec.group != c.v_codec.group)
    fail(Errc::InvalidArgument, "k_codec and v_codec are both per channel with group sizes " +
                                    u64s(c.k_codec.group) + " and " + u64s(c.v_codec.group) +
                                    ": they must be equal (tokens are encoded a group at a time)");
  // (Attention sinks alone make a residual arena too: every token passes
  // through it, aged by the append that writes it.)
  const bool wants_residual =
      c.residual_window > 0 || c.residual_fraction != 0.0 || channel || c.residual_sinks > 0;
  if (!(c.residual_fraction >= 0.0 && c.residual_fraction < 1.0))
    fail(Errc::InvalidArgument, "residual_fraction must be in [0, 1)");
  if (c.residual_window > kMaxLength) fail(Errc::InvalidArgument, "residual_window above 2^31-1");
  if (!dtype_is_plain(static_cast<int32_t>(c.residual_dtype)) && c.residual_dtype != DType::INT8)
    fail(Errc::InvalidArgument, "residual_dtype " +
                                    std::to_string(static_cast<int32_t>(c.residual_dtype)) +
                                    ": must be f32, f16, bf16 or int8");
  if (wants_residual && is_float(c.k_codec.dtype) && is_float(c.v_codec.dtype))
    fail(Errc::InvalidArgument,
         c.residual_sinks && !c.residual_window && c.residual_fraction == 0.0
             ? "residual_sinks needs a quantized K or V codec (the sinks are kept "
               "from being encoded)"
             : "a residual window needs a quantized K or V codec");
  if (!wants_residual && c.num_residual_blocks != 0)
    fail(Errc::InvalidArgument, "num_residual_blocks set without a residual window");
  if (c.residual_sinks > c.block_size)
    fail(Errc::InvalidArgument,
         "residual_sinks " + u64s(c.residual_sinks) + " above block_size " + u64s(c.block_size));
  if (c.flags & kFlagPreRopeKeys) {
    if (c.rope_style == RopeStyle::None)
      fail(Errc::InvalidArgument,
           "KVC_POOL_PRE_ROPE_KEYS needs the RoPE the engine applies to keys (rope_style, "
           "rope_dims, rope_theta)");
    if (is_float(c.k_codec.dtype))
      fail(Errc::InvalidArgument,
           "KVC_POOL_PRE_ROPE_KEYS applies to quantized keys: set a k_codec with an fp8 or "
           "integer dtype");
    if (c.device == Device::CUDA)
      fail(Errc::Unsupported,
           "device CUDA: pre-RoPE keys (KVC_POOL_PRE_ROPE_KEYS) are CPU-only in this version");
  }
  if (c.layout != Layout::NHD && c.layout != Layout::HND)
    fail(Errc::InvalidArgument,
         "layout " + std::to_string(static_cast<int32_t>(c.layout)) + ": must be NHD or HND");
  if (c.device != Device::CPU && c.device != Device::CUDA)
    fail(Errc::InvalidArgument,
         "device " + std::to_string(static_cast<int32_t>(c.device)) + ": unknown device");
  if (c.device == Device::CPU && c.device_index != 0)
    fail(Errc::InvalidArgument,
         "device_index " + std::to_string(c.device_index) + ": must be 0 for the CPU");
  if (c.device == Device::CUDA) {
    if (!cuda::Device::compiled())
      fail(Errc::DeviceUnavailable,
           "device CUDA: this build of libkvcache has no CUDA backend (built without nvcc or with "
           "KVC_CUDA=OFF)");
    if (c.device_index < 0)
      fail(Errc::InvalidArgument,
           "device_index " + std::to_string(c.device_index) + ": must be >= 0");
    // What the kernels support (cuda/*.cu): a token's row in shared
    // memory, head rows of up to 256 values read 8 at a time (or up to 32
    // one at a time), no residual arena.
    if (wants_residual)
      fail(Errc::Unsupported,
           "device CUDA: residual windows, hybrid precision and per-channel (KIVI) keys "
           "are CPU-only in this version");
    if (c.k_codec.full_range || c.v_codec.full_range)
      fail(Errc::Unsupported,
           "device CUDA: full-range symmetric codecs (kvc_codec.full_range) are CPU-only "
           "in this version");
    if (c.k_codec.outliers || c.v_codec.outliers)
      fail(Errc::Unsupported,
           "device CUDA: codec outliers (kvc_codec.outliers) are CPU-only in this version");
    if (c.k_codec.dtype == DType::INT3 || c.v_codec.dtype == DType::INT3)
      fail(Errc::Unsupported,
           "device CUDA: int3 storage (KVC_DTYPE_INT3) is CPU-only in this version");
    if (c.head_dim > 256 || (c.head_dim % 8 != 0 && c.head_dim > 32))
      fail(Errc::Unsupported, "device CUDA: head_dim " + u64s(c.head_dim) +
                                  " is not supported (a multiple of 8 up to 256, or up to 32)");
    uint64_t groups = 1;
    for (const codec::Spec *sp : {&c.k_codec, &c.v_codec}) {
      if (sp->gran == codec::Gran::Token) groups = std::max<uint64_t>(groups, c.num_kv_heads);
      if (sp->gran == codec::Gran::Group)
        groups = std::max<uint64_t>(
            groups, (uint64_t(c.num_kv_heads) * c.head_dim + sp->group - 1) / sp->group);
    }
    if (uint64_t(c.num_kv_heads) * c.head_dim + 2 * groups > 12288)
      fail(Errc::Unsupported, "device CUDA: a token row of " +
                                  u64s(uint64_t(c.num_kv_heads) * c.head_dim) + " values and " +
                                  u64s(groups) +
                                  " scale group(s) does not fit the kernels' shared memory (row + "
                                  "2 x groups <= 12288)");
  }
  // Head-wise pools: each (layer, KV head) becomes a table of its own, stored
  // as a layer of one KV head and its group of query heads (what is refused:
  // docs/eviction.md "Head-wise pools"). Done once: a validated configuration
  // keeps headwise_heads.
  if ((c.flags & kFlagHeadwise) && c.headwise_heads == 0) {
    if (c.device == Device::CUDA)
      fail(Errc::Unsupported,
           "device CUDA: head-wise pools (KVC_POOL_HEADWISE) are CPU-only in this version");
    for (const codec::Spec *sp : {&c.k_codec, &c.v_codec})
      if (!is_float(sp->dtype) && sp->gran == codec::Gran::Tensor)
        fail(Errc::Unsupported,
             "head-wise pools (KVC_POOL_HEADWISE) take per-token, per-group or per-channel "
             "scales, not one scale per tensor");
    for (const codec::Spec *sp : {&c.k_codec, &c.v_codec})
      if (!is_float(sp->dtype) && sp->gran == codec::Gran::Group && c.head_dim % sp->group != 0)
        fail(Errc::Unsupported, "head-wise pools (KVC_POOL_HEADWISE): group_size " +
                                    u64s(sp->group) + " must divide head_dim " + u64s(c.head_dim) +
                                    " (a block holds one KV head)");
    if (c.layout != Layout::NHD)
      fail(Errc::Unsupported,
           "head-wise pools (KVC_POOL_HEADWISE) use the NHD layout (a block "
           "holds one KV head)");
    if (uint64_t(c.num_layers) * c.num_kv_heads > (uint64_t(1) << 20))
      fail(Errc::InvalidArgument,
           "head-wise pools (KVC_POOL_HEADWISE): num_layers x num_kv_heads " +
               u64s(uint64_t(c.num_layers) * c.num_kv_heads) + " above 1048576 tables");
    c.headwise_heads = c.num_kv_heads;
    c.num_layers *= c.num_kv_heads;
    c.num_q_heads /= c.num_kv_heads;
    c.num_kv_heads = 1;
  }
  // Bytes of one block of each format (K and V parts, scales and zero points
  // included; each part and the block start on 16 bytes so every element is
  // aligned): one format, or one per distinct pair of per-layer codecs.
  std::vector<FormatClass> fcls;
  {
    std::vector<uint8_t> unused;
    PoolConfig probe = c;
    probe.num_blocks = 0;
    format_classes(probe, &fcls, &unused);  // throws Overflow
  }
  // Bytes of one block per table, summed over the tables (a uniform pool:
  // num_layers x stride).
  unsigned __int128 layer_bytes = 0;
  for (const FormatClass &k : fcls)
    layer_bytes += static_cast<unsigned __int128>(k.stride) * k.layers;
  const uint64_t stride =
      fcls.size() == 1 ? fcls[0].stride : static_cast<uint64_t>(layer_bytes / c.num_layers);
  if (c.num_blocks == 0 && c.capacity_bytes == 0)
    fail(Errc::InvalidArgument, "no capacity: set num_blocks or capacity_bytes");
  if (c.num_blocks != 0 && c.capacity_bytes != 0)
    fail(Errc::InvalidArgument, "both num_blocks and capacity_bytes are set: give one");
  if (c.num_blocks == 0) {
    const unsigned __int128 n = static_cast<unsigned __int128>(c.capacity_bytes) * c.num_layers /
                                std::max<unsigned __int128>(layer_bytes, 1);
    c.num_blocks = n > kMaxBlocks ? kMaxBlocks : static_cast<uint64_t>(n);
    if (fcls.size() > 1) {
      // Per-layer formats: the largest count whose split gives every format
      // a block and fits the budget. The split's remainders may go to the
      // larger blocks or the smaller, so counts around the estimate n0 are
      // tried: a split of n takes at least n x layer_bytes / num_layers less
      // one block of each format, so no count above n0 + 1 + (the formats'
      // strides summed) x num_layers / layer_bytes fits.
      auto split_bytes = [&](uint64_t n, bool *each) {
        split_blocks(n, c.num_layers, fcls);
        unsigned __int128 bytes = 0;
        *each = true;
        for (const FormatClass &k : fcls) {
          bytes += static_cast<unsigned __int128>(k.blocks) * k.stride;
          *each = *each && k.blocks > 0;
        }
        return bytes;
      };
      unsigned __int128 strides = 0;
      for (const FormatClass &k : fcls) strides += k.stride;
      const unsigned __int128 top =
          static_cast<unsigned __int128>(c.num_blocks) + 2 +
          strides * c.num_layers / std::max<unsigned __int128>(layer_bytes, 1);
      uint64_t n = top > kMaxBlocks ? kMaxBlocks : static_cast<uint64_t>(top);
      for (; n >= fcls.size(); --n) {
        bool each = false;
        if (split_bytes(n, &each) <= c.capacity_bytes && each) break;
      }
      if (n < fcls.size()) {
        // The fewest bytes that give each format a block, for the message.
        unsigned __int128 need = 0;
        for (uint64_t m = fcls.size(); m <= c.num_layers; ++m) {
          bool each = false;
          need = split_bytes(m, &each);
          if (each) break;
        }
        fail(Errc::InvalidArgument, "capacity_bytes " + u64s(c.capacity_bytes) +
                                        " holds no block of each of the " + u64s(fcls.size()) +
                                        " per-layer block formats (the fewest blocks that give "
                                        "each one a block take " +
                                        u64s(static_cast<uint64_t>(need)) + " bytes)");
      }
      c.num_blocks = n;
      bool each = false;
      split_bytes(n, &each);  // the split of the count taken
    }
    if (c.num_blocks == 0)
      fail(Errc::InvalidArgument, "capacity_bytes " + u64s(c.capacity_bytes) +
                                      " holds no block of " + u64s(stride) + " bytes");
    c.capacity_bytes = 0;
  }
  if (c.num_blocks > kMaxBlocks)
    fail(Errc::InvalidArgument,
         "num_blocks " + u64s(c.num_blocks) + ": must be 1.." + u64s(kMaxBlocks));
  uint64_t total = 0;
  if (fcls.size() == 1) {
    if (mul_overflows(c.num_blocks, stride, &total) ||
        total > static_cast<uint64_t>(std::numeric_limits<std::ptrdiff_t>::max()))
      fail(Errc::Overflow, "num_blocks " + u64s(c.num_blocks) + " x " + u64s(stride) +
                               " bytes per block overflows the address space");
  } else {
    // Each format gets its share of the blocks (its layers' share, summing
    // to num_blocks): at least one each.
    if (c.num_blocks < fcls.size())
      fail(Errc::InvalidArgument, "num_blocks " + u64s(c.num_blocks) +
                                      ": the per-layer codecs make " + u64s(fcls.size()) +
                                      " block formats, each needs at least one block");
    split_blocks(c.num_blocks, c.num_layers, fcls);
    unsigned __int128 bytes = 0;
    for (const FormatClass &k : fcls) {
      if (k.blocks == 0)
        fail(Errc::InvalidArgument, "num_blocks " + u64s(c.num_blocks) +
                                        ": a per-layer block format of " + u64s(k.layers) + " of " +
                                        u64s(c.num_layers) +
                                        " layers gets no block (give at least num_layers blocks)");
      bytes += static_cast<unsigned __int128>(k.blocks) * k.stride;
    }
    if (bytes > static_cast<uint64_t>(std::numeric_limits<std::ptrdiff_t>::max()))
      fail(Errc::Overflow, "num_blocks " + u64s(c.num_blocks) +
                               " blocks of the per-layer formats overflow the address space");
    total = static_cast<uint64_t>(bytes);
  }
  uint64_t res_total = 0;
  if (wants_residual) {
    if (c.num_residual_blocks == 0) c.num_residual_blocks = c.num_blocks;
    if (c.num_residual_blocks > kMaxBlocks)
      fail(Errc::InvalidArgument, "num_residual_blocks " + u64s(c.num_residual_blocks) +
                                      ": must be 1.." + u64s(kMaxBlocks));
    uint64_t rs = 0, rt = 0;
    // A residual row: kv_heads x head_dim elements (int8: plus an f16 scale per KV head).
    const uint64_t elem = c.residual_dtype == DType::INT8 ? 1 : dtype_bytes(c.residual_dtype);
    const uint64_t extra = c.residual_dtype == DType::INT8 ? 2 : 0;
    if (mul_overflows(static_cast<uint64_t>(c.block_size) * c.num_kv_heads * (c.head_dim + extra),
                      2 * elem, &rs) ||
        mul_overflows(rs, c.num_residual_blocks, &rt) ||
        rt > static_cast<uint64_t>(std::numeric_limits<std::ptrdiff_t>::max()) - total)
      fail(Errc::Overflow, "residual blocks overflow the address space");
    res_total = rt;
  }
  // Block memory is mapped lazily, but the bookkeeping (about 20 bytes per
  // block) is written at create: refuse pools this machine can never hold
  // rather than let the kernel's OOM killer end the process.
  const uint64_t book = (c.num_blocks + c.num_residual_blocks) * 20;
  const long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGE_SIZE);
  if (check_memory && pages > 0 && page > 0) {
    const uint64_t phys = static_cast<uint64_t>(pages) * static_cast<uint64_t>(page);
    // CUDA blocks: device memory
    const uint64_t host = c.device == Device::CPU ? total / 2 + res_total / 2 : 0;
    if (host + book / 2 > phys / 2)
      fail(Errc::OutOfMemory, "the pool needs " + u64s(total + res_total + book) +
                                  " bytes (blocks and bookkeeping); this machine has " +
                                  u64s(phys));
  }
}

// The pool's fingerprint: geometry and storage, little-endian fields in a
// fixed order (docs/prefix-cache.md).
std::vector<uint8_t> pool_fingerprint(const PoolConfig &c) {
  std::vector<uint8_t> b;
  for (uint32_t v : {c.num_layers, c.num_q_heads, c.num_kv_heads, c.head_dim, c.block_size,
                     static_cast<uint32_t>(c.k_dtype), static_cast<uint32_t>(c.v_dtype),
                     static_cast<uint32_t>(c.layout)})
    append_le32(b, v);
  for (const codec::Spec *sp : {&c.k_codec, &c.v_codec}) {
    for (uint32_t v :
         {static_cast<uint32_t>(sp->dtype), static_cast<uint32_t>(sp->gran), sp->group,
          // bit 0: asymmetric, bit 1: full range (0 for pools without it, as before it existed)
          // bits 8..15: outliers per group (0 before they existed)
          static_cast<uint32_t>(sp->asym) | (sp->full_range ? 2u : 0u) | (sp->outliers << 8),
          static_cast<uint32_t>(sp->scale_dtype), sp->rotation_block})
      append_le32(b, v);
    append_le_f64(b, sp->static_scale);
  }
  append_le32(b, c.residual_window);
  append_le32(b, static_cast<uint32_t>(c.residual_dtype));
  append_le_f64(b, c.residual_fraction);
  // Pre-RoPE keys (absent without: older keys and records still match),
  // with the RoPE settings their codes depend on.
  if (c.flags & kFlagPreRopeKeys) {
    append_le32(b, kFlagPreRopeKeys);
    append_le32(b, static_cast<uint32_t>(c.rope_style));
    append_le32(b, c.rope_dims ? c.rope_dims : c.head_dim);
    append_le_f64(b, c.rope_theta);
  }
  // Head-wise pools (absent in token-wise ones): the tables per layer, so a
  // head-wise pool never matches a token-wise one of num_layers x heads layers.
  if (c.flags & kFlagHeadwise) {
    append_le32(b, kFlagHeadwise);
    append_le32(b, c.headwise_heads);
  }
  // Codebooks of K then V (absent without): a tag, the part and the digest
  // of its levels, so keys and records match only pools with the same ones.
  for (int kv = 0; kv < 2; ++kv)
    if (c.codebook[kv]) {
      append_le32(b, kCodebookTag);
      b.push_back(static_cast<uint8_t>(kv));
      b.insert(b.end(), c.codebook[kv]->digest, c.codebook[kv]->digest + 16);
    }
  // Per-layer codecs (absent without): a tag, then each layer's K and V
  // codec fields as above.
  if (c.mixed()) {
    append_le32(b, kMixedTag);
    for (uint32_t l = 0; l < c.num_layers; ++l)
      for (int kv = 0; kv < 2; ++kv) {
        const codec::Spec &sp = c.layer_codec[kv][l];
        for (uint32_t v :
             {static_cast<uint32_t>(sp.dtype), static_cast<uint32_t>(sp.gran), sp.group,
              static_cast<uint32_t>(sp.asym) | (sp.full_range ? 2u : 0u) | (sp.outliers << 8),
              static_cast<uint32_t>(sp.scale_dtype), sp.rotation_block})
          append_le32(b, v);
        append_le_f64(b, sp.static_scale);
      }
  }
  // Key smoothing (absent without): a tag and the digest of its arrays, so
  // keys and records match only pools that smooth with the same ones.
  if (c.k_smoothing) {
    append_le32(b, kKeySmoothingTag);
    b.insert(b.end(), c.k_smoothing->digest, c.k_smoothing->digest + 16);
  }
  return b;
}

}  // namespace kvc::core
