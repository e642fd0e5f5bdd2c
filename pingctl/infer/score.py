"""Anomaly scores: how surprising each measured result is to a trained model (`pingctl score`).

For every measurement of a canonical table the model is asked what `pingctl eval` asks it
(the same prompts: the packet's timestamp, source and destination after the probe's preceding
measurements, chosen by a context policy of pingctl/context.py), and the observed result is
read off the answer:

- `nll`: the negative log-likelihood, in **nats**, of the observed result: −ln P(failure) for
  a failed packet, −ln(1 − P(failure)) − ln P(RTT code | success) for a successful one. The
  RTT is the 2-byte code of the tokenizer (about 1/2048 relative resolution), so the NLL of an
  RTT is a discrete one, comparable between packets of one pair, not a density. P(failure) is
  renormalised between the two legal result tokens (Failed, RttStart) and the code's bytes over
  the 256 byte tokens, as every distribution pingctl reads.
- `pit`: P(RTT ≤ observed | success), the model's CDF at the observed code; NaN for a failure.
- `tail_p`: the two-sided tail probability, min(1, 2·min(P(RTT ≤ x), P(RTT ≥ x))) given
  success, for a successful packet (the observed code's own mass counts on both sides, so the
  most likely code is never a tail); P(failure) itself for a failed packet. Small = surprising:
  a 5 ms packet where the model expects 40 ms, or a failure where it expects 0.1% of them.
- `p_fail`: the model's P(failure) for the packet.
- `context_measurements`: how many earlier measurements the prompt held.

Reading: the table is validated as every step validates it (pingctl.schema.duck): a row that
`build-rows` would reject is set aside, counted by reason (rows read = scored + rejected),
never scored. The result keeps the valid rows in file order with the canonical columns, then
the score columns; its schema metadata (key `pingctl`, JSON) holds the counts, the run and the
prompt settings (`score_meta`).

Context policies (pingctl/context.py): `probe` (default) the probe's preceding measurements in
the scored table itself, any destination, as in training; `cold` the same without the queried
(src, dst) pair's own; `none` no context; `both` a triangulation context from the table (the
probe's rows to other destinations and the destination's from other sources, `context` a side). Only the table is searched for context: score a
pair's history with it, or its first packets are scored with little context.
"""

from __future__ import annotations

import json
import math
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from pingctl.artifacts.run import run_config
from pingctl.artifacts.table import resolve_inputs
from pingctl.context import check_policy, context_indices, context_pool, dict_encode
from pingctl.errors import PingctlError, UsageError
from pingctl.infer import queries as Q
from pingctl.schema.columns import COLUMNS
from pingctl.schema.duck import canonical_head, rejected_lines
from pingctl.tokenizer import C, Measurements, encode
from pingctl.tokenizer.measurements import event_seconds
from pingctl.tokenizer.rtt_codec import decode_rtt, encode_rtt

# ----------------------------------------------------------------- defaults and bounds
#
# Each scored row is one prompt through the model (a teacher-forced pass plus a few
# second-byte passes where its RTT is read) and a row of per-packet arrays: 1,000,000 rows are
# hours on a GPU and more on a 2-core CPU, as eval's --queries bound. A table larger than that
# is scored in parts (`limit` takes its first rows). The context bound is eval's: a prompt
# holds at most seq_len tokens and a measurement takes >= 12 of them.
MAX_ROWS = 1_000_000
MAX_CONTEXT = 10_000
CONTEXT = 16
SCORE_COLUMNS = ("nll", "pit", "tail_p", "p_fail", "context_measurements")
_TINY = np.finfo(np.float64).tiny  # a probability that underflowed: a finite, huge NLL


def check_options(context: int = CONTEXT, context_policy: str = "probe", limit: int | None = None) -> None:
    """The bounds of every size `score_table` takes (a `UsageError` naming the option)."""
    check_policy(context_policy)
    if not isinstance(context, int) or not 0 <= context <= MAX_CONTEXT:
        raise UsageError(f"context {context!r}: expected 0 to {MAX_CONTEXT:,} measurements (--context)")
    if limit is not None and (not isinstance(limit, int) or not 1 <= limit <= MAX_ROWS):
        raise UsageError(f"limit {limit!r}: expected 1 to {MAX_ROWS:,} rows (--limit)")


# ----------------------------------------------------------------- prompts (shared with eval)


def prompts(model, test: dict, idx: np.ndarray, pool: dict, contexts: list[np.ndarray]
            ) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """(prompt tokens, full tokens with the actual result) per query packet; timestamped as
    the run was trained (`model.timestamps`)."""
    timed = model.timestamps
    t = np.asarray(test["event_time"], np.int64)
    prompts_, fulls = [], []
    budget = model.seq_len - 64
    for i, prev in zip(idx, contexts):
        ctx = measurements(pool, prev) if len(prev) else None
        ctx_tok, last_t = Q.context_tokens(model, ctx, budget, timed=timed)
        src, dst = str(test["src"][i]), str(test["dst"][i])
        prompt = Q.query_prefix(src, dst, int(t[i]) if timed else None, ctx_tok, last_t)
        q = measurements(test, np.array([i]), timed)
        ref = Measurements.concat([measurements(pool, prev[-1:]), q]) if last_t is not None else q
        enc = encode(ref, "compact", order=("time", "src", "dst", "result"))
        tail = enc.measurement(len(ref) - 1)
        fulls.append(np.concatenate([ctx_tok, tail]).astype(np.int32))
        prompts_.append(prompt)
    return prompts_, fulls


def measurements(d: dict, idx: np.ndarray, timed: bool = True) -> Measurements:
    """Rows `idx` of a dict of arrays (src, dst, rtt, event_time) as `Measurements`."""
    return Measurements.from_fields(
        [str(x) for x in d["src"][idx]], [str(x) for x in d["dst"][idx]], np.asarray(d["rtt"])[idx],
        [int(x) for x in np.asarray(d["event_time"])[idx]] if timed else None,
    )


def teacher_forced(model, prompts_: list[np.ndarray], fulls: list[np.ndarray]):
    """One pass over prompt + actual result per packet gives its NLL scores and, for
    successful packets, what the distribution needs: P(failure) where the result starts,
    P(first byte) after RttStart and P(second byte | the actual first byte). Failed packets
    (and any prompt that is not a prefix of its full sequence) get a separate first pass.
    Returns ((p_fail, p1), known second-byte rows, scores)."""
    lps = model.log_probs(fulls)
    scores = [lp[np.arange(len(f) - 1), f[1:]] for lp, f in zip(lps, fulls)]
    n = len(prompts_)
    p_fail, p1 = np.zeros(n), np.zeros((n, 256))
    known, missing = {}, []
    for k, (p, f, lp) in enumerate(zip(prompts_, fulls, lps)):
        m = len(p)
        if len(f) >= m + 3 and np.array_equal(f[:m], p) and f[m] == C.RttStart:
            p_fail[k] = Q.fail_probability(lp[m - 1])
            p1[k] = Q.bytes_distribution(lp[m])
            known[(k, int(f[m + 1]) - Q.BYTE0)] = Q.bytes_distribution(lp[m + 1])
        else:
            missing.append(k)
    if missing:
        pf, pb = Q.first_pass(model, [prompts_[k] for k in missing])
        p_fail[missing], p1[missing] = pf, pb
    return (p_fail, p1), known, scores


# ----------------------------------------------------------------- reading the table


@dataclass
class ScoreInput:
    """The valid rows of a table to score (canonical Arrow columns, file order) and what became
    of the rest: rows read = len(table) + rows rejected."""

    table: object  # pyarrow.Table
    rows_read: int
    rejected: dict = field(default_factory=dict)  # reason -> {rows, meaning, first: {file, row}}
    source: str = ""

    @property
    def rows_rejected(self) -> int:
        return sum(e["rows"] for e in self.rejected.values())

    def counts(self) -> dict:
        return {"rows_read": self.rows_read, "rows_scored": self.table.num_rows,
                "rows_rejected": self.rows_rejected, "rejected": self.rejected}


def read_input(table, limit: int | None = None) -> ScoreInput:
    """A canonical table (a Parquet file, a directory or glob of them, or an Arrow table), its
    first `limit` rows (None: all, refused beyond MAX_ROWS), checked as `build-rows` checks
    rows. No valid row at all is an error (`PingctlError`) naming each reason."""
    import pyarrow as pa

    check_options(limit=limit)
    if isinstance(table, pa.RecordBatch):
        table = pa.Table.from_batches([table])
    if isinstance(table, pa.Table):
        _check_size(table.num_rows, limit, "the table")
        with tempfile.TemporaryDirectory(prefix="pingctl-score-") as d:
            import pyarrow.parquet as pq

            f = Path(d) / "table.parquet"
            try:
                pq.write_table(table, f)
            except (pa.ArrowException, TypeError, ValueError) as e:
                raise PingctlError(f"the table cannot be written as Parquet ({e})") from None
            got = _checked(["the table"], [f], limit)
        for e in got.rejected.values():
            e["first"]["file"] = "<table>"
        return got
    if not isinstance(table, (str, Path)):
        raise UsageError(f"table: expected a path or a pyarrow.Table, got {type(table).__name__}")
    files = resolve_inputs([table])
    _check_size(_parquet_rows(files), limit, str(table))
    return _checked([str(table)], files, limit)


def _parquet_rows(files: list[Path]) -> int:
    import pyarrow.parquet as pq

    n = 0
    for f in files:
        try:
            n += pq.ParquetFile(f).metadata.num_rows
        except Exception as e:  # noqa: BLE001 - pyarrow raises OSError/ArrowInvalid/... for damaged files
            raise PingctlError(f"{f}: not a readable Parquet file ({e})") from None
    return n


def _check_size(rows: int, limit: int | None, what: str) -> None:
    if limit is None and rows > MAX_ROWS:
        raise UsageError(f"{what} has {rows:,} rows, beyond the bound of {MAX_ROWS:,} one score takes: "
                         "score it in parts (limit / --limit takes the first rows)")


def _checked(label: list[str], files: list[Path], limit: int | None) -> ScoreInput:
    valid, rejected, read = canonical_head(files, limit)
    what = ", ".join(label)
    if not read:
        raise PingctlError(f"{what}: the input has no rows")
    if not valid.num_rows:
        first = "" if limit is None else "the first "
        raise PingctlError(f"{what}: no valid rows among {first}{read:,}\n" + "\n".join(rejected_lines(rejected)))
    return ScoreInput(valid, read, rejected, what)


def _arrays(table) -> dict[str, np.ndarray]:
    """The dict of arrays the prompt builders read (as `pingctl.eval.report.load_split`)."""
    import pyarrow.compute as pc

    def strings(col) -> np.ndarray:
        enc = dict_encode(col)
        uniq = np.array(enc.dictionary.to_pylist(), dtype=object)
        return uniq[enc.indices.to_numpy(zero_copy_only=False).astype(np.int64)]

    return {"src": strings(table.column("src_addr")), "dst": strings(table.column("dst_addr")),
            "ip_version": table.column("ip_version").to_numpy().astype(np.int64),
            "rtt": table.column("rtt").to_numpy().astype(np.float64),
            "event_time": event_seconds(table.column("event_time").combine_chunks())[0],
            "prb_id": pc.fill_null(table.column("prb_id"), -1).to_numpy().astype(np.int64)}


# ----------------------------------------------------------------- scoring


def score_table(model, table, *, context: int = CONTEXT, context_policy: str = "probe", limit: int | None = None,
                per_pair: int | None = None, progress=None):
    """Anomaly scores of every measurement of a canonical table under a trained model.

    model: a `pingctl.infer.model.LoadedModel` (compact scheme).
    table: a canonical Parquet file, a directory or glob of them, or a `pyarrow.Table` with
      the canonical columns; rows `build-rows` would reject are set aside, counted by reason.
    context: at most this many of the probe's preceding measurements per prompt (0..10,000).
    context_policy: "probe" | "cold" | "none" (module docstring).
    limit: score only the first `limit` rows (1..1,000,000); None: all, refused beyond that.
    per_pair: at most this many measurements of one (src, dst) pair in a prompt (None: as the
      run was trained, its loader.max_per_pair; 0 = no cap).
    progress: optional `progress(done, total)`, called per chunk of rows.

    Returns a `pyarrow.Table`: the valid rows' canonical columns in file order, then nll (nats),
    pit, tail_p, p_fail and context_measurements (module docstring). Its schema metadata key
    `pingctl` holds the counts (rows_read = rows_scored + rows_rejected, and rejected by reason)
    and the settings; `score_meta(result)` reads it. Raises `UsageError` for an option out of
    bounds, `PingctlError` for an unreadable table or one without a valid row."""
    check_options(context, context_policy, limit)
    got = read_input(table, limit)
    return score_rows(model, got, context=context, context_policy=context_policy, per_pair=per_pair,
                      progress=progress)


def score_rows(model, got: ScoreInput, *, context: int = CONTEXT, context_policy: str = "probe",
               per_pair: int | None = None, chunk: int = 64, progress=None):
    """`score_table` on rows already read (`read_input`): a command reads and checks the table
    before the model loads, then scores."""
    import pyarrow as pa

    check_options(context, context_policy)
    if per_pair is not None and per_pair < 0:
        raise UsageError(f"per_pair must be >= 0 (0 = no cap), got {per_pair}")
    if model.scheme != "compact":
        raise PingctlError(f"scoring needs a model trained with the compact scheme (this one: {model.scheme})")
    progress = progress or (lambda done, total: None)
    rows = _arrays(got.table)
    if per_pair is None:  # as the run's training contexts were shaped
        per_pair = (run_config(model.run).loader.triangulation_per_pair if context_policy == "both"
                    else model.max_per_pair)
    cols = _score(model, rows, context, context_policy, per_pair, chunk, progress)
    out = got.table.select(list(COLUMNS))
    for name in SCORE_COLUMNS:
        out = out.append_column(name, pa.array(cols[name]))
    meta = {"kind": "scores", "run": str(model.run), "steps": list(model.steps or (model.step,)),
            "context_policy": context_policy, "context": context, "context_per_pair": per_pair,
            "timestamps": model.timestamps, "nll_unit": "nats", "source": got.source, **got.counts()}
    return out.replace_schema_metadata({"pingctl": json.dumps(meta)})


def score_meta(table) -> dict:
    """The counts and settings `score_table` put in a result's schema metadata ({} if none)."""
    raw = (table.schema.metadata or {}).get(b"pingctl")
    try:
        meta = json.loads(raw) if raw else {}
    except ValueError:
        return {}
    return meta if isinstance(meta, dict) else {}


def _score(model, rows: dict, context: int, policy: str, per_pair: int, chunk: int, progress) -> dict:
    n = len(rows["rtt"])
    idx = np.arange(n)
    pool = context_pool(rows, None, policy)
    ctxs = context_indices(pool, rows, idx, context, policy, per_pair)
    ps, fulls = prompts(model, rows, idx, pool, ctxs)
    actual = rows["rtt"]
    out = {"nll": np.zeros(n), "pit": np.full(n, np.nan), "tail_p": np.zeros(n), "p_fail": np.zeros(n),
           "context_measurements": np.array([len(c) for c in ctxs], np.int64)}
    progress(0, n)
    for a in range(0, n, chunk):
        b = min(a + chunk, n)
        first, known, _ = teacher_forced(model, ps[a:b], fulls[a:b])
        dists = Q.rtt_distributions_at(model, ps[a:b], quantiles=(), points=actual[a:b], first=first, known=known)
        p_fail, p1 = first
        codes = encode_rtt(np.maximum(actual[a:b], 0.0)).astype(np.int64)
        need = [k for k in range(b - a) if actual[a + k] >= 0 and (k, int(codes[k] >> 8)) not in known]
        if need:  # a prompt that was not a prefix of its full sequence: P(second byte) asked apart
            rows2 = model.second_byte_log_probs(
                [np.concatenate([ps[a + k], [C.RttStart]]).astype(np.int32) for k in need],
                [np.array([int(codes[k] >> 8)]) for k in need])
            known.update({(k, int(codes[k] >> 8)): Q.bytes_distribution(r[0]) for k, r in zip(need, rows2)})
        for k, d in enumerate(dists):
            i = a + k
            pf = float(p_fail[k])
            out["p_fail"][i] = pf
            if actual[i] < 0:
                out["nll"][i] = -math.log(max(pf, _TINY))
                out["tail_p"][i] = pf
                continue
            c = int(codes[k])
            p_code = p1[k, c >> 8] * known[(k, c >> 8)][c & 0xFF]
            out["nll"][i] = -math.log(max(1.0 - pf, _TINY)) - math.log(max(float(p_code), _TINY))
            x = float(decode_rtt(c))
            below = float(d.probs[d.values_ms < x].sum())
            at = float(d.probs[d.values_ms == x].sum())
            out["pit"][i] = min(below + at, 1.0)
            out["tail_p"][i] = min(1.0, 2.0 * min(below + at, 1.0 - below))
        progress(b, n)
    return out


def summary(scored, threshold: float | None = None, top: int = 10) -> dict:
    """What `pingctl score` prints of a score table: packets, failures, the NLL's mean and
    median, how many rows fall below tail probabilities 0.01 and 0.001, and with a `threshold`
    the rows flagged below it and the `top` most surprising of them (lowest tail_p, then highest
    NLL), each with its pair, time (Unix seconds), RTT and scores."""
    import pyarrow.compute as pc

    nll = scored.column("nll").to_numpy()
    tail = scored.column("tail_p").to_numpy()
    n = len(nll)
    out = {"failed": int((scored.column("rtt").to_numpy() < 0).sum()),
           "context_measurements_mean": float(scored.column("context_measurements").to_numpy().mean()) if n else 0.0,
           "nll_mean": float(nll.mean()) if n else None, "nll_median": float(np.median(nll)) if n else None,
           "below_0.01": int((tail < 0.01).sum()), "below_0.001": int((tail < 0.001).sum()),
           "threshold": threshold}
    if threshold is None:
        return out
    flagged = np.flatnonzero(tail < threshold)
    order = flagged[np.lexsort((-nll[flagged], tail[flagged]))][:top]
    rows = scored.take(order).select(["event_time", "src_addr", "dst_addr", "rtt", "p_fail", "pit", "tail_p", "nll"])
    times = event_seconds(pc.fill_null(rows.column("event_time"), 0).combine_chunks())[0]
    listed = rows.drop_columns(["event_time"]).to_pylist()
    for r, t in zip(listed, times):
        r["time"] = int(t)
        if r["pit"] is not None and not math.isfinite(r["pit"]):
            r["pit"] = None
    return out | {"flagged": int(len(flagged)), "top": listed}
