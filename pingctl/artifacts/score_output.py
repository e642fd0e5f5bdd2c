"""What `pingctl score` writes (docs/score.md): one Parquet file, the scored rows' canonical
columns then the score columns (nll, pit, tail_p, p_fail, context_measurements), the counts and
settings as JSON under the schema-metadata key `pingctl` (`"kind": "scores"`). It is still a
canonical table (extra columns are allowed), so `pingctl inspect` and every reader of tables
take it as one; `read` tells it apart by its metadata. `-o FILE.csv` writes the same rows as
CSV, and `-o FILE.json` as JSON rows under "scores" beside the metadata, both in the form of
every CSV pingctl writes (pingctl.schema.spreadsheet: `event_time_utc` in ISO 8601,
`rtt_ms`, `size_bytes`); a CSV has no place for the metadata, which `--json` prints.

`-o DIR` (no suffix) is a table of any size scored a bucket of probes at a time
(pingctl.infer.score_parts): one Parquet part per bucket (`part-00000.parquet`, ...), each
written atomically, with a `row` column (the row's place in the input), and last manifest.json:
the counts and settings as a file's metadata holds them, and `data_files`, the parts, so every
reader of tables reads the directory as one table. Without manifest.json the directory is
unfinished: its `.staging/` holds what a rerun resumes from."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from pingctl import __version__
from pingctl.atomic import MANIFEST, atomic_file, inside_pingctl_output, is_pingctl_output, unwritable_reason, write_json
from pingctl.errors import PingctlError, UsageError
from pingctl.schema.parquet import WRITE_OPTIONS
from pingctl.schema.spreadsheet import json_rows, json_text, write_csv

KIND = "scores"
SCORE_COLUMNS = ("nll", "pit", "tail_p", "p_fail")
SUFFIX = ".parquet"
SUFFIXES = (SUFFIX, ".csv", ".json")
STAGING = ".staging"  # an unfinished directory output's buckets and settings: what a rerun resumes from
PART = "part-{:05d}.parquet"


def is_directory(out: Path) -> bool:
    """Whether `-o out` names a directory of parts: a name without a suffix, or a directory
    that exists and is not named like a score file (`runs/day.scores/`)."""
    out = Path(out)
    return out.suffix not in SUFFIXES and (out.suffix == "" or out.is_dir())


def check_out(out: Path, inputs: list[Path] = (), within: dict[str, Path] | None = None) -> None:
    """Refuse, before any work, an output that cannot be created, one that is an input of the
    same command (it would be replaced by its own scores), or one inside what the command reads
    (`within`: label -> the table or model directory given) or inside a pingctl output (a
    split): the next read of that directory would take the scores for its measurements. A
    name without a .parquet, .csv or .json suffix is a directory of parts (`check_directory`)."""
    out = Path(out)
    if out.suffix not in SUFFIXES and not is_directory(out):
        raise UsageError(f"-o {out}: scores are written as Parquet, CSV or JSON; give a file name ending in "
                         f"{', '.join(SUFFIXES[:-1])} or {SUFFIXES[-1]}, or a directory name (no suffix) for a "
                         "table of any size")
    _check_outside(out, within or {})
    if is_directory(out):
        check_directory(out, inputs)
        return
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
    footer only); of a directory of parts, its manifest.json once it is finished."""
    import pyarrow.parquet as pq

    path = Path(path)
    if path.is_dir():
        return _directory_meta(path)
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


def _directory_meta(d: Path) -> dict | None:
    try:
        meta = json.loads((d / MANIFEST).read_text())
    except (OSError, ValueError):
        return None
    files = meta.get("data_files") if isinstance(meta, dict) else None
    if meta.get("kind") != KIND or not isinstance(files, list) or not all((d / str(f)).is_file() for f in files):
        return None
    return meta


def is_score_output(path: Path) -> bool:
    return read_meta(path) is not None


# ----------------------------------------------------------------- a directory of parts


def check_directory(out: Path, inputs: list[Path] = ()) -> None:
    """`-o DIR`: refuse a file, a directory that holds the table, and a non-empty directory
    that is not a score output, finished or not (its contents would be mixed with the parts)."""
    out = Path(out)
    if out.exists() and not out.is_dir():
        raise UsageError(f"-o {out} is a file; scores go to a file ending in {', '.join(SUFFIXES)}, or to a directory: "
                         "give a directory name")
    if reason := unwritable_reason(out / PART.format(0)):
        raise PingctlError(f"-o {out}: cannot be written ({reason})")
    where = out.resolve()
    if any(where == f.resolve() or where in f.resolve().parents for f in map(Path, inputs)):
        raise UsageError(f"-o {out} holds the table being scored; write the scores to another directory")
    if out.is_dir() and not is_score_directory(out):
        raise UsageError(f"-o {out} is a directory that holds other files than scores (no score manifest.json, "
                         f"no unfinished score's {STAGING}/); choose a new or empty directory")


def is_score_directory(d: Path) -> bool:
    """Empty, a finished score output, or an unfinished one: part files and hidden entries only."""
    d = Path(d)
    if read_meta(d) is not None:
        return True
    return all(e.name.startswith(".") or (e.name.startswith("part-") and e.suffix == SUFFIX) for e in d.iterdir())


def part_path(out: Path, index: int) -> Path:
    return Path(out) / PART.format(index)


def part_meta(path: Path) -> dict | None:
    """The `pingctl` metadata of a part already written (None: no such part, or unreadable)."""
    import pyarrow.parquet as pq

    try:
        meta = json.loads((pq.read_schema(path).metadata or {}).get(b"pingctl", b"{}"))
    except Exception:  # noqa: BLE001 - a part that cannot be read is one to write again
        return None
    return meta if isinstance(meta, dict) else None


def start_over(out: Path) -> None:
    """Remove a score directory's manifest.json first (never a finished-looking mix), then its parts."""
    out = Path(out)
    (out / MANIFEST).unlink(missing_ok=True)
    if out.is_dir():
        for f in out.glob("part-*" + SUFFIX):
            f.unlink()


def finish_directory(out: Path, meta: dict, parts: int) -> dict:
    """Write manifest.json (last: the directory is finished once it is there) and remove
    `.staging/`; returns the manifest."""
    files = [PART.format(i) for i in range(parts)]
    manifest = {**meta, "kind": KIND, "pingctl_version": __version__, "parts": parts, "data_files": files}
    write_json(Path(out) / MANIFEST, manifest)
    shutil.rmtree(Path(out) / STAGING, ignore_errors=True)
    return manifest


def part_files(out: Path) -> list[Path]:
    """A finished score directory's parts, in order."""
    meta = read_meta(out)
    if meta is None or not Path(out).is_dir():
        raise PingctlError(f"{out}: not a finished score output (no score manifest.json listing its parts)")
    return [Path(out) / f for f in meta["data_files"]]
