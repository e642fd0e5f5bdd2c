"""Canonical Parquet tables on disk: which files a path names (a file, a directory, a glob, or
a pingctl output that lists its data files), and `pingctl shard`'s splits directory
(train/, val/, test/ beside one manifest.json, or for `--strategy regimes` train/, val/ and one
test_<regime>/ per regime; docs/data.md); `load_split`: one split read and checked into the dict
of NumPy arrays eval and the prompt builders use, the only reader of a split for `pingctl eval`."""

from __future__ import annotations

import glob
import json
from pathlib import Path
from typing import Iterable

import numpy as np

from pingctl.artifacts.raw import JSON_SUFFIXES, SNIFF_BYTES, SUFFIX_CODECS, codec_of, starts_like_results
from pingctl.atomic import MANIFEST, inside_pingctl_output, is_pingctl_output
from pingctl.errors import PingctlError, UsageError
from pingctl.schema.arrow_strings import CodedStrings, Vocabulary
from pingctl.schema.columns import SEED_COLUMNS
from pingctl.schema.duck import refuse_rejects
from pingctl.schema.parquet import check_parquet_columns, read_table
from pingctl.tokenizer.measurements import event_seconds, MeasurementError, parse_addresses

SPLITS = ("train", "val", "test")
# `pingctl shard --strategy regimes`: one train/val split and a test set per regime, each in
# test_<regime>/ (time: later packets of train pairs; pair: unseen pairs of seen ends; probe:
# unseen sources; target: unseen destinations).
REGIMES = ("time", "pair", "probe", "target")
# val is the time regime's val set; each held-out regime has its own, val_<regime>/
REGIME_VALS = tuple(f"val_{r}" for r in REGIMES[1:])
REGIME_SPLITS = ("train", "val") + tuple(f"test_{r}" for r in REGIMES) + REGIME_VALS
ALL_SPLITS = SPLITS + REGIME_SPLITS[2:]

_SNIFF_FILES = 1000  # a directory's files looked at for the hint; it is only a hint


def resolve_inputs(items: Iterable[str | Path], suffixes: tuple[str, ...] = (".parquet",)) -> list[Path]:
    """Expand files, directories (recursively) and globs; sorted, de-duplicated. Where
    canonical Parquet is wanted (the default `suffixes`), raw RIPE Atlas results given as a
    file, matched by a glob, or found in a directory without Parquet are refused with the
    `pingctl ingest` command that makes a table of them."""
    want_table = suffixes == (".parquet",)
    found: list[Path] = []
    for item in items:
        p = Path(item)
        listed = _manifest_files(p) if p.is_dir() else None
        if listed is not None:
            found.extend(listed)
        elif p.is_dir():
            here = [f for f in sorted(p.rglob("*")) if f.is_file() and f.name.endswith(suffixes) and not _hidden(f, p)]
            if not here and want_table and (raw := _raw_results_in(p)) is not None:
                raise PingctlError(f"no Parquet files in {p}; it holds what look like raw RIPE Atlas results (e.g. "
                                   f"{raw}), and this needs a canonical table: make one first with "
                                   f"`pingctl ingest {p} -o TABLE_DIR` and give TABLE_DIR here")
            found.extend(here)
        elif p.is_file():
            found.append(p)
        else:
            matches = sorted(glob.glob(str(item), recursive=True))
            if not matches:
                raise PingctlError(f"input not found: {item}")
            found.extend(Path(m) for m in matches if Path(m).is_file())
    out, seen = [], set()
    for f in found:
        key = f.resolve()
        if key not in seen:
            seen.add(key)
            out.append(f)
    if not out:
        raise PingctlError("no input files found in " + ", ".join(map(str, items)))
    if want_table:
        for f in out:
            check_not_raw_results(f)
    return out


def check_not_raw_results(f: Path) -> None:
    """Refuse a file that is not Parquet but looks like raw RIPE Atlas results, naming it and
    the `pingctl ingest` command that turns it into a canonical table."""
    if f.suffix.lower() != ".parquet" and looks_like_raw_results(f):
        raise PingctlError(f"{f} looks like raw RIPE Atlas results, not a canonical Parquet table; make one first "
                           f"with `pingctl ingest {f} -o TABLE_DIR` and give TABLE_DIR here")


def looks_like_raw_results(f: Path) -> bool:
    """A compressed dump (by suffix or magic bytes), or JSON (by suffix or none) whose first
    64 KiB name a RIPE result's keys. Unreadable files are not judged here."""
    if f.suffix.lower() in SUFFIX_CODECS:
        return True
    try:
        with open(f, "rb") as fh:
            head = fh.read(SNIFF_BYTES)
    except OSError:
        return False
    if codec_of("", head) != "plain":
        return True
    if f.suffix and f.suffix.lower() not in JSON_SUFFIXES:
        return False
    return starts_like_results(head)


def _raw_results_in(d: Path) -> Path | None:
    """The first file under `d` that looks like raw results, outside hidden entries and
    pingctl outputs (their manifest.json and rejects.jsonl are not RIPE results)."""
    owned: dict[Path, bool] = {}

    def in_output(f: Path) -> bool:
        for a in (d / r for r in f.relative_to(d).parents):
            if a not in owned:
                owned[a] = is_pingctl_output(a)
            if owned[a]:
                return True
        return False

    looked = 0
    for f in sorted(d.rglob("*")):
        if looked >= _SNIFF_FILES:
            return None
        if not f.is_file() or _hidden(f, d) or in_output(f):
            continue
        looked += 1
        if looks_like_raw_results(f):
            return f
    return None


def _manifest_files(d: Path) -> list[Path] | None:
    """A pingctl output that lists its data files (synth has truth/ tables beside them)."""
    try:
        files = json.loads((d / "manifest.json").read_text()).get("data_files")
    except (OSError, ValueError, AttributeError):
        return None
    if not isinstance(files, list) or not files:
        return None
    # names inside the directory only: a damaged or foreign manifest must not point elsewhere
    if not all(isinstance(f, str) and f and not Path(f).is_absolute() and ".." not in Path(f).parts for f in files):
        raise PingctlError(f"{d / 'manifest.json'}: data_files must be file names inside {d}; got {files!r:.200}")
    return [d / f for f in files]


def _hidden(f: Path, root: Path) -> bool:
    # Temp outputs of interrupted runs (".x.tmp-*") must never be read as data.
    return any(part.startswith(".") for part in f.relative_to(root).parts)


def is_splits_dir(path: Path | str) -> bool:
    """A directory with a train/, val/, test/ or test_<regime>/ split in it (a `pingctl shard`
    output)."""
    path = Path(path)
    return path.is_dir() and any((path / s).is_dir() for s in ALL_SPLITS)


def expected_splits(path: Path | str) -> tuple[str, ...]:
    """The split names a splits directory should hold: a regimes split's when it has any
    test_<regime>/ directory or its manifest says so, else train/val/test."""
    path = Path(path)
    if _shard_strategy(path) == "regimes" or any((path / s).is_dir() for s in REGIME_SPLITS[2:]):
        return REGIME_SPLITS
    return SPLITS


def split_dirs(path: Path | str) -> dict[str, Path]:
    """The splits of a splits directory that hold Parquet data, by name."""
    return {s: Path(path) / s for s in ALL_SPLITS
            if (Path(path) / s).is_dir() and any((Path(path) / s).glob("*.parquet"))}


def regime_test_dirs(split_dir: Path | str) -> dict[str, Path]:
    """The test set of each regime in a `pingctl shard --strategy regimes` output, by regime
    name in REGIMES order: {"time": SPLIT_DIR/test_time, ...}. Refuses any other directory
    with a message saying what it is and how to make a regimes split."""
    d = Path(split_dir)
    make = f"make one with `pingctl shard TABLE -o {d} --strategy regimes`"
    if not d.is_dir():
        raise PingctlError(f"{d}: not a directory; a regimes split is a directory from `pingctl shard "
                           f"--strategy regimes` (train/, val/, test_time/, test_pair/, test_probe/, test_target/)")
    strategy = _shard_strategy(d)
    if strategy is None:
        raise PingctlError(f"{d}: no `pingctl shard` manifest.json here, so not a regimes split; {make}")
    if strategy != "regimes":
        raise PingctlError(f"{d}: a `pingctl shard --strategy {strategy}` output, not a regimes split (it has "
                           f"one test/ set, not one per regime); {make}")
    dirs = {r: d / f"test_{r}" for r in REGIMES}
    missing = [p.name for p in dirs.values() if not p.is_dir()]
    if missing:
        raise PingctlError(f"{d}: regimes split without {', '.join(missing)}/ (incomplete or edited); {make} --force")
    return dirs


def regime_val_dirs(split_dir: Path | str) -> dict[str, Path]:
    """Each regime's val set in a regimes split, by regime: val/ for time, val_<regime>/ for the
    held-out ones; a split made before those existed (or with `regimes.val` 0) gives val/ for
    a regime without its own."""
    d = Path(split_dir)
    return {r: d / f"val_{r}" if r != "time" and (d / f"val_{r}").is_dir() else d / "val" for r in REGIMES}


def _shard_strategy(d: Path) -> str | None:
    """The strategy a `pingctl shard` output's manifest names; None for anything else."""
    try:
        m = json.loads((d / MANIFEST).read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(m, dict) or m.get("command") != "shard":
        return None
    return str(m.get("strategy"))


def refuse_whole_shard_output(items, split: str = "train") -> None:
    """A `pingctl shard` output given, or lying inside a directory given, where one split
    belongs: its files are train, val and test (or the regime test sets) together, and reading them as one table leaks
    the held-out splits into training rows, baselines or a new split. `split` is the one to
    suggest."""

    def is_shard_output(d: Path) -> bool:
        try:
            return json.loads((d / MANIFEST).read_text()).get("command") == "shard"
        except (OSError, ValueError, AttributeError):
            return False

    for item in items:
        d = Path(item)
        if not d.is_dir():
            continue
        # a split inside a shard output (splits/train) holds no manifest of its own: fine
        found = d if is_shard_output(d) else next(
            (m.parent for m in sorted(d.rglob(MANIFEST)) if is_shard_output(m.parent)), None)
        if found is not None:
            where = "" if found == d else f" (inside {d})"
            held = ", ".join(expected_splits(found)[:-1]) + " and " + expected_splits(found)[-1]
            raise UsageError(f"{found} is a `pingctl shard` output holding {held}{where}; give "
                             f"one split, e.g. {found / split}")


# ---------------------------------------------------------------- a split, read and checked


def load_split(path, columns: list[str] | None = None, split_hint: str = "test") -> dict[str, np.ndarray]:
    """Canonical Parquet (a file, a directory such as `SHARDS/test`, or a glob) -> dict of arrays.

    Keys: src, dst (NumPy object arrays of str, read-only, `CodedStrings` that keep the files'
    dictionary coding for `arrow_strings`; equal strings share one object), ip_version
    (int64), rtt (float64 ms, -1.0 = failed), event_time (int64 Unix seconds), msm_id, size,
    packet_error_count (int64), prb_id (int64, -1 where null or absent). `columns` picks
    canonical column names (src_addr/dst_addr for the addresses).
    """
    import pyarrow as pa
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    refuse_whole_shard_output([path], split=split_hint)
    files = resolve_inputs([path])
    check_parquet_columns(files)
    wanted = list(columns or (*SEED_COLUMNS, "prb_id"))  # the arrays eval computes with (above)
    parts: dict[str, list[np.ndarray]] = {c: [] for c in wanted}
    # every file's address dictionaries coded into one vocabulary: the columns keep that coding
    addresses = Vocabulary()
    for f in files:
        have = set(pq.read_schema(f).names)
        cols = [c for c in wanted if c in have]
        t = read_table(f, columns=cols, read_dictionary=[c for c in ("src_addr", "dst_addr") if c in cols])
        n = t.num_rows
        _check_no_nulls(f, t)
        for c in wanted:
            if c not in have:
                parts[c].append(np.full(n, -1, np.int64))
                continue
            col = t.column(c)
            if c in ("src_addr", "dst_addr"):
                parts[c].append(_codes(col, addresses))
            elif c == "event_time":
                try:
                    parts[c].append(event_seconds(col)[0])  # nulls were refused above
                except MeasurementError as e:
                    raise PingctlError(f"{f}: {e}") from None
            elif c == "rtt":
                parts[c].append(col.cast(pa.float64()).to_numpy())
            else:
                parts[c].append(pc.fill_null(col.cast(pa.int64()), -1).to_numpy())
    # a table pingctl did not write may hold rows its pipeline rejects (a -5 ms RTT read as a
    # failure, 1e300 ms as an RTT, an IPv4 pair labelled 6): named here, not scored
    if foreign := [f for f in files if not inside_pingctl_output(f)]:
        refuse_rejects(foreign, "eval scores canonical rows only: pass the table through `pingctl shard` "
                       "(which sets rejected rows aside in rejects.jsonl) and evaluate its splits")
    out = {}
    for c in list(parts):
        chunks = parts.pop(c)  # each column's pieces freed as soon as it is whole
        key = {"src_addr": "src", "dst_addr": "dst"}.get(c, c)
        if chunks and key in ("src", "dst"):
            out[key] = CodedStrings(addresses.values, np.concatenate(chunks))
        elif chunks:
            out[key] = np.concatenate(chunks)
        else:
            out[key] = np.empty(0, dtype=object if key in ("src", "dst") else np.float64 if c == "rtt" else np.int64)
    chunks = t = col = None  # the last column's pieces, the last file's table
    # Arrow's allocator keeps the freed tables' pages for reuse: at a day's 64M rows that is
    # 1.8 GB the process holds beside the 3.6 GB of arrays, until something asks them back
    pa.default_memory_pool().release_unused()
    return out


def has_split(path: Path) -> bool:
    """Whether `path` is a directory holding Parquet (a split `load_split_if_any` reads)."""
    path = Path(path)
    return path.is_dir() and any(path.glob("*.parquet"))


def load_split_if_any(path: Path) -> dict[str, np.ndarray] | None:
    """`load_split` of a split directory that may be absent (an optional val set): None where
    `path` is not a directory holding Parquet."""
    return load_split(path) if has_split(path) else None


def _check_no_nulls(path, t) -> None:
    """Nulls, a NaN RTT or an unparseable address would surface later (after the baselines and
    the model load) as a NaN metric or an error that names neither the file nor the row."""
    import pyarrow as pa
    import pyarrow.compute as pc

    for c in ("src_addr", "dst_addr", "rtt", "event_time"):
        if c in t.column_names and t.column(c).null_count:
            first = int(pc.index(pc.is_null(t.column(c)), True).as_py())
            raise PingctlError(
                f"{path}: column {c} has {t.column(c).null_count:,} null value(s), the first in row {first}; "
                "a canonical table has none (a failed packet has rtt = -1): `pingctl ingest` it first"
            )
    if "rtt" in t.column_names and pa.types.is_floating(t.column("rtt").type):
        nan = pc.is_nan(t.column("rtt"))
        if count := int(pc.sum(nan).as_py() or 0):
            first = int(pc.index(nan, True).as_py())
            raise PingctlError(f"{path}: column rtt has {count:,} NaN value(s), the first in row {first}; "
                               "a canonical RTT is milliseconds, or -1 for a failed packet")
    for c in ("src_addr", "dst_addr"):
        if c in t.column_names:
            _check_addresses(path, c, t.column(c))


def _check_addresses(path, name: str, col) -> None:
    """Every address parses as the prompt builder will parse it; cheap on the dictionary-encoded
    columns load_split reads (each distinct string once per chunk)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    try:
        for chunk in col.chunks:
            parse_addresses(chunk, name)
    except PingctlError:
        # the error path only: find which strings fail and the first row holding one
        text = col.cast(pa.string()) if pa.types.is_dictionary(col.type) else col
        bad = []
        for v in pc.unique(text).to_pylist():
            try:
                parse_addresses(pa.array([v], pa.string()), name)
            except PingctlError:
                bad.append(v)
        first = int(pc.index(pc.is_in(text, value_set=pa.array(bad, pa.string())), True).as_py())
        shown = ", ".join(repr(b) for b in bad[:3]) + (" ..." if len(bad) > 3 else "")
        raise PingctlError(f"{path}: column {name} has {len(bad):,} invalid IP address(es) ({shown}), "
                           f"the first in row {first}") from None


def _codes(col, addresses: Vocabulary) -> np.ndarray:
    """int32 codes of an address column (nulls refused before) in `addresses`."""
    import pyarrow as pa
    import pyarrow.compute as pc

    chunks = []
    for ch in col.chunks:
        # read with read_dictionary: each distinct address is hashed once per chunk, not per row
        enc = ch if pa.types.is_dictionary(ch.type) else pc.dictionary_encode(ch.cast(pa.string()))
        chunks.append(addresses.codes(enc))
    return np.concatenate(chunks) if chunks else np.empty(0, np.int32)


def take(d: dict, index) -> dict:
    """Row subset (boolean mask or indices) of every array in a split dict."""
    return {k: np.asarray(v)[index] for k, v in d.items()}


