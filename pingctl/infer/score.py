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

Stream (`context_policy="stream"`, score only): a prompt per row costs a forward pass over its
whole context, ~200 tokens for one row. Instead each probe's rows (by prb_id, else source
address; in time order, file order among equal times) are encoded as one token stream, every
block in the query's order (time, source, destination, result), and cut into windows of the
model's context; one teacher-forced pass over a window reads each of its rows' results (the
result block closes a measurement, so its P(failure), P(first byte) and P(second byte) sit at
known positions) with the rows before it in the window as its context. Windows overlap: after
the first, a window opens with up to `context` rows already scored (in at most half its
tokens), so every row is scored once, after between that many and a window's worth of rows.
The reads are the other policies' (the same PIT/tail refinement), the context is what differs:
not capped per pair, the probe's previous rows whatever their time (equal times included), and
`context_measurements` says how many. 7-9x the rows/s of `probe` (docs/benchmarks.md).
"""

from __future__ import annotations

import functools
import itertools
import json
import math
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from pingctl.artifacts.table import resolve_inputs
from pingctl.context import context_indices, context_pool
from pingctl.errors import PingctlError, UsageError
from pingctl.infer import queries as Q
from pingctl.infer import score_answer as SA
from pingctl.prompt import SCORE_POLICIES, Policy, PromptSpec, parse_policy
from pingctl.schema.arrow_strings import codes_in, dict_encode, vocabulary
from pingctl.schema.columns import COLUMNS
from pingctl.schema.duck import canonical_head, rejected_lines
from pingctl.tokenizer import C, Measurements, encode
from pingctl.tokenizer.compact import result_lengths
from pingctl.tokenizer.measurements import event_seconds
from pingctl.tokenizer.relative import to_relative
from pingctl.tokenizer.rtt_codec import decode_rtt, possible_first_bytes, token_codes

# ----------------------------------------------------------------- defaults and bounds
#
# Each scored row is one prompt through the model (a teacher-forced pass plus a few
# second-byte passes where its RTT is read) and a row of per-packet arrays: 1,000,000 rows are
# hours on a GPU and more on a 2-core CPU, as eval's --queries bound. A table larger than that
# is scored into a directory, a bucket of probes at a time (`score_parts`), or `limit` takes
# its first rows. The context bound is eval's: a prompt
# holds at most seq_len tokens and a measurement takes >= 12 of them.
MAX_ROWS = 1_000_000
MAX_CONTEXT = 10_000
CONTEXT = 16
SCORE_COLUMNS = ("nll", "pit", "tail_p", "p_fail", "context_measurements")
# `stream`: each probe's history as one teacher-forced token stream (module docstring, "Stream")
STREAM = Policy.STREAM
ORDER = ("time", "src", "dst", "result")  # a query's block order, and a stream's
EPS = 1e-3  # as `rtt_distributions_at`: unrefined first bytes may hold this much mass at a read
_TINY = np.finfo(np.float64).tiny  # a probability that underflowed: a finite, huge NLL


def check_options(context: int = CONTEXT, context_policy: str = "probe", limit: int | None = None) -> None:
    """The bounds of every size `score_table` takes (a `UsageError` naming the option)."""
    parse_policy(context_policy, SCORE_POLICIES)
    if not isinstance(context, int) or not 0 <= context <= MAX_CONTEXT:
        raise UsageError(f"context {context!r}: expected 0 to {MAX_CONTEXT:,} measurements (--context)")
    if limit is not None and (not isinstance(limit, int) or not 1 <= limit <= MAX_ROWS):
        raise UsageError(f"limit {limit!r}: expected 1 to {MAX_ROWS:,} rows (--limit)")


# ----------------------------------------------------------------- prompts (shared with eval)


def prompts(model, test: dict, idx: np.ndarray, pool: dict, contexts: list[np.ndarray],
            hints: np.ndarray | None = None, scales: np.ndarray | None = None
            ) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """(prompt tokens, full tokens with the actual result) per query packet; timestamped as
    the run was trained (`model.timestamps`). `hints`: per packet an RTT estimate (ms; NaN:
    none) given as a measurement of its pair without a timestamp just before it, as
    `loader.hints_file` trains them. `scales`: per packet the scale its answer is relative to
    (`infer.hints.scales`): its full sequence holds the actual RTT in those units, as the loader
    encodes a hinted query (`loader.relative_target`)."""
    timed = model.timestamps
    t = np.asarray(test["event_time"], np.int64)
    prompts_, fulls = [], []
    budget = model.seq_len - 64
    # every address parsed once: the pool rows any prompt holds, and the query packets
    used = np.unique(np.concatenate([np.asarray(c, np.int64) for c in contexts] + [np.zeros(0, np.int64)]))
    held = measurements(pool, used)
    queries = measurements(test, np.asarray(idx), timed)
    if scales is not None:
        queries.rtt_ms[:] = to_relative(queries.rtt_ms, scales)
    for k, (i, prev) in enumerate(zip(idx, contexts)):
        at = np.searchsorted(used, prev)
        ctx = held.take(at) if len(prev) else None
        hint = (Q.hint_tokens(str(test["src"][i]), str(test["dst"][i]), hints[k])
                if hints is not None and np.isfinite(hints[k]) else None)
        ctx_tok, last_t = Q.context_tokens(model, ctx, budget, timed=timed, hint=hint)
        q = queries.take(np.array([k]))
        ref = Measurements.concat([held.take(at[-1:]), q]) if last_t is not None else q
        enc = encode(ref, "compact", order=ORDER)
        full = np.concatenate([ctx_tok, enc.measurement(len(ref) - 1)]).astype(np.int32)
        if last_t is None or held.time_s[at[-1]] == last_t:
            # the prompt is the packet without its result block, which closes a measurement
            prompt = full[: len(full) - int(result_lengths(q)[0])]
        else:  # its timestamp a delta from the context's last time, not from the last row's
            prompt = Q.query_prefix(str(test["src"][i]), str(test["dst"][i]), int(t[i]) if timed else None,
                                    ctx_tok, last_t)
        fulls.append(full)
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
    return _teacher_forced(model, prompts_, fulls, model.log_probs(fulls))


def teacher_forced_kept(model, prompts_: list[np.ndarray], fulls: list[np.ndarray]):
    """`teacher_forced` plus the second-byte reads of the prompts (`second_bytes` of
    `queries.rtt_distributions_at`), which the light engine serves from the caches of this
    same pass (`LoadedModel.teacher_forced_session`); None where the model keeps none."""
    session = getattr(model, "teacher_forced_session", None)
    if session is None:
        return (*teacher_forced(model, prompts_, fulls), None)
    firsts = [np.concatenate([p, [C.RttStart]]).astype(np.int32) for p in prompts_]
    lps, second_bytes = session(firsts, fulls)
    return (*_teacher_forced(model, prompts_, fulls, lps), second_bytes)


def _teacher_forced(model, prompts_, fulls, lps):
    scores = [lp[np.arange(len(f) - 1), f[1:]] for lp, f in zip(lps, fulls)]
    n = len(prompts_)
    p_fail, p1 = np.zeros(n), np.zeros((n, 256))
    known, missing = {}, []
    for k, (p, f, lp) in enumerate(zip(prompts_, fulls, lps)):
        m = len(p)
        if len(f) >= m + 3 and np.array_equal(f[:m], p) and f[m] == C.RttStart:
            p_fail[k] = Q.fail_probability(lp[m - 1])
            p1[k] = Q.first_byte_distribution(lp[m])
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
    _check_size(parquet_rows(files), limit, str(table))
    return _checked([str(table)], files, limit)


def parquet_rows(files: list[Path]) -> int:
    """The rows of Parquet files by their footers (no data read); a damaged file is named."""
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
        raise UsageError(f"{what} has {rows:,} rows, beyond the bound of {MAX_ROWS:,} one table of scores holds: "
                         "give -o a directory (no .parquet/.csv/.json suffix; `Model.score_to` in Python) to score "
                         "it in buckets of probes, whatever its size (docs/score.md, \"A table of any size\"), or "
                         "take its first rows (--limit / limit)")


def _checked(label: list[str], files: list[Path], limit: int | None) -> ScoreInput:
    valid, rejected, read = canonical_head(files, limit)
    what = ", ".join(label)
    check_some_valid(what, read, valid.num_rows, rejected, limit)
    return ScoreInput(valid, read, rejected, what)


def check_some_valid(what: str, read: int, valid: int, rejected: dict, limit: int | None) -> None:
    """No row, or no valid row, to score is an error (`PingctlError`) naming each reason."""
    if not read:
        raise PingctlError(f"{what}: the input has no rows")
    if not valid:
        first = "" if limit is None else "the first "
        raise PingctlError(f"{what}: no valid rows among {first}{read:,}\n" + "\n".join(rejected_lines(rejected)))


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
               per_pair: int | None = None, chunk: int = 64, progress=None, predictor=None):
    """`score_table` on rows already read (`read_input`): a command reads and checks the table
    before the model loads, then scores. `predictor` (`predictor.Predictor`): each row scored
    under the answer to its question (`score_answer`), its columns answered_by and regime
    saying which; None: the model's."""
    import pyarrow as pa

    check_options(context, context_policy)
    if per_pair is not None and per_pair < 0:
        raise UsageError(f"per_pair must be >= 0 (0 = no cap), got {per_pair}")
    if model.scheme != "compact":
        raise PingctlError(f"scoring needs a model trained with the compact scheme (this one: {model.scheme})")
    progress = progress or (lambda done, total: None)
    # a row's scores must not depend on the rows it is batched with: the same in a bucket of
    # probes (`score_parts`) as in the whole table
    model = model.shape_stable() if hasattr(model, "shape_stable") else model
    rows = _arrays(got.table)
    spec = PromptSpec.for_model(model.run, policy=context_policy, context=context, per_pair=per_pair,
                               hints=False, allowed=SCORE_POLICIES)
    if spec.streamed:
        cols = _score_stream(model, rows, context, progress)
    else:
        cols = _score(model, rows, context, spec.policy, spec.cap, chunk, progress)
    answered = None if predictor is None else SA.answer_rows(cols, rows, predictor, spec.policy, context, spec.cap)
    out = got.table.select(list(COLUMNS))
    for name in SCORE_COLUMNS:
        out = out.append_column(name, pa.array(cols[name]))
    if answered is not None:
        out = out.append_column("answered_by", pa.array(answered["answered_by"], pa.string()))
        out = out.append_column("regime", pa.array(answered["regime"], pa.string()))
    meta = {"kind": "scores", "run": str(model.run), "steps": list(model.steps or (model.step,)),
            "context_policy": str(spec.policy), "context": context, "context_per_pair": spec.cap,
            "timestamps": model.timestamps, "nll_unit": "nats", "source": got.source, **got.counts()}
    if answered is not None:
        meta.update(combination=predictor.path, answered_why=answered["why"])
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
    progress(0, n)
    pool = context_pool(rows, None, policy)
    ctxs = context_indices(pool, rows, idx, context, policy, per_pair)
    actual = rows["rtt"]
    out = {"nll": np.zeros(n), "pit": np.full(n, np.nan), "tail_p": np.zeros(n), "p_fail": np.zeros(n),
           "context_measurements": np.array([len(c) for c in ctxs], np.int64)}
    for a in range(0, n, chunk):
        b = min(a + chunk, n)
        # prompts built chunk by chunk: the first rows are scored (and the progress moves) at once
        ps, fulls = prompts(model, rows, idx[a:b], pool, ctxs[a:b])
        first, known, _ = teacher_forced(model, ps, fulls)
        codes = token_codes(np.maximum(actual[a:b], 0.0)).astype(np.int64)
        need = [k for k in range(b - a) if actual[a + k] >= 0 and (k, int(codes[k] >> 8)) not in known]
        if need:  # a prompt that was not a prefix of its full sequence: P(second byte) asked apart
            rows2 = model.second_byte_log_probs(
                [np.concatenate([ps[k], [C.RttStart]]).astype(np.int32) for k in need],
                [np.array([int(codes[k] >> 8)]) for k in need])
            known.update({(k, int(codes[k] >> 8)): Q.bytes_distribution(r[0]) for k, r in zip(need, rows2)})
        p_fail, p1 = first
        p1 = possible_first_bytes(p1)
        ok = actual[a:b] >= 0
        p2 = np.zeros((b - a, 256))
        for k in np.flatnonzero(ok):
            p2[k] = known[(k, int(codes[k] >> 8))]
        extra = {(k, fb): row for (k, fb), row in known.items() if not (ok[k] and fb == codes[k] >> 8)}
        _read(out, slice(a, b), ok, p_fail, p1, p2, codes, extra, model, ps)
        progress(b, n)
    return out


# ----------------------------------------------------------------- reading a packet's result


@functools.cache
def _values() -> np.ndarray:
    """[256, 256]: the RTT (ms) of code (first byte, second byte)."""
    return decode_rtt(np.arange(65536, dtype=np.uint16)).reshape(256, 256)


def _read(out: dict, rows: slice, ok: np.ndarray, p_fail: np.ndarray, p1: np.ndarray, p2: np.ndarray,
          codes: np.ndarray, extra: dict, model, prefixes: list[np.ndarray]) -> None:
    """The scores of a chunk of packets from P(failure), P(first byte) and P(second byte | the
    observed first byte); `extra`: {(packet, first byte): P(second byte)} rows known already.

    The PIT and tail read the distribution at the observed value x as `rtt_distributions_at`
    does (exact there): every first byte whose codes straddle x, other than the observed one,
    is refined (its P(second byte) asked, one pass over the packet's prompt + RttStart), most
    probable first, until the unrefined ones hold at most EPS; an unrefined first byte keeps its
    mass spread evenly over its 256 codes."""
    values = _values()
    _, _, lo, hi = Q.code_table()
    n = len(ok)
    first = codes >> 8
    x = values.reshape(-1)[codes]
    # packet k's refined rows: the observed first byte, then what `extra` and the passes add
    refined = {(k, int(first[k])): p2[k] for k in np.flatnonzero(ok)}
    refined.update({key: row for key, row in extra.items() if key[0] < n and ok[key[0]]})
    straddle = (lo[None, :] <= x[:, None]) & (x[:, None] <= hi[None, :]) & ok[:, None]
    straddle[np.arange(n), first] = False
    for (k, fb) in refined:
        straddle[k, fb] = False
    want: list[tuple[int, int]] = []
    for k in np.flatnonzero((p1 * straddle).sum(axis=1) > EPS):  # rare: overlapping first bytes with mass
        cand = np.flatnonzero(straddle[k])
        cand = cand[np.argsort(-p1[k, cand], kind="stable")]
        rest = np.cumsum(p1[k, cand][::-1])[::-1]
        want += [(int(k), int(fb)) for fb in cand[rest > EPS]]
    if want:
        groups = [(k, np.array([fb for _, fb in g])) for k, g in itertools.groupby(sorted(want), key=lambda t: t[0])]
        got = model.second_byte_log_probs([np.concatenate([prefixes[k], [C.RttStart]]).astype(np.int32)
                                           for k, _ in groups], [fbs for _, fbs in groups])
        for (k, fbs), lps in zip(groups, got):
            for fb, lp in zip(fbs, lps):
                refined[(k, int(fb))] = Q.bytes_distribution(lp)
    # mass below and at x: unrefined first bytes spread evenly, refined ones by their rows
    below_n, at_n = _counts_below_at(values, x)
    below = (p1 * below_n).sum(axis=1)
    at = (p1 * at_n).sum(axis=1)
    for (k, fb), row in refined.items():
        v = values[fb]
        below[k] += p1[k, fb] * (row[v < x[k]].sum() - below_n[k, fb])
        at[k] += p1[k, fb] * (row[v == x[k]].sum() - at_n[k, fb])
    total = p1.sum(axis=1)
    below, at = below / total, at / total
    p_code = p1[np.arange(n), first] * p2[np.arange(n), codes & 0xFF]
    i = np.arange(rows.start, rows.stop)
    out["p_fail"][i] = p_fail
    fail = ~ok
    out["nll"][i[fail]] = -np.log(np.maximum(p_fail[fail], _TINY))
    out["tail_p"][i[fail]] = p_fail[fail]
    out["nll"][i[ok]] = (-np.log(np.maximum(1.0 - p_fail[ok], _TINY))
                         - np.log(np.maximum(p_code[ok], _TINY)))
    out["pit"][i[ok]] = np.minimum(below[ok] + at[ok], 1.0)
    out["tail_p"][i[ok]] = np.minimum(1.0, 2.0 * np.minimum(np.minimum(below[ok] + at[ok], 1.0), 1.0 - below[ok]))


def _counts_below_at(values: np.ndarray, x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """[n, 256] each: the share of first byte fb's 256 codes below x[k], and equal to it.
    A first byte's codes rise with the second byte, so two binary searches per first byte
    count them, not a [n, 256, 256] comparison (hundreds of MB a chunk)."""
    below = np.empty((len(x), values.shape[0]))
    upto = np.empty_like(below)
    for fb, row in enumerate(values):
        below[:, fb] = np.searchsorted(row, x, side="left")
        upto[:, fb] = np.searchsorted(row, x, side="right")
    return below / 256.0, (upto - below) / 256.0


# ----------------------------------------------------------------- stream


def _stream_windows(lengths: np.ndarray, budget: int, context: int) -> list[tuple[int, int, int]]:
    """(start, first scored, end) measurement windows over one probe's history: each fits
    `budget` tokens (its first measurement's time grows to an absolute one: 8 tokens held
    back), and after the first, opens with up to `context` already-scored measurements in at
    most half the budget, so that every measurement is scored once, after some context."""
    out: list[tuple[int, int, int]] = []
    n, end = len(lengths), 0
    while end < n:
        a, used = end, 0
        if out:
            while a > 0 and end - a < context and used + lengths[a - 1] <= budget // 2:
                a -= 1
                used += int(lengths[a])
        b, used = end, used + 8
        while b < n and (b == end or used + lengths[b] <= budget):
            used += int(lengths[b])
            b += 1
        out.append((a, end, b))
        end = b
    return out


def _score_stream(model, rows: dict, context: int, progress, windows_per_pass: int = 128) -> dict:
    """Each probe's measurements (prb_id, else source address), in time order (file order
    among equal times), as one token stream cut into windows of the model's context: one
    teacher-forced pass over a window scores each of its measurements after the ones before
    it, a few tokens a row (module docstring, "Stream")."""
    n = len(rows["rtt"])
    progress(0, n)
    timed = model.timestamps
    key = np.asarray(rows["prb_id"], np.int64)
    key = np.where(key >= 0, key, -1 - codes_in(rows["src"], vocabulary(rows["src"])))
    order = np.lexsort((np.arange(n), np.asarray(rows["event_time"], np.int64), key))
    bounds = np.flatnonzero(np.diff(key[order])) + 1
    budget = model.seq_len - 8
    out = {"nll": np.zeros(n), "pit": np.full(n, np.nan), "tail_p": np.zeros(n), "p_fail": np.zeros(n),
           "context_measurements": np.zeros(n, np.int64)}
    pending: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = []  # (tokens, scored rows, their result starts)
    done = 0

    def flush() -> None:
        nonlocal done
        seqs = [t for t, _, _ in pending]
        # P(result role), P(first byte), P(second byte | the observed first); clipped: a failed
        # packet closing its window has no byte positions (and needs none)
        at = [np.minimum(np.stack([r - 1, r, r + 1], axis=1).reshape(-1), len(t) - 1) for t, _, r in pending]
        lps = model.log_probs(seqs, at=at)
        idx = np.concatenate([i for _, i, _ in pending])
        lp = np.concatenate([x.reshape(-1, 3, x.shape[-1]) for x in lps])
        tokens = np.concatenate([t[np.minimum(r + 1, len(t) - 1)] * 256 + t[np.minimum(r + 2, len(t) - 1)]
                                 for t, _, r in pending])
        ok = np.asarray(rows["rtt"])[idx] >= 0
        codes = np.where(ok, tokens - Q.BYTE0 * 257, 0)  # (b1 - BYTE0) * 256 + (b2 - BYTE0)
        p_fail = (np.exp(lp[:, 0, C.Failed]) / (np.exp(lp[:, 0, C.Failed]) + np.exp(lp[:, 0, C.RttStart])))
        p1 = possible_first_bytes(Q.bytes_distribution(lp[:, 1]))
        p2 = Q.bytes_distribution(lp[:, 2])
        prefixes = [t[:r] for t, _, rs in pending for r in rs]
        part = {k: np.zeros(len(idx)) for k in ("nll", "tail_p", "p_fail")}
        part["pit"] = np.full(len(idx), np.nan)
        _read(part, slice(0, len(idx)), ok, p_fail, p1, p2, codes, {}, model, prefixes)
        for k, v in part.items():
            out[k][idx] = v
        done += len(idx)
        pending.clear()
        progress(done, n)

    for g in np.split(order, bounds):
        m = measurements(rows, g, timed)
        lengths = encode(m, "compact", order=ORDER).lengths
        for a, s, b in _stream_windows(lengths, budget, context):
            enc = encode(m.take(np.arange(a, b)), "compact", order=ORDER)
            ends = enc.offsets[s - a + 1:]
            ok = np.asarray(rows["rtt"])[g[s:b]] >= 0
            starts = np.where(ok, ends - 3, ends - 1)  # the result block closes a measurement
            out["context_measurements"][g[s:b]] = np.arange(s - a, b - a)
            pending.append((enc.tokens.astype(np.int32), g[s:b], starts.astype(np.int64)))
            if len(pending) >= windows_per_pass:
                flush()
    if pending:
        flush()
    return out


def summary(scored, threshold: float | None = None, top: int = 10) -> dict:
    """What `pingctl score` prints of a score table: packets, failures, the NLL's mean and
    median, how many rows fall below tail probabilities 0.01 and 0.001, and with a `threshold`
    the rows flagged below it and the `top` most surprising of them (lowest tail_p, then highest
    NLL), each with its pair, time (Unix seconds), RTT and scores."""
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
    return out | {"flagged": int(len(flagged)), "top": top_rows(scored.take(order))}


TOP_COLUMNS = ("event_time", "src_addr", "dst_addr", "rtt", "p_fail", "pit", "tail_p", "nll")


def top_rows(scored) -> list[dict]:
    """Scored rows as `summary` lists its most surprising: pair, time (Unix seconds), RTT and
    scores, a failure's PIT None."""
    import pyarrow.compute as pc

    rows = scored.select(list(TOP_COLUMNS))
    times = event_seconds(pc.fill_null(rows.column("event_time"), 0).combine_chunks())[0]
    listed = rows.drop_columns(["event_time"]).to_pylist()
    for r, t in zip(listed, times):
        r["time"] = int(t)
        if r["pit"] is not None and not math.isfinite(r["pit"]):
            r["pit"] = None
    return listed
