"""A `pingctl eval` output directory: report.json (the numbers, docs/eval.md "The report")
beside the plots, predictions.parquet (one row per evaluated packet: what every predictor
said about it, docs/eval.md "Predictions") and, while an eval runs or after one was
interrupted, .resume/ (the model's passes so far, for the rerun: `Resume`)."""

from __future__ import annotations

import json
import logging
import shutil
import zipfile
from pathlib import Path

import numpy as np

from pingctl.atomic import atomic_file, json_default, unwritable_reason, write_json
from pingctl.errors import PingctlError, UsageError
from pingctl.schema.spreadsheet import json_rows, json_text, write_csv

REPORT = "report.json"
REPORT_KEYS = ("rows", "comparisons", "nll", "queries", "predictors", "inputs")
REGIMES_MODE = "regimes"  # report.json "mode" of `pingctl eval --regimes`: a report per regime, one table
REGIMES_KEYS = ("regimes", "table", "inputs")
PREDICTIONS = "predictions.parquet"
KIND = "eval-predictions"
# per predictor P the columns P_<field>; NaN where P says nothing (no quantiles, a failed packet)
FIELDS = ("median", "p05", "p25", "p75", "p95", "p_fail", "pit", "crps")
PACKET_COLUMNS = ("regime", "src", "dst", "ip_version", "event_time", "pair", "actual_rtt")
COPY_SUFFIXES = (".csv", ".json")  # `eval --predictions`: the predictions again, for a spreadsheet
MS_FIELDS = ("median", "p05", "p25", "p75", "p95", "crps")  # the FIELDS in milliseconds
RESUME = ".resume"  # hidden: a finished eval removes it, and it is no output of the eval's
RESUME_KEY = "key.json"


def report_path(out: Path | str) -> Path:
    return Path(out) / REPORT


def predictions_path(out: Path | str) -> Path:
    return Path(out) / PREDICTIONS


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
    keys = REGIMES_KEYS if isinstance(report, dict) and report.get("mode") == REGIMES_MODE else REPORT_KEYS
    missing = [k for k in keys if k not in report] if isinstance(report, dict) else list(keys)
    if missing:
        raise PingctlError(f"{f}: not a `pingctl eval` report (missing {', '.join(missing) or 'everything'})")
    return f, report


def write_predictions(out: Path | str, packets: dict, predictors: dict[str, dict], meta: dict | None = None) -> Path:
    """OUT/predictions.parquet, atomically: the PACKET_COLUMNS of `packets` (equal-length
    arrays; `regime` may be absent), then for each predictor P (in order) the columns
    P_<field> for FIELDS from `predictors[P]` (missing fields are NaN). The predictor names and
    `meta` go in the schema metadata under `pingctl` (`"kind": "eval-predictions"`)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    n = len(packets["actual_rtt"])
    cols: dict = {}
    for c in PACKET_COLUMNS:
        if c not in packets:
            continue
        v = packets[c]
        cols[c] = (pa.array(np.asarray(v, dtype=object).tolist(), pa.string()).dictionary_encode()
                   if c in ("regime", "src", "dst") else pa.array(np.asarray(v, np.float64 if c == "actual_rtt" else np.int64)))
    for name, fields in predictors.items():
        for f in FIELDS:
            v = fields.get(f)
            arr = np.full(n, np.nan) if v is None else np.asarray(v, np.float64)
            if len(arr) != n:
                raise PingctlError(f"predictions of {name}: {f} has {len(arr)} values for {n} packets")
            cols[f"{name}_{f}"] = pa.array(arr)
    table = pa.table(cols)
    info = {"kind": KIND, "predictors": list(predictors), "fields": list(FIELDS), **(meta or {})}
    table = table.replace_schema_metadata({b"pingctl": json.dumps(info, default=str).encode()})
    path = predictions_path(out)
    with atomic_file(path) as tmp:
        pq.write_table(table, tmp)
    return path


def read_predictions(path: Path | str):
    """(Arrow table, metadata) of a predictions.parquet (or the eval output holding one)."""
    import pyarrow.parquet as pq

    p = Path(path)
    if p.is_dir():
        p = predictions_path(p)
    try:
        table = pq.read_table(p)
        meta = json.loads((table.schema.metadata or {}).get(b"pingctl", b"{}"))
    except (OSError, ValueError) as e:
        raise PingctlError(f"{p}: not a readable eval predictions file ({e})") from None
    if meta.get("kind") != KIND:
        raise PingctlError(f"{p}: not a `pingctl eval` predictions file (no {KIND!r} metadata)")
    return table, meta


def check_copy(path: Path | None) -> None:
    """`eval --predictions FILE`, refused before the eval runs: a suffix it cannot write, or a
    place it cannot write to."""
    if path is None:
        return
    if Path(path).suffix not in COPY_SUFFIXES:
        raise UsageError(f"--predictions {path}: written as .csv or .json (OUT/{PREDICTIONS} is always written)")
    if Path(path).is_dir():
        raise UsageError(f"--predictions {path} is a directory; give a file name")
    if reason := unwritable_reason(Path(path)):
        raise PingctlError(f"--predictions {path}: cannot be written ({reason})")


def write_copy(out: Path | str, path: Path) -> Path:
    """OUT/predictions.parquet again at `path`, atomically, in the form of every CSV pingctl
    writes (pingctl.schema.spreadsheet): `event_time_utc` in ISO 8601, `actual_rtt_ms` and each
    predictor's `_median_ms` ... `_crps_ms`; as CSV, or as JSON (the metadata's keys and the rows
    as "predictions"), by suffix."""
    table, meta = read_predictions(out)
    units = {"actual_rtt": "actual_rtt_ms",
             **{f"{p}_{f}": f"{p}_{f}_ms" for p in meta.get("predictors", []) for f in MS_FIELDS}}
    path = Path(path)
    with atomic_file(path) as tmp:
        if path.suffix == ".csv":
            write_csv(table, tmp, seconds=("event_time",), units=units)
        else:
            tmp.write_text(json_text({**meta, "predictions": json_rows(table, ("event_time",), units)}))
    return path


def resume_path(out: Path | str) -> Path:
    return Path(out) / RESUME


class Resume:
    """OUT/.resume/: the model's passes of an eval into OUT, chunk by chunk as they finish, so
    that the same command run again after an interruption reuses them (docs/eval-reference.md,
    "An interrupted eval resumes"). The eval's i-th ask keeps its chunks under ask-i/ beside the
    key of everything they depend on (`key.json`); an ask with another key empties the folder
    first. The arrays are the caller's (eval.model); `finish` removes it all."""

    def __init__(self, out: Path | str):
        self.root = resume_path(out)
        self.opened = 0

    def ask(self, key: dict) -> KeptAsk:
        """The next ask's chunks, kept under `key` (JSON)."""
        self.opened += 1
        return KeptAsk(self.root / f"ask-{self.opened - 1}", key)

    def finish(self) -> None:
        shutil.rmtree(self.root, ignore_errors=True)


class KeptAsk:
    """One ask's folder of .resume/: chunk-A.npz holds what the model gave for the chunk of the
    ask's packets starting at A, written whole (temp + rename) as soon as it is computed."""

    def __init__(self, folder: Path, key: dict):
        self.folder = folder
        self.key = json.loads(json.dumps(key, default=json_default))  # as it reads back
        try:
            kept = json.loads((folder / RESUME_KEY).read_text())
        except (OSError, ValueError):
            kept = None
        self.valid = kept == self.key
        if not self.valid and folder.exists():
            # another command's, or this one's before its model, prompts or reads changed
            shutil.rmtree(folder, ignore_errors=True)
        self.writable = True

    def _chunk(self, start: int) -> Path:
        return self.folder / f"chunk-{start:07d}.npz"

    def read(self, start: int) -> dict[str, np.ndarray] | None:
        """The arrays kept of the chunk starting at `start` (None: none, or unreadable)."""
        if not self.valid:
            return None
        try:
            with np.load(self._chunk(start)) as z:
                return {k: z[k] for k in z.files}
        except (OSError, ValueError, EOFError, zipfile.BadZipFile):
            return None

    def keep(self, start: int, arrays: dict[str, np.ndarray]) -> None:
        """Keep the chunk starting at `start`. Where that fails (a full disk) the eval goes on
        without keeping more: the folder only saves time."""
        if not self.writable:
            return
        try:
            if not self.valid:
                self.folder.mkdir(parents=True, exist_ok=True)
                write_json(self.folder / RESUME_KEY, self.key)
                self.valid = True
            with atomic_file(self._chunk(start)) as tmp, open(tmp, "wb") as f:
                np.savez_compressed(f, **arrays)
        except (OSError, PingctlError) as e:
            self.writable = False
            logging.getLogger("pingctl").warning("not keeping the model's passes in %s for a rerun: %s",
                                                 self.folder, e)
