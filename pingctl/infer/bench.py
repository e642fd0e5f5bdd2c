"""`pingctl bench sample RUN`: what a trained run costs to ask, per question and per prompt length,
with each engine that can answer (light, and MaxText where it is installed).

Per engine, first `load` (LoadedModel.load in this process: the engine's imports, the weights,
the first engine's JAX import too) and `first answer` (one pair's exact distribution, without
context: the shapes compile), then the steady cases, each after an untimed warm-up of the same shapes (compilation is not timed):
- `forward BxLEN`: batched forward passes at one length bucket -> tokens/s (the unit every
  question is made of; each second-byte pass of a distribution is one such sequence).
- `lazy|exact, ctx C`: RTT distributions of synthetic pairs whose prompts
  hold C context measurements, read at the quantiles (`--pairs`' default, eval) or over every
  code (a single `--src/--dst` query, `--pairs --exact`) -> questions/s.
- `generate Nx4`: grammar-constrained streams of 4 measurements -> generated tokens/s.

The pairs and contexts are synthetic (documentation addresses, one probe): throughput does
not depend on what the model believes about them, only on the token counts.
"""

from __future__ import annotations

import time

import numpy as np

from pingctl.errors import UsageError
from pingctl.infer import queries as Q
from pingctl.tokenizer import Measurements


def _pairs(n: int) -> list[tuple[str, str]]:
    return [(f"192.0.2.{1 + i % 200}", f"198.51.100.{1 + (i * 7) % 250}") for i in range(n)]


def _context(model, measurements: int):
    """Tokens of `measurements` synthetic context measurements (fewer if the prompt is full)."""
    if measurements == 0:
        return np.zeros(0, np.int32), None
    rng = np.random.default_rng(0)
    t = 1_704_067_200 + np.cumsum(rng.integers(30, 300, measurements))
    m = Measurements.from_fields(["192.0.2.1"] * measurements,
                                 [f"198.51.100.{1 + i % 40}" for i in range(measurements)],
                                 rng.uniform(5, 200, measurements), [int(x) for x in t])
    return Q.context_tokens(model, m, model.seq_len - 64, timed=model.timestamps)


def _timed(fn, min_s: float = 0.5) -> float:
    """Seconds per call: after a warm-up call (it compiles the shapes the timed calls use), the
    mean over as many calls as fill `min_s` (one, for the slow cases)."""
    fn()
    n, t0 = 0, time.perf_counter()
    while True:
        fn()
        n += 1
        elapsed = time.perf_counter() - t0
        if elapsed >= min_s:
            return elapsed / n


def bench_engines(load, engines: list[str], queries: int, contexts: list[int], exact_queries: int, streams: int,
                  progress=lambda what: None) -> dict:
    """`bench_sample` for each engine in turn, one table with an `engine` column; `load(engine)`
    returns a LoadedModel. The first rows of each engine: its load and its first answer."""
    _check(queries, exact_queries, streams)
    table: list[dict] = []
    result: dict = {}
    for engine in engines:
        progress(f"{engine}: load")
        t0 = time.perf_counter()
        model = load(engine)
        loaded = time.perf_counter() - t0
        progress(f"{engine}: first answer")
        (a, b), = _pairs(1)
        t0 = time.perf_counter()
        Q.rtt_distributions(model, [Q.query_prefix(a, b, None, np.zeros(0, np.int32), None)])
        first = time.perf_counter() - t0
        once = {"prompt_tokens": None, "questions": 1, "per_s": None, "tokens_per_s": None}
        table += [{"engine": engine, "case": "load", **once, "seconds": round(loaded, 3)},
                  {"engine": engine, "case": "first answer", **once, "seconds": round(first, 3)}]
        result = bench_sample(model, queries, contexts, exact_queries, streams,
                              progress=lambda what, e=engine: progress(f"{e}: {what}"))
        table += [{"engine": engine, **row} for row in result["table"]]
        del model
    result["table"] = [{k: r[k] for k in ("engine", "case", "prompt_tokens", "questions", "seconds", "per_s",
                                          "tokens_per_s")} for r in table]
    result["engines"] = list(engines)
    result["notes"] = [*result.get("notes", []),
                       "load: LoadedModel.load in this process, the engine's imports included (the first "
                       "engine's includes JAX's); first answer: one exact distribution, its shapes compiled "
                       "(or read from JAX's persistent compilation cache)"]
    return result


def _check(queries: int, exact_queries: int, streams: int) -> None:
    if queries < 1 or exact_queries < 0 or streams < 0:
        raise UsageError("--queries must be >= 1, --exact-queries and --streams >= 0")


def bench_sample(model, queries: int, contexts: list[int], exact_queries: int, streams: int,
                 progress=lambda what: None) -> dict:
    _check(queries, exact_queries, streams)
    table: list[dict] = []
    for length in sorted({b for b in (64, 256, model.seq_len) if b <= model.seq_len}):
        progress(f"forward {length}")
        seqs = [np.zeros(length, np.int32)] * model.batch
        s = _timed(lambda seqs=seqs: model.log_probs(seqs, at=[np.array([length - 1])] * len(seqs)))
        table.append({"case": f"forward {model.batch}x{length}", "prompt_tokens": length, "questions": model.batch,
                      "seconds": round(s, 3), "per_s": round(model.batch / s, 2),
                      "tokens_per_s": int(model.batch * length / s)})
    pairs = _pairs(queries)
    for c in contexts:
        ctx, last = _context(model, c)
        prompts = [Q.query_prefix(a, b, None, ctx, last) for a, b in pairs]
        n_ctx = int((ctx == 0).sum())
        cases = [("lazy", prompts, Q.rtt_distributions_at)]
        if exact_queries:
            cases.append(("exact", prompts[:exact_queries], Q.rtt_distributions))
        for kind, ps, fn in cases:
            progress(f"{kind} distributions, context {n_ctx}")
            s = _timed(lambda ps=ps, fn=fn: fn(model, ps))
            table.append({"case": f"{kind}, ctx {n_ctx}", "prompt_tokens": int(len(ps[0])),
                          "questions": len(ps), "seconds": round(s, 3), "per_s": round(len(ps) / s, 2),
                          "tokens_per_s": None})
    if streams:
        progress("generate")
        rng = np.random.default_rng(0)
        out: list = []
        s = _timed(lambda: out.append(Q.generate(model, streams, 4, rng, timestamps=model.timestamps)))
        # tokens of the whole measurements returned (a measurement cut by the length limit is dropped)
        per_call = [int(sum((d.spans[:, 1] - d.spans[:, 0]).sum() for d in streams_)) for streams_ in out[1:]]
        tokens = sum(per_call) / len(per_call)  # the timed calls' mean; out[0] is the warm-up
        table.append({"case": f"generate {streams}x4", "prompt_tokens": 0, "questions": streams,
                      "seconds": round(s, 3), "per_s": round(streams / s, 2), "tokens_per_s": int(tokens / s)})
    return {
        "name": "sample",
        "table": table,
        "run": str(model.run),
        "step": model.step,
        "device": model.device,
        "engine": model.engine,
        "seq_len": model.seq_len,
        "batch": model.batch,
        "notes": [
            "per_s: questions (sequences, distributions, streams) per second, after an untimed warm-up; "
            "seconds: per call, the mean of as many calls as fill 0.5 s",
            "lazy: exact at P(failure) and the quantiles (pingctl eval, sample --pairs); "
            "exact: all 65,536 codes (a single --src/--dst query, --pairs --exact)",
            "second-byte passes share each prompt's key-value cache: with the light engine whenever a prompt "
            "has several candidate bytes, with MaxText in calls of >= 100,000 sequence tokens (a context, many "
            "prompts); PINGCTL_KV_CACHE=0: whole sequences, to compare",
        ],
    }
