"""The model's side of `pingctl eval`: per-packet predictive distributions and NLL.

For each evaluated test packet the prompt is some of the probe's preceding measurements
(the *context*, chosen by a policy below, at most `context` of them, every one timestamped,
as the loader's *full* mode), then the packet's timestamp, source and destination. A run
trained without timestamps (`loader.mode_weights` all on *none*) gets prompts without any. The
exact RTT-code distribution after that prompt gives the median, the central-interval
quantiles, the PIT value of the actual RTT and the failure probability. Teacher-forced
scoring of prompt + actual result gives NLL per token and bits per measurement.

Context policies:
- `probe`: the probe's preceding measurements in the test split, any destination — as in
  training. On a pair split these are mostly earlier packets of the very pair asked about,
  so `context_median` (the median of those same-pair packets in the prompt) is reported
  beside the model: it is the classical history median with exactly the model's information.
- `cold`: the probe's preceding measurements from the train and test splits *excluding the
  queried (src, dst) pair* — the model must predict a pair it has never seen, from its
  addresses and the probe's RTTs to other destinations.
- `none`: no context; the prompt is the packet alone.
- `both`: a triangulation context, as the loader builds them (`loader.triangulation_share`):
  the probe's last `context` measurements to destinations other than the queried one and
  the queried destination's last `context_dst` measurements from sources other than the
  queried one, all before the packet, merged in time order, drawn from the train split (the
  table the baselines are fitted on, so the model holds no evidence they lack). The pair
  itself is never in it, so it answers held-out pairs, probes and destinations alike.

`per_pair` caps the prompt at the most recent `per_pair` measurements of each (src, dst)
pair (0 = no cap), as `loader.max_per_pair` shapes training contexts (for `both`:
`loader.triangulation_per_pair`); `pingctl eval` takes the run's own setting unless told
otherwise.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import numpy as np

import pingctl
from pingctl.artifacts import export as EX
from pingctl.artifacts.run import COMMITTED, checkpoints_dir
from pingctl.artifacts.table import take
from pingctl.context import pool_and_contexts
from pingctl.histories import History
from pingctl.eval import metrics as M
from pingctl.infer import hints as H
from pingctl.infer import queries as Q
from pingctl.infer.score import prompts, teacher_forced, teacher_forced_kept  # noqa: F401 - one prompt builder for eval and score
from pingctl.tokenizer.spec import get_spec

QS = (0.05, 0.25, 0.75, 0.95)
CHUNK = 64  # packets per model pass of `predict`


def context_median(pool: dict, test: dict, idx: np.ndarray, contexts: list[np.ndarray]) -> dict:
    """The history-median baseline with the model's information: per packet, the median of
    the successful RTTs of the same (src, dst) pair among its context measurements and their
    failure share as P(failure); NaN where the context has none (`used` is False there)."""
    psrc, pdst = np.asarray(pool["src"]), np.asarray(pool["dst"])
    prtt = np.asarray(pool["rtt"], np.float64)
    median = np.full(len(idx), np.nan)
    p_fail = np.full(len(idx), np.nan)
    used = np.zeros(len(idx), bool)
    for k, (i, prev) in enumerate(zip(idx, contexts)):
        same = prev[(psrc[prev] == test["src"][i]) & (pdst[prev] == test["dst"][i])]
        if len(same) == 0:
            continue
        r = prtt[same]
        p_fail[k] = float((r < 0).mean())
        if (r >= 0).any():
            median[k] = float(np.median(r[r >= 0]))
            used[k] = True
    return {"median": median, "p_fail": p_fail, "used": used}


def predict(model, test: dict, idx: np.ndarray, context: int = 16, eps: float = 1e-3, *,
            train: dict | History | None = None, policy: str = "probe", per_pair: int = 0, chunk: int | None = None,
            calibration=None, context_dst: int | None = None, hints=None, resume=None,
            progress=lambda done, total: None) -> dict:
    """Median, quantiles, PIT, P(failure) and the context-median baseline for the packets
    `idx` of `test`; `progress(done, total)` after every `chunk` packets (None: CHUNK). With a
    `calibration` (pingctl/infer/calibration.py) also the same read from the recalibrated
    distributions, under "calibrated" (no extra model passes: only more refined reads).
    `context_dst`: the destination side of the `both` policy (None: `context`). `train`: the
    split contexts are also drawn from, or its `History` (built once for several calls). The
    prompts' context measurements are returned under "contexts" (indices into "pool": for the
    `both` and `pair` policies only the rows some prompt holds, `context.pool_and_contexts`). `hints(pool,
    queries, contexts)`: each packet's RTT estimate (NaN: none), given in its prompt as a hint
    measurement (a run trained with `loader.hints_file`); returned under "hints". `resume`: an
    `artifacts.eval_output.Resume`, which keeps each chunk's model passes and gives back those
    an interrupted eval kept; how many packets it gave is returned under "resumed"."""
    levels = (0.5, *QS)
    reads = levels if calibration is None else (*levels, *calibration.raw_level(np.array(levels)))
    pool, contexts = pool_and_contexts(test, idx, context, policy, per_pair, context_dst, train)
    est = None if hints is None else np.asarray(hints(pool, take(test, idx), contexts), np.float64)
    # a run trained with loader.relative_target answers a hinted prompt relative to its hint
    scales = None if est is None else H.scales(model.run, est)
    ps, fulls = prompts(model, test, idx, pool, contexts, est, scales)
    actual = np.asarray(test["rtt"], np.float64)[idx]
    passes = ModelPasses(model, ps, fulls, actual, reads, eps, scales, chunk or CHUNK)
    resumed = passes.run(progress, None if resume is None else resume.ask(passes.key()))
    dists, scores = passes.dists, passes.scores
    nll = nll_from_scores(fulls, scores, np.asarray(test["ip_version"])[idx])
    n_ctx = np.array([len(c) for c in contexts])
    out = {**_reads(dists, actual), "nll": nll, "context_median": context_median(pool, test, idx, contexts),
           "context_sizes": {"mean": float(n_ctx.mean()) if len(n_ctx) else 0.0,
                             "empty_share": float((n_ctx == 0).mean()) if len(n_ctx) else 0.0},
           "contexts": contexts, "pool": pool, "prompts": ps, "hints": est,
           # the distributions themselves, for the combined answer (eval.combine); callers drop them
           "dists": dists, "resumed": resumed,
           "context_examples": context_examples(pool, test, idx, contexts)}
    if calibration is not None:
        out["calibrated"] = _reads([calibration.apply(d) for d in dists], actual)
    return out


class ModelPasses:
    """The model's part of `predict`: each packet's distribution, exact where `reads` (quantile
    levels) and its actual RTT read it, and the teacher-forced scores of its whole sequence,
    `chunk` packets to a pass. All else `predict` computes without the model, so these are all
    an interrupted eval needs to keep (`run`)."""

    def __init__(self, model, ps, fulls, actual, reads, eps, scales, chunk):
        self.model, self.ps, self.fulls, self.actual, self.scales = model, ps, fulls, actual, scales
        self.reads, self.eps, self.chunk = reads, eps, chunk
        self.dists: list = [None] * len(ps)
        self.scores: list[np.ndarray] = [np.zeros(0)] * len(ps)
        # chunks of similar lengths: a pass pads its sequences to the longest (triangulation
        # prompts run from ~200 to ~480 tokens), and each packet's answer is its own
        self.by_length = np.argsort([len(f) for f in fulls], kind="stable")

    def key(self) -> dict:
        """What the passes depend on: the model as loaded and run, the reads, `eps`, the chunks,
        and the model's inputs themselves (prompts, whole sequences, actual RTTs, hint scales),
        whatever split, packets, policy, hints or seed made them."""
        h = hashlib.sha256()
        for seqs in (self.ps, self.fulls):
            for s in seqs:
                s = np.asarray(s, np.int64)
                h.update(np.int64(len(s)).tobytes() + s.tobytes())
        h.update(self.actual.tobytes())
        h.update(b"" if self.scales is None else b"scales" + np.asarray(self.scales, np.float64).tobytes())
        return {"model": model_key(self.model), "reads": [float(r) for r in self.reads], "eps": float(self.eps),
                "chunk": self.chunk, "packets": len(self.ps), "inputs": h.hexdigest()}

    def run(self, progress, kept=None) -> int:
        """Every chunk: those `kept` (an `eval_output.KeptAsk`) holds read back and shown as done
        at once, the others passed through the model and kept as each finishes. Returns the
        packets read back."""
        n = len(self.ps)
        todo, reused = [], 0
        for a in range(0, n, self.chunk):
            ks = self.by_length[a : a + self.chunk]
            if kept is not None and (got := from_chunk(kept.read(a), ks)) is not None:
                self._place(ks, *got)
                reused += len(ks)
            else:
                todo.append(a)
        done = reused
        progress(done, n)
        for a in todo:
            ks = self.by_length[a : a + self.chunk]
            scores, dists = self._pass(ks)
            self._place(ks, scores, dists)
            if kept is not None:
                kept.keep(a, chunk_arrays(ks, scores, dists))
            done += len(ks)
            progress(done, n)
        return reused

    def _pass(self, ks: np.ndarray) -> tuple[list, list]:
        cp, cf = [self.ps[k] for k in ks], [self.fulls[k] for k in ks]
        # the light engine keeps this pass's caches for the second-byte reads below
        first, known, sc, second = teacher_forced_kept(self.model, cp, cf)
        # exact where read: at the quantiles below and at the actual RTT (for the PIT)
        got = Q.rtt_distributions_at(self.model, cp, quantiles=self.reads, points=self.actual[ks], eps=self.eps,
                                     first=first, known=known, second_bytes=second,
                                     scales=None if self.scales is None else self.scales[ks])
        return list(sc), got

    def _place(self, ks, scores, dists) -> None:
        for k, s, d in zip(ks, scores, dists):
            self.scores[k], self.dists[k] = s, d


def model_key(model) -> dict:
    """The model as its passes ran: run, checkpoints (and when each was written: a run trained
    again in place), engine, device, batch shapes and the libraries, any of which can move the
    last bit of a float."""
    run = Path(model.run).resolve()
    written = [p for p in [checkpoints_dir(run) / str(s) / COMMITTED for s in model.steps] + [run / EX.WEIGHTS]
               if p.is_file()]
    return {"run": str(run), "steps": [int(s) for s in model.steps],
            "written": {str(p.relative_to(run)): [p.stat().st_size, p.stat().st_mtime_ns] for p in written},
            "engine": model.engine, "device": model.device, "batch": model.batch, "seq_len": model.seq_len,
            "stable_shapes": bool(getattr(model, "stable_shapes", False)),
            "kv_cache": os.environ.get("PINGCTL_KV_CACHE", "1"), "versions": _versions()}


def _versions() -> dict[str, str]:
    from importlib import metadata

    out = {"pingctl": pingctl.__version__}
    for name in ("numpy", "jax", "jaxlib"):
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            pass
    return out


def chunk_arrays(ks: np.ndarray, scores: list[np.ndarray], dists: list) -> dict[str, np.ndarray]:
    """A chunk's scores and distributions as arrays that give them back bit for bit
    (`from_chunk`). The codes and values are the code table's but where a hint's scale moved the
    values. The probabilities are kept in code order as runs of equal values: there an
    unrefined first byte's even spread over its 256 codes is one run, and a distribution is
    ~1,500 runs of its 65,536 codes (in value order the first bytes interleave)."""
    codes, values = Q.code_table()[:2]
    out = {"ks": np.asarray(ks, np.int64), "p_fail": np.array([d.p_fail for d in dists], np.float64),
           "scores": np.concatenate(scores), "score_lengths": np.array([len(s) for s in scores], np.int64)}
    probs = np.stack([d.probs for d in dists])
    if all(np.array_equal(d.codes, codes) for d in dists):
        by_code = np.empty_like(probs)
        by_code[:, codes] = probs
        bits = by_code.view(np.int64)  # runs of equal bits: 0.0 and -0.0 are two
        starts = np.ones(by_code.shape, bool)
        starts[:, 1:] = bits[:, 1:] != bits[:, :-1]
        out["run_starts"], out["run_values"] = np.packbits(starts, axis=1), by_code[starts]
    else:
        out["codes"], out["probs"] = np.stack([d.codes for d in dists]), probs
    if not all(np.array_equal(d.values_ms, values) for d in dists):
        out["values_ms"] = np.stack([d.values_ms for d in dists])
    return out


def from_chunk(arrays: dict | None, ks: np.ndarray) -> tuple[list, list] | None:
    """(scores, distributions) of the chunk of packets `ks` from `chunk_arrays` (None: none, or
    kept for other packets). Each array is its own, as the passes gave them: a view into the
    chunk's could differ in alignment, and with it a SIMD sum's last bit."""
    if arrays is None or not np.array_equal(arrays.get("ks"), ks):
        return None
    codes, values = Q.code_table()[:2]
    lengths = arrays["score_lengths"]
    scores = [s.copy() for s in np.split(arrays["scores"], np.cumsum(lengths)[:-1])]
    if "run_starts" in arrays:
        starts = np.unpackbits(arrays["run_starts"], axis=1, count=len(codes)).astype(bool)
        by_code = arrays["run_values"][np.cumsum(starts) - 1].reshape(starts.shape)
        probs, each_codes = by_code[:, codes], None
    else:
        probs, each_codes = arrays["probs"], arrays["codes"]
    each_values = arrays.get("values_ms")
    dists = [Q.RttDistribution(float(arrays["p_fail"][i]), codes if each_codes is None else each_codes[i].copy(),
                               values if each_values is None else each_values[i].copy(), probs[i].copy())
             for i in range(len(ks))]
    return scores, dists


def context_examples(pool: dict, test: dict, idx: np.ndarray, contexts: list[np.ndarray], n: int = 3) -> list[dict]:
    """The first `n` prompts in words, for the report: the query packet and its context
    measurements (src, dst, time, rtt ms) in prompt order."""
    def row(d: dict, i) -> dict:
        return {"src": str(d["src"][i]), "dst": str(d["dst"][i]), "time": int(d["event_time"][i]),
                "rtt": float(d["rtt"][i])}

    return [{"query": row(test, i), "context": [row(pool, j) for j in c]} for i, c in zip(idx[:n], contexts[:n])]


def _reads(dists: list, actual: np.ndarray) -> dict:
    """What the report takes from each packet's distribution: median, the QS quantiles, the
    PIT of the actual RTT (NaN for a failed packet), P(failure) and the CRPS (ms) of the actual
    RTT under the RTT distribution (NaN for a failed packet)."""
    values = dists[0].values_ms if dists else np.zeros(0)
    same = all(d.values_ms is values or np.array_equal(d.values_ms, values) for d in dists)
    crps = (M.crps_distribution(actual, values, [d.probs for d in dists]) if same else
            np.array([M.crps_distribution([a], d.values_ms, [d.probs])[0] for d, a in zip(dists, actual)]))
    return {"median": np.array([d.quantile(0.5) for d in dists]),
            "quantiles": np.array([[d.quantile(q) for q in QS] for d in dists]).reshape(len(dists), len(QS)),
            "pit": np.array([d.cdf(a) if a >= 0 else np.nan for d, a in zip(dists, actual)]),
            "p_fail": np.array([d.p_fail for d in dists]),
            "crps": crps.reshape(len(dists))}


FIELDS = ("time", "src", "dst", "result")  # the query's block order; the names are compact.BLOCKS


def field_bits(f: np.ndarray, s: np.ndarray, start: int) -> dict[str, float]:
    """Bits spent on each block of the measurement starting at `start` of tokens `f`
    (s[t - 1] scores token t). A field that is already known costs ~0 bits: e.g. `src`
    when the model copies the probe's address from its context."""
    spec = get_spec("compact")  # the block tables the decoder and the grammar use
    out = dict.fromkeys(FIELDS, 0.0)
    t = start + 1
    while t < len(f):
        n = 1 + int(spec.role_payload[f[t]])
        out[spec.blocks[spec.role_block[f[t]]]] += float(-s[t - 1 : t - 1 + n].sum() / np.log(2))
        t += n
    return out


def nll_from_scores(fulls: list[np.ndarray], scores: list[np.ndarray], ipv: np.ndarray) -> dict:
    """NLL per token over whole sequences and bits for the query measurement itself (also
    per field), from teacher-forced scores (log P(token t | tokens < t), t >= 1)."""
    tok_nats = np.concatenate(scores)
    # the query measurement starts at its MeasurementStart (the last one in the sequence)
    meas_bits, by_field = [], []
    for f, s in zip(fulls, scores):
        start = int(np.flatnonzero(f == 0)[-1])
        meas_bits.append(-s[start:].sum() / np.log(2))  # predictions of tokens start+1 ..
        by_field.append(field_bits(f, s, start))
    meas_bits = np.array(meas_bits)
    out = {
        "nats_per_token": float(-tok_nats.mean()),
        "bits_per_token": float(-tok_nats.mean() / np.log(2)),
        "bits_per_measurement": float(meas_bits.mean()),
        "tokens": int(len(tok_nats)),
        "measurements": int(len(meas_bits)),
        "bits_per_field": {k: float(np.mean([b[k] for b in by_field])) for k in FIELDS} if by_field else {},
    }
    for fam in (4, 6):
        m = ipv == fam
        if m.any():
            out[f"bits_per_measurement_v{fam}"] = float(meas_bits[m].mean())
    return out
