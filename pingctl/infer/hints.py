"""The hint an answer's triangulation prompt carries, for a run trained with them
(`loader.hints_file`; docs/loader.md, "Hints"): the least-squares embedding's RTT estimate for the
pair, read from the hints file the run keeps (`artifacts.run.HINTS`, copied there when training
started; an export carries it too), an end it never saw placed from the prompt's measurements.
`eval` gives the same estimate from its own `embedding` baseline (pingctl/eval/hints.py)."""

from __future__ import annotations

import functools
from pathlib import Path

import numpy as np

from pingctl.artifacts.run import HINTS, run_config
from pingctl.errors import PingctlError
from pingctl.infer import queries as Q
from pingctl.loader.hints import Hints
from pingctl.tokenizer import Measurements

NONE = np.zeros(0, np.int32)


@functools.lru_cache(maxsize=8)
def _load(path: str, _mtime_ns: int) -> Hints:
    return Hints.load(path)


def run_hints(run: Path | str) -> Hints | None:
    """The hints a model directory's answers carry, or None (trained without them)."""
    cfg = run_config(run)
    if not cfg.loader.hints_file:
        return None
    path = Path(run) / HINTS
    if not path.is_file():
        raise PingctlError(f"{run} was trained with hints (loader.hints_file {cfg.loader.hints_file}) but holds no "
                           f"{HINTS}, which its answers read: copy that file to {path}")
    return _load(str(path.resolve()), path.stat().st_mtime_ns)


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
