"""llamacpp_restore_in_llama: a llama.cpp sequence state goes through libkvcache and back
into llama.cpp, which then decodes exactly as if it had never left.

llama.cpp (llama-cpp-python) evaluates a prompt on SmolLM2; its sequence state blob is
imported into a pool (kvc_seq_import_llama), saved as a fingerprinted record and restored
into another pool (kvc_seq_save / kvc_seq_restore, what the tiers store), exported
(kvc_seq_export_llama) and restored into a fresh llama.cpp context
(llama_state_seq_set_data). The next token's logits there equal, bit for bit, those of
the context that never stopped (f16 K/V, and q8_0 with llama.cpp's rotation undone in the
pool and applied again on export).

  python test_restore.py MODEL.gguf SHARED_DIR     (PYTHONPATH: the kvcache package)

MODEL.gguf "smollm2" is SmolLM2-135M-Instruct.Q4_1.gguf in the model cache
(scripts/fetch-models.sh: $KVCACHE_MODEL_CACHE, else $XDG_CACHE_HOME/kvcache, else
~/.cache/kvcache).
"""
import ctypes
import os
import sys

import llama_cpp
import numpy as np

import kvcache

N_PROMPT = 40


def context(model, type_kv, flash=True):
    return llama_cpp.Llama(model_path=model, n_ctx=128, n_batch=64, n_ubatch=64, flash_attn=flash,
                           type_k=type_kv, type_v=type_kv, n_threads=2, seed=0, logits_all=True,
                           verbose=False)


def seq_state(llm):
    ctx = llm._ctx.ctx
    n = llama_cpp.llama_state_seq_get_size(ctx, 0)
    buf = (ctypes.c_uint8 * n)()
    assert llama_cpp.llama_state_seq_get_data(ctx, buf, n, 0) == n
    return bytes(buf)


def pool_for(dtype):
    cfg = kvcache.PoolConfig()
    cfg.num_layers, cfg.num_q_heads, cfg.num_kv_heads, cfg.head_dim = 30, 9, 3, 64
    cfg.block_size, cfg.num_blocks = 16, 256
    cfg.k_dtype = cfg.v_dtype = dtype
    return kvcache.Pool(cfg)


def check(model, ids, type_kv, dtype, llama_type, flags, flash=True):
    prompt, nxt = ids[:N_PROMPT], ids[N_PROMPT]
    a = context(model, type_kv, flash)
    a.eval(prompt)
    blob = seq_state(a)
    a.eval([nxt])
    want = np.array(a.scores[N_PROMPT], dtype=np.float32)

    with pool_for(dtype) as p1, pool_for(dtype) as p2:
        assert p1.import_llama(5, blob, flags & kvcache.LLAMA_ATTN_ROT) == N_PROMPT
        record = p1.save(5)
        p2.restore(9, record)
        out = p2.export_llama(9, llama_type, flags=flags)
    assert out == blob, "the exported blob differs from llama.cpp's"

    b = context(model, type_kv, flash)
    buf = (ctypes.c_uint8 * len(out)).from_buffer_copy(out)
    assert llama_cpp.llama_state_seq_set_data(b._ctx.ctx, buf, len(out), 0) == len(out)
    b.n_tokens = N_PROMPT
    b.input_ids[:N_PROMPT] = prompt
    b.eval([nxt])
    got = np.array(b.scores[N_PROMPT], dtype=np.float32)
    diff = float(np.max(np.abs(got - want)))
    print("%-5s flash=%d: %d-token state through kvcache (%d bytes); next-token logits max |diff| %g, "
          "argmax %d vs %d" % ("f16" if type_kv == 1 else "q8_0", flash, N_PROMPT, len(out), diff,
                               int(np.argmax(got)), int(np.argmax(want))))
    assert diff == 0.0, "llama.cpp decodes differently after the round trip"
    # A context that never saw the prompt decodes otherwise: the restore is what made them equal.
    c = context(model, type_kv, flash)
    c.n_tokens = N_PROMPT
    c.input_ids[:N_PROMPT] = prompt
    c.eval([nxt])
    assert float(np.max(np.abs(np.array(c.scores[N_PROMPT], dtype=np.float32) - want))) > 0.1


def main():
    model, shared = sys.argv[1], sys.argv[2]
    if model == "smollm2":
        cache = os.environ.get("KVCACHE_MODEL_CACHE") or os.path.join(
            os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache"), "kvcache")
        model = os.path.join(cache, "SmolLM2-135M-Instruct.Q4_1.gguf")
    with open(shared + "/data/tinystories-valid-sample.txt", "rb") as f:
        text = f.read()
    probe = llama_cpp.Llama(model_path=model, n_ctx=64, vocab_only=True, verbose=False)
    ids = probe.tokenize(text, add_bos=False, special=False)[:N_PROMPT + 1]
    check(model, ids, 1, kvcache.DTYPE_F16, kvcache.LLAMA_F16, 0)
    check(model, ids, 1, kvcache.DTYPE_F16, kvcache.LLAMA_F16, kvcache.LLAMA_V_TRANS, flash=False)
    check(model, ids, 8, kvcache.DTYPE_F32, kvcache.LLAMA_Q8_0, kvcache.LLAMA_ATTN_ROT)
    print("ok")


if __name__ == "__main__":
    main()
