"""Second-byte log-probabilities from one key-value cache per prompt, in the light engine.

An RTT distribution needs P(second byte | prompt, RttStart, b) for many first bytes b of one
prompt: all 256 for an exact distribution, a few for a read at its quantiles. Here each prompt
(ending with RttStart) is run once, keeping every layer's keys and values (`light.decoder`
with `want_kv`), and each candidate byte is one decoder step over that cache
(`light.decode`): the cost of a long prompt is paid once, not once per candidate. The
numbers are those of whole sequences to float32 rounding (tests/test_light_engine.py).

Shapes are bucketed so that a session compiles a handful: prompts per call (PROMPT_BATCHES),
candidates per prompt (CANDIDATE_BUCKETS), prompt length (the model's length buckets).
"""

from __future__ import annotations

import functools

import numpy as np

from pingctl.infer import light

PROMPT_BATCHES = (1, 8, 32)
CANDIDATE_BUCKETS = (4, 16, 64, 256)
# prompts x candidate slots in one decode step: bounds its attention scores (slots x heads x
# prompt length per layer) while keeping a step large enough to use the cores
SLOTS = 1024


def worth_it(prompts: int, candidates: int) -> bool:
    """The cache pays once the prompts have more than one candidate each on average: with one,
    a whole-sequence pass costs what the prefill alone does."""
    return candidates >= 2 * prompts


def _bucket(n: int, buckets: tuple[int, ...]) -> int:
    return next((b for b in buckets if n <= b), buckets[-1])


class SecondBytes:
    """Scores candidate next bytes after prompts that end with RttStart, one cache per prompt."""

    def __init__(self, arch: light.Arch, params, byte0: int):
        import jax

        self.arch, self.params, self.byte0 = arch, params, byte0
        self._prefill = jax.jit(lambda p, t, pos, seg: light.decoder(p, t, pos, seg, arch, want_kv=True)[1])
        self._decode = jax.jit(functools.partial(light.decode, arch=arch))

    def log_probs(self, firsts: list[np.ndarray], candidates: list[np.ndarray], bucket) -> list[np.ndarray]:
        """[len(candidates[i]), vocab] log-probs of the token after firsts[i] + [byte b], per b.
        `bucket(n)`: the padded length a prompt of n tokens runs at."""
        out = [np.zeros((len(c), self.arch.vocab), np.float32) for c in candidates]
        live = [i for i in range(len(firsts)) if len(candidates[i])]
        live.sort(key=lambda i: len(firsts[i]))  # similar lengths share a padded length
        k = 0
        while k < len(live):
            # as many prompts as the slot budget holds at this chunk's candidate bucket
            group: list[int] = []
            width = CANDIDATE_BUCKETS[0]
            for i in live[k:]:
                w = max(width, _bucket(len(candidates[i]), CANDIDATE_BUCKETS))
                if group and (len(group) + 1) * w > SLOTS or len(group) == PROMPT_BATCHES[-1]:
                    break
                group.append(i)
                width = w
            k += len(group)
            self._run(group, firsts, candidates, width, bucket, out)
        return out

    def _run(self, group, firsts, candidates, width, bucket, out) -> None:
        nb = _bucket(len(group), PROMPT_BATCHES)
        length = bucket(max(len(firsts[i]) for i in group))
        tok = np.zeros((nb, length), np.int32)
        seg = np.zeros((nb, length), np.int32)
        lengths = np.ones(nb, np.int32)
        cand = np.full((nb, width), self.byte0, np.int32)
        for r, i in enumerate(group):
            f = np.asarray(firsts[i], np.int32)
            tok[r, : len(f)] = f
            seg[r, : len(f)] = 1
            lengths[r] = len(f)
            c = np.asarray(candidates[i], np.int64)
            cand[r, : len(c)] = self.byte0 + c
        pos = np.ascontiguousarray(np.broadcast_to(np.arange(length, dtype=np.int32), (nb, length)))
        keys, values = self._prefill(self.params, tok, pos, seg)
        lp = np.asarray(self._decode(self.params, keys, values, lengths, cand))
        for r, i in enumerate(group):
            out[i] = lp[r, : len(candidates[i])]
