"""A query's RTT relative to the scale its prompt carries (`loader.relative_target`; docs/loader.md,
"Hints", and docs/tokenizer.md, "Relative RTTs").

With it, a hinted triangulation context's query result is `rtt_ms * REF_MS / scale_ms` through the
same 2-byte codec, where `scale_ms` is the hint's RTT exactly as the prompt shows it: the decoded
value of the hint's own code (`scale_of_hint`). The loader encodes training queries with
`to_relative`; an answer reads the hint's estimate from its prompt, takes the same scale and maps
the distribution's values back with `to_absolute`. One rule for both sides, so what the model
learned and what an answer reads are the same numbers.

No scale (NaN: no hint, or a hint whose code decodes to 0 ms, which no ratio can be taken of)
leaves an RTT absolute; a failed result (RTT < 0) stays failed; a ratio above the codec's ceiling
clamps there, as any RTT does (`rtt_codec.token_codes`).
"""

from __future__ import annotations

import numpy as np

from pingctl.tokenizer.rtt_codec import decode_rtt, token_codes

# The scale a hint's RTT maps to: a query as long as its hint reads 100 ms, where the codec keeps
# 1/2048 relative precision; ratios from about 0.01 to 1341 (the ceiling, 134 s) keep it too.
REF_MS = 100.0


def scale_of_hint(hint_ms) -> np.ndarray:
    """The scale (ms) each hint gives its query: the decoded value of the hint's token code, the
    RTT the prompt shows; NaN where there is no hint (NaN, negative) or its code is 0 ms."""
    h = np.asarray(hint_ms, np.float64)
    shown = decode_rtt(token_codes(np.where(np.isfinite(h) & (h >= 0), h, 0.0).reshape(-1))).reshape(h.shape)
    return np.where(np.isfinite(h) & (h >= 0) & (shown > 0), shown, np.nan)


def has_scale(scale_ms) -> np.ndarray:
    """Where a scale applies (finite and above 0; `scale_of_hint` gives NaN elsewhere)."""
    s = np.asarray(scale_ms, np.float64)
    return np.isfinite(s) & (s > 0)


def to_relative(rtt_ms, scale_ms) -> np.ndarray:
    """`rtt_ms * REF_MS / scale_ms` where a scale applies and the result succeeded (>= 0); the RTT
    itself elsewhere (absolute, failed (< 0) or NaN as given)."""
    r = np.asarray(rtt_ms, np.float64)
    s = np.asarray(scale_ms, np.float64)
    on = has_scale(s) & (r >= 0)
    with np.errstate(over="ignore", invalid="ignore", divide="ignore"):  # only `on` is kept
        return np.where(on, r * (REF_MS / np.where(on, s, 1.0)), r)


def to_absolute(values_ms, scale_ms) -> np.ndarray:
    """Relative values back in ms: `values_ms * scale_ms / REF_MS` where a scale applies, the
    values themselves elsewhere (an unscaled prompt's answer was absolute already)."""
    v = np.asarray(values_ms, np.float64)
    s = np.asarray(scale_ms, np.float64)
    on = has_scale(s)
    return np.where(on, v * (np.where(on, s, REF_MS) / REF_MS), v)
