"""`pingctl.api.Model`: a trained model asked from a notebook, a script, the service or the CLI.

    from pingctl import Model
    m = Model.load("runs/demo/train")
    m.rtt("78.143.22.26", "194.255.199.229").quantiles

One `Model` holds one loaded checkpoint, so a session pays the model load once, where each
`pingctl sample` pays it per question. Every method builds the question object `pingctl
sample` builds (`pingctl.infer.questions`), so it refuses what the CLI refuses, with the same
bounds, before any work (a refusal names the argument: `pingctl.api.arguments`); the answers
come from the same functions (`questions.answer`, `pairs.answer`), so the numbers are the
CLI's numbers.
"""

from __future__ import annotations

import tempfile
import warnings
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np

from pingctl.artifacts import eval_output as EO
from pingctl.artifacts import sample_output as SO
from pingctl.artifacts import score_output as SCO
from pingctl.artifacts.hub import hub_name, resolve_model_path
from pingctl.artifacts.run import checkpoint_items, parse_steps, read_summary, run_config
from pingctl.artifacts.table import resolve_inputs
from pingctl.api import arguments as A
from pingctl.errors import PingctlError, UsageError
from pingctl.infer import calibration as CAL
from pingctl.infer import pairs as P
from pingctl.infer import predictor as PR
from pingctl.infer import queries as Q
from pingctl.infer import questions as QS
from pingctl.infer import score as S
from pingctl.infer import score_parts as SP
from pingctl.infer.model import LoadedModel, check_engine, untimed_run
from pingctl.infer.plots import distribution_figure, save_figure
from pingctl.infer.runtime import check_hardware
from pingctl.schema.duck import rejected_lines, valid_head
from pingctl.tokenizer import Measurements

MEAN_CEILING_MS = Q.MEAN_CEILING_MS

# `Rtt.sample(n)` holds n float64 draws and as many uniforms: 10 million is ~160 MB, far more
# draws than any quantile or histogram of one pair's 65,536 codes needs.
MAX_DRAWS = 10_000_000

# What a summary of the model carries from its run's summary.json (the training figures).
_TRAINING_KEYS = ("parameters", "steps_total", "last_step", "final_loss", "final_eval_loss", "generalization_gap")


# ----------------------------------------------------------------- one pair's distribution


@dataclass
class Rtt(Q.RttDistribution):
    """The exact distribution of one pair's RTT, as `pingctl sample --src --dst` computes it.

    Inherited from `RttDistribution`: `p_fail` (P(failure)), `codes`, `values_ms` (each RTT
    code's value, ascending), `probs` (P(code | success), summing to 1), `quantile(q)`,
    `cdf(ms)`, `mean` (the mean of RTT <= `MEAN_CEILING_MS`, renormalised: NaN where no mass is
    there), `p_over()` (the mass above that ceiling), `trimmed_mean()` (the central 90%).
    `info` is the whole result as `pingctl sample --json` prints it (run, step, device,
    context_tokens, ...)."""

    src: str = ""
    dst: str = ""
    time: int | None = None
    info: dict = field(default_factory=dict, repr=False)

    @property
    def answered_by(self) -> dict | None:
        """Which predictor answered (model, combined or classical), in which regime, and why."""
        return self.info.get("answered_by")

    @property
    def quantiles(self) -> dict[float, float]:
        """{0.05: ms, 0.25: ms, 0.5: ms, 0.75: ms, 0.95: ms}: the quantiles `pingctl sample` prints."""
        return {q: self.quantile(q) for q in Q.QUANTILES}

    def quantile(self, q: float) -> float:
        """The RTT (ms) at probability `q` of the distribution given success, 0 <= q <= 1."""
        try:
            q = float(q)
        except (TypeError, ValueError):
            raise UsageError(f"quantile {q!r}: give a probability between 0 and 1") from None
        if not 0.0 <= q <= 1.0:  # NaN fails too
            raise UsageError(f"quantile {q!r}: give a probability between 0 and 1")
        return super().quantile(q)

    def sample(self, n: int, rng: np.random.Generator | int | None = None) -> np.ndarray:
        """`n` draws of the measured RTT in ms (float64): each fails with probability `p_fail`,
        and a failed draw is NaN (the canonical table writes -1; NaN keeps np.nanmean and the
        like honest); otherwise a code's value with its probability. `rng`: a NumPy Generator,
        a seed, or None (fresh entropy)."""
        n = A.count("n", n, MAX_DRAWS, "each draw is a float64 in memory, with a uniform to make it")
        rng = rng if isinstance(rng, np.random.Generator) else np.random.default_rng(rng)
        cdf = np.cumsum(self.probs)
        idx = np.minimum(np.searchsorted(cdf, rng.random(n) * cdf[-1], side="right"), len(cdf) - 1)
        out = self.values_ms[idx].astype(np.float64)
        out[rng.random(n) < self.p_fail] = np.nan
        return out

    def plot(self, path: str | Path | None = None):
        """The distribution as a matplotlib Figure (the histogram `pingctl sample --plot` saves);
        with `path`, also saved there as a PNG."""
        fig = distribution_figure(self, f"{self.src} -> {self.dst}")
        if path is not None:
            save_figure(fig, Path(path))
        return fig

    def summary(self) -> dict:
        """src, dst, time and the figures `pingctl sample --json` prints: p_fail, mean_ms (RTT <=
        the ceiling; None where no mass is there), p_over_ceiling, trimmed_mean_ms, p5_ms..p95_ms."""
        return {"src": self.src, "dst": self.dst, "time": self.time, **super().summary()}

    def __repr__(self) -> str:
        s = super().summary()
        mean = "n/a" if s["mean_ms"] is None else f"{s['mean_ms']:.1f}"
        return (f"Rtt({self.src} -> {self.dst}{'' if self.time is None else f' at {self.time}'}: "
                f"P(fail)={self.p_fail:.2%}, p5/p50/p95={s['p5_ms']:.1f}/{s['p50_ms']:.1f}/{s['p95_ms']:.1f} ms, "
                f"mean={mean} ms)")


# ----------------------------------------------------------------- many pairs


@dataclass
class RttPrompts:
    """`Model.rtt_prompts`: the checked pairs of an `rtt_many` question and the prompt of each of
    its distinct questions (`prompts`, token arrays), built apart from the model's passes."""

    built: P.Prompts
    label: str  # how messages and the predictions' metadata name the pairs
    context_per_pair: int

    @property
    def prompts(self) -> list[np.ndarray]:
        return self.built.prompts

    @property
    def choices(self) -> list | None:
        """Per prompt, the predictor answering it (`pingctl.infer.predictor.Choice`)."""
        return self.built.choices

    @property
    def scales(self):
        """Per prompt, the scale its answer is relative to (NaN: in ms); None: every one in ms."""
        return self.built.scales

    @property
    def pairs(self) -> P.Pairs:
        return self.built.pairs

    def __len__(self) -> int:
        return len(self.built.prompts)


@dataclass
class Predictions:
    """The RTT distributions of many pairs, as `pingctl sample --pairs` writes them: `table`
    (one row per valid input row, its columns those of the predictions file; run and step in
    its schema metadata, key `pingctl`, so `pq.write_table(p.table, ...)` writes a file `pingctl
    inspect` knows), `rejects` (each row set aside: its row or line, reason, detail and raw
    values). rows_read == answered + rows_rejected."""

    table: Any
    rejects: list[dict]
    rows_read: int
    rejected: dict  # reason -> {rows, meaning, first}
    # the table's columns as lists, and the cap of measurements a pair the prompts held under:
    # what `pingctl sample --pairs` prints and writes
    columns: dict = field(default_factory=dict, repr=False)
    context_per_pair: int = 0

    @property
    def answered(self) -> int:
        return self.table.num_rows

    @property
    def rows_rejected(self) -> int:
        return len(self.rejects)

    def __len__(self) -> int:
        return self.table.num_rows

    def __repr__(self) -> str:
        return f"Predictions({self.answered:,} answered, {self.rows_rejected:,} set aside of {self.rows_read:,} rows)"


# ----------------------------------------------------------------- contexts


@dataclass
class Context:
    """Earlier measurements to ask after, read and checked once (reuse one across questions):
    `measurements`, each row's prb_id (`prb`, -1 where null; None: unknown) and `read` (rows
    read, rejected and why)."""

    measurements: Measurements
    prb: np.ndarray | None
    read: dict
    label: str

    @classmethod
    def load(cls, source) -> Context:
        """A canonical table (a Parquet file, a directory or glob of them, or a pyarrow Table)
        checked as `pingctl sample --context` checks its file: a row build-rows would reject is
        skipped with a warning; or `Measurements` taken as they are. A Context is returned as is."""
        if isinstance(source, Context):
            return source
        if isinstance(source, Measurements):
            return cls(source, None, {"rows_read": len(source), "rows_rejected": 0, "rejected": {}}, "Measurements")
        import pyarrow as pa

        if isinstance(source, (pa.Table, pa.RecordBatch)):
            with tempfile.TemporaryDirectory(prefix="pingctl-context-") as d:
                f = Path(d) / "context.parquet"
                A.write_parquet(pa.Table.from_batches([source]) if isinstance(source, pa.RecordBatch) else source, f)
                return cls._checked([f], "context (a pyarrow Table)", "<table>")
        if isinstance(source, (str, Path)):
            return cls._checked(resolve_inputs([source]), f"context {source}")
        raise UsageError(f"context: expected a canonical table (path or pyarrow Table) or Measurements, "
                         f"got {type(source).__name__}")

    @classmethod
    def _checked(cls, files: list[Path], label: str, file_name: str | None = None) -> Context:
        import pyarrow as pa
        import pyarrow.compute as pc

        # the checks `pingctl sample --context` makes (pingctl.cli.common.read_valid_rows)
        table, info = valid_head(files, None, label)
        rejected = info["rejected"]
        for e in rejected.values() if file_name else ():
            e["first"]["file"] = file_name  # not the temporary file it was checked in
        if rejected:
            head = f"{label}: skipped {info['rows_rejected']:,} of {info['rows_read']:,} rows, which build-rows would reject:"
            warnings.warn("\n".join([head, *rejected_lines(rejected)]), stacklevel=4)
        prb = (pc.fill_null(table.column("prb_id").cast(pa.int64()), -1).to_numpy(zero_copy_only=False)
               if "prb_id" in table.column_names else None)
        return cls(Measurements.from_arrow(table), prb, info, label)

    def __len__(self) -> int:
        return len(self.measurements)


# ----------------------------------------------------------------- the model


class Model:
    """A trained run (or an exported model directory), loaded once and asked many questions."""

    def __init__(self, loaded: LoadedModel, calibration: CAL.Calibration | None = None,
                 predictor: PR.Predictor | None = None):
        self.loaded = loaded
        self.calibration = calibration
        self._predictor = predictor

    @property
    def predictor(self) -> PR.Predictor:
        """Which predictor answers its RTT questions (`pingctl.infer.predictor`): by default the
        combined answer where the run's combination.json fits and was better on val."""
        if self._predictor is None:
            self._predictor = PR.resolve(self.loaded.run, self.loaded.steps)
        return self._predictor

    @property
    def name(self) -> str:
        """What the model is called where its path is not to be shown (a service's /version): the
        Hub repo id and commit it was downloaded from, else its directory's name."""
        return hub_name(self.loaded.run) or Path(self.loaded.run).name

    @classmethod
    @A.argument_names
    def load(cls, path: str | Path, step: int | list[int] | str | None = None, hardware: str | None = None,
             calibration: str | Path | bool | None = None, engine: str | None = None,
             revision: str | None = None, answer: str | None = None, combination=None) -> Model:
        """Load `path` (a `pingctl train` run directory, an export, or an export's Hugging Face Hub
        repo id `org/name`, through huggingface_hub's cache, at `revision`: a branch, tag or
        commit, default its main branch) at
        `step`: one checkpoint (default: the latest), several (a list, or "100,200") whose
        weights are averaged. `hardware`: cpu | gpu (default: as the run was trained).
        `calibration`: a calibration.json `pingctl eval` fitted for this run and step(s) (its path,
        or the map read: `checks.load_calibration`), whose
        recalibrated distributions `rtt` and `rtt_many` then answer with; default: the map an
        exported model carries, if any; False: none. `engine`: light (plain JAX, no MaxText, the
        default) or maxtext (the reference); default: $PINGCTL_ENGINE, else light.
        `answer`: which predictor answers `rtt` and `rtt_many` (docs/sample.md, "Which predictor
        answers"): model, combined or classical; default: combined where `combination` (a
        combination.json path; default: the run's or the export's own, False: none) fits this
        run, step and prompt and was better than the model on val, else the model."""
        path = resolve_model_path(path, revision)  # a directory, or a Hugging Face Hub repo id
        check_hardware(hardware)
        steps = parse_steps(step) if isinstance(step, str) else step
        if calibration is not None and not isinstance(calibration, (str, Path, bool, CAL.Calibration)):
            raise UsageError("calibration: a calibration.json path, True, False or None")
        check_engine(engine)
        PR.check_answer(answer, "answer")
        loaded = LoadedModel.load(path, steps, hardware, engine=engine)
        predictor = PR.resolve(loaded.run, loaded.steps, answer, combination, "combination")
        if isinstance(calibration, CAL.Calibration):  # a map already read (the CLI reads it before the load)
            CAL.check_fits(calibration, loaded.run, loaded.steps)
            return cls(loaded, calibration, predictor)
        return cls(loaded, CAL.for_model(loaded.run, loaded.steps, calibration), predictor)

    # ------------------------------------------------------------ what it is

    @property
    def run(self) -> Path:
        return self.loaded.run

    @property
    def step(self) -> int:
        return self.loaded.step

    @property
    def steps(self) -> tuple[int, ...]:
        return tuple(self.loaded.steps)

    @property
    def device(self) -> str:
        return self.loaded.device

    @property
    def searches(self) -> bool:
        """Whether `search` (and a completion from an RTT) can be asked: not of a run trained
        with the RTT always after both addresses (loader.result_last=1)."""
        return QS.rtt_first_ok(self.run)

    def metadata(self) -> dict:
        """What the loaded model is: run, step(s), preset, scheme, seq_len, whether it was trained
        with timestamps, device; `checkpoint_time` (UTC, when its checkpoint was written);
        `training` (from the run's summary.json, None without one); `eval` (the latest `pingctl
        eval` report of this run beside it: its path and each predictor's median relative
        error; None without one)."""
        m = self.loaded
        try:
            preset = run_config(m.run).model.preset
        except PingctlError:  # a config no longer readable since the load
            preset = None
        try:
            written = checkpoint_items(m.run, m.step).parent.stat().st_mtime
            checkpoint_time = datetime.fromtimestamp(written, UTC).isoformat().replace("+00:00", "Z")
        except OSError:
            checkpoint_time = None
        try:
            training = {k: read_summary(m.run).get(k) for k in _TRAINING_KEYS}
        except (OSError, ValueError):
            training = None
        return {"run": str(m.run), "step": m.step, "steps": list(m.steps), "preset": preset, "scheme": m.scheme,
                "seq_len": m.seq_len, "timestamps": m.timestamps, "max_per_pair": m.max_per_pair,
                "device": m.device, "engine": m.engine, "checkpoint_time": checkpoint_time, "training": training,
                "eval": _eval_headline(m.run), "calibration": CAL.describe(self.calibration) if self.calibration else None,
                "answering": self.predictor.describe()}

    def __repr__(self) -> str:
        return f"Model({str(self.run)!r}, {self.loaded.label}, device={self.device!r}, engine={self.loaded.engine!r})"

    # ------------------------------------------------------------ questions

    @A.argument_names
    def rtt(self, src: str, dst: str, time=None, context=None, context_per_pair: int | None = None,
            context_policy: str = "probe", context_k: int | None = None, answer: str | None = None) -> Rtt:
        """The exact RTT distribution of src -> dst (`pingctl sample --src --dst`): at `time`
        (ISO 8601 text, Unix seconds or a datetime; naive = UTC) if given, after `context` (a
        canonical table's path or pyarrow Table, `Measurements` or a `Context`: of it, the
        measurements of the source's probe before `time`, as `--context` picks them).
        `context_per_pair`: at most this many measurements per (src, dst) pair of the context
        (default: as the run was trained; 0 = no cap). `context_policy="both"`: a triangulation
        context from `context` instead, `context_k` (default 16) of the probe's measurements to
        other destinations and as many of dst's from other sources (`pingctl sample
        --context-policy both`); `Rtt.info["context"]` lists them. `answer`: model, combined or
        classical for this call (default: as loaded); `Rtt.info["answered_by"]` says which
        predictor answered and why."""
        src, dst = A.address(src, "src", True), A.address(dst, "dst", True)
        A.one_family(src, dst)
        q = QS.RttQuestion(src=src, dst=dst,
                           time=A.when(time, "time"), **A.context_fields(context, context_per_pair),
                           context_policy=context_policy,
                           context_k=None if context_k is None else A.whole("context_k", context_k))
        a = self._answer(q, context, answer)
        d = a.distribution
        return Rtt(d.p_fail, d.codes, d.values_ms, d.probs, src=q.src, dst=q.dst, time=q.time, info=a.result)

    @A.argument_names
    def rtt_many(self, pairs, context=None, context_per_pair: int | None = None, exact: bool = False,
                 progress=None, context_policy: str = "probe", context_k: int | None = None,
                 answer: str | None = None) -> Predictions:
        """The RTT distribution of every row of `pairs` (`pingctl sample --pairs`): a CSV or
        Parquet path, a pyarrow Table or a list of dicts, with src|src_addr, dst|dst_addr and
        optionally time|event_time (or pairs already read, `checks.read_pairs`). A row that fails the `rtt` checks is set aside with its
        reason (Predictions.rejects); a repeated (src, dst, time) is asked once. Each row's
        context is its source's probe's measurements before its time. By default each
        distribution is exact at the quantiles it reports (`exact=True`: every code, as `rtt`).
        `progress(done, total)` is called as batches finish.
        `context_policy="both"`: each prompt holds the pair's triangulation context from
        `context` instead (`context_k`, default 16, measurements a side: its probe's to other
        destinations, its destination's from other sources), as `rtt(..., context_policy="both")`.
        `answer`: as `rtt`'s, per row: its columns answered_by, regime and answered_why say which
        predictor answered and why (a row asked for one it cannot have gets the model's)."""
        asked = self.rtt_prompts(pairs, context, context_per_pair, context_policy, context_k, answer)
        sums = P.summaries(self.loaded, asked.prompts, exact, self.calibration,
                           **({"progress": progress} if progress else {}), choices=asked.choices,
                           scales=asked.scales)
        return self.rtt_predictions(asked, sums, exact)

    @A.argument_names
    def rtt_prompts(self, pairs, context=None, context_per_pair: int | None = None, context_policy: str = "probe",
                    context_k: int | None = None, answer: str | None = None) -> RttPrompts:
        """`rtt_many`'s first half: its pairs checked and the prompt of each distinct question
        built, with no forward pass (pure Python and NumPy, safe beside the model's own thread).
        `rtt_summaries(asked.prompts)` is the model's half, and `rtt_predictions` puts them
        together: `rtt_many` is the three in turn. A service calls them apart, so prompts of many
        requests share one `rtt_summaries` call (`pingctl serve` does)."""
        context_per_pair = A.context_fields(context, context_per_pair)["context_per_pair"]
        QS.check_context_options(Path("context") if context is not None else None, context_per_pair, context_policy,
                                 context_k)
        rows, label = A.read_pairs(pairs)
        m = self.loaded
        check_pairs(rows, f"pairs {label}", m.run, m.timestamps)
        ctx = Context.load(context) if context is not None else None
        per_pair = P.context_cap(m, context_policy, context_per_pair)
        built = P.prompts(m, rows, ctx.measurements if ctx else None, per_pair, prb=ctx.prb if ctx else None,
                          policy=context_policy, k=QS.CONTEXT_K if context_k is None else context_k,
                          predictor=self.predictor.asking(answer))
        return RttPrompts(built, label, per_pair)

    def rtt_summaries(self, prompts: list[np.ndarray], exact: bool = False, choices: list | None = None,
                      scales=None) -> list[dict]:
        """The model's half of `rtt_many`: per prompt (of any `RttPrompts`, in any mix), the
        distribution's summary as `rtt_many`'s columns hold it (recalibrated where the model is,
        then pooled where its choice, `RttPrompts.choices`, says; None: the model's). `scales`:
        per prompt, `RttPrompts.scales` (a hinted prompt of a run trained with
        loader.relative_target is answered relative to its hint; None: every answer in ms)."""
        return P.summaries(self.loaded, list(prompts), exact, self.calibration, choices=choices, scales=scales)

    def rtt_predictions(self, asked: RttPrompts, summaries: list[dict], exact: bool = False) -> Predictions:
        """`rtt_many`'s answer from its prompts and their `rtt_summaries` (in order)."""
        if len(summaries) != len(asked):
            raise ValueError(f"{len(summaries)} summaries for {len(asked)} prompts")
        m, rows = self.loaded, asked.built.pairs
        cols = P.columns(asked.built, summaries)
        meta = {"run": str(m.run), "step": m.step, "steps": list(m.steps), "timestamps": m.timestamps,
                "pairs": asked.label, "exact": exact,
                "calibration": self.calibration.path if self.calibration is not None else None,
                "combination": self.predictor.path}
        return Predictions(SO.predictions_table(cols, meta), rows.rejects, rows.rows_read, rows.reject_summary(),
                           cols, asked.context_per_pair)

    @A.argument_names
    def complete(self, src: str | None = None, dst: str | None = None, rtt: float | None = None, k: int = QS.K,
                 context=None, context_per_pair: int | None = None) -> list[dict]:
        """The `k` most probable (src, dst) filling the patterns (`8.8.*.*`, `8.8.0.0/16`; a side
        left out is any address of the other's family), given one RTT `rtt` ms if set: a list of
        {src, dst, probability, log_prob}, most probable first (`pingctl sample` with a pattern)."""
        if src is None and dst is None:
            raise UsageError("complete: give src, dst or both, a pattern (8.8.*.* or a CIDR) in at least one")
        src, dst = A.address(src, "src"), A.address(dst, "dst")
        A.one_family(src, dst)
        fam_src, fam_dst = (p[0] if p else None for p in Q.parse_pair(src, dst))
        lo, hi = A.rtt_bounds(rtt) if rtt is not None else (None, None)
        if rtt is not None and hi > lo:
            raise UsageError(f"rtt {rtt!r}: a completion conditions on one RTT (e.g. 20); ranges are for search")
        q = QS.CompleteQuestion(src=src or Q.any_address(fam_dst), dst=dst or Q.any_address(fam_src), rtt=lo,
                                k=A.whole("k", k), **A.context_fields(context, context_per_pair))
        return self._answer(q, context).rows

    @A.argument_names
    def search(self, src: str, rtt, n: int = QS.SAMPLES, k: int = QS.K, seed: int = 0, temperature: float = 1.0,
               context=None, context_per_pair: int | None = None) -> list[dict]:
        """Inverse search (`pingctl sample --src --rtt`): destinations `src` reaches at `rtt` ms
        (a number, a (low, high) pair or "10-30"), from `n` sampled destinations at
        `temperature` (seeded: the same seed, the same answer), deduplicated; the `k` most
        probable as {dst, probability, samples}."""
        lo, hi = A.rtt_bounds(rtt)
        A.sampling(seed=seed, temperature=temperature)
        q = QS.InverseQuestion(src=A.address(src, "src", True), rtt_lo=lo, rtt_hi=hi, samples=A.whole("n", n),
                               k=A.whole("k", k), seed=seed, temperature=float(temperature),
                               **A.context_fields(context, context_per_pair))
        return self._answer(q, context).rows

    @A.argument_names
    def generate(self, n: int = QS.STREAMS, measurements: int = QS.MEASUREMENTS, src: str | None = None,
                 timestamps: bool | None = None, since=None, until=None, seed: int = 0, temperature: float = 1.0,
                 top_p: float = 1.0, context=None, context_per_pair: int | None = None):
        """`n` generated measurement streams of up to `measurements` measurements each (`pingctl
        sample --n`): of probe `src` if set; every measurement timestamped (`timestamps`,
        default: as the run was trained), its time between `since` and `until`. Returns the
        canonical rows, with a `stream` column, as a pyarrow Table (what `--out` writes)."""
        A.sampling(seed=seed, temperature=temperature, top_p=top_p)
        period = None
        if since is not None or until is not None:
            period = QS.generation_period(A.time_text(since, "since"), A.time_text(until, "until"))
        q = QS.GenerateQuestion(streams=A.whole("n", n), measurements=A.whole("measurements", measurements),
                                src=A.address(src, "src"), timestamps=timestamps, period=period, seed=seed,
                                temperature=float(temperature), top_p=float(top_p),
                                **A.context_fields(context, context_per_pair))
        import pyarrow as pa

        table, stream_id = QS.generated_rows(self._answer(q, context).streams)
        return table.append_column("stream", pa.array(stream_id, pa.int64()))

    @A.argument_names
    def score(self, table, context: int = S.CONTEXT, context_policy: str = S.STREAM, limit: int | None = None,
              context_per_pair: int | None = None, progress=None, answer: str | None = None):
        """How surprising each measurement of a canonical table (a Parquet path, directory or
        glob, or a pyarrow Table) is to the model (`pingctl score`, `pingctl.infer.score`): a
        pyarrow Table of the valid rows' canonical columns, then `nll` (nats), `pit`, `tail_p`,
        `p_fail` and `context_measurements`; each prompt holds up to `context` of the probe's
        preceding measurements in the table (`context_policy` "stream", the default as for
        `pingctl score`: each probe's rows as one teacher-forced stream; or "probe", "cold", "none"). Rows
        build-rows would reject are set aside; the counts are in the schema metadata
        (`pingctl.infer.score.score_meta`). At most `limit` rows (1,000,000 at most; `score_to`
        scores a table of any size into a directory). Each row is read from the answer to its
        question (`answer`, as `rtt`'s; columns answered_by and regime)."""
        predictor = self.predictor.asking(answer)
        if not isinstance(table, S.ScoreInput):  # else read and checked before the load (`read_scores`)
            S.check_options(context, context_policy, limit)
            table = S.read_input(table, limit)
        return S.score_rows(self.loaded, table, context=context, context_policy=context_policy,
                            per_pair=context_per_pair, progress=progress, predictor=predictor)

    @A.argument_names
    def score_to(self, table, out: Path | str, context: int = S.CONTEXT, context_policy: str = S.STREAM,
                 limit: int | None = None, context_per_pair: int | None = None, progress=None,
                 answer: str | None = None, bucket_rows: int = SP.BUCKET_ROWS) -> dict:
        """`score` of a table of any size (a Parquet path, directory or glob) into the directory
        `out`, a bucket of about `bucket_rows` rows of whole probes at a time, as `pingctl score
        TABLE -o DIR` writes it (docs/score.md, "A table of any size"): one Parquet part per bucket
        with a `row` column (the row's place in the table), then manifest.json. A call after an
        interrupted one with the same arguments resumes it. Policies "stream", "probe", "cold",
        "none". Returns the manifest: the counts, the settings and `data_files`, the parts."""
        predictor = self.predictor.asking(answer)
        if not isinstance(table, SP.Partition):  # else read into buckets before the load (`partition_scores`)
            SP.check_options(context, context_policy, limit, bucket_rows)
            if not SCO.is_directory(Path(out)):
                raise UsageError(f"out {out}: a directory name (no .parquet, .csv or .json suffix); "
                                 "Model.score returns the scores of a table as one")
            SCO.check_out(Path(out), resolve_inputs([table]) if isinstance(table, (str, Path)) else [])
            table = SP.partition(table, out, limit=limit, bucket_rows=bucket_rows)
        return SP.score_parts(self.loaded, table, context=context, context_policy=context_policy,
                              per_pair=context_per_pair, progress=progress, predictor=predictor)

    def answer(self, question: QS.Question, context: Measurements | None = None, read: dict | None = None,
               run: Path | str | None = None, answer: str | None = None) -> QS.Answer:
        """The answer to one question `pingctl sample` built (`pingctl.cli.sample_options.question_from_options`):
        `context` the measurements already picked for its prompt (`checks.probe_context`), `read`
        what became of the context file's rows, `run` how the result names the run (default:
        `self.run`); `answer` the predictor of an RTT question (default: as loaded). The methods
        above build the question from Python arguments first."""
        return QS.answer(self.loaded, question, self.run if run is None else run, context, read, self.calibration,
                         self.predictor.asking(answer))

    def _answer(self, q: QS.Question, context, answer: str | None = None) -> QS.Answer:
        QS.check_run(q, self.run)
        ctx, read = None, None
        if context is not None:
            c = Context.load(context)
            read = dict(c.read)
            ctx = QS.probe_context(q, c.measurements, read, c.prb, self.run)
        return self.answer(q, ctx, read, answer=answer)


def check_pairs(rows: P.Pairs, what: str, run: Path, timestamps: bool, whose: str = "their") -> None:
    """Refuse pairs a run cannot answer: times to a run trained without them, or no valid row
    (`what` names them: `pairs FILE` here, `--pairs FILE` in the CLI, which checks before the
    model loads; `whose` times they are)."""
    if rows.has_times() and not timestamps:
        raise untimed_run(what, run, f"so it cannot condition on {whose} times; leave the time column empty or "
                                     "drop it")
    if not rows.src:
        raise PingctlError("\n".join([f"{what}: no valid pair among {rows.rows_read:,} rows",
                                      *reason_lines(rows.reject_summary(), rows.unit)]))


def reason_lines(summary: dict, unit: str) -> list[str]:
    """schema.rejected_lines for pairs: their rows are CSV lines or Parquet rows, all of one file."""
    return [f"  {r}: {e['rows']:,} ({e['meaning']}); first: {unit} {e['first']['row']}" for r, e in summary.items()]


def _eval_headline(run: Path) -> dict | None:
    """The newest `pingctl eval` report beside `run` (a sibling directory) that evaluated it."""
    found = []
    try:
        siblings = [p for p in run.parent.iterdir() if p.is_dir() and p != run]
    except OSError:
        return None
    for d in siblings:
        if not EO.is_eval_output(d):
            continue
        try:
            path, report = EO.read_report(d)
            asked = Path(report["inputs"]["run"]).resolve()
        except (PingctlError, KeyError, TypeError, OSError):
            continue
        if asked == run.resolve():
            found.append((path.stat().st_mtime, path, report))
    if not found:
        return None
    _, path, report = max(found, key=lambda x: x[0])
    rows = [r for r in report.get("rows", []) if isinstance(r, dict) and "predictor" in r]
    return {"report": str(path), "queries": report.get("queries"),
            "median_rel_err": {r["predictor"]: r.get("median_rel_err") for r in rows}}


__all__ = ["MAX_DRAWS", "MEAN_CEILING_MS", "Context", "Model", "Predictions", "Rtt", "check_pairs", "reason_lines"]
