"""RTT distributions for a file of pairs: `pingctl sample RUN --pairs FILE`.

A researcher asking for many predictions at once (every probe to a set of candidate
targets, the pairs of a planned campaign) should pay for one model load, not one per pair,
and must not lose a row silently. So each row of the file is checked as `--src/--dst/--time`
are, a row that fails is set aside with its line (CSV) or row (Parquet) and the reason
(rows read = answered + rejected), and the rest are answered in batches.

The answer per pair is the one `pingctl sample --src --dst` prints: P(failure), p5..p95, the
mean of the central 90%, the mean of RTT <= `queries.MEAN_CEILING_MS` and the mass above
it. By default the distribution is exact where it is read (`queries.rtt_distributions_at`,
as `pingctl eval`: each quantile and P(RTT > ceiling) within 1e-3 of probability) at a few
dozen second-byte passes per pair instead of 256; the two means are then approximate inside
the first-byte bins nothing is read in. `exact=True` computes all 65,536 codes, as a single
query does.
"""

from __future__ import annotations

import csv
import functools
import math
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from pingctl.context import context_indices, triangulation_indices
from pingctl.errors import PingctlError, UsageError
from pingctl.infer import hints as H
from pingctl.infer import predictor as PR
from pingctl.infer import queries as Q
from pingctl.prompt import SAMPLE_POLICIES, PromptSpec
from pingctl.schema.times import parse_when
from pingctl.tokenizer.measurements import event_seconds

SRC_COLUMNS = ("src", "src_addr")
DST_COLUMNS = ("dst", "dst_addr")
# and as every CSV pingctl writes names them (pingctl.schema.spreadsheet): its outputs read back
TIME_COLUMNS = ("time", "event_time", "time_utc", "event_time_utc")
SUFFIXES = (".csv", ".parquet")
CONTEXT_ROWS_MAX = 4096  # a prompt of seq_len tokens holds far fewer measurements than this
CHUNK = 32  # questions per model call: progress reports between them

REASONS = {
    "bad_record": "a CSV line whose number of fields differs from the header's",
    "missing_address": "src or dst is empty",
    "bad_address": "src or dst is not an IP address",
    "pattern": "src or dst is a pattern or CIDR; --pairs answers whole addresses (use --src/--dst for completions)",
    "zone_id": "an IPv6 zone id (%...) names a local interface, not part of a measured address",
    "ipv4_mapped": "an IPv4-mapped IPv6 address; measurements record the IPv4 address itself",
    "mixed_family": "src and dst are of different address families",
    "bad_time": "the time is neither ISO 8601 nor Unix seconds (or out of range)",
}


@dataclass
class Pairs:
    """The valid rows of a pairs file, and the rejected ones with their reasons."""

    file: str
    unit: str  # "line" (CSV: physical line, header = 1) or "row" (Parquet: 0-based, as DuckDB numbers rows)
    where: list[int] = field(default_factory=list)
    src: list[str] = field(default_factory=list)
    dst: list[str] = field(default_factory=list)
    family: list[int] = field(default_factory=list)
    time: list[int | None] = field(default_factory=list)
    rejects: list[dict] = field(default_factory=list)  # {file, line|row, reason, detail, raw}

    @property
    def rows_read(self) -> int:
        return len(self.src) + len(self.rejects)

    def has_times(self) -> bool:
        return any(t is not None for t in self.time)

    @functools.cached_property
    def slots(self) -> np.ndarray:
        """Per valid row, the index of its distinct (src, dst, time) question, numbered in
        order of first appearance: equal questions share a prompt, so they are asked once."""
        first: dict = {}
        return np.array([first.setdefault(k, len(first)) for k in zip(self.src, self.dst, self.time)], np.int64)

    @property
    def distinct(self) -> int:
        return int(self.slots.max()) + 1 if len(self.slots) else 0

    def reject_summary(self) -> dict:
        """reason -> {rows, meaning, first: {file, row}}: the shape the other commands report."""
        out: dict = {}
        for r in self.rejects:
            e = out.setdefault(r["reason"], {"rows": 0, "meaning": REASONS[r["reason"]],
                                             "first": {"file": self.file, "row": r[self.unit]}})
            e["rows"] += 1
        return dict(sorted(out.items(), key=lambda kv: -kv[1]["rows"]))


def check_measurable(text: str) -> None:
    """Refuse (`AddressError`) what no measurement records, whole address or pattern alike:
    nothing, an IPv6 zone id (fe80::1%eth0 names a local interface) and an IPv4-mapped IPv6
    address or network (::ffff:1.2.3.4 would be asked as IPv6, a different question from the
    IPv4 one the data holds; the message gives the IPv4 form). `text` is stripped."""
    import ipaddress

    if not text:
        raise AddressError("missing_address", "is empty")
    if "%" in text:
        raise AddressError("zone_id", f"{text!r}: an IPv6 zone id (%...) is not part of a measured address; drop it")
    try:
        net = ipaddress.ip_network(text, strict=False) if ":" in text else None
    except ValueError:
        net = None  # a pattern, or not an address: the caller's parser names what is wrong
    v4 = net.network_address.ipv4_mapped if net is not None and net.prefixlen >= 96 else None
    if v4 is not None:
        ask = v4 if net.prefixlen == 128 else f"{v4}/{net.prefixlen - 96}"
        raise AddressError("ipv4_mapped", f"{text!r} is an IPv4-mapped IPv6 address; measurements record the IPv4 "
                                          f"address itself: ask for {ask}")


@functools.lru_cache(maxsize=1 << 16)  # a table of packets repeats its addresses many times
def clean_address(text: str) -> tuple[str, int]:
    """A whole address as a measurement records it -> (canonical text, family); raises
    `AddressError` with a reason key of `REASONS`."""
    import ipaddress

    text = text.strip()
    check_measurable(text)
    if "*" in text or "/" in text:
        raise AddressError("pattern", f"{text!r} is a pattern; give a whole address")
    try:
        ip = ipaddress.ip_address(text)
    except ValueError:
        raise AddressError("bad_address", f"{text!r} is not an IP address") from None
    return str(ip), ip.version


class AddressError(UsageError):
    def __init__(self, reason: str, message: str):
        super().__init__(message)
        self.reason = reason


def read_pairs(path: Path) -> Pairs:
    """Read and check a pairs file: CSV with a header, or Parquet; columns src|src_addr,
    dst|dst_addr and optionally time|event_time (ISO 8601 or Unix seconds; empty = no time)."""
    path = Path(path)
    if path.suffix not in SUFFIXES:
        raise UsageError(f"--pairs {path}: expected a .csv (with a header) or .parquet file")
    if not path.is_file():
        raise PingctlError(f"--pairs {path}: no such file")
    records = _csv_records(path) if path.suffix == ".csv" else _parquet_records(path)
    pairs = _checked(Pairs(str(path), "line" if path.suffix == ".csv" else "row"), records)
    if not pairs.rows_read:
        raise PingctlError(f"--pairs {path}: the file has no rows")
    return pairs


def records_pairs(records, label: str) -> Pairs:
    """Pairs from (src, dst, time) records already in memory (time: Unix seconds, ISO 8601 or
    None), numbered as rows from 0 and checked as a file's rows are, without a file between
    (what a service's parsed body asks)."""
    return _checked(Pairs(label, "row"), [(i, values, None) for i, values in enumerate(records)])


def _checked(pairs: Pairs, records) -> Pairs:
    for where, values, problem in records:
        if problem is None:
            problem = _check(pairs, where, values)
        if problem is not None:
            reason, detail = problem
            pairs.rejects.append({"file": pairs.file, pairs.unit: where, "reason": reason, "detail": detail,
                                  "raw": values if isinstance(values, str) else dict(zip(("src", "dst", "time"), values))})
    return pairs


def _check(pairs: Pairs, where: int, values: tuple) -> tuple[str, str] | None:
    src_text, dst_text, time_value = values
    try:
        src, fam_s = clean_address("" if src_text is None else str(src_text))
        dst, fam_d = clean_address("" if dst_text is None else str(dst_text))
    except AddressError as e:
        return e.reason, str(e)
    if fam_s != fam_d:
        return "mixed_family", f"src is IPv{fam_s} but dst is IPv{fam_d}"
    try:
        if isinstance(time_value, float) and not math.isfinite(time_value):
            raise PingctlError(f"time {time_value!r}: not a finite number")
        us = parse_when(time_value, "time")
    except PingctlError as e:
        return "bad_time", str(e)
    pairs.where.append(where)
    pairs.src.append(src)
    pairs.dst.append(dst)
    pairs.family.append(fam_s)
    pairs.time.append(None if us is None else us // 1_000_000)
    return None


def pick_columns(names: list[str], path: Path | str) -> tuple[str, str, str | None]:
    """The columns of src, dst and time among a header's `names`; two columns for one field
    (one name twice, or two of its names) are refused: which of them a row means is a guess."""
    def pick(options: tuple[str, ...], required: bool) -> str | None:
        found = [c for c in names if c in options]
        if len(found) > 1:
            twice = next((c for c in found if found.count(c) > 1), None)
            if twice is None:
                what = f"columns {' and '.join(found)} both name the same field"
            else:
                at = ", ".join(str(i + 1) for i, c in enumerate(names) if c == twice)
                what = f"column {twice} appears {found.count(twice)} times (columns {at})"
            raise PingctlError(f"--pairs {path}: {what}; keep one")
        if required and not found:
            raise PingctlError(f"--pairs {path}: no {' or '.join(options)} column (columns: {', '.join(names) or 'none'})")
        return found[0] if found else None

    return pick(SRC_COLUMNS, True), pick(DST_COLUMNS, True), pick(TIME_COLUMNS, False)


def _csv_records(path: Path):
    """(line, (src, dst, time), problem) per record; the csv module keeps exact line numbers
    and lets a malformed line be set aside instead of failing the file."""
    try:
        # utf-8-sig: spreadsheet exports open with a byte-order mark, which would hide the `src` header
        with path.open(newline="", encoding="utf-8-sig") as f:
            reader = csv.reader(f)
            header = next(reader, None)
            if header is None:
                raise PingctlError(f"--pairs {path}: the file is empty (expected a header like src,dst,time)")
            names = [h.strip() for h in header]
            s, d, t = pick_columns(names, path)
            idx = [names.index(s), names.index(d), names.index(t) if t else None]
            out = []
            for rec in reader:
                line = reader.line_num
                if not rec or (len(rec) == 1 and not rec[0].strip()):
                    continue  # a blank line is not a record
                if len(rec) != len(names):
                    out.append((line, ",".join(rec), ("bad_record", f"{len(rec)} fields, the header has {len(names)}")))
                    continue
                out.append((line, (rec[idx[0]], rec[idx[1]], rec[idx[2]] if idx[2] is not None else None), None))
            return out
    except UnicodeDecodeError as e:
        raise PingctlError(f"--pairs {path}: not UTF-8 text ({e.reason} at byte {e.start})") from None
    except csv.Error as e:
        raise PingctlError(f"--pairs {path}: line {reader.line_num}: {e}") from None


def _parquet_records(path: Path):
    import pyarrow.parquet as pq

    try:
        names = pq.read_schema(path).names
    except Exception as e:  # noqa: BLE001 - pyarrow raises OSError/ArrowInvalid/... for damaged files
        raise PingctlError(f"--pairs {path}: cannot read it as Parquet ({e})") from None
    s, d, t = pick_columns(names, path)
    try:
        # the picked columns only: a name repeated among the others would fail a whole-file read
        table = pq.read_table(path, columns=[c for c in (s, d, t) if c])
    except Exception as e:  # noqa: BLE001 - as above, a damaged page found past the footer
        raise PingctlError(f"--pairs {path}: cannot read it as Parquet ({e})") from None
    cols = [table.column(c).to_pylist() for c in (s, d)]
    times = _parquet_times(table.column(t)) if t else [None] * table.num_rows
    return [(i, (a, b, c), None) for i, (a, b, c) in enumerate(zip(*cols, times))]


def _parquet_times(col) -> list:
    """Timestamps of any unit become whole Unix seconds, floored by the canonical readers' own
    conversion (no datetime detour, which fails past the year 9999); numbers and text stay as
    they are, for the row checks to name."""
    import pyarrow as pa

    if not pa.types.is_timestamp(col.type):
        return col.to_pylist()
    seconds, valid = event_seconds(col)
    return [int(t) if ok else None for t, ok in zip(seconds, valid)]


# ----------------------------------------------------------------- answering


def triangulation_contexts(pairs: Pairs, ctx, rows: np.ndarray, k: int, per_pair: int,
                           prb: np.ndarray | None = None) -> list:
    """Per pair `rows[k]`, its `--context-policy both` context from `ctx` (a `Measurements`):
    `k` measurements of its probe to other destinations and `k` of its destination from other
    sources, before the pair's time (all rows where it has none), at most `per_pair` of each
    pair, never the pair itself, oldest first — `triangulation_indices`, the rule of eval and
    of the loader's triangulation contexts. None where there are none."""
    if ctx is None or len(ctx) == 0:
        return [None] * len(rows)
    pool, query = _pool_and_queries(pairs, ctx, prb)
    picked = triangulation_indices(pool, query, np.asarray(rows, np.int64), k, k, per_pair)
    return [ctx.take(i) if len(i) else None for i in picked]


def contexts(pairs: Pairs, ctx, rows: np.ndarray, per_source_max: int = CONTEXT_ROWS_MAX,
             prb: np.ndarray | None = None) -> list:
    """Per pair `rows[k]`, the context's measurements of the pair's probe strictly before the
    pair's time (all of them where the row has no time), oldest first; `ctx` is a
    `Measurements` or None. A question names no probe, so its probe is the one whose rows in
    the context have its source address (`prb`: the context's prb_id, -1 where null): then
    all of that probe's rows count, both families of a dual-stack probe, as in the
    probe-centric rows it was trained on. Where no single probe has that address, the rows
    from the address itself."""
    if ctx is None or len(ctx) == 0:
        return [None] * len(rows)

    pool, query = _pool_and_queries(pairs, ctx, prb)
    rows = np.asarray(rows, np.int64)
    known = query["prb_id"][rows] >= 0
    out: list = [None] * len(rows)
    # by probe where the address names one; by address (every row keyed by its source) elsewhere
    for sel, p in ((known, pool), (~known, {**pool, "prb_id": np.full(len(ctx), -1, np.int64)})):
        q = query if p is pool else {**query, "prb_id": np.full(len(pairs.src), -1, np.int64)}
        for k, i in zip(np.flatnonzero(sel), context_indices(p, q, rows[sel], per_source_max, "probe")):
            out[k] = ctx.take(i) if len(i) else None
    return out


def _pool_and_queries(pairs: Pairs, ctx, prb: np.ndarray | None) -> tuple[dict, dict]:
    """The context's and the pairs' columns as pingctl.context takes them; a pair without a
    time asks after every row, and its probe is the one whose rows have its source."""
    pool = {"src": np.array(ctx.src_text(), object), "dst": np.array(ctx.dst_text(), object),
            "event_time": ctx.time_s,
            "prb_id": np.full(len(ctx), -1, np.int64) if prb is None else np.asarray(prb, np.int64)}
    big = np.iinfo(np.int64).max
    query = {"src": np.array(pairs.src, object), "dst": np.array(pairs.dst, object),
             "event_time": np.array([big if t is None else t for t in pairs.time], np.int64),
             "prb_id": probe_of(pool["src"], pool["prb_id"], pairs.src)}
    return pool, query


def probe_of(pool_src: np.ndarray, pool_prb: np.ndarray, srcs: list[str]) -> np.ndarray:
    """Per address in `srcs`, the one prb_id whose context rows have it as source; -1 where
    there is none or more than one (an address two probes shared, e.g. behind one NAT)."""
    have = pool_prb >= 0
    found: dict[str, set] = {}
    for a, p in set(zip(pool_src[have].tolist(), pool_prb[have].tolist())):
        found.setdefault(a, set()).add(p)
    one = {a: next(iter(ps)) for a, ps in found.items() if len(ps) == 1}
    return np.array([one.get(a, -1) for a in srcs], np.int64)


def context_of(ctx, src: str, time: int | None, prb: np.ndarray | None = None):
    """The context a single `--src/--dst [--time]` question is asked with, picked as for a
    `--pairs` row (`contexts`): the measurements of `src`'s probe in `ctx` (`src` canonical
    text) before `time`; None where there are none."""
    one = Pairs(file="", unit="row", src=[src], dst=[""], family=[0], time=[time])
    return contexts(one, ctx, np.zeros(1, np.int64), prb=prb)[0]


def context_cap(model, policy: str, requested: int | None) -> int:
    """Measurements of one pair a prompt may hold: `requested`, else as the run was trained
    (`prompt.per_pair_cap`)."""
    return PromptSpec.for_model(model.run, policy=policy, per_pair=requested, hints=False,
                                allowed=SAMPLE_POLICIES).cap


def distributions(model, prompts: list[np.ndarray], exact: bool, calibration=None, choices=None,
                  scales=None) -> list:
    """The RTT distribution after each prompt as `--pairs` and the service answer it: every
    code (`exact`), or exact where it is read — the quantiles (with a `calibration`, the raw
    levels its recalibrated quantiles come from; with `choices`, per prompt its predictor
    (`predictor.Choice`), where the combined answer's quantiles fall) and the mean's ceiling,
    since P(RTT > ceiling) is printed beside the mean; then recalibrated, then pooled. `scales`:
    per prompt, the scale its answer is relative to (`Prompts.scales`; None: all in ms)."""
    if exact:
        dists = Q.rtt_distributions(model, prompts, scales=scales)
    else:
        reads = Q.QUANTILES if calibration is None else (*Q.QUANTILES, *calibration.raw_level(np.array(Q.QUANTILES)))
        cdfs = None if choices is None else [c.read_cdf(calibration) for c in choices]
        dists = Q.rtt_distributions_at(model, prompts, reads, points=np.full(len(prompts), Q.MEAN_CEILING_MS),
                                       read_cdfs=cdfs if cdfs and any(f is not None for f in cdfs) else None,
                                       scales=scales)
    if choices is not None:
        return [c.apply(d, calibration) for c, d in zip(choices, dists)]
    return dists if calibration is None else [calibration.apply(d) for d in dists]


@dataclass
class Prompts:
    """The prompts of a pairs table's distinct questions, in order of first appearance (`Pairs.slots`
    maps each valid row to its question), each with the context measurements it holds. Built
    without the model's forward pass, so a service builds them off the model's thread."""

    pairs: Pairs
    prompts: list[np.ndarray]
    context_measurements: list[int]
    choices: list | None = None  # per prompt, its predictor (`predictor.Choice`); None: the model's
    scales: np.ndarray | None = None  # per prompt, the scale its answer is relative to (`hints.scales`); None: ms


def prompts(model, pairs: Pairs, ctx=None, per_pair: int = 0, prb: np.ndarray | None = None, policy: str = "probe",
            k: int = 16, predictor=None) -> Prompts:
    """The prompt of each distinct question of `pairs` (see `answer`); with a `predictor`
    (`predictor.Predictor`), which one answers each."""
    distinct = np.unique(pairs.slots, return_index=True)[1]  # the first row of each distinct question
    budget = model.seq_len - 64
    timed = model.timestamps
    spec = PromptSpec.for_model(model.run, policy=policy, context=k, per_pair=per_pair, allowed=SAMPLE_POLICIES)
    if spec.two_sided:
        ctxs = triangulation_contexts(pairs, ctx, distinct, k, spec.cap, prb=prb)
    else:
        ctxs = contexts(pairs, ctx, distinct, prb=prb)
    hints = H.run_hints(model.run) if spec.hint else None  # read once for the table
    out, n_ctx, chosen, estimates = [], [], [], []
    for c, i in zip(ctxs, distinct):
        hint, hint_ms = H.hint(hints, pairs.src[i], pairs.dst[i], c)
        estimates.append(hint_ms)
        tokens, last_t = Q.context_tokens(model, c, budget, spec.tokens_cap, timed=timed, hint=hint)
        # one MeasurementStart (id 0) per context measurement, the hint after them not counted
        n_ctx.append(int((tokens[: len(tokens) - len(hint)] == 0).sum()))
        out.append(Q.query_prefix(pairs.src[i], pairs.dst[i], pairs.time[i] if timed else None, tokens, last_t))
        if predictor is not None:
            chosen.append(choose(predictor, pairs.src[i], pairs.dst[i], c, policy, spec.cap, k, hint_ms))
    return Prompts(pairs, out, n_ctx, chosen if predictor is not None else None,
                   H.scales(model.run, estimates) if hints is not None else None)


def choose(predictor, src: str, dst: str, context, policy: str, per_pair: int, k: int, hint_ms: float | None):
    """The predictor of one question whose prompt holds `context` (the measurements picked for
    it) under `policy`: the prompt's own estimate (`hint_ms`) where it carries a hint."""
    keys = PR.prompt_keys(policy, context is not None, per_pair, k, hint_ms is not None)
    return predictor.choose(src, dst, context, keys, hint_ms)


def summaries(model, prompts: list[np.ndarray], exact: bool, calibration=None, chunk: int = CHUNK,
              progress=lambda done, total: None, choices=None, scales=None) -> list[dict]:
    """What `--pairs` reports of the distribution after each prompt (`distributions`), `chunk`
    prompts a model call: the model's part of an answer, for prompts of any questions
    (`choices`: per prompt, the predictor answering it; `scales`: the scale its answer is
    relative to, `Prompts.scales`)."""
    n, out = len(prompts), []
    progress(0, n)
    for a in range(0, n, chunk):
        part = None if choices is None else choices[a : a + chunk]
        sc = None if scales is None else scales[a : a + chunk]
        out += [d.summary() for d in distributions(model, prompts[a : a + chunk], exact, calibration, part, sc)]
        progress(min(a + chunk, n), n)
    return out


ANSWERED_BY_COLUMNS = ("answered_by", "regime", "answered_why")


def answered_by_columns(choices: list) -> dict:
    """The predictions' columns naming each answer's predictor, its regime and why."""
    return {"answered_by": [c.predictor for c in choices], "regime": [c.regime for c in choices],
            "answered_why": [c.why for c in choices]}


SUMMARY_COLUMNS = ("p_fail", "mean_ms", "p_over_ceiling", "trimmed_mean_ms",
                   *(f"p{round(q * 100)}_ms" for q in Q.QUANTILES))


def columns(p: Prompts, sums: list[dict]) -> dict:
    """The predictions' column arrays, one entry per valid row of `p.pairs`, in file order, from
    the summaries of its distinct questions (a repeated question copies its answer)."""
    pairs, slot = p.pairs, p.pairs.slots
    cols = {k: [s[k] for s in sums] for k in SUMMARY_COLUMNS}
    if p.choices is not None:  # which predictor answered each, and why
        cols.update(answered_by_columns(p.choices))
    per_row = {k: [v[j] for j in slot] for k, v in {**cols, "context_measurements": p.context_measurements}.items()}
    return {pairs.unit: list(pairs.where), "src": list(pairs.src), "dst": list(pairs.dst),
            "ip_version": list(pairs.family), "time": list(pairs.time), **per_row}


def answer(model, pairs: Pairs, ctx=None, per_pair: int = 0, exact: bool = False, chunk: int = CHUNK,
           progress=lambda done, total: None, prb: np.ndarray | None = None, calibration=None,
           policy: str = "probe", k: int = 16, predictor=None) -> dict:
    """Column arrays of the predictions, one entry per valid pair, in file order. A row that
    repeats an earlier (src, dst, time) has the same prompt, so it is answered once and copied:
    a measurement table given as pairs costs its distinct pairs, not its rows. A `calibration`
    recalibrates every distribution (its quantiles are then read exactly where the recalibrated
    ones fall). `policy` "both": each prompt holds the pair's triangulation context from `ctx`
    (`k` a side, `per_pair` of each pair per side) instead of its probe's history."""
    p = prompts(model, pairs, ctx, per_pair, prb=prb, policy=policy, k=k, predictor=predictor)
    return columns(p, summaries(model, p.prompts, exact, calibration, chunk, progress, p.choices, p.scales))
