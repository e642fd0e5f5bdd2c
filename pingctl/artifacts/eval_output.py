"""A `pingctl eval` output directory: report.json (the numbers, docs/eval.md "The report")
beside the plots."""

from __future__ import annotations

import json
from pathlib import Path

from pingctl.errors import PingctlError

REPORT = "report.json"
REPORT_KEYS = ("rows", "comparisons", "nll", "queries", "predictors", "inputs")


def report_path(out: Path | str) -> Path:
    return Path(out) / REPORT


def is_eval_output(path: Path | str) -> bool:
    path = Path(path)
    return path.name == REPORT or (path.is_dir() and (path / REPORT).is_file())


def read_report(path: Path | str) -> tuple[Path, dict]:
    """(report.json's path, the report) of an eval output (its directory or report.json),
    checked enough to print its table."""
    f = Path(path) if Path(path).name == REPORT else Path(path) / REPORT
    try:
        report = json.loads(f.read_text())
    except (OSError, ValueError) as e:
        raise PingctlError(f"{f}: not a readable eval report ({e})") from None
    missing = [k for k in REPORT_KEYS if k not in report] if isinstance(report, dict) else list(REPORT_KEYS)
    if missing:
        raise PingctlError(f"{f}: not a `pingctl eval` report (missing {', '.join(missing) or 'everything'})")
    return f, report
