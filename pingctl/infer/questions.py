"""The questions `pingctl sample` asks a trained run, as objects (docs/sample.md).

A question is built from what the user gave (the CLI's `pingctl/cli/sample_options.py` infers
which one from `pingctl sample`'s options; `pingctl.api.Model` from its arguments), and
refuses, before any file is read or the model loads, what does not fit it: an option of
another question, a value no model could answer, a size beyond the bounds below. The rules
a run's config.yaml sets (`check_run`: was it trained with timestamps, to read an RTT before
the addresses?) are checked next, still without JAX; `answer(model, question)` then returns
plain results (`Answer`) and writes the files the question names.

- `RttQuestion`: the exact RTT distribution of one (src, dst [, time, context]).
- `PairsQuestion`: that distribution for every row of a --pairs file (`pingctl/infer/pairs.py`).
- `CompleteQuestion`: the most probable completions of partial addresses.
- `InverseQuestion`: destinations a source reaches at an RTT (sampled).
- `GenerateQuestion`: whole measurement streams (sampled).
"""

from __future__ import annotations

import ipaddress
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import ClassVar

import numpy as np

from pingctl.artifacts import sample_output as SO
from pingctl.artifacts.run import run_config
from pingctl.atomic import unwritable_reason
from pingctl.context import triangulation_indices
from pingctl.errors import PingctlError, UsageError
from pingctl.infer import hints as H
from pingctl.infer import predictor as PR
from pingctl.infer import queries as Q
from pingctl.infer.model import trained_with_timestamps, untimed_run
from pingctl.infer.pairs import AddressError, check_measurable, choose, context_of, probe_of
from pingctl.infer.plots import plot_distribution
from pingctl.prompt import CONTEXT_K, SAMPLE_POLICIES, Policy, PromptSpec, parse_policy
from pingctl.schema.times import generated_time_range, parse_when, utc_text
from pingctl.tokenizer import Measurements, decode
from pingctl.tokenizer.rtt_codec import MAX_MS

# ----------------------------------------------------------------- defaults and bounds
#
# Every size a user can type is bounded here, checked when the question is built (before the
# run is read or the model loads), so that the CLI, the Python API and a service refuse the
# same sizes with the same message (a usage error, exit 2). The reasoning, per question:
#
# Generation decodes token by token, and every step runs a forward pass over every live
# stream (no key-value cache), keeping a grammar state and a token list per stream and one
# result row per generated measurement. A `--n 1000000000000` once grew to 22 GB building
# the streams' states before the first token. 10,000 streams is ~80 MB of token lists at
# seq_len 1024 and hours of CPU; the rows of 1,000,000 measurements in all (streams x
# measurements) are ~1 GB as Python objects and their --json text. A stream is one context
# of seq_len tokens and a measurement takes at least 12 of them (start, two roles, two IPv4
# addresses, the result), so 10,000 measurements per stream would need a 120,000-token
# context, far beyond any run trained here (loader.seq_len 1024 by default).
MAX_STREAMS = 10_000
MAX_MEASUREMENTS = 10_000
MAX_GENERATED = 1_000_000  # streams x measurements
#
# Inverse search runs every sample through 4 (IPv4) or 16 (IPv6) forward passes and holds
# [samples, vocab] log-probabilities per pass; `--n 1000000000000` asked NumPy for 7.28 TiB.
# 100,000 samples are ~120 MB per pass and ~6,000 forward batches of 32 per address byte.
MAX_SAMPLES = 100_000
#
# -k shows the top of a ranked list, so it is bounded by the candidates there can be: a
# completion's beam search keeps the COMPLETE_BEAM most probable, an inverse search finds at
# most one destination per sample.
COMPLETE_BEAM = 64
MAX_K = MAX_SAMPLES

K = 10  # -k: completions / inverse-search destinations shown
MEASUREMENTS = 8  # --measurements: per generated stream
STREAMS = 4  # --n of a generation
SAMPLES = 64  # --n of an inverse search

MODE_NAMES = {"distribution": "an RTT distribution (--src IP --dst IP)", "complete": "a completion",
              "inverse": "inverse search", "generate": "generation"}


def bound(name: str, value: int | None, most: int, what: str) -> None:
    if value is not None and value > most:
        raise UsageError(f"{name} {value:,} is beyond the bound of {most:,}: {what}")


def _at_least_one(name: str, value: int | None) -> None:
    if value is not None and value < 1:
        raise UsageError(f"{name} must be at least 1, got {value}")


# ----------------------------------------------------------------- option parsers


def is_pattern(text: str | None) -> bool:
    return bool(text) and ("*" in text or "/" in text)


def address_option(text: str | None, name: str) -> str | None:
    """The address or pattern of --src/--dst as the prompt builder takes it: no surrounding
    whitespace, and refused as a --pairs row is where no measurement could record it."""
    if text is None:
        return None
    text = text.strip()
    try:
        check_measurable(text)
    except AddressError as e:
        raise UsageError(f"{name} {e}") from None
    return text


def rtt_range(text: str, name: str = "--rtt") -> tuple[float, float]:
    """--rtt as (low, high) ms: '20' or '10-30'; refusals name `name`."""
    # the range's '-' is neither a leading sign nor an exponent's sign (1e-3 is one number)
    cut = next((i for i in range(1, len(text)) if text[i] == "-" and text[i - 1] not in "eE"), None)
    lo, hi = (text, text) if cut is None else (text[:cut], text[cut + 1 :])
    if cut is not None and not hi.strip():
        raise UsageError(f"{name} {text!r}: a range needs both ends, like 10-30")
    try:
        lo_f, hi_f = float(lo), float(hi)
    except ValueError:
        raise UsageError(f"{name} {text!r}: give milliseconds like 20 or a range like 10-30") from None
    # NaN compares false with everything, so it must be excluded explicitly
    if not (math.isfinite(lo_f) and math.isfinite(hi_f)) or lo_f < 0 or hi_f < lo_f:
        raise UsageError(f"{name} {text!r}: need finite 0 <= low <= high")
    if hi_f > MAX_MS:
        raise UsageError(f"{name} {text!r}: the RTT code ends at {MAX_MS:,.0f} ms")
    return lo_f, hi_f


def time_option(text: str | None, option: str = "--time") -> int | None:
    """A time option (ISO 8601 or Unix seconds) -> Unix seconds; None when not given."""
    if text is not None and not text.strip():  # parse_when reads "" as "no time" (an unset config key)
        raise UsageError(f"{option} is empty: give ISO 8601 or Unix seconds")
    us = parse_when(text, option, UsageError)
    return None if us is None else us // 1_000_000


def generation_period(since: str | None, until: str | None) -> tuple[int, int]:
    """--since/--until as the (lo, hi) Unix seconds generated times are drawn in; inside the
    range a canonical row may hold, so every generated row stays one."""
    lo_ok, hi_ok = generated_time_range()
    lo = time_option(since, "--since") if since is not None else lo_ok
    hi = time_option(until, "--until") if until is not None else hi_ok
    for name, v in (("--since", lo), ("--until", hi)):
        if not lo_ok <= v <= hi_ok:
            raise UsageError(f"{name} {utc_text(v)}: generated rows are canonical rows, whose times lie in "
                             f"{utc_text(lo_ok)} .. now ({utc_text(hi_ok)}); shard would set this one aside")
    if lo > hi:
        raise UsageError(f"--since {utc_text(lo)} is after --until {utc_text(hi)}")
    return lo, hi


# --context-policy: `probe` the probe's own measurements from --context (as training contexts
# without triangulation); `both` a triangulation context from it (docs/sample.md): the probe's
# measurements to other destinations and the destination's from other sources, CONTEXT_K a side.
CONTEXT_POLICIES = SAMPLE_POLICIES
MAX_CONTEXT_K = 10_000  # a prompt holds at most seq_len tokens, >= 12 a measurement (eval's bound)


def check_context_options(context: Path | None, context_per_pair: int | None, context_policy: str = "probe",
                          context_k: int | None = None) -> None:
    Q.check_per_pair(context_per_pair)
    if context_per_pair is not None and context is None:
        raise UsageError("--context-per-pair caps measurements from --context; give --context too")
    two_sided = parse_policy(context_policy, SAMPLE_POLICIES) is Policy.BOTH
    if two_sided and context is None:
        raise UsageError("--context-policy both picks its measurements from --context; give --context TABLE too")
    if context_k is not None:
        if not two_sided:
            raise UsageError("--context-k is the size of each side of --context-policy both")
        _at_least_one("--context-k", context_k)
        bound("--context-k", context_k, MAX_CONTEXT_K, "a prompt holds at most the run's seq_len tokens, at "
                                                         "least 12 a measurement")


def check_writable(*named: tuple[str, Path | None]) -> None:
    for name, path in named:
        if path is not None and (reason := unwritable_reason(path)):
            raise PingctlError(f"{name} {path}: cannot be written ({reason})")


# ----------------------------------------------------------------- the questions


@dataclass(frozen=True, kw_only=True)
class Question:
    """What every question may carry: a --context file of the probe's preceding measurements
    and its per-pair cap (None: as the run was trained)."""

    mode: ClassVar[str] = ""
    context: Path | None = None
    context_per_pair: int | None = None
    context_policy: str = "probe"
    context_k: int | None = None

    def __post_init__(self) -> None:
        self.check()

    def check(self) -> None:
        check_context_options(self.context, self.context_per_pair, self.context_policy, self.context_k)
        if self.two_sided and self.mode not in ("distribution", "pairs"):
            raise UsageError(f"--context-policy both is for an RTT distribution (--src IP --dst IP), not "
                             f"{MODE_NAMES.get(self.mode, 'a --pairs file')}: its context needs both ends")

    @property
    def two_sided(self) -> bool:
        """Its prompt holds a triangulation context (`--context-policy both`)."""
        return self.context_policy == Policy.BOTH

    def prompt(self, run: Path | str) -> PromptSpec:
        """Its prompt under `run`'s rules (`prompt.PromptSpec`): the per-pair cap as the run was
        trained unless --context-per-pair says, the hint where a `both` prompt of the run carries one."""
        k = CONTEXT_K if self.context_k is None else self.context_k
        return PromptSpec.for_model(run, policy=self.context_policy, context=k, per_pair=self.context_per_pair,
                                    allowed=SAMPLE_POLICIES)

    def needs_run_rules(self) -> bool:
        """Whether `check_run` must read the run's config."""
        return False


@dataclass(frozen=True, kw_only=True)
class RttQuestion(Question):
    """The exact distribution of the RTT code of src -> dst (at `time`, after the context);
    `out` (.parquet | .json) keeps every code, `plot` draws it, `calibration` recalibrates it."""

    mode: ClassVar[str] = "distribution"
    src: str
    dst: str
    time: int | None = None
    out: Path | None = None
    plot: Path | None = None
    calibration: Path | None = None

    def check(self) -> None:
        super().check()
        Q.parse_pair(self.src, self.dst)
        if is_pattern(self.src) or is_pattern(self.dst):
            raise UsageError("an RTT distribution needs whole addresses; a pattern asks for a completion")
        if self.out is not None and self.out.suffix not in SO.SINGLE_SUFFIXES:
            raise UsageError(f"--out {self.out}: written as .parquet, .csv or .json")

    def needs_run_rules(self) -> bool:
        return self.time is not None


@dataclass(frozen=True, kw_only=True)
class PairsQuestion(Question):
    """The RTT distribution of every row of a pairs file (CSV or Parquet: src, dst [, time]);
    `out` (.parquet | .csv | .json) holds the predictions, the rows set aside beside it."""

    mode: ClassVar[str] = "pairs"
    pairs: Path
    out: Path | None = None
    exact: bool = False
    calibration: Path | None = None

    def check(self) -> None:
        super().check()
        if self.out is not None and self.out.suffix not in SO.PAIRS_SUFFIXES:
            raise UsageError(f"--out {self.out}: --pairs writes .parquet, .csv or .json")


@dataclass(frozen=True, kw_only=True)
class CompleteQuestion(Question):
    """The `k` most probable (src, dst) that fill the patterns (a side left out: any address
    of the other's family), given an RTT `rtt` ms if set."""

    mode: ClassVar[str] = "complete"
    src: str
    dst: str
    rtt: float | None = None
    k: int = K

    def check(self) -> None:
        super().check()
        Q.parse_pair(self.src, self.dst)
        _at_least_one("-k", self.k)
        bound("-k", self.k, COMPLETE_BEAM, f"a completion's beam search keeps the {COMPLETE_BEAM} most "
                                            "probable completions, so it can show no more")

    def needs_run_rules(self) -> bool:
        return self.rtt is not None


@dataclass(frozen=True, kw_only=True)
class InverseQuestion(Question):
    """Destinations `src` reaches at an RTT in [rtt_lo, rtt_hi] ms: `samples` drawn at
    `temperature` (seeded), deduplicated, the `k` most probable shown."""

    mode: ClassVar[str] = "inverse"
    src: str
    rtt_lo: float
    rtt_hi: float
    samples: int = SAMPLES
    k: int = K
    seed: int = 0
    temperature: float = 1.0

    def check(self) -> None:
        super().check()
        Q.parse_pair(self.src, None)
        if is_pattern(self.src):
            raise UsageError("inverse search needs a whole --src address")
        if not (0 <= self.rtt_lo <= self.rtt_hi <= MAX_MS):
            raise UsageError(f"--rtt {self.rtt_lo}-{self.rtt_hi}: need finite 0 <= low <= high")
        _at_least_one("--n", self.samples)
        _at_least_one("-k", self.k)
        bound("--n", self.samples, MAX_SAMPLES, "inverse search runs every sample through each address "
                                                 "byte's forward pass and holds its log-probabilities")
        bound("-k", self.k, MAX_K, f"inverse search finds at most one destination per sample, and "
                                    f"--n is at most {MAX_SAMPLES:,}")

    @property
    def rtt_text(self) -> str:
        return f"{self.rtt_lo:g}" if self.rtt_hi == self.rtt_lo else f"{self.rtt_lo:g}-{self.rtt_hi:g}"

    def needs_run_rules(self) -> bool:
        return True


@dataclass(frozen=True, kw_only=True)
class GenerateQuestion(Question):
    """`streams` streams of up to `measurements` measurements each (of probe `src` if set);
    `timestamps` None: as the run was trained; `period` (lo, hi) Unix seconds bounds their
    times; `out` (.parquet | .json) keeps them."""

    mode: ClassVar[str] = "generate"
    streams: int = STREAMS
    measurements: int = MEASUREMENTS
    src: str | None = None
    timestamps: bool | None = None
    period: tuple[int, int] | None = None
    out: Path | None = None
    seed: int = 0
    temperature: float = 1.0
    top_p: float = 1.0

    def check(self) -> None:
        super().check()
        if self.src is not None:
            Q.parse_pair(self.src, None)
            if is_pattern(self.src):
                raise UsageError("generation pins a whole --src address, not a pattern")
        _at_least_one("--n", self.streams)
        _at_least_one("--measurements", self.measurements)
        bound("--n", self.streams, MAX_STREAMS, "generation decodes every stream token by token, a forward "
                                                 "pass over all of them per token")
        bound("--measurements", self.measurements, MAX_MEASUREMENTS,
               "a stream is one context of the run's seq_len tokens, at least 12 per measurement")
        if self.streams * self.measurements > MAX_GENERATED:
            raise UsageError(f"--n {self.streams:,} x --measurements {self.measurements:,} is beyond the bound of "
                             f"{MAX_GENERATED:,} generated measurements in all (each one a result row in memory)")
        if self.out is not None and self.out.suffix not in SO.SINGLE_SUFFIXES:
            raise UsageError(f"--out {self.out}: written as .parquet, .csv or .json")

    def needs_run_rules(self) -> bool:
        return bool(self.timestamps) or self.period is not None


# ----------------------------------------------------------------- from options


# ----------------------------------------------------------------- the run's rules


def rtt_first_ok(run) -> bool:
    """Whether the run can be asked with the RTT before the addresses (a completion or search
    from an RTT): not one trained with loader.result_last=1, which never saw that order."""
    return run_config(run).loader.result_last < 1.0


def check_run(question: Question, run: Path) -> None:
    """Refuse what the run was not trained to answer, from its config.yaml (cheap, no JAX):
    a time, timestamps or a period of a run trained without timestamps; an RTT before the
    addresses of a run trained with loader.result_last=1."""
    if not question.needs_run_rules():
        return
    trained = run_config(run).loader
    timed = trained_with_timestamps(trained.mode_weights)
    if isinstance(question, RttQuestion) and question.time is not None and not timed:
        raise untimed_run("--time", run, "so it cannot condition on a time; ask without --time")
    if isinstance(question, GenerateQuestion):
        if question.timestamps and not timed:
            raise untimed_run("--timestamps", run, "so it cannot generate them")
        if question.period and not timed:
            raise untimed_run("--since/--until", run, "so its streams have no times to bound")
    if isinstance(question, (CompleteQuestion, InverseQuestion)) and not rtt_first_ok(run):
        # these prompts put the RTT before the addresses, an order such a run never saw
        raise UsageError(f"--rtt: {run} was trained with loader.result_last=1 (the RTT always after both "
                         "addresses), so it cannot answer from an RTT to addresses; ask a run trained with "
                         "result_last < 1, or ask this one for the RTT distribution of candidate pairs")


def probe_context(question: Question, ctx: Measurements, read: dict, prb, run: Path | str) -> Measurements | None:
    """The context a question with a whole --src is asked with: that source's probe's
    measurements (before --time), as a --pairs row's; training contexts hold one probe's past.
    With --context-policy both, the triangulation context (`triangulation_context`, capped per
    pair as `run` was trained unless --context-per-pair says: `Question.prompt`). Sets
    read["rows_used"] (a caller may say how many of the file's rows that left)."""
    src = getattr(question, "src", None)
    if question.two_sided:
        spec = question.prompt(run)
        idx = triangulation_context(ctx, prb, question.src, question.dst, question.time, spec.context, spec.cap)
        read["rows_used"] = len(idx)
        return ctx.take(idx) if len(idx) else None
    if src is None or is_pattern(src):
        return ctx
    picked = context_of(ctx, str(ipaddress.ip_address(src)), getattr(question, "time", None), prb)
    read["rows_used"] = 0 if picked is None else len(picked)
    return picked


def triangulation_context(ctx: Measurements, prb, src: str, dst: str, time: int | None, k: int,
                          per_pair: int) -> np.ndarray:
    """Indices into `ctx` of the `both` context of src -> dst (before `time`, all rows without
    one): `k` measurements of src's probe to other destinations and `k` of dst from other
    sources, at most `per_pair` of each pair, oldest first (pingctl.context.triangulation_indices,
    the rule of eval and of the loader's triangulation contexts)."""
    pool = {"src": np.array(ctx.src_text(), object), "dst": np.array(ctx.dst_text(), object),
            "event_time": ctx.time_s,
            "prb_id": np.full(len(ctx), -1, np.int64) if prb is None else np.asarray(prb, np.int64)}
    src_c, dst_c = str(ipaddress.ip_address(src)), str(ipaddress.ip_address(dst))
    query = {"src": np.array([src_c], object), "dst": np.array([dst_c], object),
             "event_time": np.array([np.iinfo(np.int64).max if time is None else time], np.int64),
             "prb_id": probe_of(pool["src"], pool["prb_id"], [src_c])}
    return triangulation_indices(pool, query, np.zeros(1, np.int64), k, k, per_pair)[0]


# ----------------------------------------------------------------- answers


@dataclass
class Answer:
    """What a question got: `result` as `pingctl sample --json` prints it; beside it, the
    distribution (RttQuestion), the ranked rows (completions, candidates, generated
    measurements) and the generated streams (`Decoded`, GenerateQuestion)."""

    question: Question
    result: dict
    distribution: Q.RttDistribution | None = None
    rows: list[dict] = field(default_factory=list)
    streams: list | None = None


def answer(model, question: Question, run: Path | str | None = None, context: Measurements | None = None,
           context_read: dict | None = None, calibration=None, predictor=None) -> Answer:
    """Ask `model` a single question (not PairsQuestion: `pingctl/infer/pairs.py`), after the
    `context` measurements; write the files the question names. `calibration`: a loaded
    calibration map (`pingctl.infer.calibration.load`) for an RttQuestion; `predictor`
    (`predictor.Predictor`): which predictor answers it (None: the model)."""
    if isinstance(question, PairsQuestion):
        raise PingctlError("a --pairs question is answered by pingctl.infer.pairs.answer")
    q = question
    result: dict = {"mode": q.mode, "run": str(model.run if run is None else run), "step": model.step,
                    "steps": list(model.steps), "timestamps": model.timestamps, "device": model.device,
                    "engine": getattr(model, "engine", "maxtext")}
    spec = q.prompt(model.run)
    hint_tokens, estimate = H.NONE, None
    if spec.hint and isinstance(q, RttQuestion):
        hint_tokens, estimate = H.hint(H.run_hints(model.run), q.src, q.dst, context)
    # a `both` context was capped per pair when it was picked (probe_context)
    ctx_tokens, last_t = Q.context_tokens(model, context, model.seq_len - 64, spec.tokens_cap,
                                          timed=model.timestamps, hint=hint_tokens)
    if context is not None:
        result["context_per_pair"] = spec.cap
        result["context_rows"] = context_read
    if estimate is not None:
        result["hint_ms"] = estimate
    result["context_tokens"] = int(len(ctx_tokens))
    if spec.two_sided:
        # the prompt's context measurements as the model reads them (src, dst, time, rtt)
        m = decode(ctx_tokens, "compact").measurements
        result["context_policy"] = str(spec.policy)
        result["context_k"] = spec.context
        result["context"] = [{"src": a, "dst": b, "time": int(t) if h else None, "rtt_ms": float(r)}
                             for a, b, t, h, r in zip(m.src_text(), m.dst_text(), m.time_s, m.has_time, m.rtt_ms)]
    if isinstance(q, RttQuestion):
        d = Q.rtt_distribution(model, Q.query_prefix(q.src, q.dst, q.time, ctx_tokens, last_t),
                               None if estimate is None else H.scales(model.run, [estimate])[0])
        if calibration is not None:
            result["calibration"] = {"path": calibration.path,
                                     **{k: calibration.meta.get(k) for k in ("fitted_on", "packets")}}
        choice = _choice(q, spec, predictor, context, estimate)
        d = choice.apply(d, calibration)
        if predictor is not None:
            result["answered_by"] = choice.answered_by()
        result.update({"src": q.src, "dst": q.dst, "time": q.time, **d.summary()})
        if q.plot:
            plot_distribution(d, q.plot, f"{q.src} -> {q.dst}")
            result["plot"] = str(q.plot)
        if q.out:
            SO.write_distribution(d, q.out, q.src, q.dst)
            result["out"] = str(q.out)
        return Answer(q, result, distribution=d)
    if isinstance(q, CompleteQuestion):
        found = Q.complete(model, q.src, q.dst, q.rtt, k=q.k, beam=COMPLETE_BEAM, context=ctx_tokens)
        result["completions"] = found
        return Answer(q, result, rows=found)
    rng = np.random.default_rng(q.seed)
    if isinstance(q, InverseQuestion):
        found = Q.inverse(model, q.src, q.rtt_lo, q.rtt_hi, q.samples, rng, q.temperature, context=ctx_tokens)
        result["candidates"] = found[: q.k]
        return Answer(q, result, rows=found[: q.k])
    assert isinstance(q, GenerateQuestion)
    timed = model.timestamps if q.timestamps is None else q.timestamps
    # every generated row passes shard's time check
    streams = Q.generate(model, q.streams, q.measurements, rng, q.temperature, q.top_p,
                         context=ctx_tokens, src=q.src, timestamps=timed,
                         time_range=(q.period or generated_time_range()) if model.scheme == "compact" else None)
    result["timestamped"] = timed
    if model.scheme == "compact":
        result["time_range"] = list(q.period or generated_time_range())
    rows = []
    for i, d in enumerate(streams):
        m = d.measurements
        times = m.time_s
        for j, (s_, d_, r_) in enumerate(zip(m.src_text(), m.dst_text(), m.rtt_ms)):
            rows.append({"stream": i, "src": s_, "dst": d_, "rtt_ms": float(r_),
                         "time": int(times[j]) if m.has_time[j] else None})
    result["measurements"] = rows
    result["errors"] = sum(len(d.errors) for d in streams)
    result["times_out_of_range"] = int(sum(d.measurements.unrepresentable_times().sum() for d in streams))
    if q.out:
        SO.write_generated(*generated_rows(streams), q.out)
        result["out"] = str(q.out)
    return Answer(q, result, rows=rows, streams=streams)


def _choice(q: RttQuestion, spec: PromptSpec, predictor, context: Measurements | None, hint_ms: float | None):
    """The predictor of a single RTT question (`pairs.choose`) asked with prompt `spec`; one
    asked for explicitly that cannot answer it is refused (`Predictor.require`)."""
    if predictor is None:
        return PR.MODEL
    return predictor.require(choose(predictor, q.src, q.dst, context, q.context_policy, spec.cap, spec.context,
                                    hint_ms))


def generated_rows(streams: list) -> tuple:
    """Generated streams (`Decoded`) as (canonical Arrow rows or None for no stream, each
    row's stream number): what `--out` writes and the Python API returns."""
    ms = [d.measurements for d in streams]
    table = Measurements.concat(ms).to_arrow() if ms else None
    stream_id = np.concatenate([np.full(len(m), i) for i, m in enumerate(ms)]) if ms else []
    return table, stream_id
