"""`pingctl inspect`: one describer per artifact kind, and `describe` to pick one by what is at
a path (`detect`). Describers read files only (no JAX): instant, and safe on a run still training.

    table     canonical Parquet tables and shard splits      records   build-rows output
    run       train run directories                          outputs   sample outputs
    export    exported model directories
"""

from __future__ import annotations

from pathlib import Path

from pingctl.artifacts import eval_output, sample_output
from pingctl.artifacts.export import is_export_dir
from pingctl.artifacts.records import is_records_path
from pingctl.artifacts.run import is_run_dir
from pingctl.artifacts.table import check_not_raw_results, is_splits_dir
from pingctl.errors import PingctlError, UsageError
from pingctl.infer import calibration as CAL
from pingctl.inspect.export import describe_export
from pingctl.inspect.groups import group_stats
from pingctl.inspect.outputs import describe_distribution, describe_predictions
from pingctl.inspect.records import describe_rows
from pingctl.inspect.run import describe_run
from pingctl.inspect.table import describe_splits, describe_table
from pingctl.records.layout import to_measurements
from pingctl.tokenizer import measurement_lengths


def detect(path: Path) -> str:
    """The kind of artifact at `path`: 'run', 'export', 'eval', 'splits', 'rows' or 'table'."""
    path = Path(path)
    if not path.exists():
        raise PingctlError(f"{path}: no such file or directory")
    if is_run_dir(path):
        return "run"
    if is_export_dir(path):
        return "export"
    if eval_output.is_eval_output(path):
        return "eval"
    if is_records_path(path):
        return "rows"
    if is_splits_dir(path):
        return "splits"
    if path.is_file() and path.suffix != ".parquet":
        check_not_raw_results(path)  # RIPE results: say which command makes a table of them
        raise PingctlError(f"{path}: not a Parquet file, a pingctl output directory or a `pingctl sample` output")
    return "table"


def _no_sample(path: Path, sample: int, what: str, of: str) -> None:
    if sample:
        raise UsageError(f"{path}: --sample shows rows of {what}, not of {of}")


def describe(path: Path, sample: int = 0, scheme: str = "compact") -> dict:
    if Path(path).name != eval_output.REPORT and (found := sample_output.read(path)):
        kind, tbl, meta = found
        if kind == "distribution":
            _no_sample(path, sample, "a table, probe rows or predictions", "one pair's RTT distribution")
            return describe_distribution(Path(path), tbl, meta)
        return describe_predictions(Path(path), tbl, meta, sample)
    if CAL.is_calibration_file(path):
        _no_sample(path, sample, "a table, probe rows or predictions", "a calibration")
        return CAL.describe(CAL.load(path, option=""))
    kind = detect(path)
    if kind == "run":
        _no_sample(path, sample, "a table or probe rows", "a run directory")
        return describe_run(path)
    if kind == "export":
        _no_sample(path, sample, "a table or probe rows", "an exported model")
        return describe_export(path)
    if kind == "eval":
        _no_sample(path, sample, "a table or probe rows", "an eval report")
        f, report = eval_output.read_report(path)
        return {"kind": "eval", "path": str(f), **report}
    if kind == "rows":
        def tokens(rec) -> int:
            # one context per record, every measurement timestamped: the `full` loader mode
            return int(measurement_lengths(to_measurements(rec), scheme).sum())

        return describe_rows(path, sample, tokens)
    if kind == "splits":
        return describe_splits(path, sample)
    return {"kind": "table", "path": str(path), **describe_table([path], sample)}


def describe_groups(path: Path, by: str, limit: int = 20, out: Path | None = None, every: str | None = None) -> dict:
    """`inspect TABLE --by pair|probe|destination|msm|prefix [--every 1h]`: statistics per group
    (and time bucket) of a canonical table."""
    kind = detect(path)
    if kind == "splits":
        raise UsageError(f"{path}: --by groups one table; give one split, e.g. {Path(path) / 'train'}")
    if kind != "table":
        raise UsageError(f"{path}: --by groups the rows of a canonical Parquet table, not of a {kind} output")
    return group_stats([Path(path)], by, limit, out, every=every)
