"""`pingctl hints`: the embedding's cross-fitted estimates that triangulation contexts carry."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from pingctl.cli.common import JsonOpt, emit, handle_errors, kv_table, step_progress
from pingctl.errors import UsageError


def hints(
    split: Annotated[Path, typer.Argument(help="The train split (canonical Parquet: a file or a directory) the "
                                               "rows were built from.")],
    out: Annotated[Path, typer.Option("--out", "-o", help="The hints file to write (.npz).")],
    folds: Annotated[int, typer.Option(min=2, max=20, help="Folds of the pairs: a pair's estimate comes from the "
                                                           "embedding fitted on the other folds.")] = 5,
    seed: Annotated[int, typer.Option(min=0, help="Seed of the embeddings' starting points.")] = 0,
    workers: Annotated[int | None, typer.Option(min=1, help="Processes fitting at once (default: one per core, "
                                                           "at most folds + 1); the file is the same whatever "
                                                           "the number.")] = None,
    as_json: JsonOpt = False,
) -> None:
    """Fit the least-squares embedding per fold of the train split's pairs and write the estimates
    triangulation contexts carry as a hint before the query (loader.hints_file; docs/loader.md, "Hints").

    Example: pingctl hints runs/regimes/sparse/splits/train -o runs/regimes/sparse/hints.npz

    Then: pingctl train ROWS --set loader.hints_file=runs/regimes/sparse/hints.npz. Eval's `both`
    prompts carry the embedding's estimate for such a run (--no-hints: without).
    """
    from pingctl.eval.hints import fit_hints_split

    if out.suffix != ".npz":
        raise UsageError(f"-o {out}: a hints file is .npz (NumPy's archive), e.g. -o {out.with_suffix('.npz')}")
    with step_progress("hints") as report:
        report("reading the train split's ends and RTTs", 0, None)
        got = fit_hints_split(split, out, folds=folds, seed=seed, workers=workers,
                              progress=lambda done, total: report(
                                  f"fitting the embeddings: {done} of {total} done (the folds', and one on every pair)",
                                  done, total))
    if as_json:
        emit(got, True)
        return
    est = got["estimate_median_rel_err"]
    emit(got, False, kv_table("hints", [
        ("written", got["path"]), ("addresses", got["nodes"]), ("measurements", got["measurements"]),
        ("folds", got["folds"]), ("pairs per fit", f"{min(got['pairs']):,}-{max(got['pairs']):,}"),
        ("estimate vs the pair's median RTT, median rel err", "-" if est is None else f"{100 * est:.1f}%"),
        ("pairs with an estimate", "-" if est is None else f"{100 * got['estimated_share']:.1f}%"),
        ("pairs' train medians kept", f"{got['train_pairs']:,} (the time regime's classical estimate)"),
        ("next", f"pingctl train ROWS --set loader.hints_file={got['path']}"),
    ]))


def register(app) -> None:
    app.command("hints")(handle_errors(hints))
