"""A numpy forward pass of the shared stories260K model (llama2.c format), for
the binding's tests: it captures real K/V and can read its attention's K/V
back from a kvcache.Pool, so the results compare with the upstream golden
log-probabilities (shared/models/golden-logprobs.tsv)."""

import os

import numpy as np


def shared_dir():
    return os.environ.get("KVCACHE_SHARED_DIR") or os.path.join(
        os.path.dirname(__file__), "..", "..", "..", "..", "shared")


class Model:
    """stories260K: dim 64, 5 layers, 8 query heads, 4 KV heads, head_dim 8."""

    def __init__(self, path):
        raw = np.fromfile(path, dtype=np.float32)
        hdr = np.frombuffer(raw[:7].tobytes(), dtype=np.int32)
        dim, hidden, L, nh, nkv, vocab, seq = (int(x) for x in hdr)
        self.dim, self.hidden, self.n_layers = dim, hidden, L
        self.n_heads, self.n_kv_heads, self.vocab = nh, nkv, abs(vocab)
        self.head_dim = dim // nh
        kv_dim = nkv * self.head_dim
        off = 7

        def take(*shape):
            nonlocal off
            n = int(np.prod(shape))
            a = raw[off:off + n].reshape(shape)
            off += n
            return a

        self.emb = take(self.vocab, dim)
        self.rms_att = take(L, dim)
        self.wq = take(L, dim, dim)
        self.wk = take(L, kv_dim, dim)
        self.wv = take(L, kv_dim, dim)
        self.wo = take(L, dim, dim)
        self.rms_ffn = take(L, dim)
        self.w1 = take(L, hidden, dim)
        self.w2 = take(L, dim, hidden)
        self.w3 = take(L, hidden, dim)
        self.rms_final = take(dim)

    @staticmethod
    def _rmsnorm(x, w):
        ss = np.float32(np.mean(x.astype(np.float32) ** 2)) + np.float32(1e-5)
        return (w * (x / np.sqrt(ss))).astype(np.float32)

    def _rope(self, x, pos):
        """Interleaved RoPE (llama2.c): pairs (2i, 2i+1) of each head."""
        x = x.reshape(-1, self.head_dim).copy()
        i = np.arange(0, self.head_dim, 2, dtype=np.float32)
        freq = (1.0 / np.power(np.float32(10000.0), i / np.float32(self.head_dim))).astype(np.float32)
        ang = (np.float32(pos) * freq).astype(np.float32)
        c, s = np.cos(ang), np.sin(ang)
        a, b = x[:, 0::2].copy(), x[:, 1::2].copy()
        x[:, 0::2] = a * c - b * s
        x[:, 1::2] = a * s + b * c
        return x.reshape(-1)

    def step(self, token, pos, kv):
        """One decode step. kv(layer, pos, k, v) stores this token's K and V
        ([n_kv_heads, head_dim] f32) and returns all K, V of positions 0..pos
        ([pos + 1, n_kv_heads, head_dim]). Returns the logits."""
        x = self.emb[token].copy()
        group = self.n_heads // self.n_kv_heads
        for layer in range(self.n_layers):
            xb = self._rmsnorm(x, self.rms_att[layer])
            q = self._rope(self.wq[layer] @ xb, pos).reshape(self.n_heads, self.head_dim)
            k = self._rope(self.wk[layer] @ xb, pos).reshape(self.n_kv_heads, self.head_dim)
            v = (self.wv[layer] @ xb).reshape(self.n_kv_heads, self.head_dim)
            ks, vs = kv(layer, pos, k.astype(np.float32), v.astype(np.float32))
            out = np.empty((self.n_heads, self.head_dim), np.float32)
            for h in range(self.n_heads):
                kh, vh = ks[:, h // group, :], vs[:, h // group, :]
                att = (kh @ q[h]) / np.float32(np.sqrt(self.head_dim))
                att = np.exp(att - att.max())
                att /= att.sum()
                out[h] = att @ vh
            x = x + self.wo[layer] @ out.reshape(-1)
            xb = self._rmsnorm(x, self.rms_ffn[layer])
            h1 = self.w1[layer] @ xb
            h3 = self.w3[layer] @ xb
            x = x + self.w2[layer] @ ((h1 / (1.0 + np.exp(-h1))) * h3)
        x = self._rmsnorm(x, self.rms_final)
        return self.emb @ x


def golden_window0(n):
    """The first n scored rows of window 0: (token ids incl. BOS, log-probs)."""
    path = os.path.join(shared_dir(), "models", "golden-logprobs.tsv")
    toks, lps = [1], []
    with open(path) as f:
        next(f)
        for line in f:
            w, _pos, tok, lp = line.split("\t")
            if int(w) != 0 or len(lps) == n:
                break
            toks.append(int(tok))
            lps.append(float(lp))
    return toks, lps


def log_softmax(logits):
    z = logits.astype(np.float64)
    z = z - z.max()
    return z - np.log(np.exp(z).sum())
