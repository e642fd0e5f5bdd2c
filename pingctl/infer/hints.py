"""The hint an answer's triangulation prompt carries, for a run trained with them
(`loader.hints_file`; docs/loader.md, "Hints"): the least-squares embedding's RTT estimate for the
pair, read from the hints file the run keeps (`artifacts.run.hints_path`, copied there when training
started; an export carries it too), an end it never saw placed from the prompt's measurements.
`eval` gives the same estimate from its own `embedding` baseline (pingctl/eval/hints.py).

A run trained with `loader.relative_target` answers a hinted prompt relative to the hint: `scales`
gives each prompt's scale, the hint as its code shows it (the loader's rule,
`tokenizer.relative.scale_of_hint`), which the distribution reads take (`queries.in_ms`)."""

from __future__ import annotations

import functools
from pathlib import Path

import numpy as np

from pingctl.artifacts.run import hints_path, run_config
from pingctl.infer import queries as Q
from pingctl.loader.hints import Hints
from pingctl.tokenizer import Measurements
from pingctl.tokenizer.relative import scale_of_hint

NONE = np.zeros(0, np.int32)


@functools.lru_cache(maxsize=8)
def _load(path: str, _mtime_ns: int) -> Hints:
    return Hints.load(path)


def run_hints(run: Path | str) -> Hints | None:
    """The hints a model directory's answers carry, or None (trained without them)."""
    path = hints_path(run)
    return None if path is None else _load(str(path.resolve()), path.stat().st_mtime_ns)


def hint(hints: Hints | None, src: str, dst: str, context: Measurements | None) -> tuple[np.ndarray, float | None]:
    """(the hint's tokens, its estimate in ms) for src -> dst after `context`, the prompt's
    measurements; (no tokens, None) without `hints` (`run_hints`: a run trained without them)
    or where no estimate can be made."""
    if hints is None:
        return NONE, None
    peers = [] if context is None else list(zip(context.src_text(), context.dst_text(), context.rtt_ms.tolist()))
    est = hints.answer(src, dst, peers)
    if not np.isfinite(est):
        return NONE, None
    return Q.hint_tokens(src, dst, est), est


def scales(run: Path | str, estimates) -> np.ndarray:
    """Per prompt, the scale its answer is read in (`queries.in_ms`): for a run trained with
    `loader.relative_target`, its hint as the hint's code shows it; NaN where the run answers in
    ms or the prompt holds no hint (an estimate of None or NaN: `hint` made no tokens)."""
    est = np.array([np.nan if e is None else e for e in estimates], np.float64)
    if not len(est) or np.isnan(est).all() or not run_config(run).loader.relative_target:
        return np.full(len(est), np.nan)
    return scale_of_hint(est)
