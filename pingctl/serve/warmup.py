"""The warm-up of `pingctl serve`: the model asked, through `pingctl.api.Model`, the questions
whose shapes the batcher will send, before `/health` says ready.

A forward pass runs jitted at a fixed [batch, length] shape; the first call at a new shape
compiles it (seconds each on a CPU), and the first large batch of long prompts also builds the
model's shared key-value cache. A fresh service that met them under load made every request of
its first burst wait on them (32 requests with 24 context measurements each: 20-60 s). So the
worker asks, before anything else, RTT questions at each batch size the batcher gathers (1
pair, and a full batch) and with contexts that fill each prompt length up to the model's
context, exact and not; and one completion, search and scoring (on the NumPy engine, which
compiles nothing, only the questions without context). Documentation addresses
(192.0.2.0/24, 198.51.100.0/24, 203.0.113.0/24): what matters is their token counts.
"""

from __future__ import annotations

import time

from pingctl.api import Context, Model
from pingctl.serve import answers as A
from pingctl.tokenizer import Measurements

T0 = 1_704_067_200  # 2024-01-01: context rows lie in a canonical row's time range
TOKENS_PER_MEASUREMENT = 8  # fewer than a context measurement takes in a prompt: `levels` reaches a full one


def _dst(j: int) -> str:
    return f"198.51.100.{1 + j}" if j < 250 else f"203.0.113.{1 + (j - 250) % 250}"


def _pairs(n: int) -> list[dict]:
    return [{"src": "192.0.2.1", "dst": _dst(j)} for j in range(n)]


def _context(n: int) -> Context:
    """`n` measurements of the source 192.0.2.1 to one destination (so `context_per_pair`
    decides how many a prompt holds)."""
    m = Measurements.from_fields(["192.0.2.1"] * n, ["203.0.113.200"] * n, [10.0 + k % 50 for k in range(n)],
                                 [T0 + 60 * k for k in range(n)])
    return Context.load(m)


def levels(seq_len: int) -> list[int]:
    """Context measurements per prompt that take prompts across every length bucket up to
    seq_len: 0, 1, 2, 4, ... and more than a prompt holds (`warm` stops once one is full)."""
    most = max(1, (seq_len - 64) // TOKENS_PER_MEASUREMENT + 1)
    out, c = [0], 1
    while c < most:
        out.append(c)
        c *= 2
    return [*out, most]


def warm(model: Model, max_batch: int, seq_len: int, forward_batch: int, log=lambda msg: None) -> dict:
    """Ask the questions (on the caller's thread: the batcher's worker); {calls, seconds, shapes}."""
    t0 = time.perf_counter()
    full = max(1, min(max_batch, forward_batch))
    # Nothing compiles on an engine like NumPy's: the shapes without context load BLAS and its
    # buffers; each context level would cost seconds of forward passes and buy nothing.
    deepest = levels(seq_len) if model.loaded.compiles else [0]
    ctx = _context(deepest[-1]) if deepest[-1] else None
    calls, held, shown = 0, [], -1
    for c in deepest:
        # one pair is exact by default (as `pingctl sample --src --dst`), so concurrent one-pair
        # clients gather full exact batches as often as many-pair requests gather lazy ones
        for n, exact in ((1, False), (full, False), (1, True), (full, True)):
            p = model.rtt_many(_pairs(n), context=ctx if c else None, context_per_pair=c if c else None, exact=exact)
            calls += 1
            if n == 1 and not exact:
                shown = p.table.column("context_measurements")[0].as_py()
                if held and shown == held[-1]:
                    break  # the prompt was full already: a longer context asks the same shapes
        if held and shown == held[-1]:
            break
        held.append(shown)
        log(f"warm-up: prompts with {shown} context measurements ({time.perf_counter() - t0:.1f} s)")
    model.complete("192.0.2.1", "198.51.100.*")
    calls += 1
    if model.searches:
        model.search("192.0.2.1", "10-30")
        calls += 1
    n = 8
    model.score(A.canonical_table(["192.0.2.1"] * n, ["198.51.100.1"] * n, [T0 + 60 * k for k in range(n)],
                                  [20.0] * n, [1] * n))
    calls += 1
    return {"calls": calls, "seconds": round(time.perf_counter() - t0, 2), "context_measurements": held,
            "batch_sizes": sorted({1, full})}
