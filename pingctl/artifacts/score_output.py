"""What `pingctl score` writes (docs/score.md): one Parquet file, the scored rows' canonical
columns then the score columns (nll, pit, tail_p, p_fail, context_measurements), the counts and
settings as JSON under the schema-metadata key `pingctl` (`"kind": "scores"`). It is still a
canonical table (extra columns are allowed), so `pingctl inspect` and every reader of tables
take it as one; `read` tells it apart by its metadata. `-o FILE.csv` writes the same rows as
CSV, and `-o FILE.json` as JSON rows under "scores" beside the metadata, both in the form of
every CSV pingctl writes (pingctl.schema.spreadsheet: `event_time_utc` in ISO 8601,
`rtt_ms`, `size_bytes`); a CSV has no place for the metadata, which `--json` prints."""

from __future__ import annotations

import json
from pathlib import Path

from pingctl.atomic import MANIFEST, atomic_file, inside_pingctl_output, is_pingctl_output, unwritable_reason
from pingctl.errors import PingctlError, UsageError
from pingctl.schema.parquet import WRITE_OPTIONS
from pingctl.schema.spreadsheet import json_rows, json_text, write_csv

KIND = "scores"
SCORE_COLUMNS = ("nll", "pit", "tail_p", "p_fail")
SUFFIX = ".parquet"
SUFFIXES = (SUFFIX, ".csv", ".json")


def check_out(out: Path, inputs: list[Path] = (), within: dict[str, Path] | None = None) -> None:
    """Refuse, before any work, an output that is not a .parquet, .csv or .json file name (usage
    error), one that cannot be created, one that is an input of the same command (it would
    be replaced by its own scores), or one inside what the command reads (`within`: label ->
    the table or model directory given) or inside a pingctl output (a split): the next read of
    that directory would take the scores for its measurements."""
    out = Path(out)
    if out.suffix not in SUFFIXES:
        raise UsageError(f"-o {out}: scores are written as Parquet, CSV or JSON; give a file name ending in "
                         f"{', '.join(SUFFIXES[:-1])} or {SUFFIXES[-1]}")
    _check_outside(out, within or {})
    if out.is_dir():
        raise PingctlError(f"-o {out} is a directory; give a file name")
    if reason := unwritable_reason(out):
        raise PingctlError(f"-o {out}: cannot be written ({reason})")
    if out.exists() and any(Path(f).resolve() == out.resolve() for f in inputs):
        raise UsageError(f"-o {out} is the table being scored; write the scores to another file")


def _check_outside(out: Path, within: dict[str, Path]) -> None:
    where = out.resolve()
    for label, d in within.items():
        if Path(d).is_dir() and Path(d).resolve() in where.parents:
            raise UsageError(f"-o {out} is inside {label} {d}, an input of this command: whatever reads that "
                             "directory next would read the scores with it (a table's readers as measurements); "
                             "write them outside it")
    if inside_pingctl_output(where):
        owner = next(a for a in where.parents if is_pingctl_output(a))
        raise UsageError(f"-o {out} is inside the pingctl output {owner} (it has {MANIFEST}), whose readers would "
                         "take the scores for its rows; write them outside it")


def write_scores(table, out: Path) -> None:
    """The scored Arrow table to `out`, atomically: Parquet with its `pingctl` metadata, CSV, or
    JSON (the metadata's keys and the rows as "scores"), by suffix."""
    import pyarrow.parquet as pq

    out = Path(out)
    missing = [c for c in SCORE_COLUMNS if c not in table.column_names]
    if missing:
        raise PingctlError(f"not a score table (missing {', '.join(missing)})")
    with atomic_file(out) as tmp:
        if out.suffix == ".csv":
            write_csv(table, tmp)
        elif out.suffix == ".json":
            meta = json.loads((table.schema.metadata or {}).get(b"pingctl", b"{}"))
            tmp.write_text(json_text({**meta, "scores": json_rows(table)}))
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
