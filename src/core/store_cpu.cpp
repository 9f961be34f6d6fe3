// The CPU store (core/store.h): blocks in anonymous host memory, tokens
// written and read through the block format's codec path, the residual
// staging and the attention sinks; attention through the attention module
// over tiles of the blocks.
#include <sys/mman.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <mutex>
#include <shared_mutex>
#include <tuple>

#include "attention/attention.h"
#include "codec/codec.h"
#include "common/convert.h"
#include "common/error.h"
#include "common/scratch.h"
#include "core/pool_int.h"
#include "core/store.h"

namespace kvc::core {

namespace {

// Per-thread buffers of the queries and outputs in f32.
struct QueryScratch {
  ScratchBuffer<float> q, out;
};
QueryScratch &scratch() {
  thread_local QueryScratch s;
  return s;
}

// A layer of one sequence as attention tiles: one block (or the rest of one)
// per read.
class LayerTiles final : public attention::TileSource {
 public:
  LayerTiles(const PoolCore &p, const uint8_t *arena, uint32_t layer, const LayerTable &l)
      : p_(p), arena_(arena), layer_(layer), l_(l) {}
  uint64_t read(uint64_t t0, uint64_t max_count, float *kt, float *vt) const override {
    const LayerTable &l = l_;
    const uint64_t bs = p_.cfg_.block_size, row = uint64_t(p_.cfg_.num_kv_heads) * p_.cfg_.head_dim;
    uint8_t *k8 = reinterpret_cast<uint8_t *>(kt), *v8 = reinterpret_cast<uint8_t *>(vt);
    if (t0 < l.n_lp) {
      const uint32_t slot = static_cast<uint32_t>(t0 % bs);
      const uint64_t cnt = std::min({bs - slot, l.n_lp - t0, max_count});
      const uint8_t *blk = arena_ + p_.fmt_.block_offset(l.blocks[t0 / bs]);
      p_.fmt_.read_part(0, layer_, blk, slot, cnt, k8, DType::F32, l, t0);
      p_.fmt_.read_part(1, layer_, blk, slot, cnt, v8, DType::F32, l, t0);
      p_.stage_.overlay_sinks(layer_, l, t0, cnt, k8, v8, DType::F32);
      p_.zero_unwritten_rows(false, l.blocks[t0 / bs], slot, cnt, k8, v8, row * sizeof(float));
      return cnt;
    }
    const uint64_t r = l.res_off + (t0 - l.n_lp);
    const uint32_t slot = static_cast<uint32_t>(r % bs);
    const uint64_t cnt = std::min(bs - slot, max_count);
    p_.stage_.read(p_.stage_.ptr(l.res_blocks[r / bs]), slot, cnt, k8, v8, DType::F32);
    p_.zero_unwritten_rows(true, l.res_blocks[r / bs], slot, cnt, k8, v8, row * sizeof(float));
    return cnt;
  }
  // Paged tokens stored plainly (f32 / f16 / bf16), as int8 / int4 / fp8
  // codes with per-token scales or per-group ones within each head, or as
  // int8 / int4 codes with per-channel scales (a tile then ends with its
  // group of tokens), Hadamard-rotated or not, all written, no sink copy over
  // them, no pre-RoPE keys or smoothing to undo: the same tokens read()
  // returns, where they are.
  uint64_t raw(uint64_t t0, uint64_t max_count, attention::RawTile &rt) const override {
    const LayerTable &l = l_;
    const uint64_t bs = p_.cfg_.block_size;
    if (t0 >= l.n_lp || p_.fmt_.pre_rope || p_.fmt_.smooth) return 0;
    if (l.sink_block >= 0 && t0 < p_.cfg_.residual_sinks) return 0;
    const uint32_t slot = static_cast<uint32_t>(t0 % bs);
    uint64_t cnt = std::min({bs - slot, l.n_lp - t0, max_count});
    for (int kv = 0; kv < 2; ++kv) {  // per-channel scales: the tokens of one group
      const codec::Spec &sp = p_.fmt_.part(layer_, kv).spec;
      if (sp.gran == codec::Gran::Channel && sp.group > 0)
        cnt = std::min<uint64_t>(cnt, sp.group - slot % sp.group);
    }
    const int32_t b = l.blocks[t0 / bs];
    if (!p_.written_.all(b, slot, cnt)) return 0;
    const uint8_t *blk = arena_ + p_.fmt_.block_offset(b);
    for (int kv = 0; kv < 2; ++kv)
      if ((p_.fmt_.codebook[kv] && p_.fmt_.codebook[kv]->has(layer_)) ||
          !raw_part(p_.fmt_.part(layer_, kv), blk, slot, p_.cfg_.num_kv_heads, p_.cfg_.head_dim,
                    kv ? rt.v : rt.k))
        return 0;
    return cnt;
  }

 private:
  static bool raw_part(const PartLayout &pl, const uint8_t *blk, uint32_t slot, uint64_t h,
                       uint64_t hd, attention::RawPart &out) {
    using attention::RawType;
    out = attention::RawPart{};
    // Hadamard-rotated codes: whole rotation blocks in each head (the
    // kernels rotate the query, and each run's value sums back)
    if (pl.rotation_block && (pl.rotation_block > hd || hd % pl.rotation_block != 0)) return false;
    out.rotation = pl.rotation_block;
    out.data = blk + pl.offset + slot * pl.token_stride;
    out.token_stride = pl.token_stride;
    out.head_stride = pl.head_stride;
    if (!pl.quantized) {
      switch (pl.spec.dtype) {
        case DType::F32:
          out.type = RawType::F32;
          return true;
        case DType::F16:
          out.type = RawType::F16;
          return true;
        case DType::BF16:
          out.type = RawType::BF16;
          return true;
        default:
          return false;
      }
    }
    // per-token scales, per-group ones whose groups tile each head, or
    // per-channel ones (integer codes)
    const bool grouped = pl.spec.gran == codec::Gran::Group && pl.spec.group < hd;
    const bool channel = pl.spec.gran == codec::Gran::Channel;
    if (pl.spec.outliers || !(pl.spec.gran == codec::Gran::Token || channel ||
                              (pl.spec.gran == codec::Gran::Group && hd % pl.spec.group == 0)))
      return false;
    if (channel && pl.spec.dtype != DType::INT8 && pl.spec.dtype != DType::INT4) return false;
    if (pl.spec.dtype == DType::INT8) {
      out.type = pl.spec.asym ? RawType::UInt8 : RawType::Int8;
      out.offset = 0;
    } else if (pl.spec.dtype == DType::INT4) {
      out.type = RawType::Int4;
      out.offset = pl.spec.asym ? 0 : 8;  // codec::int_format's offset of int4 codes
    } else if (pl.spec.dtype == DType::FP8_E4M3 || pl.spec.dtype == DType::FP8_E5M2) {
      out.type = pl.spec.dtype == DType::FP8_E4M3 ? RawType::FP8E4M3 : RawType::FP8E5M2;
      out.offset = 0;
    } else {
      return false;
    }
    if (channel) {  // [group of tokens][head][dim] scales (and zeros): slot's group's
      const uint64_t gb = (slot / pl.spec.group) * h * hd * pl.scale_bytes;
      out.scale = blk + pl.scale_offset + gb;
      out.zero = pl.spec.asym ? blk + pl.zero_offset + gb : nullptr;
      out.scale_token_stride = 0;
      out.scale_head_stride = hd * pl.scale_bytes;
      out.scale_f16 = pl.scale_bytes == 2;
      out.channel = true;
      return true;
    }
    // one scale per KV head, or per group of a head's values ([head][group])
    const uint64_t sb = pl.scales_per_token * pl.scale_bytes;
    out.scale = blk + pl.scale_offset + slot * sb;
    out.zero = pl.spec.asym ? blk + pl.zero_offset + slot * sb : nullptr;
    out.scale_token_stride = sb;
    out.group = grouped ? static_cast<uint32_t>(pl.spec.group) : 0;
    out.scale_head_stride = grouped ? hd / pl.spec.group * pl.scale_bytes : pl.scale_bytes;
    out.scale_f16 = pl.scale_bytes == 2;
    return true;
  }

  const PoolCore &p_;
  const uint8_t *arena_;  // the store's block memory
  uint32_t layer_;
  const LayerTable &l_;
};

// Transparent huge pages where the system allows them on request: decode
// reads a KV head's rows across many blocks, and 4 KiB pages put a TLB miss
// on most of those reads (an advice only; ignored where unsupported).
void advise_huge_pages(void *p, uint64_t bytes) {
#ifdef MADV_HUGEPAGE
  if (bytes >= (uint64_t{2} << 20)) (void)madvise(p, bytes, MADV_HUGEPAGE);
#else
  (void)p;
  (void)bytes;
#endif
}

class CpuStore final : public BlockStore {
 public:
  explicit CpuStore(PoolCore &c) : c_(c), bytes_(c.arena_bytes_) {
    // Anonymous mapping: page-aligned and zero-filled; pages are touched lazily.
    void *p = mmap(nullptr, bytes_, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED)
      fail(Errc::OutOfMemory, "cannot map " + u64s(bytes_) + " bytes of block memory");
    arena_ = static_cast<uint8_t *>(p);
    advise_huge_pages(p, bytes_);
  }
  ~CpuStore() override { munmap(arena_, bytes_); }
  uint8_t *arena() const override { return arena_; }

  void taken(int32_t) override {}
  void reserved(int32_t, uint32_t, uint64_t) override {}
  void zero(int32_t b) override { std::memset(ptr(b), 0, c_.fmt_.block_stride(b)); }
  // (dst and src are blocks of one format: copy-on-write takes a block of src's)
  void copy(int32_t dst, int32_t src) override {
    std::memcpy(ptr(dst), ptr(src), c_.fmt_.block_stride(src));
  }
  const uint8_t *host_block(int32_t b) const override { return ptr(b); }
  void to_host(const int32_t *blocks, size_t n, uint8_t *host) const override {
    const uint32_t bs = c_.cfg_.block_size;
    for (size_t i = 0; i < n; ++i) {
      const uint32_t cl = c_.alloc_.class_of(blocks[i]);
      const uint64_t stride = c_.fmt_.cls[cl].stride;
      std::memcpy(host, ptr(blocks[i]), stride);
      // The copy carries zeros, not an earlier owner's bytes, in the slots
      // no one wrote since the block was taken (a swap out and in keeps them so).
      if (!c_.written_.all(blocks[i], 0, bs))
        for (uint32_t t = 0; t < bs; ++t)
          if (!c_.written_.test(blocks[i], t)) c_.fmt_.zero_slots(cl, host, t, 1);
      host += stride;
    }
  }
  void from_host(const int32_t *blocks, size_t n, const uint8_t *host) override {
    for (size_t i = 0; i < n; ++i) {
      const uint64_t stride = c_.fmt_.block_stride(blocks[i]);
      std::memcpy(ptr(blocks[i]), host, stride);
      host += stride;
    }
  }
  void set_stream(void *stream) override {
    if (stream)
      fail(Errc::InvalidArgument,
           "a CPU pool runs on the calling thread: only a NULL stream is accepted");
  }
  uint64_t sync() override { return 0; }

  Input prepare(uint64_t n, const void *k, const void *v, DType src,
                InputScratch &scratch) const override {
    Input in;
    in.k = k;
    in.v = v;
    in.src = src;
    in.n = n;
    // Quantized parts: convert the input to f32 once and reject NaN / Inf
    // before anything is written.
    const uint64_t row = static_cast<uint64_t>(c_.cfg_.num_kv_heads) * c_.cfg_.head_dim;
    const float *kf = nullptr, *vf = nullptr;  // (Pool::append checked n x row against 2^40)
    in.smooth = c_.fmt_.smooth_snapshot();     // (the write checks it is still the pool's)
    const bool ktrans = c_.fmt_.pre_rope || in.smooth;
    // Pre-RoPE keys are rotated back (then Hadamard-rotated) by write(), at
    // the RoPE positions of the layer's indices they land on, into kpre.
    float *kpre = nullptr;
    if (c_.fmt_.quantized(0) || c_.fmt_.quantized(1)) {
      float *buf = scratch.floats((ktrans ? 3 : 2) * n * row);
      for (int kv = 0; kv < 2; ++kv) {
        if (!c_.fmt_.quantized(kv)) continue;
        const void *in_kv = kv == 0 ? k : v;
        const char *name = kv == 0 ? "k" : "v";
        // f16 rows that nothing transforms but a rotation: checked here,
        // quantized (and rotated) straight from the input by write_part (no
        // f32 copy)
        if (src == DType::F16 && quantize_direct(kv, ktrans)) {
          if (!direct_keys(kv, static_cast<const uint16_t *>(in_kv), n, in, scratch))
            codec::check_finite_raw(in_kv, src, n * row, name, row, c_.cfg_.head_dim);
          continue;
        }
        const bool pre = kv == 0 && c_.fmt_.pre_rope;
        // f32 rows that nothing rotates here: encoded from the input itself
        if (src == DType::F32 && !(c_.fmt_.rotation_block(kv) && !(kv == 0 && ktrans))) {
          const float *x = static_cast<const float *>(in_kv);
          codec::check_finite(x, n * row, name, row, c_.cfg_.head_dim);
          codec::check_rotatable(x, n * row,
                                 pre ? std::max<uint32_t>(2, 2 * c_.fmt_.rotation_block(kv))
                                     : c_.fmt_.rotation_block(kv),
                                 name, row, c_.cfg_.head_dim);
          (kv == 0 ? kf : vf) = x;
          continue;
        }
        float *dst = buf + kv * n * row;
        convert(in_kv, src, dst, DType::F32, n * row);
        codec::check_finite(dst, n * row, name, row, c_.cfg_.head_dim);
        // Undoing RoPE can grow a value to its pair's norm (up to sqrt(2) x):
        // pre-RoPE keys are checked as if the rotation block were twice as large.
        // (Smoothed keys are clamped into a rotatable range by smooth_keys.)
        codec::check_rotatable(dst, n * row,
                               pre ? std::max<uint32_t>(2, 2 * c_.fmt_.rotation_block(kv))
                                   : c_.fmt_.rotation_block(kv),
                               name, row, c_.cfg_.head_dim);
        // Rotate each head before calibrating and encoding (keys with a
        // transform of their own: write() does, after it).
        if (c_.fmt_.rotation_block(kv) && !(kv == 0 && ktrans))
          for (uint64_t t = 0; t < n; ++t)
            codec::hadamard(dst + t * row, row, c_.fmt_.rotation_block(kv));
        (kv == 0 ? kf : vf) = dst;
      }
      if (ktrans) kpre = buf + 2 * n * row;
      // Int8 residual rows take finite values only: a part stored plainly
      // once encoded (k-f16 + v-int4, say) is checked too, chunk by chunk.
      if (c_.stage_.active && c_.cfg_.residual_dtype == DType::INT8)
        for (int kv = 0; kv < 2; ++kv) {
          if (c_.fmt_.quantized(kv)) continue;
          const uint8_t *p = static_cast<const uint8_t *>(kv == 0 ? k : v);
          float tmp[1024];
          for (uint64_t i = 0; i < n * row; i += 1024) {
            const uint64_t m = std::min<uint64_t>(1024, n * row - i);
            convert(p + i * dtype_bytes(src), src, tmp, DType::F32, m);
            for (uint64_t j = 0; j < m; ++j)
              if (!std::isfinite(tmp[j])) {
                fail(Errc::NonFinite,
                     codec::element_name(kv == 0 ? "k" : "v", i + j, row, c_.cfg_.head_dim) +
                         " is " + (std::isnan(tmp[j]) ? "NaN" : "Inf") +
                         ": int8 residual rows (residual_dtype) take finite values only; "
                         "nothing was written");
              }
          }
        }
    }
    in.kf = kf;
    in.vf = vf;
    in.kpre = kpre;
    return in;
  }

  // For part kv's f16 rows that go straight to the codec: their groups' keys
  // (codec::f16_keys: one pass that is also the finiteness check, which
  // quantize() then does not repeat) into in.keys[kv], where every format
  // class groups the part's values alike; true when they were computed and
  // every value is finite (false: check_finite_raw reports the element).
  bool direct_keys(int kv, const uint16_t *x, uint64_t n, Input &in, InputScratch &scratch) const {
    const uint64_t hd = c_.cfg_.head_dim, row = c_.cfg_.num_kv_heads * hd;
    // (the keys are those of the unrotated values; rotated parts ignore them)
    codec::Spec s = c_.fmt_.cls[0].part[kv].spec;
    s.rotation_block = 0;
    const auto grouping = [](const codec::Spec &p) {
      return std::make_tuple(p.gran, p.gran == codec::Gran::Group ? p.group : 0,
                             p.asym || p.full_range);
    };
    for (const FormatClass &fc : c_.fmt_.cls)
      if (grouping(fc.part[kv].spec) != grouping(s)) return false;
    const bool token = s.gran == codec::Gran::Token;
    const uint64_t rows = token ? n * c_.cfg_.num_kv_heads : n, d = token ? hd : row;
    if (!codec::f16_keys_apply(s, d)) return false;
    const uint64_t count = codec::f16_keys_count(s, rows, d);
    uint16_t *lo = scratch.keys(kv, 2 * count), *hi = lo + count;
    if (!codec::f16_keys(s, x, rows, d, lo, hi)) return false;
    in.keys[kv] = {s.asym || s.full_range ? lo : nullptr, hi};
    in.keys_per_token[kv] = n ? (count - 4) / n : 0;
    return true;
  }

  // Whether part kv's f16 rows go straight to the codec (codec::quantize,
  // which also takes the Hadamard rotation, in write_part): no RoPE undo,
  // smoothing or codebook, and per-token or per-group scales without
  // outliers in every format class. (No f16 value is too large to rotate.)
  bool quantize_direct(int kv, bool ktrans) const {
    if ((kv == 0 && ktrans) || c_.fmt_.codebook[kv]) return false;
    for (const FormatClass &fc : c_.fmt_.cls) {
      const PartLayout &pl = fc.part[kv];
      if (!pl.quantized || pl.spec.outliers || pl.spec.static_scale != 0.0 ||
          !(pl.spec.gran == codec::Gran::Token || pl.spec.gran == codec::Gran::Group))
        return false;
      // per-token scales: rows of a head, so rotation blocks within it
      const uint64_t hd = c_.cfg_.head_dim;
      if (pl.spec.gran == codec::Gran::Token && pl.rotation_block &&
          (pl.rotation_block > hd || hd % pl.rotation_block != 0))
        return false;
    }
    return true;
  }

  void write(uint32_t layer, const LayerTable &l, uint64_t idx0, const Input &in) override {
    const BlockDiv bs = block_div(c_.cfg_.block_size);
    const uint64_t n = in.n, row = static_cast<uint64_t>(c_.cfg_.num_kv_heads) * c_.cfg_.head_dim;
    const void *k = in.k, *v = in.v;
    const DType src = in.src;
    const float *kf = in.kf, *vf = in.vf;
    float *kpre = in.kpre;
    const uint8_t *ks = static_cast<const uint8_t *>(k);
    const uint8_t *vs = static_cast<const uint8_t *>(v);
    const uint64_t src_row = row * dtype_bytes(src);
    const float *kq = kf;
    // Pre-RoPE keys: undo RoPE at each token's RoPE position; smoothed keys:
    // (k - offset) / scale per channel; then the Hadamard rotation.
    if (kpre) {
      std::memcpy(kpre, kf, n * row * sizeof(float));
      if (c_.fmt_.pre_rope)
        for (uint64_t t = 0; t < n; ++t)
          c_.fmt_.pre_rope->rotate(kpre + t * row, c_.cfg_.num_kv_heads,
                                   static_cast<uint64_t>(l.rope_position_of(idx0 + t)), -1);
      if (in.smooth) c_.fmt_.smooth_keys(*in.smooth, layer, kpre, n);
      if (c_.fmt_.rotation_block(0))
        for (uint64_t t = 0; t < n; ++t)
          codec::hadamard(kpre + t * row, row, c_.fmt_.rotation_block(0));
      kq = kpre;
    }
    // sinks saturate: read from their copies
    const uint64_t skip = c_.stage_.leading_sinks(l, idx0, n);
    for (int kv = 0; kv < 2; ++kv)
      if (c_.fmt_.per_tensor(kv, layer))
        c_.fmt_.calibrate(kv, layer, (kv == 0 ? kq : vf) + skip * row, (n - skip) * row);
    uint64_t done = 0;
    while (done < n) {
      const uint64_t idx = idx0 + done;
      if (idx < l.n_lp) {
        const uint32_t slot = static_cast<uint32_t>(idx % bs);
        const uint64_t run = std::min<uint64_t>({n - done, bs - slot, l.n_lp - idx});
        uint8_t *blk = ptr(l.blocks[idx / bs]);
        codec::F16Keys keys[2];  // (the run's first group's)
        for (int kv = 0; kv < 2; ++kv)
          if (in.keys[kv].hi) {
            const uint64_t off = done * in.keys_per_token[kv];
            keys[kv] = {in.keys[kv].lo ? in.keys[kv].lo + off : nullptr, in.keys[kv].hi + off};
          }
        c_.fmt_.write_part(0, layer, blk, ks + done * src_row, src, kq ? kq + done * row : nullptr,
                           slot, run, in.keys[0].hi ? &keys[0] : nullptr);
        c_.fmt_.write_part(1, layer, blk, vs + done * src_row, src, vf ? vf + done * row : nullptr,
                           slot, run, in.keys[1].hi ? &keys[1] : nullptr);
        c_.stage_.write_sinks(layer, l, idx, run, ks + done * src_row, vs + done * src_row, src);
        done += run;
      } else {
        const uint64_t r = l.res_off + (idx - l.n_lp);
        const uint32_t slot = static_cast<uint32_t>(r % bs);
        const uint64_t run = std::min<uint64_t>(n - done, bs - slot);
        c_.stage_.write(c_.stage_.ptr(l.res_blocks[r / bs]), slot, ks + done * src_row,
                        vs + done * src_row, src, run);
        done += run;
      }
    }
  }

  void write_rows(uint32_t layer, int32_t b, uint32_t slot, uint64_t n, const float *k,
                  const float *v) override {
    uint8_t *blk = ptr(b);
    c_.fmt_.write_part(0, layer, blk, reinterpret_cast<const uint8_t *>(k), DType::F32, k, slot, n);
    c_.fmt_.write_part(1, layer, blk, reinterpret_cast<const uint8_t *>(v), DType::F32, v, slot, n);
  }

  void read(uint32_t layer, const LayerTable &l, uint64_t first, uint64_t n, void *k_out,
            void *v_out, DType dst) const override {
    const BlockDiv bs = block_div(c_.cfg_.block_size);
    const uint64_t hd = c_.cfg_.head_dim, h = c_.cfg_.num_kv_heads;
    const uint64_t row = h * hd * dtype_bytes(dst);
    uint64_t done = 0;
    uint8_t *ko = static_cast<uint8_t *>(k_out), *vo = static_cast<uint8_t *>(v_out);
    while (done < n) {
      const uint64_t idx = first + done;
      if (idx < l.n_lp) {
        const uint32_t slot = static_cast<uint32_t>(idx % bs);
        const uint64_t run = std::min<uint64_t>({n - done, bs - slot, l.n_lp - idx});
        const uint8_t *blk = ptr(l.blocks[idx / bs]);
        if (ko) c_.fmt_.read_part(0, layer, blk, slot, run, ko + done * row, dst, l, idx);
        if (vo) c_.fmt_.read_part(1, layer, blk, slot, run, vo + done * row, dst, l, idx);
        c_.stage_.overlay_sinks(layer, l, idx, run, ko ? ko + done * row : nullptr,
                                vo ? vo + done * row : nullptr, dst);
        c_.zero_unwritten_rows(false, l.blocks[idx / bs], slot, run, ko ? ko + done * row : nullptr,
                               vo ? vo + done * row : nullptr, row);
        done += run;
      } else {
        const uint64_t r = l.res_off + (idx - l.n_lp);
        const uint32_t slot = static_cast<uint32_t>(r % bs);
        const uint64_t run = std::min<uint64_t>(n - done, bs - slot);
        c_.stage_.read(c_.stage_.ptr(l.res_blocks[r / bs]), slot, run,
                       ko ? ko + done * row : nullptr, vo ? vo + done * row : nullptr, dst);
        c_.zero_unwritten_rows(true, l.res_blocks[r / bs], slot, run,
                               ko ? ko + done * row : nullptr, vo ? vo + done * row : nullptr, row);
        done += run;
      }
    }
  }

  void move_tokens(const LayerTable &l, const std::vector<uint32_t> &k, uint64_t first) override {
    // A run of consecutive tokens at a time (one memmove per part and run). A
    // run stays inside one source and one destination block; memmove because
    // a run may overlap itself inside one block.
    const uint64_t bs = c_.cfg_.block_size, kn = k.size();
    for (uint64_t j = first; j < kn;) {
      if (k[j] == j) {
        ++j;
        continue;
      }
      const uint64_t ss = k[j] % bs, ds = j % bs;
      uint64_t run = 1;
      while (j + run < kn && k[j + run] == k[j] + run && ss + run < bs && ds + run < bs) ++run;
      c_.fmt_.move_run(c_.alloc_.class_of(l.blocks[j / bs]), ptr(l.blocks[j / bs]), ds,
                       ptr(l.blocks[k[j] / bs]), ss, run);
      j += run;
    }
  }

  void rotate_keys(uint32_t layer, const LayerTable &l, const std::vector<uint64_t> &idx,
                   const std::vector<int64_t> &delta, RopeShift &rope) override {
    const uint64_t bs = c_.cfg_.block_size, h = c_.cfg_.num_kv_heads, hd = c_.cfg_.head_dim,
                   row = h * hd;
    const PartLayout &kp = c_.fmt_.part(layer, 0);
    float *krow = scratch_input(2 * row);
    for (size_t i = 0; i < idx.size(); ++i) {
      const uint64_t j = idx[i];
      uint8_t *blk = ptr(l.blocks[j / bs]);
      const uint32_t slot = static_cast<uint32_t>(j % bs);
      c_.fmt_.read_part(0, layer, blk, slot, 1, reinterpret_cast<uint8_t *>(krow), DType::F32, l,
                        j);
      for (uint64_t hh = 0; hh < h; ++hh) rope.rotate(krow + hh * hd, delta[i]);
      if (kp.quantized) {
        if (c_.fmt_.smooth) c_.fmt_.smooth_keys(layer, krow, 1);
        if (kp.rotation_block) codec::hadamard(krow, row, kp.rotation_block);
        c_.fmt_.write_part(0, layer, blk, nullptr, DType::F32, krow, slot, 1);
      } else {
        c_.fmt_.write_part(0, layer, blk, reinterpret_cast<const uint8_t *>(krow), DType::F32,
                           nullptr, slot, 1);
      }
    }
  }

  void attention(uint32_t layer, const uint64_t *ids, size_t n_seqs, const void *q, uint64_t n_q,
                 bool prefill, void *out, float *lse, const AttnParams &p, float scale) override {
    const uint64_t hd = c_.cfg_.head_dim;
    const uint64_t per_seq = n_q * p.num_q_heads * hd;
    // Queries to f32, checked finite, scaled (before any output is written).
    QueryScratch &sc = scratch();
    float *qf = sc.q.get(per_seq * n_seqs);
    convert(q, p.q_dtype, qf, DType::F32, per_seq * n_seqs);
    for (uint64_t i = 0; i < per_seq * n_seqs; ++i) {
      if (!std::isfinite(qf[i]))
        fail(Errc::NonFinite, "query element " + u64s(i) + " is NaN or Inf: nothing was written");
      qf[i] *= scale;
      if (!std::isfinite(qf[i]))
        fail(Errc::NonFinite,
             "query element " + u64s(i) + " times the scale overflows f32: nothing was written");
    }
    float *of = sc.out.get(per_seq * n_seqs);
    std::vector<float> lse_local;
    float *lf = lse;
    if (!lf) {
      lse_local.resize(n_seqs * n_q * p.num_q_heads);
      lf = lse_local.data();
    }
    const uint32_t H = c_.heads();
    if (H == 1) {
      run(layer, ids, n_seqs, qf, n_q, prefill, of, lf, p);
    } else {
      // A head-wise pool: each KV head's table with its group of query heads
      // (rows [n_seqs][n_q][G][D] gathered, outputs and lse scattered back).
      const uint64_t G = p.num_q_heads / H, rows = n_seqs * n_q;
      std::vector<float> qh(rows * G * hd), oh(rows * G * hd), lh(rows * G);
      AttnParams ph = p;
      ph.num_q_heads = static_cast<uint32_t>(G);
      for (uint32_t h = 0; h < H; ++h) {
        for (uint64_t r = 0; r < rows; ++r)
          std::copy_n(qf + (r * p.num_q_heads + h * G) * hd, G * hd, &qh[r * G * hd]);
        run(layer * H + h, ids, n_seqs, qh.data(), n_q, prefill, oh.data(), lh.data(), ph);
        for (uint64_t r = 0; r < rows; ++r) {
          std::copy_n(&oh[r * G * hd], G * hd, of + (r * p.num_q_heads + h * G) * hd);
          std::copy_n(&lh[r * G], G, lf + r * p.num_q_heads + h * G);
        }
      }
    }
    convert(of, DType::F32, out, p.out_dtype, per_seq * n_seqs);
  }

 private:
  // Attention over one table (a layer; a head-wise pool's head) of f32
  // queries already scaled: outputs of and log-sum-exps lf, f32.
  void run(uint32_t layer, const uint64_t *ids, size_t n_seqs, const float *qf, uint64_t n_q,
           bool prefill, float *of, float *lf, const AttnParams &p) {
    const uint64_t per_seq = n_q * p.num_q_heads * c_.cfg_.head_dim;
    // Every observed sequence must track scores: enabling takes the pool lock
    // exclusively; the state is checked again under the shared lock (a
    // sequence may have been freed and created again in between).
    std::shared_lock lk(c_.mu_, std::defer_lock);
    for (;;) {
      lk.lock();
      bool need = false;
      if (p.observe)
        for (size_t i = 0; i < n_seqs; ++i) need = need || !c_.find(ids[i]).track_scores;
      if (!need) break;
      lk.unlock();
      std::unique_lock ex(c_.mu_);
      for (size_t i = 0; i < n_seqs; ++i) c_.enable_scores(c_.find(ids[i]));
    }
    c_.check_layer(layer);
    for (size_t i = 0; i < n_seqs; ++i) {
      const Sequence &s = c_.find(ids[i]);
      const LayerTable &l = s.layers[layer];
      if (prefill && n_q > l.n_tokens)
        fail(Errc::OutOfRange, u64s(n_q) + " prefill queries but layer " + u64s(layer) +
                                   " of sequence " + u64s(ids[i]) + " holds " + u64s(l.n_tokens) +
                                   " tokens (append the chunk's K/V first)");
    }
    const attention::Shape shape{
        p.num_q_heads,      c_.cfg_.num_kv_heads,     c_.cfg_.head_dim,
        c_.cfg_.block_size, p.query_int8 && !prefill, p.int_values && !prefill};
    if (p.num_threads > 1 && !prefill && !p.observe) {
      std::vector<LayerTiles> tiles;
      tiles.reserve(n_seqs);
      std::vector<const attention::TileSource *> src(n_seqs);
      std::vector<uint64_t> ns(n_seqs);
      for (size_t i = 0; i < n_seqs; ++i) {
        const LayerTable &l = c_.find(ids[i]).layers[layer];
        tiles.emplace_back(c_, arena_, layer, l);
        src[i] = &tiles.back();
        ns[i] = l.n_tokens;
      }
      attention::attend_threads(shape, src, ns, qf, of, lf, p.num_threads);
      return;
    }
    // replace: clear every observed sequence first (an id may repeat in the batch)
    if (p.observe == 2) {
      std::lock_guard<std::mutex> g(c_.scores_mu_);
      for (size_t i = 0; i < n_seqs; ++i) {
        LayerTable &l = const_cast<Sequence &>(c_.find(ids[i])).layers[layer];
        std::fill(l.scores.begin(), l.scores.end(), 0.0f);
      }
    }
    if (p.num_threads > 1 && !p.observe) {  // prefill: blocks of query rows over threads
      for (size_t i = 0; i < n_seqs; ++i) {
        const LayerTable &l = c_.find(ids[i]).layers[layer];
        attention::attend_rows_threads(shape, LayerTiles(c_, arena_, layer, l), l.n_tokens,
                                       qf + i * per_seq, n_q, prefill, of + i * per_seq,
                                       lf + i * n_q * p.num_q_heads, p.num_threads);
      }
      return;
    }
    for (size_t i = 0; i < n_seqs; ++i) {
      Sequence &s = const_cast<Sequence &>(c_.find(ids[i]));
      LayerTable &l = s.layers[layer];
      attention::attend(shape, LayerTiles(c_, arena_, layer, l), l.n_tokens, qf + i * per_seq, n_q,
                        prefill, of + i * per_seq, lf + i * n_q * p.num_q_heads,
                        p.observe ? l.scores.data() : nullptr,
                        prefill ? p.observe_from : 0,  // decode: the query is always observed
                        &c_.scores_mu_, p.observe == 4 /* KVC_OBSERVE_MAX */);
    }
  }

  uint8_t *ptr(int32_t b) const { return arena_ + c_.fmt_.block_offset(b); }
  PoolCore &c_;
  uint64_t bytes_;
  uint8_t *arena_ = nullptr;
};

}  // namespace

std::unique_ptr<BlockStore> make_cpu_store(PoolCore &c) {
  return std::make_unique<CpuStore>(c);
}

}  // namespace kvc::core
