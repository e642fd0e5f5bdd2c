"""Second-byte log-probabilities from one key-value cache per prompt, in the NumPy engine: the
interface of the JAX engine's (pingctl/infer/engines/jax/kv.py: `SecondBytes`, `Session`) that
LoadedModel drives, on pingctl/infer/engines/numpy/net.py.

An RTT distribution needs P(second byte | prompt, RttStart, b) for many first bytes b of one
prompt (all 256 for an exact one). Each prompt is run once keeping every layer's keys and
values (`net.decoder(want_kv=True)`), then every candidate byte is one decoder step
over that cache (`net.decode`): a long prompt costs one pass, not one per candidate.

Nothing is compiled, so nothing is bucketed: a prompt's cache is kept at its own length, and
a pass is padded only to its longest sequence (sorted by length, so similar ones share one).
"""

from __future__ import annotations

import numpy as np

from pingctl.infer.engines.arch import Arch
from pingctl.infer.engines.numpy import net

PROMPTS = 32  # sequences per prefill pass
# candidate rows per decode step: bounds a step's activations ([rows, mlp] floats per layer)
SLOTS = 2048


class SecondBytes:
    """Scores candidate next bytes after prompts that end with RttStart, one cache per prompt."""

    def __init__(self, arch: Arch, params: dict, byte0: int):
        self.arch, self.params, self.byte0 = arch, params, byte0

    def _passes(self, sequences: list[np.ndarray], head: bool):
        """(log-probs [len, vocab] or None, (keys, values) [layers, len, kv, d]) per sequence."""
        out: list = [None] * len(sequences)
        order = sorted(range(len(sequences)), key=lambda i: len(sequences[i]))
        for k in range(0, len(order), PROMPTS):
            chunk = order[k : k + PROMPTS]
            length = max(len(sequences[i]) for i in chunk)
            tok = np.zeros((len(chunk), length), np.int32)
            seg = np.zeros_like(tok)
            for r, i in enumerate(chunk):
                tok[r, : len(sequences[i])] = sequences[i]
                seg[r, : len(sequences[i])] = 1
            pos = np.broadcast_to(np.arange(length, dtype=np.int32), tok.shape)
            lp, (keys, values) = net.decoder(self.params, tok, pos, seg, self.arch, want_kv=True, head=head)
            for r, i in enumerate(chunk):
                n = len(sequences[i])
                # copies: a prompt's cache outlives the pass's padded arrays
                cache = (np.ascontiguousarray(keys[:, r, :n]), np.ascontiguousarray(values[:, r, :n]))
                out[i] = (lp[r, :n].copy() if head else None, cache)
        return out

    def prefill(self, firsts: list[np.ndarray]) -> list[tuple[np.ndarray, np.ndarray]]:
        """Each prompt's (keys, values) [layers, len, kv_heads, head_dim]."""
        return [cache for _, cache in self._passes(firsts, head=False)]

    def whole(self, sequences: list[np.ndarray]):
        """(log-probs [len, vocab], (keys, values)) of each whole sequence, from one pass."""
        return self._passes(sequences, head=True)

    def scores(self, caches: list, candidates: list[np.ndarray]) -> list[np.ndarray]:
        """[len(candidates[i]), vocab] log-probs after the prompt of caches[i] + [byte b], per b;
        decode steps of at most SLOTS candidates (a prompt's many candidates split across steps)."""
        out = [np.zeros((len(c), self.arch.vocab), np.float32) for c in candidates]
        pieces = [(i, a, np.asarray(c)[a : a + SLOTS]) for i, c in enumerate(candidates)
                  for a in range(0, len(c), SLOTS)]
        k = 0
        while k < len(pieces):
            step, rows = [], 0
            while k < len(pieces) and (not step or rows + len(pieces[k][2]) <= SLOTS):
                step.append(pieces[k])
                rows += len(pieces[k][2])
                k += 1
            lp = net.decode(self.params, [caches[i] for i, _, _ in step],
                                    [self.byte0 + c.astype(np.int64) for _, _, c in step], self.arch)
            at = 0
            for i, a, c in step:
                out[i][a : a + len(c)] = lp[at : at + len(c)]
                at += len(c)
        return out

    def log_probs(self, firsts: list[np.ndarray], candidates: list[np.ndarray], bucket=None) -> list[np.ndarray]:
        """[len(candidates[i]), vocab] log-probs of the token after firsts[i] + [byte b], per b: a
        session of one call. `bucket`: the JAX engine's argument, unused (nothing is compiled, so
        nothing is padded)."""
        return Session(self, firsts).log_probs(list(range(len(firsts))), candidates)

    def session(self, firsts: list[np.ndarray], bucket=None) -> Session:
        return Session(self, firsts)


class Session:
    """Second-byte scoring for fixed prompts over several calls (the JAX engine's `Session` interface):
    a prompt is prefilled on the first call that gives it candidates, or taken from a
    teacher-forced pass over a sequence it starts (`whole`), and its cache kept after."""

    def __init__(self, kv: SecondBytes, firsts: list[np.ndarray]):
        self.kv, self.firsts = kv, firsts
        self.caches: dict[int, tuple[np.ndarray, np.ndarray]] = {}  # prompt -> (keys, values)

    def whole(self, sequences: list[np.ndarray]) -> list[np.ndarray]:
        """[len(sequences[i]), vocab] log-probs at every position of sequences[i]; where firsts[i]
        starts sequences[i], its cache is the first len(firsts[i]) positions of the pass's
        (causal attention: a longer sequence's keys and values over those tokens are a prefill's)."""
        out = []
        for i, (lp, (keys, values)) in enumerate(self.kv.whole(sequences)):
            out.append(lp)
            f, s = self.firsts[i], sequences[i]
            if i not in self.caches and len(s) >= len(f) and np.array_equal(s[: len(f)], f):
                n = len(f)
                self.caches[i] = (np.ascontiguousarray(keys[:, :n]), np.ascontiguousarray(values[:, :n]))
        return out

    def log_probs(self, prompts: list[int], candidates: list[np.ndarray]) -> list[np.ndarray]:
        """[len(candidates[j]), vocab] log-probs after firsts[prompts[j]] + [byte b], per b."""
        fresh = sorted({i for i, c in zip(prompts, candidates) if len(c) and i not in self.caches})
        if fresh:
            self.caches.update(zip(fresh, self.kv.prefill([self.firsts[i] for i in fresh])))
        live = [j for j, c in enumerate(candidates) if len(c)]
        got = self.kv.scores([self.caches[prompts[j]] for j in live], [candidates[j] for j in live])
        out = [np.zeros((len(c), self.kv.arch.vocab), np.float32) for c in candidates]
        for j, g in zip(live, got):
            out[j] = g
        return out
