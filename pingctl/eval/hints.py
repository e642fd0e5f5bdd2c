"""Fitting the hints file the loader reads (`pingctl.loader.hints`, docs/loader.md "Hints"), and
the estimates eval's prompts carry.

`fit_hints` cuts the training split's pairs into folds (`loader.hints.fold_of`) and fits one
`Embedding` per fold on the other folds' pairs, with the eval baseline's settings, so a training
query's estimate is as good as a held-out pair's; then one on every pair, the eval baseline's own
fit, which `sample` and the Python API read (`loader.hints.Hints.answer`). `prompt_hints` is the
estimate an eval prompt carries: the `embedding` baseline fitted on `--train`, an end it never saw
placed from the prompt (`embedding_refit`). `embedding_with_hints` is that baseline read from the
file where the file says it was fitted on the same train split with the same settings (its
`PROVENANCE` and pairs), instead of fitted again."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np

from pingctl.artifacts.split_codes import SplitCodes, read_split_codes
from pingctl.atomic import atomic_file
from pingctl.errors import PingctlError
from pingctl.processes import die_with_parent
from pingctl.schema.arrow_strings import codes_in, vocabulary
from pingctl.eval.baselines import SKETCH, SharedFits, column, refit_prediction
from pingctl.eval.embedding import Embedding, measured, measured_pair_medians
from pingctl.loader.hints import KEY_BYTES, Hints, fold_of
from pingctl.tokenizer.measurements import parse_addresses

FOLDS = 5


def fit_hints(train: dict, out: Path | str, folds: int = FOLDS, seed: int = 0, progress=lambda done, total: None,
              workers: int = 1) -> dict:
    """Write the hints file of `train` (a `load_split` dict) to `out`; returns what it holds."""
    vocab = vocabulary(column(train, "src"), column(train, "dst"))
    a, b = codes_in(column(train, "src"), vocab), codes_in(column(train, "dst"), vocab)
    rtt = np.asarray(column(train, "rtt"), np.float64)
    ok = measured(a, b, rtt)
    return _fit_and_write(SplitCodes(vocab, a[ok], b[ok], rtt[ok], len(rtt)), out, folds, seed, progress, workers)


def fit_hints_split(split, out: Path | str, folds: int = FOLDS, seed: int = 0, progress=lambda done, total: None,
                    workers: int | None = None) -> dict:
    """`fit_hints` of the split at `split` (canonical Parquet, as `load_split` takes it), read as
    address codes a batch at a time (`artifacts.split_codes`): the same file, in a fraction of
    the memory. `workers`: processes fitting at once (None: one per core, at most folds + 1)."""
    codes = read_split_codes(split, keep=measured, split_hint="train")
    if not codes.rows:
        raise PingctlError(f"{split}: no rows to fit the embedding on")
    return _fit_and_write(codes, out, folds, seed, progress, workers)


def _fit_and_write(codes: SplitCodes, out, folds: int, seed: int, progress, workers) -> dict:
    """The hints file of the rows `measured` kept (`codes`, whose rows are dropped once their
    pairs' medians are taken: the fits need the pairs only)."""
    if folds < 2:
        raise ValueError(f"folds must be at least 2 (a pair's estimate comes from the folds without it), got {folds}")
    n, measurements = len(codes.vocab), codes.rows
    keys = _address_keys(codes.vocab)
    pa_, pb_, med = measured_pair_medians(codes.a, codes.b, codes.rtt, n)
    codes.a = codes.b = codes.rtt = None
    # a pair's measurements all share its fold, so a fold's fit takes the medians of the pairs
    # outside it: the same numbers as the medians of their measurements, with one sort of them all
    pair_fold = fold_of(pa_, pb_, folds)
    fits = _fits(pa_, pb_, med, n, pair_fold, folds, seed, progress, workers)
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    with atomic_file(out) as tmp:
        with open(tmp, "wb") as fh:
            np.savez(fh, keys=keys, x=np.stack([f["x"] for f in fits]), h=np.stack([f["h"] for f in fits]),
                     trained=np.stack([f["trained"] for f in fits]),
                     scale=np.asarray([f["scale"] for f in fits], np.float64),
                     pair_a=pa_.astype(np.int32), pair_b=pb_.astype(np.int32), pair_median=med,
                     fit_seed=np.int64(seed), fit_rows=np.int64(measurements),
                     fit_settings=_settings(Embedding(seed=seed)))
    info = [f["fit_info"] for f in fits[:folds]]
    err = np.concatenate([f["err"] for f in fits[:folds]]) if len(med) else None
    return {"path": str(out), "nodes": n, "folds": folds, "measurements": int(measurements),
            "pairs": [i["pairs"] for i in info], "train_pairs": int(len(med)),
            "train_median_rel_err": [i["train_median_rel_err"] for i in info],
            # what a hint is worth: each pair's estimate against its median RTT (NaN: an end unplaced)
            "estimate_median_rel_err": float(np.nanmedian(err)) if len(med) else None,
            "estimated_share": float(np.isfinite(err).mean()) if len(med) else None}


def _address_keys(vocab) -> np.ndarray:
    """The file's `keys` of a sorted string vocabulary: each address's bytes and family."""
    import pyarrow as pa

    addr, v6 = parse_addresses(pa.array(vocab.to_pylist(), pa.string()), "train addresses")
    keys = np.concatenate([addr, np.asarray(v6, np.uint8)[:, None]], axis=1)
    assert keys.shape[1] == KEY_BYTES
    return keys


def _settings(e: Embedding) -> np.ndarray:
    """PROVENANCE's fit_settings of an embedding."""
    return np.array([e.steps, e.lr, e.min_rtt_ms], np.float64)


def _fits(pa_, pb_, med, n: int, pair_fold, folds: int, seed: int, progress, workers: int | None) -> list[dict]:
    """The folds' fits, then the answer-time one on every pair (what a prompt of a pair train
    never saw carries), in that order. Each in a process of its own where `workers` > 1 (None:
    one per core, where the fits are large enough to pay for starting processes): the fits are
    independent and each deterministic, so the numbers are those of one after another."""
    held = [pair_fold == k for k in range(folds)] + [np.zeros(len(med), bool)]
    args = [(pa_[~h], pb_[~h], med[~h], pa_[h], pb_[h], med[h], n, seed) for h in held]
    if workers is None:
        cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
        workers = cores if len(med) >= _PARALLEL_PAIRS else 1
    workers = min(max(int(workers), 1), len(args))
    progress(0, len(args))
    if workers == 1:
        fits = []
        for i, arg in enumerate(args):
            fits.append(_fit_one(*arg))
            progress(i + 1, len(args))
        return fits
    return _fit_in_processes(args, workers, progress)


# pairs below which the fits run in this process: a worker's start (~1 s) outweighs its share
_PARALLEL_PAIRS = 20_000


def _fit_in_processes(args: list[tuple], workers: int, progress) -> list[dict]:
    import multiprocessing as mp
    from concurrent.futures import ProcessPoolExecutor, as_completed

    fits: list[dict | None] = [None] * len(args)
    # the every-pair fit, the largest, first: the last to start then is a small one
    order = sorted(range(len(args)), key=lambda i: -len(args[i][2]))
    with ProcessPoolExecutor(max_workers=workers, mp_context=mp.get_context("spawn"),
                             initializer=die_with_parent, initargs=(os.getpid(),)) as pool:
        running = {pool.submit(_fit_one, *args[i]): i for i in order}
        for done, fut in enumerate(as_completed(running), 1):
            fits[running[fut]] = fut.result()
            progress(done, len(args))
    return fits


def _fit_one(pa_, pb_, med, held_a, held_b, held_med, n: int, seed: int) -> dict:
    """One `Embedding` fit on pairs' medians, and its relative error on the held-out pairs."""
    e = Embedding(seed=seed).fit_pairs(pa_, pb_, med, n)
    err = np.abs(e.distance(held_a, held_b) - held_med) / np.maximum(held_med, e.min_rtt_ms)
    return {"x": e.x, "h": e.h, "trained": e.trained, "scale": e.scale, "fit_info": e.fit_info, "err": err}


def prompt_hints(spec, fitted: dict):
    """What `eval.model.predict` takes as `hints` for prompts of `spec` (a `prompt.PromptSpec`),
    or None where they carry none: per query, the `embedding` baseline's distance where it placed
    both ends (fitted on all of train), one new end placed from the prompt (`embedding_refit`),
    else NaN (no hint)."""
    if not spec.hint:
        return None
    embedding, glob = fitted["embedding"], fitted["global_median"]
    return lambda pool, queries, contexts: refit_prediction(embedding, pool, queries, contexts,
                                                           glob.predict(queries)).info["raw_median"]


def embedding_with_hints(e: Embedding, train: dict, hints: Hints, shared: SharedFits | None = None) -> Embedding:
    """`e` (unfitted) fitted on `train`: taken from the every-pair fit of `hints` where that
    provably is `e.fit(train)` (`_reusable`), else fitted; `fit_info` says which, and why not."""
    shared = SharedFits.of(train, shared)
    why = _reusable(e, hints, shared)
    if why is None:
        full = hints.folds
        pairs = (np.asarray(hints.pair_a, np.int64), np.asarray(hints.pair_b, np.int64),
                 np.asarray(hints.pair_median, np.float64))
        # copies: the file's arrays are shared by every reader of the run's hints
        return e.use_fit(train, shared, np.array(hints.x[full], np.float64), np.array(hints.h[full], np.float64),
                         np.array(hints.trained[full], bool), float(hints.scale[full]), pairs,
                         {"from": "hints", "hints": hints.path})
    e.fit(train, shared)
    e.fit_info.update({"from": "fit", "hints": f"{hints.path}: not reused, {why}"})
    return e


def _reusable(e: Embedding, hints: Hints, shared: SharedFits) -> str | None:
    """None where the last fit of `hints` is what `e.fit` of the train split `shared` holds
    would compute, else why not. The fit is a deterministic function of its seed, settings,
    node codes and pairs' medians, so the file must hold the same: seed and settings, the same
    addresses in the same (sorted) order, since a node's random start is drawn by its code,
    and every measured pair with its median RTT to the bit; and the same number of rows read."""
    if hints.fit_seed is None or hints.pair_a is None:
        return "written before hints files recorded what they were fitted on"
    if int(hints.fit_seed) != e.seed:
        return f"fitted with seed {int(hints.fit_seed)}, this eval's is {e.seed}"
    if hints.x.shape[2] != e.dims or not np.array_equal(hints.fit_settings, _settings(e)):
        return "fitted with other embedding settings (dimensions, steps, learning rate or least RTT)"
    rows = len(shared.rtt())
    if int(hints.fit_rows) != rows:
        return f"fitted on {int(hints.fit_rows):,} train rows, this train split has {rows:,}"
    vocab = shared.codes()[0]
    try:
        keys = _address_keys(vocab) if len(vocab) == len(hints.keys) else None
    except PingctlError:  # a train dict load_split did not check; no file keys its addresses
        return "this train split holds strings that are no IP address"
    if keys is None or not np.array_equal(keys, hints.keys):
        return f"fitted on other addresses ({len(hints.keys):,}; this train split has {len(vocab):,})"
    _, g = shared.level("pair", (24, 48), SKETCH)
    n = max(len(vocab), 1)
    measured_pair = (g.count > 0) & (g.keys // n != g.keys % n)
    file_pairs = np.asarray(hints.pair_a, np.int64) * n + np.asarray(hints.pair_b, np.int64)
    if not (np.array_equal(file_pairs, g.keys[measured_pair])
            and np.array_equal(hints.pair_median, g.q[0.5][measured_pair])):
        return "fitted on other pairs or other RTTs than this train split's"
    return None
