"""A `pingctl build-rows` output: probe records in ArrayRecord files beside a manifest.json
that lists the files and each record's measurement count (docs/rows.md). A destination-centric
output (`--by destination`) adds `index`: destination address -> [[record id, first time], ...]
(its records in time order); `--by both` puts one in `by-destination/`, named by the probe
manifest's `destination_rows`."""

from __future__ import annotations

import json
from pathlib import Path

from pingctl.atomic import MANIFEST
from pingctl.errors import PingctlError

SUFFIX = ".arrayrecord"
BY = ("source", "destination", "both")
DESTINATION_DIR = "by-destination"


def is_records_path(path: Path | str) -> bool:
    """An ArrayRecord file, or a directory holding some."""
    path = Path(path)
    return path.suffix == SUFFIX or (path.is_dir() and any(path.glob(f"*{SUFFIX}")))


def record_files(path: Path | str) -> list[Path]:
    """The ArrayRecord files at `path` (one file, or those of a directory), sorted."""
    path = Path(path)
    if path.is_file():
        return [path]
    files = sorted(path.glob(f"*{SUFFIX}"))
    if not files:
        raise PingctlError(f"{path}: no {SUFFIX} files")
    return files


def read_manifest(rows_dir: Path | str) -> dict:
    """The manifest, checked enough for every reader: files and record sizes are lists."""
    rows_dir = Path(rows_dir)
    try:
        manifest = json.loads((rows_dir / MANIFEST).read_text())
    except (OSError, ValueError):
        raise PingctlError(f"{rows_dir}: not a `pingctl build-rows` output (no readable manifest.json)") from None
    if not isinstance(manifest, dict):
        raise PingctlError(f"{rows_dir}/manifest.json: malformed (not an object); rerun `pingctl build-rows`")
    if "record_measurements" not in manifest:
        raise PingctlError(f"{rows_dir}: built by an older pingctl; rerun `pingctl build-rows`")
    if not isinstance(manifest["record_measurements"], list) or not isinstance(manifest.get("files", []), list):
        raise PingctlError(f"{rows_dir}/manifest.json: malformed (no list of files and record sizes); "
                           "rerun `pingctl build-rows`")
    return manifest


def check_files(rows_dir: Path | str, manifest: dict) -> None:
    """Every file the manifest lists opens and holds its records: a damaged one found here is
    an error naming it, where inside MaxText it only ends the step loop ("Training stopped")."""
    from array_record.python import array_record_module

    rows_dir = Path(rows_dir)
    for name, sizes in zip(manifest.get("files", []), manifest["record_measurements"]):
        path = rows_dir / name
        try:
            reader = array_record_module.ArrayRecordReader(str(path))
            n = reader.num_records()
            reader.close()
        except Exception as e:  # noqa: BLE001 - the C++ reader raises RuntimeError/ValueError/...
            raise PingctlError(f"{path}: unreadable ArrayRecord file ({e}); rebuild with `pingctl build-rows`") from None
        if n != len(sizes):
            raise PingctlError(f"{path}: {n} records where manifest.json lists {len(sizes)}; "
                               "rebuild with `pingctl build-rows`")
    dst = destination_rows(rows_dir, manifest)
    if dst is not None and dst != rows_dir:  # the destination records beside probe rows (--by both)
        check_files(dst, read_manifest(dst))


def destination_rows(rows_dir: Path | str, manifest: dict) -> Path | None:
    """The destination records that belong to probe rows `rows_dir` (`build-rows --by both`), or
    None where they were built without; a destination output itself is its own."""
    rows_dir = Path(rows_dir)
    if manifest.get("by") == "destination":
        return rows_dir
    name = manifest.get("destination_rows")
    if name is None:
        return None
    if not isinstance(name, str) or Path(name).is_absolute() or ".." in Path(name).parts:
        raise PingctlError(f"{rows_dir}/manifest.json: malformed destination_rows {name!r}; rerun `pingctl build-rows`")
    return rows_dir / name


def destination_index(rows_dir: Path | str, manifest: dict) -> dict[str, list[list[int]]]:
    """The manifest's index of a destination output: address -> [[record id, first time], ...]."""
    index = manifest.get("index")
    if manifest.get("by") != "destination" or not isinstance(index, dict):
        raise PingctlError(f"{rows_dir}: not destination records (no index in manifest.json); build them with "
                           "`pingctl build-rows --by both` (or --by destination)")
    return index
