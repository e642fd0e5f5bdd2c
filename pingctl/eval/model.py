"""The model's side of `pingctl eval`: per-packet predictive distributions and NLL.

For each evaluated test packet the prompt is the probe's preceding measurements in the
test split (up to `context` of them, every one timestamped, as the loader's *full* mode),
then the packet's timestamp, source and destination. The exact RTT-code distribution
after that prompt gives the median, the central-interval quantiles, the PIT value of the
actual RTT and the failure probability. Teacher-forced scoring of prompt + actual result
gives NLL per token and bits per measurement.
"""

from __future__ import annotations

import numpy as np

from pingctl.infer import queries as Q
from pingctl.tokenizer import Measurements, encode

QS = (0.05, 0.25, 0.75, 0.95)


def _probe_keys(d: dict) -> np.ndarray:
    prb = np.asarray(d["prb_id"])
    return np.where(prb >= 0, prb.astype(str), np.asarray(d["src"]).astype(str))


def prompts(model, test: dict, idx: np.ndarray, context: int) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """(prompt tokens, full tokens with the actual result) per query packet."""
    keys = _probe_keys(test)
    t = np.asarray(test["event_time"], np.int64)
    order = np.lexsort((t, keys))
    sk, st = keys[order], t[order]
    prompts_, fulls = [], []
    budget = model.seq_len - 64
    for i in idx:
        lo = np.searchsorted(sk, keys[i], side="left")
        hi = lo + np.searchsorted(st[lo : np.searchsorted(sk, keys[i], side="right")], t[i], side="left")
        prev = order[max(lo, hi - context) : hi]
        ctx = _measurements(test, prev) if len(prev) else None
        ctx_tok, last_t = Q.context_tokens(model, ctx, budget)
        src, dst = str(test["src"][i]), str(test["dst"][i])
        prompt = Q.query_prefix(src, dst, int(t[i]), ctx_tok, last_t)
        q = _measurements(test, np.array([i]))
        ref = Measurements.concat([_measurements(test, prev[-1:]), q]) if last_t is not None else q
        enc = encode(ref, "compact", order=("time", "src", "dst", "result"))
        tail = enc.measurement(len(ref) - 1)
        fulls.append(np.concatenate([ctx_tok, tail]).astype(np.int32))
        prompts_.append(prompt)
    return prompts_, fulls


def _measurements(d: dict, idx: np.ndarray) -> Measurements:
    return Measurements.from_fields(
        [str(x) for x in d["src"][idx]], [str(x) for x in d["dst"][idx]], np.asarray(d["rtt"])[idx],
        [int(x) for x in np.asarray(d["event_time"])[idx]],
    )


def predict(model, test: dict, idx: np.ndarray, context: int = 16, prune: float = 1e-6) -> dict:
    """Median, quantiles, PIT and P(failure) for the packets `idx` of `test`."""
    ps, fulls = prompts(model, test, idx, context)
    dists = Q.rtt_distributions(model, ps, prune=prune)
    actual = np.asarray(test["rtt"], np.float64)[idx]
    median = np.array([d.quantile(0.5) for d in dists])
    quantiles = np.array([[d.quantile(q) for q in QS] for d in dists])
    pit = np.array([d.cdf(a) if a >= 0 else np.nan for d, a in zip(dists, actual)])
    p_fail = np.array([d.p_fail for d in dists])
    nll = nll_of(model, fulls, [len(p) for p in ps], np.asarray(test["ip_version"])[idx])
    return {"median": median, "quantiles": quantiles, "pit": pit, "p_fail": p_fail, "nll": nll}


def nll_of(model, fulls: list[np.ndarray], prompt_lens: list[int], ipv: np.ndarray) -> dict:
    """NLL per token over whole sequences, and bits for the query measurement itself."""
    scores = model.score(fulls)
    tok_nats = np.concatenate(scores)
    # the query measurement starts at its MeasurementStart (the last one in the sequence)
    meas_bits = []
    for f, s in zip(fulls, scores):
        start = int(np.flatnonzero(f == 0)[-1])
        meas_bits.append(-s[start:].sum() / np.log(2))  # predictions of tokens start+1 ..
    meas_bits = np.array(meas_bits)
    out = {
        "nats_per_token": float(-tok_nats.mean()),
        "bits_per_token": float(-tok_nats.mean() / np.log(2)),
        "bits_per_measurement": float(meas_bits.mean()),
        "tokens": int(len(tok_nats)),
        "measurements": int(len(meas_bits)),
    }
    for fam in (4, 6):
        m = ipv == fam
        if m.any():
            out[f"bits_per_measurement_v{fam}"] = float(meas_bits[m].mean())
    return out
