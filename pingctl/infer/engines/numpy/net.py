"""The NumPy engine's decoder (`--engine numpy`): pingctl's network in NumPy alone, the engine
of an install without JAX (`pip install pingctl`, docs/api.md "The answering install").

The same operations as the JAX engine's (pingctl/infer/engines/jax/net.py: MaxText's llama2
block), on the same weights, in float32 throughout: a model whose compute dtype is bfloat16 (`base`) is computed in
float32 here, so its numbers differ from MaxText's by bfloat16 rounding. The log-probabilities
are the JAX engine's to float32 rounding: XLA and NumPy sum in different orders, and so do the
kernels of different CPUs (tests/test_numpy_engine.py, against the bound of tests/tolerance.py).

What makes it fast enough without a compiler (docs/benchmarks.md, "The JAX-free install"):
- one fused query/key/value matmul per layer and every elementwise step in place, in float32
  (a Python float or a float64 operand would upcast a whole activation);
- attention one sequence at a time, over its own length only: the padding of a length bucket
  costs nothing there, and one row's scores stay in the CPU's cache for the mask, the softmax
  and the value matmul (a batch's scores at once are tens of MB, streamed from memory per
  pass); long sequences in blocks of queries, each attending to the keys up to its last one
  (causality: a block never reads later keys);
- the key-value-cache path (`prefill` via `decoder(want_kv=True)`, then `decode`) for
  second bytes, as pingctl/infer/engines/numpy/kv.py drives it;
- one BLAS thread (threadpoolctl, for these calls only) unless OPENBLAS_NUM_THREADS or
  OMP_NUM_THREADS says otherwise: most of a pass is NumPy's single-threaded elementwise work,
  and OpenBLAS's spinning threads on a busy machine made a `mini` pass 3x slower.

Padding (segment 0 after a sequence's last token) is not computed: its rows of the output are
the head of a zero attention output, not what the JAX engine gives there; no caller reads them.
"""

from __future__ import annotations

import functools
import math
import os

import numpy as np

from pingctl.infer.engines.arch import Arch, layout

_MASKED = np.float32(-0.7 * np.finfo(np.float32).max)  # MaxText's DEFAULT_MASK_VALUE
# attention scores per block of queries: ~1 MB of float32, which stays in a core's L2 cache
_BLOCK_SCORES = 1 << 18
_GELU_C = np.float32(math.sqrt(2 / math.pi))


@functools.cache
def _blas():
    """threadpoolctl's controller of the loaded BLAS, once (its first look costs ~1 ms); None
    where the user chose the thread count through the environment."""
    if os.environ.get("OPENBLAS_NUM_THREADS") or os.environ.get("OMP_NUM_THREADS"):
        return None
    from threadpoolctl import ThreadpoolController

    return ThreadpoolController()


def _one_blas_thread(fn):
    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        blas = _blas()
        if blas is None:
            return fn(*args, **kwargs)
        with blas.limit(limits=1, user_api="blas"):
            return fn(*args, **kwargs)

    return wrapper


def prepare(arch: Arch, tensors: dict) -> dict:
    """float32 weights, layer axis first; queries, keys and values fused into one kernel
    [layers, emb, (heads + 2 kv_heads) * head_dim] so a layer projects them in one matmul."""
    def put(name, layered):
        a = np.asarray(tensors[name], np.float32)
        return np.ascontiguousarray(np.moveaxis(a, 1, 0) if layered else a)

    p = layout(arch, put)
    lp = p["layers"]
    L, e = arch.layers, arch.emb
    lp["qkv"] = np.ascontiguousarray(np.concatenate([lp.pop(k).reshape(L, e, -1) for k in ("q", "k", "v")], -1))
    lp["o"] = lp["o"].reshape(L, arch.heads * arch.head_dim, e)
    return p


def _norm(x, scale, eps):
    r = np.mean(np.square(x), axis=-1, keepdims=True)
    r += np.float32(eps)
    np.sqrt(r, out=r)
    return x / r * scale


def _rotation(positions, arch: Arch):
    """(cos, sin) [..., 1, head_dim / 2] of RoPE at positions [...] (the JAX engine's `_rope` timescales)."""
    d = arch.head_dim
    fraction = 2 * np.arange(d // 2, dtype=np.float32) / np.float32(d)
    timescale = np.float32(arch.rope_min) * np.float32(arch.rope_max / arch.rope_min) ** fraction
    sinusoid = np.asarray(positions, np.float32)[..., None, None] / timescale
    return np.cos(sinusoid), np.sin(sinusoid)


def _rope(x, rot):
    cos, sin = rot
    h = x.shape[-1] // 2
    x1, x2 = x[..., :h], x[..., h:]
    return np.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1)


def _gelu(a):
    """jax.nn.gelu (its tanh approximation), in place on a."""
    t = a * a
    t *= a
    t *= np.float32(0.044715)
    t += a
    t *= _GELU_C
    np.tanh(t, out=t)
    t += np.float32(1)
    t *= np.float32(0.5)
    a *= t
    return a


def _act(name: str, a):
    if name == "gelu":
        return _gelu(a)
    if name == "relu":
        return np.maximum(a, 0, out=a)
    if name == "silu":
        return a / (np.float32(1) + np.exp(-a))
    return a


def _qkv(x, w, rot, arch: Arch):
    """Queries [..., heads, d] and keys, values [..., kv_heads, d] of normed inputs x [..., emb]."""
    n, kv, d = arch.heads, arch.kv_heads, arch.head_dim
    qkv = (x.reshape(-1, x.shape[-1]) @ w).reshape(*x.shape[:-1], n + 2 * kv, d)  # one 2-D matmul: one BLAS call
    return _rope(qkv[..., :n, :], rot), _rope(qkv[..., n : n + kv, :], rot), qkv[..., n + kv :, :]


def _mlp(y, attn, lp, layer: int, arch: Arch):
    """Output projection, residual, MLP, residual (the JAX engine's `_after_attention`)."""
    shape = y.shape
    h = attn.reshape(-1, attn.shape[-1]) @ lp["o"][layer]
    h += y.reshape(h.shape)
    hn = _norm(h, lp["post_norm"][layer], arch.eps)
    m = None
    for w, name in zip(lp["wi"], arch.activations):
        a = _act(name, hn @ w[layer])
        m = a if m is None else np.multiply(m, a, out=m)
    out = m @ lp["wo"][layer]
    out += h
    return out.reshape(shape)


def _head(params, y, arch: Arch):
    """Final norm, logits, log-softmax (float32)."""
    logits = _norm(y, params["final_norm"], arch.eps) @ params["logits"]
    logits -= logits.max(axis=-1, keepdims=True)
    logits -= np.log(np.exp(logits).sum(axis=-1, keepdims=True))
    return logits


def _extent(seg: np.ndarray) -> tuple[int, bool]:
    """(tokens to attend over, whether they are one segment): a sequence then padding (segment
    0) is attended over its own length, causally; any other layout over the whole row, masked."""
    live = np.flatnonzero(seg)
    n = int(live[-1]) + 1 if len(live) else 0
    return (n, True) if n == len(live) and (n == 0 or (seg[:n] == seg[0]).all()) else (len(seg), False)


def _self_attention(q, k, v, seg, one_segment: bool, arch: Arch):
    """One sequence's attention output [t, heads * d] from q [t, heads, d], k, v [t, kv, d]:
    blocks of queries, each over the keys up to its last query."""
    t = q.shape[0]
    kv, d = arch.kv_heads, arch.head_dim
    g = arch.heads // kv
    qh = np.ascontiguousarray(q.reshape(t, kv, g, d).transpose(1, 2, 0, 3))  # [kv, g, t, d]
    kt = np.ascontiguousarray(k.transpose(1, 2, 0))  # [kv, d, t]
    vh = np.ascontiguousarray(v.transpose(1, 0, 2))  # [kv, t, d]
    out = np.empty((kv, g, t, d), np.float32)
    block = max(1, min(t, _BLOCK_SCORES // max(1, arch.heads * t)))
    for a in range(0, t, block):
        b = min(t, a + block)
        s = qh[:, :, a:b] @ kt[:, None, :, :b]  # [kv, g, b - a, b]
        allowed = np.arange(b)[None, :] <= np.arange(a, b)[:, None]
        if not one_segment:
            allowed &= (seg[a:b, None] == seg[None, :b]) & (seg[None, :b] >= 0)
        if not allowed.all():
            np.copyto(s, _MASKED, where=~allowed)
        s -= s.max(axis=-1, keepdims=True)
        np.exp(s, out=s)
        total = s.sum(axis=-1, keepdims=True)
        o = s @ vh[:, None, :b]
        o /= total
        out[:, :, a:b] = o
    return out.transpose(2, 0, 1, 3).reshape(t, arch.heads * d)


@_one_blas_thread
def decoder(params: dict, tokens, positions, segments, arch: Arch, want_kv: bool = False, head: bool = True):
    """log P(next token) [b, t, vocab] float32, as the JAX engine's `decoder` (rows of padding aside, see the
    module's note). `want_kv`: also every layer's keys and values [layers, b, t, kv, d] (keys
    rotated), a prompt's cache for `decode`; `head` False: no log-probabilities (None)."""
    tokens, segments = np.asarray(tokens), np.asarray(segments)
    b, t = tokens.shape
    extents = [_extent(segments[r]) for r in range(b)]
    rot = _rotation(positions, arch)
    lp = params["layers"]
    y = params["embedding"][tokens]
    keys = np.zeros((arch.layers, b, t, arch.kv_heads, arch.head_dim), np.float32) if want_kv else None
    values = np.zeros_like(keys) if want_kv else None
    for layer in range(arch.layers):
        q, k, v = _qkv(_norm(y, lp["pre_norm"][layer], arch.eps), lp["qkv"][layer], rot, arch)
        if want_kv:
            keys[layer], values[layer] = k, v
        attn = np.zeros((b, t, arch.heads * arch.head_dim), np.float32)
        for r, (n, one) in enumerate(extents):
            if n:
                attn[r, :n] = _self_attention(q[r, :n], k[r, :n], v[r, :n], segments[r, :n], one, arch)
        y = _mlp(y, attn, lp, layer, arch)
    out = _head(params, y, arch) if head else None
    return (out, (keys, values)) if want_kv else out


@_one_blas_thread
def decode(params: dict, caches: list[tuple[np.ndarray, np.ndarray]], tokens: list[np.ndarray], arch: Arch):
    """log P(next) [sum of len(tokens[i]), vocab] after prompt i's cached tokens and then token
    tokens[i][j], for each of its candidates j, rows in order of i then j. caches[i]: (keys,
    values) [layers, length_i, kv, d] of prompt i, as `decoder(want_kv=True)` gives them."""
    counts = [len(c) for c in tokens]
    ends = np.cumsum(counts)
    flat = np.concatenate([np.asarray(c, np.int64) for c in tokens])
    positions = np.repeat([k.shape[1] for k, _ in caches], counts)
    rot = _rotation(positions, arch)
    kv, d = arch.kv_heads, arch.head_dim
    g = arch.heads // kv
    lp = params["layers"]
    y = params["embedding"][flat]
    for layer in range(arch.layers):
        q, k, v = _qkv(_norm(y, lp["pre_norm"][layer], arch.eps), lp["qkv"][layer], rot, arch)
        attn = np.empty((len(flat), arch.heads * d), np.float32)
        for i, (kc, vc) in enumerate(caches):
            lo, hi = ends[i] - counts[i], ends[i]
            if lo < hi:
                attn[lo:hi] = _cached_attention(q[lo:hi], k[lo:hi], v[lo:hi], kc[layer], vc[layer], g)
        y = _mlp(y, attn, lp, layer, arch)
    return _head(params, y, arch)


def _cached_attention(q, k, v, kc, vc, g: int):
    """Attention output [c, heads * d] of c candidates (q [c, heads, d]; their own k, v [c, kv, d])
    over one prompt's cached kc, vc [length, kv, d] and themselves: the softmax over the cache
    and the candidate's own key, without concatenating them."""
    c, n, d = q.shape
    kv = kc.shape[1]
    qh = q.reshape(c, kv, g, d).transpose(1, 2, 0, 3)  # [kv, g, c, d]
    s = qh @ np.ascontiguousarray(kc.transpose(1, 2, 0))[:, None]  # [kv, g, c, length]
    own = np.einsum("kgcd,ckd->kgc", qh, k)[..., None]  # [kv, g, c, 1]
    m = np.maximum(s.max(axis=-1, keepdims=True), own) if s.shape[-1] else own
    s -= m
    np.exp(s, out=s)
    own = np.exp(own - m)
    total = s.sum(axis=-1, keepdims=True) + own
    o = s @ np.ascontiguousarray(vc.transpose(1, 0, 2))[:, None]  # [kv, g, c, d]
    o += own * v.transpose(1, 0, 2)[:, None]
    o /= total
    return o.transpose(2, 0, 1, 3).reshape(c, n * d)
