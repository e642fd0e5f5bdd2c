"""Canonical Parquet tables on disk: which files a path names (a file, a directory, a glob, or
a pingctl output that lists its data files), and `pingctl shard`'s splits directory
(train/, val/, test/ beside one manifest.json; docs/data.md)."""

from __future__ import annotations

import glob
import json
from pathlib import Path
from typing import Iterable

from pingctl.atomic import MANIFEST
from pingctl.errors import PingctlError, UsageError

SPLITS = ("train", "val", "test")


def resolve_inputs(items: Iterable[str | Path], suffixes: tuple[str, ...] = (".parquet",)) -> list[Path]:
    """Expand files, directories (recursively) and globs; sorted, de-duplicated."""
    found: list[Path] = []
    for item in items:
        p = Path(item)
        listed = _manifest_files(p) if p.is_dir() else None
        if listed is not None:
            found.extend(listed)
        elif p.is_dir():
            found.extend(
                f for f in sorted(p.rglob("*")) if f.is_file() and f.name.endswith(suffixes) and not _hidden(f, p)
            )
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
    return out


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
    """A directory with a train/, val/ or test/ split in it (a `pingctl shard` output)."""
    path = Path(path)
    return path.is_dir() and any((path / s).is_dir() for s in SPLITS)


def split_dirs(path: Path | str) -> dict[str, Path]:
    """The splits of a splits directory that hold Parquet data, by name."""
    return {s: Path(path) / s for s in SPLITS if (Path(path) / s).is_dir() and any((Path(path) / s).glob("*.parquet"))}


def refuse_whole_shard_output(items, split: str = "train") -> None:
    """A `pingctl shard` output given, or lying inside a directory given, where one split
    belongs: its files are train, val and test together, and reading them as one table leaks
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
            raise UsageError(f"{found} is a `pingctl shard` output holding train, val and test{where}; give "
                             f"one split, e.g. {found / split}")
