"""Fitting the hints file the loader reads (`pingctl.loader.hints`, docs/loader.md "Hints"), and
the estimates eval's prompts carry.

`fit_hints` cuts the training split's pairs into folds (`loader.hints.fold_of`) and fits one
`Embedding` per fold on the other folds' pairs, with the eval baseline's settings, so a training
query's estimate is as good as a held-out pair's; then one on every pair, the eval baseline's own
fit, which `sample` and the Python API read (`loader.hints.Hints.answer`). `prompt_hints` is the
estimate an eval prompt carries: the `embedding` baseline fitted on `--train`, an end it never saw
placed from the prompt (`embedding_refit`)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from pingctl.atomic import atomic_file
from pingctl.schema.arrow_strings import codes_in, vocabulary
from pingctl.eval.baselines import column, refit_prediction
from pingctl.eval.embedding import Embedding, pair_medians
from pingctl.loader.hints import KEY_BYTES, fold_of
from pingctl.tokenizer.measurements import parse_addresses

FOLDS = 5


def fit_hints(train: dict, out: Path | str, folds: int = FOLDS, seed: int = 0, progress=lambda done, total: None
              ) -> dict:
    """Write the hints file of `train` (a `load_split` dict) to `out`; returns what it holds."""
    import pyarrow as pa

    if folds < 2:
        raise ValueError(f"folds must be at least 2 (a pair's estimate comes from the folds without it), got {folds}")
    vocab = vocabulary(column(train, "src"), column(train, "dst"))
    a, b = codes_in(column(train, "src"), vocab), codes_in(column(train, "dst"), vocab)
    rtt = np.asarray(column(train, "rtt"), np.float64)
    n = len(vocab)
    addr, v6 = parse_addresses(pa.array(vocab.to_pylist(), pa.string()), "train addresses")
    keys = np.concatenate([addr, np.asarray(v6, np.uint8)[:, None]], axis=1)
    assert keys.shape[1] == KEY_BYTES
    pa_, pb_, med = pair_medians(a, b, rtt, n)
    # a pair's measurements all share its fold, so a fold's fit takes the medians of the pairs
    # outside it: the same numbers as the medians of their measurements, with one sort of them all
    pair_fold = fold_of(pa_, pb_, folds)
    x, h, trained, scale, info, err = [], [], [], [], [], []
    # the folds' fits, then the answer-time one on every pair (what a prompt of a pair train never saw carries)
    for i, k in enumerate([*range(folds), None]):
        progress(i, folds + 1)
        keep = slice(None) if k is None else pair_fold != k
        e = Embedding(seed=seed).fit_pairs(pa_[keep], pb_[keep], med[keep], n)
        x.append(e.x)
        h.append(e.h)
        trained.append(e.trained)
        scale.append(e.scale)
        if k is not None:
            info.append(e.fit_info)
            held = pair_fold == k  # the pairs this fit never saw, whose estimates it gives
            err.append(np.abs(e.distance(pa_[held], pb_[held]) - med[held]) / np.maximum(med[held], e.min_rtt_ms))
    progress(folds + 1, folds + 1)
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    with atomic_file(out) as tmp:
        with open(tmp, "wb") as fh:
            np.savez(fh, keys=keys, x=np.stack(x), h=np.stack(h), trained=np.stack(trained),
                     scale=np.asarray(scale, np.float64))
    return {"path": str(out), "nodes": n, "folds": folds, "measurements": int(len(rtt)),
            "pairs": [i["pairs"] for i in info],
            "train_median_rel_err": [i["train_median_rel_err"] for i in info],
            # what a hint is worth: each pair's estimate against its median RTT (NaN: an end unplaced)
            "estimate_median_rel_err": float(np.nanmedian(np.concatenate(err))) if len(med) else None,
            "estimated_share": float(np.isfinite(np.concatenate(err)).mean()) if len(med) else None}


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
