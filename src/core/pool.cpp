#include "core/pool.h"
#include "core/offload.h"
#include "common/scratch.h"

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <mutex>
#include <shared_mutex>
#include <new>

#include "common/fp8.h"
#include "common/error.h"

namespace kvc::core {

namespace {

constexpr uint64_t kMaxBlocks = static_cast<uint64_t>(std::numeric_limits<int32_t>::max());
constexpr uint64_t kMaxLength = static_cast<uint64_t>(std::numeric_limits<int32_t>::max());

bool mul_overflows(uint64_t a, uint64_t b, uint64_t *out) { return __builtin_mul_overflow(a, b, out); }

uint64_t align16(uint64_t x) { return (x + 15) & ~uint64_t(15); }

// The block size as a divisor: a shift and a mask when it is a power of two
// (the usual case), so the hot paths (reserve, truncate, append) pay no
// 64-bit division, which costs tens of cycles.
struct BlockDiv {
  uint64_t v;
  uint32_t shift;  // 64: not a power of two
  operator uint64_t() const { return v; }
};
BlockDiv block_div(uint64_t v) {
  const bool pow2 = (v & (v - 1)) == 0;
  return {v, pow2 ? static_cast<uint32_t>(__builtin_ctzll(v)) : 64u};
}
inline uint64_t operator/(uint64_t x, BlockDiv d) { return d.shift < 64 ? x >> d.shift : x / d.v; }
inline uint64_t operator%(uint64_t x, BlockDiv d) { return d.shift < 64 ? x & (d.v - 1) : x % d.v; }

std::string u64s(uint64_t v) { return std::to_string(v); }

void check_range(const char *name, uint64_t v, uint64_t lo, uint64_t hi) {
  if (v < lo || v > hi)
    fail(Errc::InvalidArgument,
         std::string(name) + " " + u64s(v) + ": must be " + u64s(lo) + ".." + u64s(hi));
}

// Bytes of part kv (0 = K, 1 = V) of one block; UINT64_MAX on overflow.
// Per-thread scratch rows (core/scratch.h): grown on demand, so steady-state
// appends allocate nothing; large ones are released when the API call returns.
thread_local ScratchBuffer<float> t_scratch_row, t_scratch_input;

uint64_t part_bytes(const PoolConfig &c, int kv) {
  const codec::Spec &sp = kv == 0 ? c.k_codec : c.v_codec;
  const uint64_t h = c.num_kv_heads, d = c.head_dim, bs = c.block_size;
  uint64_t row = 0, codes = 0;
  if (mul_overflows(h, d, &row)) return UINT64_MAX;
  if (is_float(sp.dtype)) {
    const uint64_t e = dtype_bytes(kv == 0 ? c.k_dtype : c.v_dtype);
    if (mul_overflows(row, e, &row) || mul_overflows(row, bs, &codes)) return UINT64_MAX;
    return codes;
  }
  if (mul_overflows(codec::row_bytes(sp.dtype, d), h, &row) || mul_overflows(row, bs, &codes))
    return UINT64_MAX;
  const uint64_t sc = scales_per_block(sp, h, d, bs) * codec::scale_bytes(sp) * (sp.asym ? 2 : 1);
  return codes + sc;
}

}  // namespace

float *scratch_f32(uint64_t n) { return t_scratch_row.get(n); }
float *scratch_input(uint64_t n) { return t_scratch_input.get(n); }

uint64_t scales_per_block(const codec::Spec &sp, uint64_t num_kv_heads, uint64_t head_dim,
                          uint64_t block_size) {
  if (sp.gran == codec::Gran::Channel) return block_size / sp.group * num_kv_heads * head_dim;
  return block_size * scales_per_token(sp, num_kv_heads, head_dim);
}

uint64_t scales_per_token(const codec::Spec &sp, uint64_t num_kv_heads, uint64_t head_dim) {
  switch (sp.gran) {
    case codec::Gran::Token: return num_kv_heads;  // one per (token, KV head)
    case codec::Gran::Group: return (num_kv_heads * head_dim + sp.group - 1) / sp.group;
    default: return 0;
  }
}

void Pool::validate(PoolConfig &c) {
  check_range("num_layers", c.num_layers, 1, 4096);
  check_range("num_q_heads", c.num_q_heads, 1, 65536);
  check_range("num_kv_heads", c.num_kv_heads, 1, 65536);
  check_range("head_dim", c.head_dim, 1, 1024);
  check_range("block_size", c.block_size, 1, 4096);
  {
    const int32_t rs = static_cast<int32_t>(c.rope_style);
    if (rs < 0 || rs > 2)
      fail(Errc::InvalidArgument, "rope_style " + std::to_string(rs) +
                                      ": unknown (KVC_ROPE_NONE, KVC_ROPE_INTERLEAVED or KVC_ROPE_NEOX)");
    if (c.rope_dims % 2 != 0 || c.rope_dims > c.head_dim)
      fail(Errc::InvalidArgument, "rope_dims " + u64s(c.rope_dims) + " must be even and at most head_dim (0: head_dim)");
    if (c.rope_style != RopeStyle::None && c.rope_dims == 0 && c.head_dim % 2 != 0)
      fail(Errc::InvalidArgument, "RoPE needs an even head_dim (or an even rope_dims)");
    if (!(c.rope_theta > 1.0 && c.rope_theta <= 1e12))
      fail(Errc::InvalidArgument, "rope_theta must be in (1, 1e12] (default 10000)");
  }
  if (c.num_q_heads % c.num_kv_heads != 0)
    fail(Errc::InvalidArgument, "num_q_heads " + u64s(c.num_q_heads) +
                                    " is not a multiple of num_kv_heads " + u64s(c.num_kv_heads));
  if (c.flags & ~(kFlagZeroOnFree | kFlagPreRopeKeys))
    fail(Errc::InvalidArgument, "flags 0x" + [&] {
      char b[16];
      std::snprintf(b, sizeof b, "%x", c.flags);
      return std::string(b);
    }() + ": unknown bits (known: KVC_POOL_ZERO_ON_FREE, KVC_POOL_PRE_ROPE_KEYS)");
  for (int kv = 0; kv < 2; ++kv) {
    const int32_t d = static_cast<int32_t>(kv == 0 ? c.k_dtype : c.v_dtype);
    if (!dtype_is_plain(d))
      fail(Errc::InvalidArgument,
           std::string(kv == 0 ? "k_dtype " : "v_dtype ") + std::to_string(d) +
               (d >= 3 && d <= 8 ? ": fp8 and integer storage is described by a codec: set "
                                   "k_codec / v_codec (kvc_codec) instead"
                                 : ": unknown storage dtype (f32, f16 or bf16)"));
  }
  for (int kv = 0; kv < 2; ++kv) {
    codec::Spec &sp = kv == 0 ? c.k_codec : c.v_codec;
    const char *name = kv == 0 ? "k_codec" : "v_codec";
    if (is_float(sp.dtype) && sp.gran == codec::Gran::None && sp.static_scale == 0.0 &&
        !sp.asym && sp.rotation_block == 0) {
      sp.dtype = static_cast<DType>(kv == 0 ? c.k_dtype : c.v_dtype);  // plain storage
      continue;
    }
    try {
      codec::validate(sp, c.head_dim);
    } catch (const Error &e) {
      fail(e.code(), std::string(name) + ": " + e.what());
    }
    if (is_float(sp.dtype)) {
      (kv == 0 ? c.k_dtype : c.v_dtype) = static_cast<DType>(sp.dtype);
      continue;
    }
    if (sp.gran == codec::Gran::Tensor && sp.asym)
      fail(Errc::InvalidArgument, std::string(name) +
                                      ": per-tensor scales in a pool are symmetric (one scale per "
                                      "layer); use per-token or per-group scales for zero points");
    if (sp.gran == codec::Gran::Channel && (sp.group > c.block_size || c.block_size % sp.group != 0))
      fail(Errc::InvalidArgument, std::string(name) + ": per-channel group_size " + u64s(sp.group) +
                                      " must divide block_size " + u64s(c.block_size) +
                                      " (a group of tokens is encoded inside one block)");
    if ((static_cast<uint64_t>(c.head_dim) * bits_of(sp.dtype)) % 8 != 0)
      fail(Errc::InvalidArgument, std::string(name) + ": head_dim " + u64s(c.head_dim) + " x " +
                                      std::to_string(bits_of(sp.dtype)) +
                                      " bits is not a whole number of bytes");
    if (c.layout != Layout::NHD)
      fail(Errc::Unsupported, std::string(name) + ": quantized storage uses the NHD layout only");
  }
  const bool channel = c.k_codec.gran == codec::Gran::Channel || c.v_codec.gran == codec::Gran::Channel;
  if (c.k_codec.gran == codec::Gran::Channel && c.v_codec.gran == codec::Gran::Channel &&
      !is_float(c.k_codec.dtype) && !is_float(c.v_codec.dtype) &&
      c.k_codec.group != c.v_codec.group)
    fail(Errc::InvalidArgument, "k_codec and v_codec are both per channel with group sizes " +
                                    u64s(c.k_codec.group) + " and " + u64s(c.v_codec.group) +
                                    ": they must be equal (tokens are encoded a group at a time)");
  // (Attention sinks alone make a residual arena too: every token passes
  // through it, aged by the append that writes it.)
  const bool wants_residual = c.residual_window > 0 || c.residual_fraction != 0.0 || channel || c.residual_sinks > 0;
  if (!(c.residual_fraction >= 0.0 && c.residual_fraction < 1.0))
    fail(Errc::InvalidArgument, "residual_fraction must be in [0, 1)");
  if (c.residual_window > kMaxLength) fail(Errc::InvalidArgument, "residual_window above 2^31-1");
  if (!dtype_is_plain(static_cast<int32_t>(c.residual_dtype)))
    fail(Errc::InvalidArgument, "residual_dtype " + std::to_string(static_cast<int32_t>(c.residual_dtype)) +
                                    ": must be f32, f16 or bf16");
  if (wants_residual && is_float(c.k_codec.dtype) && is_float(c.v_codec.dtype))
    fail(Errc::InvalidArgument, c.residual_sinks && !c.residual_window && c.residual_fraction == 0.0
                                    ? "residual_sinks needs a quantized K or V codec (the sinks are kept "
                                      "from being encoded)"
                                    : "a residual window needs a quantized K or V codec");
  if (!wants_residual && c.num_residual_blocks != 0)
    fail(Errc::InvalidArgument, "num_residual_blocks set without a residual window");
  if (c.residual_sinks > c.block_size)
    fail(Errc::InvalidArgument, "residual_sinks " + u64s(c.residual_sinks) + " above block_size " +
                                    u64s(c.block_size));
  if (c.flags & kFlagPreRopeKeys) {
    if (c.rope_style == RopeStyle::None)
      fail(Errc::InvalidArgument, "KVC_POOL_PRE_ROPE_KEYS needs the RoPE the engine applies to keys (rope_style, "
                                  "rope_dims, rope_theta)");
    if (is_float(c.k_codec.dtype))
      fail(Errc::InvalidArgument, "KVC_POOL_PRE_ROPE_KEYS applies to quantized keys: set a k_codec with an fp8 or "
                                  "integer dtype");
    if (c.device == Device::CUDA)
      fail(Errc::Unsupported, "device CUDA: pre-RoPE keys (KVC_POOL_PRE_ROPE_KEYS) are CPU-only in this version");
  }
  if (c.layout != Layout::NHD && c.layout != Layout::HND)
    fail(Errc::InvalidArgument,
         "layout " + std::to_string(static_cast<int32_t>(c.layout)) + ": must be NHD or HND");
  if (c.device != Device::CPU && c.device != Device::CUDA)
    fail(Errc::InvalidArgument,
         "device " + std::to_string(static_cast<int32_t>(c.device)) + ": unknown device");
  if (c.device == Device::CPU && c.device_index != 0)
    fail(Errc::InvalidArgument, "device_index " + std::to_string(c.device_index) +
                                    ": must be 0 for the CPU");
  if (c.device == Device::CUDA) {
    if (!cuda::Device::compiled())
      fail(Errc::DeviceUnavailable,
           "device CUDA: this build of libkvcache has no CUDA backend (built without nvcc or with KVC_CUDA=OFF)");
    if (c.device_index < 0)
      fail(Errc::InvalidArgument, "device_index " + std::to_string(c.device_index) + ": must be >= 0");
    // What the kernels support (cuda/kernels.cu): a token's row in shared
    // memory, head rows of up to 256 values read 8 at a time (or up to 32
    // one at a time), no residual arena.
    if (wants_residual)
      fail(Errc::Unsupported, "device CUDA: residual windows, hybrid precision and per-channel (KIVI) keys "
                              "are CPU-only in this version");
    if (c.k_codec.full_range || c.v_codec.full_range)
      fail(Errc::Unsupported, "device CUDA: full-range symmetric codecs (kvc_codec.full_range) are CPU-only "
                              "in this version");
    if (c.k_codec.dtype == DType::INT3 || c.v_codec.dtype == DType::INT3)
      fail(Errc::Unsupported, "device CUDA: int3 storage (KVC_DTYPE_INT3) is CPU-only in this version");
    if (c.head_dim > 256 || (c.head_dim % 8 != 0 && c.head_dim > 32))
      fail(Errc::Unsupported, "device CUDA: head_dim " + u64s(c.head_dim) +
                                  " is not supported (a multiple of 8 up to 256, or up to 32)");
    uint64_t groups = 1;
    for (const codec::Spec *sp : {&c.k_codec, &c.v_codec}) {
      if (sp->gran == codec::Gran::Token) groups = std::max<uint64_t>(groups, c.num_kv_heads);
      if (sp->gran == codec::Gran::Group)
        groups = std::max<uint64_t>(groups, (uint64_t(c.num_kv_heads) * c.head_dim + sp->group - 1) / sp->group);
    }
    if (uint64_t(c.num_kv_heads) * c.head_dim + 2 * groups > 12288)
      fail(Errc::Unsupported, "device CUDA: a token row of " + u64s(uint64_t(c.num_kv_heads) * c.head_dim) +
                                  " values and " + u64s(groups) +
                                  " scale group(s) does not fit the kernels' shared memory (row + 2 x groups <= 12288)");
  }
  // Bytes of one block (K and V parts, scales and zero points included; each
  // part and the block start on 16 bytes so every element is aligned).
  uint64_t stride = 0;
  for (int kv = 0; kv < 2; ++kv) {
    const uint64_t part = part_bytes(c, kv);
    if (part == UINT64_MAX || part > (uint64_t(1) << 60) || __builtin_add_overflow(stride, part, &stride))
      fail(Errc::Overflow, "block size in bytes overflows 64 bits");
    stride = align16(stride);
  }
  if (c.num_blocks == 0 && c.capacity_bytes == 0)
    fail(Errc::InvalidArgument, "no capacity: set num_blocks or capacity_bytes");
  if (c.num_blocks != 0 && c.capacity_bytes != 0)
    fail(Errc::InvalidArgument, "both num_blocks and capacity_bytes are set: give one");
  if (c.num_blocks == 0) {
    c.num_blocks = c.capacity_bytes / stride;
    if (c.num_blocks == 0)
      fail(Errc::InvalidArgument, "capacity_bytes " + u64s(c.capacity_bytes) +
                                      " holds no block of " + u64s(stride) + " bytes");
    c.num_blocks = std::min(c.num_blocks, kMaxBlocks);
    c.capacity_bytes = 0;
  }
  if (c.num_blocks > kMaxBlocks)
    fail(Errc::InvalidArgument,
         "num_blocks " + u64s(c.num_blocks) + ": must be 1.." + u64s(kMaxBlocks));
  uint64_t total = 0;
  if (mul_overflows(c.num_blocks, stride, &total) ||
      total > static_cast<uint64_t>(std::numeric_limits<std::ptrdiff_t>::max()))
    fail(Errc::Overflow, "num_blocks " + u64s(c.num_blocks) + " x " + u64s(stride) +
                             " bytes per block overflows the address space");
  uint64_t res_total = 0;
  if (wants_residual) {
    if (c.num_residual_blocks == 0) c.num_residual_blocks = c.num_blocks;
    if (c.num_residual_blocks > kMaxBlocks)
      fail(Errc::InvalidArgument, "num_residual_blocks " + u64s(c.num_residual_blocks) +
                                      ": must be 1.." + u64s(kMaxBlocks));
    uint64_t rs = 0, rt = 0;
    if (mul_overflows(static_cast<uint64_t>(c.block_size) * c.num_kv_heads * c.head_dim,
                      2 * dtype_bytes(c.residual_dtype), &rs) ||
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
  if (pages > 0 && page > 0) {
    const uint64_t phys = static_cast<uint64_t>(pages) * static_cast<uint64_t>(page);
    const uint64_t host = c.device == Device::CPU ? total / 2 + res_total / 2 : 0;  // CUDA blocks: device memory
    if (host + book / 2 > phys / 2)
      fail(Errc::OutOfMemory, "the pool needs " + u64s(total + res_total + book) +
                                  " bytes (blocks and bookkeeping); this machine has " + u64s(phys));
  }
}

Pool::Pool(const PoolConfig &cfg)
    : cfg_([&] {
        PoolConfig c = cfg;
        validate(c);
        return c;
      }()),
      alloc_(static_cast<uint32_t>(cfg_.num_blocks)),
      res_alloc_(static_cast<uint32_t>(cfg_.num_residual_blocks)),
      written_(cfg_.num_blocks, cfg_.block_size),
      res_written_(cfg_.num_residual_blocks, cfg_.block_size) {
  const uint64_t hd = cfg_.head_dim, h = cfg_.num_kv_heads, bs = cfg_.block_size;
  uint64_t off = 0;
  for (int kv = 0; kv < 2; ++kv) {
    PartLayout &pl = part_[kv];
    pl.spec = kv == 0 ? cfg_.k_codec : cfg_.v_codec;
    pl.quantized = !is_float(pl.spec.dtype);
    pl.offset = off;
    if (!pl.quantized) {
      const uint64_t e = dtype_bytes(static_cast<DType>(pl.spec.dtype));
      pl.codes_bytes = bs * h * hd * e;
      pl.token_stride = cfg_.layout == Layout::NHD ? h * hd * e : hd * e;
      pl.head_stride = cfg_.layout == Layout::NHD ? hd * e : bs * hd * e;
    } else {
      const uint64_t rb = codec::row_bytes(pl.spec.dtype, hd);
      pl.codes_bytes = bs * h * rb;
      pl.token_stride = h * rb;
      pl.head_stride = rb;
      pl.scales_per_token = scales_per_token(pl.spec, h, hd);
      pl.scale_bytes = codec::scale_bytes(pl.spec);
      pl.scale_offset = off + pl.codes_bytes;
      pl.scales_per_block = scales_per_block(pl.spec, h, hd, bs);
      pl.zero_offset = pl.scale_offset + pl.scales_per_block * pl.scale_bytes;
      pl.rotation_block = pl.spec.rotation_block;
      tensor_scale_[kv].reset(new std::atomic<uint32_t>[cfg_.num_layers]);
      // A static scale as stored in scale_dtype (as kvc_quantize() rounds it),
      // so pool and standalone quantizer agree.
      float fixed_scale = static_cast<float>(pl.spec.static_scale);
      if (pl.spec.scale_dtype == DType::F16) fixed_scale = f16_to_f32_scalar(f32_to_f16_scalar(fixed_scale));
      const uint32_t fixed = pl.spec.static_scale > 0.0 ? f32_bits(fixed_scale) : 0u;
      for (uint32_t l = 0; l < cfg_.num_layers; ++l) tensor_scale_[kv][l].store(fixed);
    }
    pl.bytes = part_bytes(cfg_, kv);
    off = align16(off + pl.bytes);
  }
  block_stride_ = off;
  for (int kv = 0; kv < 2; ++kv)
    if (part_[kv].quantized && part_[kv].spec.gran == codec::Gran::Channel)
      unit_ = std::max(unit_, part_[kv].spec.group);
  if (cfg_.flags & kFlagPreRopeKeys)
    pre_rope_ = std::make_unique<RopeTable>(cfg_.head_dim, cfg_.rope_dims ? cfg_.rope_dims : cfg_.head_dim,
                                            cfg_.rope_style == RopeStyle::Interleaved, cfg_.rope_theta);
  arena_bytes_ = cfg_.num_blocks * block_stride_;
  if (cfg_.device == Device::CUDA) {  // one zeroed device allocation (validate() refused residuals)
    dev_ = cuda::Device::open(cfg_.device_index, arena_bytes_, geometry());
    arena_ = dev_->arena();
    return;
  }
  // Anonymous mapping: page-aligned and zero-filled; pages are touched lazily.
  void *p = mmap(nullptr, arena_bytes_, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED)
    fail(Errc::OutOfMemory, "cannot map " + u64s(arena_bytes_) + " bytes of block memory");
  arena_ = static_cast<uint8_t *>(p);
  if (cfg_.num_residual_blocks) {
    res_stride_ = bs * h * hd * 2 * dtype_bytes(cfg_.residual_dtype);
    res_arena_bytes_ = cfg_.num_residual_blocks * res_stride_;
    void *r = mmap(nullptr, res_arena_bytes_, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (r == MAP_FAILED) {
      munmap(arena_, arena_bytes_);
      fail(Errc::OutOfMemory, "cannot map " + u64s(res_arena_bytes_) + " bytes of residual blocks");
    }
    res_arena_ = static_cast<uint8_t *>(r);
  }
}

cuda::Geometry Pool::geometry() const {
  cuda::Geometry g;
  g.kv_heads = cfg_.num_kv_heads;
  g.head_dim = cfg_.head_dim;
  g.block_size = cfg_.block_size;
  g.block_stride = block_stride_;
  for (int kv = 0; kv < 2; ++kv) {
    const PartLayout &pl = part_[kv];
    cuda::PartDesc &d = g.part[kv];
    d.dtype = static_cast<int32_t>(pl.spec.dtype);
    d.gran = static_cast<int32_t>(pl.spec.gran);
    d.group = pl.spec.group;
    d.asym = pl.spec.asym;
    d.scale_f16 = pl.spec.scale_dtype == DType::F16;
    d.rotation = pl.rotation_block;
    d.quantized = pl.quantized;
    d.offset = pl.offset, d.token_stride = pl.token_stride, d.head_stride = pl.head_stride;
    d.scale_offset = pl.scale_offset, d.zero_offset = pl.zero_offset;
    d.scales_per_token = pl.scales_per_token, d.scale_bytes = pl.scale_bytes;
    d.static_scale = pl.spec.static_scale;
  }
  return g;
}

void Pool::zero_block(int32_t b) {
  if (dev_) dev_->zero(static_cast<uint64_t>(b) * block_stride_, block_stride_);
  else std::memset(block_ptr(b), 0, block_stride_);
}

template <typename F>
void Pool::for_runs(const LayerTable &l, uint64_t idx0, uint64_t n, F &&f) const {
  const BlockDiv bs = block_div(cfg_.block_size);
  for (uint64_t done = 0; done < n;) {
    const uint64_t idx = idx0 + done;
    uint64_t run;
    if (idx < l.n_lp) {
      const uint32_t slot = static_cast<uint32_t>(idx % bs);
      run = std::min<uint64_t>({n - done, bs - slot, l.n_lp - idx});
      f(false, l.blocks[idx / bs], slot, run, done);
    } else {
      const uint64_t r = l.res_off + (idx - l.n_lp);
      const uint32_t slot = static_cast<uint32_t>(r % bs);
      run = std::min<uint64_t>(n - done, bs - slot);
      f(true, l.res_blocks[r / bs], slot, run, done);
    }
    done += run;
  }
}

void Pool::mark_written(const LayerTable &l, uint64_t idx0, uint64_t n, bool written) {
  for_runs(l, idx0, n, [&](bool res, int32_t b, uint32_t slot, uint64_t run, uint64_t) {
    SlotBits &bits = res ? res_written_ : written_;
    if (written) bits.set(b, slot, run);
    else bits.clear(b, slot, run);
  });
}

uint64_t Pool::first_unwritten(const LayerTable &l, uint64_t idx0, uint64_t n) const {
  uint64_t first = UINT64_MAX;
  for_runs(l, idx0, n, [&](bool res, int32_t b, uint32_t slot, uint64_t run, uint64_t done) {
    const SlotBits &bits = res ? res_written_ : written_;
    if (first != UINT64_MAX || bits.all(b, slot, run)) return;
    for (uint64_t i = 0; i < run; ++i)
      if (!bits.test(b, static_cast<uint32_t>(slot + i))) {
        first = idx0 + done + i;
        return;
      }
  });
  return first;
}

void Pool::zero_unwritten_rows(bool residual, int32_t b, uint32_t slot, uint64_t run, uint8_t *k_out,
                               uint8_t *v_out, uint64_t row_bytes) const {
  const SlotBits &bits = residual ? res_written_ : written_;
  if (bits.all(b, slot, run)) return;
  for (uint64_t i = 0; i < run; ++i)
    if (!bits.test(b, static_cast<uint32_t>(slot + i))) {
      if (k_out) std::memset(k_out + i * row_bytes, 0, row_bytes);
      if (v_out) std::memset(v_out + i * row_bytes, 0, row_bytes);
    }
}

template <typename F>
void Pool::for_slot_bytes(uint32_t slot, uint64_t count, F &&f) const {
  for (int kv = 0; kv < 2; ++kv) {
    const PartLayout &pl = part_[kv];
    if (!pl.quantized && cfg_.layout == Layout::HND) {
      for (uint64_t hh = 0; hh < cfg_.num_kv_heads; ++hh)
        f(pl.offset + hh * pl.head_stride + slot * pl.token_stride, count * pl.token_stride);
    } else {
      f(pl.offset + slot * pl.token_stride, count * pl.token_stride);
    }
    if (pl.quantized && pl.scales_per_token) {
      const uint64_t sb = pl.scales_per_token * pl.scale_bytes;
      f(pl.scale_offset + slot * sb, count * sb);
      if (pl.spec.asym) f(pl.zero_offset + slot * sb, count * sb);
    }
  }
}

void Pool::zero_slots(uint8_t *blk, bool residual, uint32_t slot, uint64_t count) const {
  if (!count) return;
  if (residual) {
    const uint64_t row = static_cast<uint64_t>(cfg_.num_kv_heads) * cfg_.head_dim * dtype_bytes(cfg_.residual_dtype);
    std::memset(blk + slot * row, 0, count * row);
    std::memset(blk + (cfg_.block_size + slot) * row, 0, count * row);
    return;
  }
  for_slot_bytes(slot, count, [&](uint64_t off, uint64_t len) { std::memset(blk + off, 0, len); });
}

void Pool::copy_block(int32_t dst, int32_t src) {
  written_.copy_block(dst, src);
  if (dev_) dev_->copy(static_cast<uint64_t>(dst) * block_stride_, static_cast<uint64_t>(src) * block_stride_, block_stride_);
  else std::memcpy(block_ptr(dst), block_ptr(src), block_stride_);
}

std::vector<cuda::Slot> Pool::slots_of(const LayerTable &l, uint64_t first, uint64_t n) const {
  std::vector<cuda::Slot> v(n);
  const uint64_t bs = cfg_.block_size;
  for (uint64_t i = 0; i < n; ++i)
    v[i] = static_cast<cuda::Slot>(l.blocks[(first + i) / bs]) * static_cast<cuda::Slot>(bs) + (first + i) % bs;
  return v;
}

void Pool::set_stream(void *stream) {
  if (!dev_) {
    if (stream) fail(Errc::InvalidArgument, "a CPU pool runs on the calling thread: only a NULL stream is accepted");
    return;
  }
  std::unique_lock lk(mu_);
  dev_->set_stream(stream);
}

void Pool::sync() {
  if (!dev_) return;
  const uint64_t refused = dev_->sync();
  if (refused)
    fail(Errc::NonFinite, u64s(refused) + (refused == 1 ? " append" : " appends") +
                              " since the last sync held NaN or Inf (or values too large to rotate) in a "
                              "quantized part; none of their values were written");
}

void Pool::copy_blocks(const int32_t *blocks, size_t n, void *host, bool to_host) {
  if (n && (!blocks || !host)) fail(Errc::NullPointer, "blocks or host is NULL");
  if (n > (uint64_t(1) << 40) / block_stride_) fail(Errc::Overflow, "n_blocks " + u64s(n) + " is too large");
  std::unique_lock lk(mu_);
  for (size_t i = 0; i < n; ++i)
    if (blocks[i] < 0 || static_cast<uint64_t>(blocks[i]) >= cfg_.num_blocks)
      fail(Errc::OutOfRange, "block " + std::to_string(blocks[i]) + " (index " + u64s(i) + "): the pool has " +
                                 u64s(cfg_.num_blocks) + " blocks; nothing copied");
  if (!to_host) {
    for (size_t i = 0; i < n; ++i)
      if (alloc_.refcount(blocks[i]) == 0)
        fail(Errc::InvalidArgument, "block " + std::to_string(blocks[i]) + " (index " + u64s(i) +
                                        ") is not held by any sequence (free or only cached): copy into blocks "
                                        "a sequence holds; nothing copied");
    for (size_t i = 0; i < n; ++i) prefix_drop_block(blocks[i]);  // content changes
  }
  if (!to_host)  // the engine wrote every slot of these blocks
    for (size_t i = 0; i < n; ++i) written_.set(blocks[i], 0, cfg_.block_size);
  if (dev_) dev_->copy_blocks(blocks, n, host, to_host);
  for (size_t i = 0; i < n; ++i) {
    uint8_t *h = static_cast<uint8_t *>(host) + i * block_stride_;
    if (!dev_) {
      if (to_host) std::memcpy(h, block_ptr(blocks[i]), block_stride_);
      else std::memcpy(block_ptr(blocks[i]), h, block_stride_);
    }
    // The copy out carries zeros, not an earlier owner's bytes, in the slots
    // no one wrote since the block was taken (a swap out and in keeps them so).
    // (CUDA pools zero a block on the device when it is taken, and reserved
    // slots at reserve: the device copy is clean already, and an
    // asynchronous copy must not be touched here.)
    if (to_host && !dev_ && !written_.all(blocks[i], 0, cfg_.block_size))
      for (uint32_t t = 0; t < cfg_.block_size; ++t)
        if (!written_.test(blocks[i], t)) zero_slots(h, false, t, 1);
  }
}

Pool::~Pool() {
  if (offload_) offload_->shutdown();  // the offload threads call into the pool: stopped first
  offload_.reset();
  if (dev_) {
    dev_.reset();
    return;
  }
  if (arena_) munmap(arena_, arena_bytes_);
  if (res_arena_) munmap(res_arena_, res_arena_bytes_);
}

Sequence &Pool::find(uint64_t id) {
  Sequence *s = seqs_.find(id);
  if (!s) fail(Errc::SeqNotFound, "sequence " + u64s(id) + " does not exist");
  return *s;
}
const Sequence &Pool::find(uint64_t id) const { return const_cast<Pool *>(this)->find(id); }

void Pool::check_layer(uint32_t layer) const {
  if (layer >= cfg_.num_layers)
    fail(Errc::OutOfRange,
         "layer " + u64s(layer) + ": the pool has " + u64s(cfg_.num_layers) + " layers");
}

// Like convert(), but values beyond the destination's range become its
// largest finite value (f16: +-65504; bf16: +-3.3895e38, where f32 values
// near FLT_MAX would round to Inf) instead of +-Inf, as the codecs saturate:
// a finite input never turns into Inf (and then NaN) in the residual. NaN and
// Inf (which plain parts store as written) are kept.
void convert_saturating(const void *src, DType st, void *dst, DType dt, uint64_t n) {
  if (dt == DType::F32 || st == dt) return convert(src, st, dst, dt, n);
  const float big = dt == DType::F16 ? 65504.0f : 3.38953139e38f;  // 0x7f7f as bf16
  float buf[256];
  const uint64_t es = dtype_bytes(st);
  for (uint64_t i = 0; i < n; i += 256) {
    const uint64_t m = std::min<uint64_t>(256, n - i);
    convert(static_cast<const uint8_t *>(src) + i * es, st, buf, DType::F32, m);
    // Only finite values saturate: NaN and +-Inf (plain parts accept them)
    // stay what they are (std::max(-big, NaN) would give -big).
    for (uint64_t j = 0; j < m; ++j)
      if (std::isfinite(buf[j])) buf[j] = std::min(big, std::max(-big, buf[j]));
    convert(buf, DType::F32, static_cast<uint8_t *>(dst) + i * 2, dt, m);
  }
}

uint64_t Pool::bytes_in_use() const {
  return (static_cast<uint64_t>(alloc_.num_used()) + alloc_.num_cached()) * block_stride_ +
         static_cast<uint64_t>(res_alloc_.num_used()) * res_stride_;
}

void Pool::note_usage() { peak_bytes_ = std::max(peak_bytes_, bytes_in_use()); }

int32_t Pool::take_res() {
  int32_t reclaimed;
  const int32_t b = res_alloc_.allocate(&reclaimed);
  if (b < 0) fail(Errc::Internal, "residual allocator empty after an availability check");
  res_written_.clear(b, 0, cfg_.block_size);  // a new owner has written nothing yet
  return b;
}

void Pool::release_res(int32_t b) {
  if (res_alloc_.release(b, false) && (cfg_.flags & kFlagZeroOnFree)) std::memset(res_ptr(b), 0, res_stride_);
}

int32_t Pool::cow_res(int32_t b) {
  const int32_t nb = take_res();
  std::memcpy(res_ptr(nb), res_ptr(b), res_stride_);
  res_written_.copy_block(nb, b);
  release_res(b);
  return nb;
}

uint64_t Pool::hp_target(uint64_t length) const {
  const uint64_t frac = static_cast<uint64_t>(cfg_.residual_fraction * static_cast<double>(length));
  return std::max<uint64_t>(cfg_.residual_window, frac);
}

uint32_t Pool::age_unit() const { return unit_; }

// Attention sinks (residual_sinks = S): layer l's copies of its first S
// tokens are at slots (l % per) * S + i of its sequence's sink block
// l / per, per = floor(block_size / S) layers to a residual block.
uint64_t Pool::sink_blocks_needed() const {
  if (!cfg_.residual_sinks) return 0;
  const uint64_t per = cfg_.block_size / cfg_.residual_sinks;
  return (cfg_.num_layers + per - 1) / per;
}

// Slot of layer `layer`'s first sink copy in its sink block.
uint32_t Pool::sink_slot(uint32_t layer) const {
  const uint32_t S = cfg_.residual_sinks;
  return (layer % (cfg_.block_size / S)) * S;
}

void Pool::assign_sinks(Sequence &s) const {
  const uint64_t per = cfg_.residual_sinks ? cfg_.block_size / cfg_.residual_sinks : 1;
  for (uint32_t li = 0; li < cfg_.num_layers; ++li)
    s.layers[li].sink_block = s.sink_blocks.empty() ? -1 : s.sink_blocks[li / per];
}

// Copies of tokens [idx0, idx0 + n) of a layer (rows of src from k and v),
// those below S.
void Pool::write_sinks(uint32_t layer, const LayerTable &l, uint64_t idx0, uint64_t n, const uint8_t *k,
                       const uint8_t *v, DType src) const {
  const uint64_t S = cfg_.residual_sinks;
  if (l.sink_block < 0 || idx0 >= S) return;
  write_residual(res_ptr(l.sink_block), sink_slot(layer) + static_cast<uint32_t>(idx0), k, v, src,
                 std::min(n, S - idx0));
}

// Rows of tokens [idx0, idx0 + n) read from codec blocks into k_out / v_out
// (either NULL) as dst: the encoded sinks among them are replaced by their
// copies.
void Pool::overlay_sinks(uint32_t layer, const LayerTable &l, uint64_t idx0, uint64_t n, uint8_t *k_out,
                         uint8_t *v_out, DType dst) const {
  const uint64_t S = cfg_.residual_sinks;
  if (l.sink_block < 0) return;
  const uint64_t end = std::min({idx0 + n, S, l.n_lp});
  if (idx0 >= end) return;
  read_residual(res_ptr(l.sink_block), sink_slot(layer) + static_cast<uint32_t>(idx0), end - idx0, k_out, v_out,
                dst);
}

// Rows [0, result) of `n` rows at sequence indices idx0.. are attention
// sinks with exact copies, and some rows after them are not: the rows to
// leave out of the statistics of a scale that other tokens share. 0 when
// there are no such sinks, or only sinks.
uint64_t Pool::leading_sinks(const LayerTable &l, uint64_t idx0, uint64_t n) const {
  const uint64_t S = cfg_.residual_sinks;
  if (l.sink_block < 0 || idx0 >= S || idx0 + n <= S) return 0;
  return S - idx0;
}

// Scales shared by tokens (per channel, per tensor) leave the attention
// sinks out. Readers take the sinks from their exact copies, and their keys
// are often far outside the other tokens' range (the first token's key is an
// outlier in many heads: StreamingLLM arXiv 2309.17453, KVQuant arXiv
// 2401.18079 section 3.5, which keeps it in fp16 for this reason). So a
// per-channel group's range comes from its other rows: the sink rows are
// clamped into it and their codes hold the nearest value in range.
void Pool::clamp_sinks(const LayerTable &l, uint64_t idx0, uint32_t unit, float *x, uint64_t row) const {
  const uint64_t first = leading_sinks(l, idx0, unit);
  if (!first) return;
  for (uint64_t c = 0; c < row; ++c) {
    float lo = x[first * row + c], hi = lo;
    for (uint64_t t = first + 1; t < unit; ++t) {
      lo = std::min(lo, x[t * row + c]);
      hi = std::max(hi, x[t * row + c]);
    }
    for (uint64_t t = 0; t < first; ++t) x[t * row + c] = std::clamp(x[t * row + c], lo, hi);
  }
}

// Residual blocks hold K then V, each [block_size][num_kv_heads][head_dim] of residual_dtype.
void Pool::write_residual(uint8_t *blk, uint32_t slot, const uint8_t *k, const uint8_t *v, DType src,
                          uint64_t count) const {
  const uint64_t row = static_cast<uint64_t>(cfg_.num_kv_heads) * cfg_.head_dim;
  const uint64_t e = dtype_bytes(cfg_.residual_dtype);
  convert_saturating(k, src, blk + slot * row * e, cfg_.residual_dtype, count * row);
  convert_saturating(v, src, blk + (cfg_.block_size + slot) * row * e, cfg_.residual_dtype, count * row);
}

void Pool::read_residual(const uint8_t *blk, uint32_t slot, uint64_t count, uint8_t *k_out,
                         uint8_t *v_out, DType dst) const {
  const uint64_t row = static_cast<uint64_t>(cfg_.num_kv_heads) * cfg_.head_dim;
  const uint64_t e = dtype_bytes(cfg_.residual_dtype);
  if (k_out) convert(blk + slot * row * e, cfg_.residual_dtype, k_out, dst, count * row);
  if (v_out) convert(blk + (cfg_.block_size + slot) * row * e, cfg_.residual_dtype, v_out, dst, count * row);
}

// Encodes the `count` oldest residual tokens of a layer (a multiple of
// age_unit()) into its codec blocks and frees the residual blocks they leave.
// The caller reserved the codec blocks it needs and made the last one
// private. Never throws.
void Pool::age(uint32_t layer, LayerTable &l, uint64_t count) {
  const BlockDiv bs = block_div(cfg_.block_size);
  const uint64_t row = static_cast<uint64_t>(cfg_.num_kv_heads) * cfg_.head_dim;
  const uint32_t unit = age_unit();
  float *buf = scratch_input(2 * unit * row);
  for (uint64_t done = 0; done < count; done += unit) {
    // Gather `unit` residual tokens (they may straddle two residual blocks).
    for (uint32_t t = 0; t < unit; ++t) {
      const uint64_t r = l.res_off + done + t;
      read_residual(res_ptr(l.res_blocks[r / bs]), static_cast<uint32_t>(r % bs), 1,
                    reinterpret_cast<uint8_t *>(buf + t * row),
                    reinterpret_cast<uint8_t *>(buf + (unit + t) * row), DType::F32);
      // A staged token no append wrote enters its group as zeros (no stale
      // bytes in a shared scale) and stays unwritten.
      zero_unwritten_rows(true, l.res_blocks[r / bs], static_cast<uint32_t>(r % bs), 1,
                          reinterpret_cast<uint8_t *>(buf + t * row),
                          reinterpret_cast<uint8_t *>(buf + (unit + t) * row), row * sizeof(float));
    }
    // Attention sinks keep their residual rows (exact: residual_dtype in and out).
    write_sinks(layer, l, l.n_lp + done, unit, reinterpret_cast<const uint8_t *>(buf),
                reinterpret_cast<const uint8_t *>(buf + unit * row), DType::F32);
    if (pre_rope_)  // keys before RoPE: undo it at each token's RoPE position
      for (uint32_t t = 0; t < unit; ++t)
        pre_rope_->rotate(buf + t * row, cfg_.num_kv_heads, static_cast<uint64_t>(l.rope_position_of(l.n_lp + done + t)), -1);
    for (int kv = 0; kv < 2; ++kv) {
      const PartLayout &pl = part_[kv];
      float *x = buf + kv * unit * row;
      if (pl.rotation_block)
        for (uint32_t t = 0; t < unit; ++t) codec::hadamard(x + t * row, row, pl.rotation_block);
      if (pl.quantized && pl.spec.gran == codec::Gran::Channel)
        clamp_sinks(l, l.n_lp + done, unit, x, row);
      if (pl.quantized && pl.spec.gran == codec::Gran::Tensor) {
        const uint64_t skip = leading_sinks(l, l.n_lp + done, unit);  // sinks saturate: read from their copies
        calibrate(kv, layer, x + skip * row, (unit - skip) * row);
      }
    }
    const uint64_t idx = l.n_lp + done;
    if (l.blocks.size() <= idx / bs) l.blocks.push_back(take_block());
    uint8_t *blk = block_ptr(l.blocks[idx / bs]);
    // Plain parts convert from the f32 rows; quantized parts encode them.
    for (int kv = 0; kv < 2; ++kv)
      write_part(kv, layer, blk, reinterpret_cast<const uint8_t *>(buf + kv * unit * row), DType::F32,
                 buf + kv * unit * row, static_cast<uint32_t>(idx % bs), unit);
    for (uint32_t t = 0; t < unit; ++t) {
      const uint64_t r = l.res_off + done + t;
      written_.put(l.blocks[idx / bs], static_cast<uint32_t>((idx + t) % bs),
                   res_written_.test(l.res_blocks[r / bs], static_cast<uint32_t>(r % bs)));
    }
  }
  l.n_lp += count;
  const uint64_t off = l.res_off + count;
  size_t drop = std::min(static_cast<size_t>(off / bs), l.res_blocks.size());
  if (l.n_lp == l.n_tokens) drop = l.res_blocks.size();  // nothing left in the residual
  for (size_t i = 0; i < drop; ++i) release_res(l.res_blocks[i]);
  l.res_blocks.erase(l.res_blocks.begin(), l.res_blocks.begin() + static_cast<std::ptrdiff_t>(drop));
  l.res_off = l.res_blocks.empty() ? 0 : static_cast<uint32_t>(off % bs);
}

// Tokens of a layer an append of indices [idx0, written_end) lets age now:
// none unless the append wrote the layer's newest reserved position; then
// the residual tokens beyond the window, in whole aging units, among those
// known written: every token before the layer's last reserve (as reserve()
// takes them), and the last reserve's own tokens only when this append
// covered them all (an append of its newest positions ahead of its older
// ones must not encode positions not written yet). 0 when none.
static uint64_t written_agable(const LayerTable &l, uint64_t target, uint64_t idx0, uint64_t written_end,
                               uint32_t unit) {
  const uint64_t hp = l.n_tokens - l.n_lp;
  uint64_t a = hp > target ? hp - target : 0;
  if (written_end != l.n_tokens) return 0;  // only an append of the layer's newest positions
  if (idx0 > l.reserved_at) a = std::min(a, l.reserved_at > l.n_lp ? l.reserved_at - l.n_lp : 0);
  return a - a % unit;
}

bool Pool::age_due(const Sequence &s, uint32_t layer, uint64_t idx0, uint64_t written_end) const {
  if (!residual() || dev_) return false;
  return written_agable(s.layers[layer], hp_target(s.length), idx0, written_end, age_unit()) > 0;
}

// After an append that wrote the layer's newest positions: the residual
// tokens that left the window in whole aging units are encoded now instead of
// at the next reserve, so a per-channel group (KIVI) leaves its f16 staging as
// soon as it is complete and kvc_pool_stats() reports the bytes the layer
// really needs at this length. Best effort: without the free blocks (or
// memory) it needs nothing changes, and the next reserve ages them. Caller
// holds the exclusive lock. Never throws.
void Pool::age_written(Sequence &s, uint32_t layer, uint64_t idx0, uint64_t written_end) {
  LayerTable &l = s.layers[layer];
  const BlockDiv bs = block_div(cfg_.block_size);
  const uint64_t a = written_agable(l, hp_target(s.length), idx0, written_end, age_unit());
  if (!a) return;
  const bool cow = l.n_lp % bs != 0 && alloc_.refcount(l.blocks.back()) > 1;
  const uint64_t need = (l.n_lp + a + bs - 1) / bs - l.blocks.size() + (cow ? 1 : 0);
  if (need > alloc_.available()) return;
  const size_t lp_target = static_cast<size_t>((l.n_lp + a + bs - 1) / bs);
  try {  // the block table's room and age()'s buffer, before any change
    if (l.blocks.capacity() < lp_target) l.blocks.reserve(std::max(lp_target, 2 * l.blocks.capacity()));
    scratch_input(2 * static_cast<uint64_t>(age_unit()) * cfg_.num_kv_heads * cfg_.head_dim);
  } catch (const std::bad_alloc &) {
    return;  // the write stands; the next reserve ages these tokens
  }
  // From here on nothing throws.
  if (cow) l.blocks.back() = cow_copy(l.blocks.back());
  age(layer, l, a);
  note_usage();
}

int32_t Pool::take_block() {
  int32_t reclaimed;
  const int32_t b = alloc_.allocate(&reclaimed);
  if (b < 0) fail(Errc::Internal, "block allocator empty after an availability check");
  if (reclaimed >= 0) {
    prefix_on_reclaim(reclaimed);  // a cached block leaves the prefix index
    if (cfg_.flags & kFlagZeroOnFree) zero_block(b);  // no tenant's K/V lingers
  }
  written_.clear(b, 0, cfg_.block_size);  // a new owner has written nothing yet
  if (dev_) zero_block(b);  // device kernels and copies read whole blocks: none of an earlier owner's bytes
  return b;
}

void Pool::release_block(int32_t b) {
  const bool reg = registered(b);
  if (alloc_.release(b, /*keep_cached=*/reg) && (cfg_.flags & kFlagZeroOnFree)) zero_block(b);
  if (reg && alloc_.state(b) == BlockAllocator::State::Cached) prefix_on_cached(b);
}

int32_t Pool::cow_copy(int32_t b) {
  const int32_t nb = take_block();
  copy_block(nb, b);
  release_block(b);
  return nb;
}

PoolStats Pool::stats() const {
  std::shared_lock lk(mu_);
  PoolStats s{};
  s.blocks_total = alloc_.num_blocks();
  s.blocks_free = alloc_.num_free();
  s.blocks_cached = alloc_.num_cached();
  s.blocks_used = alloc_.num_used();
  s.blocks_shared = alloc_.num_shared();
  s.bytes_per_block = block_stride_;
  // Exact: a block's bytes (codes, scales and zero points) over its tokens.
  s.bytes_per_token = block_stride_ * cfg_.num_layers / cfg_.block_size;
  s.bytes_total = arena_bytes_ + res_arena_bytes_;
  s.bytes_in_use = bytes_in_use();
  s.peak_bytes_in_use = peak_bytes_;
  s.num_sequences = seqs_.size();
  s.residual_blocks_total = res_alloc_.num_blocks();
  s.residual_blocks_used = res_alloc_.num_used();
  s.residual_bytes_per_block = res_stride_;
  s.tokens_stored = tokens_stored_;
  return s;
}

PoolLayout Pool::layout() const {
  PoolLayout l{};
  l.base = arena_;
  l.num_blocks = cfg_.num_blocks;
  l.block_stride = block_stride_;
  l.part[0] = part_[0];
  l.part[1] = part_[1];
  l.residual_base = res_arena_;
  l.residual_num_blocks = cfg_.num_residual_blocks;
  l.residual_block_stride = res_stride_;
  return l;
}

std::pair<float, float> Pool::tensor_scales(uint32_t layer) const {
  check_layer(layer);
  float r[2] = {0.0f, 0.0f};
  for (int kv = 0; kv < 2; ++kv)
    if (part_[kv].quantized && part_[kv].spec.gran == codec::Gran::Tensor) r[kv] = tensor_scale(kv, layer);
  return {r[0], r[1]};
}

void Pool::reset_peak() {
  std::unique_lock lk(mu_);
  peak_bytes_ = bytes_in_use();
}

void Pool::seq_create(uint64_t id) {
  std::unique_lock lk(mu_);
  if (seqs_.find(id)) fail(Errc::SeqExists, "sequence " + u64s(id) + " already exists");
  auto s = std::make_unique<Sequence>();
  s->layers.resize(cfg_.num_layers);
  seqs_.insert(id, std::move(s));
}

void Pool::seq_fork(uint64_t parent, uint64_t child) {
  std::unique_lock lk(mu_);
  const Sequence &p = find(parent);
  if (seqs_.find(child)) fail(Errc::SeqExists, "sequence " + u64s(child) + " already exists");
  // Attention-sink copies are private (an append may rewrite a sink): the
  // child gets its own.
  if (p.sink_blocks.size() > res_alloc_.available())
    fail(Errc::PoolExhausted, "pool exhausted: the child's attention-sink copies need " +
                                  u64s(p.sink_blocks.size()) + " residual blocks, " +
                                  u64s(res_alloc_.available()) + " available");
  auto c = std::make_unique<Sequence>(p);  // may throw: nothing changed yet
  Sequence *cp = seqs_.insert(child, std::move(c));  // may throw: nothing changed yet
  for (const LayerTable &l : cp->layers) {
    tokens_stored_ += l.n_tokens;
    for (int32_t b : l.blocks) alloc_.ref(b);
    for (int32_t b : l.res_blocks) res_alloc_.ref(b);
  }
  if (!cp->sink_blocks.empty()) {
    for (int32_t &b : cp->sink_blocks) {
      const int32_t nb = take_res();
      std::memcpy(res_ptr(nb), res_ptr(b), res_stride_);
      b = nb;
    }
    assign_sinks(*cp);
    note_usage();
  }
}

void Pool::seq_truncate(uint64_t id, uint64_t new_length) {
  std::unique_lock lk(mu_);
  Sequence &s = find(id);
  if (new_length >= s.length) return;
  const BlockDiv bs = block_div(cfg_.block_size);
  const uint32_t unit = age_unit();
  // Tokens a layer keeps (computed twice, without a heap allocation).
  auto keep_of = [&](const LayerTable &l) -> uint64_t {
    if (new_length >= l.tail_pos) return std::min(l.n_tokens, l.tail_index + (new_length - l.tail_pos));
    return static_cast<uint64_t>(std::lower_bound(l.positions.begin(), l.positions.end(),
                                                  static_cast<int64_t>(new_length)) -
                                 l.positions.begin());
  };
  // A per-channel group cut in the middle is re-staged in the residual:
  // check the residual blocks that needs before anything changes.
  if (unit > 1) {
    uint64_t res_needed = 0;
    for (const LayerTable &l : s.layers) {
      const uint64_t keep = keep_of(l);
      if (keep < l.n_lp && keep % unit != 0) res_needed += (keep % unit + bs - 1) / bs;
    }
    if (res_needed > res_alloc_.available())
      fail(Errc::PoolExhausted, "pool exhausted: truncating into a per-channel group re-stages its "
                                "tokens and needs " + u64s(res_needed) + " residual blocks, " +
                                u64s(res_alloc_.available()) + " available");
    for (LayerTable &l : s.layers) l.res_blocks.reserve(l.res_blocks.size() + 2);  // may throw
  }
  // From here on nothing throws.
  const uint64_t row = static_cast<uint64_t>(cfg_.num_kv_heads) * cfg_.head_dim;
  for (uint32_t li = 0; li < cfg_.num_layers; ++li) {
    LayerTable &l = s.layers[li];
    const uint64_t keep = keep_of(l);
    // Truncating into a registered block this sequence alone holds: the block
    // will be rewritten in place, so it leaves the prefix index now.
    if (keep < l.n_lp && keep % bs != 0 && alloc_.refcount(l.blocks[keep / bs]) == 1)
      prefix_drop_block(l.blocks[keep / bs]);
    if (new_length < l.tail_pos) {
      l.positions.resize(keep);
      l.tail_index = keep;
      l.tail_pos = new_length;
    }
    if (keep >= l.n_lp) {  // cut inside the residual
      const size_t keep_res = keep == l.n_lp ? 0 : static_cast<size_t>((l.res_off + keep - l.n_lp + bs - 1) / bs);
      while (l.res_blocks.size() > keep_res) {
        release_res(l.res_blocks.back());
        l.res_blocks.pop_back();
      }
      if (l.res_blocks.empty()) l.res_off = 0;
    } else {  // cut inside the codec blocks: the residual goes entirely
      for (int32_t b : l.res_blocks) release_res(b);
      l.res_blocks.clear();
      l.res_off = 0;
      uint64_t lp = keep;
      const uint64_t partial = keep % unit;
      if (partial) {
        // Per-channel: the cut group's tokens go back to the residual
        // (dequantized), so the group can be completed and encoded again.
        lp = keep - partial;
        float *buf = scratch_input(2 * partial * row);
        const uint8_t *blk = block_ptr(l.blocks[lp / bs]);
        read_part(0, li, blk, static_cast<uint32_t>(lp % bs), partial,
                  reinterpret_cast<uint8_t *>(buf), DType::F32, l, lp);
        read_part(1, li, blk, static_cast<uint32_t>(lp % bs), partial,
                  reinterpret_cast<uint8_t *>(buf + partial * row), DType::F32, l, lp);
        overlay_sinks(li, l, lp, partial, reinterpret_cast<uint8_t *>(buf),
                      reinterpret_cast<uint8_t *>(buf + partial * row), DType::F32);
        l.res_blocks.push_back(take_res());
        write_residual(res_ptr(l.res_blocks[0]), 0, reinterpret_cast<const uint8_t *>(buf),
                       reinterpret_cast<const uint8_t *>(buf + partial * row), DType::F32, partial);
        for (uint64_t t = 0; t < partial; ++t)  // the re-staged tokens keep their written state
          res_written_.put(l.res_blocks[0], static_cast<uint32_t>(t),
                           written_.test(l.blocks[lp / bs], static_cast<uint32_t>(lp % bs + t)));
      }
      l.n_lp = lp;
      const size_t keep_blocks = static_cast<size_t>((lp + bs - 1) / bs);
      while (l.blocks.size() > keep_blocks) {
        release_block(l.blocks.back());
        l.blocks.pop_back();
      }
    }
    tokens_stored_ -= l.n_tokens - keep;
    l.n_tokens = keep;
    l.reserved_at = std::min(l.reserved_at, keep);
    if (s.track_scores) l.scores.resize(keep * cfg_.num_kv_heads);
  }
  s.length = new_length;
  s.stamp = seqs_.new_stamp();
  if (unit > 1) note_usage();  // re-staging may have taken residual blocks
}

void Pool::seq_free(uint64_t id) {
  std::unique_lock lk(mu_);
  Sequence *s = seqs_.find(id);
  if (!s) fail(Errc::SeqNotFound, "sequence " + u64s(id) + " does not exist (freed twice?)");
  // Newest blocks first, so a prefix chain enters the LRU children before
  // parents and is reclaimed from its end.
  size_t most = 0;
  for (const LayerTable &l : s->layers) {
    tokens_stored_ -= l.n_tokens;
    most = std::max(most, l.blocks.size());
    for (int32_t b : l.res_blocks) release_res(b);
  }
  for (int32_t b : s->sink_blocks) release_res(b);
  for (size_t i = most; i-- > 0;)
    for (const LayerTable &l : s->layers)
      if (i < l.blocks.size()) release_block(l.blocks[i]);
  seqs_.erase(id);
}

uint64_t Pool::seq_length(uint64_t id) const {
  std::shared_lock lk(mu_);
  return find(id).length;
}

uint64_t Pool::seq_layer_tokens(uint64_t id, uint32_t layer) const {
  std::shared_lock lk(mu_);
  const Sequence &s = find(id);
  check_layer(layer);
  return s.layers[layer].n_tokens;
}

void Pool::seq_reserve(uint64_t id, uint64_t n_new, int64_t *slot_mapping) {
  std::unique_lock lk(mu_);
  Sequence &s = find(id);
  if (n_new == 0) fail(Errc::InvalidArgument, "n_new 0: reserve at least one token");
  if (n_new > kMaxLength - s.length)
    fail(Errc::Overflow, "length " + u64s(s.length) + " + " + u64s(n_new) +
                             " tokens exceeds the maximum of " + u64s(kMaxLength));
  // Auto-eviction (a policy with auto_evict and a budget): make room under
  // the cap first. It stays done even if the reservation below then fails.
  if (const PolicySpec *pol = policy_of(s); pol && pol->auto_evict && pol->budget_tokens) {
    bool over = false;
    for (const LayerTable &l : s.layers) over = over || l.n_tokens + n_new > pol->budget_tokens;
    if (over) evict_locked(id, s, *pol, n_new, nullptr);
  }
  if (s.track_scores)  // capacity for the new tokens' scores (may throw: nothing changed yet)
    for (LayerTable &l : s.layers) l.scores.reserve((l.n_tokens + n_new) * cfg_.num_kv_heads);
  auto grow_scores = [&] {  // within the reserved capacity: cannot throw
    if (s.track_scores)
      for (LayerTable &l : s.layers) l.scores.resize(l.n_tokens * cfg_.num_kv_heads, 0.0f);
  };
  const BlockDiv bs = block_div(cfg_.block_size);
  if (!residual()) {
    uint64_t needed = 0, held_after = 0;
    for (const LayerTable &l : s.layers) {
      needed += (l.n_tokens + n_new + bs - 1) / bs - l.blocks.size();
      held_after += (l.n_tokens + n_new + bs - 1) / bs;
      if (l.n_tokens % bs != 0 && alloc_.refcount(l.blocks.back()) > 1) ++needed;  // copy-on-write
    }
    // Never fits: the sequence alone would hold more blocks than the pool
    // has (its shared blocks counted once, no copy-on-write then needed).
    if (held_after > alloc_.num_blocks())
      fail(Errc::ExceedsCapacity, "exceeds the pool's capacity: sequence " + u64s(id) + " with " + u64s(n_new) +
                                      " more tokens needs " + u64s(held_after) + " blocks (" +
                                      u64s(cfg_.num_layers) + " layers of " +
                                      u64s((s.layers[0].n_tokens + n_new + bs - 1) / bs) +
                                      "), the pool has " + u64s(alloc_.num_blocks()) + " in all");
    if (needed > alloc_.available())
      fail(Errc::PoolExhausted, "pool exhausted: reserving " + u64s(n_new) + " tokens needs " +
                                    u64s(needed) + " blocks, " + u64s(alloc_.available()) +
                                    " available");
    for (LayerTable &l : s.layers) {  // may throw bad_alloc: nothing changed yet
      const size_t target = static_cast<size_t>((l.n_tokens + n_new + bs - 1) / bs);
      if (l.blocks.capacity() < target) l.blocks.reserve(std::max(target, 2 * l.blocks.capacity()));
    }
    // From here on nothing throws.
    for (uint32_t li = 0; li < cfg_.num_layers; ++li) {
      LayerTable &l = s.layers[li];
      if (l.n_tokens % bs != 0 && alloc_.refcount(l.blocks.back()) > 1)
        l.blocks.back() = cow_copy(l.blocks.back());
      else if (l.n_tokens % bs != 0)
        prefix_drop_block(l.blocks.back());  // its free slots will be written: it leaves the prefix index
      const uint64_t target = (l.n_tokens + n_new + bs - 1) / bs;
      while (l.blocks.size() < target) l.blocks.push_back(take_block());
      // The new slots are unwritten until an append writes them (device
      // pools also zero them: their kernels read the arena directly).
      for (uint64_t i = 0; i < n_new;) {
        const uint64_t idx = l.n_tokens + i;
        const uint32_t slot = static_cast<uint32_t>(idx % bs);
        const uint64_t run = std::min<uint64_t>(n_new - i, bs - slot);
        const int32_t b = l.blocks[idx / bs];
        written_.clear(b, slot, run);
        if (dev_)
          for_slot_bytes(slot, run, [&](uint64_t off, uint64_t len) {
            dev_->zero(static_cast<uint64_t>(b) * block_stride_ + off, len);
          });
        i += run;
      }
      if (slot_mapping) {
        int64_t *out = slot_mapping + static_cast<uint64_t>(li) * n_new;
        for (uint64_t i = 0; i < n_new; ++i) {
          const uint64_t idx = l.n_tokens + i;
          out[i] = static_cast<int64_t>(l.blocks[idx / bs]) * static_cast<int64_t>(bs) +
                   static_cast<int64_t>(idx % bs);
        }
      }
      l.n_tokens += n_new;
      tokens_stored_ += n_new;
      l.n_lp = l.n_tokens;
    }
    s.length += n_new;
    grow_scores();
    note_usage();
    return;
  }
  // With a residual: new tokens go to residual blocks; the oldest residual
  // tokens beyond the window (already written: they precede this reserve)
  // are encoded into codec blocks in units of age_unit().
  const uint64_t target_hp = hp_target(s.length + n_new);
  const uint32_t unit = age_unit();
  std::vector<uint64_t> aged(cfg_.num_layers);
  uint64_t need_lp = 0, need_res = 0;
  // The sequence's attention-sink copies come with its first reserve.
  const uint64_t need_sinks = s.sink_blocks.empty() ? sink_blocks_needed() : 0;
  need_res += need_sinks;
  // Residual blocks in the order the changes below take and free them: the
  // sinks first, then per layer aging frees the blocks it leaves (those no
  // other sequence shares) before the layer's new ones are taken.
  bool res_fits = need_sinks <= res_alloc_.available();
  uint64_t res_avail = res_fits ? res_alloc_.available() - need_sinks : 0;
  uint64_t res_after = s.sink_blocks.size() + need_sinks;  // residual blocks held after the reserve
  for (uint32_t li = 0; li < cfg_.num_layers; ++li) {
    const LayerTable &l = s.layers[li];
    const uint64_t hp_old = l.n_tokens - l.n_lp, hp_after = hp_old + n_new;
    uint64_t a = hp_after > target_hp ? std::min(hp_after - target_hp, hp_old) : 0;
    a -= a % unit;
    aged[li] = a;
    if (a) {
      need_lp += (l.n_lp + a + bs - 1) / bs - l.blocks.size();
      if (l.n_lp % bs != 0 && alloc_.refcount(l.blocks.back()) > 1) ++need_lp;
    }
    // Residual blocks after aging: the kept ones plus new ones.
    const uint64_t off = l.res_off + a;
    const uint64_t kept = l.res_blocks.size() - std::min<uint64_t>(off / bs, l.res_blocks.size());
    const uint64_t hp_left = hp_after - a;
    const uint64_t first = hp_left == n_new ? 0 : off % bs;  // residual emptied: start afresh
    const uint64_t total = (first + hp_left + bs - 1) / bs;
    const uint64_t kept_used = hp_left == n_new ? 0 : kept;
    res_after += total;
    uint64_t take = total > kept_used ? total - kept_used : 0;
    if (kept_used && (l.res_off + hp_old) % bs != 0 && res_alloc_.refcount(l.res_blocks.back()) > 1) ++take;
    need_res += take;
    const size_t dropped = static_cast<size_t>(l.res_blocks.size() - kept_used);
    for (size_t i = 0; i < dropped; ++i) res_avail += res_alloc_.refcount(l.res_blocks[i]) == 1 ? 1 : 0;
    if (take > res_avail) res_fits = false;
    else res_avail -= take;
  }
  {  // Never fits: what the sequence alone would hold after this reserve.
    // (The residual keeps its offset in its first block: what no one else's
    // freeing can change.)
    uint64_t lp_after = 0;
    for (uint32_t li = 0; li < cfg_.num_layers; ++li)
      lp_after += (s.layers[li].n_lp + aged[li] + bs - 1) / bs;
    if (lp_after > alloc_.num_blocks() || res_after > res_alloc_.num_blocks())
      fail(Errc::ExceedsCapacity, "exceeds the pool's capacity: sequence " + u64s(id) + " with " + u64s(n_new) +
                                      " more tokens needs " + u64s(lp_after) + " blocks (the pool has " +
                                      u64s(alloc_.num_blocks()) + ") and " + u64s(res_after) +
                                      " residual blocks (the pool has " + u64s(res_alloc_.num_blocks()) + ")");
  }
  if (need_lp > alloc_.available() || !res_fits)
    fail(Errc::PoolExhausted, "pool exhausted: reserving " + u64s(n_new) + " tokens needs " +
                                  u64s(need_lp) + " blocks (" + u64s(alloc_.available()) +
                                  " available) and " + u64s(need_res) + " residual blocks (" +
                                  u64s(res_alloc_.available()) + " available, more as aging frees some)");
  for (uint32_t li = 0; li < cfg_.num_layers; ++li) {  // may throw bad_alloc: nothing changed yet
    LayerTable &l = s.layers[li];
    const size_t lp_target = static_cast<size_t>((l.n_lp + aged[li] + bs - 1) / bs);
    if (l.blocks.capacity() < lp_target) l.blocks.reserve(std::max(lp_target, 2 * l.blocks.capacity()));
    const size_t res_target = l.res_blocks.size() + static_cast<size_t>((n_new + bs - 1) / bs) + 1;
    if (l.res_blocks.capacity() < res_target)
      l.res_blocks.reserve(std::max(res_target, 2 * l.res_blocks.capacity()));
  }
  s.sink_blocks.reserve(need_sinks);
  // From here on nothing throws.
  if (need_sinks) {
    while (s.sink_blocks.size() < need_sinks) s.sink_blocks.push_back(take_res());
    assign_sinks(s);
  }
  for (uint32_t li = 0; li < cfg_.num_layers; ++li) {
    LayerTable &l = s.layers[li];
    if (aged[li]) {
      if (l.n_lp % bs != 0 && alloc_.refcount(l.blocks.back()) > 1)
        l.blocks.back() = cow_copy(l.blocks.back());
      age(li, l, aged[li]);
    }
    const uint64_t hp = l.n_tokens - l.n_lp;
    if (hp == 0) {
      for (int32_t b : l.res_blocks) release_res(b);
      l.res_blocks.clear();
      l.res_off = 0;
    } else if ((l.res_off + hp) % bs != 0 && res_alloc_.refcount(l.res_blocks.back()) > 1) {
      l.res_blocks.back() = cow_res(l.res_blocks.back());
    }
    const uint64_t target = (l.res_off + hp + n_new + bs - 1) / bs;
    while (l.res_blocks.size() < target) l.res_blocks.push_back(take_res());
    for (uint64_t i = 0; i < n_new;) {  // unwritten until an append writes them
      const uint64_t r = l.res_off + hp + i;
      const uint64_t run = std::min<uint64_t>(n_new - i, bs - r % bs);
      res_written_.clear(l.res_blocks[r / bs], static_cast<uint32_t>(r % bs), run);
      i += run;
    }
    if (slot_mapping) {  // slots in the residual arena
      int64_t *out = slot_mapping + static_cast<uint64_t>(li) * n_new;
      for (uint64_t i = 0; i < n_new; ++i) {
        const uint64_t r = l.res_off + hp + i;
        out[i] = static_cast<int64_t>(l.res_blocks[r / bs]) * static_cast<int64_t>(bs) +
                 static_cast<int64_t>(r % bs);
      }
    }
    l.reserved_at = l.n_tokens;
    l.n_tokens += n_new;
    tokens_stored_ += n_new;
  }
  s.length += n_new;
  grow_scores();
  note_usage();
}

float Pool::tensor_scale(int kv, uint32_t layer) const {
  return bits_f32(tensor_scale_[kv][layer].load(std::memory_order_acquire));
}

// Dynamic per-tensor scale: fixed by the first write to the layer (as vLLM
// computes k_scale / v_scale on the first forward pass); later values beyond
// its range saturate. A full-range codec takes the full-range rule's signed
// scale (-m / 2^(bits-1), negative when the extreme m is positive), as
// kvc_quantize() computes it for a per-tensor array.
void Pool::calibrate(int kv, uint32_t layer, const float *x, uint64_t n) {
  if (tensor_scale_[kv][layer].load(std::memory_order_acquire) != 0) return;
  const codec::Spec &sp = part_[kv].spec;
  if (sp.full_range) {
    float lo = 0.0f, hi = 0.0f;
    for (uint64_t i = 0; i < n; ++i) {
      lo = std::min(lo, x[i]);
      hi = std::max(hi, x[i]);
    }
    const float scale = codec::dynamic_scale(sp, lo, hi);
    if (scale == 0.0f) return;  // all zeros: stay uncalibrated
    uint32_t expected = 0;
    tensor_scale_[kv][layer].compare_exchange_strong(expected, f32_bits(scale), std::memory_order_acq_rel);
    return;
  }
  float absmax = 0.0f;
  for (uint64_t i = 0; i < n; ++i) absmax = std::max(absmax, std::fabs(x[i]));
  calibrate_absmax(kv, layer, absmax);
}

void Pool::calibrate_absmax(int kv, uint32_t layer, float absmax) {
  const codec::Spec &sp = part_[kv].spec;
  const float qmax = sym_max(sp.dtype);
  if (!(absmax > 0.0f)) return;  // all zeros: stay uncalibrated (zeros encode exactly without a scale)
  const float scale = codec::round_scale_up(
      std::max(absmax / qmax, std::numeric_limits<float>::min()), sp.scale_dtype);
  uint32_t expected = 0;
  tensor_scale_[kv][layer].compare_exchange_strong(expected, f32_bits(scale),
                                                   std::memory_order_acq_rel);
}

// Writes `count` tokens into slots [slot, slot + count) of part kv of block
// `blk`. Plain storage converts from `src`; quantized storage encodes the
// f32 rows `src_f32` (already converted, checked finite and rotated).
void Pool::write_part(int kv, uint32_t layer, uint8_t *blk, const uint8_t *src, DType src_type,
                      const float *src_f32, uint32_t slot, uint64_t count) const {
  const PartLayout &pl = part_[kv];
  const uint64_t hd = cfg_.head_dim, h = cfg_.num_kv_heads;
  uint8_t *base = blk + pl.offset;
  if (!pl.quantized) {
    const DType dst = static_cast<DType>(pl.spec.dtype);
    const uint64_t src_row = h * hd * dtype_bytes(src_type);
    if (cfg_.layout == Layout::NHD) {
      convert(src, src_type, base + slot * pl.token_stride, dst, count * h * hd);
      return;
    }
    for (uint64_t t = 0; t < count; ++t)
      for (uint64_t hh = 0; hh < h; ++hh)
        convert(src + t * src_row + hh * hd * dtype_bytes(src_type), src_type,
                base + hh * pl.head_stride + (slot + t) * pl.token_stride, dst, hd);
    return;
  }
  (void)src;
  codec::Spec sp = pl.spec;
  const uint64_t row = h * hd;
  if (sp.gran == codec::Gran::Channel) {  // whole groups of G tokens (aging only)
    for (uint64_t t = 0; t < count; t += sp.group) {
      const uint64_t g = (slot + t) / sp.group;
      codec::encode(sp, src_f32 + t * row, sp.group, row, base + (slot + t) * pl.token_stride,
                    blk + pl.scale_offset + g * row * pl.scale_bytes,
                    blk + pl.zero_offset + g * row * pl.scale_bytes);
    }
    return;
  }
  for (uint64_t t = 0; t < count; ++t) {
    const float *tmp = src_f32 + t * row;  // converted, checked and rotated by append()
    uint8_t *codes = base + (slot + t) * pl.token_stride;
    uint8_t *scales = blk + pl.scale_offset + (slot + t) * pl.scales_per_token * pl.scale_bytes;
    uint8_t *zeros = blk + pl.zero_offset + (slot + t) * pl.scales_per_token * pl.scale_bytes;
    switch (sp.gran) {
      case codec::Gran::Token: codec::encode(sp, tmp, h, hd, codes, scales, zeros); break;
      case codec::Gran::Group: codec::encode(sp, tmp, 1, row, codes, scales, zeros); break;
      default: {  // per tensor: the layer's scale
        sp.static_scale = tensor_scale(kv, layer);  // 0 only while every value written was 0
        sp.scale_dtype = DType::F32;          // per-tensor scales are kept as f32
        codec::encode(sp, tmp, 1, row, codes, nullptr, nullptr);
      }
    }
  }
}

// Reads `count` tokens from slots [slot, ...) of part kv into `out` rows of dst.
void Pool::read_part(int kv, uint32_t layer, const uint8_t *blk, uint32_t slot, uint64_t count,
                     uint8_t *out, DType dst, const LayerTable &l, uint64_t idx0) const {
  const PartLayout &pl = part_[kv];
  const uint64_t hd = cfg_.head_dim, h = cfg_.num_kv_heads, row = h * hd;
  const uint8_t *base = blk + pl.offset;
  if (!pl.quantized) {
    const DType st = static_cast<DType>(pl.spec.dtype);
    if (cfg_.layout == Layout::NHD) {
      convert(base + slot * pl.token_stride, st, out, dst, count * row);
      return;
    }
    for (uint64_t t = 0; t < count; ++t)
      for (uint64_t hh = 0; hh < h; ++hh)
        convert(base + hh * pl.head_stride + (slot + t) * pl.token_stride, st,
                out + (t * row + hh * hd) * dtype_bytes(dst), dst, hd);
    return;
  }
  codec::Spec sp = pl.spec;
  // f32 output: decode straight into it (no staging copy).
  const bool direct = dst == DType::F32 && reinterpret_cast<uintptr_t>(out) % alignof(float) == 0;
  float *tmp = direct ? reinterpret_cast<float *>(out) : scratch_f32(row * count);
  const uint8_t *codes = base + slot * pl.token_stride;  // `count` tokens, contiguous
  switch (sp.gran) {
    case codec::Gran::Token: {  // scales [slot][kv_heads], contiguous too
      const uint64_t sidx = slot * pl.scales_per_token;
      sp.rotation_block = 0;  // the rotation is undone below, per head
      codec::dequantize(sp, codes, blk + pl.scale_offset + sidx * pl.scale_bytes,
                        blk + pl.zero_offset + sidx * pl.scale_bytes, count * h, hd, tmp, DType::F32);
      break;
    }
    case codec::Gran::Group: {
      const uint64_t sidx = slot * pl.scales_per_token;
      sp.rotation_block = 0;
      codec::dequantize(sp, codes, blk + pl.scale_offset + sidx * pl.scale_bytes,
                        blk + pl.zero_offset + sidx * pl.scale_bytes, count, row, tmp, DType::F32);
      break;
    }
    case codec::Gran::Channel:
      for (uint64_t t = 0; t < count; ++t) {
        const uint64_t sidx = (slot + t) / sp.group * row;
        codec::decode(sp, codes + t * pl.token_stride, blk + pl.scale_offset + sidx * pl.scale_bytes,
                      blk + pl.zero_offset + sidx * pl.scale_bytes, 1, row, tmp + t * row);
      }
      break;
    default: {
      uint8_t one[4];
      sp.scale_dtype = DType::F32;
      codec::store_scale(one, DType::F32, tensor_scale(kv, layer));
      codec::decode(sp, codes, one, nullptr, count, row, tmp);
    }
  }
  if (pl.rotation_block)
    for (uint64_t t = 0; t < count; ++t) codec::hadamard(tmp + t * row, row, pl.rotation_block);
  if (kv == 0 && pre_rope_)
    for (uint64_t t = 0; t < count; ++t)
      pre_rope_->rotate(tmp + t * row, cfg_.num_kv_heads, static_cast<uint64_t>(l.rope_position_of(idx0 + t)), 1);
  if (!direct) convert(tmp, DType::F32, out, dst, count * row);
}

void Pool::append(uint64_t id, uint32_t layer, uint64_t pos, uint64_t n, const void *k,
                  const void *v, DType src) {
  const BlockDiv bs = block_div(cfg_.block_size);
  auto locate = [&](Sequence &s) -> uint64_t {
    check_layer(layer);
    if (n == 0) fail(Errc::InvalidArgument, "n_tokens 0: append at least one token");
    if (n > s.length || pos > s.length - n)
      fail(Errc::NotReserved, "positions from " + u64s(pos) + " (" + u64s(n) +
                                  " tokens) are not reserved: sequence " + u64s(id) +
                                  " has length " + u64s(s.length) + " (call kvc_seq_reserve first)");
    const LayerTable &l = s.layers[layer];
    if (pos < l.tail_pos)
      fail(Errc::NotReserved, "position " + u64s(pos) + " of layer " + u64s(layer) +
                                  " was compacted by eviction; only positions >= " +
                                  u64s(l.tail_pos) + " can be written");
    return l.tail_index + (pos - l.tail_pos);
  };
  // Shared blocks the write touches: codec blocks (first) and residual blocks (second).
  auto shared_blocks = [&](const LayerTable &l, uint64_t idx0) {
    std::pair<uint64_t, uint64_t> cnt{0, 0};
    const uint64_t lp_end = std::min(idx0 + n, l.n_lp);
    if (idx0 < lp_end)
      for (uint64_t b = idx0 / bs; b <= (lp_end - 1) / bs; ++b)
        if (alloc_.refcount(l.blocks[b]) > 1) ++cnt.first;
    const uint64_t hp_begin = std::max(idx0, l.n_lp);
    if (hp_begin < idx0 + n) {
      const uint64_t r0 = l.res_off + (hp_begin - l.n_lp), r1 = l.res_off + (idx0 + n - l.n_lp) - 1;
      for (uint64_t b = r0 / bs; b <= r1 / bs; ++b)
        if (res_alloc_.refcount(l.res_blocks[b]) > 1) ++cnt.second;
    }
    return cnt;
  };
  // A registered block written in place (this sequence is its only holder)
  // leaves the prefix index first (exclusive lock).
  auto touches_registered = [&](const LayerTable &l, uint64_t idx0) {
    const uint64_t lp_end = std::min(idx0 + n, l.n_lp);
    if (!prefix_ || idx0 >= lp_end) return false;
    for (uint64_t b = idx0 / bs; b <= (lp_end - 1) / bs; ++b)
      if (registered(l.blocks[b]) && alloc_.refcount(l.blocks[b]) == 1) return true;
    return false;
  };
  auto check_lp_write = [&](const LayerTable &l, uint64_t idx0) {
    if (idx0 < l.n_lp && age_unit() > 1)
      fail(Errc::NotReserved, "position " + u64s(l.position_of(idx0)) + " of layer " + u64s(layer) +
                                  " is already encoded in a per-channel group; only residual "
                                  "(newest) positions can be written");
  };
  // Quantized parts: convert the input to f32 once and reject NaN / Inf
  // before anything is written.
  const uint64_t row = static_cast<uint64_t>(cfg_.num_kv_heads) * cfg_.head_dim;
  const float *kf = nullptr, *vf = nullptr;
  if ((part_[0].quantized || part_[1].quantized) && n > (uint64_t(1) << 40) / (row ? row : 1))
    fail(Errc::Overflow, "n_tokens " + u64s(n) + " x row of " + u64s(row) + " values is too large");
  // CUDA pools check, rotate and encode on the device (cuda/kernels.cu).
  // Pre-RoPE keys are rotated back (then Hadamard-rotated) by write(), at
  // the RoPE positions of the layer's indices they land on, into kpre.
  float *kpre = nullptr;
  if (!dev_ && (part_[0].quantized || part_[1].quantized)) {
    float *buf = scratch_input((pre_rope_ ? 3 : 2) * n * row);
    for (int kv = 0; kv < 2; ++kv) {
      if (!part_[kv].quantized) continue;
      float *dst = buf + kv * n * row;
      convert(kv == 0 ? k : v, src, dst, DType::F32, n * row);
      codec::check_finite(dst, n * row, kv == 0 ? "k" : "v");
      const bool pre = kv == 0 && pre_rope_;
      // Undoing RoPE can grow a value to its pair's norm (up to sqrt(2) x):
      // pre-RoPE keys are checked as if the rotation block were twice as large.
      codec::check_rotatable(dst, n * row, pre ? std::max<uint32_t>(2, 2 * part_[kv].rotation_block)
                                               : part_[kv].rotation_block);
      if (part_[kv].rotation_block && !pre)  // rotate each head before calibrating and encoding
        for (uint64_t t = 0; t < n; ++t) codec::hadamard(dst + t * row, row, part_[kv].rotation_block);
      (kv == 0 ? kf : vf) = dst;
    }
    if (pre_rope_) kpre = buf + 2 * n * row;
  }
  auto write = [&](LayerTable &l, uint64_t idx0) {
    if (dev_) {
      float ts[2] = {0.0f, 0.0f};
      for (int kv = 0; kv < 2; ++kv)
        if (part_[kv].quantized && part_[kv].spec.gran == codec::Gran::Tensor) {
          if (tensor_scale_[kv][layer].load(std::memory_order_acquire) == 0)
            calibrate_absmax(kv, layer, dev_->absmax(kv, n, kv == 0 ? k : v, static_cast<int32_t>(src)));
          ts[kv] = tensor_scale(kv, layer);
        }
      const std::vector<cuda::Slot> slots = slots_of(l, idx0, n);
      dev_->append(slots.data(), n, k, v, static_cast<int32_t>(src), ts, 3);
      mark_written(l, idx0, n, true);
      return;
    }
    const uint8_t *ks = static_cast<const uint8_t *>(k);
    const uint8_t *vs = static_cast<const uint8_t *>(v);
    const uint64_t src_row = row * dtype_bytes(src);
    const float *kq = kf;
    if (kpre) {  // pre-RoPE keys: undo RoPE at each token's RoPE position, then the Hadamard rotation
      std::memcpy(kpre, kf, n * row * sizeof(float));
      for (uint64_t t = 0; t < n; ++t) {
        float *x = kpre + t * row;
        pre_rope_->rotate(x, cfg_.num_kv_heads, static_cast<uint64_t>(l.rope_position_of(idx0 + t)), -1);
        if (part_[0].rotation_block) codec::hadamard(x, row, part_[0].rotation_block);
      }
      kq = kpre;
    }
    const uint64_t skip = leading_sinks(l, idx0, n);  // sinks saturate: read from their copies
    for (int kv = 0; kv < 2; ++kv)
      if (part_[kv].quantized && part_[kv].spec.gran == codec::Gran::Tensor)
        calibrate(kv, layer, (kv == 0 ? kq : vf) + skip * row, (n - skip) * row);
    uint64_t done = 0;
    while (done < n) {
      const uint64_t idx = idx0 + done;
      if (idx < l.n_lp) {
        const uint32_t slot = static_cast<uint32_t>(idx % bs);
        const uint64_t run = std::min<uint64_t>({n - done, bs - slot, l.n_lp - idx});
        uint8_t *blk = block_ptr(l.blocks[idx / bs]);
        write_part(0, layer, blk, ks + done * src_row, src, kq ? kq + done * row : nullptr, slot, run);
        write_part(1, layer, blk, vs + done * src_row, src, vf ? vf + done * row : nullptr, slot, run);
        write_sinks(layer, l, idx, run, ks + done * src_row, vs + done * src_row, src);
        done += run;
      } else {
        const uint64_t r = l.res_off + (idx - l.n_lp);
        const uint32_t slot = static_cast<uint32_t>(r % bs);
        const uint64_t run = std::min<uint64_t>(n - done, bs - slot);
        write_residual(res_ptr(l.res_blocks[r / bs]), slot, ks + done * src_row, vs + done * src_row,
                       src, run);
        done += run;
      }
    }
    mark_written(l, idx0, n, true);
  };
  {
    std::shared_lock lk(mu_);
    Sequence &s = find(id);
    const uint64_t idx0 = locate(s);
    LayerTable &l = s.layers[layer];
    check_lp_write(l, idx0);
    const auto shared = shared_blocks(l, idx0);
    if (shared.first == 0 && shared.second == 0 && !touches_registered(l, idx0)) {
      {  // kvc_seq_save of this sequence waits (and holds writes off) meanwhile
        std::shared_lock wl(s.writers.mu);
        write(l, idx0);
      }
      if (!age_due(s, layer, idx0, idx0 + n)) return;
      // Aging moves blocks: exclusive lock, and only if the layer is as this
      // write left it (otherwise the next reserve ages it). The stamp tells
      // a sequence truncated, or freed and made again, that grew back to the
      // same lengths (ABA) with positions not written yet.
      const uint64_t seen_tokens = l.n_tokens, seen_lp = l.n_lp, seen_len = s.length, seen_at = l.reserved_at,
                     seen_stamp = s.stamp;
      lk.unlock();
      std::unique_lock ulk(mu_);
      Sequence *sp = seqs_.find(id);
      if (sp && sp->stamp == seen_stamp && sp->length == seen_len && sp->layers[layer].n_tokens == seen_tokens &&
          sp->layers[layer].n_lp == seen_lp && sp->layers[layer].reserved_at == seen_at)
        age_written(*sp, layer, idx0, idx0 + n);
      return;
    }
  }
  // Copy-on-write needed: redo under the exclusive lock (the state may have changed).
  std::unique_lock lk(mu_);
  Sequence &s = find(id);
  const uint64_t idx0 = locate(s);
  LayerTable &l = s.layers[layer];
  check_lp_write(l, idx0);
  const auto need = shared_blocks(l, idx0);
  if (need.first > alloc_.available() || need.second > res_alloc_.available())
    fail(Errc::PoolExhausted, "pool exhausted: copy-on-write needs " + u64s(need.first) +
                                  " blocks (" + u64s(alloc_.available()) + " available) and " +
                                  u64s(need.second) + " residual blocks (" +
                                  u64s(res_alloc_.available()) + " available)");
  const uint64_t lp_end = std::min(idx0 + n, l.n_lp);
  if (idx0 < lp_end)
    for (uint64_t b = idx0 / bs; b <= (lp_end - 1) / bs; ++b) {
      if (alloc_.refcount(l.blocks[b]) > 1) l.blocks[b] = cow_copy(l.blocks[b]);
      else prefix_drop_block(l.blocks[b]);  // written in place: leaves the prefix index
    }
  const uint64_t hp_begin = std::max(idx0, l.n_lp);
  if (hp_begin < idx0 + n) {
    const uint64_t r0 = l.res_off + (hp_begin - l.n_lp), r1 = l.res_off + (idx0 + n - l.n_lp) - 1;
    for (uint64_t b = r0 / bs; b <= r1 / bs; ++b)
      if (res_alloc_.refcount(l.res_blocks[b]) > 1) l.res_blocks[b] = cow_res(l.res_blocks[b]);
  }
  note_usage();
  write(l, idx0);
  age_written(s, layer, idx0, idx0 + n);
}

void Pool::gather(uint64_t id, uint32_t layer, uint64_t first, uint64_t n, void *k_out,
                  void *v_out, DType dst, int32_t *positions_out) const {
  std::shared_lock lk(mu_);
  const Sequence &s = find(id);
  check_layer(layer);
  const LayerTable &l = s.layers[layer];
  if (first > l.n_tokens || n > l.n_tokens - first)
    fail(Errc::OutOfRange, u64s(n) + " tokens from index " + u64s(first) + " are beyond the " +
                               u64s(l.n_tokens) + " tokens of layer " + u64s(layer));
  if (dev_) {
    const float ts[2] = {part_[0].quantized ? tensor_scale(0, layer) : 0.0f,
                         part_[1].quantized ? tensor_scale(1, layer) : 0.0f};
    const std::vector<cuda::Slot> slots = slots_of(l, first, n);
    if (n) dev_->gather(slots.data(), n, k_out, v_out, static_cast<int32_t>(dst), ts);
    if (positions_out)
      for (uint64_t i = 0; i < n; ++i) positions_out[i] = static_cast<int32_t>(l.position_of(first + i));
    return;
  }
  const BlockDiv bs = block_div(cfg_.block_size);
  const uint64_t hd = cfg_.head_dim, h = cfg_.num_kv_heads;
  const uint64_t row = h * hd * dtype_bytes(dst);
  uint64_t done = 0;
  uint8_t *ko = static_cast<uint8_t *>(k_out), *vo = static_cast<uint8_t *>(v_out);
  while (done < n) {
    const uint64_t idx = first + done;
    if (idx < l.n_lp) {
      const uint32_t slot = static_cast<uint32_t>(idx % bs);
      const uint64_t run = std::min<uint64_t>({n - done, bs - slot, l.n_lp - idx});
      const uint8_t *blk = block_ptr(l.blocks[idx / bs]);
      if (ko) read_part(0, layer, blk, slot, run, ko + done * row, dst, l, idx);
      if (vo) read_part(1, layer, blk, slot, run, vo + done * row, dst, l, idx);
      overlay_sinks(layer, l, idx, run, ko ? ko + done * row : nullptr, vo ? vo + done * row : nullptr, dst);
      zero_unwritten_rows(false, l.blocks[idx / bs], slot, run, ko ? ko + done * row : nullptr,
                          vo ? vo + done * row : nullptr, row);
      done += run;
    } else {
      const uint64_t r = l.res_off + (idx - l.n_lp);
      const uint32_t slot = static_cast<uint32_t>(r % bs);
      const uint64_t run = std::min<uint64_t>(n - done, bs - slot);
      read_residual(res_ptr(l.res_blocks[r / bs]), slot, run, ko ? ko + done * row : nullptr,
                    vo ? vo + done * row : nullptr, dst);
      zero_unwritten_rows(true, l.res_blocks[r / bs], slot, run, ko ? ko + done * row : nullptr,
                          vo ? vo + done * row : nullptr, row);
      done += run;
    }
  }
  if (positions_out)
    for (uint64_t i = 0; i < n; ++i) positions_out[i] = static_cast<int32_t>(l.position_of(first + i));
}

size_t Pool::block_table(uint64_t id, uint32_t layer, int32_t *out, size_t capacity) const {
  std::shared_lock lk(mu_);
  const Sequence &s = find(id);
  check_layer(layer);
  const auto &b = s.layers[layer].blocks;
  if (out && b.size() <= capacity) std::copy(b.begin(), b.end(), out);
  return b.size();
}

size_t Pool::export_page_table(uint32_t layer, const uint64_t *seq_ids, size_t n_seqs,
                               int32_t *indptr, int32_t *indices, size_t capacity,
                               int32_t *last_page_len) const {
  std::shared_lock lk(mu_);
  check_layer(layer);
  uint64_t total = 0;
  for (size_t i = 0; i < n_seqs; ++i) total += find(seq_ids[i]).layers[layer].blocks.size();
  if (total > static_cast<uint64_t>(std::numeric_limits<int32_t>::max()))
    fail(Errc::Overflow, "page table of " + u64s(total) + " indices exceeds int32");
  if (total > capacity) return static_cast<size_t>(total);
  const BlockDiv bs = block_div(cfg_.block_size);
  int32_t off = 0;
  indptr[0] = 0;
  for (size_t i = 0; i < n_seqs; ++i) {
    const LayerTable &l = find(seq_ids[i]).layers[layer];
    for (int32_t b : l.blocks) indices[off++] = b;
    indptr[i + 1] = off;
    last_page_len[i] =  // codec blocks only: residual tokens are not in the page table
        l.n_lp == 0 ? 0 : static_cast<int32_t>(l.n_lp - (l.blocks.size() - 1) * bs);
  }
  return static_cast<size_t>(total);
}

std::string Pool::check_sequence(uint64_t id, const Sequence &s, std::vector<uint64_t> &refs,
                                 std::vector<uint64_t> &res_refs) const {
  const BlockDiv bs = block_div(cfg_.block_size);
  if (s.layers.size() != cfg_.num_layers) return "sequence " + u64s(id) + " has wrong layer count";
  if (!s.sink_blocks.empty() && s.sink_blocks.size() != sink_blocks_needed())
    return "sequence " + u64s(id) + ": wrong number of attention-sink blocks";
  for (int32_t b : s.sink_blocks) {
    if (b < 0 || static_cast<uint64_t>(b) >= res_refs.size()) return "sequence " + u64s(id) + ": invalid sink block id";
    ++res_refs[b];
  }
  for (uint32_t li = 0; li < s.layers.size(); ++li) {
    const int32_t want = s.sink_blocks.empty() ? -1 : s.sink_blocks[li / (cfg_.block_size / cfg_.residual_sinks)];
    if (s.layers[li].sink_block != want) return "sequence " + u64s(id) + ": a layer's sink block is not its sequence's";
  }
  for (const LayerTable &l : s.layers) {
    if (l.n_lp > l.n_tokens || (!residual() && l.n_lp != l.n_tokens))
      return "sequence " + u64s(id) + ": codec token count above the layer's tokens";
    if (l.blocks.size() != (l.n_lp + bs - 1) / bs)
      return "sequence " + u64s(id) + ": block table size disagrees with token count";
    const uint64_t hp = l.n_tokens - l.n_lp;
    if (hp == 0 ? (!l.res_blocks.empty() || l.res_off != 0)
                : (l.res_off >= bs || l.res_blocks.size() != (l.res_off + hp + bs - 1) / bs))
      return "sequence " + u64s(id) + ": residual block table disagrees with its token count";
    if (l.n_lp % age_unit() != 0)
      return "sequence " + u64s(id) + ": per-channel groups not whole";
    for (int32_t b : l.res_blocks) {
      if (b < 0 || static_cast<uint64_t>(b) >= res_refs.size())
        return "sequence " + u64s(id) + ": invalid residual block id";
      ++res_refs[b];
    }
    if (l.positions.size() != l.tail_index || l.tail_pos > s.length ||
        l.n_tokens != l.tail_index + (s.length - l.tail_pos))
      return "sequence " + u64s(id) + ": position bookkeeping inconsistent";
    for (size_t i = 0; i < l.positions.size(); ++i)
      if (l.positions[i] < 0 || static_cast<uint64_t>(l.positions[i]) >= l.tail_pos ||
          (i && l.positions[i] <= l.positions[i - 1]))
        return "sequence " + u64s(id) + ": positions not increasing";
    if (s.track_scores ? l.scores.size() != l.n_tokens * cfg_.num_kv_heads : !l.scores.empty())
      return "sequence " + u64s(id) + ": score array out of step with the token count";
    for (int32_t b : l.blocks) {
      if (b < 0 || static_cast<uint64_t>(b) >= refs.size())
        return "sequence " + u64s(id) + ": invalid block id";
      ++refs[b];
    }
  }
  return {};
}

std::string Pool::check_prefix() const {
  if (!prefix_) {
    if (alloc_.num_cached() != 0) return "cached blocks without a prefix cache";
    return {};
  }
  const PrefixState &ps = *prefix_;
  uint64_t live = 0;
  for (size_t e = 0; e < ps.entries.size(); ++e) {
    const PrefixEntry &en = ps.entries[e];
    if (!en.live) continue;
    ++live;
    if (ps.map.find(en.key) != static_cast<int64_t>(e)) return "prefix entry not in the key map";
    if (en.blocks.size() != cfg_.num_layers) return "prefix entry without a block per layer";
    for (int32_t b : en.blocks) {
      if (ps.block_entry[b] != static_cast<int32_t>(e)) return "prefix block not mapped to its entry";
      if (alloc_.state(b) == BlockAllocator::State::Free) return "prefix entry holds a free block";
    }
  }
  if (live != ps.map.size()) return "prefix key map and entries disagree";
  for (size_t b = 0; b < ps.block_entry.size(); ++b) {
    const int32_t e = ps.block_entry[b];
    if (e >= 0 && !ps.entries[static_cast<size_t>(e)].live) return "block mapped to a dropped prefix entry";
    if (alloc_.state(static_cast<int32_t>(b)) == BlockAllocator::State::Cached && e < 0)
      return "cached block outside the prefix index";
  }
  return {};
}

std::string Pool::check_invariants() const {
  std::shared_lock lk(mu_);
  std::string err = alloc_.check();
  if (!err.empty()) return err;
  err = res_alloc_.check();
  if (!err.empty()) return "residual: " + err;
  std::vector<uint64_t> refs(alloc_.num_blocks(), 0), res_refs(res_alloc_.num_blocks(), 0);
  uint64_t tokens = 0;
  seqs_.for_each([&](uint64_t id, const Sequence &s) {
    if (err.empty()) err = check_sequence(id, s, refs, res_refs);
    for (const LayerTable &l : s.layers) tokens += l.n_tokens;
  });
  if (!err.empty()) return err;
  if (offload_) {  // blocks reserved for pending loads hold one reference each
    std::lock_guard g(offload_->m);
    for (const auto &[t, l] : offload_->loads)
      for (int32_t b : l.reserved) ++refs[static_cast<size_t>(b)];
  }
  if (tokens != tokens_stored_) return "tokens_stored counter disagrees with the block tables";
  for (size_t b = 0; b < res_refs.size(); ++b)
    if (res_refs[b] != res_alloc_.refcount(static_cast<int32_t>(b)))
      return "residual block " + u64s(b) + ": reference count disagrees with the block tables";
  for (size_t b = 0; b < refs.size(); ++b) {
    const auto st = alloc_.state(static_cast<int32_t>(b));
    if (refs[b] != alloc_.refcount(static_cast<int32_t>(b)))
      return "block " + u64s(b) + ": reference count " +
             u64s(alloc_.refcount(static_cast<int32_t>(b))) + " but held by " + u64s(refs[b]) +
             " block tables";
    if (refs[b] > 0 && st != BlockAllocator::State::Used)
      return "block " + u64s(b) + " held by a block table but not used";
  }
  return check_prefix();
}

}  // namespace kvc::core
