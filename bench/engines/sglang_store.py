"""Pages per second through SGLang's HiCache storage: its own file backend
(HiCacheFile) beside kvcache.sglang.KvcHiCacheStorage (disk, host and, with
--redis, Redis), on the same pages of a real MHATokenToKVPoolHost (CPU), in
the same run. Run in scripts/setup-python.sh's engines venv:

    PYTHONPATH=build/bindings/swig/python/pkg ~/.cache/kvcache/venv/engines/bin/python \\
        bench/engines/sglang_store.py [--pages 64] [--redis HOST:PORT] [--json OUT]

Each backend backs up the pages the way HiCacheController does (HiCacheFile:
batch_set of get_data_page() tensors; ours: batch_set_v1 from the host
pool's buffers) into a fresh directory, then a second instance prefetches
them (batch_exists, then batch_get / batch_get_v1 into other host pages)
and the bytes are checked. Geometry: SmolLM2-135M (30 layers, 3 KV heads,
head_dim 64), bf16, pages of 64 tokens (1.41 MiB), layout page_first.
The disk figures include the page cache: both write and read the same
files system the same way; what differs is the library's records
(checksum, header) and SGLang's per-file Python I/O.
"""
import argparse
import json
import os
import sys
import tempfile
import time

import torch
from sglang.srt.mem_cache.device_pool_info import KVBufferLayout, KVBuffers, MHABufferInfo
from sglang.srt.mem_cache.hicache_storage import HiCacheFile, HiCacheStorageConfig
from sglang.srt.mem_cache.pool_host.mha import MHATokenToKVPoolHost
from sglang.srt.mem_cache.utils import get_hash_str

from kvcache.sglang import KvcHiCacheStorage

LAYERS, HEADS, DIM, PAGE = 30, 3, 64, 64


def host_pool(n_pages):
    tokens = n_pages * PAGE
    k = tuple(torch.zeros(tokens, HEADS, DIM, dtype=torch.bfloat16) for _ in range(LAYERS))
    v = tuple(torch.zeros(tokens, HEADS, DIM, dtype=torch.bfloat16) for _ in range(LAYERS))
    ptrs = lambda ts: torch.tensor([t.data_ptr() for t in ts], dtype=torch.uint64)  # noqa: E731
    info = MHABufferInfo(buffers=KVBuffers(k=k, v=v, k_data_ptrs=ptrs(k), v_data_ptrs=ptrs(v),
                                           layout=KVBufferLayout.NHD),
                         page_size=PAGE, head_num=HEADS, head_dim=DIM, v_head_dim=DIM, dtype=torch.bfloat16,
                         device=torch.device("cpu"))
    return MHATokenToKVPoolHost(info, 2.2, 0, PAGE, "page_first", pin_memory=False, device="cpu",
                                device_capacity_tokens=tokens, start_layer=0, end_layer=LAYERS)


def config(extra):
    return HiCacheStorageConfig(tp_rank=0, tp_size=1, pp_rank=0, pp_size=1, attn_cp_rank=0, attn_cp_size=1,
                                is_mla_model=False, enable_storage_metrics=False, is_page_first_layout=True,
                                model_name="SmolLM2-135M", extra_config=extra)


def keys_of(n):
    out, prior = [], None
    for i in range(n):
        prior = get_hash_str(list(range(i * PAGE, (i + 1) * PAGE)), prior)
        out.append(prior)
    return out


def run(name, make, v1, src, dst, keys):
    n = len(keys)
    idx = torch.arange(0, n * PAGE)
    a = make(src)
    t0 = time.perf_counter()
    if v1:
        ok = all(a.batch_set_v1(keys, idx))
    else:
        ok = a.batch_set(keys, [src.get_data_page(i * PAGE) for i in range(n)])
    t_set = time.perf_counter() - t0
    b = make(dst)
    t0 = time.perf_counter()
    hit = b.batch_exists(keys)
    if v1:
        got = sum(b.batch_get_v1(keys, idx))
    else:
        pages = b.batch_get(keys, [dst.get_dummy_flat_data_page() for _ in keys])
        got = 0
        for i, p in enumerate(pages):
            if p is not None:
                dst.set_from_flat_data_page(i * PAGE, p)
                got += 1
    t_get = time.perf_counter() - t0
    same = torch.equal(src.kv_buffer[:, :n * PAGE].view(torch.int16), dst.kv_buffer[:, :n * PAGE].view(torch.int16))
    dst.kv_buffer.zero_()
    page_mib = src.get_data_page(0).numel() * 2 / 2**20
    row = {"backend": name, "pages": n, "page_mib": round(page_mib, 3), "stored": ok, "hits": hit, "loaded": got,
           "identical": same, "backup_ms_per_page": 1e3 * t_set / n, "prefetch_ms_per_page": 1e3 * t_get / n,
           "backup_mib_s": n * page_mib / t_set, "prefetch_mib_s": n * page_mib / t_get}
    print("%-34s backup %7.2f ms/page %8.0f MiB/s   prefetch %7.2f ms/page %8.0f MiB/s   %s" % (
        name, row["backup_ms_per_page"], row["backup_mib_s"], row["prefetch_ms_per_page"], row["prefetch_mib_s"],
        "identical" if same and got == n else "MISMATCH"), flush=True)
    return row


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--pages", type=int, default=64)
    ap.add_argument("--repeat", type=int, default=3, help="runs per backend; the fastest is kept")
    ap.add_argument("--redis", help="host:port of a Redis server to add its row")
    ap.add_argument("--json")
    args = ap.parse_args()
    torch.manual_seed(0)
    src, dst = host_pool(args.pages), host_pool(args.pages)
    src.kv_buffer.copy_(torch.randn(src.kv_buffer.shape).to(torch.bfloat16))
    keys = keys_of(args.pages)
    rows = []
    for rep in range(args.repeat):
        with tempfile.TemporaryDirectory() as d1, tempfile.TemporaryDirectory() as d2:
            cases = [
                ("sglang HiCacheFile (disk)", lambda p, d=d1: HiCacheFile(config({"file_storage_path": d})), False),
                ("kvcache disk (interface_v1)", lambda p, d=d2: _ours(p, {"kvc_tier": "disk", "kvc_path": d}), True),
                ("kvcache host (interface_v1)", lambda p, h=_shared_host(): h(p), True),
            ]
            if args.redis:
                scope = "bench-%d-%d" % (os.getpid(), rep)
                cases.append(("kvcache redis (interface_v1)", lambda p, s=scope: _ours(
                    p, {"kvc_tier": "redis", "kvc_address": args.redis, "kvc_scope": s}), True))
            for name, make, v1 in cases:
                rows.append(run(name, make, v1, src, dst, keys))
    best = {}
    for r in rows:
        b = best.setdefault(r["backend"], dict(r))
        for k in ("backup_ms_per_page", "prefetch_ms_per_page"):
            b[k] = min(b[k], r[k])
        b["backup_mib_s"] = b["pages"] * b["page_mib"] / (b["backup_ms_per_page"] * b["pages"] / 1e3)
        b["prefetch_mib_s"] = b["pages"] * b["page_mib"] / (b["prefetch_ms_per_page"] * b["pages"] / 1e3)
        b["identical"] = b["identical"] and r["identical"]
    base = best["sglang HiCacheFile (disk)"]
    print("\nbest of %d, against HiCacheFile in this run:" % args.repeat)
    for name, b in best.items():
        b["backup_speed_vs_hicachefile"] = base["backup_ms_per_page"] / b["backup_ms_per_page"]
        b["prefetch_speed_vs_hicachefile"] = base["prefetch_ms_per_page"] / b["prefetch_ms_per_page"]
        print("%-34s backup %5.2fx   prefetch %5.2fx" % (name, b["backup_speed_vs_hicachefile"],
                                                        b["prefetch_speed_vs_hicachefile"]))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"command": "python3 " + " ".join([os.path.relpath(sys.argv[0])] + sys.argv[1:]),
                       "torch": torch.__version__, "rows": list(best.values())}, f, indent=2)
    if not all(b["identical"] for b in best.values()):
        sys.exit("a backend did not give the pages back byte for byte")


_HOST = {}


def _shared_host():
    """A host store lives in its process: the prefetching instance is the backing-up one, pointed at
    the second host pool (same layout, so the same scope; registering it again would open a new,
    empty store)."""
    key = len(_HOST)

    def make(p):
        if key not in _HOST:
            _HOST[key] = _ours(p, {"kvc_tier": "host", "kvc_capacity_bytes": 1 << 30})
        else:
            _HOST[key].mem_pool_host = p
        return _HOST[key]
    return make


def _ours(pool, extra):
    s = KvcHiCacheStorage(config(dict({"interface_v1": 1}, **extra)))
    s.register_mem_pool_host(pool)
    return s


if __name__ == "__main__":
    main()
