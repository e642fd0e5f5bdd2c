"""The JAX engine's decoder (`--engine light`, the default): pingctl's network in plain JAX,
reading named weights, without MaxText.

The network is MaxText's `llama2` decoder block as `pingctl train` configures it
(pingctl/templates/maxtext.yml.j2): token embedding (untied), scanned layers of RMSNorm ->
multi-head attention with rotary position embedding -> residual -> RMSNorm -> MLP -> residual,
a final RMSNorm and a dense projection to the vocabulary. Every operation, its order and its
dtype casts follow MaxText 0.2.5's code (layers/normalizations.py RMSNorm, embeddings.py
RotaryEmbedding, attentions.py / attention_op.py dot-product attention, linears.py
DenseGeneral and MlpBlock, nnx_decoders.py), so the logits are MaxText's to float32 rounding
(tests/test_light_engine.py compares them on every preset). Notable details of that code:

- RMSNorm normalises in float32, casts to the compute dtype, then scales (epsilon:
  `normalization_layer_epsilon`, 1e-5).
- RoPE is the "default" variant: the two halves of each head are rotated (not interleaved),
  timescales min * (max / min) ** (2i / head_dim) with min 1 and max 10,000.
- Queries are not scaled by 1/sqrt(head_dim) in the forward pass: MaxText folds that factor
  into the query kernel's initialisation, so the trained kernel carries it.
- Attention masks by segment (a token attends to earlier tokens of its own segment; padding
  is segment 0) and causality; softmax in the compute dtype unless `float32_logits`.
- The MLP activation is `jax.nn.<name>` as named (gelu: its tanh approximation, JAX's default).
- Weights are cast to the compute dtype before each matmul (bfloat16 for `base`).

The architecture and the weights' names are pingctl/infer/engines/arch.py's (shared with the
NumPy engine); `prepare` moves the stacked layer axis first for `lax.scan` and casts to the
compute dtype once.

The key-value-cache path (`prefill` + `decode`) scores many candidate next tokens after one
prompt: the prompt's keys and values are computed once per layer, then each candidate token is
one decoder step attending over them and itself.
"""

from __future__ import annotations

import numpy as np

from pingctl.infer.engines.arch import LOGITS, Arch, layout


def prepare(arch: Arch, tensors: dict):
    """The device-side parameters: layer axis first (for lax.scan), cast to the compute dtype
    (as MaxText casts each weight before its matmul; the norms' scales likewise; the logits
    kernel to float32 with `logits_dot_in_fp32`)."""
    import jax.numpy as jnp

    dt = jnp.dtype(arch.dtype)

    def put(name, layered):
        a = np.asarray(tensors[name])
        a = np.moveaxis(a, 1, 0) if layered else a
        return jnp.asarray(a, jnp.float32 if name == LOGITS and arch.logits_dot_in_fp32 else dt)

    return layout(arch, put)


# ----------------------------------------------------------------- the network


def _dense(x, w, contract: int = 1):
    """MaxText's DenseGeneral: the last `contract` axes of x against the first of w."""
    import jax

    n = x.ndim
    return jax.lax.dot_general(x, w, ((tuple(range(n - contract, n)), tuple(range(contract))), ((), ())))


def _norm(x, scale, arch: Arch):
    import jax
    import jax.numpy as jnp

    x = x.astype(jnp.float32)
    y = (x * jax.lax.rsqrt(jnp.mean(jnp.square(x), axis=-1, keepdims=True) + arch.eps)).astype(arch.dtype)
    return y * scale


def _rope(x, positions, arch: Arch):
    """x [..., t, heads, head_dim] rotated by positions [..., t] (MaxText's RotaryEmbedding)."""
    import jax.numpy as jnp

    d = x.shape[-1]
    fraction = 2 * jnp.arange(0, d // 2) / d
    timescale = arch.rope_min * (arch.rope_max / arch.rope_min) ** fraction
    sinusoid = positions[..., None, None] / timescale
    sin = jnp.sin(sinusoid).astype(x.dtype)
    cos = jnp.cos(sinusoid).astype(x.dtype)
    sin = jnp.concatenate([sin, sin], axis=-1)
    cos = jnp.concatenate([cos, cos], axis=-1)
    x1, x2 = jnp.split(x, 2, axis=-1)
    return (x * cos + jnp.concatenate((-x2, x1), axis=-1) * sin).astype(arch.dtype)


def _qkv(x, p, positions, arch: Arch):
    import jax.numpy as jnp

    lnx = _norm(x, p["pre_norm"], arch)
    q = _rope(_dense(lnx, p["q"]), positions, arch)
    k = _rope(_dense(lnx, p["k"]), positions, arch)
    v = _dense(lnx, p["v"])
    if arch.float32_qk_product:
        q, k = q.astype(jnp.float32), k.astype(jnp.float32)
    return q, k, v


def _after_attention(x, attn, p, arch: Arch):
    """Output projection, residual, MLP, residual."""
    import jax
    import jax.numpy as jnp

    h = x + _dense(attn.astype(arch.dtype), p["o"], 2)
    hn = _norm(h, p["post_norm"], arch)
    acts = []
    for w, name in zip(p["wi"], arch.activations):
        a = _dense(hn, w)
        if arch.activations_in_float32:
            a = a.astype(jnp.float32)
        acts.append(a if name == "linear" else getattr(jax.nn, name)(a))
    m = acts[0]
    for a in acts[1:]:
        m = m * a
    return _dense(m.astype(arch.dtype), p["wo"]) + h


_MASKED = -0.7 * float(np.finfo(np.float32).max)  # MaxText's DEFAULT_MASK_VALUE
# query rows per attention block over whole sequences (`_attention`): a sequence of up to this
# many tokens is one block, MaxText's own program
ATTENTION_BLOCK = 64


def _softmax_weighted(logits, values_einsum):
    """MaxText's unnormalised local attention then the division by the exponentials' sum."""
    import jax.numpy as jnp

    m = jnp.max(logits, axis=-1, keepdims=True)
    e = jnp.exp(logits - m)
    return values_einsum(e), jnp.sum(e, axis=-1, keepdims=True)


def _attention(q, k, v, segments, arch: Arch, block: int | None):
    """Causal self-attention over whole sequences, `block` query rows at a time (None: all at
    once). A block's queries attend to the keys up to its own last row only: the keys after it
    are masked by causality anyway, and the mask value's exponential is exactly 0, so the
    numbers are those of one block while a long sequence computes ~half of its scores (on a
    CPU the scores' memory traffic is most of a long pass)."""
    import jax.numpy as jnp

    b, t = q.shape[:2]
    g = arch.heads // arch.kv_heads
    qg = q.reshape(b, t, arch.kv_heads, g, arch.head_dim)
    outs = []
    for a in range(0, t, block or t):
        e = min(a + (block or t), t)
        logits = jnp.einsum("btkgd,bskd->bkgts", qg[:, a:e], k[:, :e])
        if arch.float32_logits:
            logits = logits.astype(jnp.float32)
        causal = jnp.arange(e)[None, :] <= jnp.arange(a, e)[:, None]
        mask = (segments[:, a:e, None] == segments[:, None, :e]) & (segments[:, None, :e] >= 0) & causal[None]
        logits = jnp.where(mask[:, None, None], logits, jnp.asarray(_MASKED, logits.dtype))
        out, s = _softmax_weighted(logits, lambda w: jnp.einsum("bkgts,bskd->btkgd", w, v[:, :e]))
        outs.append(out.reshape(b, e - a, arch.heads, arch.head_dim)
                    / jnp.transpose(s.reshape(b, arch.heads, e - a, 1), (0, 2, 1, 3)))
    return outs[0] if len(outs) == 1 else jnp.concatenate(outs, axis=1)


def _layer(x, p, positions, segments, arch: Arch, block: int | None = None):
    """One decoder layer over whole sequences; returns (output, (keys, values))."""
    q, k, v = _qkv(x, p, positions, arch)
    return _after_attention(x, _attention(q, k, v, segments, arch, block), p, arch), (k, v)


def _embed(params, tokens, arch: Arch):
    return params["embedding"][tokens].astype(arch.dtype)


def _head(params, y, arch: Arch):
    """Final norm, logits (float32), log-softmax."""
    import jax
    import jax.numpy as jnp

    y = _norm(y, params["final_norm"], arch)
    logits = _dense(y.astype(params["logits"].dtype), params["logits"]).astype(jnp.float32)
    return jax.nn.log_softmax(logits, axis=-1)


def decoder(params, tokens, positions, segments, arch: Arch, want_kv: bool = False,
            block: int | None = ATTENTION_BLOCK):
    """log P(next token) [b, t, vocab] float32 after each position of tokens [b, t] (int32),
    with positions and segment ids [b, t] (segment 0: padding, ignored); with `want_kv`, also
    every layer's keys and values ([layers, b, t, kv_heads, head_dim] each). `block`: query
    rows per attention block (`_attention`; None: one block)."""
    import jax

    def body(y, p):
        y, kv = _layer(y, p, positions, segments, arch, block)
        return y, (kv if want_kv else None)

    y, kv = jax.lax.scan(body, _embed(params, tokens, arch), params["layers"])
    lp = _head(params, y, arch)
    return (lp, kv) if want_kv else lp


def decode(params, keys, values, lengths, tokens, arch: Arch):
    """log P(next) [p, c, vocab] after prompt i's `lengths[i]` cached tokens and then token
    tokens[i, j], for each of its c candidates j. keys/values: [layers, p, s, kv_heads, head_dim]
    from `decoder(..., want_kv=True)` (positions >= lengths[i] are ignored)."""
    import jax
    import jax.numpy as jnp

    P, C = tokens.shape
    S = keys.shape[2]
    g = arch.heads // arch.kv_heads
    positions = jnp.broadcast_to(lengths[:, None], (P, C))
    valid = (jnp.arange(S)[None, :] < lengths[:, None])[:, None, None, None, :]  # [p, 1, 1, 1, s]

    def body(y, layer):
        p, kc, vc = layer
        q, k, v = _qkv(y, p, positions, arch)
        qg = q.reshape(P, C, arch.kv_heads, g, arch.head_dim)
        cached = jnp.einsum("pckgd,pskd->pkgcs", qg, kc.astype(qg.dtype))
        own = jnp.einsum("pckgd,pckd->pkgc", qg, k)[..., None]
        logits = jnp.concatenate([cached, own], axis=-1)
        if arch.float32_logits:
            logits = logits.astype(jnp.float32)
        logits = jnp.where(jnp.concatenate([jnp.broadcast_to(valid, cached.shape), jnp.ones_like(own, bool)], -1),
                           logits, jnp.asarray(_MASKED, logits.dtype))
        out, s = _softmax_weighted(
            logits, lambda e: (jnp.einsum("pkgcs,pskd->pckgd", e[..., :S], vc.astype(e.dtype))
                               + jnp.einsum("pkgc,pckd->pckgd", e[..., S], v.astype(e.dtype))))
        out = out.reshape(P, C, arch.heads, arch.head_dim) / jnp.transpose(
            s.reshape(P, arch.heads, C, 1), (0, 2, 1, 3))
        return _after_attention(y, out, p, arch), None

    y, _ = jax.lax.scan(body, _embed(params, tokens, arch), (params["layers"], keys, values))
    return _head(params, y, arch)
