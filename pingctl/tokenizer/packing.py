"""Greedy cutting of time-ordered histories into contexts of at most `seq_len` tokens.

The first timestamped measurement of a context must be absolute (compact), so a
measurement's length depends on where the context starts; this works from two precomputed
lengths (as a delta, as an absolute) and one `searchsorted` per context.
"""

from __future__ import annotations

import numpy as np

from pingctl.tokenizer import compact
from pingctl.tokenizer.api import measurement_lengths
from pingctl.tokenizer.measurements import Measurements


def pack_contexts(m: Measurements, scheme: str, seq_len: int, group_starts=None) -> np.ndarray:
    """Indices where contexts start: greedy, never across a group boundary (e.g. a new probe).

    A single measurement longer than seq_len gets a context of its own.
    """
    n = len(m)
    if n == 0:
        return np.zeros(0, np.int64)
    groups = np.unique(np.concatenate([[0], np.asarray(group_starts if group_starts is not None else [], np.int64)]))
    group_end = np.append(groups[1:], n)
    lengths = measurement_lengths(m, scheme, context_starts=groups)
    extra = np.zeros(n, np.int64)
    if scheme == "compact":
        kind, _ = compact.time_kinds(m, groups)
        extra = np.where(m.has_time, compact.TIME_LEN[compact.ABS] - compact.TIME_LEN[kind], 0)
    cum = np.zeros(n + 1, np.int64)
    np.cumsum(lengths, out=cum[1:])
    # next timestamped measurement at or after i (n if none)
    timed = np.where(m.has_time, np.arange(n), n)
    next_timed = np.minimum.accumulate(timed[::-1])[::-1]
    starts = []
    for gs, ge in zip(groups.tolist(), group_end.tolist()):
        s = gs
        while s < ge:
            starts.append(s)
            f = int(next_timed[s])
            e = int(np.searchsorted(cum, cum[s] + seq_len, "right")) - 1
            if f < min(e, ge):
                e_abs = int(np.searchsorted(cum, cum[s] + seq_len - extra[f], "right")) - 1
                e = max(e_abs, f)
            e = max(min(e, ge), s + 1)
            s = e
    return np.asarray(starts, np.int64)
