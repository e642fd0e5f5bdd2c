"""Small measuring helpers for `pingctl bench` (no timing assertions live in tests)."""

from __future__ import annotations

import resource
import time
from contextlib import contextmanager


def peak_rss_mb(children: bool = False) -> float:
    """Peak resident set size of this process (or of its waited-for children), MB."""
    who = resource.RUSAGE_CHILDREN if children else resource.RUSAGE_SELF
    return resource.getrusage(who).ru_maxrss / 1024.0  # Linux reports KiB


@contextmanager
def timer():
    box = {"s": 0.0}
    t0 = time.perf_counter()
    try:
        yield box
    finally:
        box["s"] = time.perf_counter() - t0
