"""The classical predictors eval scores, by report name: one registry that the report
(`default_baselines`, `prompt_baselines`), `eval --regimes` (`candidates`) and the table in
docs/eval.md read. Adding a baseline is one `register(Spec(...))` line:

    register(Spec("my_median", lambda seed, cycles: MyMedian(seed=seed), predicts_failure=True,
                  regimes={"time": 1}, doc="..."))

Two kinds: a `Baseline` is fitted on the train split and predicts test packets (`fit`,
`predict`); a prompt baseline reads what the model's prompts hold (`reads_prompt=True`) and is
scored only beside the model (report.add_prompt_baselines): either a `PromptPredictor`
(`factory`) or the refit of a fitted `Refittable` baseline to the hosts train never saw
(`refit_of`), or one the model's side computes from the prompt itself (`by_model`).
"""

from __future__ import annotations

import inspect
import time
from dataclasses import dataclass, field
from typing import Callable, Mapping, Protocol, runtime_checkable

import numpy as np

from pingctl.artifacts.table import REGIMES
from pingctl.eval.baselines import (GlobalMedian, PairMedian, Prediction, Prefix16Median, PrefixMedian,
                                    PromptMedian, SharedFits)
from pingctl.eval.embedding import Embedding
from pingctl.eval.hints import embedding_with_hints
from pingctl.eval.vivaldi import Vivaldi
from pingctl.loader.hints import Hints
from pingctl.prompt import Policy


@runtime_checkable
class Baseline(Protocol):
    """Fitted on the train split dict, predicts a split dict's packets."""

    def fit(self, train: dict) -> "Baseline": ...

    def predict(self, test: dict) -> Prediction: ...


@runtime_checkable
class Refittable(Baseline, Protocol):
    """A coordinate baseline that can place a host train never saw (baselines.refit_prediction)."""

    trained: np.ndarray  # bool per host code: placed by the train split

    def codes(self, addresses) -> np.ndarray: ...

    def distance(self, a: np.ndarray, b: np.ndarray) -> np.ndarray: ...

    def refit(self, host, peer, rtt, n_new: int, times=None): ...


class PromptPredictor(Protocol):
    """Predicts from the prompts' measurements (`pool` rows `contexts[k]` for query k), falling
    back to `fallback` (the global median's Prediction)."""

    def predict(self, pool: dict, test: dict, contexts, fallback: Prediction) -> Prediction: ...


@dataclass(frozen=True)
class Spec:
    """One registered baseline. `factory(seed, vivaldi_cycles)` makes it unfitted (None for a
    refit, which reuses the fitted `refit_of`). `regimes`: the regimes (time, pair, probe,
    target) where it is a candidate for the baseline the model is judged against, with its rank
    among the candidates (lower first; the first is taken unless val chooses); `probe_regimes`
    likewise under the `probe` context policy (whose prompts hold the queried pair's own
    packets), where it replaces `regimes`' candidates."""

    name: str
    factory: Callable[[int, int], object] | None
    doc: str
    predicts_failure: bool = False
    reads_prompt: bool = False
    refit_of: str | None = None
    by_model: bool = False  # made by eval.model from the prompt itself (scored by eval.run)
    regimes: Mapping[str, int] = field(default_factory=dict)
    probe_regimes: Mapping[str, int] = field(default_factory=dict)


REGISTRY: dict[str, Spec] = {}


def register(spec: Spec) -> Spec:
    """Add (or replace) a baseline; registry order is report order."""
    if unknown := set(spec.regimes) - set(REGIMES) or set(spec.probe_regimes) - set(REGIMES):
        raise ValueError(f"{spec.name}: unknown regime(s) {sorted(unknown)}; regimes are {', '.join(REGIMES)}")
    if sum((spec.factory is not None, spec.refit_of is not None, spec.by_model)) != 1:
        raise ValueError(f"{spec.name}: give one of a factory, the baseline it refits (refit_of) or by_model")
    REGISTRY[spec.name] = spec
    return spec


def unregister(name: str) -> None:
    REGISTRY.pop(name, None)


def default_baselines(seed: int = 0, vivaldi_cycles: int = 1000) -> dict[str, Baseline]:
    """The baselines fitted on train, unfitted, by report name (registry order)."""
    return {s.name: s.factory(seed, vivaldi_cycles) for s in REGISTRY.values() if not s.reads_prompt}


def fit_baselines(train: dict, seed: int = 0, vivaldi_cycles: int = 1000, hints: Hints | None = None,
                  shared: SharedFits | None = None) -> tuple[dict[str, Baseline], dict]:
    """`default_baselines` fitted on `train`, and each one's fit time (s; work they share is
    counted where it is first done). `hints`: the run's hints file, whose every-pair fit is the
    `embedding` baseline where it was fitted on this train split (`fit_one`). `shared`: what
    they share, where the caller reads it after (`SharedFits.of`)."""
    fitted, fit_s, shared = {}, {}, SharedFits.of(train, shared)
    baselines = default_baselines(seed, vivaldi_cycles)
    # a fit whose transients are the largest (`fit_first`) runs before the others' fitted state
    # is held beside train, so the two do not add up (a day's 64M rows: ~1.2 GB of sketches)
    for name in sorted(baselines, key=lambda n: not getattr(baselines[n], "fit_first", False)):
        t = time.perf_counter()
        fitted[name] = fit_one(baselines[name], train, shared, hints)
        fit_s[name] = round(time.perf_counter() - t, 3)
    return {n: fitted[n] for n in baselines}, {n: fit_s[n] for n in baselines}


def fit_one(b: Baseline, train: dict, shared: SharedFits, hints: Hints | None = None) -> Baseline:
    """`b.fit(train)`, sharing `shared` (made for `train`) where its `fit` takes it: the levels,
    codes and global medians the baselines have in common are computed once. An `Embedding`
    with `hints` is read from the file where the file was fitted on this train split
    (`eval.hints.embedding_with_hints`). The same fits as each baseline fitted alone."""
    if hints is not None and isinstance(b, Embedding):
        return embedding_with_hints(b, train, hints, shared)
    if "shared" in inspect.signature(b.fit).parameters:
        return b.fit(train, shared=shared)
    return b.fit(train)


def prompt_baselines() -> list[Spec]:
    """The baselines that read the model's prompts, in registry order."""
    return [s for s in REGISTRY.values() if s.reads_prompt and not s.by_model]


def candidates(regime: str, policy: str) -> tuple[str, ...]:
    """The baselines `regime` may be judged against under context `policy`, best-ranked first."""
    ranks = {}
    if policy == Policy.PROBE:
        ranks = {s.name: s.probe_regimes[regime] for s in REGISTRY.values() if regime in s.probe_regimes}
    if not ranks:
        ranks = {s.name: s.regimes[regime] for s in REGISTRY.values() if regime in s.regimes}
    return tuple(sorted(ranks, key=ranks.get))


for _spec in (
    Spec("global_median", lambda seed, _c: GlobalMedian(seed=seed), "the median of every train packet of the "
         "address family", predicts_failure=True),
    Spec("prefix_median", lambda seed, _c: PrefixMedian(seed=seed), "the median of the (/24, /24) "
         "(IPv6: /48) network pair, else global", predicts_failure=True),
    Spec("prefix16_median", lambda seed, _c: Prefix16Median(seed=seed), "the same for /16 (IPv6: /32) "
         "networks, else global", predicts_failure=True),
    Spec("pair_median", lambda seed, _c: PairMedian(seed=seed), "the pair's own median, else /24, /16, global",
         predicts_failure=True, regimes={"time": 0}),
    Spec("vivaldi", lambda seed, cycles: Vivaldi(cycles=cycles, seed=seed), "hashicorp/serf's Vivaldi "
         "coordinates, else global", regimes={"pair": 1}),
    Spec("embedding", lambda seed, _c: Embedding(seed=seed), "least-squares embedding with heights on log "
         "RTT, else global", regimes={"pair": 0}),
    Spec("prompt_median", lambda seed, _c: PromptMedian(seed=seed), "the prompt's measurements of the pair, "
         "else of its /24|/48, else /16|/32 networks, else global", predicts_failure=True, reads_prompt=True,
         probe_regimes={"pair": 0, "probe": 0, "target": 0}),
    Spec("vivaldi_refit", None, "vivaldi, with an end train never saw placed from the prompt",
         reads_prompt=True, refit_of="vivaldi"),
    Spec("embedding_refit", None, "embedding, with an end train never saw placed from the prompt",
         reads_prompt=True, refit_of="embedding", regimes={"probe": 0, "target": 0}),
    Spec("context_median", None, "the prompt's packets of the same pair (`probe` policy only), else global",
         predicts_failure=True, reads_prompt=True, by_model=True),
):
    register(_spec)
