"""The questions users ask a trained model (compact scheme).

- `rtt_distribution`: the exact distribution of the 2-byte RTT code given src, dst (and
  time, context): P(first byte), then P(second byte | first byte) for all 256 first bytes.
- `complete`: top-k completions of partial addresses (beam search over missing bytes).
- `inverse`: destinations for a source and an RTT (sampled, ranked by probability).
- `generate`: whole measurement streams, grammar-constrained.
"""

from __future__ import annotations

import functools
import ipaddress
import itertools
from dataclasses import dataclass, field

import numpy as np

from pingctl.context import last_k_per_key
from pingctl.errors import PingctlError, UsageError
from pingctl.tokenizer import C, Measurements, decode, encode, get_vocab
from pingctl.tokenizer.measurements import format_addresses
from pingctl.tokenizer.relative import has_scale, to_absolute, to_relative
from pingctl.tokenizer.rtt_codec import POSSIBLE_FIRST_BYTES, decode_rtt, possible_first_bytes, token_codes

V = get_vocab("compact")
BYTE0 = V.byte_offset
QUANTILES = (0.05, 0.25, 0.5, 0.75, 0.95)
TRIM = 0.05  # trimmed mean over the central 90%: the mass between the p5 and p95 printed beside it
# The mean is taken over RTT <= this ceiling (renormalised), with the mass above it reported
# beside it. The RTT codec reaches ~50 days (`rtt_codec.MAX_MS`), and an undertrained model
# puts a little mass up there, which alone makes the plain mean millions of ms; a ping reply
# never takes anywhere near 60 s (RIPE Atlas pings time out far below that), so what lies
# above is the model's error, not a latency a mean should average in.
MEAN_CEILING_MS = 60_000.0
# prompts whose key-value caches `rtt_distributions_at` keeps at once (a few MB each for `mini`)
REFINE_PROMPTS = 256


def _require_compact(model) -> None:
    if model.scheme != "compact":
        raise PingctlError(f"this query needs a model trained with the compact scheme (this one: {model.scheme})")


# ----------------------------------------------------------------- prompts


def check_per_pair(per_pair: int | None) -> None:
    """`--context-per-pair` of `pingctl sample` and `pingctl eval`: None (as trained) or >= 0."""
    if per_pair is not None and per_pair < 0:
        raise UsageError(f"--context-per-pair must be >= 0 (0 = no cap), got {per_pair}")


def context_tokens(model, context: Measurements | None, budget: int, per_pair: int = 0,
                   timed: bool = True, hint: np.ndarray | None = None) -> tuple[np.ndarray, int | None]:
    """The most recent context measurements that fit `budget` tokens, time-ordered, every one
    timestamped (the *full* training mode) or, with `timed=False`, none (the *none* mode, for
    a run trained without timestamps); returns (tokens, last timestamp or None). With
    `per_pair`, only the most recent `per_pair` measurements of each (src, dst) pair are kept
    first, as `loader.max_per_pair` shapes training contexts. A `hint` (`hint_tokens`) takes
    its room from `budget` and goes after the measurements, just before the query, as
    `loader.hints_file` trains it."""
    if hint is None or not len(hint):
        return _recent_tokens(context, budget, per_pair, timed)
    tokens, last_t = _recent_tokens(context, budget - len(hint), per_pair, timed)
    return np.concatenate([tokens, hint]), last_t


def _recent_tokens(context: Measurements | None, budget: int, per_pair: int, timed: bool
                   ) -> tuple[np.ndarray, int | None]:
    if context is None or len(context) == 0:
        return np.zeros(0, np.int32), None
    order = np.argsort(context.time_s, kind="stable")
    if per_pair:
        _, pair = np.unique(np.concatenate([context.src, context.dst], axis=1)[order], axis=0, return_inverse=True)
        order = order[last_k_per_key(pair.ravel(), per_pair)]
    m = context.take(order)
    m.has_time[:] = timed
    enc = encode(m, "compact")
    lens = enc.lengths
    # keep a suffix; its first timestamp becomes absolute (+7 tokens at most)
    keep = int(np.searchsorted(np.cumsum(lens[::-1]), budget - 8, side="right"))
    if keep == 0:
        return np.zeros(0, np.int32), None
    if keep < len(m):  # all of them kept: the encoding above is the prompt's
        m = m.take(np.arange(len(m) - keep, len(m)))
        enc = encode(m, "compact")
    return enc.tokens, (int(m.time_s[-1]) if timed else None)


def hint_tokens(src: str, dst: str, rtt_ms: float) -> np.ndarray:
    """A hint (`pingctl.loader.hints`): the pair with an RTT estimate as its result, no timestamp;
    it goes just before the query, whose timestamp still counts from the context's last one."""
    m = Measurements.from_fields([src], [dst], [float(rtt_ms)], None)
    return encode(m, "compact", order=("time", "src", "dst", "result")).tokens.astype(np.int32)


def query_prefix(src: str, dst: str, time_s: int | None, context: np.ndarray, last_time: int | None) -> np.ndarray:
    """context + MeasurementStart, [timestamp], Src block, Dst block (the result comes next)."""
    has_time = time_s is not None
    m = Measurements.from_fields([src], [dst], [0.0], [time_s] if has_time else None)
    if has_time and last_time is not None:
        # encode together with a dummy reference so the timestamp is a delta, as in training
        ref = Measurements.from_fields([src], [dst], [0.0], [last_time])
        both = Measurements.concat([ref, m])
        enc = encode(both, "compact", order=("time", "src", "dst", "result"))
        tokens = enc.measurement(1)
    else:
        tokens = encode(m, "compact", order=("time", "src", "dst", "result")).tokens
    return np.concatenate([context, tokens[:-3]]).astype(np.int32)  # drop RttStart + 2 bytes


# ----------------------------------------------------------------- RTT distribution


@dataclass
class RttDistribution:
    p_fail: float
    codes: np.ndarray  # uint16 codes sorted by value
    values_ms: np.ndarray
    probs: np.ndarray  # P(code | success), sums to 1

    # cumsum of probs, once: every quantile and the trimmed mean read it
    _cumulative: np.ndarray | None = field(default=None, repr=False, compare=False)

    @property
    def cumulative(self) -> np.ndarray:
        """The CDF over `values_ms` (cumsum of `probs`), computed once."""
        if self._cumulative is None:
            self._cumulative = np.cumsum(self.probs)
        return self._cumulative

    def quantile(self, q: float) -> float:
        return float(self.quantile_values([q])[0])

    def quantile_values(self, qs) -> np.ndarray:
        """`quantile` of each of `qs`, in one search."""
        cdf = self.cumulative
        return self.values_ms[np.minimum(np.searchsorted(cdf, np.asarray(qs, np.float64)), len(cdf) - 1)]

    def cdf(self, x_ms: float) -> float:
        return float(self.probs[self.values_ms <= x_ms].sum())

    @property
    def mean(self) -> float:
        """`truncated_mean()`: the mean of RTT <= MEAN_CEILING_MS (NaN where no mass is there)."""
        return self.truncated_mean()

    def truncated_mean(self, ceiling_ms: float = MEAN_CEILING_MS) -> float:
        """Mean of the distribution truncated to RTT <= `ceiling_ms` and renormalised; NaN
        where it holds no mass. `p_over(ceiling_ms)` is the mass it leaves out."""
        below = self.values_ms <= ceiling_ms
        mass = float(self.probs[below].sum())
        return float((self.values_ms[below] * self.probs[below]).sum() / mass) if mass > 0 else float("nan")

    def p_over(self, ceiling_ms: float = MEAN_CEILING_MS) -> float:
        """P(RTT > `ceiling_ms` | success)."""
        return float(self.probs[self.values_ms > ceiling_ms].sum())

    def trimmed_mean(self, trim: float = TRIM) -> float:
        """Mean of the central 1 - 2*trim of the mass (exact: each code weighs by the overlap
        of its CDF interval with [trim, 1 - trim]). An undertrained model puts a little mass on
        codes far past any ping timeout, which moves the plain mean by seconds."""
        hi = self.cumulative
        lo = hi - self.probs
        w = np.clip(np.minimum(hi, 1.0 - trim) - np.maximum(lo, trim), 0.0, None)
        return float((self.values_ms * w).sum() / w.sum())

    def summary(self) -> dict:
        """The figures `pingctl sample` prints and `--pairs` writes, by column name. `mean_ms` is
        the mean of RTT <= MEAN_CEILING_MS (None where no mass is there) and `p_over_ceiling`
        the mass above it, given success."""
        mean = self.mean
        return {
            "p_fail": self.p_fail,
            "mean_ms": mean if np.isfinite(mean) else None,
            "p_over_ceiling": self.p_over(),
            "trimmed_mean_ms": self.trimmed_mean(),
            **{f"p{round(q * 100)}_ms": float(v) for q, v in zip(QUANTILES, self.quantile_values(QUANTILES))},
        }


def bytes_distribution(lp: np.ndarray) -> np.ndarray:
    p = np.exp(lp[..., BYTE0 : BYTE0 + 256] - lp[..., BYTE0 : BYTE0 + 256].max(axis=-1, keepdims=True))
    return p / p.sum(axis=-1, keepdims=True)


def first_byte_distribution(lp: np.ndarray) -> np.ndarray:
    """P(first RTT byte) from the log-probs after RttStart, over the first bytes a token stream
    can carry (the grammar's `rtt_codec.POSSIBLE_FIRST_BYTES`), renormalised."""
    return possible_first_bytes(bytes_distribution(lp))


def rtt_distribution(model, prefix: np.ndarray, scale: float | None = None) -> RttDistribution:
    return rtt_distributions(model, [prefix], scales=None if scale is None else [scale])[0]


def in_ms(dists: list[RttDistribution], scales=None) -> list[RttDistribution]:
    """The distributions of prompts whose answer is relative to the hint they carry
    (`loader.relative_target`), in ms: each value times `scales[i]` / REF_MS
    (`tokenizer.relative.to_absolute`); a prompt without a scale (None, NaN) as it was. The
    probabilities stay: the map is monotone, so every quantile, CDF read and PIT carries over."""
    if scales is None:
        return list(dists)
    return [RttDistribution(d.p_fail, d.codes, to_absolute(d.values_ms, s), d.probs) if has_scale(s) else d
            for d, s in zip(dists, scales)]


def rtt_distributions(model, prefixes: list[np.ndarray], prune: float = 0.0, scales=None) -> list[RttDistribution]:
    """Exact RTT-code distributions for many prompts, batched: one pass for P(failure) and
    P(first byte), one pass over every (prompt, first byte) for P(second byte). First bytes
    with probability <= `prune` are skipped (their mass is dropped and renormalised).
    `scales[i]`: prompt i's answer is relative to its hint (`in_ms`; None: all in ms)."""
    _require_compact(model)
    firsts = [np.concatenate([p, [C.RttStart]]).astype(np.int32) for p in prefixes]
    p_fail, p1 = first_pass(model, prefixes)
    live = [np.flatnonzero(row > prune) if prune > 0 else np.flatnonzero(POSSIBLE_FIRST_BYTES) for row in p1]
    p2_all = bytes_distribution(np.concatenate(model.second_byte_log_probs(firsts, live)))
    codes, values, _, _ = _code_table()
    order = codes.astype(np.int64)
    out, k = [], 0
    for i, bs in enumerate(live):
        joint = np.zeros((256, 256))
        joint[bs] = p1[i, bs, None] * p2_all[k : k + len(bs)]
        k += len(bs)
        j = joint.reshape(-1)[order]
        out.append(RttDistribution(float(p_fail[i]), codes, values, j / j.sum()))
    return in_ms(out, scales)


@functools.cache
def _code_table() -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Codes sorted by value, their values, and each first byte's [lo, hi] value range."""
    codes = np.arange(65536, dtype=np.uint16)
    values = decode_rtt(codes)
    per_byte = values.reshape(256, 256)
    order = np.argsort(values, kind="stable")
    return codes[order], values[order], per_byte.min(axis=1), per_byte.max(axis=1)


code_table = _code_table  # the same table for `pingctl score`'s reads (pingctl.infer.score)


def first_pass(model, prefixes: list[np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """(P(failure) [n], P(first RTT byte | success) [n, 256]) after each prompt, one pass."""
    firsts = [np.concatenate([p, [C.RttStart]]).astype(np.int32) for p in prefixes]
    lps = model.log_probs(firsts, at=[np.array([len(p) - 1, len(p)]) for p in prefixes])
    if not lps:
        return np.zeros(0), np.zeros((0, 256))
    return np.array([fail_probability(lp[0]) for lp in lps]), np.stack([first_byte_distribution(lp[1]) for lp in lps])


def _shifted(second_bytes, a: int, idx: list[int], candidates: list[np.ndarray]) -> list[np.ndarray]:
    return second_bytes([i + a for i in idx], candidates)


def fail_probability(lp: np.ndarray) -> float:
    """P(Failed) against P(RttStart) from the log-probs where the result block starts."""
    return float(np.exp(lp[C.Failed]) / (np.exp(lp[C.Failed]) + np.exp(lp[C.RttStart])))


def rtt_distributions_at(model, prefixes: list[np.ndarray], quantiles=QUANTILES, points=None,
                         eps: float = 1e-3, max_rounds: int = 6, first=None, known=None,
                         second_bytes=None, read_cdfs=None, scales=None) -> list[RttDistribution]:
    """RTT distributions that are exact where they are read: at the `quantiles` and at
    `points[i]` (ms, e.g. the actual RTT for a PIT; NaN or negative = none) of prompt i.

    P(first byte) comes from one pass. P(second byte | first byte) is computed only for the
    first bytes whose value range contains a quantile or a point, most probable first, until
    the unrefined ones there hold at most `eps` (non-canonical codes make several first bytes
    overlap); every other first byte keeps its mass spread evenly over its 256 codes, which
    cannot move a CDF read outside its range. Quantiles found on that mixture are refined
    until none moves into an unrefined byte (a few rounds). Cost: a few second-byte
    sequences per prompt instead of up to 256 (`rtt_distributions`); any quantile or CDF
    read is off by at most `eps` of probability. `mean` and the full code histogram are
    approximate (uniform inside unrefined first bytes).

    `first` = (p_fail, p1) from `first_pass` (or an equivalent teacher-forced pass) skips that
    pass; `known` = {(prompt index, first byte): P(second byte)} rows already computed;
    `second_bytes` = a `second_byte_session` over these prompts already under way.
    `read_cdfs[i]` (None: the model's own) maps prompt i's normalised CDF over the sorted codes
    and their values to the CDF its quantiles are read on (a combined answer's pool), so the
    distribution is exact where that answer's quantiles fall.
    `scales[i]`: prompt i's answer is relative to its hint (`in_ms`): its point is read where
    the relative answer holds it, and its distribution comes back in ms (None: all in ms)."""
    _require_compact(model)
    if scales is not None:
        sc = np.asarray(scales, np.float64)
        return in_ms(rtt_distributions_at(
            model, prefixes, quantiles, None if points is None else to_relative(points, sc), eps, max_rounds,
            first, known, second_bytes, _cdfs_read_in_ms(read_cdfs, sc)), sc)
    codes, values, lo, hi = _code_table()
    order = codes.astype(np.int64)  # sorted position k holds code order[k]
    firsts = [np.concatenate([p, [C.RttStart]]).astype(np.int32) for p in prefixes]
    p_fail, p1 = first if first is not None else first_pass(model, prefixes)
    p1 = possible_first_bytes(p1)  # a caller's own pass may not be restricted yet
    n = len(prefixes)
    if n > REFINE_PROMPTS:  # prompts are refined independently; a slice at a time bounds the caches kept
        pts = None if points is None else np.asarray(points, np.float64)
        return [d for a in range(0, n, REFINE_PROMPTS) for d in rtt_distributions_at(
            model, prefixes[a : a + REFINE_PROMPTS], quantiles, None if pts is None else pts[a : a + REFINE_PROMPTS],
            eps, max_rounds, (p_fail[a : a + REFINE_PROMPTS], p1[a : a + REFINE_PROMPTS]),
            {(i - a, b): row for (i, b), row in (known or {}).items() if a <= i < a + REFINE_PROMPTS},
            None if second_bytes is None else functools.partial(_shifted, second_bytes, a),
            None if read_cdfs is None else read_cdfs[a : a + REFINE_PROMPTS])]
    # each prompt's key-value cache serves every round (where the engine keeps one)
    session = getattr(model, "second_byte_session", None)
    if second_bytes is None:
        second_bytes = (session(firsts) if session is not None
                        else lambda idx, cands: model.second_byte_log_probs([firsts[i] for i in idx], cands))
    joint = np.repeat(p1[:, :, None] / 256.0, 256, axis=2)  # [n, first, second]
    refined = np.zeros((n, 256), bool)
    for (i, b), row in (known or {}).items():
        joint[i, b] = p1[i, b] * row
        refined[i, b] = True
    pts = np.full(n, np.nan) if points is None else np.asarray(points, np.float64)
    qs = np.asarray(quantiles, np.float64)
    changed = range(n)
    for _ in range(max_rounds):
        want: list[tuple[int, int]] = []
        for i in changed:  # a prompt none of whose bytes the last round refined would ask nothing new
            cdf = np.cumsum(joint[i].reshape(-1)[order])
            if read_cdfs is not None and read_cdfs[i] is not None:
                cdf = read_cdfs[i](cdf / cdf[-1], values)
            reads = list(values[np.minimum(np.searchsorted(cdf, qs * cdf[-1]), 65535)])
            if np.isfinite(pts[i]) and pts[i] >= 0:
                reads.append(pts[i])
            for x in reads:
                # straddling first bytes, most probable first, until the rest hold <= eps
                cand = np.flatnonzero((lo <= x) & (x <= hi) & ~refined[i])
                cand = cand[np.argsort(-p1[i, cand], kind="stable")]
                rest = np.cumsum(p1[i, cand][::-1])[::-1]
                want += [(i, int(b)) for b in cand[rest > eps]]
        want = sorted(set(want))
        if not want:
            break
        groups = [(i, np.array([b for _, b in g])) for i, g in itertools.groupby(want, key=lambda ib: ib[0])]
        rows = second_bytes([i for i, _ in groups], [bs for _, bs in groups])
        p2 = bytes_distribution(np.concatenate(rows))  # in `want` order: sorted by prompt, then byte
        for (i, b), row in zip(want, p2):
            joint[i, b] = p1[i, b] * row
            refined[i, b] = True
        changed = [i for i, _ in groups]
    out = []
    for i in range(n):
        j = joint[i].reshape(-1)[order]
        out.append(RttDistribution(float(p_fail[i]), codes, values, j / j.sum()))
    return out


def _cdfs_read_in_ms(read_cdfs, scales: np.ndarray):
    """`read_cdfs` (which read values in ms) for prompts whose code values are relative."""
    if read_cdfs is None:
        return None
    return [None if f is None else functools.partial(_cdf_read_in_ms, f, s) for f, s in zip(read_cdfs, scales)]


def _cdf_read_in_ms(read_cdf, scale: float, cdf: np.ndarray, values: np.ndarray) -> np.ndarray:
    return read_cdf(cdf, to_absolute(values, scale))


# ----------------------------------------------------------------- partial addresses


def parse_pattern(text: str) -> tuple[int, list[np.ndarray]]:
    """'8.8.*.*', '2001:db8::*' is not supported; CIDR '8.8.0.0/16' or '2001:db8::/32'.

    Returns (family, allowed byte values per address byte)."""
    text = text.strip()
    if "/" in text:
        try:
            net = ipaddress.ip_network(text, strict=False)
        except ValueError as e:
            raise UsageError(f"bad CIDR {text!r}: {e}") from None
        raw = net.network_address.packed
        allowed = []
        for i, b in enumerate(raw):
            bits = min(8, max(0, net.prefixlen - 8 * i))
            mask = (0xFF << (8 - bits)) & 0xFF
            allowed.append((np.arange(256) & mask) == (b & mask))
        return net.version, allowed
    if text.count(".") == 3 and ":" not in text:
        parts = text.split(".")
        allowed = []
        for p in parts:
            if p == "*":
                allowed.append(np.ones(256, bool))
            elif p.isdigit() and int(p) < 256 and (p == "0" or not p.startswith("0")):
                a = np.zeros(256, bool)
                a[int(p)] = True
                allowed.append(a)
            else:
                raise UsageError(f"bad IPv4 pattern {text!r}: each part is 0-255 or *")
        return 4, allowed
    raw = _parse_full(text)
    return (6 if len(raw) == 16 else 4), [np.arange(256) == b for b in raw]


def parse_pair(src: str | None, dst: str | None) -> tuple[tuple | None, tuple | None]:
    """parse_pattern of each given side; one address family for both."""
    ps, pd = (parse_pattern(v) if v else None for v in (src, dst))
    if ps and pd and ps[0] != pd[0]:
        raise UsageError(f"--src is IPv{ps[0]} but --dst is IPv{pd[0]}: a measurement has one family")
    return ps, pd


def any_address(family: int | None) -> str:
    """The pattern of every address of `family` (IPv4 when unknown): the side of a completion
    the user left out."""
    return "::/0" if family == 6 else "*.*.*.*"


def _parse_full(text: str) -> bytes:
    try:
        return ipaddress.ip_address(text).packed
    except ValueError:
        raise UsageError(f"{text!r} is not an IP address, an IPv4 pattern like 8.8.*.* or a CIDR") from None


def _block(role_v4: int, family: int, allowed: list[np.ndarray]) -> list:
    role = role_v4 if family == 4 else role_v4 + 1
    return [role] + allowed


def complete(
    model, src: str, dst: str, rtt_ms: float | None = None, k: int = 10, beam: int = 64, context: np.ndarray | None = None
) -> list[dict]:
    """Top-k (src, dst) completions with P(missing bytes | fixed parts)."""
    _require_compact(model)
    (fs, asrc), (fd, adst) = parse_pair(src, dst)
    plan: list = [C.MeasurementStart]
    if rtt_ms is not None:  # training shuffles field order, so the result can come first
        code = int(token_codes([rtt_ms])[0])
        plan += [C.RttStart, np.arange(256) == code >> 8, np.arange(256) == code & 0xFF]
    plan += _block(C.SrcIPv4, fs, asrc) + _block(C.DstIPv4, fd, adst)
    ctx = [] if context is None else list(map(int, context))
    beams: list[tuple[list[int], float]] = [(ctx, 0.0)]
    for item in plan:
        if not isinstance(item, np.ndarray):
            beams = [(t + [int(item)], lp) for t, lp in beams]
            continue
        if item.sum() == 1:  # a fixed byte: no choice, no probability mass
            b = int(np.flatnonzero(item)[0])
            beams = [(t + [BYTE0 + b], lp) for t, lp in beams]
            continue
        lps = model.next_log_probs([np.asarray(t, np.int32) for t, _ in beams])[:, BYTE0 : BYTE0 + 256]
        lps = np.where(item, lps, -np.inf)
        lps = lps - np.logaddexp.reduce(lps, axis=1, keepdims=True)  # renormalise over allowed bytes
        cand = np.array([lp for _, lp in beams])[:, None] + lps
        flat = np.argsort(-cand, axis=None)[:beam]
        beams = [(beams[i][0] + [BYTE0 + int(b)], float(cand[i, b])) for i, b in zip(*np.unravel_index(flat, cand.shape))]
    out = []
    for tokens, lp in sorted(beams, key=lambda x: -x[1])[:k]:
        body = tokens[len(ctx):]
        addrs = _addresses(body, fs)
        out.append({"src": addrs[0], "dst": addrs[1], "probability": float(np.exp(lp)), "log_prob": lp})
    return out


def _addresses(tokens: list[int], family: int) -> tuple[str, str]:
    n = 4 if family == 4 else 16
    starts = [i + 1 for i, t in enumerate(tokens) if t in (C.SrcIPv4, C.SrcIPv6, C.DstIPv4, C.DstIPv6)]
    raw = np.zeros((len(starts), 16), np.uint8)
    for r, i in enumerate(starts):
        raw[r, :n] = np.asarray(tokens[i : i + n]) - BYTE0
    src, dst = format_addresses(raw, np.full(len(starts), family == 6)).to_pylist()[:2]
    return src, dst


# ----------------------------------------------------------------- inverse search


def inverse(
    model, src: str, rtt_lo: float, rtt_hi: float, n: int, rng: np.random.Generator, temperature: float = 1.0,
    context: np.ndarray | None = None,
) -> list[dict]:
    """Destinations for `src` at an RTT in [lo, hi]: n samples, deduplicated, ranked by
    the mean log-probability of the destination given source and RTT."""
    _require_compact(model)
    fam, _ = parse_pattern(src)
    src_b = _parse_full(src)
    nb = 4 if fam == 4 else 16
    rtts = rng.uniform(rtt_lo, rtt_hi, n) if rtt_hi > rtt_lo else np.full(n, rtt_lo)
    codes = token_codes(rtts)
    ctx = [] if context is None else list(map(int, context))
    seqs = [
        ctx + [C.MeasurementStart, C.RttStart, BYTE0 + (int(c) >> 8), BYTE0 + (int(c) & 0xFF),
               C.SrcIPv4 if fam == 4 else C.SrcIPv6, *[BYTE0 + b for b in src_b],
               C.DstIPv4 if fam == 4 else C.DstIPv6]
        for c in codes
    ]
    logp = np.zeros(n)
    for _ in range(nb):
        lp = model.next_log_probs([np.asarray(s, np.int32) for s in seqs])[:, BYTE0 : BYTE0 + 256]
        lp = lp - np.logaddexp.reduce(lp, axis=1, keepdims=True)
        p = np.exp(lp / temperature)
        p /= p.sum(axis=1, keepdims=True)
        picks = np.array([rng.choice(256, p=row) for row in p])
        logp += lp[np.arange(n), picks]
        for s, b in zip(seqs, picks):
            s.append(BYTE0 + int(b))
    found: dict[str, list[float]] = {}
    for s, lp in zip(seqs, logp):
        dst = str(ipaddress.ip_address(bytes(t - BYTE0 for t in s[-nb:])))
        found.setdefault(dst, []).append(lp)
    ranked = sorted(found.items(), key=lambda kv: -np.mean(kv[1]))
    return [{"dst": d, "samples": len(v), "probability": float(np.exp(np.mean(v)))} for d, v in ranked]


# ----------------------------------------------------------------- generation


def generate(model, n: int, measurements: int, rng: np.random.Generator, temperature: float = 1.0,
             top_p: float = 1.0, context: np.ndarray | None = None, src: str | None = None,
             timestamps: bool = False, time_range: tuple[int, int] | None = None):
    """n streams of up to `measurements` whole measurements each (Decoded per stream), after
    `context`; `src` makes them streams of that probe (its address in every measurement);
    `timestamps` gives every measurement a time and `time_range` = (lo, hi) Unix seconds keeps
    every generated time inside it (`LoadedModel.sample`)."""
    pinned = None
    if src is not None:
        _require_compact(model)
        pinned = _parse_full(src)
    prefix = np.zeros(0, np.int32) if context is None else np.asarray(context, np.int32)
    seqs = model.sample(prefix, n, max_tokens=model.seq_len, rng=rng, temperature=temperature, top_p=top_p,
                        stop_after_measurements=measurements, src=pinned, timestamps=timestamps,
                        time_range=time_range)
    return [decode(s[len(prefix):], model.scheme) for s in seqs]
