"""How far apart two float32 computations of the same numbers may be: the tolerance of every test
that compares two engines (NumPy, JAX, MaxText), or two paths of one engine (a key-value cache
against whole sequences, attention in blocks against all at once), on log-probabilities or on
the probabilities made from them.

Why not a constant: float32 rounds every sum and product to 24 significant bits, and two
computations that add in different orders round differently. The NumPy and the JAX engine add in
different orders; so does one engine on another CPU, whose BLAS and XLA kernels differ (AVX2 or
AVX-512 or SSE, with or without FMA, another blocking of a matmul). An absolute bound tuned on one
machine failed on another; what the difference can be depends on the magnitude of the numbers
and on how many terms were accumulated to make them.

The model: each rounding is off by at most EPS32 / 2 of the running value, and roundings of
either sign accumulate like a random walk, so a result of magnitude `scale` made from K
accumulated terms is within about EPS32 / 2 * sqrt(K) * scale of the exact value, and two such
computations within EPS32 * sqrt(K) * scale of each other. A log-probability of the decoder
accumulates every reduction on its path (`decoder_terms`); its magnitude bounds its logits' spread
(a log-probability is a logit minus the log-sum-exp of them all), which is what the roundings of
the layers below scale with. SIGMAS is the headroom over that typical size: a test reads the
largest of 10^4-10^5 compared values, several typical sizes out, and the kernels of another CPU
shift it again. It stays well below what an arithmetic error of an engine moves: the same model
computed at half precision lands far outside it (tests/test_numpy_engine.py holds it to that).

Comparisons that must be bitwise equal stay exact, and say why where they are made: the same
program on the same inputs (one pass asked again with its keys and values, one first pass read
by two callers). One cache read in decode steps of other rows is not among them: a matmul of
another height may take another BLAS kernel.
"""

from __future__ import annotations

import math

import numpy as np

EPS32 = float(np.finfo(np.float32).eps)  # 2**-23: one unit in the last place of 1.0
SIGMAS = 4.0


def f32_tol(scale: float, terms: int) -> float:
    """The largest difference two float32 computations of numbers of magnitude `scale`, each
    accumulated from `terms` terms in its own order, may show."""
    return SIGMAS * EPS32 * math.sqrt(terms) * scale


def decoder_terms(arch, length: int) -> int:
    """Terms accumulated on the way to one log-probability of a decoder of `arch` (pingctl.infer.engines.arch.Arch)
    over `length` tokens: per layer its two RMS norms, the query/key/value projection, the
    attention scores, the softmax's normaliser and its weighted sum of values over the keys, the
    output projection, the MLP's input projections and its output one; then the final norm, the
    logits and the log-sum-exp over the vocabulary."""
    norms_and_qkv = 3 * arch.emb
    attention = arch.head_dim + 2 * length + arch.heads * arch.head_dim
    mlp = arch.emb * len(arch.activations) + arch.mlp
    return arch.layers * (norms_and_qkv + attention + mlp) + 2 * arch.emb + arch.vocab


def log_prob_tol(arch, length: int, reference) -> float:
    """The tolerance of log-probabilities of a decoder of `arch` over up to `length` tokens,
    against `reference` (one side's values: their largest magnitude is the scale)."""
    ref = np.asarray(reference, np.float64)
    return f32_tol(float(np.abs(ref[np.isfinite(ref)]).max(initial=0.0)), decoder_terms(arch, length))


def prob_tol(probs, log_tol: float) -> float:
    """The tolerance of probabilities whose logarithms are within `log_tol`: exp moves p by
    p * |Δ log p| to first order, so the largest probability sets it."""
    return log_tol * float(np.max(probs, initial=0.0))


def run_arch(run):
    """The architecture (engines.arch.Arch) of a trained run, from its maxtext.yml."""
    from pingctl.artifacts.run import read_maxtext_doc
    from pingctl.infer.engines import arch as A

    return A.Arch.from_keys(read_maxtext_doc(run))


def model_log_tol(model, sequences, run=None) -> float:
    """log_prob_tol of a loaded model (a LoadedModel) over its whole context, at the magnitude of
    its log-probabilities at every position of `sequences`: those of the answers compared (an
    RTT's prompts with RttStart after them). Its architecture: the light engines' own, or that of
    the run's maxtext.yml (`run`, for the MaxText engine)."""
    arch = run_arch(run) if run is not None else model.net.arch
    return log_prob_tol(arch, model.seq_len, np.concatenate(model.log_probs(sequences)))


def assert_within(got, want, tol: float, what: str = "") -> float:
    """|got - want| <= tol everywhere (same shapes); the largest difference."""
    got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
    assert got.shape == want.shape, (what, got.shape, want.shape)
    diff = float(np.abs(got - want).max(initial=0.0))
    assert diff <= tol, f"{what}: differ by {diff:.3g}, above float32's bound {tol:.3g}"
    return diff


def assert_log_probs_close(got, want, arch, length: int, what: str = "") -> float:
    """Log-probabilities over the vocabulary (rows whose magnitude is the scale: pass whole rows,
    or a mask of live positions) within log_prob_tol of `want`."""
    return assert_within(got, want, log_prob_tol(arch, length, want), what)


def assert_probs_close(got, want, log_tol: float, what: str = "") -> float:
    """Probabilities `got` within prob_tol(want, log_tol) of `want`."""
    return assert_within(got, want, prob_tol(want, log_tol), what)
