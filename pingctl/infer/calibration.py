"""Recalibrating the model's RTT distributions from held-out PIT values.

A model that has begun to memorise its training pairs puts too little mass in its tails: on
held-out pairs its central intervals can hold far fewer of the actual RTTs than they claim
(docs/eval.md, "Recalibrated intervals"). Quantile recalibration (Kuleshov, Fenner & Ermon, ICML 2018)
mends that after training without touching the model. Read the model's CDF F at the actual
RTT of held-out packets (the PIT); a calibrated model's PITs are uniform. With H the
empirical CDF of those PITs, H(F(x)) is calibrated on packets like them. H is monotone, so
H∘F is a CDF on the same codes: quantiles, mean, histogram and PIT all follow from it, and
P(failure) is untouched.

`pingctl eval` fits H on the packets it scores and writes it as calibration.json;
`pingctl eval --calibration` and `pingctl sample --calibration` apply one fitted on *other*
packets (the val split), for the same run, checkpoint and prompt shape.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from pingctl.artifacts import export as EX
from pingctl.atomic import write_json
from pingctl.errors import PingctlError, UsageError
from pingctl.infer.queries import RttDistribution
from pingctl.prompt import Policy

GRID = np.linspace(0.0, 1.0, 101)  # H is stored at these levels: the PIT percentiles
MIN_PACKETS = 30  # below this the percentiles are mostly noise
KIND = "pingctl.rtt-recalibration"
# what a map is specific to: applied under other values it would correct the wrong error
PROMPT_KEYS = ("context_policy", "context_measurements", "context_per_pair", "hint")


@dataclass(frozen=True)
class Calibration:
    """H as knots: knots[i] is the GRID[i]-quantile of the fitting PITs (0 and 1 at the ends,
    strictly increasing), so H(u) = interp(u, knots, GRID)."""

    knots: np.ndarray
    meta: dict = field(default_factory=dict)
    path: str | None = None

    def level(self, u):
        """H: a raw CDF level -> the calibrated one."""
        return np.interp(u, self.knots, GRID)

    def raw_level(self, q):
        """H^-1: the raw level at which the model's quantile is the calibrated q-quantile."""
        return np.interp(q, GRID, self.knots)

    def apply(self, d):
        """The RttDistribution with CDF H∘F (same codes, same P(failure))."""
        cdf = self.level(np.minimum(np.cumsum(d.probs), 1.0))
        probs = np.diff(cdf, prepend=0.0).clip(min=0.0)
        return RttDistribution(d.p_fail, d.codes, d.values_ms, probs / probs.sum())

    def fitted_on_text(self) -> str:
        """The split(s) it was fitted on, for a reader: several joined by " + "."""
        return " + ".join(fitted_on(self))

    def to_json(self) -> dict:
        return {"kind": KIND, "levels": GRID.tolist(), "knots": self.knots.tolist(), **self.meta}


def fit(pit, meta: dict) -> Calibration:
    """The map from the PITs of successful held-out packets (NaN = failed, skipped)."""
    u = np.asarray(pit, np.float64)
    u = u[np.isfinite(u)]
    if len(u) < MIN_PACKETS:
        raise UsageError(f"a calibration needs the PITs of at least {MIN_PACKETS} successful packets (got {len(u)})")
    knots = np.quantile(np.clip(u, 0.0, 1.0), GRID)
    knots[0], knots[-1] = 0.0, 1.0
    return Calibration(_strict(knots), {**meta, "packets": int(len(u))})


def _strict(knots: np.ndarray) -> np.ndarray:
    """Ties (many PITs at one value: an actual RTT on a code holding much mass) make H a step;
    a ramp of 1e-6 keeps both H and H^-1 functions, with the ends at exactly 0 and 1."""
    k = np.maximum.accumulate(np.asarray(knots, np.float64))
    return k * (1.0 - 1e-6) + GRID * 1e-6


def save(cal: Calibration, path: Path) -> Path:
    write_json(Path(path), cal.to_json())
    return Path(path)


def load(path: Path, option: str = "--calibration") -> Calibration:
    """A calibration.json that `pingctl eval` wrote; anything else is refused by name (messages
    start with `option` and the path)."""
    path = Path(path)
    where = f"{option} {path}".strip()
    try:
        raw = json.loads(path.read_text())
    except FileNotFoundError:
        raise UsageError(f"{where}: no such file (`pingctl eval` writes calibration.json "
                         "into its output directory)") from None
    except (OSError, ValueError) as e:
        raise PingctlError(f"{where}: not readable as JSON ({e})") from None
    if not isinstance(raw, dict) or raw.get("kind") != KIND:
        raise PingctlError(f"{where}: not a calibration written by `pingctl eval` "
                           f"(field kind is {raw.get('kind') if isinstance(raw, dict) else None!r}, expected {KIND!r})")
    try:
        levels = np.asarray(raw["levels"], np.float64)
        knots = np.asarray(raw["knots"], np.float64)
    except (KeyError, TypeError, ValueError) as e:
        raise PingctlError(f"{where}: field {e} missing or not a list of numbers") from None
    if levels.shape != GRID.shape or not np.allclose(levels, GRID):
        raise PingctlError(f"{where}: field levels is not the {len(GRID)}-point grid 0, 0.01, .., 1")
    if (knots.shape != GRID.shape or not np.isfinite(knots).all() or knots[0] != 0.0 or knots[-1] != 1.0
            or (np.diff(knots) <= 0).any()):
        raise PingctlError(f"{where}: field knots must be {len(GRID)} strictly increasing "
                           "numbers from 0 to 1")
    meta = {k: v for k, v in raw.items() if k not in ("kind", "levels", "knots")}
    return Calibration(knots, meta, str(path))


def is_calibration_file(path: Path) -> bool:
    """A JSON file that says it is a calibration (to be loaded, and refused if damaged)."""
    path = Path(path)
    if not (path.is_file() and path.suffix == ".json"):
        return False
    try:
        with open(path, errors="replace") as f:
            return KIND in f.read(4096)  # written with sorted keys: "kind" comes before the knots
    except OSError:
        return False


def describe(cal: Calibration) -> dict:
    """What `pingctl inspect` shows: what the map was fitted for, how the raw model covered
    those packets, and where each calibrated quantile is read from the model."""
    q = np.array([0.05, 0.25, 0.5, 0.75, 0.95])
    return {"kind": "calibration", "path": cal.path, **cal.meta, "fitted_on_text": cal.fitted_on_text() or None,
            "raw_coverage": {"cov50": float(cal.level(0.75) - cal.level(0.25)),
                             "cov90": float(cal.level(0.95) - cal.level(0.05)),
                             "below_median": float(cal.level(0.5))},
            "read_at": {f"p{round(100 * x)}": float(r) for x, r in zip(q, cal.raw_level(q))}}


def prompt_mismatch(cal: Calibration, has_context: bool) -> str | None:
    """Why a map may not fit a `pingctl sample` question (None if it does): one fitted on prompts
    with context describes other errors than a question without, and the reverse."""
    fitted_with = cal.meta.get("context_policy") != Policy.NONE and (cal.meta.get("context_measurements") or 0) > 0
    if fitted_with == has_context:
        return None
    if fitted_with:
        return (f"{cal.path} was fitted on prompts holding up to {cal.meta.get('context_measurements')} of the "
                f"probe's measurements (context policy {cal.meta.get('context_policy')}); this question has no "
                "--context, so its intervals may cover otherwise")
    return (f"{cal.path} was fitted on prompts without context (context policy none); this question has "
            "--context, so its intervals may cover otherwise")


def check_fits(cal: Calibration, run: Path, steps, prompt: dict | None = None, scored: Path | None = None) -> None:
    """Refuse a map fitted for another run or checkpoint, another prompt shape (the PROMPT_KEYS
    given in `prompt`), or on the very packets it would be judged on (`scored`)."""
    where = f"--calibration {cal.path}"
    # an export's weights are its source run's: a map fitted on that run fits the export too
    if not EX.fitted_for(str(cal.meta.get("run") or ""), run):
        raise UsageError(f"{where} was fitted for run {cal.meta.get('run')}, not {run}: "
                         "fit one for this run (`pingctl eval` on its val split writes it)")
    if list(cal.meta.get("steps") or []) != list(steps):
        raise UsageError(f"{where} was fitted for step(s) {cal.meta.get('steps')}, this model is step(s) {list(steps)}: "
                         "give the same --step, or fit one for this checkpoint")
    for k in (k for k in PROMPT_KEYS if k in (prompt or {})):
        if cal.meta.get(k) != prompt[k]:
            raise UsageError(f"{where} was fitted with {k} {cal.meta.get(k)!r}, this eval uses {prompt[k]!r}: "
                             "a map corrects the errors of one prompt shape; fit one with these options")
    if scored is not None and any(Path(p).resolve() == Path(scored).resolve() for p in fitted_on(cal)):
        raise UsageError(f"{where} was fitted on {scored}, the split being evaluated: its coverage there "
                         "would be calibrated by construction; fit it on the val split")


def fitted_on(cal: Calibration) -> list[str]:
    """The split(s) a map was fitted on: one path, or several for a map pooled over the held-out
    regimes' val sets (`eval --regimes`)."""
    f = cal.meta.get("fitted_on")
    return [] if not f else [str(p) for p in f] if isinstance(f, list) else [str(f)]


def for_model(model_dir: Path, steps, calibration=None) -> Calibration | None:
    """The map a loaded model answers with: `calibration` a calibration.json path (checked
    against the model's run and step(s)), False for none, None for the default: the map an
    exported model directory carries (`pingctl export --calibration`), else none."""
    if calibration is False:
        return None
    if calibration is None or calibration is True:
        carried = Path(model_dir) / EX.CALIBRATION
        if not (EX.is_export_dir(model_dir) and carried.is_file()):
            if calibration is True:
                raise UsageError(f"calibration=True: {model_dir} carries no {EX.CALIBRATION} (only an export made "
                                 "with `pingctl export --calibration` does); give a calibration.json path")
            return None
        calibration = carried
    cal = load(Path(calibration), "calibration")
    check_fits(cal, Path(model_dir), list(steps))
    return cal
