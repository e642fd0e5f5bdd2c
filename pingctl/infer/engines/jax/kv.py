"""Second-byte log-probabilities from one key-value cache per prompt, in the JAX engine.

An RTT distribution needs P(second byte | prompt, RttStart, b) for many first bytes b of one
prompt: all 256 for an exact distribution, a few for a read at its quantiles. Here each prompt
(ending with RttStart) is run once, keeping every layer's keys and values (`net.decoder`
with `want_kv`), and each candidate byte is one decoder step over that cache
(`net.decode`): the cost of a long prompt is paid once, not once per candidate. The
numbers are those of whole sequences to float32 rounding (tests/test_light_engine.py).

Shapes are bucketed so that a session compiles a handful: prompts per call (PROMPT_BATCHES),
candidates per prompt (CANDIDATE_BUCKETS), prompt length (the model's length buckets).
"""

from __future__ import annotations

import functools

import numpy as np

from pingctl.infer.engines.arch import Arch
from pingctl.infer.engines.jax import net

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


def fine_length(n: int, bucket) -> int:
    """The padded length of a whole-sequence pass over sequences of up to n tokens: the model's
    length bucket `bucket(n)` cut to a multiple of an eighth of it. A pass costs more than in
    proportion to its length (attention), and `Session.whole` is handed sequences of similar
    lengths, so 8 shapes a bucket instead of 1 save up to half of a long pass."""
    b = bucket(n)
    step = max(16, b // 8)
    return min(b, -(-n // step) * step)


class SecondBytes:
    """Scores candidate next bytes after prompts that end with RttStart, one cache per prompt."""

    def __init__(self, arch: Arch, params, byte0: int):
        import jax

        self.arch, self.params, self.byte0 = arch, params, byte0
        self._prefill = jax.jit(lambda p, t, pos, seg: net.decoder(p, t, pos, seg, arch, want_kv=True)[1])
        self._whole = jax.jit(lambda p, t, pos, seg: net.decoder(p, t, pos, seg, arch, want_kv=True))
        self._decode = jax.jit(functools.partial(net.decode, arch=arch))

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
        keys, values, lengths = self.prefill([firsts[i] for i in group], bucket)
        lp = self._scores(keys, values, lengths, [candidates[i] for i in group], width)
        for r, i in enumerate(group):
            out[i] = lp[r, : len(candidates[i])]

    def prefill(self, firsts: list[np.ndarray], bucket):
        """(keys, values, lengths) of up to PROMPT_BATCHES[-1] prompts, padded to a bucket of rows."""
        tok, pos, seg, lengths = self._padded(firsts, bucket)
        keys, values = self._prefill(self.params, tok, pos, seg)
        return keys, values, lengths

    def whole(self, sequences: list[np.ndarray], bucket):
        """(log-probs [rows, length, vocab], keys, values, lengths) of up to PROMPT_BATCHES[-1]
        whole sequences: a prefill that also gives the log-probs at every position."""
        tok, pos, seg, lengths = self._padded(sequences, bucket)
        lp, (keys, values) = self._whole(self.params, tok, pos, seg)
        return np.asarray(lp), keys, values, lengths

    def _padded(self, firsts: list[np.ndarray], bucket):
        nb = _bucket(len(firsts), PROMPT_BATCHES)
        length = bucket(max(len(f) for f in firsts))
        tok = np.zeros((nb, length), np.int32)
        seg = np.zeros((nb, length), np.int32)
        lengths = np.ones(nb, np.int32)
        for r, f in enumerate(firsts):
            tok[r, : len(f)] = f
            seg[r, : len(f)] = 1
            lengths[r] = len(f)
        pos = np.ascontiguousarray(np.broadcast_to(np.arange(length, dtype=np.int32), (nb, length)))
        return tok, pos, seg, lengths

    def _scores(self, keys, values, lengths, candidates: list[np.ndarray], width: int) -> np.ndarray:
        """[rows, width, vocab] log-probs of each row's candidates (row r: candidates[r], padded)."""
        cand = np.full((len(lengths), width), self.byte0, np.int32)
        for r, c in enumerate(candidates):
            cand[r, : len(c)] = self.byte0 + np.asarray(c, np.int64)
        return np.asarray(self._decode(self.params, keys, values, lengths, cand))

    def session(self, firsts: list[np.ndarray], bucket) -> Session:
        return Session(self, firsts, bucket)


class Session:
    """Second-byte scoring for fixed prompts over several calls (the refinement rounds of
    `queries.rtt_distributions_at`): a prompt is prefilled on the first call that gives it
    candidates and its cache kept for every later call, so a round costs its decode steps only."""

    def __init__(self, kv: SecondBytes, firsts: list[np.ndarray], bucket):
        self.kv, self.firsts, self.bucket = kv, firsts, bucket
        self.groups: list[tuple] = []  # (keys, values, lengths) per prefill
        self.where: dict[int, tuple[int, int]] = {}  # prompt -> (group, row)

    def whole(self, sequences: list[np.ndarray]) -> list[np.ndarray]:
        """[len(sequences[i]), vocab] log-probs at every position of sequences[i], and the cache
        of firsts[i] kept from the same pass wherever firsts[i] starts sequences[i]: causal
        attention makes a longer sequence's keys and values over its first tokens those of a
        prefill of these tokens alone (`decode` ignores cached positions past a prompt's length),
        so a teacher-forced pass over prompt + result leaves no prompt to prefill again."""
        out: list[np.ndarray] = [np.zeros(0)] * len(sequences)
        order = sorted(range(len(sequences)), key=lambda i: len(sequences[i]))
        for k in range(0, len(order), PROMPT_BATCHES[-1]):
            chunk = order[k : k + PROMPT_BATCHES[-1]]
            lp, keys, values, _ = self.kv.whole([sequences[i] for i in chunk],
                                                functools.partial(fine_length, bucket=self.bucket))
            lengths = np.ones(len(lp), np.int32)
            kept = []
            for r, i in enumerate(chunk):
                out[i] = lp[r, : len(sequences[i])].copy()
                f, s = self.firsts[i], sequences[i]
                if i not in self.where and len(s) >= len(f) and np.array_equal(s[: len(f)], f):
                    lengths[r] = len(f)
                    kept.append((i, r))
            if kept:
                self.groups.append((keys, values, lengths))
                self.where.update((i, (len(self.groups) - 1, r)) for i, r in kept)
        return out

    def log_probs(self, prompts: list[int], candidates: list[np.ndarray]) -> list[np.ndarray]:
        """[len(candidates[j]), vocab] log-probs after firsts[prompts[j]] + [byte b], per b."""
        import jax.numpy as jnp

        fresh = sorted({i for i, c in zip(prompts, candidates) if len(c) and i not in self.where},
                       key=lambda i: len(self.firsts[i]))  # similar lengths share a padded length
        for k in range(0, len(fresh), PROMPT_BATCHES[-1]):
            chunk = fresh[k : k + PROMPT_BATCHES[-1]]
            self.groups.append(self.kv.prefill([self.firsts[i] for i in chunk], self.bucket))
            self.where.update((i, (len(self.groups) - 1, r)) for r, i in enumerate(chunk))
        out = [np.zeros((len(c), self.kv.arch.vocab), np.float32) for c in candidates]
        asked: dict[int, list[int]] = {}
        for j, (i, c) in enumerate(zip(prompts, candidates)):
            if len(c):
                asked.setdefault(self.where[i][0], []).append(j)
        for g, js in asked.items():
            keys, values, lengths = self.groups[g]
            rows = [self.where[prompts[j]][1] for j in js]
            nb = _bucket(len(rows), PROMPT_BATCHES)
            if nb < len(lengths):  # a few prompts of this prefill left: decode their rows only
                take = np.array(rows + [rows[0]] * (nb - len(rows)))
                keys, values, lengths = jnp.take(keys, take, axis=1), jnp.take(values, take, axis=1), lengths[take]
                rows = list(range(len(rows)))
            most = max(len(candidates[j]) for j in js)
            fit = [b for b in CANDIDATE_BUCKETS if b * len(lengths) <= SLOTS] or [CANDIDATE_BUCKETS[0]]
            width = min(_bucket(most, CANDIDATE_BUCKETS), fit[-1])
            for a in range(0, most, width):  # the slot budget bounds one decode step
                cols = [np.zeros(0, np.int64)] * len(lengths)
                for r, j in zip(rows, js):
                    cols[r] = np.asarray(candidates[j])[a : a + width]
                lp = self.kv._scores(keys, values, lengths, cols, width)
                for r, j in zip(rows, js):
                    n = len(cols[r])
                    out[j][a : a + n] = lp[r, :n]
        return out
