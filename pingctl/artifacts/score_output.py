"""What `pingctl score` writes (docs/score.md): one Parquet file, the scored rows' canonical
columns then the score columns (nll, pit, tail_p, p_fail, context_measurements), the counts and
settings as JSON under the schema-metadata key `pingctl` (`"kind": "scores"`). It is still a
canonical table (extra columns are allowed), so `pingctl inspect` and every reader of tables
take it as one; `read` tells it apart by its metadata. `-o FILE.csv` writes the same columns
as CSV (with a header, times in ISO 8601), as `sample --pairs -o x.csv` does; a CSV has no
place for the metadata, which `--json` prints."""

from __future__ import annotations

import json
from pathlib import Path

from pingctl.atomic import atomic_file, unwritable_reason
from pingctl.errors import PingctlError, UsageError
from pingctl.schema.parquet import WRITE_OPTIONS

KIND = "scores"
SCORE_COLUMNS = ("nll", "pit", "tail_p", "p_fail")
SUFFIX = ".parquet"
SUFFIXES = (SUFFIX, ".csv")


def check_out(out: Path, inputs: list[Path] = ()) -> None:
    """Refuse, before any work, an output that is not a .parquet or .csv file name (usage
    error), one that cannot be created or one that is an input of the same command (it would
    be replaced by its own scores)."""
    out = Path(out)
    if out.suffix not in SUFFIXES:
        raise UsageError(f"-o {out}: scores are written as Parquet or CSV; give a file name ending in "
                         f"{' or '.join(SUFFIXES)}")
    if out.is_dir():
        raise PingctlError(f"-o {out} is a directory; give a file name")
    if reason := unwritable_reason(out):
        raise PingctlError(f"-o {out}: cannot be written ({reason})")
    if out.exists() and any(Path(f).resolve() == out.resolve() for f in inputs):
        raise UsageError(f"-o {out} is the table being scored; write the scores to another file")


def write_scores(table, out: Path) -> None:
    """The scored Arrow table to `out`, atomically: Parquet with its `pingctl` metadata, or CSV
    by suffix."""
    import pyarrow.parquet as pq

    out = Path(out)
    missing = [c for c in SCORE_COLUMNS if c not in table.column_names]
    if missing:
        raise PingctlError(f"not a score table (missing {', '.join(missing)})")
    with atomic_file(out) as tmp:
        if out.suffix == ".csv":
            import pyarrow.csv as pcsv

            pcsv.write_csv(table.replace_schema_metadata(None), tmp)
        else:
            pq.write_table(table, tmp, **WRITE_OPTIONS)


def read_meta(path: Path) -> dict | None:
    """The `pingctl` metadata of a score output, or None if `path` is not one (cheap: the
    footer only)."""
    import pyarrow.parquet as pq

    path = Path(path)
    if not path.is_file() or path.suffix != SUFFIX:
        return None
    try:
        schema = pq.read_schema(path)
        meta = json.loads((schema.metadata or {}).get(b"pingctl", b"{}"))
    except Exception:  # noqa: BLE001 - a file we cannot read is not ours to judge here
        return None
    if not isinstance(meta, dict) or meta.get("kind") != KIND or not all(c in schema.names for c in SCORE_COLUMNS):
        return None
    return meta


def is_score_output(path: Path) -> bool:
    return read_meta(path) is not None
