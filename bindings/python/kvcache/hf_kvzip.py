"""KVzip's context reconstruction for ``kvcache.hf.PagedCache`` (arXiv 2505.23416): the body of
``PagedCache.reconstruct_context``, kept apart from the cache class (see its docstring)."""
import numpy as _np
import torch


def reconstruct_context(cache, model, input_ids, tokenizer=None, repeat_ids=None, next_repeat_ids=None,
                        chunk=None):
    """``PagedCache.reconstruct_context`` of ``cache`` (same arguments, same errors)."""
    from .hf import _NEW_CACHE_API
    st = cache._st
    if not st.reconstruct:
        raise ValueError("reconstruct_context: strategy '%s' is not kvzip" % st.spec)
    ids = torch.as_tensor(input_ids)
    if ids.dim() == 1:
        ids = ids[None]
    if tokenizer is not None:
        repeat_ids = tokenizer.encode("\n\nRepeat the previous context exactly.", add_special_tokens=False)
        next_repeat_ids = tokenizer.encode("\n\nRepeat the part of the previous context exactly, starting "
                                           "with", add_special_tokens=False)
    if repeat_ids is None:
        raise ValueError("reconstruct_context: give a tokenizer or repeat_ids")
    first = torch.as_tensor(list(repeat_ids), dtype=torch.long)
    later = first if next_repeat_ids is None else torch.as_tensor(list(next_repeat_ids), dtype=torch.long)
    chunk = int(chunk or st.recon_chunk)
    if chunk <= 0:
        raise ValueError("reconstruct_context: chunk must be positive, got %r" % chunk)
    overlap = 8
    with cache._lock:
        if cache._seqs is None or not cache._evict_pending or cache._forward_q:
            raise ValueError("reconstruct_context: call it after the prefill forward pass and before the next")
        rows = list(cache._seqs)
        P = cache._pool.seq_length(rows[0])
        if ids.dim() != 2 or ids.shape[0] != len(rows) or ids.shape[1] != P or \
                any(cache._pool.seq_length(s) != P for s in rows):
            raise ValueError("reconstruct_context: input_ids of shape %s, expected [%d, %d] (the prefill)"
                             % (tuple(ids.shape), len(rows), P))
        best = [[_np.zeros((P, cache._hk), dtype=_np.float32) for _ in range(cache._layers_n)] for _ in rows]
        longest = max(len(first), len(later) + overlap) + chunk
        # room for the forks first: a pool that grows moves only the rows it knows
        need = len(rows) * cache._layers_n * (-(-longest // cache._block_size) + 1)
        if cache._pool.stats().blocks_free < need:
            cache._grow(need)
        cache._evict_pending = False
        try:
            for c0 in range(min(1, P - 1), P, chunk):
                c1 = min(P, c0 + chunk)
                if c0 <= 1:
                    feed = torch.cat([first[None].expand(len(rows), -1), ids[:, c0:c1]], dim=1)
                else:
                    feed = torch.cat([later[None].expand(len(rows), -1), ids[:, max(1, c0 - overlap):c1]],
                                     dim=1)
                forks = []
                try:
                    for sid in rows:
                        f = cache._new_id()
                        cache._pool.seq_fork(sid, f)
                        forks.append(f)
                    cache._hidden_rows = rows
                    cache._seqs = forks
                    cache._reconstructing = True
                    with torch.no_grad():
                        model(input_ids=feed, use_cache=True,
                              **{"cache" if _NEW_CACHE_API else "past_key_values": cache})
                    for i, f in enumerate(forks):
                        for layer in range(cache._layers_n):
                            sc = _np.asarray(cache._pool.scores(f, layer))[:P]
                            _np.maximum(best[i][layer], sc, out=best[i][layer])
                finally:
                    cache._reconstructing = False
                    cache._hidden_rows = []
                    cache._seqs = rows
                    for f in forks:
                        cache._pool.seq_free(f)
                    cache._version += 1
            for i, sid in enumerate(rows):
                for layer in range(cache._layers_n):
                    cache._pool.observe_scores(sid, layer, best[i][layer], accumulate=False)
        finally:
            cache._evict_pending = True
            cache._forward_q = 0
