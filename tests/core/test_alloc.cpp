// core_append_no_heap_allocation: kvc_append (and kvc_gather) make no heap
// allocation per call, nor does a sequence's create / reserve / free once
// one sequence was freed (unless its tables exceed what a spare may hold). The test replaces the global allocation functions of
// the process with counting ones (operator new/delete and malloc through
// glibc's __libc_malloc), links the static library, and counts calls made
// during appends of every storage dtype and layout.
#include <kvcache/kvcache.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <new>
#include <vector>

extern "C" void *__libc_malloc(size_t);
extern "C" void *__libc_calloc(size_t, size_t);
extern "C" void *__libc_realloc(void *, size_t);
extern "C" void __libc_free(void *);

static std::atomic<long> g_allocs{0};
static std::atomic<bool> g_counting{false};

static void note() {
  if (g_counting.load(std::memory_order_relaxed)) g_allocs.fetch_add(1, std::memory_order_relaxed);
}

extern "C" void *malloc(size_t n) {
  note();
  return __libc_malloc(n);
}
extern "C" void *calloc(size_t a, size_t b) {
  note();
  return __libc_calloc(a, b);
}
extern "C" void *realloc(void *p, size_t n) {
  note();
  return __libc_realloc(p, n);
}
extern "C" void free(void *p) { __libc_free(p); }

void *operator new(size_t n) {
  note();
  void *p = __libc_malloc(n ? n : 1);
  if (!p) throw std::bad_alloc();
  return p;
}
void *operator new[](size_t n) { return operator new(n); }
void operator delete(void *p) noexcept { __libc_free(p); }
void operator delete[](void *p) noexcept { __libc_free(p); }
void operator delete(void *p, size_t) noexcept { __libc_free(p); }
void operator delete[](void *p, size_t) noexcept { __libc_free(p); }

int main() {
  int failures = 0;
  // Sanity: the hook sees allocations (so the test can fail).
  g_counting = true;
  std::vector<int> *probe = new std::vector<int>(100);
  g_counting = false;
  if (g_allocs.load() < 2) {
    std::fprintf(stderr, "allocation hook not active (%ld)\n", g_allocs.load());
    return 1;
  }
  delete probe;

  const kvc_dtype dts[] = {KVC_DTYPE_F32, KVC_DTYPE_F16, KVC_DTYPE_BF16};
  for (int layout = 0; layout < 2; ++layout)
    for (kvc_dtype st : dts)
      for (kvc_dtype src : dts) {
        kvc_pool_config c;
        kvc_pool_config_init(&c);
        c.num_layers = 2;
        c.num_q_heads = 8;
        c.num_kv_heads = 8;
        c.head_dim = 128;
        c.block_size = 16;
        c.num_blocks = 64;
        c.k_dtype = c.v_dtype = st;
        c.layout = static_cast<kvc_layout>(layout);
        kvc_pool *p = nullptr;
        if (kvc_pool_create(&c, &p) != KVC_OK) return 1;
        kvc_seq_create(p, 1);
        kvc_seq_reserve(p, 1, 256, nullptr);
        std::vector<uint16_t> rows(16 * 8 * 128 * 2, 0x3c00);
        std::vector<uint16_t> out(16 * 8 * 128 * 2);
        g_allocs = 0;
        g_counting = true;
        for (uint64_t pos = 0; pos < 256; pos += 16)
          for (uint32_t l = 0; l < 2; ++l) {
            if (kvc_append(p, 1, l, pos, 16, rows.data(), rows.data(), src) != KVC_OK) ++failures;
            if (kvc_gather(p, 1, l, pos, 16, out.data(), nullptr, src, nullptr) != KVC_OK) ++failures;
          }
        g_counting = false;
        if (g_allocs.load() != 0) {
          std::fprintf(stderr, "layout %d storage %d src %d: %ld heap allocations in 32 appends\n",
                       layout, st, src, g_allocs.load());
          ++failures;
        }
        kvc_pool_destroy(p);
      }
  // A pool of `layers` x `heads` (head-wise: a table per layer and head)
  // where sequence 1 was created, given a block in each table and freed.
  auto pool_after_one_free = [&](uint32_t layers, uint32_t heads, uint32_t head_dim,
                                 uint32_t flags) -> kvc_pool * {
    kvc_pool_config c;
    kvc_pool_config_init(&c);
    c.num_layers = layers;
    c.num_q_heads = c.num_kv_heads = heads;
    c.head_dim = head_dim;
    c.block_size = 16;
    c.num_blocks = 8192;
    c.flags |= flags;
    kvc_pool *p = nullptr;
    if (kvc_pool_create(&c, &p) != KVC_OK) return nullptr;
    if (kvc_seq_create(p, 1) != KVC_OK || kvc_seq_reserve(p, 1, 20, nullptr) != KVC_OK ||
        kvc_seq_free(p, 1) != KVC_OK)
      ++failures;
    return p;
  };
  // A short request's sequence life (create, reserve a block in each layer,
  // free) reuses a freed sequence's tables (core/sequences.cpp's spares):
  // no heap allocation once one sequence was freed.
  if (kvc_pool *p = pool_after_one_free(4, 8, 128, 0)) {
    g_allocs = 0;
    g_counting = true;
    for (uint64_t id = 2; id < 100; ++id)
      if (kvc_seq_create(p, id) != KVC_OK || kvc_seq_reserve(p, id, 20, nullptr) != KVC_OK ||
          kvc_seq_free(p, id) != KVC_OK)
        ++failures;
    g_counting = false;
    if (g_allocs.load() != 0) {
      std::fprintf(stderr, "%ld heap allocations in 98 create / reserve / free cycles\n",
                   g_allocs.load());
      ++failures;
    }
    kvc_pool_destroy(p);
  } else {
    return 1;
  }
  // A sequence of more tables than a spare may hold (core: 512 KiB; a
  // head-wise pool of 640 layers x 4 KV heads has 2,560 tables) is not kept:
  // the next create allocates its tables anew (and works).
  if (kvc_pool *p = pool_after_one_free(640, 4, 8, KVC_POOL_HEADWISE)) {
    g_allocs = 0;
    g_counting = true;
    if (kvc_seq_create(p, 2) != KVC_OK) ++failures;
    g_counting = false;
    if (g_allocs.load() == 0) {
      std::fprintf(stderr, "a sequence of 2,560 tables was kept as a spare\n");
      ++failures;
    }
    uint64_t len = 1;
    if (kvc_seq_reserve(p, 2, 3, nullptr) != KVC_OK || kvc_seq_length(p, 2, &len) != KVC_OK ||
        len != 3 || kvc_seq_free(p, 2) != KVC_OK)
      ++failures;
    kvc_pool_destroy(p);
  } else {
    return 1;
  }
  std::printf("%d passed, %d failed\n", failures ? 0 : 1, failures ? 1 : 0);
  return failures ? 1 : 0;
}
