// The int8 query's int8-key scores on Intel AMX tiles (attention/fused.h,
// "AMX"): x86-64 Linux, CPUs with AMX-TILE and AMX-INT8 (Sapphire Rapids and
// later), chosen at run time.
//
// A band of 16 tokens of one KV head: the key rows, read in place as a
// 16 x 64-byte tile per 64 dimensions (row = token, the stored codes), meet
// the query's codes of those dimensions laid out as the second operand of
// TDPBSSD (signed codes) or TDPBUSD (unsigned ones), up to 4 query heads a
// tile (16 rows of 4 dimensions x 4 heads): one instruction per 64
// dimensions gives the 16 x 4 integer sums that scores_i8_512 (fused.cpp)
// builds with 4 vpdpbusd per token and head and a horizontal sum. The sums
// are exact integers in both, so the scores (sum - corr) x scale are the
// same floats, bit for bit.

// GCC 12's 512-bit intrinsics (conversions, permutes) start from an
// undefined vector that -W(maybe-)uninitialized reports once they are
// inlined; no variable of this file is read uninitialized.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#endif

#include "attention/fused.h"

#include <cstdlib>
#include <cstring>

#if defined(__x86_64__) && defined(__linux__)
#include <cpuid.h>
#include <immintrin.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <atomic>

namespace kvc::attention::fused {

namespace {

#define KVC_AMX __attribute__((target("avx2,avx512f,avx512vl,avx512bw,amx-tile,amx-int8")))

// CPUID leaf 7: AMX-TILE (EDX bit 24) and AMX-INT8 (bit 25); XCR0 bits 17
// and 18 (the OS manages XTILECFG and XTILEDATA); then Linux's per-process
// permission for the tile data (arch_prctl ARCH_REQ_XCOMP_PERM, Linux 5.16+),
// asked for once, the first time a decode could use the tiles. Refused (an
// older kernel, a seccomp filter, a sigaltstack too small for the larger
// signal frame): no AMX. The environment variable KVCACHE_NO_AMX (set, not
// "0") keeps the process from asking (the permission cannot be given back).
bool detect_amx() {
  if (const char *e = std::getenv("KVCACHE_NO_AMX"); e && *e && std::strcmp(e, "0") != 0)
    return false;
  unsigned a = 0, b = 0, c = 0, d = 0;
  if (!__get_cpuid_count(7, 0, &a, &b, &c, &d)) return false;
  if (!(d & (1u << 24)) || !(d & (1u << 25))) return false;
  if (!__get_cpuid(1, &a, &b, &c, &d) || !(c & (1u << 27))) return false;  // OSXSAVE
  unsigned lo = 0, hi = 0;
  __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
  if ((lo & (3u << 17)) != (3u << 17)) return false;
  constexpr long kReqXcompPerm = 0x1023, kXfeatureXtiledata = 18;
  return syscall(SYS_arch_prctl, kReqXcompPerm, kXfeatureXtiledata) == 0;
}

bool cpu_amx() {
  static const bool has = detect_amx();
  return has;
}

std::atomic<bool> g_amx_on{true};

// The tile configuration (palette 1): tiles 0 and 7 the 16 x 4 int32 sums of
// even and odd bands, tiles 1 and 2 two 64-dimension chunks of 16 key rows
// (64 bytes each), tiles 3 and 4 the query's matching codes (16 rows of 4
// heads x 4 bytes).
struct alignas(64) TileConfig {
  uint8_t palette = 1;
  uint8_t start_row = 0;
  uint8_t reserved[14] = {};
  uint16_t colsb[16] = {16, 64, 64, 16, 16, 0, 0, 16};
  uint8_t rows[16] = {16, 16, 16, 16, 16, 0, 0, 16};
};
static_assert(sizeof(TileConfig) == 64);

}  // namespace

bool amx_in_use() {
  return g_amx_on.load(std::memory_order_relaxed) && int8_query_available() && cpu_amx();
}

bool set_amx(bool on) {
  g_amx_on.store(on, std::memory_order_relaxed);
  return amx_in_use();
}

uint64_t amx_query_bytes(uint64_t q_heads, uint64_t kv_heads, uint64_t head_dim) {
  const uint64_t grp = q_heads / kv_heads, pieces = (grp + 3) / 4;
  return kv_heads * pieces * (head_dim / 64) * 256;
}

void amx_query_tiles(const int8_t *codes, uint64_t q_heads, uint64_t kv_heads, uint64_t head_dim,
                     int8_t *out) {
  const uint64_t grp = q_heads / kv_heads, pieces = (grp + 3) / 4, nch = head_dim / 64;
  for (uint64_t g = 0; g < kv_heads; ++g)
    for (uint64_t p = 0; p < pieces; ++p)
      for (uint64_t ch = 0; ch < nch; ++ch) {
        int8_t *t = out + ((g * pieces + p) * nch + ch) * 256;
        for (uint64_t r = 0; r < 16; ++r)
          for (uint64_t j = 0; j < 4; ++j) {
            int8_t *w = t + 16 * r + 4 * j;
            if (4 * p + j < grp)
              std::memcpy(w, codes + (g * grp + 4 * p + j) * head_dim + ch * 64 + 4 * r, 4);
            else
              std::memset(w, 0, 4);
          }
      }
}

namespace {

// A band whose sums wait in the tile store's buffer for their scores.
struct Band {
  uint64_t grp = 0;
  const int32_t *corr = nullptr;  // null: signed keys (the sums are the scores' integers)
  const float *qs = nullptr;
  float *s = nullptr;
  uint64_t ss = 0;
};
// The scores of a run go through a one-band pipeline: a vector load of the
// tile store's sums waits until that store has left the store buffer, so a
// call multiplies its band and writes the scores of the band before.
struct Pipeline {
  alignas(64) int32_t cb[2][kAmxMaxPieces * 64];  // [band parity][piece][token][4 heads]
  Band band[2];
  uint64_t count = 0;  // bands taken since amx_begin
  uint64_t total = 0;  // bands taken by this thread (amx_bands_here)
};
thread_local Pipeline t_pipe;

// The band's sums (tile C: 0 or 7 by parity), stored to cb, one piece of 4
// query heads at a time, two 64-dimension chunks a step. (A macro: GCC's
// tile intrinsics take the tile numbers as literal text.)
#define KVC_AMX_MULTIPLY(NAME, C, DP)                                                              \
  KVC_AMX void NAME(const uint8_t *k0, uint64_t kts, uint64_t nch, uint64_t grp, const int8_t *bt, \
                    int32_t *cb) {                                                                 \
    const uint64_t pieces = (grp + 3) / 4;                                                         \
    for (uint64_t p = 0; p < pieces; ++p) {                                                        \
      _tile_zero(C);                                                                               \
      const int8_t *q = bt + p * nch * 256;                                                        \
      uint64_t ch = 0;                                                                             \
      for (; ch + 2 <= nch; ch += 2) {                                                             \
        _tile_loadd(1, k0 + ch * 64, kts);                                                         \
        _tile_loadd(2, k0 + ch * 64 + 64, kts);                                                    \
        _tile_loadd(3, q + ch * 256, 16);                                                          \
        _tile_loadd(4, q + ch * 256 + 256, 16);                                                    \
        DP(C, 1, 3);                                                                               \
        DP(C, 2, 4);                                                                               \
      }                                                                                            \
      if (ch < nch) {                                                                              \
        _tile_loadd(1, k0 + ch * 64, kts);                                                         \
        _tile_loadd(3, q + ch * 256, 16);                                                          \
        DP(C, 1, 3);                                                                               \
      }                                                                                            \
      _tile_stored(C, cb + 64 * p, 16);                                                            \
    }                                                                                              \
  }
KVC_AMX_MULTIPLY(multiply_ss0, 0, _tile_dpbssd)
KVC_AMX_MULTIPLY(multiply_ss7, 7, _tile_dpbssd)
KVC_AMX_MULTIPLY(multiply_us0, 0, _tile_dpbusd)
KVC_AMX_MULTIPLY(multiply_us7, 7, _tile_dpbusd)
#undef KVC_AMX_MULTIPLY

// s[j x ss + t] = (sum - corr[j]) x qs[j] for the band's heads and 16
// tokens: head j's sums are words j, j + 4, .. of its piece (tokens 0-7 from
// the first two vectors, 8-15 from the last two, one index for both).
KVC_AMX void write_scores(const Band &b, const int32_t *cb) {
  const __m512i lane4 =
      _mm512_slli_epi32(_mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15), 2);
  for (uint64_t p = 0; 4 * p < b.grp; ++p) {
    const int32_t *c = cb + 64 * p;
    // (unaligned loads: t_pipe's alignas(64) is not promised for the dynamic
    // TLS of a dlopen'ed library on every libc; the same speed when aligned)
    const __m512i x0 = _mm512_loadu_si512(c), x1 = _mm512_loadu_si512(c + 16),
                  x2 = _mm512_loadu_si512(c + 32), x3 = _mm512_loadu_si512(c + 48);
    const uint64_t jn = b.grp - 4 * p < 4 ? b.grp - 4 * p : 4;
    for (uint64_t j = 0; j < jn; ++j) {
      const __m512i idx = _mm512_and_si512(
          _mm512_add_epi32(lane4, _mm512_set1_epi32(static_cast<int>(j))), _mm512_set1_epi32(31));
      __m512i y = _mm512_mask_blend_epi32(0xff00, _mm512_permutex2var_epi32(x0, idx, x1),
                                          _mm512_permutex2var_epi32(x2, idx, x3));
      const uint64_t hh = 4 * p + j;
      if (b.corr) y = _mm512_sub_epi32(y, _mm512_set1_epi32(b.corr[hh]));
      _mm512_storeu_ps(b.s + hh * b.ss,
                       _mm512_mul_ps(_mm512_cvtepi32_ps(y), _mm512_set1_ps(b.qs[hh])));
    }
  }
}

}  // namespace

uint64_t amx_bands_here() {
  return t_pipe.total;
}

KVC_AMX void amx_begin() {
  static const TileConfig cfg;
  _tile_loadconfig(&cfg);
  t_pipe.count = 0;
}

KVC_AMX void amx_end() {
  Pipeline &pp = t_pipe;
  if (pp.count) write_scores(pp.band[(pp.count - 1) & 1], pp.cb[(pp.count - 1) & 1]);
  pp.count = 0;
  _tile_release();
}

KVC_AMX void scores_i8_amx(const uint8_t *k0, uint64_t kts, uint64_t hd, uint64_t grp,
                           bool is_signed, const int8_t *bt, const int32_t *corr, const float *qs,
                           float *s, uint64_t ss) {
  Pipeline &pp = t_pipe;
  const uint64_t i = pp.count++;
  ++pp.total;
  const int k = static_cast<int>(i & 1);
  if (is_signed) {
    if (k)
      multiply_ss7(k0, kts, hd / 64, grp, bt, pp.cb[k]);
    else
      multiply_ss0(k0, kts, hd / 64, grp, bt, pp.cb[k]);
  } else {
    if (k)
      multiply_us7(k0, kts, hd / 64, grp, bt, pp.cb[k]);
    else
      multiply_us0(k0, kts, hd / 64, grp, bt, pp.cb[k]);
  }
  pp.band[k] = {grp, is_signed ? nullptr : corr, qs, s, ss};
  if (i) write_scores(pp.band[k ^ 1], pp.cb[k ^ 1]);
}

}  // namespace kvc::attention::fused

#else

namespace kvc::attention::fused {
bool amx_in_use() {
  return false;
}
bool set_amx(bool) {
  return false;
}
uint64_t amx_query_bytes(uint64_t, uint64_t, uint64_t) {
  return 0;
}
void amx_query_tiles(const int8_t *, uint64_t, uint64_t, uint64_t, int8_t *) {}
uint64_t amx_bands_here() {
  return 0;
}
void amx_begin() {}
void amx_end() {}
void scores_i8_amx(const uint8_t *, uint64_t, uint64_t, uint64_t, bool, const int8_t *,
                   const int32_t *, const float *, float *, uint64_t) {}
}  // namespace kvc::attention::fused

#endif
