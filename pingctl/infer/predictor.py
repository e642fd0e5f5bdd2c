"""Which predictor answers an RTT question: the model, the combined answer or the classical
estimate alone (docs/sample.md, "Which predictor answers").

`pingctl eval RUN --regimes SPLITS` fits, per regime, how much weight the model's distribution
gets against a log-normal around a classical estimate, and writes RUN/combination.json
(`pingctl.infer.combine`). An answer reads it here: `Predictor` holds the file a model answers
with (its own, an export's copy or one named) and what was asked (`model`, `combined`,
`classical`, or None for the default); `Predictor.choose` decides one question: its regime,
its classical estimate (computed once, by `classical_estimate`), which predictor answers and
why. `Choice.apply` turns the model's distribution into the answer: a recalibration map
applies to the model's own answers only; the combined and classical answers pool the model's
raw distribution, the one their weight and spread were fitted against on val.

By default a question is answered combined where a combination fitted for this run, step and
prompt shape has a fit for its regime that was better than the model on val (lower CRPS), and
the question has a classical estimate; otherwise by the model, and the answer says why.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

from pingctl.errors import PingctlError, UsageError
from pingctl.infer import combine as CB
from pingctl.infer.hints import run_hints
from pingctl.loader.hints import Hints
from pingctl.prompt import Policy

PREDICTORS = ("model", "combined", "classical")
HOW_TO_FIT = "`pingctl eval {run} --regimes SPLITS` fits one on the val split and writes {path}"


def check_answer(answer: str | None, option: str = "--answer") -> None:
    if answer is not None and answer not in PREDICTORS:
        raise UsageError(f"{option} {answer!r}: expected one of {', '.join(PREDICTORS)}")


@dataclass(frozen=True)
class Choice:
    """One question's predictor: `predictor` (model | combined | classical), its `regime`
    (None where it cannot be told), `why` in words, and what the pool needs."""

    predictor: str
    regime: str | None
    why: str
    estimate_ms: float | None = None
    fit: CB.RegimeFit | None = None

    def answered_by(self) -> dict:
        return {"predictor": self.predictor, "regime": self.regime, "why": self.why}

    def apply(self, dist, calibration=None):
        """The answer's distribution from the model's. A recalibration map is the model's own
        answer's: the combination's weight and spread were fitted on val against the model's raw
        distribution, so that is what it pools, exactly as `eval` scored it."""
        if self.predictor == "model":
            return dist if calibration is None else calibration.apply(dist)
        if self.predictor == "combined":
            return CB.pool(dist, self.estimate_ms, self.fit)
        if self.predictor == "classical":
            return CB.classical(dist, self.estimate_ms, self.fit)
        return dist

    def read_cdf(self, calibration=None):
        """The CDF (over the sorted codes) the answer's quantiles are read on, as a function of
        the model's normalised CDF: what `queries.rtt_distributions_at` refines where, so the
        answer is exact at its own quantiles. None where that is the model's (or its map's)."""
        if self.predictor == "model":
            return None
        fit = self.fit.classical_alone() if self.predictor == "classical" else self.fit
        if fit.weight >= 1.0 and fit.recal is None:
            return None
        est = float(self.estimate_ms)

        def cdf(f, values):  # the raw model's CDF, as `apply` pools and maps it
            return fit.recalibrated(CB.pooled_cdf(f, values, est, fit))

        return cdf


MODEL = Choice("model", None, "asked for the model's own answer (answer model)")


def classical_estimate(regime: str | None, pair_rtt_ms, hints: Hints | None, src: str, dst: str, context=None,
                       hint_ms: float | None = None) -> float | None:
    """A question's classical estimate (ms) for its regime, computed once: the pair's median
    (`time`: its training history where the run's hints keep it, else its packets in the
    prompt: `combine.pair_estimate`), else the embedding's estimate the run's hints give
    (`hint_ms` where the prompt's hint already computed it; the prompt's `context` measurements
    place an end the fit never saw). None where there is none."""
    if regime is None:
        return None
    if CB.CLASSICAL_OF_REGIME[regime] == "pair_median":
        est = CB.pair_estimate(np.nan if hints is None else hints.history(src, dst), CB.pair_median(pair_rtt_ms))
    elif hint_ms is not None:
        est = hint_ms
    elif hints is None:
        return None
    else:
        peers = [] if context is None else list(zip(context.src_text(), context.dst_text(), context.rtt_ms.tolist()))
        est = hints.answer(src, dst, peers)
    return float(est) if CB.usable(est) else None


def known_ends(hints: Hints | None, src: str, dst: str) -> tuple[bool, bool] | None:
    """Whether the hints' every-pair fit placed each end (None without hints)."""
    if hints is None:
        return None
    placed = hints.trained[hints.folds]
    return tuple(bool(c >= 0 and placed[c]) for c in (hints.key_code(src), hints.key_code(dst)))


def pair_rtts(context, src: str, dst: str, per_pair: int = 0) -> np.ndarray:
    """The RTTs (ms, -1 failed) of the pair's own measurements among a prompt's context: the
    most recent `per_pair` of them (0: all), as the prompt keeps them."""
    if context is None or len(context) == 0:
        return np.zeros(0)
    s, d = np.asarray(context.src_text(), object), np.asarray(context.dst_text(), object)
    mine = np.flatnonzero((s == src) & (d == dst))
    mine = mine[np.argsort(np.asarray(context.time_s)[mine], kind="stable")]
    return np.asarray(context.rtt_ms, np.float64)[mine[-per_pair:] if per_pair else mine]


@dataclass(frozen=True)
class Predictor:
    """What a loaded model answers RTT questions with: `asked` (PREDICTORS, or None: the
    default), the `combination` it may pool with (None: none applies, `unused` says why), the
    run's hints (the estimate of a pair without its own packets in the prompt)."""

    asked: str | None
    combination: CB.Combination | None
    unused: str | None
    hints: Hints | None

    @property
    def path(self) -> str | None:
        return None if self.combination is None else self.combination.path

    def describe(self) -> dict:
        return {"answer": self.asked or "default", "combination": self.path, "unused": self.unused}

    def choose(self, src: str, dst: str, context=None, prompt: dict | None = None,
               hint_ms: float | None = None) -> Choice:
        """The predictor of one question, src -> dst after `context` (the prompt's measurements),
        asked with the prompt shape `prompt` (combine.PROMPT_KEYS)."""
        if self.asked == "model":
            return MODEL
        rtts = pair_rtts(context, src, dst, (prompt or {}).get("context_per_pair") or 0)
        known = known_ends(self.hints, src, dst)
        regime = CB.regime_of(len(rtts), *(known or (False, False))) if known is not None or len(rtts) else None
        decided = self.for_regime(regime, prompt or {})
        if decided.predictor == "model":
            return decided
        est = classical_estimate(regime, rtts, self.hints, src, dst, context, hint_ms)
        if est is None:
            return Choice("model", regime, no_estimate(regime))
        return replace(decided, estimate_ms=est,
                                   why=f"{decided.why}; {decided.fit.classical} {est:.1f} ms")

    def for_regime(self, regime: str | None, prompt: dict) -> Choice:
        """What answers a question of `regime` asked with the prompt shape `prompt`, where it has
        a classical estimate (a Choice without the estimate)."""
        if self.asked == "model":
            return MODEL
        if self.combination is None:
            return Choice("model", regime, self.unused)
        if regime is None:
            return Choice("model", None, "the prompt holds no packet of the pair and the run has no hints to tell "
                                         "which ends it knows, so there is no classical estimate")
        fit = self.combination.for_regime(regime)
        if fit is None:
            return Choice("model", regime, f"{self.path} has no fit for the {regime} regime")
        if why := prompt_mismatch(self.combination, regime, prompt):
            return Choice("model", regime, why)
        crps = fit.crps_val or {}
        text = f"val CRPS combined {_ms(crps.get('combined'))}, model {_ms(crps.get('model'))}"
        if self.asked in ("classical", "combined"):
            return Choice(self.asked, regime, f"asked for the {self.asked} answer (weight {fit.weight:.2f} on the "
                                              f"model; {text})", None, fit)
        if not _number(crps.get("combined")) < _number(crps.get("model")):
            return Choice("model", regime, f"the combination was not better than the model on val in the {regime} "
                                           f"regime ({text})")
        return Choice("combined", regime, f"better than the model on val in the {regime} regime ({text}; weight "
                                          f"{fit.weight:.2f} on the model)", None, fit)

    def asking(self, answer: str | None, option: str = "answer") -> Predictor:
        """This predictor with `answer` asked instead (None: as it is), for one call."""
        check_answer(answer, option)
        if answer is None or answer == self.asked:
            return self
        if answer != "model" and self.combination is None:
            raise UsageError(f"{option} {answer!r}: {self.unused}")
        return replace(self, asked=answer)

    def require(self, choice: Choice) -> Choice:
        """A single question asked for `combined` or `classical` explicitly that cannot have
        it is refused, naming why (a many-pair answer says it per row instead)."""
        if self.asked in ("combined", "classical") and choice.predictor != self.asked:
            raise UsageError(f"--answer {self.asked}: {choice.why}")
        return choice


def no_estimate(regime: str) -> str:
    what = ("no successful packet of the pair in the prompt" if regime == "time"
            else "no embedding estimate for the pair (the run has no hints, or neither end is placed)")
    return f"no classical estimate: {what}"


def _number(v) -> float:
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else float("inf")


def _ms(v) -> str:
    return f"{v:.2f} ms" if isinstance(v, (int, float)) and not isinstance(v, bool) else "n/a"


def prompt_mismatch(comb: CB.Combination, regime: str, prompt: dict) -> str | None:
    """Why the regime's fit was made for another prompt shape than `prompt` (None if not): its
    prompt keys are the regime's own (`Combination.prompt_of`: as `eval --regimes` records them)
    or the file's."""
    fitted = comb.prompt_of(regime)
    for k in (k for k in CB.PROMPT_KEYS if k in prompt):
        if fitted.get(k) != prompt[k]:
            return (f"{comb.path} was fitted with {k} {fitted.get(k)!r} in the {regime} regime, this prompt has "
                    f"{prompt[k]!r}")
    return None


def prompt_keys(policy: str, has_context: bool, per_pair: int | None, k: int | None = None,
                hinted: bool = False) -> dict:
    """A question's prompt shape as combine.PROMPT_KEYS name it: what its fit must match."""
    if not has_context:
        return {"context_policy": "none", "hint": None}
    out = {"context_policy": policy, "context_per_pair": per_pair, "hint": "embedding" if hinted else None}
    if Policy(policy) is Policy.BOTH:
        out["context_measurements"] = k
    return out


def check_combination(model_dir: Path | str, answer: str | None, combination: Path | None = None) -> None:
    """Before a model loads: an `answer` that pools needs a combination file there (`--combination`,
    or the model directory's own); refused, naming how to make one, where there is none."""
    check_answer(answer)
    own = Path(model_dir) / CB.COMBINATION
    if answer in ("combined", "classical") and combination is None and not own.is_file():
        raise UsageError(f"--answer {answer}: no {CB.COMBINATION} in {model_dir}: "
                         + HOW_TO_FIT.format(run=model_dir, path=own) + ", or give --combination PATH")


def resolve(model_dir: Path | str, steps, answer: str | None = None, combination=None,
            option: str = "--combination") -> Predictor:
    """The `Predictor` of a model directory at `steps`: `answer` as asked (None: default),
    `combination` a combination.json path, a loaded `Combination`, False (none) or None (the
    model directory's own, RUN/combination.json or an export's copy, where it fits)."""
    check_answer(answer)
    model_dir = Path(model_dir)
    if answer == "model":  # the combination kept (a call may still ask for it), never refused for it
        try:
            return replace(resolve(model_dir, steps, None, combination, option), asked="model")
        except PingctlError as e:
            return Predictor("model", None, str(e), None)
    if combination is False:
        if answer is not None:
            raise UsageError(f"--answer {answer} pools with a combination; combination=False leaves it out")
        return Predictor(answer, None, "answering without a combination (combination=False)", None)
    own = model_dir / CB.COMBINATION
    if combination is None and not own.is_file():
        # no path in it: a run and its export answer alike
        why = f"no {CB.COMBINATION} with this model: " + HOW_TO_FIT.format(run="RUN", path="RUN/" + CB.COMBINATION)
        if answer is not None:
            raise UsageError(f"--answer {answer}: {why}, or give --combination PATH")
        return Predictor(answer, None, why, None)
    try:
        comb = combination if isinstance(combination, CB.Combination) else CB.load(
            own if combination is None else Path(combination), option)
    except PingctlError as e:
        if combination is not None or answer is not None:
            raise
        # the default file damaged: said with every answer, not a refusal of every question
        return Predictor(None, None, f"{e}; the model answers", None)
    if why := CB.mismatch(comb, model_dir, list(steps)):
        if answer is not None:
            raise UsageError(f"--answer {answer}: {why}; " + HOW_TO_FIT.format(run=model_dir, path=own))
        return Predictor(answer, None, why, None)
    # the hints only where a combination may use them: a run's answers read them for nothing else
    return Predictor(answer, comb, None, run_hints(model_dir))
