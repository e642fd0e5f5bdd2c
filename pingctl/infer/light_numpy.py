"""The light engine's decoder in NumPy alone: the runtime comparison's third column
(docs/benchmarks.md, "Answering in seconds"), and an answer without JAX (`--engine numpy`).

The same operations as pingctl/infer/light.py (MaxText's llama2 block), on the same prepared
weights (layer axis first), in float32: a model whose compute dtype is bfloat16 (`base`) is
computed in float32 here, so its numbers differ from MaxText's by bfloat16 rounding. No
key-value cache: second-byte passes run as whole sequences.
"""

from __future__ import annotations

import math

import numpy as np

from pingctl.infer.light import Arch, layout


def prepare(arch: Arch, tensors: dict) -> dict:
    """float32 weights, layer axis first, laid out as light.prepare lays them out."""
    def put(name, layered):
        a = np.asarray(tensors[name], np.float32)
        return np.ascontiguousarray(np.moveaxis(a, 1, 0)) if layered else a

    return layout(arch, put)


def _norm(x, scale, eps):
    return x / np.sqrt(np.mean(np.square(x), axis=-1, keepdims=True) + eps) * scale


def _rope(x, positions, arch: Arch):
    d = x.shape[-1]
    timescale = arch.rope_min * (arch.rope_max / arch.rope_min) ** (2 * np.arange(d // 2, dtype=np.float32) / d)
    sinusoid = positions[..., None, None].astype(np.float32) / timescale.astype(np.float32)
    sin, cos = np.sin(sinusoid), np.cos(sinusoid)
    x1, x2 = x[..., : d // 2], x[..., d // 2:]
    return np.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1)


_ACT = {
    "gelu": lambda a: 0.5 * a * (1 + np.tanh(math.sqrt(2 / math.pi) * (a + 0.044715 * a ** 3))),  # jax.nn.gelu
    "relu": lambda a: np.maximum(a, 0),
    "silu": lambda a: a / (1 + np.exp(-a)),
    "linear": lambda a: a,
}


def decoder(params: dict, tokens, positions, segments, arch: Arch) -> np.ndarray:
    """log P(next token) [b, t, vocab] float32, as light.decoder."""
    tokens, positions, segments = (np.asarray(a) for a in (tokens, positions, segments))
    b, t = tokens.shape
    n, kv, d = arch.heads, arch.kv_heads, arch.head_dim
    g = n // kv
    y = params["embedding"][tokens]
    causal = np.tril(np.ones((t, t), bool))
    mask = (segments[:, :, None] == segments[:, None, :]) & (segments[:, None, :] >= 0) & causal
    lp = params["layers"]
    for layer in range(arch.layers):
        lnx = _norm(y, lp["pre_norm"][layer], arch.eps)
        q = _rope((lnx @ lp["q"][layer].reshape(arch.emb, -1)).reshape(b, t, n, d), positions, arch)
        k = _rope((lnx @ lp["k"][layer].reshape(arch.emb, -1)).reshape(b, t, kv, d), positions, arch)
        v = (lnx @ lp["v"][layer].reshape(arch.emb, -1)).reshape(b, t, kv, d)
        # per (batch row, kv head): [g * t, d] @ [d, s], contiguous (NumPy's batched matmul is
        # BLAS-fast only on contiguous stacks)
        qh = np.ascontiguousarray(q.reshape(b, t, kv, g, d).transpose(0, 2, 3, 1, 4)).reshape(b * kv, g * t, d)
        kh = np.ascontiguousarray(k.transpose(0, 2, 3, 1)).reshape(b * kv, d, t)
        logits = (qh @ kh).reshape(b, kv, g, t, t)
        logits = np.where(mask[:, None, None], logits, np.float32(-0.7 * np.finfo(np.float32).max))
        e = np.exp(logits - logits.max(axis=-1, keepdims=True))
        vh = np.ascontiguousarray(v.transpose(0, 2, 1, 3))  # [b, kv, s, d]
        out = (e.reshape(b * kv, g * t, t) @ vh.reshape(b * kv, t, d)).reshape(b, kv, g, t, d)
        out = (out / e.sum(axis=-1, keepdims=True)).transpose(0, 3, 1, 2, 4).reshape(b, t, n, d)
        h = y + out.reshape(b, t, n * d) @ lp["o"][layer].reshape(n * d, arch.emb)
        hn = _norm(h, lp["post_norm"][layer], arch.eps)
        m = None
        for w, name in zip(lp["wi"], arch.activations):
            a = _ACT[name](hn @ w[layer])
            m = a if m is None else m * a
        y = m @ lp["wo"][layer] + h
    logits = _norm(y, params["final_norm"], arch.eps) @ params["logits"]
    logits = logits - logits.max(axis=-1, keepdims=True)
    return (logits - np.log(np.exp(logits).sum(axis=-1, keepdims=True))).astype(np.float32)
