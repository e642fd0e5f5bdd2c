"""What a prompt is: its context policy, its sizes, its per-pair cap and whether it carries a
hint, decided once from a run's config and the user's options (`PromptSpec.from_run`) and then
read by eval, sample, score, the Python API and the service alike (docs/eval.md, "Context
policies"; docs/sample.md). Which measurements a policy picks is pingctl.context's business.

Policies (`Policy`): `probe` the probe's preceding measurements, `cold` the same without the
queried pair's own, `none` no context, `both` a triangulation context (the probe's measurements
to other destinations and the destination's from other sources), `pair` the pair's own history;
`stream` is `pingctl score`'s teacher-forced stream of each probe's rows. `fair` is not a
prompt but `eval --regimes`' choice of one per regime (FAIR_POLICIES).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path

from pingctl.artifacts import export
from pingctl.artifacts import run as R
from pingctl.errors import UsageError


class Policy(StrEnum):
    PROBE = "probe"
    COLD = "cold"
    NONE = "none"
    BOTH = "both"
    PAIR = "pair"
    STREAM = "stream"


# the policies pingctl.context picks measurements by: eval's and score's
POLICIES = (Policy.PROBE, Policy.COLD, Policy.NONE, Policy.BOTH, Policy.PAIR)
# `pingctl sample` and the Python API answer from a --context file: the probe's own rows, or
# a triangulation context from it
SAMPLE_POLICIES = (Policy.PROBE, Policy.BOTH)
# `pingctl score`: every picked policy, or each probe's rows as one stream
SCORE_POLICIES = (*POLICIES, Policy.STREAM)
# `eval --regimes --context-policy fair`: each regime's prompt carries what the classical
# predictor it is judged against reads: the pair's history for the time regime (the pair
# median), both ends' other measurements where the pair is unseen (the coordinate systems).
FAIR = "fair"
FAIR_POLICIES = {"time": Policy.PAIR, "pair": Policy.BOTH, "probe": Policy.BOTH, "target": Policy.BOTH}
CONTEXT_K = 16  # measurements a side of a `both` prompt where nobody said (sample, the API)


def parse_policy(text, allowed: tuple[Policy, ...] = POLICIES, option: str = "--context-policy") -> Policy:
    """`text` as a Policy among `allowed`; a UsageError naming `option` otherwise."""
    if isinstance(text, str) and text in tuple(allowed):
        return Policy(text)
    if is_fair(text) and tuple(allowed) == POLICIES:  # eval's policies: it has --regimes
        raise UsageError(f"{option} {FAIR} gives each regime its own prompt: it goes with --regimes")
    raise UsageError(f"{option} {text!r}: not a context policy here; expected one of {', '.join(allowed)}")


def is_fair(policy) -> bool:
    """`fair`: not one prompt but each regime's own (`regime_policies`)."""
    return policy == FAIR


def regime_policies(policy: str, regimes) -> dict[str, Policy]:
    """The policy of each regime's prompts: FAIR_POLICIES under `fair`, else `policy` for all."""
    if is_fair(policy):
        return {r: FAIR_POLICIES[r] for r in regimes}
    return dict.fromkeys(regimes, parse_policy(policy))


def check_sides(policy: str, context_dst: int | None, hints: bool | None) -> None:
    """--context-dst and --hints shape `both` prompts (under `fair`, the held-out regimes'):
    refused with another policy, whose prompts have no destination side nor place for a hint."""
    two_sided = is_fair(policy) or parse_policy(policy) is Policy.BOTH
    if context_dst is not None and not two_sided:
        raise UsageError(f"--context-dst is the destination side of --context-policy both (this eval: {policy})")
    if hints and not two_sided:
        raise UsageError(f"--hints go into `both` prompts (--context-policy both, or fair with --regimes); "
                         f"this eval's are {policy}")


def per_pair_cap(loader, policy: Policy, requested: int | None = None) -> int:
    """Measurements of one (src, dst) pair a prompt may hold (0 = no cap): `requested`, else as
    the run's training contexts were shaped: `loader.triangulation_per_pair` (per side) for
    `both`, `loader.max_per_pair` otherwise. A pair-history prompt is all one pair, so no cap
    applies to it."""
    if policy is Policy.PAIR:
        return 0
    if requested is not None:
        return requested
    return loader.triangulation_per_pair if policy is Policy.BOTH else loader.max_per_pair


def carries_hint(loader, policy: Policy, use: bool | None = None) -> bool:
    """Whether prompts of `policy` carry the embedding's estimate: `use` None: when the run was
    trained with hints (`loader.hints_file`), in `both` prompts, the only ones it was trained
    with them in (a pair-history prompt holds the pair already). `use` True for a run trained
    without them is refused: its prompts have no place for an estimate."""
    if use is False or policy is not Policy.BOTH:
        return False
    trained_with = bool(loader.hints_file)  # the config refuses hints without triangulation
    if use and not trained_with:
        raise UsageError("--hints: this run was trained without them (loader.hints_file); its prompts have no "
                         "place for an estimate")
    return trained_with


def trained_config(run: Path | str):
    """`run_config` of a model directory, read once while its config file is unchanged: every
    answer of a service reads the run's prompt rules, and a config's read and validation cost
    tens of milliseconds."""
    path = Path(run).resolve()
    stamp = []
    for name in (R.CONFIG, export.CONFIG):
        try:
            st = (path / name).stat()
            stamp.append((st.st_mtime_ns, st.st_size))
        except OSError:
            stamp.append(None)
    return _config(path, tuple(stamp))


@functools.lru_cache(maxsize=16)
def _config(path: Path, _stamp: tuple):
    return R.run_config(path)


@dataclass(frozen=True)
class PromptSpec:
    """One prompt shape. `context`: measurements it holds (for `both`, of the source side);
    `context_dst`: the destination side of `both` (None for the others); `cap`: at most this
    many measurements of one pair (0 = no cap; for `both`, per side); `hint`: it carries the
    embedding's estimate of the queried pair."""

    policy: Policy
    context: int
    context_dst: int | None = None
    cap: int = 0
    hint: bool = False

    @classmethod
    def from_run(cls, run_cfg, *, policy: str = Policy.PROBE, context: int = CONTEXT_K, context_dst: int | None = None,
                 per_pair: int | None = None, hints: bool | None = None,
                 allowed: tuple[Policy, ...] = POLICIES) -> PromptSpec:
        """The prompt a run (`run_cfg`: its resolved Config) is asked with under the user's
        options: `per_pair` None and `hints` None mean as the run was trained."""
        pol = parse_policy(policy, allowed)
        if per_pair is not None and per_pair < 0:
            raise UsageError(f"--context-per-pair must be >= 0 (0 = no cap), got {per_pair}")
        loader = run_cfg.loader
        dst = (context if context_dst is None else context_dst) if pol is Policy.BOTH else None
        return cls(pol, context, dst, per_pair_cap(loader, pol, per_pair), carries_hint(loader, pol, hints))

    @classmethod
    def for_model(cls, run: Path | str, **options) -> PromptSpec:
        """`from_run` of a model directory's config (`trained_config`)."""
        return cls.from_run(trained_config(run), **options)

    @property
    def two_sided(self) -> bool:
        """A triangulation context: both ends of the query, never the pair itself."""
        return self.policy is Policy.BOTH

    @property
    def uses_pair_history(self) -> bool:
        """The pair's own earlier measurements and nothing else."""
        return self.policy is Policy.PAIR

    @property
    def probe_history(self) -> bool:
        """The probe's preceding measurements, the queried pair's own among them (`probe`)."""
        return self.policy is Policy.PROBE

    @property
    def has_context(self) -> bool:
        """Whether the prompt holds earlier measurements at all (what prompt-reading baselines read)."""
        return self.policy is not Policy.NONE

    @property
    def streamed(self) -> bool:
        """`pingctl score`'s teacher-forced stream of each probe's rows instead of a prompt per row."""
        return self.policy is Policy.STREAM

    @property
    def tokens_cap(self) -> int:
        """The per-pair cap the prompt's tokens are cut to: a `both` context was capped per side
        when its measurements were picked, so its prompt keeps every one."""
        return 0 if self.two_sided else self.cap

    def describe(self) -> dict:
        """The prompt as reports, predictions' metadata and calibration maps record it."""
        out = {"context_policy": str(self.policy), "context_measurements": self.context, "context_per_pair": self.cap}
        if self.context_dst is not None:
            out["context_dst"] = self.context_dst
        if self.hint:
            out["hint"] = "embedding"
        return out
